"""The order of an explorer run's work: the layer it opens on, which (layer, stride) tasks,
the strides of the first chart and of the overview, and how long the rest will take
(app/session.py runs them)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..result import ESSResult

__all__ = [
    "plan",
    "overview_stride",
    "first_chart_stride",
    "TaskClock",
    "opening_layer",
    "card_memory_layer",
    "tell_eta",
    "OVERVIEW_POSITIONS",
    "FIRST_CHART_FLOPS",
]

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


class TaskClock:
    """Seconds the remaining (layer, stride) tasks of a run will take, from the ones done.

    Cuts are not alike in cost: a layer at a stride costs more per cut than the same layer
    exactly (the engine picks another path by cost, and a layer's fixed work is spread over
    fewer cuts; measured: three times as much for attention at L = 523), and families differ by
    orders of magnitude. Counted in cuts alike, an LLM's remaining time reads about twice the
    real one. So the time per cut is kept per kind of task, (family, strided or exact), and a kind not
    seen yet is estimated from its family's other kind times the exact-to-strided ratio of a
    family where both were timed, else from its family, else from the same kind of other
    families, else from any task.
    """

    def __init__(self) -> None:
        self.per_cut: dict[tuple, list[float]] = {}  # (family, strided) -> seconds per cut of each task

    def record(self, family: str | None, stride: int | None, cuts: int, seconds: float) -> None:
        self.per_cut.setdefault((family, stride is not None), []).append(max(float(seconds), 0.0) / max(cuts, 1))

    def _rate(self, kind) -> float | None:
        values = self.per_cut.get(kind)
        return sum(values) / len(values) if values else None

    def estimate(self, family: str | None, stride: int | None, cuts: int) -> float | None:
        """Seconds for one task; None before any task is done."""
        strided = stride is not None
        rate = self._rate((family, strided))
        if rate is None and self._rate((family, not strided)) is not None:
            ratios = [
                self._rate((f, strided)) / self._rate((f, not strided))
                for f, s in self.per_cut
                if s == strided and self._rate((f, not strided))
            ]
            rate = self._rate((family, not strided)) * (sum(ratios) / len(ratios) if ratios else 1.0)
        if rate is None:
            same = [self._rate(kind) for kind in self.per_cut if kind[1] == strided]
            everything = [self._rate(kind) for kind in self.per_cut]
            pool = same or everything
            rate = sum(pool) / len(pool) if pool else None
        return None if rate is None else rate * max(cuts, 1)

    def remaining(self, tasks) -> float | None:
        """Seconds for ``tasks``: (family, stride, cuts) each; None before any task is done."""
        estimates = [self.estimate(*task) for task in tasks]
        return None if any(e is None for e in estimates) else float(sum(estimates))


def tell_eta(bar, seconds: float | None) -> None:
    """Give ``bar`` the session's estimate of the seconds left (TaskClock): the explorer's bar
    takes it as its ETA (``set_eta``); a tqdm bar shows it beside its own."""
    if seconds is None:
        return
    if hasattr(bar, "set_eta"):
        bar.set_eta(seconds)
    elif hasattr(bar, "set_postfix_str"):
        bar.set_postfix_str(f"about {seconds:.0f} s left")


def opening_layer(layers, result: ESSResult | None = None, *, source=None) -> tuple[int, str]:
    """(layer, why) the explorer opens on when none was asked for; ``why`` is one line for
    the status bar ("opens on layer 1: ...").

    1. A zoo model whose card names its memory layer (``source`` "zoo:NAME", else
       ``result.meta["source"]``; `card_memory_layer`): that layer, the one that carries the
       pairs from where they are stored to the queries.
    2. With every layer computed (``result``: a cached run), the layer whose units come closest
       to their attainable ceiling (core.diagnostics.layer_diagnostics: the highest utilisation
       against min(TSS, t, L - t)).
    3. Before any is computed, the middle layer: layer 0 of a deep LLM mostly mixes
       neighbouring tokens, the least informative picture it has.
    """
    layers = sorted(layers)
    if source is None and result is not None:
        source = result.meta.get("source")
    memory = card_memory_layer(source)
    if memory is not None and memory in layers:
        return memory, f"the memory layer of the model card of {source}"
    if result is not None and set(layers) <= set(result.layers):
        from ..core.diagnostics import layer_diagnostics

        scores = {i: layer_diagnostics(result.layer(i))["utilisation"] for i in layers}
        best = max(layers, key=lambda i: (scores[i], -i))
        return best, f"the highest utilisation against the ceiling min(TSS, t, L−t), {scores[best]:.2f}"
    if len(layers) <= 2:
        return layers[0], "the first layer"
    return layers[len(layers) // 2], f"the middle layer of {len(layers)}"


def card_memory_layer(source) -> int | None:
    """The memory layer a zoo model's card names (its "ess" section), for a "zoo:NAME"
    source; None for any other source, or a zoo model without a card."""
    if not isinstance(source, str) or not source.startswith("zoo:"):
        return None
    from ..sources import card, parse_source

    kind, name = parse_source(source)
    try:
        return int(card(name)["ess"]["memory_layer"]) if kind == "zoo" else None
    except (ValueError, KeyError, TypeError):  # no card (yet), or one without the field: fall back on the numbers
        return None
