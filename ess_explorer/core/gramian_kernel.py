"""The Gramian route for diagonal recurrences as one compiled CPU kernel (numba).

Same math, same outputs as core/gramian_naive.py (the reference the tests compare it with):
the Gramian scans, the balance, the shifted Cholesky, the sandwich C^T Q C and its
eigenvalues, per cut. What the kernel adds is speed where LAPACK is slow: a batched 16 x 16
`eigvalsh` costs about 7 us per matrix on a CPU core, mostly per-matrix overhead, while the
arithmetic is about 10,000 multiply-adds. Here LANES units run side by side, every loop
innermost over the lanes (contiguous), so the compiler vectorises each operation across
them; each cut's whole pipeline stays in cache; nothing is stored per cut but the outputs.

Eigenvalues of the symmetric sandwich: Householder tridiagonalisation across the lanes,
then the QL iteration of core/tridiagonal_kernel.py, every lane its own. A lane whose
iteration does not converge gets an infinite error: the caller redoes its cut by the
square-root sweep.

numba is set up in core/compiled.py; where it does not import (`available()`), core/gramian.py
runs the reference instead.
"""

from __future__ import annotations

import numpy as np

from . import compiled, gramian_naive
from .compiled import LANES, available, jit
from .sturm import _largest_eigenvalues
from .tridiagonal_kernel import _tridiagonal_eigenvalues

__all__ = ["LANES", "available", "gramian_spectra_kernel"]

EPS = float(np.finfo(np.float64).eps)
TINY = float(np.finfo(np.float64).tiny)
BLOCK = 32  # steps between the checkpoints of the forward scan (`_kernel`)


@jit
def _tridiagonal(m, n, diag, off, v, pv):  # pragma: no cover - compiled
    """Householder reduction of the symmetric m (n, n, LANES) to tridiagonal: diag (n, LANES),
    off (n, LANES) with off[k] coupling k and k + 1 (off[n - 1] = 0). Reads and updates m's
    lower triangle only (IN PLACE)."""
    beta = np.empty(LANES)
    alpha = np.empty(LANES)
    kk = np.empty(LANES)
    for k in range(n - 2):
        for w in range(LANES):
            alpha[w] = 0.0
        for i in range(k + 1, n):
            for w in range(LANES):
                alpha[w] += m[i, k, w] * m[i, k, w]
        for w in range(LANES):
            s2 = alpha[w]
            x0 = m[k + 1, k, w]
            norm = np.sqrt(s2)
            a = -norm if x0 >= 0 else norm
            v0 = x0 - a
            vnorm2 = s2 - x0 * x0 + v0 * v0
            live = vnorm2 > TINY
            beta[w] = 2.0 / vnorm2 if live else 0.0
            off[k, w] = a if live else x0
            v[k + 1, w] = v0
        for i in range(k + 2, n):
            for w in range(LANES):
                v[i, w] = m[i, k, w]
        for i in range(k + 1, n):  # pv = beta A v, A read from its lower triangle
            for w in range(LANES):
                pv[i, w] = 0.0
            for j in range(k + 1, i + 1):
                for w in range(LANES):
                    pv[i, w] += m[i, j, w] * v[j, w]
            for j in range(i + 1, n):
                for w in range(LANES):
                    pv[i, w] += m[j, i, w] * v[j, w]
            for w in range(LANES):
                pv[i, w] *= beta[w]
        for w in range(LANES):
            kk[w] = 0.0
        for i in range(k + 1, n):
            for w in range(LANES):
                kk[w] += v[i, w] * pv[i, w]
        for w in range(LANES):
            kk[w] *= 0.5 * beta[w]
        for i in range(k + 1, n):  # pv <- p - K v; A <- A - v pv^T - pv v^T
            for w in range(LANES):
                pv[i, w] -= kk[w] * v[i, w]
        for i in range(k + 1, n):  # the lower triangle only: the upper one is never read again
            for j in range(k + 1, i + 1):
                for w in range(LANES):
                    m[i, j, w] -= v[i, w] * pv[j, w] + pv[i, w] * v[j, w]
        for w in range(LANES):
            diag[k, w] = m[k, k, w]
    for w in range(LANES):
        if n >= 2:
            diag[n - 2, w] = m[n - 2, n - 2, w]
            off[n - 2, w] = m[n - 1, n - 2, w]
        diag[n - 1, w] = m[n - 1, n - 1, w]
        off[n - 1, w] = 0.0


