"""The QL iteration for LANES symmetric tridiagonal matrices side by side (numba).

Implicit QL with Wilkinson-type shifts (Numerical Recipes' tqli, eigenvalues only), run for
all lanes at once: each lane has its own first unconverged row, split point and shift, and a
rotation outside a lane's rows leaves that lane unchanged (masked by a select), so control
flow is shared and every loop over the lanes vectorises; the division and square root of
each rotation, which leave one core's vector units idle in LAPACK's dsterf, then serve 64
matrices at once. Shared by the Gramian kernel (core/gramian_kernel.py, n = N) and the dense
path's kernel (core/dense_kernel.py, n up to L / 2). Its reference is LAPACK
(`numpy.linalg.eigvalsh` of the tridiagonal, in the tests).
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
MAX_QL_SWEEPS = 60  # per eigenvalue, on average over a lane's n (it needs about 3): this only stops a failure


@jit
def _tridiagonal_eigenvalues(d, e, n, failed):  # pragma: no cover - compiled
    """Eigenvalues of the tridiagonal (d, e) of every lane, IN PLACE in d (unsorted): the
    implicit QL iteration (module docstring). failed[w] is set where a lane does not converge.

    Branch-free over the lanes (selects of values, 0/1 blends of stores; no ifs), so that
    the compiler vectorises it without masked stores. Each lane keeps its own top (its first
    unconverged row), split point, shift and rotations, and a sweep rotates every lane
    between its own top and split: a lane does exactly the sweeps tqli would do for it
    alone. (Waiting instead for all lanes to converge at each top costs the slowest of 64
    lanes at every eigenvalue: measured 1.6x the rotations.) The rows where every unfinished
    lane rotates, 60-90% of a sweep's, skip the masks (`_rotate_all`): a finished lane's
    off-diagonals are zeroed once and its shift is zero, so its rotation there leaves it
    exactly as it is, and the eigenvalues are the masked rows' own, bit for bit."""
    top = np.zeros(LANES, dtype=np.int64)
    split = np.empty(LANES, dtype=np.int64)
    sweeps = np.zeros(LANES, dtype=np.int64)
    live = np.empty(LANES, dtype=np.bool_)
    s = np.empty(LANES)
    c = np.empty(LANES)
    g = np.empty(LANES)
    p = np.empty(LANES)
    first = np.empty(LANES)
    last = np.empty(LANES)
    runs = np.empty(LANES)
    inert = np.zeros(LANES, dtype=np.bool_)
    rows = np.arange(n)
    while True:
        lowest = n - 1
        for w in range(LANES):
            lowest = min(lowest, top[w])
        for w in range(LANES):
            split[w] = n - 1
        # One pass: each lane's top moves past its negligible off-diagonals, and its split is the
        # first negligible one after its top (a top below m stopped there for this sweep). Two
        # passes, one for each, cost 4-8% more of the QL (the same tops and splits).
        for m in range(lowest, n - 1):
            for w in range(LANES):
                small = (abs(e[m, w]) <= EPS * (abs(d[m, w]) + abs(d[m + 1, w]))) | (abs(e[m, w]) <= DEFLATE)
                found = small & (m > top[w]) & (split[w] == n - 1)
                top[w] += (top[w] == m) & small
                split[w] += found * (m - split[w])
        lowest = n - 1
        for w in range(LANES):
            lowest = min(lowest, top[w])
        if lowest == n - 1:  # every lane's eigenvalues have converged
            break
        highest = 0
        every_from, every_to = 0, n  # the rows where every live lane rotates: no masks (`_rotate_all`)
        for w in range(LANES):
            live[w] = top[w] < n - 1
            sweeps[w] += live[w]
            stuck = live[w] and sweeps[w] > MAX_QL_SWEEPS * n
            failed[w] = failed[w] or stuck
            top[w] = n - 1 if stuck else top[w]  # given up: the caller redoes its cut
            live[w] = live[w] and not stuck
            highest = max(highest, split[w] if live[w] else 0)
            every_from = max(every_from, top[w] if live[w] else 0)
            every_to = min(every_to, split[w] if live[w] else n)
        for w in range(LANES):  # a lane done (or given up): its off-diagonals, all negligible, to zeros, once
            if not (live[w] or inert[w]):
                for m in range(n):
                    e[m, w] = 0.0
                inert[w] = True
        for w in range(LANES):  # each lane's Wilkinson-type shift, from its own top
            k = top[w] if live[w] else 0
            el = e[k, w] if live[w] else 1.0
            gg = (d[k + 1, w] - d[k, w]) / (2.0 * el)
            r = np.sqrt(gg * gg + 1.0)
            # zero for a lane done: with its zero off-diagonals, a rotation then leaves it as it is
            g[w] = (d[split[w], w] - d[k, w] + el / (gg + (r if gg >= 0 else -r))) if live[w] else 0.0
            s[w] = 1.0
            c[w] = 1.0
            p[w] = 0.0
            # the sweep's masks as floats: compared and blended with no byte or integer masks
            # (40% fewer instructions in the rotation loop, 6-8% of its time)
            first[w] = top[w]
            last[w] = split[w]
            runs[w] = 1.0 if live[w] else 0.0
        for i in range(highest - 1, lowest - 1, -1):
            if every_from <= i < every_to:
                if _rotate_all(d, e, rows[i], s, c, g, p, runs):  # a lane stopped: masks again
                    every_to = 0
                continue
            row = np.float64(i)
            for w in range(LANES):
                on = (runs[w] > 0.0) & (row < last[w]) & (row >= first[w])
                b = c[w] * e[i, w]
                r, sn, cn, gi, r2, pn = _rotation(s[w] * e[i, w], b, g[w], d[i, w], d[i + 1, w], p[w])
                rotate = on & (r > 0)
                # Every entry is stored, blended by 0.0 / 1.0 factors (exact: x * 1 + y * 0 = x
                # for finite y), not by a select: LLVM turns `x if on else a[i]` into a masked
                # store, microcoded on AMD's AVX2 cores, where the QL then took 1.8x as long
                # (two GPT-2 layers at L = 512, one thread: 7.9 s -> 6.7 s, the same bits).
                step = 1.0 if on else 0.0
                move = 1.0 if rotate else 0.0
                stay = 1.0 - step
                keep = 1.0 - move
                e[i + 1, w] = step * r + stay * e[i + 1, w]
                d[i + 1, w] = step * (gi + move * pn) + stay * d[i + 1, w]
                s[w] = move * sn + keep * s[w]
                c[w] = move * cn + keep * c[w]
                g[w] = move * (cn * r2 - b) + keep * g[w]
                p[w] = move * pn + keep * p[w]
                # r == 0 (underflow): this lane's sweep stops here and restarts (tqli's recovery).
                # Written last: a store to the mask before the others keeps LLVM from vectorising.
                runs[w] *= stay + move  # 0 where on and not rotate (rotate implies on)
        for w in range(LANES):  # each lane's own rows: d[top] and e[top] gain the sweep, e[split] = 0
            if top[w] < n - 1:
                if runs[w] > 0.0:  # live through the whole sweep
                    d[top[w], w] -= p[w]
                    e[top[w], w] = g[w]
                e[split[w], w] = 0.0


