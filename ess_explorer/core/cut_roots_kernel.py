"""The triangular roots of single cuts of diagonal recurrences, as one compiled CPU kernel (numba).

The Gramian route (core/gramian.py) redoes exactly the cuts its guard cannot certify: for a
unit's a, b, c (L, N) and a cut t, the R factors of

    F (t, N):     F_j = b_j prod_{m=j+1..t-1} a_m      (j < t: what the past wrote)
    G (L - t, N): G_i = c_i prod_{m=t..i} a_m          (i >= t: what the future reads)

so that sigma(H_t) = sigma(R_G R_F^T) and sigma(R_t) = sigma(R_F). A random Mamba-130m layer at
L = 512 sends about 4,300 such (unit, cut) pairs there, 0.5% of its cuts, some 800 of its 1,536
units with a median of 4 cuts each. Each unit's triangles come from two square-root sweeps
that serve all of its cuts (core/sweeps.py's recursion from zero):

    R_F of cut t + 1 = the triangle of [R_F(t) diag(a_t); b_t^T]      forward from R_F(0) = 0
    R_G of cut t     = the triangle of [c_t^T; R_G(t + 1)] diag(a_t)   backward from R_G(L) = 0

each row folded in by Givens rotations, the triangle copied out at each of the unit's cuts, so
a unit costs its farthest cut's rows on each side rather than a sweep per cut (about 3.7x fewer
rows on that layer). LANES units run side by side, every loop innermost over them
(`_UnitLanes`: units packed by where their sweeps end). Nothing is stored but the triangles.

Accuracy: Givens QR, like Householder QR, is columnwise backward stable (Higham, Accuracy and
Stability of Numerical Algorithms, 2nd ed., Thm. 19.10), and scaling column k of the triangle
by a_t,k rounds each entry of it relatively, a columnwise perturbation too: R is the exact
factor of F + dF with ||dF e_k|| <= c L N eps ||F e_k|| for each state component k, the bound
the reference's QR meets; the row order changes R only by an orthogonal factor on the left,
which leaves both spectra alone. The rotations' lengths are scaled outside the squares' normal
range (`_fold`), so entries far below 1e-154, whose squares underflow, are kept as LAPACK keeps them. A pair whose
triangle is not finite is computed again by the reference; where the reference's triangles
overflow too (a growing recurrence), core/gramian.py raises the overflow error.

The reference is `cut_roots_reference` below (tests/test_precision.py compares them); where
numba is missing it runs instead.
"""

from __future__ import annotations

import numpy as np
import torch

from . import compiled
from .accelerator import worker_threads
from .compiled import LANES, available, jit
from .sweeps import over_chunks

__all__ = ["cut_roots", "cut_roots_reference"]


def cut_roots_reference(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, times: torch.Tensor):
    """(R_F, R_G), each (k, min(L, N), N), upper triangular: the R factors of F and G (module
    docstring) of k (unit, cut) pairs, each pair's a, b, c (k, L, N) and cut t (k,). The running
    products only multiply decays (no cancellation, relative error about L eps); one that
    underflows drops a term below 1e-300 of the state, as in the sweep."""
    length = a.shape[1]
    time = torch.arange(length, device=a.device)[None, :, None]
    t = times.to(a.device)[:, None, None]
    ones = torch.ones_like(a)
    after = torch.where((time >= 1) & (time <= t - 1), a, ones).flip(1).cumprod(1).flip(1)  # prod_{m>=j}
    after = torch.cat([after[:, 1:], ones[:, :1]], 1)  # prod_{m=j+1..t-1}
    past = torch.where(time < t, b * after, torch.zeros_like(b))  # F (k, L, N)
    since = torch.where(time >= t, a, ones).cumprod(1)  # prod_{m=t..i}
    future = torch.where(time >= t, c * since, torch.zeros_like(c))  # G (k, L, N)
    return torch.linalg.qr(past, mode="r").R, torch.linalg.qr(future, mode="r").R


