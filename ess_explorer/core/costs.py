"""What each spectra route costs, in seconds: the figures behind the route choice under "ess"
(core/units.py) and the time estimate of a run (analysis.estimate_seconds).

Every figure is wall-clock time on a 2-core CPU (docs/benchmarks.md) for random models in real
shapes, with causal ESS where the route gives it. They choose routes, so they read only a job's
sizes, never this machine's thread count: every process routes a job the same way. Per unit,
with g = min(t, L - t) at cut t and N the state size:

* **dense** (core/spectra.py; under "ess" each cut's Gram built from the previous cut's, and its
  guarded eigenvalues): DENSE_CUT g^3 + DENSE_FIXED per cut, and RANK_DEFICIENT more where a
  recurrence's cut has rank N < g (the Gram's other g - N values are rounding, which its guard
  reads). A recurrence's causal ESS adds its reachability Gramian's eigenvalues, DENSE_CUT
  min(t, N)^3 per cut. Fitted to GPT-2-small's 12 heads (L = 512: 0.99 s a layer; L = 1024:
  11.3 s) and to 24 and 64 heads of diagonal recurrences, N = 64 and 128, L = 128 to 1024
  (0.12 to 25 s a layer); within 1.5x of each above L = 128, where a second is at stake.
* **Gramian** (core/gramian.py), per unit and cut: GRAMIAN_FIXED plus `gramian_cut_seconds`,
  the blocked torch route on every thread, 15, 60, 170 and 700 us in all at N = 16, 32, 64
  and 128 (24 heads, L = 128 to 1024). The compiled kernel runs LANES units side by side, one block of lanes per thread,
  `gramian.kernel_speedup` faster than that route per full block: 64 heads of N = 128 on one
  thread took 950 us a cut against the route's 700 on two. `gramian.uses_kernel` takes
  whichever of the two these figures make the faster.
* **exact** (precision="exact"): the square-root sweep per unit and cut, SWEEP_CUT at N = 16
  (a Mamba-130m layer, L = 512: 12.4 s), growing as the Gramian route's; a dense operator's cuts
  EXACT_DENSE times their "ess" cost (GPT-2-small at L = 512: 1.31 s a layer against 0.99 s);
  a head's channels (core/row_scaled.py) EXACT_SHARED times (Mamba2-130m at L = 256: 13.5 s
  a layer against 3.1 s).
* **shared** (core/row_scaled.py: the channels of a head, each the head's T with its rows
  scaled): `shared_seconds`, fitted to Mamba2-130m's layers (SHARED_FIXED and below).
* **short convolutions** (core/short_conv.py): SHORT_CONV_CUT per unit and cut (an LFM2-350M
  conv layer of 1,024 channels at L = 512: 0.37 s).
"""

from __future__ import annotations

import math

import numpy as np

from .compiled import LANES

__all__ = [
    "dense_seconds",
    "causal_seconds",
    "gramian_seconds",
    "gramian_cut_seconds",
    "shared_seconds",
    "sweep_seconds",
    "short_conv_seconds",
    "cheaper_route",
    "EXACT_DENSE",
    "EXACT_SHARED",
]

THREADS = 2  # the machine the figures were measured on (module docstring)
DENSE_CUT = 3.5e-11  # s per g^3 of a dense cut
DENSE_FIXED = 20e-6  # s per dense cut: its Gram's update, the guard, the bookkeeping
RANK_DEFICIENT = 50e-6  # s more per dense cut of rank N < g
SWEEP_CUT = 16e-6  # s per unit and cut of the exact square-root sweep at N = 16
EXACT_DENSE = 1.3
EXACT_SHARED = 4.3
SHORT_CONV_CUT = 0.7e-6
# A head's channels (`shared_seconds`), fitted to Mamba2-130m's layers with gates inside (24
# heads of 64 channels, N = 128; within 1.25x of each): L = 256 3.1-3.3 s a layer, L = 512
# 11.7 s, every 16th cut of 512 1.3 s, every 32nd of 1024 5.1 s.
SHARED_FIXED = 4e-6  # s per channel and cut
SHARED_CUT = 3e-12  # s per row and width^2 of a channel's factor Gram
SHARED_FACTOR = 2e-9  # s per row and width^2 of the head's factor SVD, carried from the last cut
SHARED_DENSE = 8e-12  # s per g^3 of a channel's cut Gram where its head's channels go dense
# The Gramian route's work outside its solver, per unit and cut: realising a, b, c, entropy,
# counts (a whole Mamba-130m at L = 512: 2.2 s a layer, of which the kernel about 1.3 s).
GRAMIAN_FIXED = 1.1e-6

