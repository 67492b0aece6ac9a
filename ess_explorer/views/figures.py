"""Publication figures from ESSResult: a paper theme, the figure kinds, and file export.

Everything here consumes ESSResult (one, or several labelled ones) and returns an Altair
chart; ``save_figure`` writes it as PDF, SVG or PNG through vl-convert with no network.

Paper theme
    sizes are in points: Vega-Lite pixels map 1:1 to PDF points in vl-convert, so a
    ``width="single"`` figure is 240 pt = 3.33 in (one column of a two-column paper) and
    ``"double"`` is 504 pt = 7 in, *including* axes and legend (autosize "fit").
    Text is 8 pt (axis titles 9 pt) in a serif (Liberation Serif, metric-compatible with
    Times) or sans font (Liberation Sans ~ Arial); series use the Okabe-Ito palette plus a
    stroke dash per series (readable in greyscale and for colour-blind readers), heatmaps
    use viridis; no chart borders, no titles (the caption is the paper's), a faint y grid.

Figure kinds (``figure(result_or_results, kind, **kw)``); [w] = the widget's own view
(charts.py) made print-ready by ``paperise``, so figure and widget are the same spec:
    "ess_time"     ESS over time, several layers and/or models overlaid (TSS optional)
    "spectrum"     singular values of H_t of one unit: one t [w], or several t overlaid
    "operator"     log10|T| of one kept unit, the cut H_t = T[t:, :t] outlined [w]
    "overview"     layer x position heatmap of ESS/TSS or ESS [w]
    "utilisation"  ESS/TSS per layer (bar = mean over units, dots = units), thresholds;
                   several models side by side
    "diagnostics"  utilisation per layer by state, and modulation at separators [w]
    "compare"      several models on one prompt: ESS over time and ESS per layer

``paperise`` turns a widget view into a print figure: titles dropped (the caption is the
paper's), text and marks at print size, selection highlights resolved to their unselected
look, pixel-placed captions dropped, heatmap cells overlapped (no seams), log axes with
decade ticks and no grid.

Conventions are the project's (0-based t, H_t = T[t:, :t], ESS(0) = 0): see result.py.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd

from ..core.ess import VARIANTS as ESS_VARIANTS
from ..result import ESSResult

__all__ = [
    "KINDS",
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

# Okabe & Ito (2008): distinguishable under the common colour-vision deficiencies.
OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000", "#F0E442"]
# One dash pattern per series, in palette order, so overlays also read in greyscale.
DASHES = [[1, 0], [4, 2], [1, 1.5], [6, 2, 1, 2], [2, 2], [8, 3], [3, 1, 1, 1], [5, 5]]
PAPER_WIDTHS = {"single": 240, "double": 504}  # points (1/72 in), axes and legend included
FONTS = {
    "serif": "Liberation Serif, Times New Roman, Times, serif",
    "sans": "Liberation Sans, Helvetica, Arial, sans-serif",
}
UNIT_AGGREGATES = ("mean", "sum", "max")
VARIANTS = ESS_VARIANTS  # tolerance, entropy, causal (core/ess.py)


# ---- theme ------------------------------------------------------------------------------
def paper_config(font: str = "serif", size: float = 8.0) -> dict:
    """Vega-Lite config of the paper theme: ``font`` "serif" | "sans" (or a CSS font list),
    ``size`` the label size in points (titles one point larger)."""
    family = FONTS.get(font, font)
    if not isinstance(family, str) or not family.strip():
        raise ValueError(f"font must be 'serif', 'sans' or a CSS font-family list, got {font!r}")
    ink, rule = "#222222", "#444444"
    text = {"font": family, "fontSize": size, "color": ink}
    return {
        "background": "white",
        "font": family,
        "padding": 2,
        "view": {"stroke": None},
        "axis": {
            "labelFont": family, "titleFont": family, "labelFontSize": size, "titleFontSize": size + 1,
            "titleFontWeight": "normal", "labelColor": ink, "titleColor": ink, "domainColor": rule,
            "tickColor": rule, "domainWidth": 0.6, "tickWidth": 0.6, "tickSize": 3, "labelPadding": 2,
            "titlePadding": 4, "grid": False, "labelFlush": True,
        },
        "axisY": {"grid": True, "gridColor": "#e8e8e8", "gridWidth": 0.5},
        "axisBand": {"grid": False},
        "legend": {
            "labelFont": family, "titleFont": family, "labelFontSize": size, "titleFontSize": size,
            "titleFontWeight": "normal", "labelColor": ink, "titleColor": ink, "symbolSize": 40,
            "symbolStrokeWidth": 1.4, "rowPadding": 1, "padding": 0, "offset": 6,
            "gradientLength": 80, "gradientThickness": 8,
        },
        "header": {"labelFont": family, "titleFont": family, "labelFontSize": size, "titleFontSize": size + 1,
                   "titleFontWeight": "normal"},
        "title": {"font": family, "fontSize": size + 1, "fontWeight": "normal", "anchor": "start", "color": ink},
        "text": text,
        "line": {"strokeWidth": 1.2},
        "point": {"size": 14, "filled": True},
        "rule": {"strokeWidth": 0.6},
        "range": {"category": OKABE_ITO, "heatmap": {"scheme": "viridis"}, "ramp": {"scheme": "viridis"}},
        "concat": {"spacing": 12},
    }


def _width_points(width) -> float:
    if isinstance(width, str):
        if width not in PAPER_WIDTHS:
            raise ValueError(f"width must be 'single', 'double' or a number of points, got {width!r}")
        return float(PAPER_WIDTHS[width])
    if not isinstance(width, (int, float)) or not np.isfinite(width) or width < 60:
        raise ValueError(f"width must be 'single', 'double' or a number of points >= 60, got {width!r}")
    return float(width)


def _spec(chart) -> dict:
    """A deep copy of a chart's Vega-Lite dict, without config and schema."""
    spec = chart.to_dict() if not isinstance(chart, dict) else json.loads(json.dumps(chart))
    spec.pop("config", None)
    spec.pop("$schema", None)
    return spec


