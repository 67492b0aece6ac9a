"""The ESS variants, computed from the spectra of the cuts H_t.

Conventions (docs/conventions.md):
- tolerance-ESS(t) = #{k : sigma_k(H_t) > tau}, with tau = tol * sigma_1(H_t) when
  ``relative=True`` (the default, so the count does not depend on the scale of T) and
  tau = tol otherwise. Default tol = 1e-3 (relative).
- The scope of a relative tolerance: which sigma_1 the threshold refers to.
    "cut"    tau = tol * sigma_1(H_t): each cut on its own scale (blind to a uniform
             scaling of a cut, so a near-reset such as a decay of 1e-4 at one step leaves
             the count unchanged there);
    "unit"   tau = tol * max_t sigma_1(H_t) over the cuts given of the unit: reset-aware;
    "layer"  tau = tol * the largest sigma_1 over all cuts of all units given (the layer
             read as one block-diagonal operator: the layer's total is then the block
             operator's tolerance-ESS).
  With ``relative=False`` the threshold is absolute and a scope other than "cut" is refused.
  "unit" and "layer" take the maximum over the cuts *given*: with a stride or a subset of
  positions it is over those (exact when every cut is computed).
- entropy-ESS(t) = exp(H(p)), p_k = sigma_k / sum_m sigma_m (singular values, not their
  squares), 0 log 0 = 0; an all-zero cut gives 0. It has no scope: p is normalised per cut,
  so any scaling of a cut cancels, and a scale-aware version would have to decide how much
  weight the missing mass gets, which is what the tolerance scope decides explicitly.

Every ESS function takes *either* an operator, positionally (a dense (*batch, L, L) stack or
a factored operator such as `DiagonalSSM`), *or* singular values by keyword
(``spectra=sigma``, shape (*batch, P, K)); nothing is guessed from a shape.
"""

from __future__ import annotations

import numpy as np
import torch

from ..options import DEFAULT_SCOPE, SCOPES, VARIANTS
from .accelerator import accelerator_routes
from .causal import reachability_singular_values
from .checks import as_tensor, require
from .gramian import gramian_hankel_singular_values
from .operators import FACTORED_OPERATORS, DiagonalSSM
from .precision import DEFAULT_PRECISION, Accuracy, check_precision
from .spectra import cut_positions, hankel_singular_values
from .sturm import TridiagonalSpectra

__all__ = [
    "DEFAULT_TOL",
    "DEFAULT_RELATIVE",
    "DEFAULT_SCOPE",
    "MODULATION_SCOPE",
    "SCOPES",
    "VARIANTS",
    "check_scope",
    "check_tolerance",
    "tolerance_reference",
    "check_variant",
    "tolerance_ess",
    "entropy_ess",
    "causal_ess",
    "count_above_tolerance",
    "entropy_of",
    "aggregate_units",
]

DEFAULT_TOL = 1e-3
DEFAULT_RELATIVE = True
MODULATION_SCOPE = "unit"  # modulation at separators: reset-aware (docs/conventions.md)


def check_variant(variant: str) -> str:
    """The one place that accepts an ESS variant name; anything else is a ValueError."""
    require(variant in VARIANTS, f"variant must be one of {', '.join(map(repr, VARIANTS))}; got {variant!r}")
    return variant


def _singular_values(op, spectra, kwargs: dict) -> torch.Tensor:
    """The spectra to count: computed from the operator ``op``, or ``spectra`` as given."""
    if (op is None) == (spectra is None):
        raise ValueError(
            "pass an operator positionally (tolerance_ess(T) or tolerance_ess(ssm)) or singular values "
            "by keyword (tolerance_ess(spectra=sigma)), exactly one of the two"
        )
    if spectra is not None:
        require(not kwargs, f"{sorted(kwargs)} only apply to an operator, not to given spectra=")
        tensor = as_tensor(spectra, "spectra")
        require(tensor.is_floating_point(), f"singular values must be floating point, got {tensor.dtype}")
        require(tensor.ndim >= 2, f"spectra must have shape (*batch, P, K), got {tuple(tensor.shape)}")
        # One pass over the values: descending (NaN fails it), with a finite first and a
        # non-negative last column, is all three checks; the slower ones only name a failure.
        if tensor.numel() and bool(
            (tensor[..., 1:] <= tensor[..., :-1]).all()
            and torch.isfinite(tensor[..., 0]).all()
            and (tensor[..., -1] >= 0).all()
        ):
            return tensor
        require(bool(torch.isfinite(tensor).all()), "singular values contain NaN or infinite values")
        require(bool((tensor >= 0).all()), "singular values must be non-negative")
        require(
            bool((tensor[..., 1:] <= tensor[..., :-1]).all()),
            "singular values must be in descending order along the last axis (as svdvals gives them); "
            "sort them with torch.sort(sigma, descending=True)",
        )
        return tensor
    if isinstance(op, FACTORED_OPERATORS):
        return hankel_singular_values(op, **kwargs)
    tensor = as_tensor(op, "operator")
    require(
        tensor.ndim >= 2 and tensor.shape[-1] == tensor.shape[-2],
        f"an operator must have shape (*batch, L, L), got {tuple(tensor.shape)}; "
        "to count singular values you already have, pass them as spectra=",
    )
    return hankel_singular_values(tensor, **kwargs)


