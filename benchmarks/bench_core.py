"""Benchmark of the ESS core. Prints ratios against baselines measured in the same run.

    python benchmarks/bench_core.py            # every case (a few minutes on 2 cores)
    python benchmarks/bench_core.py --quick    # L = 256 and 512 only, smaller layer
    python benchmarks/bench_core.py --device cuda

Cases
1. dense path ("auto": Gram + eigvalsh with an SVD redo of ill-conditioned cuts) against
   the per-cut torch.linalg.svdvals float64 loop, causal softmax attention, L = 256..1024:
   time ratio (target >= 2.5x at L = 1024) and max relative difference of the singular
   values, |sigma - sigma_ref| / sigma_1 over all cuts (target <= 1e-9).
2. factored (DiagonalSSM sweeps) against the dense path at L = 512, N = 16 (target >= 100x).
3. a Mamba-130m-shaped layer: 1536 channels, N = 16, L = 1024, all cuts, both ESS
   variants: wall time (target <= 15 s on 2 cores) and peak memory (target <= 4 GB),
   measured in a fresh subprocess (ru_maxrss, so the baseline interpreter is included).
On CUDA it also times a GPT-2-small-shaped case: 144 softmax heads at L = 1024.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch
from _models import mamba_like

from ess_explorer import entropy_ess, hankel_singular_values, tolerance_ess
from ess_explorer.synthetic import softmax_attention


def per_cut_svdvals_loop(op: torch.Tensor) -> torch.Tensor:
    """The baseline: one torch.linalg.svdvals call per cut, float64."""
    length = op.shape[-1]
    out = torch.zeros(length, length // 2, dtype=torch.float64, device=op.device)
    for t in range(1, length):
        sigma = torch.linalg.svdvals(op[t:, :t])
        out[t, : sigma.shape[-1]] = sigma[: length // 2]
    return out


def timed(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    value = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return value, time.perf_counter() - start


def layer_case(channels, length, state, device_name) -> dict:
    """Run in a fresh process so that peak RSS belongs to this case alone."""
    import resource

    device = torch.device(device_name)
    ssm = mamba_like(channels, length, state).to(device)
    (sigma, tol, ent), seconds = timed(
        lambda: (lambda s: (s, tolerance_ess(spectra=s), entropy_ess(spectra=s)))(
            hankel_singular_values(ssm, device=device)
        ),
        device,
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    gpu_peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    return {
        "seconds": seconds,
        "peak_rss_gb": peak,
        "gpu_peak_gb": gpu_peak,
        "mean_tolerance_ess": tol.double().mean().item(),
        "mean_entropy_ess": ent.mean().item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layer-case", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.layer_case:
        print(json.dumps(layer_case(*args.layer_case, args.device)))
        return
    device = torch.device(args.device)
    print(f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads")

    print("\n1. dense path vs per-cut svdvals loop (causal softmax attention, float64)")
    print(f"{'L':>6} {'loop s':>9} {'dense s':>9} {'speed-up':>9} {'max |dsigma|/sigma_1':>22}")
    for length in (256, 512) if args.quick else (256, 512, 1024):
        op = softmax_attention(length, head_dim=64, seed=0)[0].to(device)
        reference, loop_s = timed(lambda: per_cut_svdvals_loop(op), device)
        fast, fast_s = timed(lambda: hankel_singular_values(op, device=device), device)
        scale = reference[:, :1].clamp_min(1e-300)
        error = ((fast - reference).abs() / scale).max().item()
        print(f"{length:>6} {loop_s:>9.2f} {fast_s:>9.2f} {loop_s / fast_s:>8.1f}x {error:>22.2e}")

    print("\n2. factored vs dense, L = 512, N = 16 (target >= 100x)")
    ssm = mamba_like(1, 512, 16).to(device)
    dense_op = ssm.materialize()[0]
    dense, dense_s = timed(lambda: hankel_singular_values(dense_op, device=device), device)
    factored, factored_s = timed(lambda: hankel_singular_values(ssm, device=device)[0], device)
    error = ((factored - dense[:, :16]).abs() / dense[:, :1].clamp_min(1e-300)).max().item()
    print(
        f"one unit alone:   dense {dense_s:.3f} s, factored {factored_s:.4f} s: {dense_s / factored_s:.0f}x faster; "
        f"max |dsigma|/sigma_1 = {error:.1e}"
    )
    batch = mamba_like(256, 512, 16, seed=1).to(device)  # how a layer's channels are swept
    _, batch_s = timed(lambda: hankel_singular_values(batch, device=device), device)
    per_unit = batch_s / 256
    print(f"per unit in a batch of 256: factored {per_unit * 1e3:.1f} ms: {dense_s / per_unit:.0f}x faster than dense")

    channels, length = (384, 512) if args.quick else (1536, 1024)
    print(f"\n3. Mamba-130m-shaped layer: {channels} channels, N = 16, L = {length}, all cuts, both ESS")
    run = subprocess.run(
        [sys.executable, __file__, "--device", args.device, "--layer-case", str(channels), str(length), "16"],
        capture_output=True,
        text=True,
        check=True,
    )
    case = json.loads(run.stdout.strip().splitlines()[-1])
    gpu = f", GPU peak {case['gpu_peak_gb']:.2f} GB" if case["gpu_peak_gb"] is not None else ""
    print(
        f"wall {case['seconds']:.1f} s (target <= 15 s), peak RSS {case['peak_rss_gb']:.2f} GB (target <= 4 GB){gpu}; "
        f"mean tolerance-ESS {case['mean_tolerance_ess']:.2f}, mean entropy-ESS {case['mean_entropy_ess']:.2f}"
    )

    if device.type == "cuda":
        print("\n4. GPT-2-small-shaped: 144 softmax heads at L = 1024, all cuts")
        heads = softmax_attention(1024, head_dim=64, units=144, seed=1).to(device)
        _, seconds = timed(lambda: hankel_singular_values(heads, device=device), device)
        print(f"wall {seconds:.1f} s")


if __name__ == "__main__":
    main()
