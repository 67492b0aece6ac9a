"""The order of an explorer run's work: which (layer, stride) tasks, and the strides of the
first chart and of the overview (app/session.py runs them)."""

from __future__ import annotations

import math

__all__ = ["plan", "overview_stride", "first_chart_stride", "OVERVIEW_POSITIONS", "FIRST_CHART_FLOPS"]

# Prompts longer than this get the other layers at every ceil(L / OVERVIEW_POSITIONS)-th
# cut first; the selected layer is made exact before them.
OVERVIEW_POSITIONS = 128


def overview_stride(length: int, stride="auto", positions: int = OVERVIEW_POSITIONS) -> int | None:
    """The stride of the overview pass for a prompt of ``length`` tokens: None (exact) for
    ``stride=None`` or a short prompt under "auto", else an int > 1."""
    if stride is None:
        return None
    if stride == "auto":
        return None if length <= positions else math.ceil(length / positions)
    if not isinstance(stride, int) or isinstance(stride, bool) or stride < 1:
        raise ValueError(f"stride must be 'auto', None or a positive int, got {stride!r}")
    return stride if stride > 1 else None


# The first chart is the selected layer at a stride when its exact spectra would cost more
# than about this many flops (a few tenths of a second on one laptop core) ...
FIRST_CHART_FLOPS = 2e8
# ... with at least this many cuts.
FIRST_CHART_POSITIONS = 32


def first_chart_stride(layer, length: int) -> int | None:
    """The stride of the first chart for ``layer`` (a core.units.CapturedLayer) on a
    prompt of ``length`` tokens: None (exact at once) when cheap, else the smallest stride
    that brings the rough cost (units x cuts x an SVD of the largest cut rank, r^3) under
    FIRST_CHART_FLOPS, keeping at least FIRST_CHART_POSITIONS cuts."""
    from ..core.units import CapturedLayer

    if not isinstance(layer, CapturedLayer):  # an injected pipeline's own layer object: no estimate
        return None
    rank = min(layer.max_rank or length // 2, max(1, length // 2))
    cost = float(layer.n_units) * length * rank**3
    if cost <= FIRST_CHART_FLOPS or length <= FIRST_CHART_POSITIONS:
        return None
    stride = min(math.ceil(cost / FIRST_CHART_FLOPS), math.ceil(length / FIRST_CHART_POSITIONS))
    return stride if stride > 1 else None


def plan(
    layers: list[int], selected: int, stride: int | None, first: int | None = None
) -> list[tuple[int, int | None]]:
    """The (layer, stride) tasks of a run, in order: ``selected`` at the ``first`` stride
    (when given), ``selected`` exactly, the other ``layers`` at ``stride`` (the overview;
    exactly when stride is None), then the strided ones exactly (refinement). Each (layer,
    stride) appears once."""
    if selected not in layers:
        raise ValueError(f"layer {selected} is not among the layers {layers}")
    others = [i for i in layers if i != selected]
    tasks = [(selected, first)] if first is not None else []
    tasks += [(selected, None)] + [(i, stride) for i in others]
    if stride is not None:
        tasks += [(i, None) for i in others]
    return tasks
