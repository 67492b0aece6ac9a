"""Eigenvalues of a batch of float64 Grams on a GPU: torch.linalg.eigvalsh against the engine's
`eigvalsh` (core/eigen.py: cuSOLVER's batched solver through nvmath where n > 32, at most
`cuda_batch_limit()` matrices a call). Prints microseconds per matrix and the memory the
engine's call takes beyond its input, then both for 16 x 16 matrices at several limits of the
batch a call takes; not a test.

    python benchmarks/gpu_eigen.py            # needs CUDA
"""

from __future__ import annotations

import time

import torch

from ess_explorer.core import eigen


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


def main() -> None:
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, nvmath: {eigen.cusolver_batched_available()}")
    # n = 16 as a Mamba layer's Gramian route asks (1.5 million at L = 1024): its peak memory
    # beside the input says what the solver's workspace costs
    for n, count in ((16, 400_000), (64, 10_000), (128, 4_000), (512, 200), (1024, 48)):
        factor = torch.randn(count, n + 8, n, dtype=torch.float64, device="cuda")
        grams = factor.mT @ factor
        line = f"  n = {n:5d}, {count:6d} matrices ({grams.numel() * 8 / 2**30:.2f} GB): engine "
        line += f"{per_matrix_us(eigen.eigvalsh, grams):9.2f} us, {extra_peak_gb(eigen.eigvalsh, grams):.2f} GB more at its peak"
        # torch on a few hundred of them: it loops over matrices above n = 32 (about 0.3 ms each
        # at n = 64 on an H200) and refuses batches above cuSOLVER's limit at any n
        line += f", torch {per_matrix_us(torch.linalg.eigvalsh, grams[:300], repeats=1):9.2f} us"
        print(line + " per matrix", flush=True)
    # the batch size a call takes (core/eigen.py: cuSOLVER refuses large ones): time and memory
    factor = torch.randn(400_000, 24, 16, dtype=torch.float64, device="cuda")
    grams = factor.mT @ factor
    for limit in (2048, 4096, 8192, eigen.CUDA_BATCH):
        eigen._cuda_batch = limit
        print(
            f"  n = 16 in calls of at most {limit:5d}: {per_matrix_us(eigen.eigvalsh, grams):6.3f} us per matrix, "
            f"{extra_peak_gb(eigen.eigvalsh, grams):.2f} GB more at the peak",
            flush=True,
        )


if __name__ == "__main__":
    main()
