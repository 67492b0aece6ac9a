"""The triangular roots of single cuts of diagonal recurrences, as one compiled CPU kernel (numba).

The Gramian route (core/gramian.py) redoes exactly the cuts its guard cannot certify: for a
unit's a, b, c (L, N) and a cut t, the R factors of

    F (t, N):     F_j = b_j prod_{m=j+1..t-1} a_m      (j < t: what the past wrote)
    G (L - t, N): G_i = c_i prod_{m=t..i} a_m          (i >= t: what the future reads)

so that sigma(H_t) = sigma(R_G R_F^T) and sigma(R_t) = sigma(R_F). A random Mamba-130m layer at
L = 512 sends about 4,000 such (unit, cut) pairs there, 0.5% of its cuts but a quarter of its
time in torch (`cut_roots_reference`: per batch of pairs, six (pairs, L, N) arrays of running
products and masks, then two batched QRs). Here LANES pairs run side by side, every loop
innermost over them: each pair's rows are formed as they are folded, F's from j = t - 1 down
(its product grows by one decay a row), G's from i = t up, into an N x N triangle by Givens
rotations. Nothing is stored but the two triangles.

Accuracy: Givens QR, like Householder QR, is columnwise backward stable (Higham, Accuracy and
Stability of Numerical Algorithms, 2nd ed., Thm. 19.10): R is the exact factor of F + dF with
||dF e_k|| <= c L N eps ||F e_k|| for each state component k, the bound the reference's QR
meets; the row order changes R only by an orthogonal factor on the left, which leaves both
spectra alone. The rotations' lengths are scaled outside the squares' normal range (`_fold`), so
entries far below 1e-154, whose squares underflow, are kept as LAPACK keeps them. A lane whose
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
    value): by the kernel on a CPU where numba runs, its blocks of pairs spread over the worker
    threads, else by the reference in batches of REFERENCE_PAIRS."""
    if not (available() and a.device.type == "cpu" and a.dtype == torch.float64):
        return _by_reference(a, b, c, units, times)
    order = torch.argsort(times.cpu())  # lanes of similar cuts: little padding in a block
    pairs, n = len(order), a.shape[-1]
    blocks = -(-pairs // LANES)
    unit = np.zeros(blocks * LANES, dtype=np.int64)
    cut = np.zeros(blocks * LANES, dtype=np.int64)
    unit[:pairs], cut[:pairs] = units.cpu()[order].numpy(), times.cpu()[order].numpy()
    arrays = [np.ascontiguousarray(x.detach().numpy()) for x in (a, b, c)]
    roots = np.zeros((blocks, 2, n, n, LANES))
    compiled.first_call(_cut_roots, _warm_up)

    def run(chunk: slice) -> None:
        lanes = slice(chunk.start * LANES, chunk.stop * LANES)
        _cut_roots(*arrays, unit[lanes], cut[lanes], pairs - lanes.start, roots[chunk])

    workers = worker_threads(a.device)
    over_chunks(run, blocks, max(1, -(-blocks // (4 * workers))), workers)
    # (blocks, 2, N, N, LANES) -> (2, pairs, N, N), back in the callers' order
    both = torch.from_numpy(roots).permute(1, 0, 4, 2, 3).reshape(2, blocks * LANES, n, n)[:, :pairs]
    out = torch.empty_like(both)
    out[:, order] = both
    reach, observe = out[0], out[1]
    bad = ~(reach.isfinite().flatten(1).all(1) & observe.isfinite().flatten(1).all(1))
    if bool(bad.any()):  # overflow: the reference's scaled QR computes them again
        for whole, part in zip((reach, observe), _by_reference(a, b, c, units[bad], times[bad])):
            whole[bad] = 0.0
            whole[bad, : part.shape[1]] = part
    return reach, observe


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
def _cut_roots(a, b, c, unit, cut, pairs, roots):  # pragma: no cover - compiled
    """roots[blk, 0] <- R_F and roots[blk, 1] <- R_G (module docstring) of the pairs p =
    blk * LANES + w (w < LANES; those from ``pairs`` on stay zero): unit unit[p]'s a, b, c
    (U, L, N), cut cut[p]. roots (blocks, 2, N, N, LANES), zero on entry."""
    length, n = a.shape[1], a.shape[2]
    row = np.empty((n, LANES))
    product = np.empty((n, LANES))
    flat_a, flat_b, flat_c = a.reshape(-1), b.reshape(-1), c.reshape(-1)  # C-ordered (`cut_roots`)
    at = np.empty(LANES, dtype=np.int64)  # each lane's row of its unit's a and b or c at this step
    on = np.empty(LANES, dtype=np.bool_)
    for blk in range(roots.shape[0]):
        first = blk * LANES
        live = max(0, min(LANES, pairs - first))
        most_past = 0
        most_future = 0
        for w in range(live):
            most_past = max(most_past, cut[first + w])
            most_future = max(most_future, length - cut[first + w])
        for side in range(2):
            for k in range(n):
                for w in range(LANES):
                    product[k, w] = 1.0
            source = flat_b if side == 0 else flat_c
            for d in range(most_past if side == 0 else most_future):
                # F's rows, j = t - 1 - d: b_j times the decays after it; G's rows, i = t + d:
                # c_i times the decays from t to i. A lane past its rows reads a valid row and
                # folds in zeros. The rows are gathered state by state across the lanes, so
                # that the loops run over the lanes (a loop over a lane's states, strided in
                # row and product, took as long as the rotations).
                for w in range(LANES):
                    step = cut[first + w] - 1 - d if side == 0 else cut[first + w] + d
                    inside = w < live and 0 <= step < length
                    on[w] = inside
                    at[w] = (unit[first + w] * length + (step if inside else 0)) * n
                for k in range(n):
                    if side == 0:
                        for w in range(LANES):
                            row[k, w] = source[at[w] + k] * product[k, w] if on[w] else 0.0
                            product[k, w] *= flat_a[at[w] + k]
                    else:
                        for w in range(LANES):
                            product[k, w] *= flat_a[at[w] + k]
                            row[k, w] = source[at[w] + k] * product[k, w] if on[w] else 0.0
                _fold(roots[blk, side], row, n)


def _warm_up() -> None:
    """The kernel's first call in a process, on a tiny problem (`compiled.first_call`)."""
    a = torch.full((1, 4, 2), 0.5, dtype=torch.float64)
    unit, cut = np.zeros(LANES, dtype=np.int64), np.full(LANES, 2, dtype=np.int64)
    _cut_roots(*(x.numpy() for x in (a, a, a)), unit, cut, 1, np.zeros((1, 2, 2, 2, LANES)))
