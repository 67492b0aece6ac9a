"""Householder reduction of symmetric matrices to tridiagonal form, compiled (numba).

The dense kernel's first half (core/dense_kernel.py): A = Q T Q^T with T tridiagonal, whose
eigenvalues the QL iteration of core/tridiagonal_kernel.py then takes. Half of the reduction's
work is a matrix-vector product that reads the whole trailing matrix at every step, the other
half the rank-two update that writes it, so its speed is how often each entry crosses between
the caches and the registers:

- `reduce_to_tridiagonal` gathers the reflectors PANEL columns at a time (LAPACK's dsytrd /
  dlatrd): each column's product reads the trailing upper triangle without writing it, and
  the panel's rank-2 PANEL update writes it once, four rows at a time;
- its last UNBLOCKED columns take `_tridiagonalise`, one fused pass per step (LAPACK's dsytd2,
  with the rank-two update of step k and the product of step k + 1 in one pass, so each entry
  is loaded and stored once per step).

On an AVX2 core the panels are 1.16x as fast as the fused step alone at n = 128 and 256 (16
Grams, 14-19 -> 17-22 GF/s); fusing a panel's update with the next panel's first product, as
the fused step does, made them slower (1.16x -> 1.0x).

Every function here is inlined into the kernel that calls it (core/compiled.py: one compiled
copy of the arithmetic). Same arithmetic as LAPACK's, reordered: backward stable alike, every
eigenvalue of T within a small multiple of n eps ||A|| of A's. The reference is
`torch.linalg.eigvalsh` (tests/test_dense_kernel.py compares the kernel's eigenvalues with it).
"""

from __future__ import annotations

import numpy as np

from .compiled import jit

__all__ = ["PAD", "PANEL", "UNBLOCKED", "reduction_buffers", "reduce_to_tridiagonal"]

TINY = float(np.finfo(np.float64).tiny)

PAD = 4  # spare columns: rows of the work matrix not a power of two apart in memory (3% at n = 256)
# The panel width and the columns left to the fused step (`reduce_to_tridiagonal`). Measured
# on an AVX2 core, 16 Grams: PANEL = 4 1.16x the fused step alone at n = 128 and 256, 2, 3 or
# 5 1.03x, 8 1.13-1.15x; UNBLOCKED = 16, 32 or 64 the same.
PANEL = 4
UNBLOCKED = 32


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
def _tridiagonalise(a, n, d, e, v, w, vn, pn):  # pragma: no cover - compiled
    """The Householder tridiagonal form (d, e) of the symmetric matrix whose UPPER triangle is
    a[:n, :n] (row i holds a[i, i:n]; a is destroyed): d (n,), e (n,), e[k] couples k and
    k + 1, e[n - 1] = 0. v, w, vn, pn: work vectors of length >= n.

    Step k reflects rows/columns k+1.. with v_k: A <- A - v w^T - w v^T, w = p - K v,
    p = beta A v, K = beta (v . p) / 2 (LAPACK's dsytd2). The update of step k and the
    product p_{k+1} = beta' A v_{k+1} of step k + 1 are one pass: row k + 1 is updated first
    (it gives v_{k+1}), then every later row is updated and, while in registers, multiplied
    into p_{k+1} (by the row's dot product for its own entry, by an axpy for the entries its
    upper-triangle part stands for below the diagonal)."""
    if n <= 2:
        d[0] = a[0, 0]
        e[0] = a[0, 1] if n == 2 else 0.0
        if n == 2:
            d[1] = a[1, 1]
            e[1] = 0.0
        return
    d[0] = a[0, 0]
    beta, e[0] = _householder(a[0], 1, n, v)
    for j in range(n):  # step 0's product, on its own
        w[j] = 0.0
    for i in range(1, n):
        vi = v[i]
        acc = a[i, i] * vi
        row = np.uint64(i)
        for j in range(row + np.uint64(1), np.uint64(n)):
            acc += a[row, j] * v[j]
            w[j] += a[row, j] * vi
        w[i] += acc
    for j in range(np.uint64(1), np.uint64(n)):
        w[j] *= beta
    for k in range(n - 2):
        lo = k + 1
        # unsigned indices in every loop over columns: numba then drops its negative-index
        # wraparound and LLVM vectorises the loop (with signed ones it stays scalar)
        first, end = np.uint64(lo), np.uint64(n)
        kk = 0.0
        for j in range(first, end):
            kk += v[j] * w[j]
        kk *= 0.5 * beta
        for j in range(first, end):
            w[j] -= kk * v[j]
        vi = v[lo]
        wi = w[lo]
        for j in range(first, end):
            a[first, j] -= vi * w[j] + wi * v[j]
        d[lo] = a[lo, lo]
        if lo == n - 2:  # the last step: row n - 1 alone, then the last 2 x 2 block
            a[n - 1, n - 1] -= 2.0 * v[n - 1] * w[n - 1]
            e[lo] = a[lo, n - 1]
            d[n - 1] = a[n - 1, n - 1]
            break
        beta_next, e[lo] = _householder(a[lo], lo + 1, n, vn)
        for j in range(first + np.uint64(1), end):
            pn[j] = 0.0
        i = lo + 1
        while i < n:
            if n - i >= 4:
                _four_rows(a, i, n, v, w, vn, pn)
                i += 4
            else:  # the last one to three rows
                vi = v[i]
                wi = w[i]
                ni = vn[i]
                u = a[i, i] - 2.0 * vi * wi
                a[i, i] = u
                acc = u * ni
                row = np.uint64(i)
                for j in range(row + np.uint64(1), end):
                    u = a[row, j] - (vi * w[j] + wi * v[j])
                    a[row, j] = u
                    acc += u * vn[j]
                    pn[j] += u * ni
                pn[i] += acc
                i += 1
        for j in range(first + np.uint64(1), end):
            w[j] = pn[j] * beta_next
            v[j] = vn[j]
        beta = beta_next
    e[n - 1] = 0.0


