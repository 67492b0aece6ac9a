"""The Gramian route where the compiled kernel does not run (a GPU): every unit at once, one
launch per scan step.

Same outputs as `gramian_naive.gramian_spectra_reference` (the test oracle), and the same
per-cut math (`spectra_from_gramians`); what differs is how the Gramians are scanned. The
reference keeps P_t and Q_t of every wanted cut of its units, (B, W, N, N) each, so a whole
Mamba layer at L = 2048 is about 13 GB and had to be cut into chunks of a few hundred
units, each paying the 2 L scan steps (several launches each) again. Here the cuts are
taken in blocks of BLOCK:

1. a forward scan keeps P at the first cut of every block (checkpoints, (K, B, N, N));
2. a backward scan over the blocks, last first: the block's P_t again from its checkpoint
   and its Q_t down from the block after it, then the per-cut math on the block's wanted
   cuts, batched over units and cuts.

Each scan step is one fused op over all units (``addcmul``: P <- (a a^T) * P + b b^T with
the outer products of a block made in one op before its steps; Q <- (a a^T) * Q + (a a^T) *
(c c^T) likewise), so a layer costs about 3 L launches plus a few per block, whatever its
number of units, and holds about BLOCK_COPIES (B, BLOCK, N, N) arrays at once.
"""

from __future__ import annotations

import torch

from .gramian_naive import spectra_from_gramians

__all__ = ["BLOCK", "BLOCK_COPIES", "gramian_spectra_blocked", "blocked_bytes_per_unit"]

BLOCK = 64  # cuts per block: the batch of the per-cut math is (B, BLOCK)
# (B, BLOCK, N, N) float64 arrays alive at once: the outer products and scans of P and Q (4),
# and the per-cut math's balanced pair, root, sandwich and temporaries (about 8)
BLOCK_COPIES = 12


def blocked_bytes_per_unit(length: int, wanted: int, n: int, causal: bool) -> int:
    """Peak bytes per unit of `gramian_spectra_blocked`: its block arrays, the checkpoints and
    the outputs (float64)."""
    blocks = -(-length // BLOCK)
    outputs = wanted * (n + 1) * (2 if causal else 1)
    return 8 * (n * n * (BLOCK_COPIES * BLOCK + blocks) + outputs)


def _outer(x: torch.Tensor) -> torch.Tensor:
    """x x^T per row: (B, S, N) -> (B, S, N, N)."""
    return x[..., :, None] * x[..., None, :]


def _forward_block(p: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """P at every step of a block from p = P_s: rows j = 0..S of (B, S + 1, N, N) are
    P_s, P_{s+1}, .., P_{s+S}, where a, b (B, S, N) are steps s..s+S-1."""
    decay, write = _outer(a), _outer(b)
    out = p.new_empty(p.shape[0], a.shape[1] + 1, *p.shape[1:])
    out[:, 0] = p
    for j in range(a.shape[1]):
        torch.addcmul(write[:, j], decay[:, j], out[:, j], out=out[:, j + 1])
    return out


def gramian_spectra_blocked(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, wanted: torch.Tensor, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
    """`gramian_spectra_reference`'s outputs by the blocked scans (module docstring).
    a, b, c: (B, L, N) float64 on any device; wanted: sorted cuts in 1..L-1."""
    units, length, n = a.shape
    on_host = wanted.to(device="cpu", dtype=torch.long)  # the blocks' bookkeeping: no device sync
    wanted = on_host.to(a.device)
    starts = list(range(0, length, BLOCK))
    checkpoints = a.new_empty(len(starts), units, n, n)
    p = a.new_zeros(units, n, n)  # P_0: nothing written yet
    for k, start in enumerate(starts):  # 1. P at the first cut of each block
        checkpoints[k] = p
        stop = min(start + BLOCK, length - 1)  # P_t is needed up to t = L - 1
        if stop > start:
            p = _forward_block(p, a[:, start:stop], b[:, start:stop])[:, -1]
    lam = a.new_zeros(units, len(wanted), n)
    error = a.new_zeros(units, len(wanted))
    # causal: P_t's spectrum as (diag, off, top, error), as the reference returns it
    reach = [x.new_zeros(x.shape) for x in (lam, lam, error, error)] if causal else []
    q = a.new_zeros(units, n, n)  # Q_L: nothing read after the last token
    for k in range(len(starts) - 1, -1, -1):  # 2. blocks, last first
        start, stop = starts[k], min(starts[k] + BLOCK, length)
        # Q_t for t = stop - 1 .. start (descending): Q_t = (a_t a_t^T) * (Q_{t+1} + c_t c_t^T)
        decay = _outer(a[:, start:stop])
        read = decay * _outer(c[:, start:stop])
        backward = a.new_empty(units, stop - start, n, n)
        for j in range(stop - start - 1, -1, -1):
            q = torch.addcmul(read[:, j], decay[:, j], q, out=backward[:, j])
        rows = ((on_host >= max(start, 1)) & (on_host < stop)).nonzero().flatten()
        if len(rows) == 0:
            continue
        forward = _forward_block(checkpoints[k], a[:, start : stop - 1], b[:, start : stop - 1])  # P_start..P_{stop-1}
        rows, local = rows.to(a.device), (on_host[rows] - start).to(a.device)
        part = spectra_from_gramians(forward[:, local], backward[:, local], wanted[rows], length, causal)
        lam[:, rows], error[:, rows] = part[0], part[1]
        for whole, piece in zip(reach, part[2] or ()):
            whole[:, rows] = piece
    return lam, error, (tuple(reach) if causal else None)