def cut_roots(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, units: torch.Tensor, times: torch.Tensor):
    """The R factors of `cut_roots_reference` for the pairs (units[k], times[k]) of the units'
    a, b, c (U, L, N) float64 (each (k, N, N): zero rows past min(L, N), which change no singular
    value): by the kernel on a CPU where numba runs, its blocks of units spread over the worker
    threads, else by the reference in batches of REFERENCE_PAIRS."""
    n = a.shape[2]
    if not len(units):  # either route: nothing to sweep or factor
        return a.new_zeros(0, n, n), a.new_zeros(0, n, n)
    if not (available() and a.device.type == "cpu" and a.dtype == torch.float64):
        return _by_reference(a, b, c, units, times)
    unit, cut = units.cpu().numpy().astype(np.int64), times.cpu().numpy().astype(np.int64)
    arrays = [np.ascontiguousarray(x.detach().numpy()) for x in (a, b, c)]
    roots = np.zeros((2, len(unit), n, n))
    compiled.first_call(_sweep_roots, _warm_up)
    workers = worker_threads(a.device)
    for side in (PAST, FUTURE):
        lanes = _UnitLanes(unit, cut, side)
        source = arrays[1] if side == PAST else arrays[2]

        def run(chunk: slice) -> None:
            _sweep_roots(arrays[0], source, side, *lanes.of_blocks(chunk), roots[side])

        over_chunks(run, lanes.blocks, max(1, -(-lanes.blocks // (4 * workers))), workers)
    reach, observe = torch.from_numpy(roots[PAST]), torch.from_numpy(roots[FUTURE])
    bad = ~(reach.isfinite().flatten(1).all(1) & observe.isfinite().flatten(1).all(1))
    if bool(bad.any()):  # overflow: the reference's scaled QR computes them again
        for whole, part in zip((reach, observe), _by_reference(a, b, c, units[bad], times[bad])):
            whole[bad] = 0.0
            whole[bad, : part.shape[1]] = part
    return reach, observe


PAST, FUTURE = 0, 1  # the two sweeps: R_F forward from t = 0, R_G backward from t = L - 1


class _UnitLanes:
    """The kernel's lanes for one sweep: one unit per lane, LANES to a block, with that unit's
    pairs in the order the sweep meets their cuts (ascending for PAST, descending for FUTURE).
    Units are packed into blocks by the cut where their sweep ends (the last for PAST, the
    first for FUTURE), so that the units of a block sweep about as far."""

    def __init__(self, unit: np.ndarray, cut: np.ndarray, side: int):
        key = cut if side == PAST else -cut
        order = np.lexsort((key, unit))  # by unit, then along the sweep
        units, first = np.unique(unit[order], return_index=True)
        stop = np.append(first[1:], len(order))
        end = cut[order][stop - 1]  # where each unit's sweep stops: its last pair's cut
        packed = np.argsort(end if side == PAST else -end, kind="stable")
        self.blocks = -(-len(units) // LANES)
        padding = self.blocks * LANES - len(units)  # empty lanes: unit 0, no pairs
        self.unit = np.concatenate([units[packed], np.zeros(padding, dtype=np.int64)])
        self.first = np.concatenate([first[packed], np.zeros(padding, dtype=np.int64)])
        self.stop = np.concatenate([stop[packed], np.zeros(padding, dtype=np.int64)])
        self.cut, self.slot = cut[order], order  # pair k of the sweep: its cut, its row in the output

    def of_blocks(self, chunk: slice):
        lanes = slice(chunk.start * LANES, chunk.stop * LANES)
        return self.unit[lanes], self.first[lanes], self.stop[lanes], self.cut, self.slot


REFERENCE_PAIRS = 256  # pairs per call of the reference: about six (pairs, L, N) arrays each


def _by_reference(a, b, c, units, times):
    """`cut_roots_reference` of the pairs (units[k], times[k]) (at least one: the redo calls it
    only for cuts it must redo), in batches of REFERENCE_PAIRS."""
    parts = []
    for start in range(0, len(units), REFERENCE_PAIRS):
        on = units[start : start + REFERENCE_PAIRS].to(a.device)
        parts.append(cut_roots_reference(a[on], b[on], c[on], times[start : start + REFERENCE_PAIRS]))
    return tuple(torch.cat(side) for side in zip(*parts))


# The rotation's length sqrt(r^2 + x^2) straight from the squares where they are normal numbers
# (r, x between about 1e-145 and 1e145); outside that band from the scaled form, so that a row
# near 1e-200 (a cut after a decay of 1e-200), whose squares underflow to 0, is kept as LAPACK
# keeps it, and one near 1e200 does not overflow. Both are computed in every lane and one is
# selected, so the loop vectorises: `math.hypot`, a library call per lane, doubled the fold's
# time (5.1 -> 11.4 us per fold of 64 lanes at N = 16, one AVX-512 core).
SQUARES_LOW, SQUARES_HIGH = 1e-290, 1e290


@jit
def _fold(root, row, n):  # pragma: no cover - compiled
    """Rotate the row (n, LANES) into the upper triangle root (n, n, LANES) by Givens
    rotations, IN PLACE (row is consumed): root^T root grows by row row^T in every lane. The
    rotation's length is taken from the squares or scaled (SQUARES_LOW above)."""
    cos = np.empty(LANES)
    sin = np.empty(LANES)
    for i in range(n):
        for w in range(LANES):
            r = root[i, i, w]
            x = row[i, w]
            squares = r * r + x * x
            big = max(abs(r), abs(x))
            inverse = 1.0 / big if big > 0.0 else 0.0
            rs, xs = r * inverse, x * inverse
            normal = SQUARES_LOW < squares < SQUARES_HIGH
            h = np.sqrt(squares) if normal else big * np.sqrt(rs * rs + xs * xs)
            live = h > 0.0
            cos[w] = r / h if live else 1.0
            sin[w] = x / h if live else 0.0
            root[i, i, w] = h
        for j in range(i + 1, n):
            for w in range(LANES):
                r = root[i, j, w]
                x = row[j, w]
                root[i, j, w] = cos[w] * r + sin[w] * x
                row[j, w] = cos[w] * x - sin[w] * r


@jit
def _sweep_roots(a, source, side, unit, first, stop, cut, slot, out):  # pragma: no cover - compiled
    """out[slot[k]] <- the triangle of pair k (R_F where ``side`` is PAST, R_G where FUTURE:
    module docstring) for the pairs first[w] <= k < stop[w] of lane w, whose unit is unit[w]
    and whose cuts cut[k] come in the sweep's order; lanes in blocks of LANES (`_UnitLanes`).
    a and source (b for PAST, c for FUTURE) (U, L, N) C-ordered; out (pairs, N, N).

    PAST: R^(t+1) is the triangle of [R^(t) diag(a_t); b_t^T], from R^(0) = 0, so after step
    j the triangle is R_F of cut j + 1. FUTURE: R^(t) is that of [c_t^T; R^(t+1)] diag(a_t),
    from R^(L) = 0: R_G of cut t after step t. Each lane sweeps its own unit; a lane past its
    last pair (or with none) sweeps on and is not read."""
    length, n = a.shape[1], a.shape[2]
    flat_a, flat_source = a.reshape(-1), source.reshape(-1)
    root = np.empty((n, n, LANES))
    row = np.empty((n, LANES))
    decay = np.empty((n, LANES))
    at = np.empty(LANES, dtype=np.int64)  # each lane's row of its unit's a and source at this step
    ahead = np.empty(LANES, dtype=np.int64)  # each lane's next pair
    for blk in range(len(unit) // LANES):
        base = blk * LANES
        steps = 0  # the block sweeps until its farthest lane's last cut
        for w in range(LANES):
            lane = base + w
            ahead[w] = first[lane]
            if stop[lane] > first[lane]:
                last = cut[stop[lane] - 1]
                steps = max(steps, last if side == 0 else length - last)
        root[:] = 0.0
        for d in range(steps):
            step = d if side == 0 else length - 1 - d  # the row of a and source folded in
            for w in range(LANES):
                at[w] = (unit[base + w] * length + step) * n
            for k in range(n):
                for w in range(LANES):
                    decay[k, w] = flat_a[at[w] + k]
                    row[k, w] = flat_source[at[w] + k]
            # PAST: scale the old rows' columns by a_t, then add the row b_t;
            # FUTURE: add the row c_t, then scale every row's columns by a_t
            if side != 0:
                _fold(root, row, n)
            for i in range(n):
                for j in range(i, n):
                    for w in range(LANES):
                        root[i, j, w] *= decay[j, w]
            if side == 0:
                _fold(root, row, n)
            now = step + 1 if side == 0 else step  # the cut whose triangle root now holds
            for w in range(LANES):
                lane = base + w
                while ahead[w] < stop[lane] and cut[ahead[w]] == now:
                    target = out[slot[ahead[w]]]
                    for i in range(n):
                        for j in range(i, n):
                            target[i, j] = root[i, j, w]
                    ahead[w] += 1


def _warm_up() -> None:
    """The kernel's first call in a process, on a tiny problem (`compiled.first_call`)."""
    a = np.full((1, 4, 2), 0.5)
    lanes = np.zeros(LANES, dtype=np.int64)
    stop = lanes.copy()
    stop[0] = 1
    for side in (PAST, FUTURE):
        _sweep_roots(a, a, side, lanes, lanes, stop, np.full(1, 2, dtype=np.int64), lanes[:1], np.zeros((1, 2, 2)))