@jit(inline=True)
def _four_rows(a, i, n, v, w, vn, pn):  # pragma: no cover - compiled
    """Rows i..i+3 of `_tridiagonalise`'s fused pass: the update A -= v w^T + w v^T on their
    upper-triangle entries and their share of pn = A vn. The 4 x 4 diagonal block is written
    out (straight-line code), the rest is one loop over the columns right of it, vectorised,
    with the four rows' entries in registers."""
    r0 = a[i]
    r1 = a[i + 1]
    r2 = a[i + 2]
    r3 = a[i + 3]
    v0, w0, n0 = v[i], w[i], vn[i]
    v1, w1, n1 = v[i + 1], w[i + 1], vn[i + 1]
    v2, w2, n2 = v[i + 2], w[i + 2], vn[i + 2]
    v3, w3, n3 = v[i + 3], w[i + 3], vn[i + 3]
    u00 = r0[i] - 2.0 * v0 * w0
    u01 = r0[i + 1] - (v0 * w1 + w0 * v1)
    u02 = r0[i + 2] - (v0 * w2 + w0 * v2)
    u03 = r0[i + 3] - (v0 * w3 + w0 * v3)
    u11 = r1[i + 1] - 2.0 * v1 * w1
    u12 = r1[i + 2] - (v1 * w2 + w1 * v2)
    u13 = r1[i + 3] - (v1 * w3 + w1 * v3)
    u22 = r2[i + 2] - 2.0 * v2 * w2
    u23 = r2[i + 3] - (v2 * w3 + w2 * v3)
    u33 = r3[i + 3] - 2.0 * v3 * w3
    r0[i], r0[i + 1], r0[i + 2], r0[i + 3] = u00, u01, u02, u03
    r1[i + 1], r1[i + 2], r1[i + 3] = u11, u12, u13
    r2[i + 2], r2[i + 3] = u22, u23
    r3[i + 3] = u33
    i0 = np.uint64(i)
    i1 = i0 + np.uint64(1)
    i2 = i0 + np.uint64(2)
    i3 = i0 + np.uint64(3)
    acc0 = u00 * n0 + u01 * n1 + u02 * n2 + u03 * n3
    acc1 = u01 * n0 + u11 * n1 + u12 * n2 + u13 * n3
    acc2 = u02 * n0 + u12 * n1 + u22 * n2 + u23 * n3
    acc3 = u03 * n0 + u13 * n1 + u23 * n2 + u33 * n3
    # unsigned indices, as in `_tridiagonalise` (slices instead cost 8 views per call)
    for j in range(i0 + np.uint64(4), np.uint64(n)):
        wj = w[j]
        vj = v[j]
        nj = vn[j]
        x0 = a[i0, j] - v0 * wj - w0 * vj
        x1 = a[i1, j] - v1 * wj - w1 * vj
        x2 = a[i2, j] - v2 * wj - w2 * vj
        x3 = a[i3, j] - v3 * wj - w3 * vj
        a[i0, j] = x0
        a[i1, j] = x1
        a[i2, j] = x2
        a[i3, j] = x3
        acc0 += x0 * nj
        acc1 += x1 * nj
        acc2 += x2 * nj
        acc3 += x3 * nj
        pn[j] += (x0 * n0 + x1 * n1) + (x2 * n2 + x3 * n3)
    pn[i] += acc0
    pn[i + 1] += acc1
    pn[i + 2] += acc2
    pn[i + 3] += acc3


