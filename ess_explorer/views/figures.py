"""Publication figures of ESSResults: the figure kinds, drawn in the paper theme (theme.py).

``figure(result_or_results, kind, width=..., **kw)`` returns an Altair chart that fits the
stated width (single column 240 pt, double 504 pt, axes and legend included) with one font
family and no text below 7 pt; ``render.save_figure`` writes it as PDF, SVG or PNG.

Figure kinds; [w] = the widget's own view (specs.py) made print-ready by ``paperise``:
    "ess_time"     ESS over time, several layers and/or models overlaid (TSS and the attainable
                   ceiling min(TSS, t, L - t) optional), separators drawn as labelled rules
    "spectrum"     singular values of H_t of one unit: one t [w], or several t overlaid (values
                   below round-off, or the "ess" contract's resolution, are not drawn)
    "operator"     log10|T| of one kept unit, the cut H_t = T[t:, :t] outlined [w]
    "overview"     layer x position heatmap of ESS/TSS or ESS [w]
    "utilisation"  utilisation per layer (bar = mean over units, dots = units), thresholds;
                   against the ceiling or (against="tss") the paper's TSS; models side by side
    "diagnostics"  utilisation per layer by state, and modulation at separators [w] (stacked)
    "compare"      several models on one prompt: ESS over time and ESS per layer
    "advice"       per layer: ESS distribution, state, advised state (an Advice; views/advice.py)

Conventions are the project's (0-based t, H_t = T[t:, :t], ESS(0) = 0): docs/math.md.
"""

from __future__ import annotations

import inspect

import altair as alt
import numpy as np
import pandas as pd

from ..core.diagnostics import COLLAPSED_AT, SATURATED_AT
from ..options import AGGREGATES
from ..options import VARIANTS as ESS_VARIANTS
from ..result import ESSResult
from . import specs
from .advice import advice_figure
from .data import drawn_floor, family_name, floor_note, separator_positions
from .difficulty import difficulty_figure
from .frames import analysed_layers as _layers
from .frames import default_label as _default_label
from .frames import envelope, ess_over_time_frame, layer_summary_frame, spread
from .frames import series_of as _series
from .sweep_figures import SWEEP_KINDS
from .theme import (
    DASHES,
    FONTS,
    OKABE_ITO,
    PAPER_WIDTHS,
    apply_paper_theme,
    fit_width,
    paper_config,
    paperise,
    paperise_spec,
    spec_of,
    stacked,
    theme_spec,
    thin_layer_axes,
    to_chart,
    width_points,
)

__all__ = [
    "KINDS",
    "KIND_DOCS",
    "OKABE_ITO",
    "PAPER_WIDTHS",
    "FONTS",
    "paper_config",
    "apply_paper_theme",
    "paperise",
    "figure",
    "ess_over_time_frame",
    "layer_summary_frame",
]

# Above this many lines a legend entry per line outgrows the figure (and the palette):
# ess_time colours by layer on a gradient instead, one legend bar for any depth.
MANY_SERIES = len(OKABE_ITO)
# A layer axis along x: upright numbers, every other one (or fewer) left out where they would
# run together ("910", "1112" at 30 layers in one column).
LAYER_AXIS = alt.Axis(labelAngle=0, labelOverlap="greedy", labelFlush=False)
VARIANTS = ESS_VARIANTS  # tolerance, entropy, causal (core/ess.py)
_ = (DASHES, _default_label)  # re-exported names of the former single module


def _check(value, allowed, name):
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def _unit_word(result: ESSResult, layers) -> str:
    kinds = {result.layer(i).unit_kind for i in layers}
    return f"{kinds.pop()}s" if len(kinds) == 1 else "units"


def _y_title(variant: str, unit: str, units_word: str) -> str:
    word = {"mean": "mean", "sum": "total in scalars", "max": "max"}[unit]
    return f"{variant}-ESS ({word} over {units_word})"


def _series_scales(names, field: str = "series") -> tuple[alt.Color, alt.StrokeDash]:
    names = list(dict.fromkeys(names))
    colour = alt.Color(
        f"{field}:N",
        title=None,
        sort=names,
        scale=alt.Scale(domain=names, range=[OKABE_ITO[k % len(OKABE_ITO)] for k in range(len(names))]),
    )
    dash = alt.StrokeDash(
        f"{field}:N",
        title=None,
        sort=names,
        scale=alt.Scale(domain=names, range=[DASHES[k % len(DASHES)] for k in range(len(names))]),
    )
    return colour, dash


