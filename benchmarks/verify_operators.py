"""The "ess" contract on random operators that stress its routes, for a while (prints; not a test).

    python benchmarks/verify_operators.py --minutes 10 --seed 0

Each run draws an operator and a tolerance, computes tolerance- and entropy-ESS of a sample of
its cuts (a run of eight consecutive ones among them) with ``precision="ess"`` and checks them
against plain numpy SVDs of those cuts: the count equal except where a singular value lies
within 1e-6 (relative) of tau or within float64's resolution of the cut (ROUNDOFF sigma_1, which
no SVD decides), entropy-ESS within 1e-5 (relative). The operators are the ones random model
weights do not make (core/precision.py): softmax heads up to an attention sink that takes all
the weight, diagonal recurrences with decays near 0 or 1 or one of 1e-200, scalar decays (Mamba2) whose inputs
are all written along one direction of the state, realisations imbalanced by up to 1e8, and cuts
with one dominant value over a tail planted below the routes' resolution; all through the
public API (`tolerance_ess`, `entropy_ess`, and `causal_ess` against SVDs of the reachability
matrices). Channels of a gated head (gates inside, core/row_scaled.py: silu gates of wide
pre-activations, gates spread over 1e-8..1, gates that open late, exact zeros) take that
route's function with the accuracy `analyze` gives it. Tolerances: relative (every scope) from
1e-3 down to 1e-8, or absolute down to 1e-12. Exit status 1 if any run failed.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from functools import partial
from typing import Callable, NamedTuple

import numpy as np
import torch

from ess_explorer import DPLRSSM, DiagonalSSM, causal_ess, entropy_ess, hankel_singular_values, tolerance_ess
from ess_explorer.core.causal import reachability_singular_values
from ess_explorer.core.ess import tolerance_reference
from ess_explorer.core.precision import EXACT, ROUNDOFF, TAU_BAND, Accuracy, zero_subnormal_cuts
from ess_explorer.core.row_scaled import row_scaled_hankel_singular_values
from ess_explorer.options import SCOPES
from ess_explorer.synthetic import softmax_attention
from ess_explorer.verification import ENTROPY_TOLERANCE, EXACT_ABSOLUTE, EXACT_RELATIVE


class Draw(NamedTuple):
    """One operator to check: its exact spectra of given cuts (numpy SVDs), and the "ess" ESS of
    them (tolerance-ESS, and entropy-ESS where the draw has one)."""

    name: str
    length: int
    units: int
    exact: Callable[[list[int]], torch.Tensor]  # positions -> (U, P, K) descending
    fast: Callable[[list[int], dict], tuple[torch.Tensor, torch.Tensor | None]]  # positions, tolerance
    spectra: Callable[[list[int]], torch.Tensor]  # positions -> the "exact" route's values (U, P, K)


def cut_spectra(dense: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """sigma(H_t) of dense (U, L, L) at ``positions`` by numpy's SVD: (U, P, K), zero padded; a
    cut below float64's normal range read as zero, as the engine reads it."""
    return zero_subnormal_cuts(stacked_svdvals([dense[:, t:, :t] for t in positions]))


def stacked_svdvals(matrices: list[torch.Tensor]) -> torch.Tensor:
    width = max(min(m.shape[-2:]) for m in matrices)
    out = torch.zeros(matrices[0].shape[0], len(matrices), width, dtype=torch.float64)
    for column, m in enumerate(matrices):
        values = torch.from_numpy(np.linalg.svd(m.numpy(), compute_uv=False))
        out[:, column, : values.shape[-1]] = values
    return out


def of_operator(name: str, op, dense: torch.Tensor) -> Draw:
    """A draw checked through the public API: `tolerance_ess` and `entropy_ess` of ``op``."""

    def fast(positions, options):
        counts = tolerance_ess(op, positions=positions, precision="ess", **options)
        return counts, entropy_ess(op, positions=positions, precision="ess")

    def spectra(positions):
        return hankel_singular_values(op, positions=positions, precision="exact")

    return Draw(name, dense.shape[-1], dense.shape[0], partial(cut_spectra, dense), fast, spectra)


