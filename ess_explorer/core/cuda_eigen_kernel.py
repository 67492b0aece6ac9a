"""Eigenvalues of many small symmetric matrices on a GPU: one CUDA thread per matrix (numba-cuda).

A Mamba layer's Gramian route asks, at L = 1024, for about 1.6 million eigenvalue problems of
16 x 16 (one per channel and cut), and cuSOLVER's batched Jacobi solver, which torch's
`eigvalsh` calls for n <= 32, took 0.24 us each on an H200: most of the layer's 0.55 s. Each
problem is small enough for one thread to hold in its own memory and solve alone, as LAPACK
would on one core, and a GPU runs some 270,000 such threads at once (132 multiprocessors x
2,048): the thread loads its matrix (lower triangle), scales it by its largest entry,
reduces it to tridiagonal form by Householder reflections (LAPACK's dsytd2, lower) and
takes the tridiagonal's eigenvalues by the implicit QL iteration with Wilkinson-type shifts
(tqli, without vectors), then sorts them ascending. No workspace beyond the output, and no
limit on the batch (cuSOLVER refuses batches of a few tens of thousands: core/eigen.py).

Accuracy: both steps are backward stable, so every eigenvalue is within a small multiple of
n eps ||A|| of the exact one, the bound every caller's guard assumes of an eigensolver
(core/spectra.py GRAM_ERROR, core/gramian_naive.py GRAMIAN_ERROR). An off-diagonal below eps
(the matrix scaled to its largest entry 1, so ||A|| >= 1) is dropped, which moves an
eigenvalue by less. A matrix with an entry that is not finite, or whose QL does not converge
within MAX_QL_STEPS per eigenvalue, is flagged and solved again by LAPACK on the host.

Its reference is `torch.linalg.eigvalsh` (tests/test_cuda_eigen_kernel.py runs the kernel in
numba's CUDA simulator on the CPU and compares; on a GPU the gpu-marked test does the same on
a layer-sized batch). Where numba-cuda or a GPU is missing, torch's solver runs instead
(core/eigen.py).
"""

from __future__ import annotations

import functools
import math
import warnings

import torch

__all__ = ["MAX_SIZE", "available", "symmetric_eigenvalues", "launch"]

MAX_SIZE = 32  # the largest n: a thread's 32 x 32 matrix is 8 KB of its local memory
THREADS = 128  # threads per block: one matrix each
MAX_QL_STEPS = 30  # QL iterations per eigenvalue (it needs about 2): this only stops a failure
EPS = 2.0**-52


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


cuda = None  # numba.cuda, imported with the first kernel: a module global, which numba's simulator swaps


@functools.cache
def _kernel(size: int):
    """The kernel for matrices of n <= ``size`` (a thread's local arrays are size x size)."""
    global cuda
    from numba import cuda, float64

    @cuda.jit
    def kernel(matrices, n, out, failed):  # pragma: no cover - runs on a GPU or in numba's simulator
        b = cuda.grid(1)
        if b >= matrices.shape[0]:
            return
        a = cuda.local.array((size, size), float64)
        d = cuda.local.array(size, float64)
        e = cuda.local.array(size, float64)
        v = cuda.local.array(size, float64)
        p = cuda.local.array(size, float64)
        largest = 0.0
        finite = True
        for i in range(n):  # the lower triangle; its largest entry sets the scale
            for j in range(i + 1):
                x = matrices[b, i, j]
                a[i, j] = x
                if not (abs(x) <= 1.7e308):  # inf or NaN
                    finite = False
                elif abs(x) > largest:
                    largest = abs(x)
        if not finite or largest == 0.0:
            for i in range(n):
                out[b, i] = 0.0
            failed[b] = 0 if finite else 1
            return
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
        ok = True
        for l in range(n):  # noqa: E741 - tqli's name
            steps = 0
            while ok:
                m = l
                while m < n - 1:
                    if abs(e[m]) <= EPS * (abs(d[m]) + abs(d[m + 1])) or abs(e[m]) <= EPS:
                        break
                    m += 1
                if m == l:
                    break
                if steps == MAX_QL_STEPS:
                    ok = False
                    break
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
        failed[b] = 0 if ok else 1
        for i in range(1, n):  # insertion sort, ascending
            x = d[i]
            j = i - 1
            while j >= 0 and d[j] > x:
                d[j + 1] = d[j]
                j -= 1
            d[j + 1] = x
        for i in range(n):
            out[b, i] = d[i] * largest

    return kernel


def launch(matrices, out, failed, stream=0) -> None:
    """Run the kernel: matrices (B, n, n) float64 (read, lower triangle), out (B, n) float64 the
    ascending eigenvalues, failed (B,) int32 set to 1 where the host must solve instead (a
    non-finite entry, or a QL that did not converge). Arrays numba-cuda takes: device arrays,
    or NumPy arrays under its simulator."""
    count, n = matrices.shape[0], matrices.shape[-1]
    if count == 0 or n == 0:
        return
    if n > MAX_SIZE:
        raise ValueError(f"the CUDA eigenvalue kernel takes n <= {MAX_SIZE}, got {n}")
    kernel = _kernel(16 if n <= 16 else MAX_SIZE)
    kernel[(count + THREADS - 1) // THREADS, THREADS, stream](matrices, n, out, failed)


def symmetric_eigenvalues(matrices: torch.Tensor) -> torch.Tensor:
    """Ascending eigenvalues (B, n) of the symmetric CUDA float64 batch ``matrices`` (B, n, n),
    n <= MAX_SIZE, on torch's current stream; a matrix the kernel flags is solved by LAPACK on
    the host (module docstring)."""
    from numba import cuda  # noqa: F811 - the module global is the same module
    from numba.core.errors import NumbaPerformanceWarning

    batch = matrices.contiguous()
    out = torch.empty(batch.shape[:-1], dtype=batch.dtype, device=batch.device)
    failed = torch.zeros(batch.shape[0], dtype=torch.int32, device=batch.device)
    index = batch.device.index if batch.device.index is not None else torch.cuda.current_device()
    with cuda.gpus[index], warnings.catch_warnings():
        # a small batch fills few multiprocessors, which numba warns of: no news to a user
        warnings.simplefilter("ignore", NumbaPerformanceWarning)
        stream = cuda.external_stream(torch.cuda.current_stream(batch.device).cuda_stream)
        launch(cuda.as_cuda_array(batch), cuda.as_cuda_array(out), cuda.as_cuda_array(failed), stream)
    redo = failed.nonzero().flatten()
    if len(redo):  # one sync per call, as cuSOLVER's info check
        out[redo] = torch.linalg.eigvalsh(batch[redo].cpu()).to(out.device)
    return out
