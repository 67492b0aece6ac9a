"""The paper theme: figure widths, one font family, print-size text, the Okabe-Ito palette.

Sizes are in points: Vega-Lite pixels map 1:1 to PDF points in vl-convert, so a
``width="single"`` figure is 240 pt = 3.33 in (one column of a two-column paper) and
``"double"`` is 504 pt = 7 in, *including* axes and legend. A single or layered view is fit
by Vega-Lite (autosize "fit"); a concatenated one is measured after layout and its panels
narrowed until the whole figure fits (`fit_width`). Text is 8 pt (axis titles 9 pt, never
below 7 pt) in ONE family: a serif (Liberation Serif, metric-compatible with Times) or sans
(Liberation Sans ~ Arial); series use the Okabe-Ito palette plus a stroke dash per series
(readable in greyscale and for colour-blind readers), heatmaps use viridis; no chart
borders, no titles (the caption is the paper's), a faint y grid.

``paperise`` turns a widget view (specs.py) into a print figure: titles dropped, text and
marks at print size, selection highlights resolved to their unselected look, pixel-placed
captions dropped, heatmap cells overlapped (no seams), log axes with decade ticks, no grid.
"""

from __future__ import annotations

import json
import re

import altair as alt
import numpy as np

from .render import figure_bytes

