"""Train a diagonal SSM layer with an ESS term in its loss, and show the ESS move.

A learnable DiagonalSSM (L = 32, N = 8, one unit; decays a = sigmoid(.), input and output
vectors b, c constant in t) is fitted to a teacher's outputs on random inputs, with
`lambda * mean entropy-ESS` added to the loss (core/differentiable.py). A positive lambda pushes
entropy-ESS down (the state concentrates on fewer directions), a negative one pushes it up.
Prints entropy-ESS, the smooth and the exact tolerance-ESS, and the fit, before and after.
Runs in a few seconds on a CPU:

    python scripts/ess_regularise.py              # lambda = 0.5: ESS down
    python scripts/ess_regularise.py --lam -0.5   # ESS up
"""

from __future__ import annotations

import argparse

import torch

from ess_explorer.core.differentiable import entropy_ess_grad, soft_tolerance_ess
from ess_explorer.core.ess import tolerance_ess
from ess_explorer.core.operators import DiagonalSSM

LENGTH, STATE = 32, 8


class Layer(torch.nn.Module):
    """An LTI diagonal SSM: a, b, c shared over time, so its operator is a Toeplitz T."""

    def __init__(self, seed: int):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.logit_a = torch.nn.Parameter(torch.randn(STATE, generator=gen, dtype=torch.float64) + 1.0)
        self.b = torch.nn.Parameter(torch.randn(STATE, generator=gen, dtype=torch.float64))
        self.c = torch.nn.Parameter(torch.randn(STATE, generator=gen, dtype=torch.float64))

    def operator(self) -> DiagonalSSM:
        expand = lambda x: x.expand(LENGTH, STATE)  # noqa: E731
        return DiagonalSSM(expand(torch.sigmoid(self.logit_a)), expand(self.b), expand(self.c))


def report(label: str, layer: Layer, inputs, targets) -> None:
    op = layer.operator()
    with torch.no_grad():
        fit = torch.nn.functional.mse_loss(op.apply(inputs), targets).item()
        entropy = entropy_ess_grad(op).mean().item()
        soft = soft_tolerance_ess(op).mean().item()
        count = tolerance_ess(DiagonalSSM(op.a.detach(), op.b.detach(), op.c.detach())).double().mean().item()
    print(
        f"{label:>6}: entropy-ESS {entropy:6.3f}  soft tolerance-ESS {soft:6.3f}  "
        f"tolerance-ESS {count:6.3f}  (mean over cuts)  fit MSE {fit:.4f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lam", type=float, default=0.5, help="weight of mean entropy-ESS in the loss (< 0: push up)")
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    torch.manual_seed(0)
    teacher, student = Layer(seed=1), Layer(seed=2)
    inputs = torch.randn(16, LENGTH, dtype=torch.float64)
    with torch.no_grad():
        targets = teacher.operator().apply(inputs)
    optimiser = torch.optim.Adam(student.parameters(), lr=0.03)
    report("before", student, inputs, targets)
    for _ in range(args.steps):
        op = student.operator()
        loss = torch.nn.functional.mse_loss(op.apply(inputs), targets) + args.lam * entropy_ess_grad(op).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    report("after", student, inputs, targets)


if __name__ == "__main__":
    main()
