"""Benchmark: analyze end to end on randomly initialised, real-sized models (prints; not a test).

Cases (built from configs offline, float32, seeded):
    gpt2-small shape   12 layers x 12 heads, d_model 768           (dense path, (12, L, L) per layer)
    mamba-130m shape   24 layers, d_model 768, d_inner 1536, N 16  (factored path, 1536 channels per layer)
at L = 512 (random token ids), for one layer (layers=[0]) and for the whole model.

Each case runs in its own subprocess so that its peak memory is its own: the child reports
wall seconds of analyze (the forward pass + all spectra; model construction excluded and
reported separately) and its peak RSS from resource.getrusage (ru_maxrss, whole process,
so it includes torch, transformers and the model's weights).

    .venv/bin/python benchmarks/bench_analyze.py                  # all four cases
    .venv/bin/python benchmarks/bench_analyze.py --length 256 --cases gpt2:1 mamba:1
    python benchmarks/bench_analyze.py --device cuda               # model and spectra on a GPU
Target: one layer of either model under 10 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, os, resource, sys, time
os.environ["HF_HUB_OFFLINE"] = "1"
import torch, transformers as tf
from ess_explorer.analysis import analyze
kind, scope, length, threads, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(threads)
tf.logging.set_verbosity_error()
torch.manual_seed(0)
start = time.perf_counter()
if kind == "gpt2":
    config = tf.GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=1024)
else:
    config = tf.MambaConfig(hidden_size=768, num_hidden_layers=24, state_size=16, expand=2, vocab_size=50280)
model = tf.AutoModelForCausalLM.from_config(config).eval().to(device)
build = time.perf_counter() - start
ids = torch.randint(0, config.vocab_size, (1, length), generator=torch.Generator().manual_seed(1))
layers = [0] if scope == "1" else None
start = time.perf_counter()
result = analyze(model, ids, layers=layers, progress=False, device=device)
if device.startswith("cuda"):
    torch.cuda.synchronize()
seconds = time.perf_counter() - start
lay = result.layers[0]
print(json.dumps({
    "case": kind, "layers": len(result.layers), "L": length, "threads": threads, "device": device,
    "gpu_peak_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if device.startswith("cuda") else None,
    "analyze_s": round(seconds, 2), "build_s": round(build, 2),
    "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    "units_per_layer": lay.n_units, "kept_K": lay.singular_values.shape[-1],
    "mean_tolerance_ess_layer0": round(float(lay.tolerance_ess.mean()), 2),
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="torch device for the model and the spectra (cpu, cuda)")
    parser.add_argument(
        "--cases",
        nargs="*",
        default=["gpt2:1", "mamba:1", "gpt2:all", "mamba:all"],
        help="KIND:SCOPE with KIND gpt2|mamba and SCOPE 1 (layer 0) or all",
    )
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}  (other processes on the machine slow every number)")
    for case in args.cases:
        kind, scope = case.split(":")
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, kind, scope, str(args.length), str(args.threads), args.device],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            print(f"{case}: failed\n{proc.stderr[-2000:]}")
            continue
        record = json.loads(proc.stdout.strip().splitlines()[-1])
        record["subprocess_s"] = round(time.perf_counter() - start, 1)
        print(json.dumps(record))
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