def _separator_positions(result: ESSResult, separators) -> list[int]:
    """Separators to mark: explicit positions, token strings, or (None) the widget's rule,
    specs.separator_positions: meta["separators"], else separator / EOS tokens."""
    if separators is False:
        return []
    if separators is None:
        return separator_positions(result)
    if isinstance(separators, str):
        separators = [separators]
    out = []
    for s in separators:
        if isinstance(s, str):
            out += [t for t, tok in enumerate(result.tokens) if tok == s]
        else:
            out.append(int(s))
    return sorted(set(out))


# ---- kinds ------------------------------------------------------------------------------
def _ess_time(
    results,
    *,
    layers=None,
    variant="tolerance",
    unit="mean",
    show_tss=False,
    show_ceiling=False,
    separators=None,
    legend="top",
):
    frame = ess_over_time_frame(results, layers=layers, variant=variant, unit=unit)
    series = _series(results)
    words = {_unit_word(r, _layers(r, layers)) for _, r in series}
    y_title = _y_title(variant, unit, words.pop() if len(words) == 1 else "units")
    horizontal = legend in ("top", "bottom")
    direction = "horizontal" if horizontal else "vertical"
    keys = alt.Legend(orient=legend, direction=direction, columns=2 if horizontal else 1, symbolType="stroke")
    if frame["series"].nunique() > MANY_SERIES and frame["layer"].nunique() > 1:
        encoding = {
            "color": alt.Color(
                "layer:Q",
                title="layer",
                scale=alt.Scale(scheme="viridis"),
                legend=alt.Legend(orient=legend, direction=direction),
            )
        }
        if frame["model"].nunique() > 1:  # the models by dash, the layers by colour
            encoding["strokeDash"] = _series_scales(frame["model"], "model")[1].legend(keys)
    else:
        colour, dash = _series_scales(frame["series"])
        encoding = {"color": colour.legend(keys), "strokeDash": dash.legend(keys)}
    frame = envelope(frame, ["series"])
    base = alt.Chart(frame)
    lines = base.mark_line().encode(
        x=alt.X("t:Q", title="position t", scale=alt.Scale(nice=False, zero=True)),
        y=alt.Y("ess:Q", title=y_title, scale=alt.Scale(zero=True)),
        detail="series:N",
        tooltip=["series:N", "t:Q", "token:N", alt.Tooltip("ess:Q", format=".2f")],
        **encoding,
    )
    layers_ = []
    seps = _separator_positions(series[0][1], separators) if len(series) == 1 else []
    if seps:
        layers_.append(
            alt.Chart(pd.DataFrame({"t": seps})).mark_rule(color="#999999", strokeDash=[2, 2]).encode(x="t:Q")
        )
        # the first rule says what the rules are (inside the plot, at its top)
        first = pd.DataFrame({"t": seps[:1], "label": ["separator"]})
        layers_.append(
            alt.Chart(first)
            .mark_text(align="left", baseline="top", dx=2, dy=1, color="#666666")
            .encode(x="t:Q", y=alt.value(0), text="label:N")
        )
    for shown, field, dash in ((show_tss, "tss", [1, 1.5]), (show_ceiling, "ceiling", [4, 2])):
        if shown:  # grey, thin: the capacity (dotted) and the attainable ceiling (dashed) behind ESS
            layers_.append(
                base.mark_line(color="#888888", strokeWidth=0.8, strokeDash=dash).encode(
                    x="t:Q", y=f"{field}:Q", detail="series:N"
                )
            )
    layers_.append(lines)
    return alt.layer(*layers_) if len(layers_) > 1 else lines