def check_tolerance(tol, relative) -> None:
    """The one check of a tolerance: a finite number >= 0 and, relative to sigma_1, below 1
    (tau = tol * sigma_1 >= sigma_1 would make every ESS 0)."""
    require(
        isinstance(tol, (int, float, np.floating, np.integer))
        and not isinstance(tol, bool)
        and np.isfinite(tol)
        and tol >= 0,
        f"tol must be a finite number >= 0 (e.g. 1e-3), got {tol!r}",
    )
    require(isinstance(relative, (bool, np.bool_)), f"relative must be True or False, got {relative!r}")
    require(
        not relative or tol < 1,
        f"a relative tol is a fraction of sigma_1 and must be below 1 (got {tol!r}: every ESS would be 0); "
        "give e.g. 1e-3, or an absolute threshold with relative=False (--absolute)",
    )


def _check_reference(reference) -> None:
    values = as_tensor(torch.as_tensor(reference) if isinstance(reference, (int, float)) else reference, "reference")
    require(
        not values.is_complex() and bool(torch.isfinite(values).all()) and bool((values >= 0).all()),
        f"reference is a sigma_1: finite and >= 0, got {reference!r:.60}",
    )


def check_scope(scope: str, relative: bool = True) -> str:
    """The one place that accepts a tolerance scope; a non-"cut" scope needs relative=True."""
    require(scope in SCOPES, f"scope must be one of {', '.join(map(repr, SCOPES))}; got {scope!r}")
    require(
        relative or scope == "cut",
        f"scope={scope!r} chooses which sigma_1 a relative tolerance refers to; with relative=False the "
        "tolerance is absolute and has no scope: leave scope='cut' or pass relative=True",
    )
    return scope


def tolerance_reference(sigma, scope: str):
    """sigma_1 that a relative tolerance refers to, broadcastable against ``sigma``
    (*batch, P, K) (torch or numpy, or a `TridiagonalSpectra` (*batch, P)): per cut, per unit
    (max over P) or over everything."""
    first = sigma.sigma_1()[..., None] if isinstance(sigma, TridiagonalSpectra) else sigma[..., :1]  # (*batch, P, 1)
    empty = (first.size if isinstance(first, np.ndarray) else first.numel()) == 0
    if scope == "cut" or empty:
        return first
    if scope == "unit":
        return first.max(-2, keepdims=True) if isinstance(first, np.ndarray) else first.amax(-2, keepdim=True)
    return first.max()  # "layer": one reference for all units given


def tolerance_ess(
    op=None,
    tol: float = DEFAULT_TOL,
    relative: bool = DEFAULT_RELATIVE,
    *,
    spectra=None,
    scope: str = DEFAULT_SCOPE,
    reference=None,
    **kwargs,
) -> torch.Tensor:
    """tolerance-ESS: #{k : sigma_k(H_t) > tau}, shape (*batch, P), int64.

    tau = tol * sigma_1 when relative (default) else tol, where sigma_1 is that of the cut,
    the largest over the unit's cuts or over all cuts of all units given (``scope``, see the
    module docstring). ``reference``: a sigma_1 given explicitly (a number or a tensor
    broadcastable to (*batch, P, 1)), e.g. the maximum over a layer computed in chunks; it
    replaces the scope's. A cut with sigma_1 = 0 has ESS 0 either way. ``kwargs`` pass to
    `hankel_singular_values` (positions, stride; top_k is refused: a count from cut spectra
    would be wrong) when given an operator.
    """
    check_tolerance(tol, relative)
    check_scope(scope, relative)
    if reference is not None:
        _check_reference(reference)
    require(
        "top_k" not in kwargs, "top_k would cut the spectra before counting; tolerance_ess counts the full spectrum"
    )
    if op is not None and isinstance(kwargs.get("precision"), str):  # the guards must know this tau
        kwargs["precision"] = _accuracy(check_precision(kwargs["precision"]), tol, relative, scope, reference)
    checked = (
        spectra if isinstance(spectra, TridiagonalSpectra) and op is None else _singular_values(op, spectra, kwargs)
    )
    return count_above_tolerance(checked, tol, relative, scope, reference)


