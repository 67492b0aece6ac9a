"""Householder reduction of symmetric matrices to tridiagonal form, compiled (numba).

The dense kernel's first half (core/dense_kernel.py): A = Q T Q^T with T tridiagonal, whose
eigenvalues the QL iteration of core/tridiagonal_kernel.py then takes. Half of the reduction's
work is a matrix-vector product with the trailing matrix at every step, the other half the
rank-two update of that matrix, so its speed is how often each entry crosses between the caches
and the registers. `reduce_to_tridiagonal` gathers the reflectors PANEL columns at a time
(LAPACK's dsytrd / dlatrd): each column's product reads the trailing upper triangle without
writing it, and the panel's rank-2 PANEL update writes it once, four rows at a time.

Measured on an AVX2 core (16 graded Grams): 17-22 GF/s at n = 128-256, 1.16x the one-pass step
this kernel used before (LAPACK's dsytd2 with the update of step k and the product of step
k + 1 fused, each entry loaded and stored once per step; 0.8x of it at n = 20, where the whole
reduction takes 4 us). OpenBLAS's dsytrd reaches 8-14 GF/s on these sizes.

Every function here is inlined into the kernel that calls it (core/compiled.py: one compiled
copy of the arithmetic). Same arithmetic as LAPACK's, reordered: backward stable alike, every
eigenvalue of T within a small multiple of n eps ||A|| of A's. The reference is
`torch.linalg.eigvalsh` (tests/test_dense_kernel.py compares the kernel's eigenvalues with it).
"""

from __future__ import annotations

import numpy as np

from .compiled import jit

__all__ = ["PAD", "PANEL", "TINY", "reduction_buffers", "reduce_to_tridiagonal"]

TINY = float(np.finfo(np.float64).tiny)

PAD = 4  # spare columns: rows of the work matrix not a power of two apart in memory (3% at n = 256)
# Reflectors per panel. Measured on an AVX2 core, 16 Grams at n = 128 and 256: 4 1.16x the
# one-pass step, 2, 3 or 5 1.03x, 8 1.13-1.15x.
PANEL = 4


@jit(inline=True)
def _householder(row, lo, n, v):  # pragma: no cover - compiled
    """The Householder reflector I - beta v v^T that maps x = row[lo:n] to (alpha, 0, ..., 0):
    v written to v[lo:n] (unnormalised, v[lo] = x_0 - alpha); returns (beta, alpha). A zero x
    gives beta = 0 (no reflection) and alpha = x_0."""
    s2 = 0.0
    for j in range(np.uint64(lo), np.uint64(n)):
        s2 += row[j] * row[j]
    x0 = row[lo]
    norm = np.sqrt(s2)
    alpha = -norm if x0 >= 0 else norm
    v0 = x0 - alpha
    vnorm2 = s2 - x0 * x0 + v0 * v0
    v[lo] = v0
    for j in range(np.uint64(lo + 1), np.uint64(n)):
        v[j] = row[j]
    if vnorm2 > TINY:
        return 2.0 / vnorm2, alpha
    return 0.0, x0


@jit(inline=True)
def reduce_to_tridiagonal(a, n, d, e, v, vn, pn, vt, wt):  # pragma: no cover - compiled
    """The tridiagonal form (d, e) of the symmetric matrix whose UPPER triangle is a[:n, :n]
    (row i holds a[i, i:n]; a is destroyed): d (n,), e (n,), e[k] couples k and k + 1,
    e[n - 1] = 0. v, vn, pn: work vectors of length >= n; vt, wt (PANEL, >= n): the panel.

    Step k reflects rows/columns k + 1.. by I - beta v v^T, v from row k, and takes A <- A - v w^T
    - w v^T, w = p - K v, p = beta A v, K = beta (v . p) / 2 (LAPACK's dsytd2). A panel's steps
    k0..k0 + PANEL - 1 keep their v_q, w_q and leave a stale: step k reads its row k as
    a[k, k:] - sum_q (v_q[k] w_q[k:] + w_q[k] v_q[k:]) and its product as
    beta (a v - sum_q (v_q (w_q . v) + w_q (v_q . v))), one read-only pass (`_product_four_rows`),
    the q's being the panel's earlier steps; the panel's end subtracts all its terms from the
    trailing rows in one pass (`_update_rows`). The last two rows need no reflector."""
    k0 = 0
    end = np.uint64(n)
    while n - k0 > 2:  # a reflector for every column but the last two
        # the width read from the array: LLVM unrolled the loops over a constant one (1.1x slower)
        width = min(vt.shape[0], n - k0 - 2)
        for q in range(width):
            k = k0 + q
            lo = k + 1
            first, nxt = np.uint64(k), np.uint64(lo)
            for j in range(first, end):
                vn[j] = a[k, j]
            for r in range(q):
                vk, wk, rr = vt[r, k], wt[r, k], np.uint64(r)
                for j in range(first, end):
                    vn[j] -= vk * wt[rr, j] + wk * vt[rr, j]
            d[k] = vn[k]
            beta, e[k] = _householder(vn, lo, n, v)
            for j in range(nxt, end):
                pn[j] = 0.0
            i = lo
            while i < n:
                if n - i >= 4:
                    _product_four_rows(a, i, n, v, pn)
                    i += 4
                else:  # the last one to three rows
                    vi = v[i]
                    acc = a[i, i] * vi
                    row = np.uint64(i)
                    for j in range(row + np.uint64(1), end):
                        acc += a[row, j] * v[j]
                        pn[j] += a[row, j] * vi
                    pn[i] += acc
                    i += 1
            for r in range(q):
                rr = np.uint64(r)
                wv = 0.0
                vv = 0.0
                for j in range(nxt, end):
                    wv += wt[rr, j] * v[j]
                    vv += vt[rr, j] * v[j]
                for j in range(nxt, end):
                    pn[j] -= vt[rr, j] * wv + wt[rr, j] * vv
            kk = 0.0
            for j in range(nxt, end):
                pn[j] *= beta
                kk += v[j] * pn[j]
            kk *= 0.5 * beta
            qq = np.uint64(q)
            for j in range(nxt, end):
                wt[qq, j] = pn[j] - kk * v[j]
                vt[qq, j] = v[j]
        k0 += width
        i = k0
        while i < n:  # the panel's update of the trailing rows (from their diagonal on)
            rows = min(4, n - i)
            _update_rows(a, i, rows, n, vt, wt, width)
            i += rows
    # the last two rows, updated by the last panel: their 2 x 2 block is the form's end
    d[n - 1] = a[n - 1, n - 1]
    e[n - 1] = 0.0
    if n >= 2:
        d[n - 2] = a[n - 2, n - 2]
        e[n - 2] = a[n - 2, n - 1]


