"""The ESS variants, computed from the spectra of the cuts H_t.

Conventions (docs/conventions.md):
- tolerance-ESS(t) = #{k : sigma_k(H_t) > tau}, with tau = tol * sigma_1(H_t) when
  ``relative=True`` (the default, so the count does not depend on the scale of T) and
  tau = tol otherwise. Default tol = 1e-3 (relative).
- entropy-ESS(t) = exp(H(p)), p_k = sigma_k / sum_m sigma_m (singular values, not their
  squares), 0 log 0 = 0; an all-zero cut gives 0.

Every ESS function takes *either* an operator, positionally (a dense (*batch, L, L) stack or
a factored operator such as `DiagonalSSM`), *or* singular values by keyword
(``spectra=sigma``, shape (*batch, P, K)); nothing is guessed from a shape.
"""

from __future__ import annotations

import numpy as np
import torch

from .checks import as_tensor, require
from .operators import FACTORED_OPERATORS
from .spectra import hankel_singular_values

__all__ = [
    "DEFAULT_TOL",
    "DEFAULT_RELATIVE",
    "VARIANTS",
    "check_variant",
    "tolerance_ess",
    "entropy_ess",
    "aggregate_units",
]

DEFAULT_TOL = 1e-3
DEFAULT_RELATIVE = True
VARIANTS = ("tolerance", "entropy")


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
        require(bool(torch.isfinite(tensor).all()), "singular values contain NaN or infinite values")
        require(bool((tensor >= 0).all()), "singular values must be non-negative")
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


def _check_tolerance(tol, relative) -> None:
    require(
        isinstance(tol, (int, float, np.floating, np.integer)) and not isinstance(tol, bool) and np.isfinite(tol) and tol >= 0,
        f"tol must be a finite non-negative number, got {tol!r}",
    )
    require(isinstance(relative, (bool, np.bool_)), f"relative must be True or False, got {relative!r}")


def tolerance_ess(
    op=None, tol: float = DEFAULT_TOL, relative: bool = DEFAULT_RELATIVE, *, spectra=None, **kwargs
) -> torch.Tensor:
    """tolerance-ESS: #{k : sigma_k(H_t) > tau}, shape (*batch, P), int64.

    tau = tol * sigma_1(H_t) when relative (default) else tol. A cut with sigma_1 = 0 has
    ESS 0 either way. ``kwargs`` pass to `hankel_singular_values` (positions, stride, top_k
    is refused: a count from cut spectra would be wrong) when given an operator.
    """
    _check_tolerance(tol, relative)
    require("top_k" not in kwargs, "top_k would cut the spectra before counting; tolerance_ess counts the full spectrum")
    sigma = _singular_values(op, spectra, kwargs)
    threshold = tol * sigma[..., :1] if relative else torch.full_like(sigma[..., :1], tol)
    return (sigma > threshold).sum(-1)


def entropy_ess(op=None, *, spectra=None, **kwargs) -> torch.Tensor:
    """entropy-ESS: exp(-sum p_k log p_k), p = sigma / sum(sigma); 0 for an all-zero cut.
    Input as for `tolerance_ess`."""
    require("top_k" not in kwargs, "top_k would cut the spectra; entropy_ess needs the full spectrum")
    sigma = _singular_values(op, spectra, kwargs)
    total = sigma.sum(-1, keepdim=True)
    p = sigma / torch.where(total > 0, total, torch.ones_like(total))
    plogp = torch.where(p > 0, p * torch.log(torch.where(p > 0, p, torch.ones_like(p))), torch.zeros_like(p))
    return torch.where(total[..., 0] > 0, torch.exp(-plogp.sum(-1)), torch.zeros_like(total[..., 0]))


def aggregate_units(ess: torch.Tensor, how: str = "mean", unit_dim: int = -2) -> torch.Tensor:
    """Combine ESS over units (heads or channels): "mean" (average ESS), "sum" (total ESS,
    comparable with total TSS), "max" or "min". ess has shape (..., U, L) by default."""
    ess = as_tensor(ess, "ess").to(torch.float64)
    reducers = {"mean": torch.mean, "sum": torch.sum, "max": lambda x, dim: x.max(dim).values,
                "min": lambda x, dim: x.min(dim).values}
    require(how in reducers, f"how must be one of {sorted(reducers)}, got {how!r}")
    return reducers[how](ess, dim=unit_dim)
