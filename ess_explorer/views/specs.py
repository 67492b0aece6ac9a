"""Vega-Lite specs of an ESSResult: the five linked views of the explorer, and each alone.

Every builder takes an `ESSResult` and view options (checked once into a `ViewState`,
state.py) and returns an Altair chart that reads named datasets (data.py); the widget, the
report, the exporters and the CLI draw these same specs. The five views:

    ess_over_time     ESS per position t (tokens on hover), TSS drawn with it, separators marked
    spectrum          sigma_k(H_t) at the selected t, log scale, tolerance as a rule, count stated
    operator_heatmap  log10 |T| of one unit, H_t = T[t:, :t] outlined (block-downsampled when large)
    overview          layer x position heatmap of ESS/TSS (or ESS); a click selects a layer
    diagnostics_chart per-layer utilisation with saturation/collapse thresholds, modulation at separators

linked.py puts them in one spec whose params link them in the browser. Conventions:
0-based t, H_t = T[t:, :t] (docs/math.md).
"""

from __future__ import annotations

import altair as alt

from ..core.diagnostics import COLLAPSED_AT, SATURATED_AT
from ..result import ESSResult
from .data import (
    DATASETS,
    MAX_SPECTRUM_K,
    diagnostics_rows,
    floor_note,
    focus_unit,
    layer_axis_title,
    operator_block_size,
    overview_cell_stride,
    overview_rows,
    start_position,
    state_data,
    thresholds_data,
)
from .params import (
    ESS_COLOR,
    SELECT_COLOR,
    SEP_COLOR,
    STATE_COLORS,
    TSS_COLOR,
    ViewNames,
    hover_selection,
    layer_selection,
    named,
    standalone,
    t_selection,
    unit_label,
)
from .state import ViewState

__all__ = ["ViewNames", "ess_over_time", "spectrum", "operator_heatmap", "overview", "diagnostics_chart"]

# Rows of the layer panels (overview, diagnostics): 22 px each up to 20 layers, then smaller so
# a deep model stays about 440 px tall, never below the 12 px that an 11 px label needs.
ROW_STEP, ROW_STEP_MIN, ROWS_HEIGHT = 22, 12, 440
# The most ESS a unit can show at t (core/diagnostics.attainable_ceiling), drawn with ESS and
# TSS; its formula depends on the variant, so the legend names it and the data states it
# (labels.ceiling_label, beside the variant's name).
CEILING = "attainable ceiling"
CEILING_COLOR = "#7f7f7f"