def _accuracy(precision: str, tol: float, relative: bool, scope: str, reference) -> Accuracy:
    """The contract with the tolerance the count will use, so that a fast route's guard
    (core/precision.py) checks the smallest tau it can meet: an explicit ``reference`` may lie
    below a cut's own sigma_1, so its smallest tau is taken as an absolute one."""
    if reference is not None and relative:
        return Accuracy(precision, tol * float(torch.as_tensor(reference).min()), False)
    return Accuracy(precision, tol, relative, scope)


def count_above_tolerance(sigma, tol: float, relative: bool, scope: str, reference=None) -> torch.Tensor:
    """The count of `tolerance_ess` on spectra already known to be valid (the engine's own:
    no checks). sigma: (*batch, P, K) descending, or a `TridiagonalSpectra` (Sturm counts)."""
    if isinstance(sigma, TridiagonalSpectra):
        if not relative:
            return sigma.count_above(torch.as_tensor(float(tol)))
        ref = tolerance_reference(sigma, scope) if reference is None else torch.as_tensor(reference)
        ref = ref.to(sigma.top.dtype)
        return sigma.count_above(tol * (ref[..., 0] if ref.ndim else ref))  # (*batch, P, 1) -> (*batch, P)
    if sigma.shape[-1] == 0:
        return torch.zeros(sigma.shape[:-1], dtype=torch.long, device=sigma.device)
    if relative:
        ref = tolerance_reference(sigma, scope) if reference is None else torch.as_tensor(reference, dtype=sigma.dtype)
        threshold = tol * ref.to(sigma.device)
    else:
        threshold = torch.as_tensor(float(tol), dtype=sigma.dtype, device=sigma.device)
    threshold = threshold.expand(*sigma.shape[:-1], 1)
    return _by_row_blocks(lambda block, above: (block > above).sum(-1), sigma, threshold)


def causal_ess(
    op=None,
    tol: float = DEFAULT_TOL,
    relative: bool = DEFAULT_RELATIVE,
    *,
    spectra=None,
    scope: str = DEFAULT_SCOPE,
    reference=None,
    positions=None,
    stride: int | None = None,
    precision: str = DEFAULT_PRECISION,
) -> torch.Tensor:
    """causal ESS: the tolerance-rank of the reachability factor R_t of each cut (core/causal.py:
    how many state directions the past u_0..u_{t-1} has written), shape (*batch, P), int64.

    Same tolerance rules as `tolerance_ess` (tol, relative, scope, reference). Input: a
    factored operator (`DiagonalSSM` or `DPLRSSM`: causal ESS is a property of the realisation
    the model computes with, so it needs one), or the reachability spectra by keyword
    (``spectra=`` sigma(R_t), (*batch, P, K) descending, or a `TridiagonalSpectra`). A dense
    operator has no realisation: ValueError. positions / stride: the cuts (default every t).
    precision: "ess" (Sturm counts on the Gramian's tridiagonal form, core/sturm.py) or
    "exact" (the square-root sweep); the counts agree but within 1e-6 of tau.
    """
    if spectra is None:
        require(
            isinstance(op, FACTORED_OPERATORS),
            "causal ESS needs a realisation (a DiagonalSSM or DPLRSSM): a dense operator T fixes the "
            f"ESS of its cuts but not which state coordinates wrote them; got {type(op).__name__}. "
            "Pass sigma(R_t) as spectra= if you have them",
        )
        check_precision(precision)
        check_tolerance(tol, relative)
        cuts = cut_positions(op.length, positions, stride)
        if precision == "ess" and isinstance(op, DiagonalSSM):
            accuracy = _accuracy(precision, tol, relative, scope, reference)
            _, spectra = gramian_hankel_singular_values(op, positions=cuts, accuracy=accuracy, causal=True)
        else:
            spectra = reachability_singular_values(op, cuts)
    else:
        require(op is None, "pass an operator positionally or spectra= by keyword, not both")
    return tolerance_ess(spectra=spectra, tol=tol, relative=relative, scope=scope, reference=reference)


