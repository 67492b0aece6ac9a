"""Eigenvalues of many symmetric matrices at once, and the singular values of many matrices:
which solver a batch goes to.

On a GPU: `torch.linalg.eigvalsh` on CUDA solves a batch in one call only for n <= 32
(cuSOLVER's batched solver; torch 2.11 calls `cusolverDnXsyevBatched`); above that it calls
`syevd` once per matrix, so a batch of 10,000 Grams of size 100 is 10,000 launches with a host
round trip each. `cusolverDnXsyevBatched` (cuSOLVER 12.6 on) takes any n; nvmath-python (the
optional `gpu` extra) binds it, and `eigvalsh` uses it where it helps (n > 32, nvmath
importable): 2.5 us per 64 x 64 matrix on an H200 against torch's 311 us. Every GPU call takes
at most `cuda_batch_limit()` matrices: cuSOLVER's batched solvers fail
(CUSOLVER_STATUS_INTERNAL_ERROR or INVALID_VALUE) on batches of a few tens of thousands of
matrices, an undocumented limit that torch does not split for, and a Mamba layer's Gramian
route asks for about 1.5 million 16 x 16 solves at once. A batch refused anyway is solved again
in halves, down to CUDA_MIN_BATCH, and the smaller size is kept for the rest of the process; a
batch the GPU's solver does not converge on (LinAlgError) is solved on the host by LAPACK.
A float64 CUDA batch with n <= 1024 may go instead to the engine's kernels (numba-cuda, in the
`gpu` extra; no limit on the batch): core/cuda_eigen_kernel.py for n <= 32,
core/cuda_block_kernel.py above. `kernel_or_torch` times each against the route above on its
first large batch of each size class in a process, checks that they agree, and keeps the
faster; a kernel that cannot run falls back to the route above, with one warning.
On a CPU: a float64 batch of 16 or more matrices of size 24 or more goes to the compiled
kernel of core/dense_kernel.py (1.15-2.8x LAPACK's speed on one core), unless its caller's
whole job is too small to repay the kernel's compile (`allow_kernel`, decided by
dense_jobs.repays_kernel). torch everywhere else.
All give ascending eigenvalues, as `torch.linalg.eigvalsh` does.

`svdvals` and `svd` are torch's, except on an accelerator's routes, where a batch the device's
solver does not converge on (cuSOLVER's Jacobi SVD stops at a sweep limit, and torch then
raises LinAlgError for the whole batch) is solved again on the host by LAPACK.
"""

from __future__ import annotations

import time
import warnings

import torch

from ..options import environment_switch
from . import cuda_block_kernel, cuda_eigen_kernel, dense_kernel
from .accelerator import accelerator_routes

__all__ = [
    "eigvalsh",
    "svdvals",
    "svd",
    "kernel_takes",
    "cusolver_batched_available",
    "cuda_batch_limit",
    "cuda_kernel_takes",
    "kernel_or_torch",
    "route_choices",
    "TORCH_BATCHED_LIMIT",
]

TORCH_BATCHED_LIMIT = 32  # the largest n torch's CUDA eigvalsh solves as one batched call
# Below this many matrices the kernel's 64 lanes are too empty to beat LAPACK. Measured on
# one core, torch's time over the kernel's at n = 24-128: 8 matrices 0.7-1.0x, 16 matrices
# 1.15-1.65x, 32 matrices 1.9-2.3x, 64 matrices 2.5-2.8x.
KERNEL_MIN_BATCH = 16
_CUDA_R_64F, _CUDA_R_32F = 1, 0  # cudaDataType
_NO_VECTORS, _LOWER = 0, 0  # cusolverEigMode_t, cublasFillMode_t
_failed_once = False
# Whether a float64 CUDA batch may take core/cuda_eigen_kernel.py: a user turns the kernels off
# with ESS_EXPLORER_CUDA_KERNELS=0 (docs/usage.md), a benchmark to time torch's route in the same
# process.
KERNELS_ENV = "ESS_EXPLORER_CUDA_KERNELS"
use_cuda_kernel = environment_switch(KERNELS_ENV, default=True)
_kernel_failed_once = False
# A batch's work (matrices x n^3) from which one timing of a kernel and of torch's route says
# which is faster (`kernel_or_torch`): 12,000 matrices of 16 x 16, one of 370 x 370.
CALIBRATION_WORK = 5e7
_choices: dict = {}  # (route, size class) -> "kernel" or "torch"
_timings: dict = {}  # (route, size class) -> (kernel's seconds, torch's seconds)
CUDA_BATCH = 16384  # matrices per cuSOLVER call to start with (module docstring)
CUDA_MIN_BATCH = 256  # below this a failing call is not the batch's size: raise
_cuda_batch = CUDA_BATCH


