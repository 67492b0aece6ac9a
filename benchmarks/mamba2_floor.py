"""The arithmetic floor of Mamba2-130m with gates inside under "ess" (prints; not a test).

    python benchmarks/mamba2_floor.py                  # layers 0, 6, 12, 18 at L = 256
    python benchmarks/mamba2_floor.py --length 512 --layers 3 12

With gates inside every channel of a head is its own unit, T_c = diag(g_c) T_head
(docs/spectra.md), and ESS needs the whole spectrum of each channel at each cut (entropy-ESS
reads every value). Through a symmetric eigensolver, a channel's cut then costs at least the
Householder reduction of an r x r matrix, (4/3) r^3 flops, r the head's numerical rank at that
cut (its values above row_scaled.TRUNCATE_ESS sigma_1). This script counts, on the random
Mamba2-130m of benchmarks/_models.py, each head on the cheaper of the two routes of
core/row_scaled.py:

- ``shared heads``: that reduction for every channel and cut of the heads whose channels share
  their head's factor;
- ``grams``: forming those channels' Grams from the factor, m r (r + 1) / 2 multiply-adds each
  (the upper triangle);
- ``dense heads``: for the other heads (cuts of full rank, or nearly), the reduction of each
  channel's whole cut Gram, (4/3) min(t, L - t)^3, each built from the previous cut's;
- ``causal``: the reduction of each head's causal Gram at each cut, (4/3) w^3, w the rows of
  R_t it keeps (core/recent_kernel.py: at most min(t, N), a fast-forgetting head's far fewer);

and turns them into seconds: the reductions at the rate this machine's kernel reduces 128 x 128
matrices (core/dense_kernel.py, its best size), the Grams at torch's matrix-product rate (one
product per head and cut would be the fastest way to form them), both measured in the run and
spread over torch's thread count. The sum is a floor for the current formulation with no
overhead at all: the heads' SVDs, the QL iterations, capture and bookkeeping come on top. `make bench`
(benchmarks/bench_engine.py) prints `floor_seconds` of the layer it times beside the Mamba2 target.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from _models import random_model, token_ids

from ess_explorer.analysis import capture_layers
from ess_explorer.core import dense_kernel
from ess_explorer.core.causal import WINDOW_MASS
from ess_explorer.core.recent_kernel import RecentRows
from ess_explorer.core.row_scaled import TRUNCATE_ESS
from ess_explorer.core.sweeps import single_threaded_torch


def reduction_rate(n: int = 128, count: int = 64) -> float:
    """Flops per second ((4/3) n^3 per matrix) of the dense kernel's tridiagonal reduction."""
    grams = torch.randn(count, n, n, dtype=torch.float64)
    grams = np.ascontiguousarray((grams @ grams.mT).numpy())
    forms = dense_kernel.TridiagonalForms.empty(count, n)
    forms.reduce(grams[:2], np.full(2, n), range(2))  # compile or load
    start = time.perf_counter()
    forms.reduce(grams, np.full(count, n), range(count))
    return count * 4 / 3 * n**3 / (time.perf_counter() - start)


def product_rate(rows: int = 64, inner: int = 128, cols: int = 528) -> float:
    """Multiply-adds per second of a (rows, inner) x
    (inner, cols) product: a head's 64 channel gates times its factor's row outer products."""
    left, right = (torch.randn(*shape, dtype=torch.float64) for shape in ((rows, inner), (inner, cols)))
    repeats = 200
    with single_threaded_torch():  # one thread's rate, as the reduction's
        torch.mm(left, right)
        start = time.perf_counter()
        for _ in range(repeats):
            torch.mm(left, right)
        return repeats * rows * inner * cols / (time.perf_counter() - start)


def layer_flops(layer) -> dict:
    """The layer's floor counts (module docstring): flops of the reductions, multiply-adds of the Grams."""
    owners, owner_of = layer._owners(list(range(layer.n_units)))
    heads = layer._stored_owners(owners).to(torch.float64)  # (H, L, L)
    channels = torch.bincount(owner_of).to(torch.float64)  # (H,)
    length, state = heads.shape[-1], layer.max_rank
    eigen, grams, dense = (torch.zeros(len(channels), dtype=torch.float64) for _ in range(3))
    ssm = layer.realize(owners)
    recent = RecentRows(ssm.a[..., 0].to(torch.float64), ssm.b.to(torch.float64))
    gramian = torch.zeros(len(channels), state, state, dtype=torch.float64)  # P_t: its values are not read
    out = torch.empty_like(gramian)
    causal = 0.0
    for t in range(1, length):
        sigma = torch.linalg.svdvals(heads[:, t:, :t])  # (H, min(t, L - t))
        rank = (sigma > TRUNCATE_ESS * sigma[:, :1]).sum(-1).to(torch.float64)
        eigen += channels * 4 / 3 * rank**3
        grams += channels * (length - t) * rank * (rank + 1) / 2
        dense += channels * 4 / 3 * min(t, length - t) ** 3
        kept = recent.grams(t, gramian, out, WINDOW_MASS)[0]  # rows kept: the sizes alone are read
        causal += float((4 / 3 * kept.to(torch.float64) ** 3).sum())
    shared = eigen + 2 * grams < dense  # in flops; else the channels build each cut's Gram from the last
    return {
        "dense heads": float(dense[~shared].sum()),
        "shared heads": float(eigen[shared].sum()),
        "grams": float(grams[shared].sum()),
        "causal": causal,
    }


def floor_seconds(model, ids: torch.Tensor, layers) -> tuple[dict, list[str]]:
    """The floor of ``layers`` of ``model`` on the prompt ``ids``, by part, in seconds on this
    machine's threads, and a line per layer and one for the rates, to print."""
    captured = capture_layers(model, ids, layers=list(layers), gates="inside")
    threads = torch.get_num_threads()
    rate = reduction_rate() * threads
    rates = {"dense heads": rate, "shared heads": rate, "grams": product_rate() * threads, "causal": rate}
    lines = [
        f"on {threads} threads: kernel reduction at n = 128 {rate / 1e9:.1f} GF/s, "
        f"products {rates['grams'] / 1e9:.1f} G multiply-adds/s"
    ]
    seconds = dict.fromkeys(rates, 0.0)
    for index, layer in captured.layers.items():
        flops = layer_flops(layer)
        lines.append(f"layer {index}: " + ", ".join(f"{k} {v:.2e} ({v / rates[k]:.2f} s)" for k, v in flops.items()))
        seconds = {k: seconds[k] + flops[k] / rates[k] for k in seconds}
    return seconds, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--layers", type=int, nargs="+", default=[0, 6, 12, 18])
    args = parser.parse_args()
    model = random_model("mamba2")
    seconds, lines = floor_seconds(model, token_ids(model, args.length), args.layers)
    print("\n".join(lines))
    scale = model.config.num_hidden_layers / len(set(args.layers))  # the layers captured, each once
    print(
        f"whole model ({model.config.num_hidden_layers} layers, extrapolated), L = {args.length}: "
        + ", ".join(f"{k} {scale * v:.1f} s" for k, v in seconds.items())
        + f"; floor {scale * sum(seconds.values()):.1f} s"
    )


if __name__ == "__main__":
    main()