@jit
def _scale_by_trace(m, n, scale):  # pragma: no cover - compiled
    """Divide the lower triangle of the symmetric m (n, n, LANES) by its trace, per lane, IN
    PLACE; scale (LANES,) gets the trace (1 where it is 0). The rotations and bisections that
    follow then work on numbers of order one: none underflows or overflows. A lane whose trace
    is not finite (its matrix overflowed) is zeroed, so the solver passes it at once, and keeps
    that trace as its scale: its results come out NaN or zero, and `_symmetric_eigenvalues`
    marks it failed."""
    inverse = np.empty(LANES)
    for w in range(LANES):
        scale[w] = 0.0
    for i in range(n):
        for w in range(LANES):
            scale[w] += abs(m[i, i, w])
    overflowed = False
    for w in range(LANES):
        finite = np.isfinite(scale[w])
        overflowed = overflowed or not finite
        scale[w] = scale[w] if (scale[w] > TINY or not finite) else 1.0
        inverse[w] = 1.0 / scale[w] if finite else 0.0  # one division per lane, not per entry
    for i in range(n):  # the lower triangle: all that `_tridiagonal` reads
        for j in range(i + 1):
            for w in range(LANES):
                m[i, j, w] *= inverse[w]
    if overflowed:  # inf * 0 is NaN: such a lane's entries are set, not scaled
        for w in range(LANES):
            if not np.isfinite(scale[w]):
                for i in range(n):
                    for j in range(i + 1):
                        m[i, j, w] = 0.0


@jit
def _symmetric_eigenvalues(m, n, rank, out, failed, diag, off, v, pv):  # pragma: no cover - compiled
    """Eigenvalues of the symmetric m (n, n, LANES) (destroyed) into out (n, LANES),
    descending, clamped at 0, zero from index ``rank`` on (every lane's cut has the same t). Scaled by the trace first, so the
    rotations neither underflow nor overflow. failed[w] is set (never cleared) where the lane's
    matrix overflowed or its QL did not converge."""
    scale = np.empty(LANES)
    _scale_by_trace(m, n, scale)
    for w in range(LANES):
        failed[w] = failed[w] or not np.isfinite(scale[w])
    _tridiagonal(m, n, diag, off, v, pv)
    _tridiagonal_eigenvalues(diag, off, n, failed)
    for sweep in range(n):  # odd-even transposition sort, descending: n rounds of selects
        for i in range(sweep % 2, n - 1, 2):
            for w in range(LANES):
                hi = max(diag[i, w], diag[i + 1, w])
                lo = min(diag[i, w], diag[i + 1, w])
                diag[i, w] = hi
                diag[i + 1, w] = lo
    for i in range(n):
        for w in range(LANES):
            value = diag[i, w] * scale[w]
            out[i, w] = value if (value > 0 and i < rank) else 0.0


@jit
def _tridiagonal_top(m, n, diag, off, top, v, pv):  # pragma: no cover - compiled
    """The Householder tridiagonal (diag, off) of the symmetric m (n, n, LANES) (destroyed)
    and its largest eigenvalue ``top`` (LANES,) (core/sturm.py `_largest_eigenvalues`): what
    core/sturm.py needs to count the eigenvalues above any threshold later. Scaled by the
    trace for the iteration; returned in m's own scale."""
    scale = np.empty(LANES)
    _scale_by_trace(m, n, scale)
    _tridiagonal(m, n, diag, off, v, pv)
    _largest_eigenvalues(diag, off, n, top, v, np.empty((10, LANES)))
    for i in range(n):
        for w in range(LANES):
            diag[i, w] *= scale[w]
            off[i, w] *= scale[w]
    for w in range(LANES):
        top[w] *= scale[w]


