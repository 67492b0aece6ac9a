"""Spectra kept as symmetric tridiagonal matrices, counted by Sturm sequences.

Causal ESS (core/causal.py) is a count only: how many eigenvalues of the reachability
Gramian P_t = R_t R_t^T lie above tau^2. The Gramian route (core/gramian_kernel.py) therefore
stops at P_t's Householder tridiagonal form T (same eigenvalues) and its largest eigenvalue,
instead of solving for every eigenvalue: the count at any tau, known only once a scope's
sigma_1 is known, is then one Sturm sequence (Sylvester's law of inertia applied to
T - x I = L D L^T):

    q_0 = d_0 - x,   q_i = d_i - x - e_{i-1}^2 / q_{i-1},   #{lambda < x} = #{i : q_i < 0}

which is backward stable for a tridiagonal matrix, so the count is exact for a matrix within
a few eps ||T|| of T. An exact spectrum sigma is the diagonal T = diag(sigma^2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import compiled
from .accelerator import accelerator_routes

__all__ = ["TridiagonalSpectra", "sturm_counts"]


@dataclass
class TridiagonalSpectra:
    """Spectra sigma_k = sqrt(lambda_k(T)) of cuts (*batch, P), each given by a symmetric
    tridiagonal T: ``diag`` (*batch, P, N), ``off`` (*batch, P, N) (off[..., k] couples k and
    k + 1; the last is unused) and ``top`` (*batch, P), its largest eigenvalue."""

    diag: torch.Tensor
    off: torch.Tensor
    top: torch.Tensor

    @classmethod
    def from_values(cls, sigma: torch.Tensor) -> "TridiagonalSpectra":
        """Exact spectra (*batch, P, K) descending, as diagonal matrices."""
        squares = sigma**2
        return cls(squares, torch.zeros_like(squares), squares[..., 0])

    @property
    def shape(self) -> torch.Size:
        return self.top.shape

    def __getitem__(self, index) -> "TridiagonalSpectra":
        return TridiagonalSpectra(self.diag[index], self.off[index], self.top[index])

    def reshape(self, *shape) -> "TridiagonalSpectra":
        n = self.diag.shape[-1]
        return TridiagonalSpectra(self.diag.reshape(*shape, n), self.off.reshape(*shape, n), self.top.reshape(*shape))

    def sigma_1(self) -> torch.Tensor:
        """(*batch, P) the largest singular value of each cut."""
        return self.top.clamp_min(0).sqrt()

    def count_above(self, tau: torch.Tensor, compiled: bool | None = None) -> torch.Tensor:
        """(*batch, P) #{k : sigma_k > tau}, tau >= 0 broadcastable to (*batch, P).
        compiled: the compiled count (`sturm_counts`) or the torch sequence below,
        its reference; default: compiled where it runs (CPU float64, numba)."""
        x = (torch.as_tensor(tau, dtype=self.diag.dtype, device=self.diag.device) ** 2).expand(self.top.shape)
        n = self.diag.shape[-1]
        if _compiled(self.diag) if compiled is None else compiled:
            flat = lambda v: v.reshape(-1, n).numpy()  # noqa: E731
            counts = sturm_counts(flat(self.diag), flat(self.off), x.reshape(-1).numpy())
            return torch.from_numpy(counts).reshape(self.top.shape)
        tiny = torch.finfo(self.diag.dtype).tiny
        below = torch.zeros(self.top.shape, dtype=torch.long, device=self.diag.device)
        q = torch.ones_like(x)
        for i in range(n):
            q = self.diag[..., i] - x - (self.off[..., i - 1] ** 2 / q if i else 0.0)
            q = torch.where(q == 0, torch.full_like(q, -tiny), q)  # a zero pivot: x is an eigenvalue
            below += q < 0
        return n - below

    def values(self) -> torch.Tensor:
        """(*batch, P, N) the singular values, descending (tests and checks: eigvalsh of T)."""
        n = self.diag.shape[-1]
        matrix = torch.diag_embed(self.diag)
        if n > 1:
            matrix = matrix + torch.diag_embed(self.off[..., :-1], 1) + torch.diag_embed(self.off[..., :-1], -1)
        return torch.linalg.eigvalsh(matrix).flip(-1).clamp_min(0).sqrt()


def _compiled(values: torch.Tensor) -> bool:
    """Whether the compiled Sturm count (`sturm_counts`) runs on these values."""
    return (
        compiled.available()
        and not accelerator_routes(values.device)
        and values.dtype == torch.float64
        and not values.requires_grad
        and values.shape[-1] > 0
    )


_TINY = float(np.finfo(np.float64).tiny)


@compiled.jit
def _sturm_counts(diag, off, x, out):  # pragma: no cover - compiled
    """out[k] = #{eigenvalues of the tridiagonal (diag[k], off[k]) above x[k]}: the Sturm
    sequence of core/sturm.py, compiled.LANES matrices side by side so that the loop vectorises."""
    batch, n = diag.shape
    q = np.empty(compiled.LANES)
    below = np.empty(compiled.LANES)
    for first in range(0, batch, compiled.LANES):
        width = min(compiled.LANES, batch - first)
        for w in range(width):
            q[w] = 1.0
            below[w] = 0.0
        for i in range(n):
            for w in range(width):
                k = first + w
                e2 = off[k, i - 1] * off[k, i - 1] if i > 0 else 0.0
                value = diag[k, i] - x[k] - e2 / q[w]
                value = -_TINY if value == 0 else value
                q[w] = value
                below[w] += value < 0
        for w in range(width):
            out[first + w] = n - int(below[w])


def sturm_counts(diag: np.ndarray, off: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The compiled `TridiagonalSpectra.count_above` (the torch sequence there is its reference): diag,
    off (B, N) and thresholds x (B,) on the eigenvalues, float64; (B,) int64 counts."""
    out = np.empty(len(x), dtype=np.int64)
    _sturm_counts(np.ascontiguousarray(diag), np.ascontiguousarray(off), np.ascontiguousarray(x), out)
    return out
