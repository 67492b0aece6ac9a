"""Spectra of the cuts H_t = T[t:, :t] and the two ESS variants built on them.

Conventions (ESS.md section 2; also in the README):
- 0-based time. H_t = T[t:, :t] maps the past inputs u_0..u_{t-1} to the present and
  future outputs y_t..y_{L-1}; the diagonal (direct feed-through) is excluded.
  Row t = 0 has no past: its singular values and both ESS are 0.
- tolerance-ESS(t) = #{k : sigma_k(H_t) > tau}, with tau = tol * sigma_1(H_t) when
  ``relative=True`` (the default, so the count does not depend on the scale of T) and
  tau = tol otherwise. Default tol = 1e-3 (relative).
- entropy-ESS(t) = exp(H(p)), p_k = sigma_k / sum_m sigma_m (singular values, not their
  squares), 0 log 0 = 0; an all-zero cut gives 0.

No torch.nn and no UI here: tensors in, tensors out.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

import numpy as np
import torch
from tqdm.auto import tqdm

from ._checks import as_tensor, require
from .realizations import DiagonalSSM, single_threaded_torch, factored_hankel_singular_values

__all__ = [
    "DEFAULT_TOL",
    "DEFAULT_RELATIVE",
    "hankel_singular_values",
    "tolerance_ess",
    "entropy_ess",
    "aggregate_units",
    "validate_operator",
]

DEFAULT_TOL = 1e-3
DEFAULT_RELATIVE = True

# The Gram route (eigvalsh of H^T H or H H^T) squares the spectrum: a singular value
# sigma_k carries an absolute error of about eps * sigma_1^2 / sigma_k. A cut whose
# smallest value (so estimated) is above GRAM_GUARD * sigma_1 therefore keeps every value
# to ~1e-10 relative (measured; 1e-6 worst case); any other cut is redone by SVD.
GRAM_GUARD = 1e-4


def validate_operator(op, name: str = "op") -> torch.Tensor:
    """Check a dense operator of shape (*batch, L, L): square, finite, lower triangular."""
    tensor = as_tensor(op, name)
    require(
        tensor.ndim >= 2,
        f"{name} must have shape (*batch, L, L); got a tensor with {tensor.ndim} dimension(s)",
    )
    require(
        tensor.shape[-1] == tensor.shape[-2],
        f"{name} must be square in its last two dimensions (L x L); got shape {tuple(tensor.shape)}",
    )
    require(tensor.is_floating_point(), f"{name} must be a floating-point tensor, got {tensor.dtype}")
    require(bool(torch.isfinite(tensor).all()), f"{name} contains NaN or infinite values")
    above = torch.triu(tensor, diagonal=1)
    if bool((above != 0).any()):
        worst = above.abs().flatten(-2).max(-1).values.max().item()
        where = torch.nonzero(above)[0].tolist()
        raise ValueError(
            f"{name} is not lower triangular (causal): entry {tuple(where)} above the diagonal is "
            f"{above[tuple(where)].item():.3g} (largest above-diagonal magnitude {worst:.3g}). "
            "ESS is defined for causal operators y_i = sum_{j<=i} T[i, j] u_j; pass T, not T^T."
        )
    return tensor


def _positions(length: int, positions, stride: int | None) -> torch.Tensor:
    if positions is not None:
        require(stride is None, "give either positions or stride, not both")
        pos = torch.as_tensor(positions, dtype=torch.long).flatten()
        require(
            bool(((pos >= 0) & (pos < length)).all()),
            f"positions must lie in [0, {length - 1}]; got min {pos.min().item()}, max {pos.max().item()}",
        )
        return pos
    stride = 1 if stride is None else int(stride)
    require(stride >= 1, f"stride must be a positive integer, got {stride}")
    return torch.arange(0, length, stride)


def hankel_singular_values(
    op,
    *,
    top_k: int | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    positions: Iterable[int] | None = None,
    stride: int | None = None,
    method: str = "auto",
    progress: bool = False,
) -> torch.Tensor:
    """Singular values of every cut H_t = T[t:, :t].

    Parameters
    ----------
    op : array (*batch, L, L) lower triangular, or a DiagonalSSM.
    top_k : keep the K largest values per cut (default: all, K = L // 2 dense, N factored).
    dtype : computation and output dtype (float64 by default; float32 is ~1e-6 relative).
    device : torch device to compute on (default: the operator's own).
    positions / stride : compute only these cuts t (output rows follow ``positions``);
        default every t in 0..L-1. A stride is a quick preview.
    method : dense path only. "auto" (Gram + eigvalsh with an SVD redo of ill-conditioned
        cuts; as accurate as "svd" and ~2x faster), "svd" (one svdvals per cut) or "gram"
        (no redo: fast, loses values below ~1e-8 * sigma_1).

    Returns
    -------
    tensor (*batch, P, K), descending and zero-padded; P = L unless positions/stride given.
    """
    if isinstance(op, DiagonalSSM):
        pos = _positions(op.length, positions, stride)
        return factored_hankel_singular_values(op, positions=pos, top_k=top_k, dtype=dtype, device=device)
    require(method in ("auto", "svd", "gram"), f"method must be 'auto', 'svd' or 'gram', got {method!r}")
    dense = validate_operator(op)
    length = dense.shape[-1]
    pos = _positions(length, positions, stride)
    dense = dense.to(device=device if device is not None else dense.device, dtype=dtype)
    batch_shape = dense.shape[:-2]
    flat = dense.reshape(-1, length, length)
    max_rank = length // 2
    k_out = max_rank if top_k is None else min(int(top_k), max_rank)
    out = torch.zeros(flat.shape[0], len(pos), k_out, dtype=dtype, device=dense.device)
    bar = tqdm(total=len(pos), disable=not progress, desc="cuts", leave=False)

    def fill(rows: list[int]) -> None:
        with single_threaded_torch():
            fill_rows(rows)

    def fill_rows(rows: list[int]) -> None:
        for row in rows:
            t = int(pos[row])
            if t > 0:
                sigma = _cut_singular_values(flat[:, t:, :t], method)
                width = min(k_out, sigma.shape[-1])
                out[:, row, :width] = sigma[:, :width]
            bar.update()

    # Cuts are independent LAPACK calls of different shapes that torch cannot batch, and
    # one call barely uses a second core; on CPU, interleaved halves run in two threads.
    workers = torch.get_num_threads() if dense.device.type == "cpu" else 1
    rows = list(range(len(pos)))
    if workers > 1 and len(rows) > 1:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(fill, [rows[i::workers] for i in range(workers)]))
    else:
        fill_rows(rows)
    bar.close()
    return out.reshape(*batch_shape, len(pos), k_out)


def _cut_singular_values(cut: torch.Tensor, method: str) -> torch.Tensor:
    """Descending singular values of a batch of cuts (B, m, n)."""
    if method == "svd":
        return torch.linalg.svdvals(cut)
    rows, cols = cut.shape[-2:]
    gram = cut.mT @ cut if cols <= rows else cut @ cut.mT
    sigma = torch.linalg.eigvalsh(gram).flip(-1).clamp_min(0).sqrt()
    if method == "gram":
        return sigma
    unsafe = sigma[:, -1] < GRAM_GUARD * sigma[:, 0]
    if bool(unsafe.any()):
        sigma[unsafe] = torch.linalg.svdvals(cut[unsafe])
    return sigma


def _spectra(op_or_singular_values, spectra: bool | None, **kwargs) -> torch.Tensor:
    """Singular values as given, or computed from an operator.

    ``spectra=None`` infers: a DiagonalSSM or a square trailing block (L x L) is an
    operator, anything else singular values (*batch, P, K). Strided spectra can be square
    (P == K), so callers holding spectra pass ``spectra=True``.
    """
    if isinstance(op_or_singular_values, DiagonalSSM):
        require(spectra is not True, "spectra=True, but a DiagonalSSM is an operator")
        return hankel_singular_values(op_or_singular_values, **kwargs)
    tensor = as_tensor(op_or_singular_values, "op_or_singular_values")
    is_operator = tensor.ndim >= 2 and tensor.shape[-1] == tensor.shape[-2] if spectra is None else not spectra
    if is_operator:
        return hankel_singular_values(tensor, **kwargs)
    require(tensor.is_floating_point(), f"singular values must be floating point, got {tensor.dtype}")
    require(tensor.ndim >= 2, f"singular values must have shape (*batch, P, K), got {tuple(tensor.shape)}")
    require(bool(torch.isfinite(tensor).all()), "singular values contain NaN or infinite values")
    require(bool((tensor >= 0).all()), "singular values must be non-negative")
    return tensor


def tolerance_ess(
    op_or_singular_values,
    tol: float = DEFAULT_TOL,
    relative: bool = DEFAULT_RELATIVE,
    *,
    spectra: bool | None = None,
    **kwargs,
) -> torch.Tensor:
    """tolerance-ESS: #{k : sigma_k(H_t) > tau}, shape (*batch, L), int64.

    tau = tol * sigma_1(H_t) when relative (default) else tol. A cut with sigma_1 = 0 has
    ESS 0 either way. Input: an operator, a DiagonalSSM or singular values (see
    ``spectra``); ``kwargs`` pass to `hankel_singular_values` when given an operator.
    """
    require(np.isfinite(tol) and tol >= 0, f"tol must be a finite non-negative number, got {tol}")
    sigma = _spectra(op_or_singular_values, spectra, **kwargs)
    threshold = tol * sigma[..., :1] if relative else torch.full_like(sigma[..., :1], tol)
    return (sigma > threshold).sum(-1)


def entropy_ess(op_or_singular_values, *, spectra: bool | None = None, **kwargs) -> torch.Tensor:
    """entropy-ESS: exp(-sum p_k log p_k), p = sigma / sum(sigma); 0 for an all-zero cut.
    Input as for `tolerance_ess`."""
    sigma = _spectra(op_or_singular_values, spectra, **kwargs)
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