@jit
def _cut_batch(ps, qs, rank, n, causal, error_factor, shift_factor, lam, err, reach, work):  # pragma: no cover
    """Steps 1-4 of the module docstring of core/gramian_naive.py for LANES cuts at once (one
    t, LANES units): ps, qs (n, n, LANES) their Gramians, ``rank`` the rank bound of H_t,
    min(t, L - t, N). Writes lam (n, LANES) and err (LANES); with
    ``causal``, reach = (diag, off, top, error): P_t's tridiagonal form (core/sturm.py)."""
    root, qb, x, sandwich, diag, off, v, pv, acc, inv, norm_p, norm_q, trace, balance, unbalance, failed = work
    for w in range(LANES):
        failed[w] = False
        norm_p[w] = 0.0
        norm_q[w] = 0.0
        trace[w] = 0.0
    for i in range(n):  # balance: equal diagonals
        for w in range(LANES):
            pi = ps[i, i, w]
            qi = qs[i, i, w]
            balance[i, w] = np.sqrt(np.sqrt(qi / pi)) if (pi > TINY and qi > TINY) else 1.0
            unbalance[i, w] = 1.0 / balance[i, w]
    for i in range(n):  # the scans keep lower triangles: both halves of the balanced pair from them
        for j in range(i + 1):
            weight = 1.0 if i == j else 2.0  # an off-diagonal entry stands for two in the norms
            for w in range(LANES):
                pij = ps[i, j, w] * (balance[i, w] * balance[j, w])
                qij = qs[i, j, w] * (unbalance[i, w] * unbalance[j, w])
                root[i, j, w] = pij
                qb[i, j, w] = qij
                qb[j, i, w] = qij
                norm_p[w] += weight * pij * pij
                norm_q[w] += weight * qij * qij
    for i in range(n):
        for w in range(LANES):
            trace[w] += root[i, i, w]
    for j in range(n):  # Cholesky of P + shift_factor eps tr P (gramian_naive.CHOLESKY_SHIFT), in place in root
        for w in range(LANES):
            acc[w] = root[j, j, w] + shift_factor * EPS * trace[w] + TINY
        for k in range(j):
            for w in range(LANES):
                acc[w] -= root[j, k, w] * root[j, k, w]
        for w in range(LANES):
            pivot = acc[w]
            failed[w] = failed[w] or not (pivot > 0)
            root[j, j, w] = np.sqrt(pivot) if pivot > 0 else 1.0
            inv[w] = 1.0 / root[j, j, w]
        for i in range(j + 1, n):
            for w in range(LANES):
                acc[w] = root[i, j, w]
            for k in range(j):
                for w in range(LANES):
                    acc[w] -= root[i, k, w] * root[j, k, w]
            for w in range(LANES):
                root[i, j, w] = acc[w] * inv[w]
    # The sandwich C^T Q C in n^3 / 2 multiply-adds (LAPACK's dsygst counts the same), where a
    # full x = Q C and a whole triangle of C^T x would take 5 n^3 / 6: its lower triangle
    # (C^T x)[j, i] = sum_{k >= j} C[k, j] x[k, i], i <= j, reads x only where k >= i.
    # Each sum takes four terms per pass over the lanes: one load and store of the
    # accumulator per four multiply-adds, not per one.
    for i in range(n):  # x = Q C (C lower), its lower triangle
        for j in range(i + 1):
            for w in range(LANES):
                acc[w] = 0.0
            for k in range(j, n - 3, 4):
                for w in range(LANES):
                    acc[w] += (qb[i, k, w] * root[k, j, w] + qb[i, k + 1, w] * root[k + 1, j, w]) + (
                        qb[i, k + 2, w] * root[k + 2, j, w] + qb[i, k + 3, w] * root[k + 3, j, w]
                    )
            for k in range(n - (n - j) % 4, n):
                for w in range(LANES):
                    acc[w] += qb[i, k, w] * root[k, j, w]
            for w in range(LANES):
                x[i, j, w] = acc[w]
    for j in range(n):  # sandwich = C^T x, its lower triangle, the half `_tridiagonal` reads
        for i in range(j + 1):
            for w in range(LANES):
                acc[w] = 0.0
            for k in range(j, n - 3, 4):
                for w in range(LANES):
                    acc[w] += (root[k, j, w] * x[k, i, w] + root[k + 1, j, w] * x[k + 1, i, w]) + (
                        root[k + 2, j, w] * x[k + 2, i, w] + root[k + 3, j, w] * x[k + 3, i, w]
                    )
            for k in range(n - (n - j) % 4, n):
                for w in range(LANES):
                    acc[w] += root[k, j, w] * x[k, i, w]
            for w in range(LANES):
                sandwich[j, i, w] = acc[w]
    _symmetric_eigenvalues(sandwich, n, rank, lam, failed, diag, off, v, pv)
    for w in range(LANES):
        error = error_factor * EPS * np.sqrt(norm_p[w] * norm_q[w])
        err[w] = np.inf if (failed[w] or not np.isfinite(error)) else error
    if causal:
        reach_diag, reach_off, reach_top, reach_err = reach
        for w in range(LANES):
            norm_p[w] = 0.0
        for i in range(n):
            for j in range(i + 1):
                weight = 1.0 if i == j else 2.0
                for w in range(LANES):
                    sandwich[i, j, w] = ps[i, j, w]  # the lower triangle: all `_tridiagonal` reads
                    norm_p[w] += weight * ps[i, j, w] * ps[i, j, w]
        _tridiagonal_top(sandwich, n, reach_diag, reach_off, reach_top, v, pv)
        for w in range(LANES):
            reach_err[w] = error_factor * EPS * np.sqrt(norm_p[w])