def attention(rng: random.Random) -> Draw:
    length = rng.choice([64, 200, 512, 1024])
    heads = attention_heads(rng, length, 2)
    return of_operator(f"softmax L={length}", heads, heads)


def attention_heads(rng: random.Random, length: int, units: int) -> torch.Tensor:
    sink = rng.choice([0.0, math.log(200 * length), rng.uniform(15, 40)])
    return softmax_attention(
        length,
        head_dim=rng.choice([16, 64]),
        units=units,
        seed=rng.randrange(1000),
        sink=sink,
        sharpness=rng.choice([0.1, 1.0, 6.0]),
    )


def diagonal_ssm(
    rng: random.Random, kinds=("uniform", "near 0", "near 1", "scalar", "reset")
) -> tuple[str, DiagonalSSM]:
    length, state, units = rng.choice([64, 160, 300]), rng.choice([4, 16, 64, 128]), 2
    g = torch.Generator().manual_seed(rng.randrange(1000))
    kind = rng.choice(kinds)
    shape = (units, length, state)
    if kind == "scalar":  # one decay per step for every mode (Mamba2)
        a = torch.exp(-rng.uniform(0.001, 0.3) * torch.rand(units, length, 1, generator=g, dtype=torch.float64)).expand(
            shape
        )
    else:
        jitter = 1e-6 * torch.rand(shape, generator=g, dtype=torch.float64)
        a = {
            "uniform": 0.5 + 0.5 * torch.rand(shape, generator=g, dtype=torch.float64),
            "reset": 0.5 + 0.5 * torch.rand(shape, generator=g, dtype=torch.float64),
            "near 0": jitter,
            "near 1": 1 - jitter,
        }[kind]
        if kind == "reset":  # one decay of 1e-200: the cut there lies near 1e-200, its squares underflow
            # (not 1e-312, below float64's normal range: numpy's SVDs of such cuts run 30x slower
            # on subnormal arithmetic; tests/test_precision.py checks that case on every route)
            a[:, length // 2] = 1e-200  # a cut every draw checks
    b, c = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(2))
    writes = rng.choice(["random", "one direction"])
    if writes == "one direction":
        b = b[:, :1] * torch.randn(units, length, 1, generator=g, dtype=torch.float64) + 1e-13 * b
    imbalance = 10 ** rng.choice([0, 4])  # per mode from 1/imbalance to imbalance
    scale = torch.logspace(-math.log10(imbalance), math.log10(imbalance), state, dtype=torch.float64)
    ssm = DiagonalSSM(a.contiguous(), b * scale, c / scale)
    return f"diagonal {kind} N={state} L={length} {writes} imbalance {imbalance**2:g}", ssm


def delta_rule(rng: random.Random) -> tuple[str, DPLRSSM]:
    """Gated DeltaNet's transition A_t = alpha_t (I - beta_t k_t k_t^T) (core/operators.py), with
    decays near 1 or 0, beta up to 2 (a reflection: nothing decays) or exactly 1 (a projection:
    A_t is singular), and keys that repeat (every write along one direction)."""
    length, state, units = rng.choice([64, 160]), rng.choice([4, 16, 64]), 2
    g = torch.Generator().manual_seed(rng.randrange(1000))
    shape = (units, length, state)
    decay = rng.choice(["near 1", "near 0", "uniform"])
    alpha = {
        "near 1": 1 - 1e-6 * torch.rand(units, length, 1, generator=g, dtype=torch.float64),
        "near 0": 1e-6 * torch.rand(units, length, 1, generator=g, dtype=torch.float64),
        "uniform": torch.rand(units, length, 1, generator=g, dtype=torch.float64),
    }[decay]
    beta_kind = rng.choice(["(0, 1)", "1", "up to 2"])
    beta = {
        "(0, 1)": torch.rand(units, length, 1, generator=g, dtype=torch.float64),
        "1": torch.ones(units, length, 1, dtype=torch.float64),
        "up to 2": 2 * torch.rand(units, length, 1, generator=g, dtype=torch.float64),
    }[beta_kind]
    keys, keys_kind = torch.randn(shape, generator=g, dtype=torch.float64), ""
    if rng.random() < 0.3:  # every key along one direction, up to 1e-3
        # Not closer: with beta = 1 each step's projection then cancels all but that much of
        # the state, and T itself is known to float64 only to eps over it per step (keys
        # repeated to 1e-9: numpy's SVD of the float64 T 3e-4 from a 60-digit computation of the
        # same parameters, the sweep 9e-4). No float64 route, the reference included, is
        # checkable there.
        keys, keys_kind = keys[:, :1] + 1e-3 * keys, ", keys along one direction"
    keys = keys / keys.norm(dim=-1, keepdim=True)
    queries = torch.randn(shape, generator=g, dtype=torch.float64)
    op = DPLRSSM(
        a=alpha.expand(shape).contiguous(),
        p=(-alpha * beta * keys)[..., None],
        q=keys[..., None],
        b=beta * keys,
        c=queries,
    )
    return f"delta rule N={state} L={length}, decay {decay}, beta {beta_kind}{keys_kind}", op


