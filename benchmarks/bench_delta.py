"""Benchmark of a Qwen3-Next-shaped Gated DeltaNet layer (DPLR units on the factored path).

    python benchmarks/bench_delta.py                   # the real layer shape, L = 512
    python benchmarks/bench_delta.py --heads 4         # fewer value heads (a quick look)
    python benchmarks/bench_delta.py --device cuda
    python benchmarks/bench_delta.py --heads 4 --gates outside   # the gated norm outside T

Case: one Qwen3-Next linear-attention layer with the released model's shapes (hidden
size 2048; 16 query/key heads and 32 value heads; key and value head size 128), random
weights, one prompt of L = 512 tokens. `analyze` runs the forward pass, captures the 32
value heads as DPLRSSM units (N = 128, rank-one transitions) and computes every cut's
spectrum and both ESS variants: with gates inside (the default) each head's 128 value
channels are units of their own, diag(g_c) T_head with g = act(z) / rms_t of the gated norm. Printed: wall time and peak memory of that call (in a
fresh subprocess, ru_maxrss, so the interpreter and the model are included), and, as the
baseline measured in the same run, the spectra of the same a, b, c as a DiagonalSSM (the
cost of the diagonal sweep with the same N): the ratio is the price of the rank-one term.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

CHILD = r"""
import json, resource, sys, time, torch
from ess_explorer import DiagonalSSM, analyze, hankel_singular_values
from ess_explorer.capture import capture, layer_slots
args = json.loads(sys.argv[1])
sys.path.insert(0, args["benchmarks"])
from _models import qwen3_next
model = qwen3_next(  # one linear-attention layer with the released model's hidden size
    args["heads"], num_hidden_layers=1, layer_types=["linear_attention"], hidden_size=2048,
    num_attention_heads=16, head_dim=256, vocab_size=256,
)
ids = torch.randint(0, 256, (1, args["length"]), generator=torch.Generator().manual_seed(1))
sync = torch.cuda.synchronize if args["device"] == "cuda" else (lambda: None)
start = time.perf_counter()
result = analyze(model, ids, layers=0, progress=False, device=args["device"], keep_operators=None, gates=args["gates"])
sync()
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
layer = capture(model, ids, layer_slots(model))[0]
ssm = layer.ssm(range(layer.n_units))
diagonal = DiagonalSSM(ssm.a, ssm.b, ssm.c)
times = {}
for name, op in (("dplr", ssm), ("diagonal", diagonal)):
    start = time.perf_counter()
    hankel_singular_values(op, device=args["device"])
    sync()
    times[name] = time.perf_counter() - start
print(json.dumps({"analyze_s": seconds, "peak_gb": peak, "units": layer.n_units, "N": ssm.state_size,
                  "analysed_units": result.layers[0].tolerance_ess.shape[0],
                  "max_tolerance_ess": int(result.layers[0].tolerance_ess.max()), **times}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=32, help="value heads (Qwen3-Next: 32)")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--gates", default="inside", choices=["inside", "outside"])
    args = parser.parse_args()
    payload = json.dumps({**vars(args), "benchmarks": str(Path(__file__).parent)})
    out = subprocess.run([sys.executable, "-c", CHILD, payload], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(out.stderr[-4000:])
    row = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"Qwen3-Next-shaped Gated DeltaNet layer: {row['units']} value heads, N = {row['N']}, L = {args.length}, "
        f"gates {args.gates} ({row['analysed_units']} units), device {args.device}, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(
        f"  analyze (forward + capture + all cuts, both ESS): {row['analyze_s']:.1f} s, peak memory {row['peak_gb']:.2f} GB"
    )
    print(
        f"  spectra only: DPLR {row['dplr']:.1f} s vs the same a, b, c as a DiagonalSSM {row['diagonal']:.1f} s "
        f"(ratio {row['dplr'] / row['diagonal']:.2f}x)"
    )
    print(f"  largest tolerance-ESS: {row['max_tolerance_ess']} of N = {row['N']}")


if __name__ == "__main__":
    main()