def _chart(spec: dict):
    """The Altair chart object of a top-level Vega-Lite dict."""
    for key, cls in (("layer", alt.LayerChart), ("hconcat", alt.HConcatChart), ("vconcat", alt.VConcatChart),
                     ("concat", alt.ConcatChart), ("facet", alt.FacetChart)):
        if key in spec:
            return cls.from_dict(spec)
    return alt.Chart.from_dict(spec)


def _theme_spec(spec: dict, *, width="single", height=None, font: str = "serif", size: float = 8.0) -> dict:
    total = _width_points(width)
    height = float(height) if height is not None else round(total * (0.62 if total < 300 else 0.36))
    for key in ("hconcat", "concat", "vconcat"):
        if key in spec:
            panels = spec[key]
            n = max(len(panels), 1)
            for panel in panels:
                if any(k in panel for k in ("hconcat", "vconcat", "concat", "facet")):
                    continue  # nested layouts keep their own proportions
                if key == "vconcat":
                    panel["width"], panel["height"] = total - 50, max((height - 30) / n - 10, 30)
                else:  # about 45 pt of each panel go to its y axis, 12 pt between panels
                    panel["width"] = max((total - 12 * (n - 1)) / n - 45, 40)
                    panel["height"] = max(height - 40, 40)
            spec["autosize"] = {"type": "pad"}
            break
    else:
        spec["width"], spec["height"] = total, height
        spec["autosize"] = {"type": "fit", "contains": "padding"}
    spec["config"] = paper_config(font, size)
    return spec


def apply_paper_theme(chart, *, width="single", height=None, font: str = "serif", size: float = 8.0):
    """Return a copy of ``chart`` resized to a paper width, with the paper config (replacing
    any config of its own).

    A single or layered view fits the whole figure, axes and legend included, into
    ``width`` x ``height`` points (autosize "fit"); a concatenated chart splits the width
    between its panels (autosize "pad": the total is then close to, not exactly, ``width``).
    Interactive params stay in the spec; a static export shows their initial values.
    """
    return _chart(_theme_spec(_spec(chart), width=width, height=height, font=font, size=size))


# Channels whose param-conditioned value only shows what is *selected* in the widget: in a
# static figure nothing is selected, so the unselected ("else") value is the right one.
_SELECTION_CHANNELS = ("color", "fill", "stroke", "strokeWidth", "size", "shape", "strokeDash")
_MAX_MARK = {"size": 14.0, "strokeWidth": 1.4}