def _spectrum(results, *, layer=None, unit=0, positions=None, t=None, normalise=True, tol=None, legend="right"):
    """Spectra of H_t. One position (``t=`` or a single ``positions``) is the widget's view
    (specs.spectrum: values above/below the tolerance); several overlay one line each."""
    ((label, res),) = _one(results, "spectrum")
    layer = sorted(res.layers)[0] if layer is None else layer
    lay = res.layer(layer)
    if t is not None and positions is not None:
        raise ValueError("give t (one position) or positions (several), not both")
    single = (
        t
        if t is not None
        else (
            positions
            if isinstance(positions, (int, np.integer))
            else (positions[0] if positions is not None and len(positions) == 1 else None)
        )
    )
    if single is not None:
        if not isinstance(unit, (int, np.integer)) or not 0 <= unit < lay.n_units:
            raise ValueError(f"unit must be an integer in [0, {lay.n_units - 1}] for layer {layer}, got {unit!r}")
        if int(single) not in set(np.asarray(lay.positions).tolist()):
            raise ValueError(f"position {single} was not computed for layer {layer}")
        return specs.spectrum(res, layer=layer, unit=int(unit), t=int(single), tol=tol)
    if not isinstance(unit, (int, np.integer)) or not 0 <= unit < lay.n_units:
        raise ValueError(f"unit must be an integer in [0, {lay.n_units - 1}] for layer {layer}, got {unit!r}")
    pos = np.asarray(lay.positions)
    if positions is None:  # three interior cuts, a quarter, half and three quarters in
        positions = sorted({int(pos[int(round(q * (len(pos) - 1)))]) for q in (0.25, 0.5, 0.75)} - {0})
    positions = [positions] if isinstance(positions, (int, np.integer)) else list(positions)
    rows = []
    for t in positions:
        hits = np.flatnonzero(pos == t)
        if not hits.size:
            raise ValueError(
                f"position {t} was not computed for layer {layer}; computed positions {pos.min()}..{pos.max()}"
                f" (stride {int(pos[1] - pos[0]) if len(pos) > 1 else 1})"
            )
        stored = np.asarray(lay.singular_values[unit, hits[0]])
        sigma = stored.astype(np.float64)
        # Not data: values below eps * sigma_1 of their precision (round-off), zeros (padding) and,
        # under the "ess" contract, values below its resolution (drawn_floor; the figure says so).
        eps = np.finfo(stored.dtype if np.issubdtype(stored.dtype, np.floating) else np.float64).eps
        relative, absolute = drawn_floor(res)
        floor = max(eps, relative) * sigma[0] if sigma.size else 0.0
        keep = sigma > max(floor, absolute) if sigma.size and sigma[0] > 0 else np.zeros(sigma.shape, bool)
        if normalise and sigma.size and sigma[0] > 0:
            sigma = sigma / sigma[0]
        tok = res.tokens[t] if t < len(res.tokens) else ""
        rows.append(
            pd.DataFrame(
                {
                    "k": np.arange(1, sigma.size + 1)[keep],
                    "sigma": sigma[keep],
                    "series": f"t = {t} ({tok})" if tok else f"t = {t}",
                }
            )
        )
    frame = pd.concat(rows, ignore_index=True)
    if frame.empty:
        raise ValueError(
            f"all chosen cuts of layer {layer}, unit {unit} have an all-zero spectrum; choose other positions"
        )
    colour, dash = _series_scales(frame["series"])
    legend_spec = alt.Legend(orient=legend, symbolType="stroke")
    y_title = "σk / σ1" if normalise else "σk"
    # the log axis spans the decades the data occupy, no more
    low, high = frame["sigma"].min(), frame["sigma"].max()
    tol = res.meta.get("tol") if tol is None else tol
    relative = bool(res.meta.get("relative", True))
    show_tol = bool(tol) and relative == normalise  # the threshold is on the plotted scale
    if show_tol:
        low = min(low, float(tol))
    decades = [10.0 ** np.floor(np.log10(low)), 10.0 ** np.ceil(np.log10(high))]
    few = frame.groupby("series").size().max() <= 24  # dots help read a short spectrum, clutter a long one
    chart = (
        alt.Chart(frame)
        .mark_line(point=alt.OverlayMarkDef(size=10, filled=True) if few else False)
        .encode(
            x=alt.X("k:Q", title="index k", scale=alt.Scale(nice=False, zero=False, domainMin=1)),
            y=alt.Y("sigma:Q", title=y_title, scale=alt.Scale(type="log", domain=decades, nice=False)),
            color=colour.legend(legend_spec),
            strokeDash=dash.legend(legend_spec),
            tooltip=["series:N", "k:Q", alt.Tooltip("sigma:Q", format=".3e")],
        )
    )
    layers = [chart]
    if floor_note(res):  # at the foot of the plot, where the values it speaks of would be
        note = pd.DataFrame({"note": [floor_note(res)], "k": [1], "foot": [decades[0]]})
        text = alt.Chart(note).mark_text(align="left", baseline="bottom", dx=2, dy=-14, color="#666666")
        layers.append(text.encode(x="k:Q", y=alt.Y("foot:Q", title=y_title), text="note:N"))
    if show_tol:
        limit = pd.DataFrame({"tol": [float(tol)], "label": ["tolerance"]})
        rule = alt.Chart(limit).mark_rule(color="#666666", strokeDash=[3, 2]).encode(y="tol:Q")
        # named at the left end of the rule, just above it (a spectrum is high there)
        name = (
            alt.Chart(limit)
            .mark_text(align="left", baseline="bottom", dx=2, dy=-1, color="#666666")
            .encode(y="tol:Q", x=alt.value(0), text="label:N")
        )
        return alt.layer(rule, name, *layers)
    return alt.layer(*layers) if len(layers) > 1 else chart


