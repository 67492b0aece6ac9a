"""The five views of the explorer in ONE linked Vega-Lite spec.

`linked_views` puts ESS over time, the spectrum, the operator, the overview and the
diagnostics (specs.py) in one top-level spec whose params link them in the browser:
selecting t on ESS over time moves the spectrum and the H_t outline with no call into
Python; a click on the overview selects a layer (the widget answers by redrawing).
`linked_structure` is the same chart without data: the widget pairs it with the named
datasets of data.linked_data, which it replaces when an option changes.
"""

from __future__ import annotations

import altair as alt

from ..core.diagnostics import COLLAPSED_AT, SATURATED_AT
from ..result import ESSResult
from .data import DATASETS, layer_datasets, start_position, state_data
from .params import CONVENTION_SHORT, ViewNames
from .specs import diagnostics_panel, ess_over_time_panel, operator_panel, overview_panel, spectrum_panel
from .state import ViewState

__all__ = ["linked_structure", "linked_views", "linked_views_per_layer"]


# The narrowest `max_width` the narrow layout is drawn for: below it labels would collide.
MIN_WIDTH = 640
# Pixels around the plots of a row of the narrow layout that are not plot: axis labels and
# titles, legends and the spacing between panels (measured on the synthetic reference).
_TOP_MARGIN, _DETAIL_MARGIN, _OVERVIEW_MARGIN = 110, 300, 230


def linked_structure(
    result: ESSResult,
    *,
    layer: int,
    unit="mean",
    t: int,
    names: ViewNames,
    overview_metric: str = "utilisation",
    max_width: int | None = None,
):
    """The five views in one top-level chart that reads the named datasets of
    `linked_data` but carries none: the widget pairs it with data it can replace.

    ``max_width`` None: the wide layout (about 1,250 px: ESS over time above the spectrum and
    the operator, the overview beside the diagnostics). A number of pixels (at least
    MIN_WIDTH): the narrow layout, every panel sized to fit it and the diagnostics under the
    overview (a report page at 900 px, a narrow notebook column)."""
    ViewState.of(result, layer=layer, unit=unit, metric=overview_metric)  # the structure needs layer and unit only
    if max_width is not None and (
        isinstance(max_width, bool) or not isinstance(max_width, int) or max_width < MIN_WIDTH
    ):
        raise ValueError(
            f"max_width must be None (the wide layout) or an int of at least {MIN_WIDTH} px, got {max_width!r}"
        )
    if max_width is None:
        top = ess_over_time_panel(result, layer, unit, names, t)
        spec = spectrum_panel(result, layer, unit, names, t)
        op = operator_panel(result, layer, unit, names, t)
        ov = overview_panel(result, layer, unit, overview_metric, names)
        rows = [
            top,
            alt.hconcat(spec, op, spacing=50),
            alt.hconcat(ov, diagnostics_panel(result, layer, names), spacing=24),
        ]
    else:
        detail = max_width - _DETAIL_MARGIN
        top = ess_over_time_panel(result, layer, unit, names, t, width=max_width - _TOP_MARGIN)
        spec = spectrum_panel(result, layer, unit, names, t, width=int(detail * 0.56))
        op = operator_panel(result, layer, unit, names, t, size=int(detail * 0.44))
        ov = overview_panel(result, layer, unit, overview_metric, names, width=max_width - _OVERVIEW_MARGIN)
        rows = [top, alt.hconcat(spec, op, spacing=40), ov, diagnostics_panel(result, layer, names)]
    model = result.meta.get("source") or result.meta.get("model_id") or ""
    return (
        alt.vconcat(*rows, spacing=26)
        .properties(
            title=alt.Title(
                f"Effective state size · {model}" if model else "Effective state size",
                subtitle=f"{result.length} tokens · {len(result.layers)} layers analysed · {CONVENTION_SHORT}",
                anchor="start",
                fontSize=15,
            )
        )
        .configure_view(stroke=None)
        .configure_axis(gridOpacity=0.35, labelFontSize=11, titleFontSize=11)
        .configure_title(subtitleColor="#555", subtitleFontSize=11)
    )


def linked_views(
    result: ESSResult,
    *,
    layer: int,
    unit="mean",
    variant: str = "tolerance",
    tol=None,
    relative=None,
    saturated: float = SATURATED_AT,
    collapsed: float = COLLAPSED_AT,
    t: int | None = None,
    names: ViewNames | None = None,
    overview_metric: str = "utilisation",
    scope=None,
    max_width: int | None = None,
):
    """The five views in one top-level spec with its data (for alt.JupyterChart or a
    standalone HTML).

    Params (names from ``names``; fresh unique ones by default, so several charts in one
    notebook never share a signal): ``names.t`` (point on "t", set by a click on ESS over
    time; the spectrum and the H_t outline follow it in the browser), ``names.hover``
    (hover, browser only) and ``names.layer`` (point on "layer", set by a click on the
    overview; the widget answers by showing that layer). ``max_width``: see `linked_structure`."""
    state = ViewState.of(
        result,
        layer=layer,
        unit=unit,
        variant=variant,
        tol=tol,
        relative=relative,
        t=t,
        saturated=saturated,
        collapsed=collapsed,
        metric=overview_metric,
        scope=scope,
    )
    names = names or ViewNames.fresh()
    t0 = start_position(result, state)
    return linked_structure(
        result, layer=layer, unit=unit, t=t0, names=names, overview_metric=overview_metric, max_width=max_width
    ).properties(datasets=state_data(result, state))


def linked_views_per_layer(
    result: ESSResult, *, layer: int, names: ViewNames | None = None, max_width: int | None = None, **options
) -> tuple[dict, dict[int, dict]]:
    """The linked views of every analysed layer, for a page that shows the layer picked in the
    overview without Python (the report): (shared, specs). ``shared``: the datasets every
    layer's views read alike (overview, diagnostics, thresholds, labels); ``specs``: {layer:
    the linked spec of that layer as a dict, carrying only its own datasets (ESS over time
    with the spectra, the operator)}. A spec plus ``shared`` is `linked_views` of that layer.
    All use the same param names, so the overview's selection keeps its name across them.
    ``options``: those of `linked_views` (unit, variant, tol, ...); a unit index that a layer
    does not have means "mean" there. ``layer`` is checked like `linked_views`' and gives
    the shared datasets."""
    names = names or ViewNames.fresh()
    unit = options.pop("unit", "mean")
    metric = options.pop("overview_metric", "utilisation")
    first = ViewState.of(result, layer=layer, unit=unit, metric=metric, **options)
    every = state_data(result, first)
    own = (DATASETS["time"], DATASETS["operator"])
    shared = {name: rows for name, rows in every.items() if name not in own}
    specs = {}
    for index in sorted(result.layers):
        shown = unit if isinstance(unit, str) or unit < result.layers[index].n_units else "mean"
        state = first.with_(layer=index, unit=shown, t=first.t if index == first.layer else None)
        chart = linked_structure(
            result,
            layer=index,
            unit=shown,
            t=start_position(result, state),
            names=names,
            overview_metric=metric,
            max_width=max_width,
        )
        specs[index] = {**chart.to_dict(), "datasets": layer_datasets(result, state)}
    return shared, specs