def entropy_ess(op=None, *, spectra=None, **kwargs) -> torch.Tensor:
    """entropy-ESS: exp(-sum p_k log p_k), p = sigma / sum(sigma); 0 for an all-zero cut.
    Input as for `tolerance_ess`."""
    require("top_k" not in kwargs, "top_k would cut the spectra; entropy_ess needs the full spectrum")
    return entropy_of(_singular_values(op, spectra, kwargs))


# On a CPU a layer's (U, P, K) spectra (100s of MB) are counted and their entropy taken in
# blocks of about this many values (`_by_row_blocks`): a temporary as large as the whole
# array costs more in page faults than the arithmetic (a Mamba2 layer's entropy: 1.2 s -> 0.3 s).
BLOCK_VALUES = 1 << 20


def _by_row_blocks(compute, sigma: torch.Tensor, *per_row: torch.Tensor) -> torch.Tensor:
    """compute(rows, *their per_row entries) -> one value per row, for the rows of sigma
    (*batch, K), with per_row arrays (*batch, 1): in blocks of rows on a CPU, in one call on
    a GPU (where launches cost, not page faults). Returns (*batch,)."""
    width = sigma.shape[-1]
    rows = sigma.reshape(-1, width) if width else sigma.new_zeros(sigma.shape[:-1].numel(), 1)
    extra = [x.reshape(-1, 1) for x in per_row]
    step = max(1, len(rows)) if accelerator_routes(sigma.device) else max(1, BLOCK_VALUES // max(1, width))
    if step >= len(rows):
        return compute(rows, *extra).reshape(sigma.shape[:-1])
    out = torch.cat([compute(rows[i : i + step], *(x[i : i + step] for x in extra)) for i in range(0, len(rows), step)])
    return out.reshape(sigma.shape[:-1])


def _entropy_rows(rows: torch.Tensor) -> torch.Tensor:
    """exp(-sum p log p) = exp(log S - sum(x log x) / S), x = sigma / max(sigma), S = sum(x): no
    array p; xlogy's 0 log 0 = 0; 0 for an all-zero row. Entropy does not see the scale, and
    dividing by the largest value keeps sigma log sigma and the sum finite for values up to the
    float64 maximum."""
    largest = rows.amax(-1, keepdim=True)
    rows = rows / torch.where(largest > 0, largest, 1.0)
    total = rows.sum(-1)
    safe = torch.where(total > 0, total, 1.0)
    return torch.where(total > 0, torch.exp(torch.log(safe) - torch.special.xlogy(rows, rows).sum(-1) / safe), 0.0)


def entropy_of(sigma: torch.Tensor) -> torch.Tensor:
    """The value of `entropy_ess` on spectra (*batch, P, K) already known to be valid (the
    engine's own: no checks)."""
    if not sigma.requires_grad:
        return _by_row_blocks(_entropy_rows, sigma)
    largest = sigma.detach().amax(-1, keepdim=True)  # a constant scale: p and its gradient do not change
    sigma = sigma / torch.where(largest > 0, largest, torch.ones_like(largest))
    total = sigma.sum(-1, keepdim=True)
    p = sigma / torch.where(total > 0, total, torch.ones_like(total))
    # 0 log 0 = 0, written so that the gradient is finite at p = 0 too (core/differentiable.py)
    plogp = torch.where(p > 0, p * torch.log(torch.where(p > 0, p, torch.ones_like(p))), torch.zeros_like(p))
    return torch.where(total[..., 0] > 0, torch.exp(-plogp.sum(-1)), torch.zeros_like(total[..., 0]))


def aggregate_units(ess: torch.Tensor, how: str = "mean", unit_dim: int = -2) -> torch.Tensor:
    """Combine ESS over units (heads or channels): "mean" (average ESS), "sum" (total ESS,
    comparable with total TSS), "max" or "min". ess has shape (..., U, L) by default."""
    ess = as_tensor(ess, "ess").to(torch.float64)
    reducers = {
        "mean": torch.mean,
        "sum": torch.sum,
        "max": lambda x, dim: x.max(dim).values,
        "min": lambda x, dim: x.min(dim).values,
    }
    require(how in reducers, f"how must be one of {sorted(reducers)}, got {how!r}")
    return reducers[how](ess, dim=unit_dim)