# Under "ess" a layer of diagonal units takes the other route than the exact routes' flops
# choose (core/units.py) where these figures make it at least SWITCH_RATIO as fast: they are
# within about 1.5x of what they were fitted to. Below SWITCH_SECONDS a route change saves
# nothing a user waits for, and a small job keeps the exact routes' rule.
SWITCH_RATIO = 1.5
SWITCH_SECONDS = 1.0


def _cuts(times, length: int) -> np.ndarray:
    """The cuts 0 < t < L among ``times``, sorted (float64)."""
    t = np.asarray(times, dtype=np.float64).ravel()
    return np.sort(t[(t > 0) & (t < length)])


def _cut_sizes(times, length: int) -> np.ndarray:
    """g = min(t, L - t) of the cuts among ``times``."""
    t = _cuts(times, length)
    return np.minimum(t, length - t)


def dense_seconds(units: int, length: int, times, state: int | None = None) -> float:
    """The dense route under "ess" for ``units`` operators at the cuts ``times``: their cut
    Grams' eigenvalues; ``state`` N bounds each cut's rank (None: full rank)."""
    g = _cut_sizes(times, length)
    per_unit = DENSE_CUT * float((g**3).sum()) + DENSE_FIXED * len(g)
    if state is not None:
        per_unit += RANK_DEFICIENT * float((g > state).sum())
    return units * per_unit


def causal_seconds(owners: int, length: int, times, state: int) -> float:
    """Causal ESS of ``owners`` recurrences off the Gramian route: each cut's reachability
    Gramian's eigenvalues (core/causal.py), of size min(t, N)."""
    return owners * DENSE_CUT * float((np.minimum(_cuts(times, length), state) ** 3).sum())


def _state_growth(state: int) -> float:
    """How a cut of the Gramian route and of the exact sweep grows with the state size N,
    relative to N = 16 (both work on N x N matrices per cut)."""
    return (state / 16) ** 1.85


def gramian_cut_seconds(state: int) -> float:
    """The blocked Gramian route's seconds per unit and cut at state size N, every thread, less
    GRAMIAN_FIXED: its scans, sandwiches and eigenvalues."""
    return 13e-6 * _state_growth(state)


def gramian_seconds(units: int, cuts: int, state: int, kernel: bool, speedup: float = 1.0) -> float:
    """The Gramian route for ``units`` diagonal units at ``cuts`` cuts, causal ESS included:
    with ``kernel``, LANES units per block, each block on one thread, ``speedup`` (the kernel's
    over the blocked route per full block, `gramian.kernel_speedup`) faster."""
    solve = units * cuts * gramian_cut_seconds(state)
    if kernel:
        blocks = math.ceil(units / LANES)
        filled = units / (blocks * LANES)
        solve *= THREADS / (filled * speedup * min(blocks, THREADS))
    return solve + units * cuts * GRAMIAN_FIXED


def sweep_seconds(units: int, cuts: int, state: int) -> float:
    """The exact square-root sweep (core/sweeps.py) for ``units`` at ``cuts`` cuts, its causal
    spectra included."""
    return units * cuts * SWEEP_CUT * _state_growth(state)


def shared_seconds(channels: int, length: int, times, width: int) -> float:
    """One head's ``channels`` under "ess" (core/row_scaled.py), its factor ``width`` wide at
    most: each cut's factor, carried from the last cut by an SVD of (L - t) rows and the width
    plus the cuts between, and each channel's (L - t) x min(g, width) Gram and its eigenvalues;
    or, where that costs less, each channel's cut Grams (the dense route)."""
    t = _cuts(times, length)
    g, rows = np.minimum(t, length - t), length - t
    step = np.diff(t, prepend=0.0)
    factor = SHARED_FACTOR * float((rows * np.minimum(g, width + step) ** 2).sum())
    shared = channels * SHARED_CUT * float((rows * np.minimum(g, width) ** 2).sum()) + factor
    dense = channels * SHARED_DENSE * float((g**3).sum())
    return min(shared, dense) + channels * SHARED_FIXED * len(t)


def short_conv_seconds(units: int, cuts: int) -> float:
    """A short convolution's cuts (core/short_conv.py): a k - 1 block each."""
    return units * cuts * SHORT_CONV_CUT


def cheaper_route(current: float, other: float) -> bool:
    """Whether a job whose route is predicted to take ``current`` seconds takes the other one,
    predicted ``other`` (SWITCH_RATIO, SWITCH_SECONDS)."""
    return current >= SWITCH_SECONDS and current >= SWITCH_RATIO * other
