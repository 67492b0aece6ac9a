"""Eigenvalues of larger symmetric matrices on a GPU: one thread block per matrix (numba-cuda).

Attention's cut Grams (n up to L / 2) went to cuSOLVER's batched solver, which took 1.47 s of
a GPT-2 layer's 1.74 s at L = 1024 on an H200. Here each matrix, up to BLOCK_MAX_SIZE, takes
one block of BLOCK_THREADS threads (`_block_kernel`): the matrix, in global memory (a copy the
kernel scales by its largest entry and destroys), is reduced to tridiagonal form by Householder
reflections (LAPACK's dsytd2), the block's threads sharing each step; thread i owns columns
i, i + T, ..., so every read and write of a row is coalesced, and the symmetric matrix is kept
whole so that the product with the reflector reads columns too. Then each thread bisects its
share of the eigenvalues on Sturm counts (LAPACK's dstebz), which come out ascending.

Accuracy: the reduction and the Sturm counts are backward stable, and the bisection stops
within 6n 2^-60 (below eps) of the scaled matrix's eigenvalue, so every eigenvalue is within a small
multiple of n eps ||A|| of the exact one, the bound the callers' guards assume of an
eigensolver. A matrix with an entry that is not finite is flagged and solved by LAPACK on the
host. No GPU was at hand to time it: core/eigen.py times it against cuSOLVER on its first
large batch of each size class and keeps the faster (`kernel_or_torch`). Its reference is
`torch.linalg.eigvalsh` (tests/test_cuda_eigen_kernel.py: numba's simulator on the CPU, a
compile for sm_90 where a CUDA toolkit is installed, and on a GPU against LAPACK).
"""

from __future__ import annotations

import functools
import math

import torch

from .cuda_eigen_kernel import TINY, eigenvalues_by

__all__ = ["BLOCK_THREADS", "BLOCK_MAX_SIZE", "block_eigenvalues", "launch_block"]

BLOCK_THREADS = 128
BLOCK_MAX_SIZE = 1024
BISECTION_STEPS = 60  # halvings of the Gershgorin interval (at most about 6n wide, scaled): 6n 2^-60 < eps


cuda = None  # numba.cuda, imported with the kernel: a module global, which numba's simulator swaps