def _seamless_heatmap(mark, encoding: dict) -> None:
    """A heatmap cell (a rect coloured by a field, spanning x..x2 / y..y2) overlaps its
    neighbour by half a point: adjacent anti-aliased rects otherwise leave faint white seams
    in PDF viewers and PNGs. (A same-colour stroke would also do, but turns the gradient
    legend into a symbol legend.)"""
    if not isinstance(mark, dict) or mark.get("type") != "rect":
        return
    colour = encoding.get("color")
    if not isinstance(colour, dict) or "field" not in colour:
        return
    for channel in ("x", "y"):  # grid lines over a heatmap's empty cells are junk
        spec = encoding.get(channel)
        if isinstance(spec, dict) and spec.get("axis", {}) is not None:
            spec["axis"] = {**(spec.get("axis") or {}), "grid": False}
    if "x2" in encoding:
        mark.setdefault("x2Offset", 0.5)
    if "y2" in encoding:
        reverse = bool(((encoding.get("y") or {}).get("scale") or {}).get("reverse"))
        # pixel y grows downwards: y2 (the larger value) lies below y on a reversed scale
        mark.setdefault("y2Offset", 0.5 if reverse else -0.5)


def _quiet_log_axis(channel) -> None:
    """A log axis: decade ticks only, no grid (Vega's default draws a line at every 2, 5)."""
    if not isinstance(channel, dict) or (channel.get("scale") or {}).get("type") != "log":
        return
    axis = channel.get("axis")
    if axis is None and "axis" in channel:
        return  # the axis is hidden on purpose
    axis = dict(axis or {})
    axis.setdefault("grid", False)
    axis.setdefault("tickCount", 4)
    axis.setdefault("format", "~g")
    channel["axis"] = axis


def _pixel_text(view) -> bool:
    """A text mark placed by pixel values on both axes (an in-plot caption of the widget)."""
    mark = view.get("mark") if isinstance(view, dict) else None
    kind = mark.get("type") if isinstance(mark, dict) else mark
    enc = view.get("encoding", {}) if isinstance(view, dict) else {}
    return kind == "text" and all(isinstance(enc.get(c), dict) and "value" in enc[c] for c in ("x", "y"))


def _is_view(node: dict) -> bool:
    return any(key in node for key in ("mark", "layer", "hconcat", "vconcat", "concat", "facet", "spec"))


def _paperise_node(node, size: float):
    """Walk a Vega-Lite spec dict in place: drop titles (a paper's caption says it), cap mark
    text, point sizes and stroke widths at print sizes, and resolve selection highlights."""
    if isinstance(node, list):
        for item in node:
            _paperise_node(item, size)
        return
    if not isinstance(node, dict):
        return
    if _is_view(node):
        node.pop("title", None)
    if isinstance(node.get("layer"), list):  # widget annotations placed in pixels overflow a column
        node["layer"] = [child for child in node["layer"] if not _pixel_text(child)] or node["layer"]
    mark = node.get("mark")
    if isinstance(mark, dict):
        if "fontSize" in mark:
            mark["fontSize"] = min(float(mark["fontSize"]), size - 1)
        mark.pop("fontWeight", None)
        if "size" in mark and isinstance(mark["size"], (int, float)):
            mark["size"] = min(float(mark["size"]), _MAX_MARK["size"])
        if isinstance(mark.get("strokeWidth"), (int, float)):
            mark["strokeWidth"] = min(float(mark["strokeWidth"]), _MAX_MARK["strokeWidth"])
    encoding = node.get("encoding")
    if isinstance(encoding, dict):
        for channel in list(encoding):
            spec = encoding[channel]
            condition = spec.get("condition") if isinstance(spec, dict) else None
            if condition is None:
                continue
            conditions = condition if isinstance(condition, list) else [condition]
            if channel == "opacity":  # dimming of the unselected: a static figure shows all alike
                del encoding[channel]
            elif channel in _SELECTION_CHANNELS and any("param" in c for c in conditions):
                if "value" in spec:
                    encoding[channel] = {"value": spec["value"]}
                else:
                    del encoding[channel]
        if isinstance(encoding.get("size"), dict) and isinstance(encoding["size"].get("value"), (int, float)):
            encoding["size"]["value"] = min(float(encoding["size"]["value"]), _MAX_MARK["size"])
        text = encoding.get("text")
        if isinstance(text, dict) and isinstance(mark, dict):
            mark["fontSize"] = min(float(mark.get("fontSize", size - 1)), size - 1)
        _seamless_heatmap(mark, encoding)
        for channel in ("x", "y"):
            _quiet_log_axis(encoding.get(channel))
    for key, value in node.items():
        if key not in ("data", "datasets", "encoding", "mark"):
            _paperise_node(value, size)


def _paperise_spec(spec: dict, size: float) -> dict:
    _paperise_node(spec, size)
    return spec


