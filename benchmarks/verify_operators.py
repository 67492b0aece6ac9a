"""The "ess" contract on random operators that stress its routes, for a while (prints; not a test).

    python benchmarks/verify_operators.py --minutes 10 --seed 0

Each run draws an operator and a tolerance, computes tolerance- and entropy-ESS of a sample of
its cuts with ``precision="ess"`` (the public API: `tolerance_ess`, `entropy_ess`) and checks
them against plain numpy SVDs of those cuts: the count equal except where a singular value lies
within 1e-6 (relative) of tau, entropy-ESS within 1e-5 (relative). The operators are the ones random model weights do not
make (core/precision.py): softmax heads up to an attention sink that takes all the weight,
diagonal recurrences with decays near 0 or 1, scalar decays (Mamba2) whose inputs are all
written along one direction of the state, realisations imbalanced by up to 1e8, and cuts with
one dominant value over a tail planted below the routes' resolution. Tolerances: relative
(every scope) from 1e-3 down to 1e-8, or absolute down to 1e-12. Exit status 1 if any run failed.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time

import numpy as np
import torch

from ess_explorer import DiagonalSSM, entropy_ess, tolerance_ess
from ess_explorer.core.ess import tolerance_reference
from ess_explorer.options import SCOPES
from ess_explorer.synthetic import softmax_attention

TAU_BAND, ENTROPY = 1e-6, 1e-5  # the contract (core/precision.py)


def attention(rng: random.Random):
    length = rng.choice([64, 200, 512, 1024])
    sink = rng.choice([0.0, math.log(200 * length), rng.uniform(15, 40)])
    heads = softmax_attention(
        length,
        head_dim=rng.choice([16, 64]),
        units=2,
        seed=rng.randrange(1000),
        sink=sink,
        sharpness=rng.choice([0.1, 1.0, 6.0]),
    )
    return f"softmax L={length} sink={sink:.1f}", heads, heads


def recurrence(rng: random.Random):
    length, state, units = rng.choice([64, 160, 300]), rng.choice([4, 16, 64, 128]), 2
    g = torch.Generator().manual_seed(rng.randrange(1000))
    kind = rng.choice(["uniform", "near 0", "near 1", "scalar"])
    shape = (units, length, state)
    if kind == "scalar":  # one decay per step for every mode (Mamba2)
        a = torch.exp(-rng.uniform(0.001, 0.3) * torch.rand(units, length, 1, generator=g, dtype=torch.float64)).expand(
            shape
        )
    else:
        jitter = 1e-6 * torch.rand(shape, generator=g, dtype=torch.float64)
        a = {
            "uniform": 0.5 + 0.5 * torch.rand(shape, generator=g, dtype=torch.float64),
            "near 0": jitter,
            "near 1": 1 - jitter,
        }[kind]
    b, c = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(2))
    writes = rng.choice(["random", "one direction"])
    if writes == "one direction":
        b = b[:, :1] * torch.randn(units, length, 1, generator=g, dtype=torch.float64) + 1e-13 * b
    imbalance = 10 ** rng.choice([0, 4])  # per mode from 1/imbalance to imbalance
    scale = torch.logspace(-math.log10(imbalance), math.log10(imbalance), state, dtype=torch.float64)
    ssm = DiagonalSSM(a.contiguous(), b * scale, c / scale)
    return f"diagonal {kind} N={state} L={length} {writes} imbalance {imbalance**2:g}", ssm, ssm.materialize()


def planted(rng: random.Random):
    length = rng.choice([120, 400, 1000])
    t = length // 2
    g = torch.Generator().manual_seed(rng.randrange(1000))
    count = rng.choice([3, t - 1])
    values = torch.full((count + 1,), 10 ** rng.uniform(-12, -6), dtype=torch.float64)
    values[0] = 1.0
    values[1 : 1 + min(3, count)] = 1e-3 * (1 + torch.tensor([1e-4, -1e-4, 1e-2])[: min(3, count)])  # around tau
    values = values.sort(descending=True).values
    left = torch.linalg.qr(torch.randn(length - t, count + 1, generator=g, dtype=torch.float64)).Q
    right = torch.linalg.qr(torch.randn(t, count + 1, generator=g, dtype=torch.float64)).Q
    dense = torch.zeros(1, length, length, dtype=torch.float64)
    dense[0, t:, :t] = left @ torch.diag(values) @ right.T
    return f"planted L={length}: sigma_1, three values at tau, {count - 3} at {float(values[-1]):.0e}", dense, dense


def tolerance(rng: random.Random) -> dict:
    if rng.random() < 0.3:
        return dict(tol=10 ** rng.choice([-4, -6, -9, -12]), relative=False)
    return dict(tol=10 ** rng.choice([-3, -3, -5, -8]), relative=True, scope=rng.choice(SCOPES))


def exact_spectra(dense: torch.Tensor, positions: list[int]) -> torch.Tensor:
    width = max(min(t, dense.shape[-1] - t) for t in positions)
    out = torch.zeros(dense.shape[0], len(positions), width, dtype=torch.float64)
    for column, t in enumerate(positions):
        values = torch.from_numpy(np.linalg.svd(dense[:, t:, :t].numpy(), compute_uv=False))
        out[:, column, : values.shape[-1]] = values
    return out


def check(op, dense: torch.Tensor, positions: list[int], options: dict) -> str | None:
    """None where the "ess" ESS of ``positions`` meet the contract, else what went wrong."""
    exact = exact_spectra(dense, positions)
    expected = tolerance_ess(spectra=exact, **options)
    got = tolerance_ess(op, positions=positions, precision="ess", **options)
    if options["relative"]:
        tau = options["tol"] * tolerance_reference(exact, options["scope"])
    else:
        tau = torch.tensor(options["tol"], dtype=torch.float64)
    near = ((exact - tau).abs() <= TAU_BAND * tau).any(-1)
    miscounts = int(((got != expected) & ~near).sum())
    entropy, truth = entropy_ess(op, positions=positions, precision="ess"), entropy_ess(spectra=exact)
    error = float(((entropy - truth).abs() / truth.clamp_min(1e-300)).max())
    if miscounts or error > ENTROPY:
        return f"{miscounts} miscounts, entropy-ESS off by {error:.2e}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    runs = failed = cuts = 0
    deadline = time.perf_counter() + 60 * args.minutes
    while time.perf_counter() < deadline:
        name, op, dense = rng.choice([attention, recurrence, planted])(rng)
        length = dense.shape[-1]
        positions = sorted({length // 2, *rng.sample(range(1, length), 7)})
        options = tolerance(rng)
        problem = check(op, dense, positions, options)
        runs, cuts = runs + 1, cuts + len(positions) * dense.shape[0]
        if problem:
            failed += 1
            print(f"FAILED {name} {options}: {problem}", flush=True)
    print(f"{runs} operators checked ({cuts} cuts), {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
