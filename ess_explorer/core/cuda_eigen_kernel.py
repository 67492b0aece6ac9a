"""Symmetric eigenproblems on a GPU by kernels of the engine's own (numba-cuda).

A Mamba layer's Gramian route asks, at L = 1024, for about 1.6 million eigenvalue problems of
16 x 16 (one per channel and cut), and cuSOLVER's batched Jacobi solver, which torch's
`eigvalsh` calls for n <= 32, took 0.24 us each on an H200: most of the layer's 0.55 s. Each
problem is small enough for one thread to hold in its own memory and solve alone, as LAPACK
would on one core, and a GPU runs some 270,000 such threads at once (132 multiprocessors x
2,048). The solver (`_solve`, compiled into each kernel that calls it): scale the matrix by
its largest entry, reduce it to tridiagonal form by Householder reflections (LAPACK's dsytd2,
lower), take the tridiagonal's eigenvalues by the implicit QL iteration with Wilkinson-type
shifts (tqli, without vectors) and sort them. Two kernels call it, one thread per problem:

- `symmetric_eigenvalues`: the eigenvalues of each matrix of a batch, n <= MAX_SIZE;
- `gramian_cut_spectra`: steps 1-3 of core/gramian_naive.py's per-cut math, fused: balance
  P and Q, the shifted Cholesky of P, the sandwich C^T Q C, its eigenvalues and the cut's
  error bound, reading only P_t and Q_t (the torch route makes some ten (B, W, N, N)
  temporaries of them per block of cuts, and a kernel launch per step).

Larger matrices (attention's cut Grams) take core/cuda_block_kernel.py, one block of threads
per matrix. No kernel needs workspace beyond its outputs or limits the batch (cuSOLVER
refuses batches of a few tens of thousands: core/eigen.py). They were written without a GPU
at hand to time them, so core/eigen.py times each against the cuSOLVER or torch route it
would replace on its first large batch of each size, checks that they agree, and keeps the
faster (`kernel_or_torch`).

Accuracy: the reduction and the QL are backward stable, so every eigenvalue is within a small
multiple of n eps ||A|| of the exact one, the bound every caller's guard assumes of an
eigensolver (core/gram.py GRAM_ERROR, core/gramian_naive.py GRAMIAN_ERROR). An
off-diagonal below eps (the matrix scaled to its largest entry 1, so ||A|| >= 1) is dropped,
which moves an eigenvalue by less. A matrix with an entry that is not finite, or whose QL
does not converge within MAX_QL_STEPS per eigenvalue, is flagged: `symmetric_eigenvalues`
solves it again by LAPACK on the host, `gramian_cut_spectra` gives the cut an infinite error bound (the
caller redoes it by the exact route, as the torch route does with a cut it cannot solve).

The references are `torch.linalg.eigvalsh` and `gramian_naive._sandwich_spectra`, the torch
route (tests/test_cuda_eigen_kernel.py runs both kernels in numba's CUDA simulator on the CPU
and compares, and compiles them for sm_90 where a CUDA toolkit is installed; on a GPU its
gpu-marked tests do the same on layer-sized batches). Where numba-cuda or a GPU is missing,
the torch routes run instead.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch

__all__ = [
    "MAX_SIZE",
    "GRAMIAN_MAX_SIZE",
    "available",
    "symmetric_eigenvalues",
    "gramian_cut_spectra",
    "launch",
    "launch_gramian",
    "on_torch_stream",
    "eigenvalues_by",
]

# The largest n. A thread's matrices live in its local memory, for which the driver reserves
# room for every thread a GPU can hold at once (about 270,000 on an H200): the eigenvalue
# kernel needs 2.5 KB a thread at n <= 16 and 9 KB at 32, the Gramian-cut kernel, with three
# matrices, 6.5 KB at 16 (25 KB at 32: larger states take the torch route and `eigvalsh`).
# Compiled for sm_90 they use 56 and 62 registers and spill none (`ptxas -v`).
MAX_SIZE = 32
GRAMIAN_MAX_SIZE = 16
THREADS = 128  # threads per block: one matrix each
MAX_QL_STEPS = 30  # QL iterations per eigenvalue (it needs about 2): this only stops a failure
EPS = 2.0**-52
TINY = 2.0**-1022  # the smallest normal float64, as torch.finfo(torch.float64).tiny
OK, NOT_FINITE, NO_CONVERGENCE = 0, 1, 2  # what `_solve` returns

cuda = None  # numba.cuda, imported with the first kernel: a module global, which numba's simulator swaps


@functools.cache
def available() -> bool:
    """Whether numba-cuda imports and sees a GPU (never under its CPU simulator: the engine's
    routes would crawl there; the tests call `launch` in it directly)."""
    try:
        from numba import config, cuda
    except Exception:  # ImportError, or a numba without its CUDA target
        return False
    try:
        return not config.ENABLE_CUDASIM and bool(cuda.is_available())
    except Exception:  # a driver or toolkit numba-cuda cannot load
        return False


@functools.cache
def _kernels(size: int):
    """(eigenvalue kernel, Gramian-cut kernel) for n <= ``size`` (a thread's local arrays are
    size x size)."""
    global cuda
    from numba import cuda, float64
    from numba.extending import register_jitable

    @register_jitable  # compiled into each kernel that calls it (plain Python under the simulator)
    def _solve(a, n, d, e, v, p):  # pragma: no cover - runs on a GPU or in numba's simulator
        """Eigenvalues of the symmetric matrix whose lower triangle is a[:n, :n] (destroyed)
        into d[:n], ascending. Returns OK, NOT_FINITE or NO_CONVERGENCE (d then zeros)."""
        largest = 0.0
        for i in range(n):  # its largest entry sets the scale
            for j in range(i + 1):
                x = abs(a[i, j])
                if not (x <= 1.7e308):  # inf or NaN
                    for k in range(n):
                        d[k] = 0.0
                    return NOT_FINITE
                if x > largest:
                    largest = x
        if largest == 0.0:
            for k in range(n):
                d[k] = 0.0
            return OK
        inverse = 1.0 / largest
        for i in range(n):
            for j in range(i + 1):
                a[i, j] *= inverse
        # Householder: column k's reflector zeroes a[k + 2:, k]; e[k] the new a[k + 1, k]
        for k in range(n - 2):
            alpha = a[k + 1, k]
            below = 0.0
            for i in range(k + 2, n):
                below += a[i, k] * a[i, k]
            if below == 0.0:  # already tridiagonal in this column
                e[k] = alpha
                continue
            beta = -math.copysign(math.sqrt(alpha * alpha + below), alpha)
            tau = (beta - alpha) / beta
            scale = 1.0 / (alpha - beta)
            v[k + 1] = 1.0
            for i in range(k + 2, n):
                v[i] = a[i, k] * scale
            e[k] = beta
            # p = tau A22 v (A22 = a[k + 1:, k + 1:], its lower triangle stored), then
            # w = p - (tau / 2) (p . v) v, and A22 <- A22 - v w^T - w v^T
            pv = 0.0
            for i in range(k + 1, n):
                s = 0.0
                for j in range(k + 1, i + 1):
                    s += a[i, j] * v[j]
                for j in range(i + 1, n):
                    s += a[j, i] * v[j]
                p[i] = tau * s
                pv += p[i] * v[i]
            half = -0.5 * tau * pv
            for i in range(k + 1, n):
                p[i] += half * v[i]
            for i in range(k + 1, n):
                for j in range(k + 1, i + 1):
                    a[i, j] -= v[i] * p[j] + p[i] * v[j]
        for i in range(n):
            d[i] = a[i, i]
        e[n - 1] = 0.0
        if n >= 2:
            e[n - 2] = a[n - 1, n - 2]
        # implicit QL with shifts (tqli, no vectors): e[i] couples rows i and i + 1
        for l in range(n):  # noqa: E741 - tqli's name
            steps = 0
            while True:
                m = l
                while m < n - 1:
                    if abs(e[m]) <= EPS * (abs(d[m]) + abs(d[m + 1])) or abs(e[m]) <= EPS:
                        break
                    m += 1
                if m == l:
                    break
                if steps == MAX_QL_STEPS:
                    for k in range(n):
                        d[k] = 0.0
                    return NO_CONVERGENCE
                steps += 1
                g = (d[l + 1] - d[l]) / (2.0 * e[l])
                r = math.hypot(g, 1.0)
                g = d[m] - d[l] + e[l] / (g + math.copysign(r, g))
                s = 1.0
                c = 1.0
                shift = 0.0
                i = m - 1
                deflated = False
                while i >= l:
                    f = s * e[i]
                    h = c * e[i]
                    r = math.hypot(f, g)
                    e[i + 1] = r
                    if r == 0.0:  # underflow: split here and start again
                        d[i + 1] -= shift
                        e[m] = 0.0
                        deflated = True
                        break
                    s = f / r
                    c = g / r
                    g = d[i + 1] - shift
                    r = (d[i] - g) * s + 2.0 * c * h
                    shift = s * r
                    d[i + 1] = g + shift
                    g = c * r - h
                    i -= 1
                if deflated:
                    continue
                d[l] -= shift
                e[l] = g
                e[m] = 0.0
        for i in range(1, n):  # insertion sort, ascending
            x = d[i]
            j = i - 1
            while j >= 0 and d[j] > x:
                d[j + 1] = d[j]
                j -= 1
            d[j + 1] = x
        for i in range(n):
            d[i] *= largest
        return OK

    @cuda.jit
    def eigenvalues(matrices, n, out, failed):  # pragma: no cover - runs on a GPU or in numba's simulator
        b = cuda.grid(1)
        if b >= matrices.shape[0]:
            return
        a = cuda.local.array((size, size), float64)
        d = cuda.local.array(size, float64)
        e = cuda.local.array(size, float64)
        v = cuda.local.array(size, float64)
        p = cuda.local.array(size, float64)
        for i in range(n):
            for j in range(i + 1):
                a[i, j] = matrices[b, i, j]
        failed[b] = 0 if _solve(a, n, d, e, v, p) == OK else 1
        for i in range(n):
            out[b, i] = d[i]

    @cuda.jit
    def gramian_cut(ps, qs, shift_factor, error_factor, lam, error):  # pragma: no cover - GPU or simulator
        """Steps 1-3 of core/gramian_naive.py for the pair (P, Q) = (ps[b], qs[b]): lam[b]
        the sandwich's eigenvalues, descending, clamped at 0; error[b] its bound, inf where
        the cut cannot be solved here (a failed Cholesky, a value that is not finite, a QL that
        did not converge: the caller redoes it exactly), lam[b] then zeros."""
        b = cuda.grid(1)
        if b >= ps.shape[0]:
            return
        n = ps.shape[-1]
        root = cuda.local.array((size, size), float64)  # balanced P, then its Cholesky factor C
        qb = cuda.local.array((size, size), float64)  # balanced Q, lower triangle
        x = cuda.local.array((size, size), float64)  # Q C, then the sandwich C^T Q C
        d = cuda.local.array(size, float64)
        e = cuda.local.array(size, float64)
        v = cuda.local.array(size, float64)
        p = cuda.local.array(size, float64)
        for i in range(n):  # 1. balance: equal diagonals, d_i = (Q_ii / P_ii)^(1/4)
            pi = ps[b, i, i]
            qi = qs[b, i, i]
            d[i] = math.sqrt(math.sqrt(qi / pi)) if (pi > TINY and qi > TINY) else 1.0
        trace = 0.0
        norm_p = 0.0
        norm_q = 0.0
        for i in range(n):
            for j in range(i + 1):
                pij = ps[b, i, j] * d[i] * d[j]
                qij = qs[b, i, j] / (d[i] * d[j])
                root[i, j] = pij
                qb[i, j] = qij
                weight = 1.0 if i == j else 2.0  # the upper triangle mirrors the lower
                norm_p += weight * pij * pij
                norm_q += weight * qij * qij
            trace += root[i, i]
        bound = error_factor * EPS * math.sqrt(norm_p) * math.sqrt(norm_q)
        shift = shift_factor * EPS * trace + TINY
        solvable = bound <= 1.7e308  # not inf or NaN
        for j in range(n):  # 2. the shifted Cholesky P + shift I = C C^T, C in root's lower triangle
            if not solvable:
                break
            s = root[j, j] + shift
            for k in range(j):
                s -= root[j, k] * root[j, k]
            if not (s > 0.0):  # a pivot that is not positive, or NaN
                solvable = False
                break
            pivot = math.sqrt(s)
            root[j, j] = pivot
            for i in range(j + 1, n):
                s = root[i, j]
                for k in range(j):
                    s -= root[i, k] * root[j, k]
                root[i, j] = s / pivot
        if solvable:
            for i in range(n):  # x = Q C (Q symmetric from its lower triangle, C lower)
                for j in range(n):
                    s = 0.0
                    for k in range(j, n):
                        q = qb[i, k] if k <= i else qb[k, i]
                        s += q * root[k, j]
                    x[i, j] = s
            for i in range(n):  # the sandwich's lower triangle C^T x into qb (Q is read no more)
                for j in range(i + 1):
                    s = 0.0
                    for k in range(i, n):
                        s += root[k, i] * x[k, j]
                    qb[i, j] = s
            solvable = _solve(qb, n, d, e, v, p) == OK  # 3. its eigenvalues, ascending
            for k in range(n):
                if not (abs(d[k]) <= 1.7e308):  # overflowed in the unscaling
                    solvable = False
        # descending, clamped at 0 (a conditional: numba 0.68's CUDA target cannot compile max() of floats)
        for k in range(n):
            value = d[n - 1 - k]
            lam[b, k] = value if (solvable and value > 0.0) else 0.0
        error[b] = bound if solvable else math.inf

    return eigenvalues, gramian_cut


def _grid(count: int) -> int:
    return (count + THREADS - 1) // THREADS


def _checked_size(n: int) -> int:
    if n > MAX_SIZE:
        raise ValueError(f"the CUDA eigenvalue kernels take n <= {MAX_SIZE}, got {n}")
    return 16 if n <= 16 else MAX_SIZE


def launch(matrices, out, failed, stream=0) -> None:
    """The eigenvalue kernel: matrices (B, n, n) float64 (read, lower triangle), out (B, n)
    float64 the ascending eigenvalues, failed (B,) int32 set to 1 where the host must solve
    instead (a non-finite entry, or a QL that did not converge). Arrays numba-cuda takes:
    device arrays, or NumPy arrays under its simulator."""
    count, n = matrices.shape[0], matrices.shape[-1]
    if count and n:
        kernel = _kernels(_checked_size(n))[0]
        kernel[_grid(count), THREADS, stream](matrices, n, out, failed)


def launch_gramian(ps, qs, shift_factor: float, error_factor: float, lam, error, stream=0) -> None:
    """The Gramian-cut kernel: ps, qs (B, n, n) float64 the cuts' Gramians (read, lower
    triangles); lam (B, n) the sandwiches' eigenvalues, descending, clamped at 0; error (B,)
    each cut's bound, error_factor eps ||P||_F ||Q||_F balanced, inf where the cut must be
    redone exactly; the Cholesky's shift is shift_factor eps tr P (core/gramian_naive.py)."""
    count, n = ps.shape[0], ps.shape[-1]
    if n > GRAMIAN_MAX_SIZE:
        raise ValueError(f"the CUDA Gramian-cut kernel takes n <= {GRAMIAN_MAX_SIZE}, got {n}")
    if count and n:
        kernel = _kernels(16)[1]
        kernel[_grid(count), THREADS, stream](ps, qs, shift_factor, error_factor, lam, error)


