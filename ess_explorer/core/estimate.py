"""How long a layer's spectra will take, before they are computed: the route the layer takes
(its `spectra_path`, under the run's contract) priced by what that route was measured to cost
(core/costs.py). analysis.estimate_seconds sums it over a run's layers, and a run estimated
above its limit is refused before its spectra.

A head's channels (gates inside: core/row_scaled.py) cost what their head's factor is wide,
which only their spectra tell exactly; it is bounded here from the head's decays: a past step
whose decay to the middle cut has fallen below TRUNCATE_ESS no longer widens the factor. A
head that is not diagonal has no decays to read: its width is N, and its channels take the
dense route, as row_scaled.takes_dense_route sends such wide heads. The figures are a 2-core
CPU's (`costs.THREADS`) whatever the device: no GPU has been measured for them.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import costs, gramian
from .gramian import wanted_cuts
from .operators import DiagonalSSM
from .precision import Accuracy
from .row_scaled import TRUNCATE_ESS
from .units import CapturedLayer, ShortConvCapture, SSMCapture

__all__ = ["layer_seconds"]

HEAD_VALUES = 1 << 21  # the heads realised at once to read their decays: (heads, L, N) values at most


def layer_seconds(layer: CapturedLayer, positions, accuracy: Accuracy, causal: bool = True, device=None) -> float:
    """The seconds the spectra of every unit of ``layer`` at ``positions`` take under
    ``accuracy`` (with causal ESS where ``causal``), on a 2-core CPU (module docstring)."""
    positions = torch.as_tensor(np.asarray(positions, dtype=np.int64))
    cuts = wanted_cuts(positions, layer.length).numpy()
    if isinstance(layer, ShortConvCapture):
        return costs.short_conv_seconds(layer.n_units, len(cuts))
    if isinstance(layer, SSMCapture):
        return _recurrence_seconds(layer, positions, cuts, accuracy, causal, device)
    return _dense_seconds(layer.n_units, layer.length, cuts, layer.max_rank, accuracy)


def _recurrence_seconds(layer: SSMCapture, positions, cuts, accuracy: Accuracy, causal: bool, device) -> float:
    """A recurrence's layer on the route its `spectra_path` takes."""
    units, length = layer.n_units, layer.length
    path = layer.spectra_path(positions, device, accuracy)
    owners, owner_of = layer._owners(range(units))
    ssm = layer.realize(owners[:1])
    state = layer.state_size if layer.state_size is not None else ssm.state_size
    reach = len(owners) if causal else 0  # causal ESS: each owner's reachability Gramians
    if path["method"] != "dense":  # factored: the Gramian route under "ess", else the sweep
        if layer.gramian_route(range(units), path, accuracy):
            return gramian.route_seconds(device, units, len(cuts), state, length)
        return costs.sweep_seconds(units, len(cuts), state)
    if len(owners) == units:
        return _dense_seconds(units, length, cuts, state, accuracy) + costs.causal_seconds(reach, length, cuts, state)
    channels = torch.bincount(owner_of, minlength=len(owners)).tolist()
    if isinstance(ssm, DiagonalSSM):  # a few heads at a time: an estimate holds no layer's operators
        step = max(1, HEAD_VALUES // (length * state))
        widths = [w for k in range(0, len(owners), step) for w in _widths(layer.realize(owners[k : k + step]), length)]
        seconds = sum(costs.shared_seconds(n, length, cuts, min(w, state)) for n, w in zip(channels, widths))
    else:  # no decays to read a width off: full, and such heads' channels take the dense route
        seconds = costs.dense_seconds(units, length, cuts, state)
    scale = 1.0 if accuracy.fast else costs.EXACT_SHARED
    return scale * seconds + costs.causal_seconds(reach, length, cuts, state)


def _dense_seconds(units: int, length: int, cuts, rank: int | None, accuracy: Accuracy) -> float:
    """The dense route under ``accuracy``: "exact" costs EXACT_DENSE times "ess"."""
    seconds = costs.dense_seconds(units, length, cuts, rank)
    return seconds if accuracy.fast else costs.EXACT_DENSE * seconds


def _widths(heads: DiagonalSSM, length: int) -> list[int]:
    """Each head's factor width at its middle cut, bounded from its decays (module docstring):
    the past steps whose decay to the middle stays above TRUNCATE_ESS (the caller caps it at N)."""
    slowest = heads.a.reshape(-1, length, heads.state_size).abs().amax(-1)  # (h, L): each head's slowest mode
    middle = max(1, length // 2)
    decayed = torch.log(slowest[:, :middle].clamp_min(1e-300)).flip(-1).cumsum(-1)  # from each step to the middle
    return ((decayed > math.log(TRUNCATE_ESS)).sum(-1) + 1).tolist()
