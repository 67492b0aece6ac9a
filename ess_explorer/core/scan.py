"""Hankel singular values of a factored operator by a blocked scan of the square-root factors.

The sequential sweeps (core/sweeps.py) take one step per time step: L small batched ops,
which on a GPU means thousands of tiny kernel launches per layer. The scan computes the
same triangular square roots with about 2 sqrt(L) batched calls.

Each sweep has the form X_s^T X_s = P_s with P_s = M_s^T P_{s-1} M_s + v_s v_s^T, i.e.
X_s = R-factor of [X_{s-1} M_s; v_s^T], where M_s = diag(scale_s) for a DiagonalSSM and
M_s = diag(scale_s) + left_s right_s^T (rank r) for a DPLRSSM (`times_transition`). Over a
segment of steps the map P -> F^T P F + Q is affine, with F = M_{p+1} ... M_s the product of
the segment's transitions and Q = S^T S the segment's own Gramian started from zero. So,
with blocks of ``block`` steps:

1. inside every block, the local roots S_k (started from zero) and the running transition
   products F_k, all blocks at once: ``block`` batched QRs of (N+1) x N (F_k is a vector of
   decays for diagonal transitions, an N x N matrix for DPLR ones);
2. the roots at the block boundaries, carried from block to block: one QR of the stacked
   [X F; S] (2N x N) per block;
3. the root at any wanted step: one batched QR of [X_boundary F_k; S_k] (2N x N).

Only QRs of stacked triangular factors are formed: no Gramian (which would lose every
singular value below sqrt(eps) sigma_1). The transition products F_k span at most one
block; one that underflows drops a contribution below 1e-300 of the state it multiplies, as
the sequential sweep's repeated scaling does. Cut t's values are those of
U_o(t) U_c(t)^T as in core/sweeps.py. Written in torch ops: it runs on CPU (the reference
the tests check) and on any device.
"""

from __future__ import annotations

import math

import torch

from .eigen import svdvals

__all__ = ["scan_chunk", "scan_roots", "stacked_qr_r", "times_transition"]


def stacked_qr_r(top: torch.Tensor, bottom: torch.Tensor) -> torch.Tensor:
    """R factor (*, N, N) of the stacked [top; bottom], top (*, k, N), bottom (*, j, N), k + j >= N.

    The stack is written in column-major order (LAPACK's): torch's QR then copies it as one
    block instead of transposing it, about a quarter of a batched 17 x 16 QR on CPU. The R
    factor comes back column-major too.
    """
    rows = top.shape[-2] + bottom.shape[-2]
    stack = top.new_empty(*top.shape[:-2], top.shape[-1], rows).mT  # (*, k + j, N), column-major
    stack[..., : top.shape[-2], :] = top
    stack[..., top.shape[-2] :, :] = bottom
    return torch.linalg.qr(stack, mode="r").R


def times_transition(
    state: torch.Tensor, scale: torch.Tensor, left: torch.Tensor | None = None, right: torch.Tensor | None = None
) -> torch.Tensor:
    """S <- S (diag(scale) + left right^T), IN PLACE, batched: the factor times a transition.

    state (*, N, N); scale (*, N); left, right (*, N, r) or None (a diagonal transition).
    The low-rank part costs O(N^2 r): (S left) right^T, with S taken before the scaling.
    The sweeps and the scan use it with A_t^T = diag(a) + q p^T (forward) and
    A_t = diag(a) + p q^T (backward). After a low-rank update S is no longer triangular;
    the QR that follows re-triangularises it.
    """
    coefficients = None if left is None else state @ left  # (*, N, r)
    state.mul_(scale[..., None, :])
    if coefficients is not None:
        state.add_(coefficients @ right.transpose(-1, -2))
    return state