def paperise(chart, *, size: float = 8.0):
    """A copy of a widget view (charts.py) fit for print: no titles, print-size text and
    marks, selection highlights resolved to their unselected look, pixel-placed annotation
    text dropped (it does not scale to a column). The params stay: a view such as the
    spectrum filters its data by the selected t, whose initial value is the t shown."""
    return _chart(_paperise_spec(_spec(chart), size))


# ---- inputs -----------------------------------------------------------------------------
def _series(result_or_results) -> list[tuple[str, ESSResult]]:
    """[(label, result)] from one ESSResult, a list of them, or a {label: result} dict."""
    if isinstance(result_or_results, ESSResult):
        items = [(None, result_or_results)]
    elif isinstance(result_or_results, dict):
        items = list(result_or_results.items())
    elif isinstance(result_or_results, (list, tuple)):
        items = [(None, r) for r in result_or_results]
    else:
        raise ValueError(
            f"figure needs an ESSResult, a list of them or a {{label: ESSResult}} dict, got {type(result_or_results).__name__}"
        )
    if not items:
        raise ValueError("figure needs at least one ESSResult")
    out, seen = [], {}
    for label, res in items:
        if not isinstance(res, ESSResult):
            raise ValueError(f"every item must be an ESSResult, got {type(res).__name__}")
        if not res.layers:
            raise ValueError("the result has no analysed layers; analyse at least one layer")
        label = str(label) if label is not None else _default_label(res)
        seen[label] = seen.get(label, 0) + 1
        out.append((label if seen[label] == 1 else f"{label} ({seen[label]})", res))
    return out


def _default_label(result: ESSResult) -> str:
    """A short series name: the CLI's source ("zoo:mamba2_n16") or the model id, a local
    folder by its name rather than its full path."""
    name = str(result.meta.get("source") or result.meta.get("model_id") or "model")
    return Path(name).name if name.startswith(("/", "./", "../", "~")) else name


def _layers(result: ESSResult, layers) -> list[int]:
    if layers is None:
        return sorted(result.layers)
    layers = [layers] if isinstance(layers, (int, np.integer)) else list(layers)
    missing = [i for i in layers if i not in result.layers]
    if missing:
        raise ValueError(f"layers {missing} were not analysed; analysed layers: {sorted(result.layers)}")
    return [int(i) for i in layers]


def _check(value, allowed, name):
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def _reduce_units(values: np.ndarray, how: str, multiplicity=None) -> np.ndarray:
    """Over units (axis 0); "sum" is the layer total in scalars (multiplicity x value)."""
    values = np.asarray(values, dtype=np.float64)
    if how == "sum" and multiplicity is not None:
        return (np.asarray(multiplicity, dtype=np.float64)[:, None] * values).sum(0)
    return {"mean": np.mean, "sum": np.sum, "max": np.max}[how](values, axis=0)


def _unit_word(result: ESSResult, layers) -> str:
    kinds = {result.layer(i).unit_kind for i in layers}
    return f"{kinds.pop()}s" if len(kinds) == 1 else "units"


def _y_title(variant: str, unit: str, units_word: str) -> str:
    word = {"mean": "mean", "sum": "total in scalars", "max": "max"}[unit]
    return f"{variant}-ESS ({word} over {units_word})"


def ess_over_time_frame(result_or_results, *, layers=None, variant="tolerance", unit="mean") -> pd.DataFrame:
    """Long table for ESS-over-time plots: columns model, layer, family, series, t, token,
    ess, tss (ESS and TSS reduced over units by ``unit``: "mean", "sum" (the total in scalars,
    sum over units of multiplicity x value, docs/conventions.md) or "max"). variant "causal"
    plots the causal ESS (core/causal.py)."""
    _check(variant, VARIANTS, "variant")
    _check(unit, UNIT_AGGREGATES, "unit")
    series = _series(result_or_results)
    rows = []
    for label, res in series:
        for i in _layers(res, layers):
            lay = res.layer(i)
            ess = lay.ess(variant)
            t = np.asarray(lay.positions)
            rows.append(pd.DataFrame({
                "model": label, "layer": i, "family": lay.family, "t": t,
                "token": [res.tokens[k] if k < len(res.tokens) else "" for k in t],
                "ess": _reduce_units(ess, unit, lay.multiplicity), "tss": _reduce_units(lay.tss, unit, lay.multiplicity),
            }))
    frame = pd.concat(rows, ignore_index=True)
    several_models = frame["model"].nunique() > 1
    several_layers = frame.groupby("model")["layer"].nunique().max() > 1
    if several_models and several_layers:
        frame["series"] = frame["model"] + " · layer " + frame["layer"].astype(str)
    elif several_models:
        frame["series"] = frame["model"]
    else:
        frame["series"] = "layer " + frame["layer"].astype(str) + " (" + frame["family"].str.replace("_", " ") + ")"
    return frame


