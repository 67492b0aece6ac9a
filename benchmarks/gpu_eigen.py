"""Eigenvalues of a batch of float64 Grams on a GPU: torch.linalg.eigvalsh against the engine's
`eigvalsh` (core/eigen.py: cuSOLVER's batched solver through nvmath where n > 32, at most
`cuda_batch_limit()` matrices a call; the CUDA kernel of core/cuda_eigen_kernel.py for n <= 32).
Prints microseconds per matrix and the memory a call takes beyond its input: first for 16 x 16
matrices (a Mamba layer's) by cuSOLVER at several limits of the batch one call takes, by the
kernel and by the batched Jacobi solver, then 32 x 32 by torch and the kernel, then per size
against torch; not a test.

    python benchmarks/gpu_eigen.py            # needs CUDA
"""

from __future__ import annotations

import time

import torch
from bench_engine import chosen_routes

from ess_explorer.core import cuda_block_kernel, cuda_eigen_kernel, eigen

KERNELS_ON = eigen.use_cuda_kernel  # as the environment set it (ESS_EXPLORER_CUDA_KERNELS): off stays off


def kernels_absent() -> str:
    """Why the CUDA kernels are not timed here, or "" where they are."""
    if not KERNELS_ON:
        return f"turned off ({eigen.KERNELS_ENV}=0)"
    return "" if cuda_eigen_kernel.available() else "numba-cuda is not available here"


def per_matrix_us(solve, grams: torch.Tensor, repeats: int = 3) -> float:
    solve(grams)  # warm: handles, workspaces, kernels loaded
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        solve(grams)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best / grams.shape[0] * 1e6