def scan_roots(
    scales: torch.Tensor,
    vectors: torch.Tensor,
    steps: torch.Tensor,
    block: int | None = None,
    lefts: torch.Tensor | None = None,
    rights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Roots X_s (upper triangular, rows of any sign) of X_s^T X_s = M_s^T X_{s-1}^T X_{s-1} M_s + v_s v_s^T.

    scales, vectors: (S, M, N) (v_s = vectors[s]); lefts, rights: (S, M, N, r) or None:
    M_s = diag(scales[s]) + lefts[s] rights[s]^T. X_{-1} = 0.
    steps: (W,) long, the step indices s wanted, or (W, M) for a different step per column m.
    Returns (W, M, N, N).
    """
    length, m, n = scales.shape
    low_rank = lefts is not None
    block = max(1, int(math.ceil(math.sqrt(length)))) if block is None else int(block)
    blocks = -(-length // block)
    pad = blocks * block - length
    if pad:  # identity steps (scale 1, vector 0, no low-rank part) fill the last block
        scales = torch.cat([scales, scales.new_ones(pad, m, n)])
        vectors = torch.cat([vectors, vectors.new_zeros(pad, m, n)])
        if low_rank:
            lefts, rights = (torch.cat([x, x.new_zeros(pad, *x.shape[1:])]) for x in (lefts, rights))
    sc = scales.reshape(blocks, block, m, n)
    vc = vectors.reshape(blocks, block, m, n)
    lc, rc = (x.reshape(blocks, block, *x.shape[1:]) for x in (lefts, rights)) if low_rank else (None, None)

    def step(state: torch.Tensor, k: int) -> torch.Tensor:  # state M_k for every block at once
        if not low_rank:
            return state * sc[:, k, :, None, :]
        return times_transition(state.clone(), sc[:, k], lc[:, k], rc[:, k])

    # 1. local roots and transition products inside every block, all blocks at once
    local = scales.new_empty(blocks, block, m, n, n)
    state = scales.new_zeros(blocks, m, n, n)
    if low_rank:  # products F_k = M_1 ... M_k of the block's steps: (N, N) each
        decay = scales.new_empty(blocks, block, m, n, n)
        running = torch.eye(n, dtype=scales.dtype, device=scales.device).expand(blocks, m, n, n)
    else:  # diagonal transitions: their products are vectors of decays
        decay = scales.new_empty(blocks, block, m, n)
        running = scales.new_ones(blocks, m, n)
    for k in range(block):
        state = stacked_qr_r(step(state, k), vc[:, k, :, None, :])
        local[:, k] = state
        running = step(running, k) if low_rank else running * sc[:, k]
        decay[:, k] = running

    def times_product(root: torch.Tensor, product: torch.Tensor) -> torch.Tensor:
        return root @ product if low_rank else root * product[..., None, :]

    # 2. roots at the block boundaries: carry[j] = X at the last step before block j
    carry = scales.new_zeros(blocks, m, n, n)
    for j in range(1, blocks):
        carry[j] = stacked_qr_r(times_product(carry[j - 1], decay[j - 1, -1]), local[j - 1, -1])

    # 3. the wanted steps: combine their block's boundary root with the local root
    steps = steps.to(torch.long)
    if steps.ndim == 1:
        steps = steps[:, None].expand(-1, m)
    column = torch.arange(m, device=steps.device).expand_as(steps)
    j, k = steps // block, steps % block
    base = times_product(carry[j, column], decay[j, k, column])
    return stacked_qr_r(base, local[j, k, column])


def scan_chunk(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    wanted: torch.Tensor,
    block: int | None = None,
    causal: bool = False,
    low_rank: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The scan counterpart of core/sweeps.py ``_sweep_chunk``: a, b, c (B, L, N); wanted:
    sorted cut positions t in [1, L - 1]; low_rank: (p, q), each (B, L, N, r), for
    transitions A_t = diag(a_t) + p_t q_t^T, or None for diagonal ones. Returns
    (B, len(wanted), N), descending; with ``causal`` also sigma(U_c(t)) = sigma(R_t), the
    reachability spectrum causal ESS counts (core/causal.py), read off the same forward roots.

    Forward  U_c(t) = root after step t - 1 of (transition A_s^T, vector b_s);
    backward W_t    = root after step L - 1 - t of the time-reversed (transition A_{s+1}, vector c_s);
    sigma(H_t) = sigma((W_t A_t) U_c(t)^T). Both halves are one stacked scan.
    """
    units, length, _ = a.shape
    shifted = torch.cat([a[:, 1:], torch.zeros_like(a[:, :1])], 1)
    scales = torch.cat([a, shifted.flip(1)]).transpose(0, 1)  # (L, 2B, N)
    vectors = torch.cat([b, c.flip(1)]).transpose(0, 1)
    lefts = rights = None
    if low_rank is not None:  # forward A_t^T = diag(a_t) + q_t p_t^T, backward A_{t+1} (zero past the end)
        p, q = low_rank
        p_next, q_next = (torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], 1) for x in (p, q))
        lefts = torch.cat([q, p_next.flip(1)]).transpose(0, 1)  # (L, 2B, N, r)
        rights = torch.cat([p, q_next.flip(1)]).transpose(0, 1)
    wanted = wanted.to(device=a.device, dtype=torch.long)
    forward, backward = (wanted - 1)[:, None], (length - 1 - wanted)[:, None]
    steps = torch.cat([forward.expand(-1, units), backward.expand(-1, units)], 1)
    roots = scan_roots(scales, vectors, steps, block, lefts, rights)  # (W, 2B, N, N)
    reach, observe = roots[:, :units], roots[:, units:]
    # U_o(t) = W_t A_t
    at = (x[:, wanted].transpose(0, 1) for x in (a, *(low_rank or ())))  # (W, B, N[, r])
    observe = times_transition(observe.clone(), *at)
    sigma = svdvals(observe @ reach.transpose(-1, -2)).transpose(0, 1)  # (B, W, N)
    return (sigma, svdvals(reach).transpose(0, 1)) if causal else sigma
