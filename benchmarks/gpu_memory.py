"""What a GPU's memory holds at the peak of one Mamba-130m-shaped layer (prints; not a test).

    python benchmarks/gpu_memory.py                 # needs CUDA: 1536 channels, N = 16, L = 1024
    python benchmarks/gpu_memory.py --channels 384 --precision exact

The Gramian route's own estimate for this layer (`gramian_blocked.blocked_bytes_per_unit`) is
about 3.3 GB, and its torch route on a CPU grows as estimated; an H200 reported a peak of
12.8 GB (torch.cuda.max_memory_allocated). This runs the layer as `bench_engine.py --only layer`
does, with torch's allocator recording every allocation and the Python stack that made it,
replays the trace to its peak and prints the bytes alive there, grouped by the innermost frame
of ess_explorer that asked for them (a solver's workspace shows under the engine's line that
called the solver): once with the engine's CUDA kernels where it chose them, once with torch's
routes alone (the routes of the 12.8 GB run).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from _models import mamba_like
from bench_engine import chosen_routes

from ess_explorer import entropy_ess, hankel_singular_values, tolerance_ess
from ess_explorer.core import eigen
from ess_explorer.core.gramian_blocked import blocked_bytes_per_unit


def alive_at_peak(events: list[dict]) -> tuple[int, list[dict]]:
    """(peak bytes, the alloc events alive at the peak) of one device's allocator trace: bytes
    count from an "alloc" until its "free_completed" (a freed block is reusable only then)."""
    alive: dict[int, dict] = {}
    current = peak = peak_index = 0
    for index, event in enumerate(events):
        if event["action"] == "alloc":
            alive[event["addr"]] = event
            current += event["size"]
            if current > peak:
                peak, peak_index = current, index
        elif event["action"] == "free_completed" and event["addr"] in alive:
            current -= alive.pop(event["addr"])["size"]
    alive = {}
    for event in events[: peak_index + 1]:  # again, stopping at the peak
        if event["action"] == "alloc":
            alive[event["addr"]] = event
        elif event["action"] == "free_completed":
            alive.pop(event["addr"], None)
    return peak, list(alive.values())


def where(event: dict) -> str:
    """The innermost ess_explorer frame of an allocation's stack (frames innermost first)."""
    for frame in event.get("frames", ()):
        name = frame.get("filename", "")
        if "ess_explorer" in name:
            return f"{name.split('ess_explorer', 1)[1].lstrip('/')}:{frame['line']} ({frame['name']})"
    return "outside ess_explorer"


def by_place(events: list[dict]) -> list[tuple[str, int, int]]:
    """(place, bytes, allocations) for each `where`, the most bytes first."""
    total: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for event in events:
        slot = total[where(event)]
        slot[0] += event["size"]
        slot[1] += 1
    return sorted(((place, size, count) for place, (size, count) in total.items()), key=lambda row: -row[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--channels", type=int, default=1536)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--precision", default="ess")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    estimate = blocked_bytes_per_unit(args.length, args.length - 1, 16, causal=False) * args.channels
    print(
        f"{args.channels} channels, N = 16, L = {args.length}, precision {args.precision!r}; "
        f"the Gramian route's estimate {estimate / 2**30:.2f} GB"
    )
    # the engine's CUDA kernels where it chose them (unless ESS_EXPLORER_CUDA_KERNELS=0), then torch's routes alone
    for kernels in (True, False) if eigen.use_cuda_kernel else (False,):
        eigen.use_cuda_kernel = kernels
        trace(args, "with the CUDA kernels" if kernels else "torch's routes alone")
    print(f"  the engine's choices: {chosen_routes()}")


def trace(args, label: str) -> None:
    """Run the layer once unrecorded (compiles, and the engine's choices between its kernels and
    torch, at the layer's width), then recorded; print the peak and what was alive there."""
    device = torch.device("cuda")

    def layer(op):
        sigma = hankel_singular_values(op, device=device, precision=args.precision)
        return tolerance_ess(spectra=sigma), entropy_ess(spectra=sigma)

    layer(mamba_like(args.channels, 128, 16))
    op = mamba_like(args.channels, args.length, 16)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=2_000_000)
    layer(op)
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = snapshot["device_traces"][torch.cuda.current_device()]
    peak, alive = alive_at_peak(events)
    print(
        f"{label}: max_memory_allocated {(torch.cuda.max_memory_allocated() - before) / 2**30:.2f} GB above the "
        f"start, the trace's peak {peak / 2**30:.2f} GB ({len(events)} events)"
    )
    for place, size, count in by_place(alive)[: args.top]:
        print(f"  {size / 2**30:7.3f} GB in {count:5d} allocations  {place}")
    del op
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