def layer_summary_frame(result_or_results, *, layers=None, variant="tolerance", reduce="max",
                        saturated=None, collapsed=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per_layer, per_unit) utilisation tables from diagnostics.layer_diagnostics.

    per_layer: model, layer, family, label, utilisation (mean over units), state, mean_ess.
    per_unit: model, layer, label, unit, utilisation, state. ``reduce`` over time: "max"
    (peak, the diagnostics default) or "mean".
    """
    from ..core.diagnostics import COLLAPSED_AT, SATURATED_AT, layer_diagnostics

    saturated = SATURATED_AT if saturated is None else saturated
    collapsed = COLLAPSED_AT if collapsed is None else collapsed
    per_layer, per_unit = [], []
    for label, res in _series(result_or_results):
        for i in _layers(res, layers):
            lay = res.layer(i)
            diag = layer_diagnostics(lay, variant=variant, reduce=reduce, saturated=saturated, collapsed=collapsed)
            name = f"{i} {lay.family.replace('_', ' ')}"
            per_layer.append({"model": label, "layer": i, "family": lay.family, "label": name,
                              "utilisation": diag["utilisation"], "state": str(diag["state"]),
                              "mean_ess": diag["mean_ess"], "units": lay.n_units})
            for u, (value, state) in enumerate(zip(diag["unit_utilisation"], diag["unit_state"])):
                per_unit.append({"model": label, "layer": i, "label": name, "unit": u,
                                 "utilisation": float(value), "state": str(state)})
    return pd.DataFrame(per_layer), pd.DataFrame(per_unit)


def _series_scales(names) -> tuple[alt.Color, alt.StrokeDash]:
    names = list(dict.fromkeys(names))
    colour = alt.Color("series:N", title=None, sort=names,
                       scale=alt.Scale(domain=names, range=[OKABE_ITO[k % len(OKABE_ITO)] for k in range(len(names))]))
    dash = alt.StrokeDash("series:N", title=None, sort=names,
                          scale=alt.Scale(domain=names, range=[DASHES[k % len(DASHES)] for k in range(len(names))]))
    return colour, dash


def _separator_positions(result: ESSResult, separators) -> list[int]:
    """Separators to mark: explicit positions, token strings, or (None) the widget's rule,
    charts.separator_positions: meta["separators"], else separator / EOS tokens."""
    if separators is False:
        return []
    if separators is None:
        from .charts import separator_positions

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
def _ess_time(results, *, layers=None, variant="tolerance", unit="mean", show_tss=False, separators=None, legend="top"):
    frame = ess_over_time_frame(results, layers=layers, variant=variant, unit=unit)
    series = _series(results)
    colour, dash = _series_scales(frame["series"])
    words = {_unit_word(r, _layers(r, layers)) for _, r in series}
    y_title = _y_title(variant, unit, words.pop() if len(words) == 1 else "units")
    legend_spec = alt.Legend(orient=legend, direction="horizontal" if legend in ("top", "bottom") else "vertical",
                             columns=2 if legend in ("top", "bottom") else 1, symbolType="stroke")
    base = alt.Chart(frame)
    lines = base.mark_line().encode(
        x=alt.X("t:Q", title="position t", scale=alt.Scale(nice=False, zero=True)),
        y=alt.Y("ess:Q", title=y_title, scale=alt.Scale(zero=True)),
        color=colour.legend(legend_spec), strokeDash=dash.legend(legend_spec),
        detail="series:N",
        tooltip=["series:N", "t:Q", "token:N", alt.Tooltip("ess:Q", format=".2f")],
    )
    layers_ = []
    seps = _separator_positions(series[0][1], separators) if len(series) == 1 else []
    if seps:
        layers_.append(alt.Chart(pd.DataFrame({"t": seps})).mark_rule(color="#bbbbbb", strokeDash=[2, 2]).encode(x="t:Q"))
    if show_tss:
        layers_.append(base.mark_line(color="#888888", strokeWidth=0.8, strokeDash=[1, 1.5]).encode(
            x="t:Q", y="tss:Q", detail="series:N"))
    layers_.append(lines)
    return alt.layer(*layers_) if len(layers_) > 1 else lines


def _spectrum(results, *, layer=None, unit=0, positions=None, t=None, normalise=True, tol=None, legend="right"):
    """Spectra of H_t. One position (``t=`` or a single ``positions``) is the widget's view
    (charts.spectrum: values above/below the tolerance); several overlay one line each."""
    (label, res), = _one(results, "spectrum")
    layer = sorted(res.layers)[0] if layer is None else layer
    lay = res.layer(layer)
    if t is not None and positions is not None:
        raise ValueError("give t (one position) or positions (several), not both")
    single = t if t is not None else (positions if isinstance(positions, (int, np.integer)) else
                                      (positions[0] if positions is not None and len(positions) == 1 else None))
    if single is not None:
        from . import charts

        if not isinstance(unit, (int, np.integer)) or not 0 <= unit < lay.n_units:
            raise ValueError(f"unit must be an integer in [0, {lay.n_units - 1}] for layer {layer}, got {unit!r}")
        if int(single) not in set(np.asarray(lay.positions).tolist()):
            raise ValueError(f"position {single} was not computed for layer {layer}")
        return charts.spectrum(res, layer=layer, unit=int(unit), t=int(single), tol=tol)
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
            raise ValueError(f"position {t} was not computed for layer {layer}; computed positions {pos.min()}..{pos.max()}"
                             f" (stride {int(pos[1] - pos[0]) if len(pos) > 1 else 1})")
        sigma = np.asarray(lay.singular_values[unit, hits[0]], dtype=np.float64)
        if normalise and sigma.size and sigma[0] > 0:
            sigma = sigma / sigma[0]
        keep = sigma > 0  # zero padding and exact zeros have no place on a log axis
        tok = res.tokens[t] if t < len(res.tokens) else ""
        rows.append(pd.DataFrame({"k": np.arange(1, sigma.size + 1)[keep], "sigma": sigma[keep],
                                  "series": f"t = {t} ({tok})" if tok else f"t = {t}"}))
    frame = pd.concat(rows, ignore_index=True)
    if frame.empty:
        raise ValueError(f"all chosen cuts of layer {layer}, unit {unit} have an all-zero spectrum; choose other positions")
    colour, dash = _series_scales(frame["series"])
    legend_spec = alt.Legend(orient=legend, symbolType="stroke")
    y_title = "σₖ / σ₁" if normalise else "σₖ"
    few = frame.groupby("series").size().max() <= 24  # dots help read a short spectrum, clutter a long one
    chart = alt.Chart(frame).mark_line(point=alt.OverlayMarkDef(size=10, filled=True) if few else False).encode(
        x=alt.X("k:Q", title="index k", scale=alt.Scale(nice=False, zero=False, domainMin=1)),
        y=alt.Y("sigma:Q", title=y_title, scale=alt.Scale(type="log")),
        color=colour.legend(legend_spec), strokeDash=dash.legend(legend_spec),
        tooltip=["series:N", "k:Q", alt.Tooltip("sigma:Q", format=".3e")],
    )
    tol = res.meta.get("tol") if tol is None else tol
    relative = bool(res.meta.get("relative", True))
    if tol and (relative == normalise):  # the threshold is on the plotted scale
        rule = alt.Chart(pd.DataFrame({"tol": [float(tol)]})).mark_rule(color="#666666", strokeDash=[3, 2]).encode(y="tol:Q")
        return alt.layer(rule, chart)
    return chart


def _subset(result: ESSResult, layers) -> ESSResult:
    """The same result restricted to ``layers`` (shares the arrays; nothing is copied)."""
    if layers is None:
        return result
    keep = _layers(result, layers)
    return ESSResult(result.tokens, result.input_ids, {i: result.layers[i] for i in keep}, dict(result.meta))


def _operator(results, *, layer=None, unit=None, t=None, variant="tolerance", max_side=None):
    """The widget's operator view (charts.operator_heatmap): log10|T| of one kept unit with
    the cut H_t = T[t:, :t] outlined at ``t`` (default: where that unit's ESS peaks)."""
    from . import charts

    (label, res), = _one(results, "operator")
    if layer is None:
        kept = [i for i in sorted(res.layers) if res.layers[i].operators]
        if not kept:
            raise ValueError("no layer kept an operator; analyse with operators kept to draw this figure")
        layer = kept[0]
    lay = res.layer(layer)
    if not lay.operators:
        raise ValueError(f"layer {layer} kept no operator; layers with operators: "
                         f"{[i for i in sorted(res.layers) if res.layers[i].operators]}")
    unit = min(lay.operators) if unit is None else unit
    if unit not in lay.operators:
        raise ValueError(f"unit {unit} of layer {layer} kept no operator; kept units: {sorted(lay.operators)}")
    if t is not None and not 1 <= int(t) < res.length:
        raise ValueError(f"t must be in [1, {res.length - 1}] (H_t = T[t:, :t] is empty at t = 0), got {t}")
    extra = {} if max_side is None else {"max_side": int(max_side)}
    return charts.operator_heatmap(res, layer=layer, unit=int(unit), variant=variant, t=t, **extra)


def _overview(results, *, layers=None, variant="tolerance", unit="mean", value="utilisation"):
    """The widget's overview (charts.overview): layer x position heatmap of ESS/TSS
    (value="utilisation") or ESS (value="ess"), reduced over units by ``unit``."""
    from . import charts

    (label, res), = _one(results, "overview")
    _check(value, ("ess", "utilisation"), "value")
    _check(unit, UNIT_AGGREGATES, "unit")
    return charts.overview(_subset(res, layers), unit=unit, variant=variant, metric=value)


def _diagnostics(results, *, variant="tolerance", saturated=None, collapsed=None):
    """The widget's diagnostics view (charts.diagnostics_chart): utilisation per layer,
    coloured saturated / normal / collapsed, and the modulation at separators."""
    from . import charts
    from ..core.diagnostics import COLLAPSED_AT, SATURATED_AT

    (label, res), = _one(results, "diagnostics")
    return charts.diagnostics_chart(res, variant=variant, saturated=SATURATED_AT if saturated is None else saturated,
                                    collapsed=COLLAPSED_AT if collapsed is None else collapsed)


def _utilisation(results, *, layers=None, variant="tolerance", reduce="max", saturated=None, collapsed=None,
                 legend="top"):
    from ..core.diagnostics import COLLAPSED_AT, SATURATED_AT

    saturated = SATURATED_AT if saturated is None else saturated
    collapsed = COLLAPSED_AT if collapsed is None else collapsed
    per_layer, per_unit = layer_summary_frame(results, layers=layers, variant=variant, reduce=reduce,
                                              saturated=saturated, collapsed=collapsed)
    several = per_layer["model"].nunique() > 1
    x = alt.X("layer:O", title="layer", axis=alt.Axis(labelAngle=0))
    y_title = f"ESS / TSS ({'peak' if reduce == 'max' else 'mean'} over t)"
    enc = dict(x=x, y=alt.Y("utilisation:Q", title=y_title, scale=alt.Scale(domain=[0, 1])))
    tips = [alt.Tooltip("label:N", title="layer"), alt.Tooltip("utilisation:Q", format=".2f"), "state:N"]
    if several:  # one bar per model within each layer
        names = list(dict.fromkeys(per_layer["model"]))
        colour = alt.Color("model:N", title=None, scale=alt.Scale(domain=names, range=OKABE_ITO[: len(names)]),
                           legend=alt.Legend(orient=legend, direction="horizontal", columns=3))
        # Same offset order as the legend in both layers, so each unit's dot sits on its model's bar.
        offset = alt.XOffset("model:N", sort=names, scale=alt.Scale(domain=names))
        bars = alt.Chart(per_layer).mark_bar(opacity=0.8).encode(color=colour, xOffset=offset,
                                                                 tooltip=["model:N"] + tips, **enc)
        dots = alt.Chart(per_unit).mark_point(size=8, color="#222222", filled=True, opacity=0.7).encode(
            xOffset=offset, **enc)
    else:  # colour says the family: a hybrid model's layers differ in kind
        families = list(dict.fromkeys(per_layer["family"].str.replace("_", " ")))
        per_layer = per_layer.assign(family=per_layer["family"].str.replace("_", " "))
        colour = alt.Color("family:N", title=None, scale=alt.Scale(domain=families, range=OKABE_ITO[: len(families)]),
                           legend=alt.Legend(orient=legend, direction="horizontal", columns=2) if len(families) > 1 else None)
        bars = alt.Chart(per_layer).mark_bar(opacity=0.6).encode(color=colour, tooltip=tips, **enc)
        dots = alt.Chart(per_unit).mark_point(size=9, color="#222222", filled=True, opacity=0.8).encode(
            tooltip=[alt.Tooltip("label:N", title="layer"), "unit:Q", alt.Tooltip("utilisation:Q", format=".2f"), "state:N"],
            **enc)
    limits = pd.DataFrame({"y": [saturated, collapsed], "text": ["saturated", "collapsed"]})
    rules = alt.Chart(limits).mark_rule(color="#D55E00", strokeDash=[3, 2]).encode(y="y:Q")
    # Outside the plot, right of its edge: labels never sit on bars.
    notes = alt.Chart(limits).mark_text(align="left", baseline="middle", dx=3, color="#D55E00").encode(
        y="y:Q", text="text:N", x=alt.value("width"))
    return alt.layer(bars, dots, rules, notes)


def _compare(results, *, layers=None, variant="tolerance", unit="mean", check_prompt=True, legend="top"):
    series = _series(results)
    if check_prompt:
        prompts = {r.meta.get("prompt") for _, r in series if r.meta.get("prompt") is not None}
        if len(prompts) > 1:
            raise ValueError("compare needs results of one prompt; these were analysed on different prompts "
                             "(pass check_prompt=False to compare anyway)")
    rows, per_layer = [], []
    for label, res in series:
        lay_ids = _layers(res, layers) if layers is not None else sorted(res.layers)
        frame = ess_over_time_frame({label: res}, layers=lay_ids, variant=variant, unit=unit)
        rows.append(frame.groupby(["model", "t"], as_index=False)["ess"].mean())
        means = frame.groupby("layer", as_index=False)["ess"].mean()
        means["model"] = label
        per_layer.append(means)
    over_time = pd.concat(rows, ignore_index=True).rename(columns={"model": "series"})
    by_layer = pd.concat(per_layer, ignore_index=True).rename(columns={"model": "series"})
    colour, dash = _series_scales(over_time["series"])
    legend_spec = alt.Legend(orient=legend, direction="horizontal", symbolType="stroke")
    y_title = _y_title(variant, unit, "units")
    left = alt.Chart(over_time).mark_line().encode(
        x=alt.X("t:Q", title="position t", scale=alt.Scale(nice=False)),
        y=alt.Y("ess:Q", title=f"{variant}-ESS, mean over layers"),
        color=colour.legend(legend_spec), strokeDash=dash.legend(legend_spec),
        tooltip=["series:N", "t:Q", alt.Tooltip("ess:Q", format=".2f")],
    )
    right = alt.Chart(by_layer).mark_line(point=alt.OverlayMarkDef(size=14, filled=True)).encode(
        x=alt.X("layer:O", title="layer", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("ess:Q", title=f"{variant}-ESS, mean over t"),
        color=colour.legend(None), strokeDash=dash.legend(None),
        tooltip=["series:N", "layer:O", alt.Tooltip("ess:Q", format=".2f")],
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
    "ess_time": "ESS over time; layers=, variant=, unit=, show_tss=, separators=; several results overlay",
    "spectrum": "singular values of H_t; layer=, unit=, t= (one cut) or positions=[...] (overlay), normalise=",
    "operator": "log10|T| heatmap with the cut H_t outlined; layer=, unit=, t=, max_side=",
    "overview": "layer x position heatmap; value='utilisation'|'ess', variant=, unit=, layers=",
    "diagnostics": "the widget's diagnostics: utilisation per layer by state, modulation at separators",
    "utilisation": "ESS/TSS per layer and unit with thresholds; reduce='max'|'mean', saturated=, collapsed=",
    "compare": "several models on one prompt: ESS over time and per layer",
}


def figure(result_or_results, kind: str, *, width="single", height=None, font: str = "serif", size: float = 8.0, **kw):
    """A publication figure of ``kind`` (see KINDS / module docstring) as an Altair chart.

    result_or_results: an ESSResult, a list of them, or {label: ESSResult} (labels name the
    series; default label meta["model_id"]). width: "single" (240 pt), "double" (504 pt)
    or points; height in points (default from the width); font "serif" | "sans".
    Remaining keywords go to the kind (e.g. layers=, variant=, t=).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown figure kind {kind!r}; kinds: {', '.join(KINDS)}")
    builder = KINDS[kind]
    accepted = set(inspect.signature(builder).parameters) - {"results"}
    unknown = sorted(set(kw) - accepted)
    if unknown:
        raise ValueError(f"figure kind {kind!r} takes no option {', '.join(unknown)}; it takes: {KIND_DOCS[kind]}")
    spec = _paperise_spec(_spec(builder(result_or_results, **kw)), size)
    return _chart(_theme_spec(spec, width=width, height=height, font=font, size=size))