def _subset(result: ESSResult, layers) -> ESSResult:
    """The same result restricted to ``layers`` (shares the arrays; nothing is copied)."""
    if layers is None:
        return result
    keep = _layers(result, layers)
    return ESSResult(result.tokens, result.input_ids, {i: result.layers[i] for i in keep}, dict(result.meta))


def _operator(results, *, layer=None, unit=None, t=None, variant="tolerance", max_side=None):
    """The widget's operator view (specs.operator_heatmap): log10|T| of one kept unit with
    the cut H_t = T[t:, :t] outlined at ``t`` (default: where that unit's ESS peaks)."""
    ((label, res),) = _one(results, "operator")
    if layer is None:
        kept = [i for i in sorted(res.layers) if res.layers[i].operators]
        if not kept:
            raise ValueError("no layer kept an operator; analyse with operators kept to draw this figure")
        layer = kept[0]
    lay = res.layer(layer)
    if not lay.operators:
        raise ValueError(
            f"layer {layer} kept no operator; layers with operators: "
            f"{[i for i in sorted(res.layers) if res.layers[i].operators]}"
        )
    unit = min(lay.operators) if unit is None else unit
    if unit not in lay.operators:
        raise ValueError(f"unit {unit} of layer {layer} kept no operator; kept units: {sorted(lay.operators)}")
    if t is not None and not 1 <= int(t) < res.length:
        raise ValueError(f"t must be in [1, {res.length - 1}] (H_t = T[t:, :t] is empty at t = 0), got {t}")
    extra = {} if max_side is None else {"max_side": int(max_side)}
    return specs.operator_heatmap(res, layer=layer, unit=int(unit), variant=variant, t=t, **extra)


def _overview(results, *, layers=None, variant="tolerance", unit="mean", value="utilisation"):
    """The widget's overview (specs.overview): layer x position heatmap of ESS/TSS
    (value="utilisation") or ESS (value="ess"), reduced over units by ``unit``."""
    ((label, res),) = _one(results, "overview")
    _check(value, ("ess", "utilisation"), "value")
    _check(unit, AGGREGATES, "unit")
    return specs.overview(_subset(res, layers), unit=unit, variant=variant, metric=value)


def _diagnostics(results, *, variant="tolerance", saturated=None, collapsed=None):
    """The widget's diagnostics view (specs.diagnostics_chart): utilisation per layer,
    coloured saturated / normal / collapsed, and the modulation at separators."""
    ((label, res),) = _one(results, "diagnostics")
    return specs.diagnostics_chart(
        res,
        variant=variant,
        saturated=SATURATED_AT if saturated is None else saturated,
        collapsed=COLLAPSED_AT if collapsed is None else collapsed,
    )


