"""The QL iteration for LANES symmetric tridiagonal matrices side by side (numba).

The root-free implicit QL iteration of Pal, Walker and Kahan (LAPACK's dsterf: eigenvalues
only), with tqli's Wilkinson-type shifts, run for all lanes at once: each lane has its own
first unconverged row, split point and shift, and a rotation outside a lane's rows leaves
that lane unchanged (masked by a blend), so control flow is shared and every loop over the
lanes vectorises; the divisions of each rotation, which leave one core's vector units idle
in LAPACK's dsterf, then serve 64 matrices at once. Root-free: the iteration carries the
squares of the off-diagonals, so a rotation costs two divisions and no square root (tqli's
costs a square root and a division; the square root took most of a row's time on the vector
units: a 64-lane row 1.55x as fast alone, the whole QL 1.1-1.25x). Shared by the Gramian
kernel (core/gramian_kernel.py, n = N) and the dense path's kernel (core/dense_kernel.py, n
up to L / 2). Its reference is LAPACK (`numpy.linalg.eigvalsh` of the tridiagonal, in the
tests).
"""

from __future__ import annotations

import numpy as np

from .compiled import LANES, jit

__all__ = ["LANES", "DEFLATE", "MAX_QL_SWEEPS"]

EPS = float(np.finfo(np.float64).eps)
# An off-diagonal below DEFLATE (the callers scale their matrices to trace 1, or to at least
# their largest entry) is dropped: that moves an eigenvalue by less than the error bound the
# callers already allow (>= n eps ||M||).
DEFLATE = EPS
EPS2, DEFLATE2 = EPS * EPS, DEFLATE * DEFLATE  # the same tests on the squared off-diagonals
MAX_QL_SWEEPS = 60  # per eigenvalue, on average over a lane's n (it needs about 3): this only stops a failure


