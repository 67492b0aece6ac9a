"""numba, where it is installed: the one place the compiled kernels are set up.

core/gramian_kernel.py (the Gramian route) and core/sturm.py (Sturm counts) compile their
loops with `jit`; `available()` says whether numba imports, and where it does not the torch
references beside each kernel run instead. The kernels put LANES problems side by side,
every loop innermost over them, so LLVM vectorises each step across the problems.
"""

from __future__ import annotations

import os

try:  # optional: every kernel has a torch reference that runs without it
    import numba
except ImportError:  # pragma: no cover - exercised where numba is absent
    numba = None

__all__ = ["LANES", "available", "jit"]

# Problems solved side by side. Each lane loop must be long enough for LLVM's loop
# vectoriser, which checks at run time that the arrays do not overlap: at 8 or 16 lanes it
# leaves the loops scalar (measured), at 64 it emits packed FMAs.
LANES = 64


def available() -> bool:
    """Whether the compiled kernels can run here (numba imports)."""
    return numba is not None


def jit(function):
    """The kernels' compiler: numba's njit, or the plain function where numba is missing."""
    if numba is None:
        return function
    # error_model "numpy": a division by zero gives inf / nan (discarded by a select) instead of
    # raising, so the lane loops stay branch-free and vectorise; "contract" allows FMA only.
    return numba.njit(nogil=True, cache=True, error_model="numpy", fastmath={"contract"})(function)


def _full_width_vectors() -> None:
    """Let LLVM use the CPU's whole vector width where it has AVX-512.

    LLVM prefers 256-bit vectors on AVX-512 CPUs by default (the "prefer-256-bit" tuning),
    which halves the lanes of every loop; with 512-bit vectors the Gramian kernel runs about
    5-10% faster (measured, benchmarks/bench_engine.py). numba reads its CPU features once,
    when it first compiles in a process, so this applies only where nothing has been
    compiled yet and the user has not chosen features (NUMBA_CPU_FEATURES) themselves; it
    changes how fast compiled code runs, not what it computes."""
    if numba is None or os.environ.get("NUMBA_CPU_FEATURES") or numba.config.CPU_FEATURES is not None:
        return
    try:
        from numba.core.registry import cpu_target

        if "_toplevel_target_context" in vars(cpu_target):  # numba has compiled already: too late
            return
        import llvmlite.binding as llvm

        host = llvm.get_host_cpu_features()
        if host.get("avx512f"):
            numba.config.CPU_FEATURES = host.flatten() + ",-prefer-256-bit"
    except (ImportError, RuntimeError, AttributeError):  # a numba without these internals: its default
        return


_full_width_vectors()
