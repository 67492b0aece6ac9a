"""ESS that can be trained against: entropy-ESS and a smooth tolerance-ESS that keep the graph.

The engine's spectra (core/spectra.py, core/sweeps.py, core/gramian.py) are computed for
reading, not for training: they run without gradients and update their square roots in place.
The functions here compute the same singular values with out-of-place torch operations only,
so a loss can hold an ESS term (an ESS-informed regulariser or initialisation):

- a dense operator T (*batch, L, L): ``torch.linalg.svdvals(T[..., t:, :t])`` per cut.
  Cost O(L^3) per cut, O(L^4) per unit over all cuts.
- a `DiagonalSSM`: H_t = G F^T with F_j = b_j prod_{m=j+1..t-1} a_m (j < t) and
  G_i = c_i prod_{m=t..i} a_m (i >= t), the one-segment square-root roots of
  core/gramian.py's ``_exact_cuts``. Each factor with more rows than N is replaced by the R of
  its reduced QR (sigma(G F^T) = sigma(R_G R_F^T)), so each cut costs O(L N^2) and one SVD of
  at most N x N: O(L^2 N^2) per unit over all cuts, and only the N values the state can hold
  (no structural zeros). The running products multiply decays only (no cancellation).

The surrogate of tolerance-ESS (`soft_tolerance_ess`) is

    sum_k sigmoid((log sigma_k - log tau) / temperature),   tau = tol * sigma_1 (relative) or tol,

which tends to the count #{k : sigma_k > tau} as temperature -> 0 (a value exactly at tau
counts 1/2). The relative threshold is per cut (scope "cut", docs/conventions.md) and keeps
its gradient through sigma_1, so the surrogate, like the count, ignores a uniform scaling of a
cut.

Where gradients are undefined: singular values are not differentiable where two of them are
equal or one is zero (the SVD's own limits), and entropy-ESS's slope -log p_k - 1 grows without
bound as p_k -> 0. So a cut with a zero singular value (a dense materialised SSM with
N < min(t, L - t), or a rank-deficient T) gives unreliable gradients on the dense route; the
factored route avoids the structural zeros. A QR factor with dependent columns (fewer
independent past inputs or future readouts than N) has no QR gradient either. Cut t = 0 has no
singular values and contributes ESS 0 with zero gradient.

Example: scripts/ess_regularise.py trains a DiagonalSSM with an entropy-ESS term
(docs/usage.md, "Training against ESS").
"""

from __future__ import annotations

import torch
import torch.nn.functional as nnf

from .checks import require
from .ess import DEFAULT_TOL, check_tolerance, entropy_of
from .operators import DiagonalSSM
from .spectra import cut_positions, validate_operator

__all__ = ["DEFAULT_TEMPERATURE", "differentiable_singular_values", "entropy_ess_grad", "soft_tolerance_ess"]

# In units of log sigma: at 0.1 a value e^0.3 = 1.35 times above tau counts 0.95 and one 1.35
# times below counts 0.05, so the surrogate agrees with the count within 0.05 per value
# everywhere but a band of about +-35% around tau, while still giving gradients there.
DEFAULT_TEMPERATURE = 0.1