@jit(inline=True)
def _rotate_all(d, e, i, s, c, g, p, runs):  # pragma: no cover - compiled
    """Row i of a QL sweep where every lane rotates (each live lane is between its top and
    split; a lane done has zero off-diagonals and g = 0, so its rotation is the identity on
    its d and e): the masked row of `_tridiagonal_eigenvalues` without its masks and blends,
    the same values; the QL 1.1-1.2x as fast at n >= 64, 1.07x at 16. Returns how many live
    lanes stopped (r == 0: underflow, or not finite), whose rotation the masked row would have
    skipped; their later rows must take the masked row again.

    ``i`` comes through memory (an array), not from the caller's row loop: given the loop
    variable, LLVM hoisted this loop's overlap checks out of the descending row loop and, unable
    to bound a descending range, failed them always, so this loop ran scalar (the QL then took
    1.5x as long as with masks everywhere)."""
    stopped = 0
    for w in range(LANES):
        b = c[w] * e[i, w]
        r, sn, cn, gi, r2, pn = _rotation(s[w] * e[i, w], b, g[w], d[i, w], d[i + 1, w], p[w])
        move = 1.0 if r > 0 else 0.0
        e[i + 1, w] = r
        d[i + 1, w] = gi + move * pn
        s[w] = sn
        c[w] = cn
        g[w] = cn * r2 - b
        p[w] = pn
        stopped += (runs[w] > 0.0) & (move == 0.0)
        runs[w] *= move
    return stopped


@jit(inline=True)
def _rotation(f, b, g, d_i, d_next, p):  # pragma: no cover - compiled
    """One lane's QL rotation at a row (tqli): f = s e_i, b = c e_i, the running g and p, and
    the row's diagonal entries. Returns r (the new e_{i+1}), the new s and c, g_i = d_{i+1} - p,
    r2 (the new g is c r2 - b) and the new p = s r2. Where r == 0 (f^2 + g^2 underflowed) it
    divides by 1 instead; the callers then stop the lane's sweep and keep only e_{i+1} = 0 and
    d_{i+1} = g_i of that row."""
    r = np.sqrt(f * f + g * g)
    inv = 1.0 / (r if r > 0 else 1.0)
    sn = f * inv
    cn = g * inv
    gi = d_next - p
    r2 = (d_i - gi) * sn + 2.0 * cn * b
    return r, sn, cn, gi, r2, sn * r2