@jit
def _tridiagonal_eigenvalues(d, e, n, failed):  # pragma: no cover - compiled
    """Eigenvalues of the tridiagonal (d, e) of every lane, IN PLACE in d (unsorted; e is
    overwritten): the root-free QL iteration (module docstring). failed[w] is set where a
    lane does not converge.

    The sweeps are branch-free over the lanes (selects of values, 0/1 blends of stores; no
    ifs), so that the compiler vectorises them without masked stores. Each lane keeps its own
    top (its first unconverged row), split point, shift and rotations, and a sweep rotates
    every lane between its own top and split: a lane does the sweeps dsterf would do for it
    alone, but for the splits that dsterf would find between its top and split after the
    first sweep, which it rotates across until its top reaches them (below). (Waiting instead
    for all lanes to converge at each top costs the slowest of 64 lanes at every eigenvalue:
    measured 1.6x the rotations.) The rows where every unfinished lane rotates, 60-90% of a
    sweep's, skip the masks (`_rotate_all`)."""
    top = np.zeros(LANES, dtype=np.int64)
    split = np.empty(LANES, dtype=np.int64)
    sweeps = np.zeros(LANES, dtype=np.int64)
    live = np.empty(LANES, dtype=np.bool_)
    s = np.empty(LANES)
    c = np.empty(LANES)
    gamma = np.empty(LANES)
    p = np.empty(LANES)
    sigma = np.empty(LANES)
    first = np.empty(LANES)
    last = np.empty(LANES)
    runs = np.empty(LANES)
    inert = np.zeros(LANES, dtype=np.bool_)
    top_d = np.empty(LANES)
    top_d1 = np.empty(LANES)
    top_e2 = np.empty(LANES)
    split_d = np.empty(LANES)
    rows = np.arange(n)
    for m in range(n):  # the iteration carries the squared off-diagonals
        for w in range(LANES):
            e[m, w] = e[m, w] * e[m, w]
    # Each lane's first top and split in one vectorised pass over the rows: its top moves past
    # its negligible off-diagonals, its split is the first negligible one after the top.
    # Negligible: |e| <= eps (|d_m| + |d_m+1|) or |e| <= DEFLATE (dsterf's test), squared.
    for w in range(LANES):
        split[w] = n - 1
    for m in range(n - 1):
        for w in range(LANES):
            near = abs(d[m, w]) + abs(d[m + 1, w])
            small = (e[m, w] <= EPS2 * (near * near)) | (e[m, w] <= DEFLATE2)
            found = small & (m > top[w]) & (split[w] == n - 1)
            top[w] += (top[w] == m) & small
            split[w] += found * (m - split[w])
    swept = False  # whether the lanes have done a sweep, to be finished below
    for w in range(LANES):
        live[w] = False
    while True:
        # One scalar pass over the lanes between two sweeps (one instead of five: 8% of the QL
        # at n = 16): finish the sweep just done, move each lane's top and split on, and set up
        # the next sweep, gathering the entries each lane's shift reads at its own rows so that
        # the shift's arithmetic below vectorises.
        lowest, highest = n - 1, 0
        every_from, every_to = 0, n  # the rows where every live lane rotates: no masks (`_rotate_all`)
        for w in range(LANES):
            if live[w]:  # its own rows: d[top] and e[top] gain the sweep, e[split] = 0
                e[top[w], w] = s[w] * p[w]
                d[top[w], w] = sigma[w] + gamma[w]
                e[split[w], w] = 0.0
            k = top[w]
            # Its next top and split, from the rows that can have changed: the top moves past
            # the off-diagonals that became negligible at it (QL deflates there), and a top that
            # reached its split (its block converged) looks for the next split from there. The
            # rows between top and split are not tested again (the whole-block test at every
            # sweep was a third of the QL at n = 16-64): one that became negligible there, which
            # is rare, is rotated across until the top reaches it, an exact similarity all the
            # same. Written out: as an inlined helper (numba's IR inlining) the QL took 1.2-1.7x
            # as long.
            if swept:
                while k < n - 1:
                    near = abs(d[k, w]) + abs(d[k + 1, w])
                    if (e[k, w] <= EPS2 * (near * near)) or (e[k, w] <= DEFLATE2):
                        k += 1
                    else:
                        break
                if k >= split[w] and k < n - 1:  # past its block: the next split
                    m = k + 1
                    while m < n - 1:
                        near = abs(d[m, w]) + abs(d[m + 1, w])
                        if (e[m, w] <= EPS2 * (near * near)) or (e[m, w] <= DEFLATE2):
                            break
                        m += 1
                    split[w] = m
            on = k < n - 1
            sweeps[w] += on
            stuck = on and sweeps[w] > MAX_QL_SWEEPS * n
            failed[w] = failed[w] or stuck
            k = n - 1 if stuck else k  # given up: the caller redoes its cut
            on = on and not stuck
            top[w] = k
            live[w] = on
            if not (on or inert[w]):  # done (or given up): its off-diagonals, all negligible, to zeros, once
                for m in range(n):
                    e[m, w] = 0.0
                inert[w] = True
            j = k if on else 0  # the entries its shift reads
            top_d[w] = d[j, w]
            top_d1[w] = d[j + 1, w] if on else 0.0
            top_e2[w] = e[j, w] if on else 1.0
            split_d[w] = d[split[w], w] if on else 0.0
            # the sweep's masks as floats: compared and blended with no byte or integer masks
            # (40% fewer instructions in the rotation loop, 6-8% of its time)
            runs[w] = 1.0 if on else 0.0
            first[w] = k
            last[w] = split[w]
            lowest = min(lowest, k)
            if on:
                highest = max(highest, split[w])
                every_from = max(every_from, k)
                every_to = min(every_to, split[w])
        swept = True
        if lowest == n - 1:  # every lane's eigenvalues have converged
            break
        for w in range(LANES):  # each lane's Wilkinson-type shift sigma, from its own top (dsterf's)
            on = runs[w] > 0.0
            # d_k - e / (g + sign(g) sqrt(g^2 + 1)), g = (d_k+1 - d_k) / 2e, multiplied through by
            # e: one square root and one division instead of two of each
            half = 0.5 * (top_d1[w] - top_d[w])
            root = np.sqrt(half * half + top_e2[w])
            sigma[w] = (top_d[w] - top_e2[w] / (half + (root if half >= 0 else -root))) if on else 0.0
            # a lane done: gamma = p = 0 and zero off-diagonals, so an unmasked row leaves its e
            # at zero and computes finite values for its d, which the row then discards
            gamma[w] = (split_d[w] - sigma[w]) if on else 0.0
            p[w] = gamma[w] * gamma[w]
            s[w] = 0.0
            c[w] = 1.0
        for i in range(highest - 1, lowest - 1, -1):
            if every_from <= i < every_to:
                _rotate_all(d, e, rows[i], s, c, gamma, p, sigma, runs)
                continue
            row = np.float64(i)
            for w in range(LANES):
                on = (runs[w] > 0.0) & (row < last[w]) & (row >= first[w])
                e_next, d_next, sn, cn, gn, pn = _rotation(e[i, w], d[i, w], s[w], c[w], gamma[w], p[w], sigma[w])
                # Every entry is stored, blended by 0.0 / 1.0 factors (exact: x * 1 + y * 0 = x
                # for finite y), not by a select: LLVM turns `x if on else a[i]` into a masked
                # store, microcoded on AMD's AVX2 cores, where the QL then took 1.8x as long
                # (two GPT-2 layers at L = 512, one thread: 7.9 s -> 6.7 s, the same bits).
                step = 1.0 if on else 0.0
                stay = 1.0 - step
                e[i + 1, w] = step * e_next + stay * e[i + 1, w]
                d[i + 1, w] = step * d_next + stay * d[i + 1, w]
                s[w] = step * sn + stay * s[w]
                c[w] = step * cn + stay * c[w]
                gamma[w] = step * gn + stay * gamma[w]
                p[w] = step * pn + stay * p[w]


