"""Spectra of many row-scaled copies of a few operators: T_u = diag(g_u) T_owner(u).

An output gate folded into T (core/gates.py) splits a head into its channels, each the
head's T with its rows scaled by the channel's gate: Mamba2's 64 channels per head. Their
cuts are diag(g_u[t:]) H_t, H_t = T_owner[t:, :t], so one SVD of the owner's cut serves
all of its channels:

    H_t = U S V^T   =>   sigma(diag(g) H_t) = sigma(diag(g) U S)      (V has orthonormal columns)

and U S keeps only the r columns with S_k > TRUNCATE * S_1 (TRUNCATE_ESS under "ess"; at
most the rank bound of the structure, N for a recurrence), so each channel works on an
(L - t) x r matrix instead of its own (L - t) x t cut. Each owner keeps its own r: a
fast-decaying head's cuts have a few values above the cut-off, a slow one's up to N, and a
channel's cost grows as r^2 (L - t) + r^3.

Accuracy. Dropping the columns past r and the rounding of the owner's SVD change
diag(g) H_t by at most ||diag(g)|| (S_{r+1} + ROUNDING * S_1) in the 2-norm, so by Weyl's
inequality every singular value moves by at most that much (the shift). Under "exact" a
channel keeps the result only where the shift is within BOUND * sigma_1 of its own cut (the
accuracy every path of the project keeps: docs/spectra.md), from the SVD of its (L - t) x r
factor. Under "ess" (core/precision.py) the factor's Gram gives the values, and a channel
keeps them where the Gram's rounding plus the shift cannot move a count and the shift is at
most ESS_BOUND * sigma_1 (so entropy-ESS stays within its contract). Any other channel's cut
is redone by its own SVD. Where the owner's cut is well conditioned, each channel's Gram and
`eigvalsh` of its whole cut (the dense path's guarded route, core/spectra.py) cost less than
that SVD and are used instead.
"""

from __future__ import annotations

import torch

from . import dense_jobs
from .checks import require
from .eigen import eigvalsh
from .precision import EXACT, Accuracy
from .spectra import GRAM_ERROR, GRAM_GUARD, gram_singular_values
from .sweeps import over_chunks

__all__ = ["row_scaled_hankel_singular_values"]

TRUNCATE = 1e-14  # owner values kept: above this times the owner's sigma_1 (past it: rounding)
ROUNDING = 1e-14  # the owner SVD's backward error, relative to its sigma_1 (a few hundred eps)
BOUND = 1e-10  # a channel keeps the shared result when it is this accurate relative to its sigma_1
# Under the "ess" contract (core/precision.py) the owner's values are kept down to this times
# its sigma_1, and a channel keeps the shared result while the shift that causes is at most
# ESS_BOUND times its own sigma_1 and cannot move a count: `_ess_factor_values`.
TRUNCATE_ESS = 1e-13
ESS_BOUND = 1e-8


