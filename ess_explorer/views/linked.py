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
from .data import start_position, state_data
from .params import CONVENTION_SHORT, ViewNames
from .specs import diagnostics_panel, ess_over_time_panel, operator_panel, overview_panel, spectrum_panel
from .state import ViewState

__all__ = ["linked_structure", "linked_views"]


def linked_structure(
    result: ESSResult, *, layer: int, unit="mean", t: int, names: ViewNames, overview_metric: str = "utilisation"
):
    """The five views in one top-level chart that reads the named datasets of
    `linked_data` but carries none: the widget pairs it with data it can replace."""
    ViewState.of(result, layer=layer, unit=unit, metric=overview_metric)  # the structure needs layer and unit only
    top = ess_over_time_panel(result, layer, unit, names, t)
    spec = spectrum_panel(result, layer, unit, names, t)
    op = operator_panel(result, layer, unit, names, t)
    ov = overview_panel(result, layer, unit, overview_metric, names)
    diag = diagnostics_panel(result, layer, names)
    model = result.meta.get("source") or result.meta.get("model_id") or ""
    return (
        alt.vconcat(
            top,
            alt.hconcat(spec, op, spacing=50),
            alt.hconcat(ov, diag, spacing=24),
            spacing=26,
        )
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
):
    """The five views in one top-level spec with its data (for alt.JupyterChart or a
    standalone HTML).

    Params (names from ``names``; fresh unique ones by default, so several charts in one
    notebook never share a signal): ``names.t`` (point on "t", set by a click on ESS over
    time; the spectrum and the H_t outline follow it in the browser), ``names.hover``
    (hover, browser only) and ``names.layer`` (point on "layer", set by a click on the
    overview; the widget answers by showing that layer)."""
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
        result, layer=layer, unit=unit, t=t0, names=names, overview_metric=overview_metric
    ).properties(datasets=state_data(result, state))
