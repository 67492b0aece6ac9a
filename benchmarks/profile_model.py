"""Where one analysis spends its time: cProfile of `analyze` on a random model (prints; not a test).

    python benchmarks/profile_model.py mamba 2048 --device cuda --layers 2
    python benchmarks/profile_model.py gpt2 1024 --top 25

Builds the model of benchmarks/_models.py, runs the same call once on a short prompt (loads,
compiles and warms what it needs, untimed), then profiles `analyze` of the first ``--layers``
layers at length L with the default options and prints the functions with the most cumulative
and the most own time. On a GPU, time spent waiting for the device shows up in the function
that first needs a result on the host (a `.item()`, `.cpu()` or a Python `bool` of a tensor).
On a CPU the engine runs its chunks in worker threads, which cProfile does not see: profile
with one thread (OMP_NUM_THREADS=1) to see them.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
from _models import KINDS, random_model, token_ids

from ess_explorer import analyze


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("L", type=int)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layers", type=int, default=1, help="profile the first this many layers")
    parser.add_argument("--precision", default="ess")
    parser.add_argument("--top", type=int, default=30, help="functions printed per ordering")
    args = parser.parse_args()
    device = torch.device(args.device)
    model = random_model(args.kind).to(device)
    ids = token_ids(model, args.L)
    options = dict(progress=False, device=device, layers=range(args.layers), precision=args.precision)
    analyze(model, ids[:128], **options)
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    analyze(model, ids, **options)
    if device.type == "cuda":
        torch.cuda.synchronize()
    profile.disable()
    print(f"{KINDS[args.kind]}, L = {args.L}, {args.layers} layer(s) on {device}: {time.perf_counter() - start:.2f} s")
    stats = pstats.Stats(profile)
    for order in ("cumulative", "tottime"):
        stats.sort_stats(order).print_stats(args.top)


if __name__ == "__main__":
    main()