def _utilisation(
    results,
    *,
    layers=None,
    variant="tolerance",
    reduce="max",
    saturated=None,
    collapsed=None,
    against="ceiling",
    legend="top",
):
    saturated = SATURATED_AT if saturated is None else saturated
    collapsed = COLLAPSED_AT if collapsed is None else collapsed
    per_layer, per_unit = layer_summary_frame(
        results,
        layers=layers,
        variant=variant,
        reduce=reduce,
        saturated=saturated,
        collapsed=collapsed,
        against=against,
    )
    per_unit = spread(per_unit, ["model", "layer"], "utilisation")  # thousands of channels: their quantiles
    several = per_layer["model"].nunique() > 1
    x = alt.X("layer:O", title="layer", axis=LAYER_AXIS)
    y_title = f"ESS / {'ceiling' if against == 'ceiling' else 'TSS'} ({'peak' if reduce == 'max' else 'mean'} over t)"
    enc = dict(x=x, y=alt.Y("utilisation:Q", title=y_title, scale=alt.Scale(domain=[0, 1])))
    tips = [alt.Tooltip("label:N", title="layer"), alt.Tooltip("utilisation:Q", format=".2f"), "state:N"]
    if several:  # one bar per model within each layer
        names = list(dict.fromkeys(per_layer["model"]))
        colour = alt.Color(
            "model:N",
            title=None,
            scale=alt.Scale(domain=names, range=OKABE_ITO[: len(names)]),
            legend=alt.Legend(orient=legend, direction="horizontal", columns=3),
        )
        # Same offset order as the legend in both layers, so each unit's dot sits on its model's bar.
        offset = alt.XOffset("model:N", sort=names, scale=alt.Scale(domain=names))
        bars = (
            alt.Chart(per_layer)
            .mark_bar(opacity=0.8)
            .encode(color=colour, xOffset=offset, tooltip=["model:N"] + tips, **enc)
        )
        dots = (
            alt.Chart(per_unit)
            .mark_point(size=8, color="#222222", filled=True, opacity=0.7)
            .encode(xOffset=offset, **enc)
        )
    else:  # colour says the family: a hybrid model's layers differ in kind
        families = list(dict.fromkeys(per_layer["family"].map(family_name)))
        per_layer = per_layer.assign(family=per_layer["family"].map(family_name))
        colour = alt.Color(
            "family:N",
            title=None,
            scale=alt.Scale(domain=families, range=OKABE_ITO[: len(families)]),
            legend=alt.Legend(orient=legend, direction="horizontal", columns=2) if len(families) > 1 else None,
        )
        bars = alt.Chart(per_layer).mark_bar(opacity=0.6).encode(color=colour, tooltip=tips, **enc)
        dots = (
            alt.Chart(per_unit)
            .mark_point(size=9, color="#222222", filled=True, opacity=0.8)
            .encode(
                tooltip=[
                    alt.Tooltip("label:N", title="layer"),
                    "unit:Q",
                    alt.Tooltip("utilisation:Q", format=".2f"),
                    "state:N",
                ],
                **enc,
            )
        )
    limits = pd.DataFrame({"y": [saturated, collapsed], "text": ["saturated", "collapsed"]})
    rules = alt.Chart(limits).mark_rule(color="#D55E00", strokeDash=[3, 2]).encode(y="y:Q")
    # Outside the plot, right of its edge: labels never sit on bars.
    notes = (
        alt.Chart(limits)
        .mark_text(align="left", baseline="middle", dx=3, color="#D55E00")
        .encode(y="y:Q", text="text:N", x=alt.value("width"))
    )
    return alt.layer(bars, dots, rules, notes)


def _compare(results, *, layers=None, variant="tolerance", unit="mean", check_prompt=True, legend="top"):
    series = _series(results)
    if check_prompt:
        prompts = {r.meta.get("prompt") for _, r in series if r.meta.get("prompt") is not None}
        if len(prompts) > 1 or len({tuple(r.input_ids) for _, r in series}) > 1:  # the tokens tell too
            raise ValueError(
                "compare needs results of one prompt; these were analysed on different prompts "
                "(to compare anyway: check_prompt=False in Python, --any-prompt on the command line)"
            )
    rows, per_layer = [], []
    for label, res in series:
        lay_ids = _layers(res, layers) if layers is not None else sorted(res.layers)
        frame = ess_over_time_frame({label: res}, layers=lay_ids, variant=variant, unit=unit)
        rows.append(frame.groupby(["model", "t"], as_index=False)["ess"].mean())
        means = frame.groupby("layer", as_index=False)["ess"].mean()
        means["model"] = label
        per_layer.append(means)
    over_time = envelope(pd.concat(rows, ignore_index=True).rename(columns={"model": "series"}), ["series"])
    by_layer = pd.concat(per_layer, ignore_index=True).rename(columns={"model": "series"})
    colour, dash = _series_scales(over_time["series"])
    legend_spec = alt.Legend(orient=legend, direction="horizontal", symbolType="stroke")
    left = (
        alt.Chart(over_time)
        .mark_line()
        .encode(
            x=alt.X("t:Q", title="position t", scale=alt.Scale(nice=False)),
            y=alt.Y("ess:Q", title=f"{variant}-ESS, mean over layers"),
            color=colour.legend(legend_spec),
            strokeDash=dash.legend(legend_spec),
            tooltip=["series:N", "t:Q", alt.Tooltip("ess:Q", format=".2f")],
        )
    )
    right = (
        alt.Chart(by_layer)
        .mark_line(point=alt.OverlayMarkDef(size=14, filled=True))
        .encode(
            x=alt.X("layer:O", title="layer", axis=LAYER_AXIS),
            y=alt.Y("ess:Q", title=f"{variant}-ESS, mean over t"),
            color=colour.legend(None),
            strokeDash=dash.legend(None),
            tooltip=["series:N", "layer:O", alt.Tooltip("ess:Q", format=".2f")],
        )
    )
    return alt.hconcat(left, right).resolve_scale(color="shared", strokeDash="shared")