def on_torch_stream(device: torch.device, run) -> None:
    """run(stream, as_array) inside numba's context for ``device``, on torch's current stream,
    without numba's low-occupancy warnings (a small batch fills few multiprocessors: no news).
    as_array views a torch tensor without synchronising the host with its stream: the kernel
    runs on that same stream, after whatever wrote the tensor."""
    from numba import cuda  # noqa: F811 - the module global is the same module
    from numba.core.errors import NumbaPerformanceWarning

    index = device.index if device.index is not None else torch.cuda.current_device()
    with cuda.gpus[index], warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaPerformanceWarning)
        stream = cuda.external_stream(torch.cuda.current_stream(device).cuda_stream)
        run(stream, lambda tensor: cuda.as_cuda_array(tensor, sync=False))


def symmetric_eigenvalues(matrices: torch.Tensor) -> torch.Tensor:
    """Ascending eigenvalues (B, n) of the symmetric CUDA float64 batch ``matrices`` (B, n, n),
    n <= MAX_SIZE, on torch's current stream; a matrix the kernel flags is solved by LAPACK on
    the host (module docstring)."""
    batch = matrices.contiguous()
    return eigenvalues_by(launch, batch, batch)


def eigenvalues_by(launch_kernel, matrices: torch.Tensor, work: torch.Tensor) -> torch.Tensor:
    """launch_kernel(work, out, failed, stream) on torch's current stream (`launch`, or the
    block kernel's), ``work`` the (B, n, n) copy of ``matrices`` it reads; then LAPACK on the
    host for each matrix the kernel flagged (B,). Returns out (B, n), ascending."""
    out = torch.empty(work.shape[:-1], dtype=work.dtype, device=work.device)
    failed = torch.zeros(work.shape[0], dtype=torch.int32, device=work.device)
    on_torch_stream(work.device, lambda stream, array: launch_kernel(array(work), array(out), array(failed), stream))
    redo = failed.nonzero().flatten()
    if len(redo):  # one sync per call, as cuSOLVER's info check
        out[redo] = torch.linalg.eigvalsh(matrices[redo].cpu()).to(out.device)
    return out


def gramian_cut_spectra(
    p: torch.Tensor, q: torch.Tensor, shift_factor: float, error_factor: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(lam (..., n) descending, error (...)) of the CUDA float64 Gramians p, q (..., n, n),
    n <= GRAMIAN_MAX_SIZE: the sandwiches' eigenvalues and each cut's bound, inf where the cut
    must be redone exactly (module docstring, `launch_gramian`)."""
    shape, n = p.shape[:-2], p.shape[-1]
    ps, qs = (x.reshape(-1, n, n).contiguous() for x in (p, q))
    lam = torch.empty(ps.shape[:-1], dtype=ps.dtype, device=ps.device)
    error = torch.empty(ps.shape[0], dtype=ps.dtype, device=ps.device)
    on_torch_stream(
        ps.device,
        lambda stream, array: launch_gramian(
            array(ps), array(qs), shift_factor, error_factor, array(lam), array(error), stream
        ),
    )
    return lam.reshape(*shape, n), error.reshape(shape)
