"""numba, where it is installed: the one place the compiled kernels are set up.

core/gramian_kernel.py (the Gramian route), core/dense_kernel.py (the dense path's cut
eigenvalues), core/householder_kernel.py (its tridiagonal reduction), core/channel_kernel.py (a
head's row-scaled channels), core/tridiagonal_kernel.py (their shared QL iteration),
core/sturm.py (Sturm counts), core/recent_kernel.py (a head's causal Gram of its recent
rows), core/cut_roots_kernel.py (the Gramian route's exact redo) and core/entropy_kernel.py
(the entropy of unresolved values) compile their loops with
`jit`; `available()` says whether numba imports, and where it does not the torch references
beside each kernel run instead. The eigensolvers put LANES
problems side by side, every loop innermost over them, so LLVM vectorises each step across
the problems.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import sys
import threading
from pathlib import Path

try:  # optional: every kernel has a torch reference that runs without it
    import numba
except ImportError:  # pragma: no cover - exercised where numba is absent
    numba = None

__all__ = ["LANES", "available", "jit", "first_call"]

# Problems solved side by side. Each lane loop must be long enough for LLVM's loop
# vectoriser, which checks at run time that the arrays do not overlap: at 8 or 16 lanes it
# leaves the loops scalar (measured), at 64 it emits packed FMAs.
# A change here compiles every kernel again (`_key_cache_on_every_kernel_file`). A value that
# changes at run time is passed as an argument instead (gramian_kernel's shift).
LANES = 64


def available() -> bool:
    """Whether the compiled kernels can run here (numba imports)."""
    return numba is not None


def jit(function=None, *, reassociate: bool = False, inline: bool = False):
    """The kernels' compiler: numba's njit, or the plain function where numba is missing.
    ``reassociate``: let LLVM reorder sums (vectorised reductions; results then differ from
    the sequential sum by rounding), for kernels whose accuracy is a backward-error bound.
    ``inline``: a helper compiled into each kernel that calls it, with that kernel's flags.

    A reassociating kernel must not call a helper it does not inline: numba links a copy of
    the helper into the caller's module, where LLVM may vectorise its sums in another order
    than in the helper's own module, and a process that compiled the kernel runs one copy
    while a process that loaded it from numba's disk cache runs the other; the same input
    then gave different bits after and before a fresh install (tests/test_compiled.py)."""
    if function is None:
        return lambda f: jit(f, reassociate=reassociate, inline=inline)
    if numba is None:
        return function
    # error_model "numpy": a division by zero gives inf / nan (discarded by a select) instead of
    # raising, so the lane loops stay branch-free and vectorise; "contract" allows FMA only.
    flags = {"contract", "reassoc", "nsz"} if reassociate else {"contract"}
    kernel = numba.njit(
        nogil=True, cache=True, error_model="numpy", fastmath=flags, inline="always" if inline else "never"
    )(function)
    _key_cache_on_every_kernel_file(kernel)
    return kernel


# The modules whose functions `jit` compiles (tests/test_compiled.py checks the list).
KERNEL_MODULES = (
    "compiled",
    "tridiagonal_kernel",
    "householder_kernel",
    "dense_kernel",
    "gramian_kernel",
    "channel_kernel",
    "recent_kernel",
    "sturm",
    "cut_roots_kernel",
    "entropy_kernel",
)


@functools.cache
def _kernels_digest() -> str:
    here = Path(__file__).parent
    return hashlib.sha256(b"".join((here / f"{name}.py").read_bytes() for name in KERNEL_MODULES)).hexdigest()


def _key_cache_on_every_kernel_file(kernel) -> None:
    """numba checks a kernel's disk cache against its own file alone, but a kernel carries
    compiled copies of the helpers it calls from other files (the QL of
    core/tridiagonal_kernel.py in three kernels): after a change to a helper's file only, it
    would load the old copy. So its cache also records the contents of every kernel file, and
    any change there compiles every kernel again. Where numba's cache object differs (another
    version), the kernel keeps numba's own check."""
    cache_file = getattr(getattr(kernel, "_cache", None), "_cache_file", None)
    if cache_file is not None and hasattr(cache_file, "_source_stamp"):
        cache_file._source_stamp = (cache_file._source_stamp, _kernels_digest())


# A kernel's first call in a process loads it from numba's disk cache (a fraction of a second)
# or, once per install, compiles it (9-12 s, with nothing on screen). So before its first real
# call it runs a tiny problem (`first_call`), and where that takes longer than NOTICE_AFTER
# seconds (a compile: loading takes far less), one line says so, once per process, so a first
# analysis does not look hung. Timing the real call instead would also announce a compile
# for a large job that is merely long.
NOTICE_AFTER = 2.0
_announced = threading.Event()
_warming: set = set()
_warmed: set = set()  # kernels with a loaded signature: a set lookup, not numba's signature list, per call
_warm_lock = threading.RLock()  # re-entered by the warm-up's own calls, in its thread


def first_call(kernel, warm_up) -> None:
    """Call before each call of the compiled ``kernel``: where this process has not yet run
    it (no signature loaded or compiled), ``warm_up()`` (a tiny problem through the same
    call, so the same compiled version) runs first, under the notice. Other threads wait for
    it; the warm-up's own calls of the kernel pass straight through, so it must make them in
    its own thread (a pool's threads would wait for it to finish)."""
    if numba is None or kernel in _warmed:
        return
    if getattr(kernel, "signatures", True):
        _warmed.add(kernel)
        return
    with _warm_lock:
        if kernel in _warming or kernel.signatures:
            return
        _warming.add(kernel)
        try:
            with _notice():
                warm_up()
        finally:
            _warming.discard(kernel)


@contextlib.contextmanager
def _notice():
    def say() -> None:
        if not _announced.is_set():
            _announced.set()
            sys.stderr.write("ess-explorer: compiling the CPU kernels, once for this install (10-25 s) ...\n")

    timer = threading.Timer(NOTICE_AFTER, say)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