def _one(results, kind):
    series = _series(results)
    if len(series) != 1:
        raise ValueError(f"kind {kind!r} shows one result; got {len(series)} (use 'ess_time' or 'compare' to overlay)")
    return series


KINDS = {
    "ess_time": _ess_time,
    "spectrum": _spectrum,
    "operator": _operator,
    "overview": _overview,
    "utilisation": _utilisation,
    "diagnostics": _diagnostics,
    "compare": _compare,
}
KIND_DOCS = {
    "ess_time": "ESS over time; layers=, variant=, unit=, show_tss=, show_ceiling=, separators=; "
    "several results overlay",
    "spectrum": "singular values of H_t; layer=, unit=, t= (one cut) or positions=[...] (overlay), normalise=",
    "operator": "log10|T| heatmap with the cut H_t outlined; layer=, unit=, t=, max_side=",
    "overview": "layer x position heatmap; value='utilisation'|'ess', variant=, unit=, layers=",
    "diagnostics": "the widget's diagnostics: utilisation per layer by state, modulation at separators",
    "utilisation": "utilisation per layer and unit with thresholds; against='ceiling'|'tss', reduce='max'|'mean', "
    "saturated=, collapsed=",
    "compare": "several models on one prompt: ESS over time and per layer",
}


def figure(result_or_results, kind: str, *, width="single", height=None, font: str = "serif", size: float = 8.0, **kw):
    """A publication figure of ``kind`` (see KINDS / module docstring) as an Altair chart.

    result_or_results: an ESSResult, a list of them, or {label: ESSResult} (labels name the
    series; default label meta["model_id"]). width: "single" (240 pt), "double" (504 pt)
    or points; height in points (default from the width); font "serif" | "sans".
    Remaining keywords go to the kind (e.g. layers=, variant=, t=). The sweep kinds
    (views/sweep_figures.py: sweep_ess_time, sweep_modulation, sweep_checkpoints,
    sweep_utilisation) take the statistics frames of ess_explorer.sweep instead of results;
    "difficulty" takes {model: zoo.sweep_difficulty(model)} (and ``untrained=`` the same for
    the untrained copies); "advice" takes ``ess_explorer.advise``'s Advice (views/advice.py).
    """
    if kind in SWEEP_KINDS:
        return SWEEP_KINDS[kind](result_or_results, width=width, height=height, font=font, **kw)
    if kind == "difficulty":  # {model: zoo.sweep_difficulty(model)} (views/difficulty.py)
        return difficulty_figure(result_or_results, width=width, height=height, font=font, size=size, **kw)
    if kind == "advice":  # an Advice of ess_explorer.advise (views/advice.py)
        return advice_figure(result_or_results, width=width, height=height, font=font, size=size, **kw)
    if kind not in KINDS:
        raise ValueError(
            f"unknown figure kind {kind!r}; kinds: {', '.join([*KINDS, *SWEEP_KINDS, 'difficulty', 'advice'])}"
        )
    builder = KINDS[kind]
    accepted = set(inspect.signature(builder).parameters) - {"results"}
    unknown = sorted(set(kw) - accepted)
    if unknown:
        raise ValueError(f"figure kind {kind!r} takes no option {', '.join(unknown)}; it takes: {KIND_DOCS[kind]}")
    total = width_points(width)
    spec = paperise_spec(spec_of(builder(result_or_results, **kw)), size)
    if kind == "diagnostics" and total < 400 and "hconcat" in spec:
        # two panels side by side leave a single column no room for the threshold names
        spec = stacked(spec)
        height = round(total * 0.9) if height is None else height
    spec = theme_spec(spec, width=total, height=height, font=font, size=size)
    thin_layer_axes(spec, size)
    return to_chart(fit_width(spec, total))