@functools.cache
def _block_kernel():
    """The kernel (module docstring): block b solves work[b]."""
    global cuda
    from numba import cuda, float64
    from numba.extending import register_jitable

    @register_jitable
    def _total(part):  # thread 0 adds up what each thread left in ``part``
        total = 0.0
        for t in range(BLOCK_THREADS):
            total += part[t]
        return total

    @cuda.jit
    def kernel(work, out, failed):  # pragma: no cover - runs on a GPU or in numba's simulator
        b = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        n = work.shape[-1]
        v = cuda.shared.array(BLOCK_MAX_SIZE, float64)
        w = cuda.shared.array(BLOCK_MAX_SIZE, float64)
        d = cuda.shared.array(BLOCK_MAX_SIZE, float64)
        e = cuda.shared.array(BLOCK_MAX_SIZE, float64)
        part = cuda.shared.array(BLOCK_THREADS, float64)
        share = cuda.shared.array(4, float64)  # scalars thread 0 hands to the block
        a = work[b]
        # the largest entry (and whether every entry is finite), then the matrix scaled by it
        largest = 0.0
        for i in range(tid, n, BLOCK_THREADS):
            for j in range(n):
                x = abs(a[j, i])
                if not (x <= 1.7e308):
                    largest = math.inf
                elif x > largest:
                    largest = x
        part[tid] = largest
        cuda.syncthreads()
        if tid == 0:
            top = 0.0
            for t in range(BLOCK_THREADS):
                if part[t] > top:
                    top = part[t]
            share[0] = top
        cuda.syncthreads()
        largest = share[0]
        if not (largest <= 1.7e308) or largest == 0.0:
            for i in range(tid, n, BLOCK_THREADS):
                out[b, i] = 0.0
            if tid == 0:
                failed[b] = 0 if largest == 0.0 else 1
            return
        inverse = 1.0 / largest
        for i in range(tid, n, BLOCK_THREADS):
            for j in range(n):
                a[j, i] *= inverse
        cuda.syncthreads()
        for k in range(n - 2):  # Householder: column k's reflector zeroes a[k + 2:, k]
            below = 0.0
            for i in range(k + 2 + tid, n, BLOCK_THREADS):
                below += a[k, i] * a[k, i]  # row k: column k by symmetry, read coalesced
            part[tid] = below
            cuda.syncthreads()
            if tid == 0:
                total = _total(part)
                alpha = a[k, k + 1]
                d[k] = a[k, k]
                if total == 0.0:  # already tridiagonal in this column
                    e[k] = alpha
                    share[1] = 0.0
                else:
                    beta = -math.copysign(math.sqrt(alpha * alpha + total), alpha)
                    e[k] = beta
                    share[1] = (beta - alpha) / beta  # tau
                    share[2] = 1.0 / (alpha - beta)
            cuda.syncthreads()
            tau = share[1]
            if tau == 0.0:
                continue  # the same for every thread: no barrier is skipped by some only
            for i in range(k + 1 + tid, n, BLOCK_THREADS):
                v[i] = 1.0 if i == k + 1 else a[k, i] * share[2]
            cuda.syncthreads()
            pv = 0.0
            for i in range(k + 1 + tid, n, BLOCK_THREADS):  # p = tau A22 v: column i, rows j
                s = 0.0
                for j in range(k + 1, n):
                    s += a[j, i] * v[j]
                w[i] = tau * s
                pv += w[i] * v[i]
            part[tid] = pv
            cuda.syncthreads()
            if tid == 0:
                share[3] = -0.5 * tau * _total(part)
            cuda.syncthreads()
            half = share[3]
            for i in range(k + 1 + tid, n, BLOCK_THREADS):
                w[i] += half * v[i]
            cuda.syncthreads()
            for i in range(k + 1 + tid, n, BLOCK_THREADS):  # A22 <- A22 - v w^T - w v^T
                vi = v[i]
                wi = w[i]
                for j in range(k + 1, n):
                    a[j, i] -= v[j] * wi + w[j] * vi
            cuda.syncthreads()
        if tid == 0:
            for i in range(n - 2 if n >= 2 else 0, n):
                d[i] = a[i, i]
            if n >= 2:
                e[n - 2] = a[n - 1, n - 2]
            e[n - 1] = 0.0
            low = math.inf
            high = -math.inf
            biggest = 0.0
            for i in range(n):  # Gershgorin's interval, and e^2 in place of e
                radius = (abs(e[i - 1]) if i > 0 else 0.0) + abs(e[i])
                if d[i] - radius < low:
                    low = d[i] - radius
                if d[i] + radius > high:
                    high = d[i] + radius
            for i in range(n):
                e[i] = e[i] * e[i]
                if e[i] > biggest:
                    biggest = e[i]
            share[0] = low
            share[1] = high
            share[2] = TINY * (biggest if biggest > 1.0 else 1.0)  # LAPACK's pivmin
        cuda.syncthreads()
        low, high, pivot = share[0], share[1], share[2]
        for j in range(tid, n, BLOCK_THREADS):  # the j-th smallest eigenvalue, by bisection
            lo = low
            hi = high
            for _ in range(BISECTION_STEPS):
                mid = 0.5 * (lo + hi)
                below = 0
                q = 1.0
                for i in range(n):  # Sturm count: eigenvalues below mid
                    q = d[i] - mid - (e[i - 1] / q if i > 0 else 0.0)
                    if abs(q) < pivot:
                        q = -pivot
                    if q < 0.0:
                        below += 1
                if below > j:
                    hi = mid
                else:
                    lo = mid
            out[b, j] = 0.5 * (lo + hi) * largest
        if tid == 0:
            failed[b] = 0

    return kernel


def launch_block(work, out, failed, stream=0) -> None:
    """The block kernel: work (B, n, n) float64 symmetric, n <= BLOCK_MAX_SIZE, scaled and
    destroyed; out (B, n) float64 the ascending eigenvalues; failed (B,) int32 set to 1 where a
    matrix has an entry that is not finite (its out row then zeros), else 0."""
    count, n = work.shape[0], work.shape[-1]
    if n > BLOCK_MAX_SIZE:
        raise ValueError(f"the CUDA block eigenvalue kernel takes n <= {BLOCK_MAX_SIZE}, got {n}")
    if count and n:
        _block_kernel()[count, BLOCK_THREADS, stream](work, out, failed)


def block_eigenvalues(matrices: torch.Tensor) -> torch.Tensor:
    """Ascending eigenvalues (B, n) of the symmetric CUDA float64 batch ``matrices`` (B, n, n),
    n <= BLOCK_MAX_SIZE, one thread block each (`_block_kernel`), on torch's current stream; a
    matrix with an entry that is not finite goes to LAPACK on the host, as torch would."""
    work = matrices.contiguous().clone()  # scaled and destroyed by the kernel
    return eigenvalues_by(launch_block, matrices, work)