def cuda_batch_limit() -> int:
    """The most matrices one CUDA eigensolver call takes in this process (module docstring)."""
    return _cuda_batch


def cusolver_batched_available() -> bool:
    """Whether nvmath-python's binding of cusolverDnXsyevBatched imports here."""
    try:
        from nvmath.bindings import cusolverDn  # noqa: F401
    except Exception:  # ImportError, or a binding whose CUDA libraries are missing
        return False
    return hasattr(cusolverDn, "xsyev_batched")


def kernel_takes(count: int, n: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `eigvalsh` gives a batch of ``count`` matrices n x n to the compiled kernel:
    CPU float64 with numba, at least KERNEL_MIN_BATCH matrices of n >= KERNEL_MIN_SIZE."""
    return (
        not accelerator_routes(device)
        and dtype == torch.float64
        and n >= dense_kernel.KERNEL_MIN_SIZE
        and count >= KERNEL_MIN_BATCH
        and dense_kernel.available()
    )


def eigvalsh(matrices: torch.Tensor, allow_kernel: bool = True) -> torch.Tensor:
    """Ascending eigenvalues (..., n) of the symmetric (..., n, n) ``matrices``. A CUDA kernel
    (core/cuda_eigen_kernel.py, core/cuda_block_kernel.py) for a float64 CUDA batch with
    n <= 1024 where it proved the faster (`cuda_kernel_takes`, `kernel_or_torch`); else
    cuSOLVER's batched solver for a CUDA batch with n > 32 where nvmath is installed (falls
    back to torch, with one warning, if that call fails); the compiled kernel of core/dense_kernel.py
    for a CPU float64 batch of at least KERNEL_MIN_BATCH matrices with n >= KERNEL_MIN_SIZE
    (it solves the batch's tridiagonals side by side, so it needs a batch), unless the
    caller's whole job is too small to repay its compile (``allow_kernel`` False:
    dense_jobs.KERNEL_MIN_WORK); torch otherwise."""
    n = matrices.shape[-1]
    if allow_kernel and kernel_takes(matrices[..., 0, 0].numel(), n, matrices.dtype, matrices.device):
        flat = matrices.reshape(-1, n, n)
        return dense_kernel.symmetric_eigenvalues(flat).reshape(matrices.shape[:-1])
    if matrices.device.type == "cuda":
        flat = matrices.reshape(-1, n, n)
        if cuda_kernel_takes(flat):
            values = kernel_or_torch(
                "eigenvalues",
                flat,
                lambda: cuda_eigen_kernel.symmetric_eigenvalues(flat),
                lambda: _in_cuda_batches(flat),
                _same_eigenvalues,
            )
        elif cuda_kernel_takes(flat, most=cuda_block_kernel.BLOCK_MAX_SIZE):
            values = kernel_or_torch(
                "block eigenvalues",
                flat,
                lambda: cuda_block_kernel.block_eigenvalues(flat),
                lambda: _in_cuda_batches(flat),
                _same_eigenvalues,
                kernel_first=False,
            )
        else:
            values = _in_cuda_batches(flat)
        return values.reshape(matrices.shape[:-1])
    return torch.linalg.eigvalsh(matrices)


def cuda_kernel_takes(matrices: torch.Tensor, most: int = cuda_eigen_kernel.MAX_SIZE) -> bool:
    """Whether the CUDA batch ``matrices`` (..., n, n) may go to core/cuda_eigen_kernel.py
    (`eigvalsh`, and the Gramian route's per-cut steps): float64, n <= ``most``, numba-cuda
    importable with a GPU, not turned off."""
    return (
        use_cuda_kernel
        and not _kernel_failed_once
        and matrices.dtype == torch.float64
        and 0 < matrices.shape[-1] <= most
        and matrices.device.type == "cuda"
        and cuda_eigen_kernel.available()
    )


def kernel_or_torch(route: str, matrices: torch.Tensor, kernel, fallback, agree, kernel_first: bool = True):
    """kernel() (a call of core/cuda_eigen_kernel.py) or fallback() (the torch route it would
    replace) for the batch ``matrices`` (..., n, n). The kernels were written where no GPU
    could time them, so each route is timed against torch's on its first batch of at least
    CALIBRATION_WORK in each size class (n up to the next power of two) of a process, both
    warmed first (the kernel's compile, and any choice the torch route makes inside); the
    results must agree (agree(kernel's, torch's)), and the faster route takes every later
    batch of that class (`route_choices`). A batch before that
    takes the kernel where ``kernel_first``, else torch. A kernel that cannot run (numba-cuda
    cannot compile or launch it here) gives torch this batch and, through `cuda_kernel_takes`,
    every later one, with one warning."""
    global _kernel_failed_once
    n = matrices.shape[-1]
    key = (route, (n - 1).bit_length())
    choice = _choices.get(key)
    untimed = choice is None and matrices[..., 0, 0].numel() * n**3 < CALIBRATION_WORK
    if _kernel_failed_once or choice == "torch" or (untimed and not kernel_first):
        return fallback()
    try:
        if choice == "kernel" or untimed:
            return kernel()
        kernel()  # compiled (numba-cuda) and warmed, untimed
        seconds, got = _timed(kernel)
    except Exception as error:  # a toolkit or driver numba-cuda cannot use: torch still answers
        warnings.warn(f"the CUDA eigenvalue kernel failed ({error}); using torch's route")
        _kernel_failed_once = True
        return fallback()
    fallback()  # warmed too: the first call of a route may decide a route of its own (nested)
    torch_seconds, expected = _timed(fallback)
    _timings[key] = (seconds, torch_seconds)
    if not agree(got, expected):
        warnings.warn(f"the CUDA kernel's {route} disagree with torch's (n = {n}); using torch's route")
        _choices[key] = "torch"
        return expected
    _choices[key] = "kernel" if seconds < torch_seconds else "torch"
    return got if _choices[key] == "kernel" else expected


def route_choices() -> dict:
    """What `kernel_or_torch` chose in this process: {(route, size class): (choice, kernel's
    seconds, torch's seconds)}, size class k holding n in 2^(k-1) + 1 .. 2^k."""
    return {key: (choice, *_timings.get(key, (None, None))) for key, choice in _choices.items()}


def _timed(solve):
    """(seconds, solve()) with the device idle before and after."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    answer = solve()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, answer


def _same_eigenvalues(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Two backward-stable solvers' eigenvalues (B, n): within 16 n eps of each matrix's largest."""
    n = expected.shape[-1]
    bound = 16 * n * torch.finfo(expected.dtype).eps * expected.abs().amax(-1, keepdim=True)
    return bool(((got - expected).abs() <= bound).all())


def svdvals(matrices: torch.Tensor) -> torch.Tensor:
    """`torch.linalg.svdvals`, solved on the host where an accelerator's solver does not
    converge (module docstring)."""
    return _on_host_where_the_device_fails(lambda x: torch.linalg.svdvals(x), matrices)


def svd(matrices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`torch.linalg.svd(matrices, full_matrices=False)`, solved on the host where an
    accelerator's solver does not converge (module docstring)."""
    return _on_host_where_the_device_fails(lambda x: torch.linalg.svd(x, full_matrices=False), matrices)


def _on_host_where_the_device_fails(solve, matrices: torch.Tensor):
    """solve(matrices); on an accelerator's routes, where its solver does not converge
    (LinAlgError), solve(matrices on the host) brought back to the device. ``solve`` reads
    torch.linalg when called, so a test can stand in for the device's solver."""
    try:
        return solve(matrices)
    except torch.linalg.LinAlgError:
        if not accelerator_routes(matrices.device):
            raise
        answer = solve(matrices.cpu())
        if isinstance(answer, torch.Tensor):
            return answer.to(matrices.device)
        return tuple(x.to(matrices.device) for x in answer)


def _in_cuda_batches(flat: torch.Tensor) -> torch.Tensor:
    """Eigenvalues (B, n) of the CUDA batch ``flat`` (B, n, n), at most `cuda_batch_limit()`
    matrices per call; a call that cuSOLVER refuses is made again in halves (module docstring)."""
    global _cuda_batch
    out = flat.new_empty(flat.shape[:-1])
    start = 0
    while start < flat.shape[0]:
        stop = min(start + _cuda_batch, flat.shape[0])
        try:
            out[start:stop] = _cuda_eigvalsh(flat[start:stop])
        except torch.linalg.LinAlgError:  # a matrix the batched solver does not converge on
            out[start:stop] = torch.linalg.eigvalsh(flat[start:stop].cpu()).to(flat.device)
        except RuntimeError as error:
            if "cusolver" not in str(error).lower() or stop - start <= CUDA_MIN_BATCH:
                raise
            _cuda_batch = max(CUDA_MIN_BATCH, (stop - start) // 2)
            continue
        start = stop
    return out


def _cuda_eigvalsh(matrices: torch.Tensor) -> torch.Tensor:
    """One batch (B, n, n) on the GPU: cuSOLVER's batched solver through nvmath where torch
    would loop (n > 32), torch otherwise."""
    n = matrices.shape[-1]
    if (
        n > TORCH_BATCHED_LIMIT
        and matrices.dtype in (torch.float64, torch.float32)
        and matrices.shape[0] > 1
        and cusolver_batched_available()
    ):
        global _failed_once
        try:
            return _cusolver_eigvalsh(matrices)
        except Exception as error:  # a driver without the batched solver: torch still answers
            if not _failed_once:
                warnings.warn(f"cuSOLVER's batched eigensolver failed ({error}); using torch.linalg.eigvalsh")
                _failed_once = True
    return torch.linalg.eigvalsh(matrices)


def _cusolver_eigvalsh(matrices: torch.Tensor) -> torch.Tensor:
    """cusolverDnXsyevBatched on a contiguous copy (it overwrites its input): one call for the
    whole batch, on torch's current stream, workspace from torch's allocator."""
    from nvmath.bindings import cusolverDn

    shape, n = matrices.shape[:-2], matrices.shape[-1]
    batch = matrices.reshape(-1, n, n).contiguous().clone()  # symmetric: row- or column-major alike
    count = batch.shape[0]
    values = torch.empty(count, n, dtype=batch.dtype, device=batch.device)
    info = torch.zeros(count, dtype=torch.int32, device=batch.device)
    kind = _CUDA_R_64F if batch.dtype == torch.float64 else _CUDA_R_32F
    handle = _handle(batch.device)
    params = cusolverDn.create_params()
    try:
        cusolverDn.set_stream(handle, torch.cuda.current_stream(batch.device).cuda_stream)
        device_bytes, host_bytes = cusolverDn.xsyev_batched_buffer_size(
            handle, params, _NO_VECTORS, _LOWER, n, kind, batch.data_ptr(), n, kind, values.data_ptr(), kind, count
        )
        device_work = torch.empty(max(1, device_bytes), dtype=torch.uint8, device=batch.device)
        host_work = torch.empty(max(1, host_bytes), dtype=torch.uint8)
        cusolverDn.xsyev_batched(
            handle,
            params,
            _NO_VECTORS,
            _LOWER,
            n,
            kind,
            batch.data_ptr(),
            n,
            kind,
            values.data_ptr(),
            kind,
            device_work.data_ptr(),
            device_bytes,
            host_work.data_ptr(),
            host_bytes,
            info.data_ptr(),
            count,
        )
    finally:
        cusolverDn.destroy_params(params)
    if bool((info != 0).any()):  # one check per call, not per matrix
        raise RuntimeError(f"{int((info != 0).sum())} of {count} matrices did not converge")
    return values.reshape(*shape, n)


_handles: dict = {}


def _handle(device: torch.device) -> int:
    """One cuSOLVER handle per device, made on first use (creating one costs milliseconds)."""
    from nvmath.bindings import cusolverDn

    key = torch.device(device).index if torch.device(device).index is not None else torch.cuda.current_device()
    if key not in _handles:
        with torch.cuda.device(key):
            _handles[key] = cusolverDn.create()
    return _handles[key]
