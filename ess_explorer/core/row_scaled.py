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
channel's cost grows as r^2 (L - t) + r^3. On a CPU the owner's factor is carried from one
cut to the next: H_{t+1} is H_t without its first row plus one new column, so the SVD of
[U_r S_r without its first row | new column], (L - t - 1) x (r + 1), gives the next factor
(`_carried_factor`), instead of the SVD of the whole (L - t - 1) x (t + 1) cut (Mamba2's
heads at L = 512: 59 s of SVDs per layer -> 17 s, one thread). Where a cut's own SVD is
taken, its leading columns that have decayed below the truncation are left out
(`_whole_factor`).

Accuracy. Dropping the columns past r and the rounding of the owner's SVD change
diag(g) H_t by at most ||diag(g)|| (S_{r+1} + ROUNDING * S_1) in the 2-norm, so by Weyl's
inequality every singular value moves by at most that much (the shift); a carried factor
adds up those of the cuts it was carried through (its ``error``: the drops in quadrature,
`_Factor`), and restarts from the
cut's own SVD before it passes RESTART times the truncation. Under "exact" a channel keeps
the result only where the shift is within BOUND * sigma_1 of its own cut (the accuracy
every path of the project keeps: docs/spectra.md), from the SVD of its (L - t) x r factor.
Under "ess" (core/precision.py) the factor's Gram gives the values, and a channel keeps
them where the Gram's rounding plus what was dropped cannot move a count and moves its
spectrum by at most ESS_MASS of its sum (so entropy-ESS stays within its contract); there
the dropped columns, orthogonal to the kept ones, move a value only to second order
(`_ess_guard`), so the truncation can keep fewer. Any other channel tries
again with the factor of its owner's own SVD, where the one it had was carried, and failing
that its cut is redone by its own SVD. Where the owner's cut is well conditioned, each
channel's Gram and `eigvalsh` of its whole cut (the dense path's guarded route,
core/spectra.py) cost less than that SVD and are used instead.

Where sharing does not pay, under "ess", an owner's channels go to that dense path whole
(`takes_dense_route`): on a CPU the owners whose factors are nearly as wide as their cuts
(a slow head: an SVD per cut for no narrower factor), on a GPU every owner (its batched
Grams beat an SVD of every owner at every cut).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from . import dense_jobs
from .accelerator import accelerator_routes, worker_threads
from .channel_kernel import ChannelLanes, decayed_lines
from .checks import require
from .eigen import svd, svdvals
from .gram import GRAM_ERROR, GRAM_GUARD, GRAM_NOISE, gram_singular_values
from .precision import EXACT, Accuracy, squares_underflow, zero_subnormal_cuts
from .spectra import DENSE_CHUNK_CELLS, hankel_singular_values
from .sweeps import over_chunks

__all__ = ["row_scaled_hankel_singular_values", "takes_dense_route"]

