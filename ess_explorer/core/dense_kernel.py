"""Eigenvalues of many symmetric matrices of size ~32-512 on the CPU: one compiled kernel (numba).

The dense path's cost is `eigvalsh` of one Gram per cut (a GPT-2 head at L = 512: sizes 1 to
256, twice each), and LAPACK spends it in two places: the Householder reduction to
tridiagonal form, half of whose work is a matrix-vector product that reads the whole trailing
matrix at every step, and the tridiagonal QL iteration (dsterf), a chain of dependent
divisions and square roots that keeps one core's vector units idle. This kernel:

1. Reduces each matrix to tridiagonal form by Householder reflectors, four at a time
   (core/householder_kernel.py).
2. Solves LANES tridiagonals side by side with the root-free QL iteration of
   core/tridiagonal_kernel.py: one lane per matrix, the two divisions of each rotation
   vectorised across the lanes. Matrices are grouped by size, padded with zeros
   (a zero row and column only adds a zero eigenvalue, deflated at once).

For the dense path, `_forms` also builds each cut's Gram, in place from the previous one
(core/dense_jobs.py hands it the cuts); `symmetric_eigenvalues` takes any batch
(core/eigen.py).

Accuracy: the same as LAPACK's (the reduction is backward stable, the QL deflates an
off-diagonal below eps times the matrix's scale, its trace or its largest entry where that
is larger): every eigenvalue within a small multiple of
n eps ||A|| of the exact one, which is the error bound the callers' guards assume
(core/gram.py, GRAM_ERROR). Sums are reassociated (vectorised), so results are not bit for
bit LAPACK's; the reduction's one entry point (`_forms`) inlines every helper, so it runs one
compiled copy of the arithmetic, whether compiled here or loaded from numba's cache
(core/compiled.py). A lane whose QL does not converge is recomputed by torch (`failed`).

The reference is `torch.linalg.eigvalsh` itself (what the tests compare with); where numba is
missing, `symmetric_eigenvalues` is that reference.
"""

from __future__ import annotations

import numpy as np
import torch

from . import compiled
from .compiled import LANES, available, jit
from .householder_kernel import TINY, reduce_to_tridiagonal, reduction_buffers
from .tridiagonal_kernel import _tridiagonal_eigenvalues
from .workers import in_threads

__all__ = ["symmetric_eigenvalues", "cut_forms", "TridiagonalForms", "KERNEL_MIN_SIZE", "available", "load"]

# Below this size torch's batched call is as fast (measured: the kernel's per-row overhead
# and LAPACK's per-call overhead cross near n = 24 on one core).
KERNEL_MIN_SIZE = 24
# The arguments `_forms` does not read for one kind of work: typed as the real ones, so that
# both kinds run one compiled specialisation.
_NO_MATRICES, _NO_OP, _NO_CUTS = np.zeros((0, 0, 0)), np.zeros((0, 0)), np.zeros(0, dtype=np.int64)


@jit(inline=True)
def _scaled_form(src, lo, n, psd, work, vectors, panel, d, e):  # pragma: no cover - compiled
    """The tridiagonal form (d, e) of the symmetric block src[lo:lo+n, lo:lo+n] (its upper
    triangle read), computed on a copy divided by the block's scale, which is returned: the
    sum of |a_rr|, or the largest |a_rc| where that is larger (a zero diagonal). With ``psd``
    (a Gram) the trace bounds every entry and no entry is scanned (a scan costs 4% of a GPT-2
    run). The scale lies between max |a_rc| >= ||A|| / n and n ||A||: the scaled entries are at
    most n, and the QL's absolute deflation (eps) is within n eps ||A||. An infinite scale
    (overflowed entries) leaves d and e unwritten: the caller's fallback
    (`TridiagonalForms.eigenvalues`)."""
    first, end = np.uint64(lo), np.uint64(lo + n)
    trace = 0.0
    largest = 0.0
    for row in range(first, end):
        trace += abs(src[row, row])
        if not psd:
            for c in range(row, end):
                largest = max(largest, abs(src[row, c]))
    scale = max(trace, largest)
    scale = scale if scale > TINY else 1.0
    if not np.isfinite(scale):
        return scale
    inverse = 1.0 / scale
    for r in range(n):
        row = np.uint64(r)
        for c in range(row, np.uint64(n)):  # unsigned: vectorised (core/householder_kernel.py)
            work[row, c] = src[row + first, c + first] * inverse
    reduce_to_tridiagonal(work, n, d, e, vectors[0], vectors[1], vectors[2], panel[0], panel[1])
    return scale