def extra_peak_gb(solve, grams: torch.Tensor) -> float:
    """GB the call allocates beyond its input at its peak: output, copies, solver workspace."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    solve(grams)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**30


def jacobi_batched(grams: torch.Tensor, chunk: int = 16384) -> torch.Tensor:
    """Ascending eigenvalues of float64 (B, n, n), n <= 32, by cuSOLVER's batched Jacobi solver
    (`cusolverDnDsyevjBatched`, torch's route for such batches before 2.11) through nvmath, in
    calls of at most ``chunk`` matrices: a candidate for the 16 x 16 Gramian sandwiches, timed
    here against the engine's route before it is wired in."""
    from nvmath.bindings import cusolverDn

    handle, n = eigen._handle(grams.device), grams.shape[-1]
    cusolverDn.set_stream(handle, torch.cuda.current_stream(grams.device).cuda_stream)
    params = cusolverDn.create_syevj_info()
    out = grams.new_empty(grams.shape[:-1])
    try:
        for start in range(0, grams.shape[0], chunk):
            batch = grams[start : start + chunk].contiguous().clone()  # overwritten by the solver
            count = batch.shape[0]
            info = torch.zeros(count, dtype=torch.int32, device=grams.device)
            values = out[start : start + count]
            lwork = cusolverDn.dsyevj_batched_buffer_size(
                handle, 0, 0, n, batch.data_ptr(), n, values.data_ptr(), params, count
            )
            work = torch.empty(max(1, lwork), dtype=torch.float64, device=grams.device)
            cusolverDn.dsyevj_batched(
                handle,
                0,
                0,
                n,
                batch.data_ptr(),
                n,
                values.data_ptr(),
                work.data_ptr(),
                lwork,
                info.data_ptr(),
                params,
                count,
            )
            if bool((info != 0).any()):
                raise RuntimeError(f"{int((info != 0).sum())} of {count} matrices did not converge")
    finally:
        cusolverDn.destroy_syevj_info(params)
    return out


def main() -> None:
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, nvmath: {eigen.cusolver_batched_available()}")
    sixteen()
    sizes()


def sixteen() -> None:
    """The Mamba layer's solves (1.5 million 16 x 16 at L = 1024): cuSOLVER's route at several
    limits of the batch one call takes (core/eigen.py: cuSOLVER refuses large ones), time and
    memory beyond the input (the solver's workspace), the batched Jacobi solver beside it, and
    the engine's default for these sizes, the one-thread-per-matrix kernel of
    core/cuda_eigen_kernel.py (its first call's compile, then its time, memory and error)."""
    factor = torch.randn(400_000, 24, 16, dtype=torch.float64, device="cuda")
    grams = factor.mT @ factor
    eigen.use_cuda_kernel = False  # cuSOLVER's route first
    for limit in (4096, eigen.CUDA_BATCH):
        eigen._cuda_batch = limit
        print(
            f"  n = 16 in calls of at most {limit:5d}: {per_matrix_us(eigen.eigvalsh, grams):6.3f} us per matrix, "
            f"{extra_peak_gb(eigen.eigvalsh, grams):.2f} GB more at the peak",
            flush=True,
        )
    reference = eigen.eigvalsh(grams)
    eigen.use_cuda_kernel = KERNELS_ON
    kernel_rows(grams, reference)
    if eigen.cusolver_batched_available():
        try:
            error = float(((jacobi_batched(grams) - reference).abs() / reference[:, -1:]).max())
            print(
                f"  n = 16 by the batched Jacobi solver: {per_matrix_us(jacobi_batched, grams):6.3f} us per matrix, "
                f"{extra_peak_gb(jacobi_batched, grams):.2f} GB more at the peak, max error {error:.1e} of lambda_max",
                flush=True,
            )
        except Exception as failure:  # a candidate's trial: say why, go on
            print(f"  n = 16 by the batched Jacobi solver: failed ({type(failure).__name__}: {failure})", flush=True)
    factor = torch.randn(100_000, 40, 32, dtype=torch.float64, device="cuda")
    grams = factor.mT @ factor
    reference = torch.linalg.eigvalsh(grams)
    print(f"  n = 32, torch: {per_matrix_us(torch.linalg.eigvalsh, grams):6.3f} us per matrix", flush=True)
    kernel_rows(grams, reference)


def kernel_rows(grams: torch.Tensor, reference: torch.Tensor) -> None:
    """The CUDA kernel on ``grams``: its first call (the compile, or numba's disk cache), then
    per-matrix time, memory beyond the input and largest error relative to lambda_max."""
    n = grams.shape[-1]
    absent = kernels_absent()
    if absent:
        print(f"  n = {n} by the CUDA kernel: {absent}", flush=True)
        return
    try:
        start = time.perf_counter()
        got = cuda_eigen_kernel.symmetric_eigenvalues(grams[:1000])
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        got = cuda_eigen_kernel.symmetric_eigenvalues(grams)
        error = float(((got - reference).abs() / reference[:, -1:]).max())
        print(
            f"  n = {n} by the CUDA kernel: first call {first:.2f} s, "
            f"{per_matrix_us(cuda_eigen_kernel.symmetric_eigenvalues, grams):6.3f} us per matrix, "
            f"{extra_peak_gb(cuda_eigen_kernel.symmetric_eigenvalues, grams):.2f} GB more at the peak, "
            f"max error {error:.1e} of lambda_max",
            flush=True,
        )
    except Exception as failure:
        print(f"  n = {n} by the CUDA kernel: failed ({type(failure).__name__}: {failure})", flush=True)


def sizes() -> None:
    """Per matrix size: cuSOLVER's batched route (nvmath), the block kernel of
    core/cuda_block_kernel.py (its error against cuSOLVER's), torch's per-matrix loop, and what
    the engine's `eigvalsh` chose on its first batch of the size class (`eigen.route_choices`)."""
    for n, count in ((64, 10_000), (128, 4_000), (512, 200), (1024, 48)):
        factor = torch.randn(count, n + 8, n, dtype=torch.float64, device="cuda")
        grams = factor.mT @ factor
        line = f"  n = {n:5d}, {count:6d} matrices ({grams.numel() * 8 / 2**30:.2f} GB): cuSOLVER "
        eigen.use_cuda_kernel = False
        reference = eigen.eigvalsh(grams)
        line += f"{per_matrix_us(eigen.eigvalsh, grams):9.2f} us, {extra_peak_gb(eigen.eigvalsh, grams):.2f} GB more"
        eigen.use_cuda_kernel = KERNELS_ON
        if not kernels_absent():
            try:
                got = cuda_block_kernel.block_eigenvalues(grams)
                error = float(((got - reference).abs() / reference[:, -1:]).max())
                line += f", block kernel {per_matrix_us(cuda_block_kernel.block_eigenvalues, grams):9.2f} us"
                line += f" (max error {error:.1e} of lambda_max)"
            except Exception as failure:
                line += f", block kernel failed ({type(failure).__name__}: {failure})"
        # torch on a few hundred of them: it loops over matrices above n = 32 (about 0.3 ms each
        # at n = 64 on an H200)
        line += f", torch {per_matrix_us(torch.linalg.eigvalsh, grams[:300], repeats=1):9.2f} us"
        eigen.eigvalsh(grams)  # the engine's own choice for this size class
        print(line + " per matrix", flush=True)
    print(f"  the engine chose: {chosen_routes()}", flush=True)


if __name__ == "__main__":
    main()