def recurrence(rng: random.Random) -> Draw:
    name, op = (diagonal_ssm if rng.random() < 0.75 else delta_rule)(rng)
    return of_operator(name, op, op.materialize())


def causal(rng: random.Random) -> Draw:
    """Causal ESS (`causal_ess`, the counts only) against SVDs of the reachability matrices
    R_{t+1} = [A_t R_t | b_t] (core/causal.py), built column by column."""
    name, op = (diagonal_ssm if rng.random() < 0.75 else delta_rule)(rng)

    def transition(t: int, reach: torch.Tensor) -> torch.Tensor:  # A_t R: (U, N, t)
        moved = op.a[:, t, :, None] * reach
        if isinstance(op, DPLRSSM):
            moved = moved + op.p[:, t] @ (op.q[:, t].mT @ reach)
        return moved

    def exact(positions):
        reach, out = op.b.new_zeros(op.b.shape[0], op.b.shape[-1], 0), {}
        for t in range(1, max(positions) + 1):
            reach = torch.cat([transition(t - 1, reach), op.b[:, t - 1, :, None]], dim=-1)
            out[t] = reach
        return stacked_svdvals([out[t] for t in positions])

    def fast(positions, options):
        return causal_ess(op, positions=positions, precision="ess", **options), None

    return Draw(f"causal of {name}", op.length, op.a.shape[0], exact, fast, partial(reachability_singular_values, op))


def planted(rng: random.Random) -> Draw:
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
    return of_operator(
        f"planted L={length}: sigma_1, three values at tau, {count - 3} at {float(values[-1]):.0e}", dense, dense
    )


def gates(rng: random.Random, units: int, length: int) -> tuple[str, torch.Tensor]:
    """Output gates (units, L) as hard as a trained gate can make them: silu of wide
    pre-activations, magnitudes spread over 1e-8..1 row by row, a gate that opens only late
    (when a fast head's factor has decayed), and exact zeros (a whole channel of them too)."""
    g = torch.Generator().manual_seed(rng.randrange(1000))
    z = torch.randn(units, length, generator=g, dtype=torch.float64)
    kind = rng.choice(["silu", "spread", "late", "zeros"])
    if kind == "silu":
        return kind, torch.nn.functional.silu(rng.choice([1.0, 4.0, 16.0]) * z)
    if kind == "spread":
        return kind, z.sign() * 10 ** (-8 * torch.rand(units, length, generator=g, dtype=torch.float64))
    if kind == "late":
        opens = torch.linspace(-8, 0, length, dtype=torch.float64)
        return kind, z * 10**opens
    z[torch.rand(units, length, generator=g) < 0.5] = 0.0
    z[0] = 0.0
    return kind, z


