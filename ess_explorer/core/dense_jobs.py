"""The dense path's cuts handed to the compiled kernel (core/dense_kernel.py) on a CPU.

`cut_spectra` gives every cut's Gram eigenvalues of a batch of dense operators: one job per
operator and side (the tall cuts t <= L - t, whose Grams shrink as t falls, and the wide ones,
whose Grams shrink as t grows), each carrying its running Gram from one kernel call to the
next, a few cuts per call, so that the progress bar moves and an interrupt stops every job
within a call; all the forms of a group of cuts solved together, LANES at a time; then the
caller's guard once for the whole group, with the few cuts it sends to an SVD in threads
(`redo_by_svd`). A long prompt's cuts go in groups whose forms fit FORMS_BUDGET_BYTES. `takes`
says which jobs come here: large ones (KERNEL_MIN_WORK).
"""

from __future__ import annotations

import contextvars
import threading
from contextlib import contextmanager

import numpy as np
import torch

from . import dense_kernel
from .accelerator import accelerator_routes
from .eigen import svdvals
from .sweeps import over_chunks
from .workers import in_threads

__all__ = [
    "takes",
    "repays_kernel",
    "chunk_of_layer",
    "layer_work",
    "cut_spectra",
    "descending_roots",
    "redo_by_svd",
    "forms_group",
    "FORMS_BUDGET_BYTES",
    "CALL_WORK",
    "KERNEL_MIN_WORK",
    "eigen_work",
]

# The kernel compiles once per install (about 9 s) and then runs 2-3x LAPACK's speed. A job
# whose eigenvalues LAPACK finds in under about 0.1 s on 2 cores (0.08 ns per unit of work,
# `eigen_work`: a zoo model, GPT-2 at L = 128) takes torch, so that a fresh install's first
# small analysis does not wait for the compile; one layer of a model at a few hundred tokens is
# above it (GPT-2 at L = 256: 1.6e9), since a whole model repays the compile. The rule reads
# only the job's sizes, so every process (a Ray worker, a resumed sweep) routes a job the same way.
KERNEL_MIN_WORK = 1e9
# LAPACK's eigvalsh of a small matrix costs far more than its g^3: about 0.03 g^2 us on one
# core for g = 2 to 64 (its QL and the per-matrix overhead; 16 x 16: 7 us, 1.7 ns per g^3),
# some 300 g^2 units. A job of many small Grams (Mamba2's 64 channels per head at every cut)
# counts it: without it a chunk of narrow heads took torch at 4x the kernel's time.
SMALL_MATRIX_WORK = 300.0


def eigen_work(size: int) -> float:
    """The unit of KERNEL_MIN_WORK: what LAPACK spends on the eigenvalues of one symmetric
    matrix of this size, g^3 + SMALL_MATRIX_WORK g^2."""
    return float(size) ** 3 + SMALL_MATRIX_WORK * float(size) ** 2


def takes(flat: torch.Tensor, times) -> bool:
    """Whether the kernel computes the dense path's cuts ``times`` of ``flat`` (U, L, L): on a
    CPU, in float64, with numba, and U * sum_t min(t, L - t)^3 (the eigenvalue work) at least
    KERNEL_MIN_WORK."""
    if not (dense_kernel.available() and flat.dtype == torch.float64 and not accelerator_routes(flat.device)):
        return False
    return repays_kernel(flat.shape[0] * sum(eigen_work(min(t, flat.shape[-1] - t)) for t in times))


def repays_kernel(work: float) -> bool:
    """Whether a job of this much eigenvalue work (the sum of `eigen_work` over its Grams, or a
    bound on it) takes the compiled kernel: the one rule for every caller whose job is many
    small eigenproblems (core/row_scaled.py, core/causal.py). Inside `chunk_of_layer` the job
    is the whole layer (`layer_work`)."""
    return layer_work(work) >= KERNEL_MIN_WORK


# The share of its layer that the units being computed are (`chunk_of_layer`): 1 outside one.
_LAYER_SHARE: contextvars.ContextVar[float] = contextvars.ContextVar("layer_share", default=1.0)


@contextmanager
def chunk_of_layer(share: float):
    """Inside, the units being computed are ``share`` of their layer's (core/layer.py splits a
    layer into chunks of units that fit its memory budget): the compiled kernels' rules
    (`repays_kernel`, core/gramian.py `uses_kernel`) count the whole layer's work, since the
    layer, not a chunk, is the job whose size decides whether the compile is repaid. Counted
    by chunk, a strided preview of Mamba2 (one head of 64 channels per chunk at L = 512) sent
    every head to LAPACK."""
    token = _LAYER_SHARE.set(min(1.0, max(float(share), 1e-12)))
    try:
        yield
    finally:
        _LAYER_SHARE.reset(token)


def layer_work(work: float) -> float:
    """The work of the whole layer that ``work``, a chunk's (`chunk_of_layer`), is part of."""
    return work / _LAYER_SHARE.get()


def _work(t: int, length: int) -> float:
    """The kernel's own work on cut t, in the unit of CALL_WORK: g^3 for its Gram's size
    g = min(t, L - t) (whether a job takes the kernel at all reads LAPACK's, `eigen_work`)."""
    return float(min(t, length - t)) ** 3