__all__ = [
    "OKABE_ITO",
    "DASHES",
    "PAPER_WIDTHS",
    "FONTS",
    "MIN_FONT_SIZE",
    "paper_config",
    "apply_paper_theme",
    "paperise",
    "fit_width",
    "plain_text",
    "width_points",
    "stacked",
    "thin_layer_axes",
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
GENERIC_FONTS = ("serif", "sans-serif", "monospace")
# No text in a printed figure is smaller than this (points).
MIN_FONT_SIZE = 7.0


# ---- theme ------------------------------------------------------------------------------
def paper_config(font: str = "serif", size: float = 8.0) -> dict:
    """Vega-Lite config of the paper theme: ``font`` "serif" | "sans" (or a CSS font list),
    ``size`` the label size in points (titles one point larger)."""
    if not isinstance(size, (int, float)) or not MIN_FONT_SIZE + 1 <= size <= 14:
        raise ValueError(f"size must be a label size in points between {MIN_FONT_SIZE + 1:g} and 14, got {size!r}")
    family = FONTS.get(font, font)
    # A CSS list must end in a generic family, so a font missing on the renderer falls back to
    # a stated kind instead of silently to whatever the renderer has ("comic" is refused).
    if not isinstance(family, str) or family.rsplit(",", 1)[-1].strip() not in GENERIC_FONTS:
        raise ValueError(
            f"font must be 'serif', 'sans' or a CSS font-family list ending in one of {', '.join(GENERIC_FONTS)} "
            f"(e.g. 'Comic Neue, sans-serif'), got {font!r}"
        )
    ink, rule = "#222222", "#444444"
    text = {"font": family, "fontSize": size, "color": ink}
    return {
        "background": "white",
        "font": family,
        "padding": 2,
        "view": {"stroke": None},
        "axis": {
            "labelFont": family,
            "titleFont": family,
            "labelFontSize": size,
            "titleFontSize": size + 1,
            "titleFontWeight": "normal",
            "labelColor": ink,
            "titleColor": ink,
            "domainColor": rule,
            "tickColor": rule,
            "domainWidth": 0.6,
            "tickWidth": 0.6,
            "tickSize": 3,
            "labelPadding": 2,
            "titlePadding": 4,
            "grid": False,
            "labelFlush": True,
        },
        "axisY": {"grid": True, "gridColor": "#e8e8e8", "gridWidth": 0.5},
        # flush labels suit a continuous axis; on a band axis they move the end rows' labels
        # off their ticks
        "axisBand": {"grid": False, "labelFlush": False},
        "legend": {
            "labelFont": family,
            "titleFont": family,
            "labelFontSize": size,
            "titleFontSize": size,
            "titleFontWeight": "normal",
            "labelColor": ink,
            "titleColor": ink,
            "symbolSize": 40,
            "symbolStrokeWidth": 1.4,
            "rowPadding": 1,
            "padding": 0,
            "offset": 6,
            "gradientLength": 80,
            "gradientThickness": 8,
        },
        "header": {
            "labelFont": family,
            "titleFont": family,
            "labelFontSize": size,
            "titleFontSize": size + 1,
            "titleFontWeight": "normal",
        },
        "title": {"font": family, "fontSize": size + 1, "fontWeight": "normal", "anchor": "start", "color": ink},
        "text": text,
        "line": {"strokeWidth": 1.2},
        "point": {"size": 14, "filled": True},
        "rule": {"strokeWidth": 0.6},
        "range": {"category": OKABE_ITO, "heatmap": {"scheme": "viridis"}, "ramp": {"scheme": "viridis"}},
        "concat": {"spacing": 12},
    }


def width_points(width) -> float:
    """A figure width in points: "single" (240), "double" (504) or a number >= 60."""
    if isinstance(width, str):
        if width not in PAPER_WIDTHS:
            raise ValueError(f"width must be 'single', 'double' or a number of points, got {width!r}")
        return float(PAPER_WIDTHS[width])
    if not isinstance(width, (int, float)) or not np.isfinite(width) or width < 60:
        raise ValueError(f"width must be 'single', 'double' or a number of points >= 60, got {width!r}")
    return float(width)


def spec_of(chart) -> dict:
    """A deep copy of a chart's Vega-Lite dict, without config and schema."""
    spec = chart.to_dict() if not isinstance(chart, dict) else json.loads(json.dumps(chart))
    spec.pop("config", None)
    spec.pop("$schema", None)
    return spec


def to_chart(spec: dict):
    """The Altair chart object of a top-level Vega-Lite dict."""
    for key, cls in (
        ("layer", alt.LayerChart),
        ("hconcat", alt.HConcatChart),
        ("vconcat", alt.VConcatChart),
        ("concat", alt.ConcatChart),
        ("facet", alt.FacetChart),
    ):
        if key in spec:
            return cls.from_dict(spec)
    return alt.Chart.from_dict(spec)


def theme_spec(spec: dict, *, width="single", height=None, font: str = "serif", size: float = 8.0) -> dict:
    total = width_points(width)
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


def _svg_width(spec: dict) -> float:
    """The width in points of the figure vl-convert draws for ``spec`` (its SVG canvas)."""
    head = figure_bytes(spec, "svg")[:400].decode("utf-8", "replace")
    return float(re.search(r'width="([0-9.]+)"', head).group(1))


def fit_width(spec: dict, width, tries: int = 4) -> dict:
    """Narrow or widen the panels of a concatenated figure until the drawn figure is at
    most ``width`` points wide and less than 2 pt narrower (Vega-Lite's autosize "fit" does
    not apply to concatenations, and axis labels and legends take room no rule of thumb
    predicts, so the figure is measured; the widest try that fits is kept, since a label that
    appears or goes makes the drawn width jump). A single view is returned as it is (autosize
    "fit" sizes it exactly)."""
    total = width_points(width)
    key = next((k for k in ("hconcat", "vconcat", "concat") if k in spec), None)
    if key is None:
        return spec
    panels = [p for p in spec[key] if "width" in p and not any(k in p for k in ("hconcat", "vconcat", "concat"))]
    if not panels:
        return spec
    best = None  # (drawn width, panel widths) of the widest try that fits
    for attempt in range(2 * tries):
        drawn = _svg_width(spec)
        slack = total - drawn  # > 0: room left; < 0: overflow
        if slack >= 0 and (best is None or drawn > best[0]):
            best = (drawn, [panel["width"] for panel in panels])
        if 0 <= slack < 2 or (attempt >= tries - 1 and best is not None):
            break
        # axis labels make the drawn width jump (a log axis gains a label): past the first
        # tries, shrink by a point more each time until one fits
        share = (slack if key == "vconcat" else slack / len(panels)) - max(0, attempt - tries + 2)
        for panel in panels:
            panel["width"] = max(float(panel["width"]) + share - 0.25, 20.0)
    if best is not None:
        for panel, width_ in zip(panels, best[1]):
            panel["width"] = width_
    return spec


def apply_paper_theme(chart, *, width="single", height=None, font: str = "serif", size: float = 8.0):
    """Return a copy of ``chart`` resized to a paper width, with the paper config (replacing
    any config of its own).

    A single or layered view fits the whole figure, axes and legend included, into
    ``width`` x ``height`` points (autosize "fit"); a concatenated chart splits the width
    between its panels, measured and adjusted until it fits (`fit_width`).
    Interactive params stay in the spec; a static export shows their initial values.
    """
    spec = theme_spec(spec_of(chart), width=width, height=height, font=font, size=size)
    return to_chart(fit_width(spec, width))


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


def _text_size(value, size: float) -> float:
    """A mark's text size in print: at most one point below the labels, never below 7 pt."""
    return max(min(float(value), size - 1), MIN_FONT_SIZE)


# Unicode sub- and superscripts are missing from the paper fonts (a viewer then borrows them
# from another family): printed as plain characters, "σₖ(Hₜ)" -> "σk(Ht)", "log₁₀" -> "log10".
_PLAIN = str.maketrans("₀₁₂₃₄₅₆₇₈₉ₖₜₙᵢⱼₗ⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789ktnijl0123456789-")


def plain_text(node):
    """``node`` (a spec or part of it) with every string's sub/superscripts made plain;
    data is left alone."""
    if isinstance(node, str):
        return node.translate(_PLAIN)
    if isinstance(node, list):
        return [plain_text(item) for item in node]
    if isinstance(node, dict):
        return {k: (v if k in ("data", "datasets", "values") else plain_text(v)) for k, v in node.items()}
    return node


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
            mark["fontSize"] = _text_size(mark["fontSize"], size)
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
            mark["fontSize"] = _text_size(mark.get("fontSize", size - 1), size)
        _seamless_heatmap(mark, encoding)
        for channel in ("x", "y"):
            _quiet_log_axis(encoding.get(channel))
    for key, value in node.items():
        if key not in ("data", "datasets", "encoding", "mark"):
            _paperise_node(value, size)


def paperise_spec(spec: dict, size: float) -> dict:
    """`paperise` on a spec dict (in place, and returned), sub/superscripts made plain."""
    _paperise_node(spec, size)
    plain = plain_text(spec)
    spec.clear()
    spec.update(plain)
    return spec


def paperise(chart, *, size: float = 8.0):
    """A copy of a widget view (specs.py) fit for print: no titles, print-size text and
    marks, selection highlights resolved to their unselected look, pixel-placed annotation
    text dropped (it does not scale to a column). The params stay: a view such as the
    spectrum filters its data by the selected t, whose initial value is the t shown."""
    return to_chart(paperise_spec(spec_of(chart), size))


def stacked(spec: dict) -> dict:
    """An hconcat spec as a vconcat whose panels all label their y axis."""

    def show_labels(node):
        if isinstance(node, dict):
            axis = node.get("axis")
            if isinstance(axis, dict) and axis.get("labels") is False:
                axis.pop("labels")
            for value in node.values():
                show_labels(value)
        elif isinstance(node, list):
            for item in node:
                show_labels(item)

    panels = spec.pop("hconcat")
    show_labels(panels)
    spec.pop("spacing", None)
    spec["vconcat"] = panels
    return spec


# Room around a panel's plot that its axes and legend take (points): an estimate, generous,
# since a label left out costs less than two drawn over each other.
_AXIS_ROOM = 45


def _layer_order(spec: dict) -> list:
    """Every layer label and layer index in the figure's data, in layer order."""
    rows = [row for data in spec.get("datasets", {}).values() for row in data if isinstance(row, dict)]
    pairs = sorted({(row["layer"], row.get("label", row["layer"])) for row in rows if "layer" in row})
    return pairs


def thin_layer_axes(spec: dict, size: float) -> None:
    """Layer axes of a figure show every k-th layer where all would not fit at print size: the
    labels left out are not drawn at all (Vega's own overlap removal only hides them, and a PDF
    still holds the hidden text). Rows (y) need a line of text each; columns (x) the width of
    their longest label. The panel size is the nearest one set above the axis (theme_spec)."""
    pairs = _layer_order(spec)
    if not pairs:
        return

    def visit(node, width, height):
        if isinstance(node, list):
            for item in node:
                visit(item, width, height)
            return
        if not isinstance(node, dict):
            return
        width = node["width"] if isinstance(node.get("width"), (int, float)) else width
        height = node["height"] if isinstance(node.get("height"), (int, float)) else height
        encoding = node.get("encoding")
        for channel, room in (("y", height), ("x", width)):
            enc = encoding.get(channel) if isinstance(encoding, dict) else None
            if not isinstance(enc, dict) or enc.get("type") not in ("nominal", "ordinal") or room is None:
                continue
            if enc.get("field") == "label":
                values = [label for _, label in pairs]
            elif enc.get("field") == "layer":
                values = sorted({layer for layer, _ in pairs})
            else:
                continue
            longest = max(len(str(v)) for v in values)
            need = size * 1.3 if channel == "y" else longest * size * 0.6 + 4
            fit = max(1, int((room - _AXIS_ROOM) // need))
            step = -(-len(values) // fit)
            if step > 1 and isinstance(enc.get("axis", {}), dict):
                enc["axis"] = {**enc.get("axis", {}), "values": values[::step]}
        for key, value in node.items():
            if key not in ("data", "datasets", "encoding"):
                visit(value, width, height)

    visit(spec, None, None)