@jit
def _kernel(  # pragma: no cover - compiled
    a,
    b,
    c,
    slot_of,
    n_slots,
    lam_out,
    err_out,
    reach_diag,
    reach_off,
    reach_top,
    reach_err,
    causal,
    error_factor,
    shift_factor,
):
    """a, b, c: (U, L, N). LANES units at a time are copied side by side (lanes last, zero
    operators past the last unit), then: the forward scan (P_t kept at checkpoints), the
    backward scan, and at each wanted cut the LANES units' (P_t, Q_t) solved together by
    `_cut_batch`. Outputs (U, W, N) and (U, W), as `gramian_spectra_kernel` returns them."""
    units, length, n = a.shape
    # P_t is needed in reverse order: the forward scan keeps every BLOCK-th P_t (a checkpoint)
    # and each block is scanned forward again during the backward scan. Keeping every P_t
    # instead (128 KiB each) costs more in page faults than the whole eigensolve.
    blocks = -(-length // BLOCK)
    checkpoints = np.empty((blocks, n, n, LANES))
    recent = np.empty((BLOCK, n, n, LANES))
    ag = np.empty((length, n, LANES))
    bg = np.empty((length, n, LANES))
    cg = np.empty((length, n, LANES))
    p = np.empty((n, n, LANES))
    q = np.empty((n, n, LANES))
    lam = np.empty((n, LANES))
    err = np.empty(LANES)
    reach = (np.empty((n, LANES)), np.empty((n, LANES)), np.empty(LANES), np.empty(LANES))
    work = (
        np.empty((n, n, LANES)),
        np.empty((n, n, LANES)),
        np.empty((n, n, LANES)),
        np.empty((n, n, LANES)),
        np.empty((n, LANES)),
        np.empty((n, LANES)),
        np.empty((n, LANES)),
        np.empty((n, LANES)),
        np.empty(LANES),
        np.empty(LANES),
        np.empty(LANES),
        np.empty(LANES),
        np.empty(LANES),
        np.empty((n, LANES)),
        np.empty((n, LANES)),
        np.empty(LANES, dtype=np.bool_),
    )
    for first_unit in range(0, units, LANES):
        lanes = min(LANES, units - first_unit)
        # Lanes last; lanes past the last unit are zero operators. t outermost: the LANES
        # units' rows at t stay in L1 while they are spread over the lanes (lanes outermost
        # would sweep the whole (L, N, LANES) arrays, larger than L2, once per lane).
        for t in range(length):
            for i in range(n):
                for w in range(LANES):
                    inside = w < lanes
                    unit = first_unit + w if inside else first_unit
                    ag[t, i, w] = a[unit, t, i] if inside else 0.0
                    bg[t, i, w] = b[unit, t, i] if inside else 0.0
                    cg[t, i, w] = c[unit, t, i] if inside else 0.0
        p[:] = 0.0
        for t in range(length):  # forward scan: P_t at every checkpoint t = k BLOCK
            if t % BLOCK == 0:
                checkpoints[t // BLOCK] = p
            _reach_step(p, p, ag[t], bg[t], n)  # p becomes P_{t+1}
        q[:] = 0.0
        for k in range(blocks - 1, -1, -1):
            first, last = k * BLOCK, min(length, (k + 1) * BLOCK) - 1
            recent[0] = checkpoints[k]
            for t in range(first, last):  # this block's P_t again, kept: recent[t - first]
                _reach_step(recent[t - first + 1], recent[t - first], ag[t], bg[t], n)
            for t in range(last, max(first, 1) - 1, -1):  # backward scan: q becomes Q_t
                _observe_step(q, ag[t], cg[t], n)
                slot = slot_of[t]
                if slot < 0:
                    continue
                rank = min(min(t, length - t), n)
                _cut_batch(recent[t - first], q, rank, n, causal, error_factor, shift_factor, lam, err, reach, work)
                for w in range(lanes):
                    unit = first_unit + w
                    err_out[unit, slot] = err[w]
                    for i in range(n):
                        lam_out[unit, slot, i] = lam[i, w]
                    if causal:
                        reach_top[unit, slot] = reach[2][w]
                        reach_err[unit, slot] = reach[3][w]
                        for i in range(n):
                            reach_diag[unit, slot, i] = reach[0][i, w]
                            reach_off[unit, slot, i] = reach[1][i, w]


# The two scan steps are inlined into `_kernel` (they run at every step: as calls they cost
# about 5-10% of a Mamba layer); the larger helpers stay calls, since inlining them too
# nearly doubled the first compile (11 -> 19 s) for no further speed.
@jit(inline=True)
def _reach_step(after, p, a, b, n):  # pragma: no cover - compiled
    """after <- (a a^T) * P + b b^T for every lane, its lower triangle (after may be p);
    a, b (N, LANES)."""
    for i in range(n):
        for j in range(i + 1):
            for w in range(LANES):
                after[i, j, w] = a[i, w] * a[j, w] * p[i, j, w] + b[i, w] * b[j, w]


@jit(inline=True)
def _observe_step(q, a, c, n):  # pragma: no cover - compiled
    """Q <- (a a^T) * (Q + c c^T) for every lane, its lower triangle; a, c (N, LANES)."""
    for i in range(n):
        for j in range(i + 1):
            for w in range(LANES):
                q[i, j, w] = a[i, w] * a[j, w] * (q[i, j, w] + c[i, w] * c[j, w])


def gramian_spectra_kernel(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    wanted: np.ndarray,
    causal: bool,
    error_factor: float,
    out=None,
    first_row: int = 0,
):
    """The kernel's counterpart of `gramian_naive.gramian_spectra_reference`, on numpy
    float64 arrays a, b, c (B, L, N) (any strides) and sorted cuts ``wanted`` in 1..L-1:
    (sigma^2 (B, W, N) descending, error of each sigma^2 (B, W), and with ``causal`` the
    reachability Gramians as (diag, off, top, error): (B, W, N), (B, W, N), (B, W), (B, W);
    else None). out: those arrays, written in place (any strides), or None: new ones; cut
    wanted[k] goes to row first_row + k of them (the rows before are not written)."""
    units, length, n = a.shape
    slot_of = np.full(length + 1, -1, dtype=np.int64)
    slot_of[np.asarray(wanted, dtype=np.int64)] = first_row + np.arange(len(wanted))
    width = first_row + len(wanted)
    if out is None:
        reach_n = n if causal else 0
        out = (
            np.empty((units, width, n)),
            np.empty((units, width)),
            (
                np.empty((units, width, reach_n)),
                np.empty((units, width, reach_n)),
                np.empty((units, width if causal else 0)),
                np.empty((units, width if causal else 0)),
            )
            if causal
            else None,
        )
    lam, err, reach = out
    if reach is None:  # the kernel's signature wants arrays; none of them is written
        reach = (np.empty((units, 0, 0)), np.empty((units, 0, 0)), np.empty((units, 0)), np.empty((units, 0)))
    # numba compiles one version of the kernel per combination of array layouts (and a new
    # one at the first call that brings another, minutes into a job): every array goes in
    # C-contiguous, so all calls (every cut or some, with causal ESS or not, inputs shared
    # across units or not) run the one version `gramian.load` compiles. An output in another
    # layout is written through a C-ordered copy of it (core/gramian.py passes whole rows of
    # its own C-ordered outputs instead: the copies cost about a tenth of a Mamba layer).
    targets = (lam, err, *reach)
    written = [np.ascontiguousarray(x) for x in targets]  # the array itself where it is C-ordered
    # the shift is an argument, not a global: numba's cache of this file would keep an old
    # value of a constant imported from another module
    shift = float(gramian_naive.CHOLESKY_SHIFT)
    compiled.first_call(_kernel, _warm_up)
    _kernel(
        *(np.ascontiguousarray(x, dtype=np.float64) for x in (a, b, c)),
        slot_of,
        width,
        *written,
        bool(causal),
        float(error_factor),
        shift,
    )
    for target, result in zip(targets, written):
        if result is not target:
            target[...] = result
    return out


def _warm_up() -> None:
    """The kernel's first call in a process, on a tiny problem (`compiled.first_call`)."""
    a = np.full((1, 4, 2), 0.5)
    gramian_spectra_kernel(a, a, a, np.arange(1, 4), True, 1.0)
