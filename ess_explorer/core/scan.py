"""Hankel singular values of a DiagonalSSM by a blocked scan of the square-root factors.

The sequential sweeps (core/sweeps.py) take one step per time step: L small batched ops,
which on a GPU means thousands of tiny kernel launches per layer. The scan computes the
same triangular square roots with about 2 sqrt(L) batched calls:

Each sweep has the form X_s^T X_s = P_s with P_s = D_s P_{s-1} D_s + v_s v_s^T (D_s =
diag(scale_s)), i.e. X_s = R-factor of [X_{s-1} D_s; v_s^T]. Over a segment of steps the
map P -> D P D + Q is affine, with D the product of the segment's scales and Q = S^T S the
segment's own Gramian started from zero. So, with blocks of ``block`` steps:

1. inside every block, the local roots S_k (started from zero) and the running decay
   products D_k, all blocks at once: ``block`` batched QRs of (N+1) x N;
2. the roots at the block boundaries, carried from block to block: one QR of the stacked
   [X D; S] (2N x N) per block;
3. the root at any wanted step: one batched QR of [X_boundary D_k; S_k] (2N x N).

Only QRs of stacked triangular factors are formed: no Gramian (which would lose every
singular value below sqrt(eps) sigma_1). The decay products D_k span at most one block;
one that underflows drops a contribution below 1e-300 of the state it multiplies, as the
sequential sweep's repeated scaling does. Cut t's values are those of
U_o(t) U_c(t)^T as in core/sweeps.py. Written in torch ops: it runs on CPU (the reference
the tests check) and on any device.
"""

from __future__ import annotations

import math

import torch

__all__ = ["scan_chunk", "scan_roots"]


def _qr_r(stacked: torch.Tensor) -> torch.Tensor:
    """R factor (*, N, N) of a batch of (*, m, N) matrices, m >= N."""
    return torch.linalg.qr(stacked, mode="r").R


def scan_roots(
    scales: torch.Tensor, vectors: torch.Tensor, steps: torch.Tensor, block: int | None = None
) -> torch.Tensor:
    """Roots X_s (upper triangular, rows of any sign) of X_s^T X_s = D_s X_{s-1}^T X_{s-1} D_s + v_s v_s^T.

    scales, vectors: (S, M, N) (D_s = diag(scales[s]), v_s = vectors[s]), X_{-1} = 0.
    steps: (W,) long, the step indices s wanted, or (W, M) for a different step per column m.
    Returns (W, M, N, N).
    """
    length, m, n = scales.shape
    block = max(1, int(math.ceil(math.sqrt(length)))) if block is None else int(block)
    blocks = -(-length // block)
    pad = blocks * block - length
    if pad:  # identity steps (scale 1, vector 0) fill the last block
        scales = torch.cat([scales, scales.new_ones(pad, m, n)])
        vectors = torch.cat([vectors, vectors.new_zeros(pad, m, n)])
    sc = scales.reshape(blocks, block, m, n)
    vc = vectors.reshape(blocks, block, m, n)

    # 1. local roots and decay products inside every block, all blocks at once
    local = scales.new_empty(blocks, block, m, n, n)
    decay = scales.new_empty(blocks, block, m, n)
    state = scales.new_zeros(blocks, m, n, n)
    running = scales.new_ones(blocks, m, n)
    for k in range(block):
        state = _qr_r(torch.cat([state * sc[:, k, :, None, :], vc[:, k, :, None, :]], dim=-2))
        local[:, k] = state
        running = running * sc[:, k]
        decay[:, k] = running

    # 2. roots at the block boundaries: carry[j] = X at the last step before block j
    carry = scales.new_zeros(blocks, m, n, n)
    for j in range(1, blocks):
        carry[j] = _qr_r(torch.cat([carry[j - 1] * decay[j - 1, -1, :, None, :], local[j - 1, -1]], dim=-2))

    # 3. the wanted steps: combine their block's boundary root with the local root
    steps = steps.to(torch.long)
    if steps.ndim == 1:
        steps = steps[:, None].expand(-1, m)
    column = torch.arange(m, device=steps.device).expand_as(steps)
    j, k = steps // block, steps % block
    base = carry[j, column] * decay[j, k, column][..., None, :]
    return _qr_r(torch.cat([base, local[j, k, column]], dim=-2))


def scan_chunk(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    wanted: torch.Tensor,
    block: int | None = None,
    causal: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The scan counterpart of core/sweeps.py ``_sweep_chunk``: a, b, c (B, L, N); wanted:
    sorted cut positions t in [1, L - 1]. Returns (B, len(wanted), N), descending; with
    ``causal`` also sigma(U_c(t)) = sigma(R_t), the reachability spectrum causal ESS counts
    (core/causal.py), read off the same forward roots.

    Forward  U_c(t) = root after step t - 1 of (scale a_s, vector b_s);
    backward W_t    = root after step L - 1 - t of the time-reversed (scale a_{s+1}, vector c_s);
    sigma(H_t) = sigma((W_t diag(a_t)) U_c(t)^T). Both halves are one stacked scan.
    """
    units, length, _ = a.shape
    shifted = torch.cat([a[:, 1:], torch.zeros_like(a[:, :1])], 1)
    scales = torch.cat([a, shifted.flip(1)]).transpose(0, 1)  # (L, 2B, N)
    vectors = torch.cat([b, c.flip(1)]).transpose(0, 1)
    wanted = wanted.to(device=a.device, dtype=torch.long)
    forward, backward = (wanted - 1)[:, None], (length - 1 - wanted)[:, None]
    steps = torch.cat([forward.expand(-1, units), backward.expand(-1, units)], 1)
    roots = scan_roots(scales, vectors, steps, block)  # (W, 2B, N, N)
    reach, observe = roots[:, :units], roots[:, units:]
    observe = observe * a[:, wanted].transpose(0, 1)[:, :, None, :]  # U_o(t) = W_t diag(a_t)
    sigma = torch.linalg.svdvals(observe @ reach.transpose(-1, -2)).transpose(0, 1)  # (B, W, N)
    return (sigma, torch.linalg.svdvals(reach).transpose(0, 1)) if causal else sigma