def cut_spectra(operators: np.ndarray, rows_of: dict, workers: int, bar, finish) -> None:
    """``finish(times, sigma, failed)`` for each group of the cuts of ``rows_of`` of the float64
    operators (U, L, L): sigma (U, len(times), (L + 1) // 2) every unit's singular values at each
    cut t, from its Gram's eigenvalues, descending, zero past min(t, L - t) (`descending_roots`);
    failed (U, len(times)) where they are unset (`cut_eigenvalues`). The cuts go in groups whose
    forms fit FORMS_BUDGET_BYTES; ``finish`` runs once per group, not once per cut (per cut, its
    small torch calls took 9% of a GPT-2 layer's time)."""
    length, step = operators.shape[-1], forms_group(operators.shape[0], operators.shape[-1])
    times = list(rows_of)
    for start in range(0, len(times), step):
        group = times[start : start + step]
        values, failed = cut_eigenvalues(operators, group, rows_of, workers, bar)
        finish(group, descending_roots(values, [min(t, length - t) for t in group]), failed)


def descending_roots(values: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """The square roots of ``values`` (U, K, n), each (u, k)'s first sizes[k] ascending (a
    Gram's eigenvalues, rounding below zero clamped), descending, zero past sizes[k]."""
    width = values.shape[-1]
    sizes = torch.as_tensor(sizes)[:, None]
    columns = torch.arange(width)
    sigma = values.gather(-1, (sizes - 1 - columns).clamp_min(0).expand(values.shape))
    # in place: a group holds two arrays of this size at once, as its two forms did (FORMS_BUDGET_BYTES)
    return sigma.masked_fill_(columns >= sizes, 0.0).clamp_min_(0).sqrt_()


def redo_by_svd(
    sigma: torch.Tensor, operators: torch.Tensor, times: list[int], redo: torch.Tensor, workers: int
) -> None:
    """sigma[u, k, :g] <- the singular values of operators[u]'s cut at times[k] for every (u, k)
    of ``redo`` (U, K) (whose Gram values are unset or not accurate enough), IN PLACE; the cuts
    shared among ``workers`` threads (an "exact" run of attention-sink heads redoes most)."""
    cuts = redo.any(0).nonzero().flatten().tolist()

    def run(chunk: slice) -> None:
        for k in cuts[chunk]:
            t, units = times[k], redo[:, k].nonzero().flatten()
            values = svdvals(operators[units, t:, :t])
            sigma[units, k, : values.shape[-1]] = values

    over_chunks(run, len(cuts), 8, workers)


# The tridiagonal forms held at once, two float64 (units, cuts, L / 2) arrays: a long prompt's
# cuts go in groups (each starts its running Grams afresh: O(L^3) per unit, a few % of a group).
FORMS_BUDGET_BYTES = 256 * 1024**2


def forms_group(units: int, length: int) -> int:
    """How many cuts `cut_spectra` reduces together for ``units`` operators of size L."""
    return max(1, FORMS_BUDGET_BYTES // (16 * max(1, units) * max(1, (length + 1) // 2)))


def cut_eigenvalues(operators: np.ndarray, times: list[int], rows_of: dict, workers: int, bar):
    """Ascending eigenvalues of the Gram of every cut t in ``times`` of every lower-triangular
    float64 operator in ``operators`` (U, L, L): (values (U, len(times), (L + 1) // 2), zero past
    each cut's size min(t, L - t); failed (U, len(times)) bool, where the QL gave up or the Gram
    overflowed).

    One job per operator and side (tall cuts, wide cuts), on ``workers`` threads, each
    reducing a few cuts per `cut_forms` call (about CALL_WORK), so that ``bar`` (updated by
    the rows of ``rows_of`` each cut stands for, shared among the operators) moves and an
    interrupt stops every job within a call; then all the forms solved together."""
    units, length = operators.shape[0], operators.shape[-1]
    half = (length + 1) // 2
    forms = dense_kernel.TridiagonalForms.empty(units * len(times), half)  # cut k, unit u: slot k * units + u
    slot_of = {t: k * units for k, t in enumerate(times)}
    tall = sorted((t for t in times if t <= length - t), reverse=True)
    wide = sorted(t for t in times if t > length - t)
    jobs = [(unit, side, is_tall) for unit in range(units) for side, is_tall in ((tall, True), (wide, False)) if side]
    stop = threading.Event()

    def reduce(job) -> None:
        unit, side, is_tall = job
        gram, current = np.zeros((half, half)), -1
        try:
            for calls in _calls(side, length):
                if stop.is_set():
                    return
                slots = [slot_of[t] + unit for t in calls]
                current = dense_kernel.cut_forms(operators[unit], calls, slots, is_tall, forms, gram, current)
                bar.update(sum(len(rows_of[t]) for t in calls) / units)
        except BaseException:  # the other jobs stop too
            stop.set()
            raise

    in_threads(reduce, jobs, workers, stop)  # an interrupt: every job stops after its current call
    values, failed = forms.eigenvalues(workers)
    return values.reshape(len(times), units, -1).transpose(0, 1), failed.reshape(len(times), units).T


# Work per `cut_forms` call, sum of g^3 over its cuts' Gram sizes g: about 50 ms on one core
CALL_WORK = 1e8


def _calls(side: list[int], length: int) -> list[list[int]]:
    """``side``'s cuts in consecutive runs of about CALL_WORK each (at least one cut)."""
    calls, run, work = [], [], 0.0
    for t in side:
        run.append(t)
        work += _work(t, length)
        if work >= CALL_WORK:
            calls.append(run)
            run, work = [], 0.0
    return calls + [run] if run else calls