TRUNCATE = 1e-14  # owner values kept: above this times the owner's sigma_1 (past it: rounding)
ROUNDING = 1e-14  # the owner SVD's backward error, relative to its sigma_1 (a few hundred eps)
BOUND = 1e-10  # a channel keeps the shared result when it is this accurate relative to its sigma_1
# Under the "ess" contract (core/precision.py) the owner's values are kept down to this times
# its sigma_1, and a channel keeps the shared result where what was dropped cannot move a count
# and moves its spectrum by at most ESS_MASS of its sum (`_ess_guard`). The dropped
# directions are orthogonal to the kept ones, so they move a value near tau only to second
# order, and entropy-ESS reads their sum: a channel's sigma_1 is mostly 1e-2 to 1e-1 of
# max|g| S_1 (Mamba2's heads). One Mamba2 layer at L = 256, one thread: 1e-12 6.4 s, 1e-11
# 5.6 s, 1e-10 5.5 s (0.4% of the channel cuts then fail and retry), 1e-9 7.2 s (4% retry).
TRUNCATE_ESS = 1e-10
# Moving the spectrum by q = ESS_MASS of its sum moves entropy-ESS by at most q ln(k - 1) + h(q)
# (`_ess_guard`): 4.3e-6 for k = 128 values, 5e-6 for 2,048, half the contract's 1e-5 (the rest
# is the routes' own rounding, measured at 1.2e-6 at most on a Mamba2 layer). 1e-7 instead
# retried twice as many channel cuts by their own SVD (two layers, one thread: 8.7 s -> 8.2 s).
ESS_MASS = 2e-7
# A factor carried from cut to cut (`_carried_factor`) restarts from the cut's own SVD once its
# error passes this many times the truncation, relative to the cut's sigma_1. Below that, a
# restart waits for a channel whose guard fails (`_shared_factor_values` then takes the cut's
# own SVD, and that factor is carried on), since most channels pass theirs with the carried
# factor's larger error: at 4, a fifth of the heads' SVDs were restarts ahead of need (Mamba2
# layers at L = 256, one thread, 4 and 64 alternated in one process: under "exact" one layer
# 20.1-22.4 s -> 18.7-19.5 s, its heads' SVD work 2,600 -> 1,531 units; under "ess" two layers
# 10.2 s -> 10.0 s on average, 2,197 -> 1,916 units; the same counts and entropy within 1.2e-6
# of the exact SVDs either way).
RESTART = 64
# Under "ess" an owner's channels take the dense route where the flop count of its shared
# factors is at least this times the dense route's (`takes_dense_route`).
DENSE_ROUTE_RATIO = 0.8
# Cuts a chunk holds at least: its first cut takes each owner's own SVD, the next ones carry it
# (`_carried_factor`). A strided preview's 31 cuts in chunks of one carried nothing (two Mamba2
# layers at L = 512, every 16th cut, 2 threads: 6.5-7.2 s in chunks of one, 5.3-6.0 s of eight).
CARRY_RUN = 8
# A cut's own SVD leaves out its leading columns while their Frobenius norm stays within this
# fraction of the truncation (`_whole_factor`), so they add little to a factor's error.
LEADING = 0.1


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
    Returns (U, P, K), K = L // 2 or max_rank where that is smaller, descending, zero padded;
    row t = 0 all zeros, as `hankel_singular_values` of the materialised T_u (its first K),
    a cut below float64's normal range read as zero (`precision.zero_subnormal_cuts`).
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
    most = length // 2 if max_rank is None else min(length // 2, max(1, max_rank))  # past the bound: rounding
    out = torch.zeros(len(owner_of), len(positions), most, dtype=dtype, device=device)
    cuts = sorted({int(t) for t in positions.tolist() if 0 < t < length})
    rows_of = {t: (positions == t).nonzero().flatten().tolist() for t in cuts}
    widths = _owner_widths(owners, max_rank)
    # Under "ess" the channels of some owners take the dense route (`takes_dense_route`);
    # the rest share their owner's factors, below.
    dense_owner = [takes_dense_route(width, cuts, length, device, accuracy) for width in widths]
    dense = torch.tensor(dense_owner, dtype=torch.bool, device=device)[owner_of]
    for rows in _in_groups(dense.nonzero().flatten(), length * length):
        channels = scales[rows, :, None] * owners[owner_of[rows]]  # (u, L, L)
        sigma = hankel_singular_values(channels, positions=positions, dtype=dtype, device=device, precision=accuracy)
        out[rows] = sigma[..., :most]
    shared_rows = (~dense).nonzero().flatten()
    owner_of, scales = owner_of[shared_rows], scales[shared_rows]
    if not len(shared_rows):
        return out
    allow_kernel = _repays_kernel(widths, owner_of, cuts, length)

    truncate = TRUNCATE_ESS if accuracy.fast else TRUNCATE
    lanes = ChannelLanes(owner_of, scales)  # every owner's channels of a cut in one call of the kernel
    in_use = list(lanes.units_of)
    owner_groups = [(o, units.to(device)) for o, units in lanes.units_of.items()]  # each owner's units
    # On a CPU each owner's factor follows it from cut to cut (`_carried_factor`); on a GPU one
    # batched SVD of every owner's cut beats a loop of small ones.
    carry = not accelerator_routes(device)

    def one_cut(t: int, carried: dict) -> torch.Tensor:
        cut = owners[:, t:, :t]  # (O, m, n)
        if carry:
            factors = {o: _carried_factor(owners[o], t, carried.get(o), truncate, max_rank) for o in in_use}
        else:
            left, values, _ = svd(cut)  # (O, m, k), (O, k)
            factors = {o: _Factor.truncated(t, left[o], values[o], None, True, truncate, max_rank) for o in in_use}
        gate = scales[:, t:]  # (U, m)
        sigma = cut.new_zeros(len(owner_of), min(cut.shape[-2:]))
        # A well-conditioned owner cut (smallest value 10x above the Gram guard): its channels'
        # Grams keep every value (core/spectra.py) for a fraction of an SVD each (attention
        # heads, mostly). A recurrence's cuts fall far below it and take the shared factor.
        conditioned = torch.zeros(owners.shape[0], dtype=torch.bool, device=device)  # filled on the device: no sync
        for o, factor in factors.items():
            if factor.whole and len(factor.values) == min(cut.shape[-2:]):  # every value of the cut
                conditioned[o] = factor.values[-1] >= 10 * GRAM_GUARD * factor.values[0]
        by_gram = conditioned[owner_of]
        if bool(by_gram.any()):
            for rows in _in_groups(by_gram.nonzero().flatten(), cut.shape[-2] * cut.shape[-1]):
                channels = gate[rows, :, None] * cut[owner_of[rows]]
                sigma[rows] = gram_singular_values(channels, accuracy=accuracy, allow_kernel=allow_kernel)
            skipped = conditioned.tolist()  # one copy to the host, not one sync per owner
            groups = [(o, rows) for o, rows in owner_groups if not skipped[o]]
        else:
            groups = owner_groups
        if groups:
            _shared_factor_values(sigma, cut, factors, gate, groups, accuracy, truncate, max_rank, lanes, allow_kernel)
        if carry:
            carried.update(factors)
        return sigma

    def run(chunk: slice) -> None:
        carried: dict = {}  # owner -> its factor at the chunk's previous cut
        for t in cuts[chunk]:
            sigma = one_cut(t, carried)
            width = min(sigma.shape[-1], out.shape[-1])
            for row in rows_of[t]:  # into a view: indexing out's rows took 1.6x as long
                out[:, row, :width].index_copy_(0, shared_rows, sigma[:, :width])

    workers = worker_threads(device)
    # Small chunks of cuts, handed out as threads free up: the cheap cuts near the ends
    # balance the costly ones in the middle; at least CARRY_RUN, so that factors are carried.
    over_chunks(run, len(cuts), max(CARRY_RUN, len(cuts) // (8 * workers)), workers)
    return zero_subnormal_cuts(out)


def _in_groups(rows: torch.Tensor, cells: int) -> tuple[torch.Tensor, ...]:
    """``rows`` (units) in groups whose dense copies, ``cells`` values each, hold at most
    DENSE_CHUNK_CELLS together: a layer's chunk holds every unit of its owners (core/layer.py),
    so the copies made from them are bounded here."""
    return rows.split(max(1, DENSE_CHUNK_CELLS // max(1, cells))) if len(rows) else ()


def _owner_widths(owners: torch.Tensor, max_rank: int | None) -> list[int]:
    """Each owner's factor width r, estimated from its middle cut (the widest; a
    fast-forgetting head keeps a few columns where the bound N would say 64 or 128): its
    values above TRUNCATE_ESS S_1, at most ``max_rank``. Read from the data alone, so every
    process routes a job the same way."""
    length = owners.shape[-1]
    middle = svdvals(owners[:, length // 2 :, : length // 2])  # (O, L / 2)
    return (middle > TRUNCATE_ESS * middle[:, :1]).sum(-1).clamp(max=max_rank or length).tolist()


def takes_dense_route(width: int, cuts: list[int], length: int, device: torch.device, accuracy: Accuracy) -> bool:
    """Whether an owner's channels take the dense route of core/spectra.py (each channel's own
    T, its cut Grams' eigenvalues: what the "ess" contract accepts of dense units,
    core/precision.py) rather than their owner's shared factors. Never under "exact".

    On a GPU always: the dense route answers in a few batched Gram products and batched
    eigensolves (core/eigen.py), where shared factors need an SVD of every owner at every cut,
    which cuSOLVER takes one matrix at a time, with host syncs between them.

    On a CPU where it costs less: the dense route builds each cut's Gram from the previous
    cut's, then takes its eigenvalues, about (8/3) g^3 per cut, g = min(t, L - t); the shared
    factors cost per cut an (L - t) x r Gram and its eigenvalues, 2 (L - t) r^2 + (8/3) r^3
    with r = min(width, g), and the owner's SVD. Measured on Mamba2-130m's heads at L = 256, 64
    channels, one thread (factors against dense, CPU seconds): width 124-126: 1.5-1.6 against
    0.7; 113: 1.4 against 0.7; 73-75: 0.75-1.0 against 0.6; 56-57: 0.3-0.5 against 0.6; 42:
    0.42 against 0.59; 19: 0.31 against 0.61 (the rule below picks the faster one at each).
    The flop counts leave out the owner's SVDs, so the dense route is taken from
    DENSE_ROUTE_RATIO of its count on (width 64 and up at L = 256 with N = 128; at L = 512 only
    a head that keeps all of N = 128; never at L = 1024)."""
    if not accuracy.fast:
        return False
    if accelerator_routes(device):
        return True
    factor = dense = 0.0
    for t in cuts:
        g = min(t, length - t)
        r = min(width, g)
        factor += 2.0 * (length - t) * r * r + 8.0 / 3.0 * r**3
        dense += 8.0 / 3.0 * g**3
    return factor >= DENSE_ROUTE_RATIO * dense > 0


def _repays_kernel(widths: list[int], owner_of: torch.Tensor, cuts: list[int], length: int) -> bool:
    """Whether the channels' Gram eigenvalues may take the compiled kernel
    (`dense_jobs.repays_kernel`): their work, over channels and cuts, of Grams of size
    min(r, t, L - t), r each owner's width (`_owner_widths`)."""
    channels = torch.bincount(owner_of.cpu(), minlength=len(widths)).tolist()
    work = sum(
        count * sum(dense_jobs.eigen_work(min(w, t, length - t)) for t in cuts)
        for w, count in zip(widths, channels)
        if count
    )
    return dense_jobs.repays_kernel(work)


class _Factor(NamedTuple):
    """An owner's cut H_t (m, n) as base Z + E + R: base (m, r) = U_r S_r, Z with orthonormal
    rows; E the dropped columns, whose rows are orthogonal to Z's (E Z^T = 0: each truncation
    drops the trailing singular directions, and a carried factor's earlier E keeps its rows
    orthogonal to the new Z); R the SVDs' rounding. ||E||_2 <= dropped, the nuclear norm
    ||E||_* <= mass, ||R||_2 <= rounding, ||R||_* <= rounding_mass (each SVD's rounding is a
    matrix as wide as what it factored, so of rank at most its number of values: a carried
    step's r + 1, not the cut's min(m, t)). values: the singular values it was cut from (of H_t
    itself where ``whole``, else of the carried factor). Each step's drop lies in the row space
    it was cut from, to which every earlier drop is orthogonal, so the drops' rows are mutually
    orthogonal, E E^T is the sum of theirs, and ``dropped`` adds them in quadrature."""

    t: int
    base: torch.Tensor
    values: torch.Tensor
    whole: bool
    dropped: float
    rounding: float
    mass: float
    rounding_mass: float

    @property
    def error(self) -> float:
        """||E + R||_2 <= this: how far each singular value of H_t may be from base's (Weyl)."""
        return self.dropped + self.rounding

    @classmethod
    def truncated(cls, t, left, values, carried: "_Factor | None", whole: bool, truncate: float, max_rank) -> "_Factor":
        """Keep the columns with S_k > truncate S_1 (at most ``max_rank``), adding to what
        ``carried`` (the factor this one was carried from, if any) had dropped: ``dropped``
        grows by the first dropped value (in quadrature), ``rounding`` by the SVD's, the mass by
        all the dropped values, the rounding's mass by that rounding times the number of values."""
        listed = values.tolist()  # descending; one copy to the host for a few dozen floats
        kept = sum(value > truncate * listed[0] for value in listed)
        kept = max(1, kept if max_rank is None else min(kept, max_rank))
        return cls(
            t,
            left[:, :kept] * values[:kept],
            values,
            whole,
            dropped=math.hypot(listed[kept] if kept < len(listed) else 0.0, carried.dropped if carried else 0.0),
            rounding=ROUNDING * listed[0] + (carried.rounding if carried else 0.0),
            mass=sum(listed[kept:]) + (carried.mass if carried else 0.0),
            rounding_mass=len(listed) * ROUNDING * listed[0] + (carried.rounding_mass if carried else 0.0),
        )


def _carried_factor(owner: torch.Tensor, t: int, previous: "_Factor | None", truncate: float, max_rank) -> _Factor:
    """The factor of cut t of ``owner`` (L, L), from the factor of an earlier cut t0 where
    that is the smaller problem: H_t = [H_t0 without its first t - t0 rows | owner[t:, t0:t]],
    so H_t = [base_t0[t - t0:] | new columns] blockdiag(Z_t0, I) + E_t0 (rows dropped), and an
    SVD of that m x (r + t - t0) matrix, instead of the m x t cut, gives the next factor. The
    dropped values and roundings add up along a chunk of cuts; where they pass RESTART x the
    truncation (relative to this cut's sigma_1: a head's sigma_1 can fall by orders of
    magnitude when a large row leaves the cut), the cut's own SVD starts again. A fast-
    forgetting head keeps a few columns, so its cuts cost a fraction of their SVDs."""
    m, n = owner.shape[-1] - t, t
    if previous is not None and previous.t < t and previous.base.shape[-1] + t - previous.t < min(m, n):
        stacked = torch.cat([previous.base[t - previous.t :], owner[t:, previous.t : t]], dim=-1)
        left, values, _ = svd(stacked)
        factor = _Factor.truncated(t, left, values, previous, False, truncate, max_rank)
        if factor.error <= RESTART * truncate * float(values[0]):
            return factor
    return _whole_factor(owner[t:, :t], t, truncate, max_rank)


def _whole_factor(cut: torch.Tensor, t: int, truncate: float, max_rank) -> _Factor:
    """The factor of ``cut`` (m, t) from its own SVD, less its leading columns where those have
    decayed away: the first j columns A, whose Frobenius norm is within LEADING x the
    truncation of the largest column's norm (<= sigma_1), are left out, and the SVD is taken of
    the other m x (t - j) (`channel_kernel.decayed_lines`, the rule that also leaves out a
    factor's decayed rows). Leaving out A = [A | 0] is a drop like the truncation's: its rows
    are orthogonal to every row of Z = [0 | W^T] (``_Factor``), so it joins ``dropped`` in
    quadrature (||A||_2 <= ||A||_F) and ``mass`` (||A||_* <= sqrt(min(m, j)) ||A||_F). A
    fast-forgetting head restarts at a cut whose sigma_1 fell by orders of magnitude, and its
    old columns have decayed by as much: its SVD then takes a few dozen columns, not t."""
    squares = (cut * cut).sum(0)  # (t,) each column's norm squared
    largest, scale = squares.max(), 1.0
    if bool(squares_underflow(largest)):  # a cut near 1e-200: its squares are 0 (core/precision.py)
        scale = float(cut.abs().max()) or 1.0
        squares = ((cut / scale) ** 2).sum(0)
        largest = squares.max()
    skip, norm = decayed_lines(squares, (LEADING * truncate) ** 2 * float(largest))
    norm *= scale
    left_out = None
    if skip:
        left_out = _Factor(
            t, cut[:, :0], cut.new_zeros(0), True, norm, 0.0, math.sqrt(min(cut.shape[0], skip)) * norm, 0.0
        )
    left, values, _ = svd(cut[:, skip:])
    return _Factor.truncated(t, left, values, left_out, True, truncate, max_rank)


def _shared_factor_values(
    sigma,
    cut,
    factors: dict,
    gate,
    groups,
    accuracy: Accuracy,
    truncate: float,
    max_rank,
    lanes: ChannelLanes,
    allow_kernel: bool = True,
) -> None:
    """sigma(diag(g_u) H) into sigma[u] for each unit of ``groups`` ((owner, its units' rows)
    pairs) from its owner's factor H = base Z + E (module docstring). The owner's own rank r
    decides the factor's width (a fast-decaying head keeps a few columns, not the widest
    head's); one guard then reads every unit of the cut at once (`_guarded_values`). A unit
    whose bound does not hold tries again with the cut's own SVD where its owner's factor was
    carried (whose error is the larger: ``factors`` then holds that one; every such owner's
    units in one more guard), then takes the SVD of its own cut."""
    largest_gate = gate.abs().amax(-1)
    redo = _guarded_values(factors, gate, largest_gate, groups, accuracy, truncate, allow_kernel, sigma, lanes)
    if not bool(redo.any()):
        return
    failing = {owner: rows[redo[rows]] for owner, rows in groups}
    retry = [(owner, units) for owner, units in failing.items() if len(units) and not factors[owner].whole]
    if retry:
        for owner, _ in retry:
            factors[owner] = _whole_factor(cut[owner], factors[owner].t, truncate, max_rank)
        again = _guarded_values(factors, gate, largest_gate, retry, accuracy, truncate, allow_kernel, sigma, lanes)
        failing.update((owner, units[again[units]]) for owner, units in retry)
    for owner, units in failing.items():
        if len(units):  # the cut of a channel whose gate peaks where its rows are small
            own = svdvals(gate[units, :, None] * cut[owner])
            sigma[units] = 0.0
            sigma[units, : own.shape[-1]] = own


def _guarded_values(
    factors: dict,
    gate,
    largest_gate,
    groups,
    accuracy: Accuracy,
    truncate: float,
    allow_kernel: bool,
    sigma,
    lanes: ChannelLanes,
):
    """Write sigma[rows] (zero past each unit's values) for each (owner, rows) of ``groups``
    from the owner's factor (`_owner_values`), and return which of all units (U,) must be
    redone, by one guard over every unit written: under "exact" by SVD, kept where the shift
    max|g| ||E + R|| (Weyl) is within BOUND sigma_1; under "ess" `_ess_guard`, with the
    factor's decayed trailing rows left out of the channels' Grams and counted as a drop
    (`_owner_values`)."""
    written = torch.cat([members for _, members in groups])
    values, left_out = _owner_values(factors, groups, gate, accuracy, truncate, allow_kernel, lanes)
    values = values[written]  # (u, R): the rest zero
    sigma[written] = 0.0
    sigma[written, : values.shape[-1]] = values
    stats = []  # per owner: its factor's bounds, and how many values each of its units has
    for owner, _ in groups:
        factor = factors[owner]
        rows, norm = left_out.get(owner, (0, 0.0))
        dropped = math.hypot(factor.dropped, norm)
        mass = factor.mass + factor.rounding_mass + math.sqrt(min(rows, factor.base.shape[-1])) * norm
        stats.append((dropped, factor.rounding, mass, min(factor.base.shape)))
    counts = torch.tensor([len(members) for _, members in groups], device=sigma.device)
    per_unit = torch.tensor(stats, dtype=sigma.dtype, device=sigma.device).repeat_interleave(counts, 0)
    dropped, rounding, mass, width = per_unit.unbind(-1)
    largest = largest_gate[written]
    if accuracy.fast:
        fails = ~_ess_guard(values, width, largest, dropped, rounding, mass, accuracy)
    else:
        fails = largest * (dropped + rounding) > BOUND * values[:, 0]
    redo = torch.zeros(len(sigma), dtype=torch.bool, device=sigma.device)
    redo[written] = fails
    return redo


def _owner_values(
    factors: dict,
    groups,
    gate: torch.Tensor,
    accuracy: Accuracy,
    truncate: float,
    allow_kernel: bool,
    lanes: ChannelLanes,
) -> tuple[torch.Tensor, dict]:
    """(U, R): for each (owner, rows) of ``groups`` the rows sigma of diag(gate[u]) base,
    base = factors[owner].base (gate (U, m)), zero past min(m, r); other rows zero (R the
    widest of those owners' min(m, r)); and owner -> (rows, norm) of the trailing rows left
    out. Under "exact" by SVD, every row kept; under "ess" from its Gram's eigenvalues, every
    owner's channels in one call of the kernel (core/channel_kernel.py: one call per owner held
    the Python lock long enough that two threads of cuts waited on it, two Mamba2 layers at
    L = 256 on 2 threads, alternated in one process: 7.9 s -> 6.7 s), less the factor's
    trailing rows whose Frobenius norm is within LEADING x the truncation of its sigma_1
    (`channel_kernel.decayed_rows`): a head's future outputs decay with its forgetting, and a
    fast head's last rows are far below what it keeps. Leaving out rows D of diag(g) base adds
    the PSD term D^T D to the channel's Gram, so each sigma_k^2 lies between the kept rows'
    value and it plus ||D||^2, and the nuclear norm grows by at most ||D||_*: a drop of the
    kind `_ess_guard` reads of E (`_guarded_values` adds it in quadrature; both terms add to
    the same Gram). One layer of Mamba2-130m at L = 256: the channels' Gram products 18.7 ->
    10.0 GF."""
    if accuracy.fast:
        start = factors[groups[0][0]].t  # the cut: its rows t: of every gate
        bases = {o: factors[o].base for o, _ in groups}
        values, left_out = lanes.eigenvalues(bases, start, allow_kernel, trim=LEADING * truncate)
        return values.sqrt(), left_out
    values = gate.new_zeros(gate.shape[0], max(min(factors[o].base.shape) for o, _ in groups))
    for owner, rows in groups:
        own = svdvals(gate[rows, :, None] * factors[owner].base)
        values[rows, : own.shape[-1]] = own
    return values, {}


def _ess_guard(sigma, width, largest_gate, dropped, rounding, mass, accuracy: Accuracy) -> torch.Tensor:
    """Which units keep sigma, each unit's diag(gate) base from its Gram's eigenvalues (its
    first ``width`` values; the rest padding), base from its owner's factor H = base Z + E + R
    (`_Factor`: ``dropped`` >= ||E||, ``rounding`` >= ||R||, ``mass`` >= ||E||_* + ||R||_*),
    g = ``largest_gate`` = max|gate|. B = diag(gate) E is orthogonal to the kept part, so each
    sigma_k^2 lies between that of diag(gate) base and it plus ||B||^2 <= (g ||E||)^2
    (interlacing), and R moves each sigma by at most g ||R|| (Weyl). A count stands where the
    Gram's rounding plus those cannot move a value across tau (`Accuracy.certain`,
    `Accuracy.shifted_error`). Entropy-ESS: the spectrum moves by at most g (||E||_* + ||R||_*)
    in the 1-norm (the nuclear norm of [A | B] less that of A is at most ||B||_*; R moves the
    values by at most ||R||_* in all, Mirsky), so p = sigma / sum(sigma) moves by at most
    q = that / sum(sigma) in total variation, and the entropy by at most q log(k - 1) + h(q)
    (Fannes-Audenaert): at q below ESS_MASS, by 5e-6 at most for up to 2,048 values. The values
    the channel's own Gram leaves unresolved are read too (`Accuracy.resolves_entropy`)."""
    squares, eps = sigma**2, torch.finfo(sigma.dtype).eps
    top = squares[:, 0]
    gram_rounding = GRAM_ERROR * width * eps * top
    error = accuracy.shifted_error(top, gram_rounding + (largest_gate * dropped) ** 2, largest_gate * rounding)
    moved = largest_gate * mass
    resolved = accuracy.resolves_entropy(squares, GRAM_NOISE * eps * top)
    return accuracy.certain(top, error) & (moved <= ESS_MASS * sigma.sum(-1)) & resolved