def row_scaled_hankel_singular_values(
    owners: torch.Tensor,
    owner_of: torch.Tensor,
    scales: torch.Tensor,
    positions: torch.Tensor,
    *,
    max_rank: int | None = None,
    dtype: torch.dtype = torch.float64,
    device=None,
    accuracy: Accuracy = EXACT,
) -> torch.Tensor:
    """sigma(H_t) of T_u = diag(scales[u]) owners[owner_of[u]] at every t in ``positions``.

    owners (O, L, L) lower triangular; owner_of (U,) rows into owners; scales (U, L);
    max_rank: a bound on rank(H_t) from the structure (N for a recurrence), or None: the
    owner's values past it are rounding, and dropping them is within the bound below.
    Returns (U, P, L // 2), descending, zero padded; row t = 0 all zeros, as
    `hankel_singular_values` of the materialised T_u.
    """
    device = torch.device(device) if device is not None else owners.device
    owners = owners.to(device=device, dtype=dtype)
    scales = scales.to(device=device, dtype=dtype)
    owner_of = torch.as_tensor(owner_of, dtype=torch.long, device=device)
    length = owners.shape[-1]
    require(
        owners.shape[-2:] == (length, length) and scales.shape == (len(owner_of), length),
        f"row-scaled spectra: owners (O, L, L) and scales (U, L) expected, got {tuple(owners.shape)} "
        f"and {tuple(scales.shape)}",
    )
    positions = torch.as_tensor(positions, dtype=torch.long).flatten().cpu()
    out = torch.zeros(len(owner_of), len(positions), length // 2, dtype=dtype, device=device)
    cuts = sorted({int(t) for t in positions.tolist() if 0 < t < length})
    rows_of = {t: (positions == t).nonzero().flatten().tolist() for t in cuts}
    allow_kernel = _repays_kernel(owners, owner_of, cuts, max_rank)

    def one_cut(t: int) -> torch.Tensor:
        cut = owners[:, t:, :t]  # (O, m, n)
        left, values, _ = torch.linalg.svd(cut, full_matrices=False)  # (O, m, k), (O, k)
        gate = scales[:, t:]  # (U, m)
        sigma = cut.new_zeros(len(owner_of), values.shape[-1])
        # A well-conditioned owner cut (smallest value 10x above the Gram guard): its channels'
        # Grams keep every value (core/spectra.py) for a fraction of an SVD each (attention
        # heads, mostly). A recurrence's cuts fall far below it and take the shared factor.
        by_gram = (values[:, -1] >= 10 * GRAM_GUARD * values[:, 0])[owner_of]
        if bool(by_gram.any()):
            channels = gate[by_gram, :, None] * cut[owner_of[by_gram]]
            sigma[by_gram] = gram_singular_values(channels, accuracy=accuracy, allow_kernel=allow_kernel)
        if not bool(by_gram.all()):
            rest = ~by_gram
            shared = _shared_factor_values(
                cut, left, values, gate[rest], owner_of[rest], max_rank, accuracy, allow_kernel
            )
            sigma[rest, : shared.shape[-1]] = shared
        return sigma

    def run(chunk: slice) -> None:
        for t in cuts[chunk]:
            sigma = one_cut(t)
            width = min(sigma.shape[-1], out.shape[-1])
            for row in rows_of[t]:
                out[:, row, :width] = sigma[:, :width]

    workers = torch.get_num_threads() if device.type == "cpu" else 1
    # Small chunks of cuts, handed out as threads free up: the cheap cuts near the ends
    # balance the costly ones in the middle.
    over_chunks(run, len(cuts), len(cuts) // (8 * workers), workers)
    return out


def _repays_kernel(owners: torch.Tensor, owner_of: torch.Tensor, cuts: list[int], max_rank: int | None) -> bool:
    """Whether the channels' Gram eigenvalues may take the compiled kernel
    (`dense_jobs.repays_kernel`): their work, sum over channels and cuts of min(r, t, L - t)^3,
    with each owner's factor width r estimated from its middle cut (the widest; a
    fast-forgetting head keeps a few columns where the bound N would say 64 or 128). Read from
    the data alone, so every process routes a job the same way."""
    length = owners.shape[-1]
    middle = torch.linalg.svdvals(owners[:, length // 2 :, : length // 2])  # (O, L / 2)
    widths = (middle > TRUNCATE_ESS * middle[:, :1]).sum(-1).clamp(max=max_rank or length).tolist()
    channels = torch.bincount(owner_of, minlength=len(widths)).tolist()
    work = sum(count * sum(min(w, t, length - t) ** 3 for t in cuts) for w, count in zip(widths, channels) if count)
    return dense_jobs.repays_kernel(work)


def _shared_factor_values(
    cut, left, values, gate, owner_of, max_rank, accuracy: Accuracy, allow_kernel: bool = True
) -> torch.Tensor:
    """sigma(diag(g_u) H) for each unit from its owner's H = U S V^T (module docstring), one
    owner at a time: the owner's own rank r decides the factor's width (a fast-decaying head
    keeps a few columns, not the widest head's). Under "exact" the SVD of diag(g_u) U_r S_r;
    under "ess" its Gram's eigenvalues (`_ess_factor_values`). A unit whose bound does not
    hold takes the SVD of its own cut."""
    sigma = cut.new_zeros(len(owner_of), values.shape[-1])
    truncate = TRUNCATE_ESS if accuracy.fast else TRUNCATE
    for owner in torch.unique(owner_of).tolist():
        rows = (owner_of == owner).nonzero().flatten()
        own_values = values[owner]
        kept = max(1, int((own_values > truncate * own_values[0]).sum()))
        kept = kept if max_rank is None else min(kept, max(1, max_rank))
        dropped = own_values[kept] if kept < len(own_values) else own_values.new_zeros(())
        base = left[owner, :, :kept] * own_values[:kept]  # (m, r): unit u's factor is diag(g_u) base
        # Weyl: every value is off by at most ||diag(g)|| ||dropped part + rounding||
        shift = gate[rows].abs().amax(-1) * (dropped + ROUNDING * own_values[0])
        if accuracy.fast:
            values_u, redo = _ess_factor_values(base, gate[rows], shift, accuracy, allow_kernel)
        else:
            values_u = torch.linalg.svdvals(gate[rows, :, None] * base)  # (u, min(m, r))
            redo = shift > BOUND * values_u[:, 0]
        if bool(redo.any()):  # the cut of a channel whose gate peaks where its rows are small
            own = torch.linalg.svdvals(gate[rows[redo], :, None] * cut[owner])
            values_u = torch.nn.functional.pad(values_u, (0, max(0, own.shape[-1] - values_u.shape[-1])))
            values_u[redo] = torch.nn.functional.pad(own, (0, values_u.shape[-1] - own.shape[-1]))
        width = min(values_u.shape[-1], sigma.shape[-1])
        sigma[rows, :width] = values_u[:, :width]
    return sigma


def _ess_factor_values(
    base: torch.Tensor, gate: torch.Tensor, shift: torch.Tensor, accuracy: Accuracy, allow_kernel: bool = True
):
    """sigma of each unit's factor diag(gate[u]) base (base (m, r), gate (u, m)) from its Gram's
    eigenvalues, and which units must be redone: where the Gram's rounding plus the
    truncation's shift (Weyl, on each sigma) could move a count (`Accuracy.certain`), or the
    shift exceeds ESS_BOUND sigma_1 (entropy-ESS then stays within its 1e-5: every value moves
    by at most the shift).

    The u Grams in one matrix product, not u small ones: base^T diag(g^2) base is g^2 (a row
    of gate^2) times the m outer products of base's rows, (m, r^2); where r > m the Gram
    diag(g) base base^T diag(g) is base base^T scaled by g g^T."""
    m, r = base.shape
    if r <= m:
        outer = (base[:, :, None] * base[:, None, :]).reshape(m, r * r)
        gram = ((gate * gate) @ outer).reshape(-1, r, r)
    else:
        gram = (base @ base.T) * gate[:, :, None] * gate[:, None, :]
    sigma = eigvalsh(gram, allow_kernel).flip(-1).clamp_min(0).sqrt()  # (u, g), g = min(m, r): no redo here
    top = sigma[:, 0] ** 2
    rounding = GRAM_ERROR * sigma.shape[-1] * torch.finfo(sigma.dtype).eps * top
    error = rounding + (2 * sigma[:, 0] + shift) * shift  # on each sigma^2
    certain = accuracy.certain(top, error, sigma**2) & (shift <= ESS_BOUND * sigma[:, 0])
    return sigma, ~certain