def channels(rng: random.Random) -> Draw:
    """Gates inside (core/row_scaled.py): 2 owners, 4 channels each, T_u = diag(g_u) T_owner,
    with the accuracy `analyze` hands that route (the tolerance it counts at)."""
    if rng.random() < 0.5:
        name, ssm = diagonal_ssm(rng, kinds=("scalar", "near 1", "uniform", "reset"))
        owners, max_rank = ssm.materialize(), ssm.state_size
    else:
        length = rng.choice([64, 200, 400])
        name, owners, max_rank = f"softmax L={length}", attention_heads(rng, length, 2), None
    owner_of = torch.arange(2).repeat_interleave(4)
    kind, scales = gates(rng, len(owner_of), owners.shape[-1])
    units = scales[:, :, None] * owners[owner_of]

    def values(positions, accuracy):
        return row_scaled_hankel_singular_values(
            owners, owner_of, scales, positions, max_rank=max_rank, accuracy=accuracy
        )

    def fast(positions, options):
        sigma = values(positions, Accuracy("ess", options["tol"], options["relative"], options.get("scope", "cut")))
        return tolerance_ess(spectra=sigma, **options), entropy_ess(spectra=sigma)

    return Draw(
        f"channels ({kind} gates) of {name}",
        units.shape[-1],
        units.shape[0],
        partial(cut_spectra, units),
        fast,
        partial(values, accuracy=EXACT),
    )


def tolerance(rng: random.Random) -> dict:
    if rng.random() < 0.3:
        return dict(tol=10 ** rng.choice([-4, -6, -9, -12]), relative=False)
    return dict(tol=10 ** rng.choice([-3, -3, -5, -8]), relative=True, scope=rng.choice(SCOPES))


def check(draw: Draw, positions: list[int], options: dict) -> str | None:
    """None where the "ess" ESS of ``positions`` meet the contract, else what went wrong."""
    exact = draw.exact(positions)
    expected = tolerance_ess(spectra=exact, **options)
    got, entropy = draw.fast(positions, options)
    if options["relative"]:
        tau = options["tol"] * tolerance_reference(exact, options["scope"])
    else:
        tau = torch.tensor(options["tol"], dtype=torch.float64)
    # Where a value lies within TAU_BAND of tau, or within float64's own resolution of a cut's
    # SVD (ROUNDOFF sigma_1: a tiny absolute tol on a large cut), no SVD decides the count.
    band = torch.maximum(TAU_BAND * tau, ROUNDOFF * exact[..., :1])
    near = ((exact - tau).abs() <= band).any(-1)
    miscounts = int(((got != expected) & ~near).sum())
    error = 0.0
    if entropy is not None:
        truth = entropy_ess(spectra=exact)
        error = float(((entropy - truth).abs() / truth.clamp_min(1e-300)).max())
    if miscounts or error > ENTROPY_TOLERANCE:
        return f"{miscounts} miscounts, entropy-ESS off by {error:.2e}"
    return None


def check_exact(draw: Draw, positions: list[int]) -> str | None:
    """None where the "exact" route's values of ``positions`` are each within 1e-6 sigma_k +
    1e-10 sigma_1 of numpy's (the values past the ones either computes are zero), else the
    worst excess."""
    exact, got = draw.exact(positions), draw.spectra(positions)
    width = max(exact.shape[-1], got.shape[-1])
    exact, got = (torch.nn.functional.pad(x, (0, width - x.shape[-1])) for x in (exact, got))
    allowed = EXACT_RELATIVE * exact + EXACT_ABSOLUTE * exact[..., :1]
    excess = float(((got - exact).abs() / allowed.clamp_min(1e-300)).max())
    return None if excess <= 1 else f'"exact" values off by {excess:.3g}x what that contract allows'


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    runs = failed = cuts = 0
    deadline = time.perf_counter() + 60 * args.minutes
    while time.perf_counter() < deadline:
        draw = rng.choice([attention, recurrence, planted, causal, channels])(rng)
        length = draw.length
        run = rng.randrange(1, length - 8)  # a run of cuts: the row-scaled route carries factors along one
        positions = sorted({length // 2, *rng.sample(range(1, length), 7), *range(run, run + 8)})
        options = tolerance(rng)
        problem = check(draw, positions, options) or check_exact(draw, positions)
        runs, cuts = runs + 1, cuts + len(positions) * draw.units
        if problem:
            failed += 1
            print(f"FAILED {draw.name} {options}: {problem}", flush=True)
    print(f"{runs} operators checked ({cuts} cuts), {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