@jit(reassociate=True)
def _forms(matrices, op, cuts, slots, tall, diag, off, scale, sizes, gram, current):  # pragma: no cover - compiled
    """The kernel's one entry point for the reduction (its helpers inlined, one call of
    `_scaled_form`, so that the arithmetic compiles once: core/compiled.py), for two kinds of
    work. The forms go to slots[i] of diag, off, scale (`_scaled_form`); sizes[slot] is each
    matrix's size.

    ``op`` empty (0 x 0): matrices[i]'s leading sizes[slots[i]] block (symmetric, its upper
    triangle read, not written). Else the Gram of every cut H_t = op[t:, :t] of one
    lower-triangular op (L, L), t in ``cuts`` (all on one side: ``tall``, t <= L - t,
    descending, Gram H^T H (t x t); else t > L - t, ascending, Gram H H^T ((L - t) x (L - t))),
    from one running Gram (its upper triangle, in ``gram`` (L/2, L/2)), each the previous one
    plus rank-one terms, as core/spectra.py's `_gram_sequence`:
        tall:  H_t^T H_t = (H_{t+1}^T H_{t+1})[:t, :t] + op[t, :t]^T op[t, :t]
        wide:  H_{t+1} H_{t+1}^T = (H_t H_t^T)[1:, 1:] + op[t+1:, t] op[t+1:, t]^T
    The wide Gram is kept at its rows' absolute positions (row i of op at i - base), so that
    dropping its first row and column moves nothing. ``current``: the cut ``gram`` holds (a
    later call goes on from where the previous one stopped), or -1: ``gram`` is zero and
    starts at the first cut. Returns the cut ``gram`` holds now."""
    by_cut = op.shape[0] > 0
    length = op.shape[0]
    half = (length + 1) // 2
    base = length - half
    work, vectors, panel = reduction_buffers(half if by_cut else matrices.shape[-1])
    column = np.empty(length)
    count = len(cuts) if by_cut else len(slots)
    if by_cut and count > 0 and current < 0:
        current = cuts[0]
        if tall:  # H^T H of the first (largest) cut: rows current.. of its first `current` columns
            for i in range(current, length):
                _add_outer(gram, op[i], 0, current)
        else:  # H H^T of the first (largest) cut: rows current.., columns < current
            for k in range(current):
                for i in range(current, length):
                    column[i - base] = op[i, k]
                _add_outer(gram, column, current - base, half)
    for c in range(count):
        b = slots[c]
        src, lo, n = gram, 0, sizes[b]
        if by_cut:
            t = cuts[c]
            if tall:
                while current > t:
                    current -= 1
                    _add_outer(gram, op[current], 0, current)
                n = t
            else:
                while current < t:
                    for i in range(current + 1, length):
                        column[i - base] = op[i, current]
                    current += 1
                    _add_outer(gram, column, current - base, half)
                n, lo = length - t, t - base
            sizes[b] = n
        else:
            src = matrices[c]
        if n > 0:  # a Gram's trace bounds its entries (psd): no scan for the largest
            scale[b] = _scaled_form(src, lo, n, by_cut, work, vectors, panel, diag[b], off[b])
    return current


