"""The explorer's chart: one alt.JupyterChart of the linked views, redrawn for a view state.

A redraw splits into the spec's structure (the marks, encodings and params of the views for
one result, layer, unit and overview metric: built once and cached, views/charts.py) and
its data (recomputed from the kept singular values for the tolerance, variant and the
selected t). The first structure builds the JupyterChart, which validates the spec once;
later ones come from the same builders and skip the schema walk. A selection made in the
browser (the position t on ESS over time, a layer on the overview) is read through
``JupyterChart.selections`` and handed to the callbacks. The panels are drawn as wide as the
output area allows (app/fit.py: measured in the browser, ``on_resize`` redraws).
"""

from __future__ import annotations

import time
from typing import Callable

import altair as alt
import ipywidgets as W
import numpy as np

from ..result import ESSResult
from ..views import charts
from .controls import with_selection
from .fit import ChartFit, WidthProbe, scaled_spec
from .static import sync_only

__all__ = ["LiveChart", "shown_position"]


def view_settings(e) -> dict:
    """Explorer ``e``'s view settings as the view builders take them."""
    scope = e.scope if e.relative else "cut"  # an absolute tolerance has no reference sigma_1
    return dict(layer=e.layer, unit=e.unit, variant=e.variant, tol=e.tol, relative=e.relative, scope=scope)


def shown_position(e, view: dict | None = None) -> int:
    """The cut t explorer ``e`` shows: the one selected in the browser, else the one the
    views open on, snapped to the nearest computed cut of the shown layer."""
    view = view or view_settings(e)
    t = e.selected_t if e.selected_t is not None else charts.default_position(e.result, **view)
    positions = np.asarray(e.result.layer(e.layer).positions)
    return int(positions[int(np.argmin(np.abs(positions - t)))])


class LiveChart:
    """The chart in ``box``. ``on_t(t)`` and ``on_layer(layer)`` receive the browser's selections;
    ``on_resize()`` redraws when the output area's width asks for other panel widths."""

    def __init__(
        self,
        box: W.Box,
        *,
        on_t: Callable[[int], None],
        on_layer: Callable[[int], None],
        on_resize: Callable[[], None] = lambda: None,
    ):
        self.box, self.on_t, self.on_layer = box, on_t, on_layer
        self.probe = WidthProbe()
        self.fit = ChartFit(self.probe, on_resize)
        box.children = [self.probe]
        self.names = charts.ViewNames.fresh()  # unique params: explorers in one notebook never interfere
        self.chart: alt.JupyterChart | None = None
        self.last_update_s: float | None = None  # seconds of the last redraw (for measurement)
        self._structures: dict[tuple, dict] = {}

    def forget(self) -> None:
        """A new result: the cached structures belong to the previous one."""
        self._structures.clear()

    def draw(self, e) -> None:
        """Redraw explorer ``e``'s state: its result at its layer, unit, variant, tolerance
        (relative, scope), overview metric, selected t and thresholds."""
        started, result = time.perf_counter(), e.result
        view = view_settings(e)
        metric = e.overview_metric
        data = charts.linked_data(result, saturated=e.saturated, collapsed=e.collapsed, overview_metric=metric, **view)
        t = shown_position(e, view)
        structure = self._structure(result, view, metric)
        structure = scaled_spec(structure, self.fit.scale, stacked=self.fit.stacked)
        self.chart.spec = with_selection(structure, data, self.names, t=t, layer=int(e.layer))
        self.last_update_s = time.perf_counter() - started

    def _structure(self, result: ESSResult, view: dict, metric: str) -> dict:
        """The spec without data, cached. The key holds what of a progressing result the
        structure reads (its overview stride, how many layers, whether the shown layer is
        exact yet); the rest is the prompt's."""
        meta, layer, unit = result.meta, view["layer"], view["unit"]
        key = (
            layer,
            unit,
            metric,
            meta.get("overview_stride"),
            meta.get("stride"),
            len(result.layers),
            len(result.layer(layer).positions),
        )
        if key not in self._structures:
            t0 = charts.default_position(result, **view)
            chart = charts.linked_structure(
                result, layer=layer, unit=unit, t=t0, names=self.names, overview_metric=metric
            )
            if self.chart is None:
                self._make_chart(chart)  # JupyterChart validates the spec once
                self._structures[key] = self.chart.spec
            else:  # same builders, validated by the first spec and the chart tests: skip the schema walk
                self._structures[key] = chart.to_dict(validate=False)
        return self._structures[key]

    def _make_chart(self, chart) -> None:
        self.chart = alt.JupyterChart(
            chart,
            embed_options={
                "renderer": "svg",
                "actions": {"export": True, "source": False, "compiled": False, "editor": False},
            },
        )
        sync_only(self.chart, {self.names.t, self.names.layer})
        self.chart.selections.observe(self._on_selection, names=[self.names.t, self.names.layer])
        self.box.children = [self.probe, self.chart]

    def _on_selection(self, change) -> None:
        """A selection made in the browser (JupyterChart.selections, Altair's public API)."""
        value = change["new"].value if change["new"] is not None else None
        if not value:
            return
        row = value[0] if isinstance(value, list) else value
        if change["name"] == self.names.t and row.get("t") is not None:
            self.on_t(int(row["t"]))
        elif change["name"] == self.names.layer and row.get("layer") is not None:
            self.on_layer(int(row["layer"]))
