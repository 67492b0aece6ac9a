"""The Gramian route's two CPU paths, kernel against blocked, on shapes you name (prints; not a test).

    python benchmarks/bench_gramian_routes.py 64x128x256 128x128x256 20x32x2048

Each shape is UNITS x N x L: that many units of a random Mamba-like diagonal SSM
(`synthetic.diagonal_ssm`) with a state of N, every cut of a prompt of L, under "ess" with causal
ESS. Both paths run twice, alternated in this process, after one untimed call that compiles the
kernel; the line gives each path's range, their ratio (best kernel over best blocked: below 1
the kernel is faster), the largest difference between their spectra relative to sigma_1, and
which path `gramian.uses_kernel` (core/costs.py's prices) picks for the shape. These are the
measurements the rule was fitted to (docstring of `gramian.uses_kernel`); rerun them to check it
on another machine.
"""

from __future__ import annotations

import argparse
import time

import torch

from ess_explorer import synthetic
from ess_explorer.core import gramian
from ess_explorer.core.precision import Accuracy


def shape(text: str) -> tuple[int, int, int]:
    units, state, length = (int(x) for x in text.lower().split("x"))
    return units, state, length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shapes", nargs="+", type=shape, help="UNITSxNxL, e.g. 64x128x256")
    args = parser.parse_args()
    gramian.load()
    accuracy = Accuracy("ess")
    for units, state, length in args.shapes:
        ssm = synthetic.diagonal_ssm(length, state, units=units, seed=1)
        positions = torch.arange(length)
        seconds: dict[bool, list[float]] = {True: [], False: []}
        spectra = {}
        for _ in range(2):
            for kernel in (True, False):
                start = time.perf_counter()
                spectra[kernel], _ = gramian.gramian_hankel_singular_values(
                    ssm, positions=positions, accuracy=accuracy, causal=True, kernel=kernel
                )
                seconds[kernel].append(time.perf_counter() - start)
        gap = float((spectra[True] - spectra[False]).abs().max() / spectra[False].max())
        picked = "kernel" if gramian.uses_kernel(torch.device("cpu"), units, length - 1, state, length) else "blocked"
        print(
            f"{units} units, N = {state}, L = {length}: kernel {min(seconds[True]):.2f}-{max(seconds[True]):.2f} s, "
            f"blocked {min(seconds[False]):.2f}-{max(seconds[False]):.2f} s, "
            f"ratio {min(seconds[True]) / min(seconds[False]):.2f}, max |dsigma| / sigma_1 {gap:.1e}, "
            f"uses_kernel picks {picked}",
            flush=True,
        )


if __name__ == "__main__":
    main()