@jit(inline=True)
def _rotate_all(d, e, i, s, c, gamma, p, sigma, runs):  # pragma: no cover - compiled
    """Row i of a QL sweep where every live lane rotates (each is between its top and split):
    the masked row of `_tridiagonal_eigenvalues` without its masks and blends but one, the
    same values. A lane done has zero off-diagonals and s = 0, so its e stays zero; its d is
    kept by a blend with ``runs`` (0 for it), since the root-free rotation writes d[i + 1]
    from the carried gamma, not from d[i + 1] itself. No live lane stops here (tqli's r = 0):
    r = p + e_i^2 >= e_i^2 > DEFLATE2 between a lane's top and split.

    ``i`` comes through memory (an array), not from the caller's row loop: given the loop
    variable, LLVM hoisted this loop's overlap checks out of the descending row loop and, unable
    to bound a descending range, failed them always, so this loop ran scalar."""
    for w in range(LANES):
        e_next, d_next, sn, cn, gn, pn = _rotation(e[i, w], d[i, w], s[w], c[w], gamma[w], p[w], sigma[w])
        e[i + 1, w] = e_next
        d[i + 1, w] = runs[w] * d_next + (1.0 - runs[w]) * d[i + 1, w]
        s[w] = sn
        c[w] = cn
        gamma[w] = gn
        p[w] = pn


@jit(inline=True)
def _rotation(bb, alpha, s, c, gamma, p, sigma):  # pragma: no cover - compiled
    """One lane's root-free QL rotation at row i (dsterf's inner loop): bb = e_i^2, alpha =
    d_i, the running s, c, gamma and p, and the sweep's shift sigma. Returns the new e_{i+1}^2
    (s r), the new d_{i+1}, s, c, gamma and p. r = p + bb is positive wherever a lane rotates
    (`_rotate_all`); elsewhere it divides by 1 instead, for a value that is discarded."""
    r = p + bb
    inv = 1.0 / (r if r > 0 else 1.0)
    cn = p * inv
    sn = bb * inv
    gn = cn * (alpha - sigma) - sn * gamma
    pn = (gn * gn) / cn if cn != 0 else c * bb
    return s * r, gamma + (alpha - gn), sn, cn, gn, pn