@jit(inline=True)
def reduce_to_tridiagonal(a, n, d, e, v, w, vn, pn, vt, wt, dt, et):  # pragma: no cover - compiled
    """`_tridiagonalise`'s form (d, e) of the matrix whose UPPER triangle is a[:n, :n], with the
    reflectors gathered PANEL at a time (LAPACK's dsytrd / dlatrd): a is updated once per panel,
    by the rank-2 PANEL term sum_q (v_q w_q^T + w_q v_q^T), instead of once per column. Within a
    panel each column reads the stale trailing matrix and subtracts the panel's earlier terms:
    its row k is a[k, k:] - sum_q (v_q[k] w_q[k:] + w_q[k] v_q[k:]), and its product
    p = beta A v is beta (a v - sum_q (v_q (w_q . v) + w_q (v_q . v))), one read-only pass
    (`_product_four_rows`) where the fused step reads and writes every entry. The last
    UNBLOCKED columns, copied to a's corner, take the fused step. vt, wt (PANEL, >= n): the
    panel's v_q and w_q; dt, et: the corner's form. Same arithmetic as dsytd2's, reordered:
    backward stable alike."""
    k0 = 0
    end = np.uint64(n)
    width = vt.shape[0]  # read from the array: LLVM unrolled loops over the constant, 1.1x slower
    while n - k0 > UNBLOCKED:
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
            _update_rows(a, i, rows, n, vt, wt)
            i += rows
    m = n - k0
    if k0 == 0:
        _tridiagonalise(a, m, d, e, v, w, vn, pn)
        return
    for i in range(m):  # the trailing block to the corner: row i's source, row k0 + i, lies below it
        row = np.uint64(i)
        for j in range(row, np.uint64(m)):
            a[row, j] = a[row + np.uint64(k0), j + np.uint64(k0)]
    _tridiagonalise(a, m, dt, et, v, w, vn, pn)
    for i in range(m):
        d[k0 + i] = dt[i]
        e[k0 + i] = et[i]


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
def _update_rows(a, i, rows, n, vt, wt):  # pragma: no cover - compiled
    """a[i + s, j] -= sum_q (v_q[i + s] w_q[j] + w_q[i + s] v_q[j]) for s < rows (<= 4), the
    panel's terms q (vt, wt), from column i on: a few entries left of the diagonal too, which
    nothing reads."""
    i0 = np.uint64(i)
    if rows == 4:
        i1, i2, i3 = i0 + np.uint64(1), i0 + np.uint64(2), i0 + np.uint64(3)
        for q in range(vt.shape[0]):
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
        for q in range(vt.shape[0]):
            vi, wi, qq = vt[q, row], wt[q, row], np.uint64(q)
            for j in range(row, np.uint64(n)):
                a[row, j] -= vi * wt[qq, j] + wi * vt[qq, j]


@jit
def reduction_buffers(n):  # pragma: no cover - compiled
    """The work matrix, vectors and panel `reduce_to_tridiagonal` needs for matrices up to n x n."""
    vectors = (np.empty(n + PAD), np.empty(n + PAD), np.empty(n + PAD), np.empty(n + PAD))
    panel = (np.zeros((PANEL, n + PAD)), np.zeros((PANEL, n + PAD)))
    corner = (np.empty(UNBLOCKED + 1), np.empty(UNBLOCKED + 1))
    return np.empty((n, n + PAD)), vectors, panel, corner