@jit(inline=True)
def _add_outer(gram, x, lo, hi):  # pragma: no cover - compiled
    """gram[i, j] += x[i] x[j] for lo <= i <= j < hi (the upper triangle)."""
    for i in range(lo, hi):
        xi = x[i]
        row = np.uint64(i)
        for j in range(row, np.uint64(hi)):  # unsigned: vectorised (core/householder_kernel.py)
            gram[row, j] += xi * x[j]


def cut_forms(
    op: np.ndarray, cuts, slots, tall: bool, forms: "TridiagonalForms", gram: np.ndarray, current: int = -1
) -> int:
    """Into ``forms``' slots: the tridiagonal form of every cut's Gram of the lower-triangular
    float64 ``op`` (L, L) (`_forms`); cuts all tall (descending) or all wide (ascending).
    ``gram`` ((L + 1) // 2 square, zeros at first) and ``current`` carry the running Gram from
    one call to the next, so that a side's cuts can be reduced a few at a time; returns the
    new ``current``."""
    compiled.first_call(_forms, load)
    return _forms(
        _NO_MATRICES,
        op,
        np.asarray(cuts, dtype=np.int64),
        np.asarray(slots, dtype=np.int64),
        bool(tall),
        forms.diag,
        forms.off,
        forms.scale,
        forms.sizes,
        gram,
        int(current),
    )


@jit
def _lane_eigenvalues(diag, off, sizes, order, first, last, failed):  # pragma: no cover - compiled
    """The eigenvalues of the tridiagonals order[first..last-1] (diag, off, as
    `_forms` left them), IN PLACE in diag, ascending: LANES at a time, side by
    side, each group padded to its largest size. failed[b] where a lane did not converge."""
    n_max = diag.shape[-1]
    d = np.zeros((n_max, LANES))
    e = np.zeros((n_max, LANES))
    lane_failed = np.zeros(LANES, dtype=np.bool_)
    for start in range(first, last, LANES):
        count = min(LANES, last - start)
        n = 0
        for w in range(count):
            n = max(n, sizes[order[start + w]])
        for i in range(n):
            for w in range(LANES):
                d[i, w] = 0.0
                e[i, w] = 0.0
        for w in range(count):
            b = order[start + w]
            for i in range(sizes[b]):
                d[i, w] = diag[b, i]
                e[i, w] = off[b, i]
            if sizes[b] > 0:
                e[sizes[b] - 1, w] = 0.0  # no coupling into the padding
            lane_failed[w] = False
        for w in range(count, LANES):
            lane_failed[w] = False
        _tridiagonal_eigenvalues(d, e, n, lane_failed)
        for w in range(count):
            b = order[start + w]
            failed[b] = lane_failed[w]
            for i in range(sizes[b]):
                diag[b, i] = d[i, w]
            diag[b, : sizes[b]].sort()  # ascending, as eigvalsh


def load() -> None:
    """Compile every kernel (once per install, about 9 s; numba's disk cache then loads them in
    about 0.3 s per process) on a tiny problem: for a benchmark, so that it times none of it.
    Any call compiles what it needs by itself."""
    op = np.tril(np.ones((6, 6)))
    forms = TridiagonalForms.empty(2, 3)
    cut_forms(op, [3], [0], True, forms, np.zeros((3, 3)))
    cut_forms(op, [4], [1], False, forms, np.zeros((3, 3)))
    forms.eigenvalues()
    TridiagonalForms.empty(1, 3).reduce(np.eye(3)[None], np.array([3]), [0])