def row_step(result: ESSResult) -> int:
    """Pixels per layer row of the overview and the diagnostics (the same, so rows align)."""
    return max(ROW_STEP_MIN, min(ROW_STEP, ROWS_HEIGHT // max(1, len(result.layers))))


def layer_y(result: ESSResult, **axis) -> alt.Y:
    """The layer axis of the overview and the diagnostics panels: rows in numeric layer order.

    The sort takes op "min": a layered panel unions the domains of its layers, and Vega-Lite
    drops a sort by a field with the default op there, falling back to sorting the labels as
    text (0, 1, 10, 11, ..., 2). Labels that would overlap (a figure's fixed height) are
    thinned by Vega ("greedy"), never drawn over each other."""
    return alt.Y(
        "label:N",
        title=layer_axis_title(result),
        sort=alt.EncodingSortField("layer", op="min", order="ascending"),
        axis=alt.Axis(labelOverlap="greedy", **axis),
    )


# ---------------------------------------------------------------- view 1 --------------
def ess_over_time_panel(result, layer, unit, names, t0, width=720, height=190):
    lay = result.layer(layer)
    sel_t, hover = t_selection(names, t0), hover_selection(names)
    x = alt.X("t:Q", title="position t", scale=alt.Scale(domain=[0, max(result.length - 1, 1)], nice=False))
    base = alt.Chart(named("time"))
    series = base.transform_fold(["ess", "ceiling", "tss"], as_=["series", "value"]).transform_calculate(
        series=f"datum.series === 'ess' ? 'ESS' : datum.series === 'tss' ? 'TSS (capacity)' : '{CEILING}'"
    )
    domain = ["ESS", CEILING, "TSS (capacity)"]
    lines = series.mark_line(strokeWidth=2).encode(
        x=x,
        y=alt.Y("value:Q", title="state size"),
        color=alt.Color(
            "series:N",
            scale=alt.Scale(domain=domain, range=[ESS_COLOR, CEILING_COLOR, TSS_COLOR]),
            legend=alt.Legend(orient="none", legendX=0, legendY=-20, title=None, direction="horizontal"),
        ),
        strokeDash=alt.StrokeDash(
            "series:N", scale=alt.Scale(domain=domain, range=[[1, 0], [2, 2], [5, 3]]), legend=None
        ),
    )
    points = (
        base.mark_point(filled=True)
        .encode(
            x=x,
            y="ess:Q",
            color=alt.condition(sel_t, alt.value(SELECT_COLOR), alt.value(ESS_COLOR)),
            opacity=alt.condition("datum.exact", alt.value(0.9), alt.value(0.35)),  # faint: a lower bound
            size=alt.condition(sel_t, alt.value(110), alt.value(22)),
            # numbers only: the tooltip of a nearest (voronoi) point selection shows a string field
            # as "undefined" (checked in Chromium); the hovered token is drawn as text at the top
            # of the plot instead, and the subtitle says so
            tooltip=[
                alt.Tooltip("t:Q", title="t"),
                alt.Tooltip("ess:Q", title="ESS", format=".3~f"),
                alt.Tooltip("tss:Q", title="TSS", format=".3~f"),
                alt.Tooltip("ceiling:Q", title="ceiling", format=".3~f"),
            ],
        )
        .add_params(sel_t, hover)
    )
    seps = (
        base.transform_filter("datum.sep")
        .mark_rule(color=SEP_COLOR, strokeDash=[3, 2], strokeWidth=1.5)
        .encode(x=x, tooltip=[alt.Tooltip("t:Q"), alt.Tooltip("token:N", title="separator")])
    )
    hover_rule = base.transform_filter(hover).mark_rule(color="#555", strokeWidth=1).encode(x=x)
    hover_text = (
        base.transform_filter(hover)
        .mark_text(align="left", dx=6, fontSize=13, fontWeight="bold", color="#333")
        .encode(x=x, y=alt.value(10), text="token:N")
    )
    selected_rule = base.transform_filter(sel_t).mark_rule(color=SELECT_COLOR, strokeWidth=2).encode(x=x)
    selected_text = (
        base.transform_filter(sel_t)
        .transform_calculate(label="'t = ' + datum.t + ' \u201c' + datum.token + '\u201d'")
        .mark_text(align="left", dx=6, dy=14, fontSize=11, color=SELECT_COLOR)
        .encode(x=x, y=alt.value(10), text="label:N")
    )
    variant = (
        alt.Chart(named("labels"))
        .transform_calculate(text="datum.variant + ' · ' + datum.ceiling")
        .mark_text(align="right", fontSize=12, color=ESS_COLOR, fontWeight="bold")
        .encode(x=alt.value(width), y=alt.value(-8), text="text:N")
    )
    stride = result.meta.get("stride")
    subtitle = (
        f"layer {layer} ({lay.family}), {unit_label(lay, unit)} · click to select t · "
        "hover: the token at the top · "
        "orange: separators" + (f" · computed at stride {stride}" if stride and stride > 1 else "")
    )
    return alt.layer(lines, seps, hover_rule, selected_rule, points, hover_text, selected_text, variant).properties(
        width=width, height=height, title=alt.Title("ESS over time", subtitle=subtitle, anchor="start", offset=28)
    )


def ess_over_time(
    result: ESSResult,
    *,
    layer: int,
    unit="mean",
    variant: str = "tolerance",
    tol=None,
    relative=None,
    t: int | None = None,
    names: ViewNames | None = None,
) -> alt.LayerChart:
    """ESS(t) of the chosen unit or aggregate with TSS(t) dashed and separators as orange
    rules. Hover shows the token; a click selects t (param ``names.t``, a point selection
    on field "t", initially ``t`` or the ESS peak). Faint points are lower bounds (a
    recomputed tolerance count that reached the number of kept values)."""
    state = ViewState.of(result, layer=layer, unit=unit, variant=variant, tol=tol, relative=relative, t=t)
    names = names or ViewNames.fresh()
    t0 = start_position(result, state)
    return standalone(
        ess_over_time_panel(result, layer, unit, names, t0), state_data(result, state), ("time", "labels")
    )


# ---------------------------------------------------------------- view 2 --------------
# Up to this many singular values, every k gets its own tick (Vega's own ticks at such a
# small domain fall on halves, which the integer format prints twice: "1 1 2 2 3").
K_TICKS_ALL = 16


def k_axis(kmax: int) -> alt.Axis:
    """The k axis of a spectrum: one tick per integer k for a few values, else Vega's ticks
    at integer steps."""
    if kmax <= K_TICKS_ALL:
        return alt.Axis(values=list(range(1, kmax + 1)), format="d")
    return alt.Axis(tickMinStep=1, format="d")


def spectrum_panel(result, layer, unit, names, t0, width=360, height=230):
    lay = result.layer(layer)
    sel_t = t_selection(names, t0)
    base = alt.Chart(named("time")).transform_filter(sel_t)
    flat = (
        base.transform_flatten(["sigma"])
        .transform_window(k="row_number()")
        .transform_filter("datum.sigma > 0")
        .transform_calculate(above="datum.thr != null && datum.sigma > datum.thr ? 'above τ' : 'below τ'")
    )
    kmax = max(1, min(MAX_SPECTRUM_K, int(lay.singular_values.shape[-1])))
    x = alt.X(
        "k:Q",
        title="k (σ in descending order)",
        scale=alt.Scale(domain=[0.5, kmax + 0.5], nice=False),
        axis=k_axis(kmax),
    )
    y = alt.Y("sigma:Q", title="σₖ(Hₜ)", scale=alt.Scale(type="log"))
    line = flat.mark_line(strokeWidth=1.2, color="#9aa3ad").encode(x=x, y=y, order="k:Q")
    dots = flat.mark_circle(size=48, opacity=1).encode(
        x=x,
        y=y,
        color=alt.Color(
            "above:N",
            scale=alt.Scale(domain=["above τ", "below τ"], range=[ESS_COLOR, "#b8bec7"]),
            legend=alt.Legend(orient="top-right", title=None),
        ),
        tooltip=[alt.Tooltip("k:Q"), alt.Tooltip("sigma:Q", title="σ", format=".4~e"), alt.Tooltip("above:N")],
    )
    rule = (
        base.transform_filter("datum.thr != null")
        .mark_rule(color=SELECT_COLOR, strokeDash=[6, 3], strokeWidth=1.5)
        .encode(
            y="thr:Q",
            tooltip=[alt.Tooltip("thr:Q", title="τ", format=".3~e"), alt.Tooltip("tol_label:N", title="tolerance")],
        )
    )
    # The count above the plot, stated for the drawn unit in the shown variant, and for an
    # aggregate curve its own value at t inside the plot (data.py builds both texts, labels.py
    # words them): a new tolerance or variant needs no new spec.
    focus = focus_unit(result, layer, unit)
    drawn = f"{lay.unit_kind} {focus}"
    label = (
        base.transform_calculate(
            label=f"'t = ' + datum.t + ' \u201c' + datum.token + '\u201d · {drawn}\\n' + datum.count_label"
        )
        .mark_text(align="left", baseline="bottom", fontSize=11, fontWeight="bold", color="#222", lineBreak="\n")
        .encode(x=alt.value(0), y=alt.value(-10), text="label:N")  # clear of the top tick label
    )
    curve = (
        base.transform_filter("datum.curve_label != ''")
        .mark_text(align="left", baseline="bottom", fontSize=11, color=ESS_COLOR)
        .encode(x=alt.value(4), y=alt.value(height - 4), text="curve_label:N")
    )
    if isinstance(unit, str):
        first = f"{lay.unit_kind} {focus} drawn, one of the {lay.n_units} the curve's {unit} is over"
    else:
        first = f"{lay.unit_kind} {focus}, the unit of the curve"
    notes = ["red dashed: τ"]
    if lay.singular_values.shape[-1] > kmax or (lay.rank_bound[focus] > kmax).any():
        notes.append(f"top {kmax} kept")
    if floor_note(result):
        notes.append(floor_note(result))
    sub = [first, " · ".join(notes)]  # two short lines: a long one would widen the panel
    return alt.layer(line, dots, rule, label, curve).properties(
        width=width,
        height=height,
        title=alt.Title("Singular values of Hₜ = T[t:, :t]", subtitle=sub, anchor="start", offset=38),
    )


def spectrum(
    result: ESSResult,
    *,
    layer: int,
    unit="mean",
    variant: str = "tolerance",
    tol=None,
    relative=None,
    t: int | None = None,
    names: ViewNames | None = None,
) -> alt.LayerChart:
    """Kept singular values sigma_k(H_t) of the focus unit (see `focus_unit`) at the
    selected t on a log scale, the tolerance as a dashed rule, and the count above it
    stated. Standalone it carries its own t param (initially ``t``); inside
    `linked_views` it follows the click on ESS over time."""
    state = ViewState.of(result, layer=layer, unit=unit, variant=variant, tol=tol, relative=relative, t=t)
    names = names or ViewNames.fresh()
    t0 = start_position(result, state)
    chart = spectrum_panel(result, layer, unit, names, t0).add_params(t_selection(names, t0))
    return standalone(chart, state_data(result, state), ("time",))


# ---------------------------------------------------------------- view 3 --------------
def operator_panel(result, layer, unit, names, t0, size=270):
    lay = result.layer(layer)
    focus = focus_unit(result, layer, unit)
    sel_t = t_selection(names, t0)
    length = result.length
    if focus not in lay.operators:
        msg = f"T of {lay.unit_kind} {focus} was not kept by the analysis"
        note = (
            alt.Chart(alt.InlineData(values=[{"msg": msg}])).mark_text(fontSize=12, color="#666").encode(text="msg:N")
        )
        return note.properties(width=size, height=size, title=alt.Title("Operator T", anchor="start"))
    block = operator_block_size(lay, length)
    scale_x = alt.Scale(domain=[0, length], nice=False, zero=True)
    scale_y = alt.Scale(domain=[0, length], nice=False, zero=True, reverse=True)  # row 0 on top, as a matrix
    heat = (
        alt.Chart(named("operator"))
        .mark_rect()
        .encode(
            x=alt.X("j0:Q", title="input position j", scale=scale_x),
            x2="j1:Q",
            y=alt.Y("i0:Q", title="output position i", scale=scale_y),
            y2="i1:Q",
            color=alt.Color(
                "rel:Q",
                title=["log₁₀|T|", "rel. to max"],
                scale=alt.Scale(scheme="viridis", domain=[-6, 0], clamp=True),
                legend=alt.Legend(orient="right", gradientLength=110),
            ),
            tooltip=[
                alt.Tooltip("i0:Q", title="row i"),
                alt.Tooltip("j0:Q", title="column j"),
                alt.Tooltip("logabs:Q", title="log₁₀ max|T|"),
            ],
        )
    )
    outline = (
        alt.Chart(named("time"))
        .transform_filter(sel_t)
        .transform_calculate(zero="0", end=str(length))
        .mark_rect(fill=None, stroke=SELECT_COLOR, strokeWidth=2.5)
        .encode(x=alt.X("zero:Q", scale=scale_x), x2="t:Q", y=alt.Y("t:Q", scale=scale_y), y2="end:Q")
    )
    sub = f"{lay.unit_kind} {focus} · red box: Hₜ = T[t:, :t]"
    if block > 1:
        sub += f" · {block}×{block} blocks (max |T|)"
    return alt.layer(heat, outline).properties(
        width=size, height=size, title=alt.Title("Operator T", subtitle=sub, anchor="start")
    )


def operator_heatmap(
    result: ESSResult,
    *,
    layer: int,
    unit="mean",
    variant: str = "tolerance",
    tol=None,
    relative=None,
    t: int | None = None,
    names: ViewNames | None = None,
) -> alt.LayerChart:
    """log10 |T| of the focus unit (rows i = outputs, columns j = inputs, row 0 on top)
    with H_t = T[t:, :t] outlined at the selected t. An operator longer than
    MAX_OPERATOR_SIDE is sent as max-|T| blocks (stated in the subtitle), never L^2 cells.
    A unit whose T was not kept shows a note instead."""
    state = ViewState.of(result, layer=layer, unit=unit, variant=variant, tol=tol, relative=relative, t=t)
    names = names or ViewNames.fresh()
    t0 = start_position(result, state)
    chart = operator_panel(result, layer, unit, names, t0).add_params(t_selection(names, t0))
    return standalone(chart, state_data(result, state), ("time", "operator"))


# ---------------------------------------------------------------- view 4 --------------
def overview_panel(result, layer, unit, metric, names, width=360):
    sel_layer = layer_selection(names, layer)
    agg = unit if isinstance(unit, str) else "mean"
    what = "ESS/TSS" if metric == "utilisation" else "ESS"
    scale = (
        alt.Scale(scheme="blues", domain=[0, 1], clamp=True) if metric == "utilisation" else alt.Scale(scheme="blues")
    )
    stride = overview_cell_stride(result)  # cells drawn
    notes = ["click a row to select a layer"]
    if stride > 1:
        notes.append(f"shown at stride {stride}")
    computed_stride = result.meta.get("overview_stride")
    analysis_stride = result.meta.get("stride")
    if computed_stride and computed_stride > 1:
        notes.append(f"layers computed at stride {computed_stride}, the selected layer exactly")
    elif analysis_stride and analysis_stride > 1:
        notes.append(f"computed at stride {analysis_stride}")
    return (
        alt.Chart(named("overview"))
        .mark_rect()
        .encode(
            x=alt.X("t0:Q", title="position t", scale=alt.Scale(domain=[0, result.length], nice=False)),
            x2="t1:Q",
            y=layer_y(result),
            color=alt.Color("value:Q", title=what, scale=scale, legend=alt.Legend(gradientLength=80)),
            stroke=alt.condition(sel_layer, alt.value(SELECT_COLOR), alt.value(None)),
            strokeWidth=alt.condition(sel_layer, alt.value(0.8), alt.value(0)),
            tooltip=[
                alt.Tooltip("label:N", title="layer"),
                alt.Tooltip("t0:Q", title="t"),
                alt.Tooltip("token:N"),
                alt.Tooltip("value:Q", title=what, format=".3~f"),
            ],
        )
        .add_params(sel_layer)
        .properties(
            width=width,
            height=alt.Step(row_step(result)),
            title=alt.Title(
                f"Overview: {what} per layer ({agg} over units)", subtitle=" · ".join(notes), anchor="start"
            ),
        )
    )


def overview(
    result: ESSResult,
    *,
    layer: int | None = None,
    unit="mean",
    variant: str = "tolerance",
    tol=None,
    relative=None,
    metric: str = "utilisation",
    names: ViewNames | None = None,
) -> alt.Chart:
    """Layer x position heatmap of the aggregate ESS/TSS (metric="utilisation") or ESS
    (metric="ess"). A click on a row selects the layer (param ``names.layer``, a point
    selection on field "layer"); the selected row is outlined. Above MAX_OVERVIEW_CELLS
    cells every s-th position is shown and the subtitle says so."""
    state = ViewState.of(
        result,
        layer=layer,
        unit=unit if isinstance(unit, str) else "mean",
        variant=variant,
        tol=tol,
        relative=relative,
        metric=metric,
    )
    names = names or ViewNames.fresh()
    data = {DATASETS["overview"]: overview_rows(result, state)}
    return standalone(overview_panel(result, state.layer, state.unit, metric, names), data, ("overview",))


# ---------------------------------------------------------------- view 5 --------------
def diagnostics_panel(result, layer, names):
    highlight = layer_selection(names, layer)  # the overview's selection, referenced by name
    data = alt.Chart(named("diagnostics"))
    y = layer_y(result)
    step = alt.Step(row_step(result))
    bars = data.mark_bar(height={"band": 0.72}).encode(
        x=alt.X("utilisation:Q", title="utilisation (peak ESS / peak ceiling)", scale=alt.Scale(domain=[0, 1])),
        y=y,
        color=alt.Color(
            "state:N",
            scale=alt.Scale(domain=list(STATE_COLORS), range=list(STATE_COLORS.values())),
            legend=alt.Legend(orient="bottom", title=None),
        ),
        opacity=alt.condition(highlight, alt.value(1.0), alt.value(0.45)),
        tooltip=[
            alt.Tooltip("label:N", title="layer"),
            alt.Tooltip("utilisation:Q", title="of the ceiling", format=".3f"),
            alt.Tooltip("tss_utilisation:Q", title="ESS/TSS (paper)", format=".3f"),
            alt.Tooltip("state:N"),
            alt.Tooltip("n_saturated:Q", title="saturated units"),
            alt.Tooltip("n_collapsed:Q", title="collapsed units"),
            alt.Tooltip("n_units:Q", title="units"),
        ],
    )
    undefined = (
        data.transform_filter("datum.utilisation == null")
        .mark_text(align="left", fontSize=10, color="#777")
        .encode(x=alt.value(4), y=y, text=alt.value("not defined for this variant"))
    )
    thresholds = alt.Chart(named("thresholds"))
    rules = thresholds.mark_rule(strokeDash=[4, 3], color="#444").encode(x="x:Q")
    # the upper threshold's name to its left, the lower one's to its right: both stay inside
    upper = (
        thresholds.transform_filter("datum.x >= 0.5")
        .mark_text(align="right", dx=-3, dy=-4, fontSize=10, color="#444", baseline="bottom")
        .encode(x="x:Q", y=alt.value(0), text="name:N")
    )
    lower = (
        thresholds.transform_filter("datum.x < 0.5")
        .mark_text(align="left", dx=3, dy=-4, fontSize=10, color="#444", baseline="bottom")
        .encode(x="x:Q", y=alt.value(0), text="name:N")
    )
    util = alt.layer(bars, undefined, rules, upper, lower).properties(
        width=220,
        height=step,
        title=alt.Title(
            "Utilisation per layer",
            subtitle="peak ESS / peak of its attainable ceiling per unit, mean over units",
            anchor="start",
            offset=16,
        ),
    )
    y_mod = layer_y(result, labels=False, title=None)
    mod = (
        data.transform_filter("datum.modulation != null")
        .mark_bar(height={"band": 0.72}, color=SEP_COLOR)
        .encode(
            x=alt.X("modulation:Q", title="modulation at separators", scale=alt.Scale(domain=[-0.5, 1], clamp=True)),
            y=y_mod,
            opacity=alt.condition(highlight, alt.value(1.0), alt.value(0.45)),
            tooltip=[
                alt.Tooltip("label:N", title="layer"),
                alt.Tooltip("modulation:Q", format=".3f"),
                alt.Tooltip("graded_modulation:Q", title="graded (nuclear norm)", format=".3f"),
                alt.Tooltip("n_separators:Q", title="separators"),
            ],
        )
    )
    none = (
        data.transform_filter("datum.n_separators == 0")
        .mark_text(align="left", fontSize=10, color="#777")
        .encode(x=alt.value(4), y=y_mod, text=alt.value("no separator in the prompt"))
    )
    mod = alt.layer(mod, none).properties(
        width=130,
        height=step,
        title=alt.Title("Modulation", subtitle="1 − ESS(sep) / ESS before", anchor="start", offset=16),
    )
    return alt.hconcat(util, mod, spacing=8)


def diagnostics_chart(
    result: ESSResult,
    *,
    layer: int | None = None,
    variant: str = "tolerance",
    tol=None,
    relative=None,
    saturated: float = SATURATED_AT,
    collapsed: float = COLLAPSED_AT,
    names: ViewNames | None = None,
) -> alt.HConcatChart:
    """Per layer: utilisation (diagnostics.layer_diagnostics: per unit the ratio of the
    peaks over t, max ESS / max attainable ceiling min(TSS, t, L - t); mean over units) coloured saturated / normal / collapsed with both thresholds drawn and named, and
    the mean modulation at separators (diagnostics.layer_modulation, reset-aware). Standalone, the layer
    ``layer`` is highlighted with a fixed selection of the same name as the overview's."""
    state = ViewState.of(
        result, layer=layer, variant=variant, tol=tol, relative=relative, saturated=saturated, collapsed=collapsed
    )
    names = names or ViewNames.fresh()
    layer = state.layer
    data = {DATASETS["diagnostics"]: diagnostics_rows(result, state), DATASETS["thresholds"]: thresholds_data(state)}
    chart = diagnostics_panel(result, layer, names)
    # the highlight references names.layer: define it here (no overview to define it)
    chart = alt.hconcat(
        *[c.add_params(layer_selection(names, layer)) if i == 0 else c for i, c in enumerate(chart.hconcat)], spacing=8
    )
    return standalone(chart, data, ("diagnostics", "thresholds"))