def differentiable_singular_values(op, positions=None) -> torch.Tensor:
    """sigma(H_t) of every unit at each cut, (*batch, P, K) descending and zero padded, with the
    autograd graph kept (module docstring: routes, costs, where gradients are undefined).

    op: a dense (*batch, L, L) lower-triangular floating tensor or a `DiagonalSSM` (its d is the
    diagonal, outside every cut). positions: the cuts t (default every t in 0..L-1). K is the
    largest rank a cut can have: max_t min(t, L - t), and at most N for a `DiagonalSSM`.
    """
    if isinstance(op, DiagonalSSM):
        cuts = cut_positions(op.length, positions, None)
        k = min(op.state_size, op.length // 2)
        return _stack((_factored_cut(op, int(t)) for t in cuts.tolist()), k)
    require(
        isinstance(op, torch.Tensor),
        f"differentiable ESS takes a dense torch tensor (*batch, L, L) or a DiagonalSSM, got {type(op).__name__} "
        "(a numpy array has no gradient: convert it with torch.as_tensor; a DPLRSSM: materialise it)",
    )
    dense = validate_operator(op, "operator")
    length = dense.shape[-1]
    cuts = cut_positions(length, positions, None)
    return _stack((torch.linalg.svdvals(dense[..., t:, :t]) for t in cuts.tolist()), length // 2)


def entropy_ess_grad(op, positions=None) -> torch.Tensor:
    """entropy-ESS, exp(-sum p_k log p_k) with p = sigma / sum(sigma), (*batch, P), differentiable;
    the same values as `entropy_ess`. op and positions as `differentiable_singular_values`."""
    return entropy_of(differentiable_singular_values(op, positions))


def soft_tolerance_ess(
    op,
    tol: float = DEFAULT_TOL,
    temperature: float = DEFAULT_TEMPERATURE,
    relative: bool = True,
    positions=None,
) -> torch.Tensor:
    """A smooth tolerance-ESS, (*batch, P): sum_k sigmoid((log sigma_k - log tau) / temperature),
    tau = tol * sigma_1 of the cut (relative, default) or tol (absolute). It tends to
    `tolerance_ess` (scope "cut") as temperature -> 0; temperature is in units of log sigma
    (`DEFAULT_TEMPERATURE`). A zero singular value counts 0 with zero gradient.
    op and positions as `differentiable_singular_values`."""
    check_tolerance(tol, relative)
    require(
        isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and 0 < temperature < float("inf"),
        f"temperature must be a finite number > 0 (in units of log sigma, e.g. 0.1), got {temperature!r}",
    )
    require(tol > 0, "tol must be > 0 for the smooth count: log tau of tau = 0 is -inf (every value would count 1)")
    sigma = differentiable_singular_values(op, positions)
    tau = tol * sigma[..., :1] if relative else torch.full_like(sigma[..., :1], float(tol))
    alive = (sigma > 0) & (tau > 0)
    safe = lambda x: torch.where(alive, x, torch.ones_like(x))  # noqa: E731  (log 0 would poison the gradient)
    soft = torch.sigmoid((torch.log(safe(sigma)) - torch.log(safe(tau.expand_as(sigma)))) / temperature)
    return torch.where(alive, soft, torch.zeros_like(soft)).sum(-1)


def _stack(per_cut, k: int) -> torch.Tensor:
    """(*batch, K_t) per cut -> (*batch, P, k), zero padded (out of place, so the graph stays)."""
    return torch.stack([nnf.pad(sigma, (0, k - sigma.shape[-1])) for sigma in per_cut], dim=-2)


def _factored_cut(op: DiagonalSSM, t: int) -> torch.Tensor:
    """sigma(H_t) (*batch, min(N, t, L - t)) of a DiagonalSSM from its two factors F, G."""
    a, b, c = op.a, op.b, op.c
    if t == 0:
        return a.new_zeros(*op.batch_shape, 0)
    # prod_{m=j+1..t-1} a_m for j < t: a reversed cumulative product of a_1..a_{t-1}, then a 1
    tail = a[..., 1:t, :].flip(-2).cumprod(-2).flip(-2)
    after = torch.cat([tail, torch.ones_like(a[..., :1, :])], dim=-2)  # (*batch, t, N)
    past = b[..., :t, :] * after  # F
    future = c[..., t:, :] * a[..., t:, :].cumprod(-2)  # G: c_i prod_{m=t..i} a_m
    return torch.linalg.svdvals(_root(future) @ _root(past).mT)


def _root(factor: torch.Tensor) -> torch.Tensor:
    """A matrix X with X^T X = factor^T factor: R of the reduced QR when the factor is tall (N
    columns), the factor itself otherwise (already no larger than N rows)."""
    rows, n = factor.shape[-2:]
    return torch.linalg.qr(factor, mode="reduced").R if rows > n else factor