def symmetric_eigenvalues(matrices: torch.Tensor, sizes=None, workers: int | None = None) -> torch.Tensor:
    """Ascending eigenvalues (B, n) of the symmetric CPU float64 ``matrices`` (B, n, n) (upper
    triangle read), as `torch.linalg.eigvalsh` gives them; with ``sizes`` (B,) ints, matrix b
    is its leading sizes[b] x sizes[b] block and its eigenvalues fill [:sizes[b]], the rest
    zero. ``workers`` threads (default torch's thread count). torch where numba is missing."""
    count, n = matrices.shape[0], matrices.shape[-1]
    sizes = np.full(count, n, dtype=np.int64) if sizes is None else np.asarray(sizes, dtype=np.int64)
    if not available() or count == 0:
        return _reference(matrices, sizes)
    workers = max(1, min(workers or torch.get_num_threads(), count))
    forms = TridiagonalForms.empty(count, n)
    bounds = np.linspace(0, count, workers + 1).astype(np.int64)
    array = np.ascontiguousarray(matrices.detach().numpy())  # one compiled layout: C order

    def reduce(k: int) -> None:
        lo, hi = bounds[k], bounds[k + 1]
        forms.reduce(array[lo:hi], sizes[lo:hi], range(lo, hi))

    in_threads(reduce, range(workers), workers)
    values, failed = forms.eigenvalues(workers)
    if bool(failed.any()):
        values[failed] = _reference(matrices[failed], sizes[failed.numpy()])
    return values


class TridiagonalForms:
    """The tridiagonal forms of a batch of symmetric matrices, filled in any order (by
    `reduce`, from any thread, each slot once), then solved together (`eigenvalues`): the
    dense path reduces each cut's Grams as they are built and solves them all at the end, in
    full groups of LANES."""

    def __init__(self, diag: np.ndarray, off: np.ndarray, scale: np.ndarray, sizes: np.ndarray):
        self.diag, self.off, self.scale, self.sizes = diag, off, scale, sizes

    @classmethod
    def empty(cls, count: int, n: int) -> "TridiagonalForms":
        return cls(np.zeros((count, n)), np.zeros((count, n)), np.ones(count), np.zeros(count, dtype=np.int64))

    def reduce(self, matrices: np.ndarray, sizes: np.ndarray, slots) -> None:
        """Slot slots[i] <- the form of matrices[i]'s leading sizes[i] block (float64, its upper
        triangle read). ``slots`` a range or int array, as many as matrices."""
        slots = np.asarray(slots, dtype=np.int64)
        self.sizes[slots] = sizes
        matrices = np.ascontiguousarray(matrices, dtype=np.float64)
        compiled.first_call(_forms, load)
        _forms(matrices, _NO_OP, _NO_CUTS, slots, False, self.diag, self.off, self.scale, self.sizes, _NO_OP, -1)

    def eigenvalues(self, workers: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(values (B, n) ascending per slot, zero past its size; failed (B,) bool: slots whose
        QL did not converge or whose matrix overflowed, their values unset). LANES slots of similar size at a time, the
        groups shared among ``workers`` threads. The forms are consumed."""
        count = len(self.sizes)
        order = np.argsort(-self.sizes, kind="stable")  # lanes of similar size: little padding
        failed = np.zeros(count, dtype=np.bool_)
        groups = [(start, min(start + LANES, count)) for start in range(0, count, LANES)]

        def solve(group: tuple[int, int]) -> None:
            _lane_eigenvalues(self.diag, self.off, self.sizes, order, group[0], group[1], failed)

        in_threads(solve, groups, workers)  # on an interrupt, the groups not yet begun are dropped
        overflowed = ~np.isfinite(self.scale)  # matrices whose entries overflowed: never solved
        failed |= overflowed
        self.scale[overflowed] = 0.0
        self.diag *= self.scale[:, None]  # past each slot's size: the zeros it was created with
        return torch.from_numpy(self.diag), torch.from_numpy(failed)


def _reference(matrices: torch.Tensor, sizes: np.ndarray) -> torch.Tensor:
    """torch.linalg.eigvalsh of each leading sizes[b] block, ascending, zero padded."""
    n = matrices.shape[-1]
    out = torch.zeros(matrices.shape[0], n, dtype=matrices.dtype)
    for size in np.unique(sizes):
        rows = torch.from_numpy(np.flatnonzero(sizes == size))
        if size > 0:
            block = matrices[rows, :size, :size]
            out[rows, :size] = torch.linalg.eigvalsh(block, UPLO="U")
    return out