@jit(inline=True)
def _product_four_rows(a, i, n, x, p):  # pragma: no cover - compiled
    """Rows i..i+3's share of p = A x, A symmetric from its upper triangle (read, not written):
    the 4 x 4 diagonal block written out, then one vectorised loop over the columns right of it
    (each row's dot product, and the entries it stands for below the diagonal by an axpy)."""
    r0, r1, r2, r3 = a[i], a[i + 1], a[i + 2], a[i + 3]
    x0, x1, x2, x3 = x[i], x[i + 1], x[i + 2], x[i + 3]
    a01, a02, a03 = r0[i + 1], r0[i + 2], r0[i + 3]
    a12, a13, a23 = r1[i + 2], r1[i + 3], r2[i + 3]
    acc0 = r0[i] * x0 + a01 * x1 + a02 * x2 + a03 * x3
    acc1 = a01 * x0 + r1[i + 1] * x1 + a12 * x2 + a13 * x3
    acc2 = a02 * x0 + a12 * x1 + r2[i + 2] * x2 + a23 * x3
    acc3 = a03 * x0 + a13 * x1 + a23 * x2 + r3[i + 3] * x3
    i0 = np.uint64(i)
    i1, i2, i3 = i0 + np.uint64(1), i0 + np.uint64(2), i0 + np.uint64(3)
    for j in range(i0 + np.uint64(4), np.uint64(n)):
        y0, y1, y2, y3 = a[i0, j], a[i1, j], a[i2, j], a[i3, j]
        xj = x[j]
        acc0 += y0 * xj
        acc1 += y1 * xj
        acc2 += y2 * xj
        acc3 += y3 * xj
        p[j] += (y0 * x0 + y1 * x1) + (y2 * x2 + y3 * x3)
    p[i] += acc0
    p[i + 1] += acc1
    p[i + 2] += acc2
    p[i + 3] += acc3


@jit(inline=True)
def _update_rows(a, i, rows, n, vt, wt, terms):  # pragma: no cover - compiled
    """a[i + s, j] -= sum_{q < terms} (v_q[i + s] w_q[j] + w_q[i + s] v_q[j]) for s < rows
    (<= 4), the panel's terms (vt, wt), from column i on: a few entries left of the diagonal
    too, which nothing reads."""
    i0 = np.uint64(i)
    if rows == 4:
        i1, i2, i3 = i0 + np.uint64(1), i0 + np.uint64(2), i0 + np.uint64(3)
        for q in range(terms):
            v0, v1, v2, v3 = vt[q, i], vt[q, i + 1], vt[q, i + 2], vt[q, i + 3]
            w0, w1, w2, w3 = wt[q, i], wt[q, i + 1], wt[q, i + 2], wt[q, i + 3]
            qq = np.uint64(q)
            for j in range(i0, np.uint64(n)):
                wj, vj = wt[qq, j], vt[qq, j]
                a[i0, j] -= v0 * wj + w0 * vj
                a[i1, j] -= v1 * wj + w1 * vj
                a[i2, j] -= v2 * wj + w2 * vj
                a[i3, j] -= v3 * wj + w3 * vj
        return
    for s in range(rows):
        row = i0 + np.uint64(s)
        for q in range(terms):
            vi, wi, qq = vt[q, row], wt[q, row], np.uint64(q)
            for j in range(row, np.uint64(n)):
                a[row, j] -= vi * wt[qq, j] + wi * vt[qq, j]


@jit
def reduction_buffers(n):  # pragma: no cover - compiled
    """The work matrix, vectors and panel `reduce_to_tridiagonal` needs for matrices up to n x n
    (separate arrays: views of one made LLVM check them for overlap, and the loops slower)."""
    vectors = (np.empty(n + PAD), np.empty(n + PAD), np.empty(n + PAD))
    panel = (np.zeros((PANEL, n + PAD)), np.zeros((PANEL, n + PAD)))
    return np.empty((n, n + PAD)), vectors, panel
