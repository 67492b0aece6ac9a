"""The Gram route to a cut's singular values: eigenvalues of its smaller Gram (H^T H or H H^T),
and the guard that sends every cut they cannot serve under a contract (core/precision.py) to
an SVD. The dense path (core/spectra.py) and the row-scaled channels (core/row_scaled.py)
take it; the compiled eigensolvers that replace torch's eigvalsh here (core/dense_kernel.py,
core/channel_kernel.py, core/cuda_eigen_kernel.py) keep GRAM_ERROR's bound."""

from __future__ import annotations

import torch

from .eigen import eigvalsh, svdvals
from .precision import EXACT, Accuracy, squares_underflow

__all__ = ["GRAM_GUARD", "GRAM_ERROR", "GRAM_NOISE", "gram_singular_values", "gram_unsafe", "gram_values"]

# The Gram route (eigvalsh of H^T H or H H^T) squares the spectrum: a singular value
# sigma_k carries an absolute error of about eps * sigma_1^2 / sigma_k. A cut whose
# smallest value (so estimated) is above GRAM_GUARD * sigma_1 therefore keeps every value
# to ~1e-10 relative (measured; 1e-6 worst case); any other cut is redone by SVD.
GRAM_GUARD = 1e-4
# Under the "ess" contract (core/precision.py) a Gram's eigenvalues are kept wherever their
# error, at most GRAM_ERROR * g * eps * sigma_1^2 for a g x g Gram, cannot move a count.
GRAM_ERROR = 4.0
# ... and where the values the eigensolver leaves within GRAM_NOISE eps sigma_1^2 of zero, the
# ones it cannot resolve, carry too little entropy to move entropy-ESS (core/precision.py
# `Accuracy.resolves_entropy`). Rounding leaves them below about 2 eps sigma_1^2 (measured on the
# wide cuts of heads with all their weight on token 0, where the true ones are near 1e-13
# sigma_1); GRAM_ERROR's bound instead would redo a third of a Mamba2 layer's channel cuts
# (layer 0 of a random Mamba2-130m at L = 256), for values the Gram does resolve.
GRAM_NOISE = 4.0


def gram_singular_values(cut: torch.Tensor, method="auto", accuracy=EXACT, allow_kernel=True) -> torch.Tensor:
    """Descending singular values of a batch of cuts (B, m, n) by the Gram route: the smaller
    Gram, then `gram_values` (with "auto", an SVD of every cut the guard does not pass).
    allow_kernel: False for a job too small for the compiled eigensolver (core/eigen.py)."""
    gram = cut.mT @ cut if cut.shape[-1] <= cut.shape[-2] else cut @ cut.mT
    return gram_values(gram, cut, method, accuracy, allow_kernel)


def gram_unsafe(sigma: torch.Tensor, rank: torch.Tensor | int, accuracy: Accuracy) -> torch.Tensor:
    """The cuts (*) whose Gram values (*, g) descending must be redone by SVD: under "exact",
    those whose smallest value within their rank is below GRAM_GUARD sigma_1 (each value
    then keeps ~1e-10 relative); under "ess", those whose eigenvalue error could move a count
    or whose unresolved values carry entropy (core/precision.py); under both, those whose
    squares underflow (`squares_underflow`)."""
    top, rank = sigma[..., 0] ** 2, torch.as_tensor(rank, device=sigma.device)  # one conversion, on sigma's device
    if accuracy.fast:
        eps = torch.finfo(sigma.dtype).eps
        return ~(
            accuracy.certain(top, GRAM_ERROR * rank * eps * top)
            & accuracy.resolves_entropy(sigma.square(), GRAM_NOISE * eps * top)
        )
    index = rank.expand(sigma.shape[:-1]) - 1
    smallest = sigma.gather(-1, index[..., None])[..., 0]
    return (smallest < GRAM_GUARD * sigma[..., 0]) | squares_underflow(top)


def gram_values(gram: torch.Tensor, cut: torch.Tensor, method: str, accuracy=EXACT, allow_kernel=True) -> torch.Tensor:
    """Descending singular values of ``cut`` (B, m, n) from its Gram (B, g, g), g = min(m, n):
    eigvalsh, then `_guarded`."""
    return _guarded(eigvalsh(gram, allow_kernel).flip(-1).clamp_min(0).sqrt(), cut, method, accuracy)


def _guarded(sigma: torch.Tensor, cut: torch.Tensor, method: str, accuracy: Accuracy) -> torch.Tensor:
    """The Gram route's values ``sigma`` (B, g) of ``cut`` (B, m, n), with ("auto") an SVD
    of every cut `gram_unsafe` names in place of its values."""
    if method == "gram":
        return sigma
    unsafe = gram_unsafe(sigma, sigma.shape[-1], accuracy)
    if bool(unsafe.any()):
        sigma[unsafe] = svdvals(cut[unsafe])
    return sigma
