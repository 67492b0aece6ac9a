"""The gated short convolution (LFM2 conv layers, Hyena of order 2) as an operator.

Per channel, with B = gate_in (L,), C = gate_out (L,) and a depthwise kernel w (k,) in
torch's Conv1d layout (w[k-1] multiplies the current token):

    T[i, j] = C_i w[k-1-(i-j)] B_j      for 0 <= i - j < k, 0 otherwise.

Spectra: T_c is a banded (shift-register) operator, not a diagonal SSM, so the factored
DiagonalSSM path does not apply. But every cut H_t = T[t:, :t] is zero outside rows
t..t+k-2 and columns t-k+1..t-1, so its non-zero singular values are exactly those of the
(k-1) x (k-1) block

    M_t[r, s] = C_{t+r} w[s - r] B_{t-k+1+s}     (s >= r; 0 for s < r or out of range)

(rows past L - 1 and columns before 0 are zero). We take them with one batched SVD of
all (channel, t) blocks: O(L k^3) per channel, exact, no L x L matrix. Dense T is
materialised only for the channels kept for the operator view and for the tests, which
check these spectra against the dense core (hankel_singular_values(T, method="svd")).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .eigen import svdvals

__all__ = ["short_conv_operator", "short_conv_hankel_singular_values"]


def short_conv_operator(gate_in: torch.Tensor, gate_out: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Dense T (U, L, L) float64 from B = gate_in (U, L), C = gate_out (U, L), w (U, k)."""
    gate_in, gate_out, weight = (x.to(torch.float64) for x in (gate_in, gate_out, weight))
    units, length = gate_in.shape
    k = weight.shape[-1]
    op = torch.zeros(units, length, length, dtype=torch.float64, device=gate_in.device)
    for lag in range(min(k, length)):
        # entries (i, i - lag), i = lag..L-1
        band = gate_out[:, lag:] * weight[:, k - 1 - lag, None] * gate_in[:, : length - lag]
        op = op + torch.diag_embed(band, offset=-lag)
    return op


def short_conv_hankel_singular_values(
    gate_in: torch.Tensor,
    gate_out: torch.Tensor,
    weight: torch.Tensor,
    positions,
    *,
    device=None,
    dtype=torch.float64,
) -> torch.Tensor:
    """Singular values of every cut H_t of each channel's T: (U, P, max(k - 1, 1)), descending.

    Exact: the non-zero block of H_t is (k-1) x (k-1) (module docstring).
    """
    device = torch.device(device) if device is not None else gate_in.device
    gate_in, gate_out, weight = (x.to(device=device, dtype=dtype) for x in (gate_in, gate_out, weight))
    units, length = gate_in.shape
    k = weight.shape[-1]
    pos = torch.as_tensor(np.asarray(positions), dtype=torch.long, device=device)
    m = k - 1
    if m == 0:  # kernel of length 1: T is diagonal, every cut is zero
        return torch.zeros(units, len(pos), 1, dtype=dtype, device=device)
    # Pad so that row t + r and column t - m + s index directly: C past the end and B
    # before the start are zero.
    c_pad = F.pad(gate_out, (0, m))  # c_pad[:, i] = C_i
    b_pad = F.pad(gate_in, (m, 0))  # b_pad[:, t + s] = B_{t - m + s}
    offsets = torch.arange(m, device=device)
    rows = c_pad[:, pos[:, None] + offsets]  # (U, P, m): C_{t + r}
    cols = b_pad[:, pos[:, None] + offsets]  # (U, P, m): B_{t - m + s}
    r, s = offsets[:, None], offsets[None, :]
    taps = weight[:, (s - r).clamp(min=0)] * (s >= r)  # (U, m, m): w[s - r] on and above the diagonal
    blocks = rows[..., :, None] * taps[:, None] * cols[..., None, :]  # (U, P, m, m)
    sigma = svdvals(blocks)  # tiny (k-1) x (k-1) blocks, one batched call
    return torch.where(pos[None, :, None] == 0, torch.zeros_like(sigma), sigma)
