"""The explorer's "save figure" control: the view on screen as a paper figure, in one click.

A view dropdown (ESS over time, spectrum, operator, overview, diagnostics), the format (PDF,
SVG, PNG), the width (a single or a double column of a two-column paper) and a file name;
"save" draws the view for the explorer's current layer, unit, variant and t through the
same path as the API, ``save_figure(figure(result, kind, width=...), path)``, into the
notebook's working directory (a relative name) and says the path it wrote in the status
line, or the error: the explorer's state is never touched.
"""

from __future__ import annotations

from pathlib import Path

import ipywidgets as W

from ..views.theme import PAPER_WIDTHS

__all__ = ["SaveControl", "FIGURE_VIEWS", "FORMATS", "figure_options", "figure_path"]

# The explorer's views by the name the control shows, as figure kinds (views/figures.py).
FIGURE_VIEWS = {
    "ESS over time": "ess_time",
    "spectrum": "spectrum",
    "operator": "operator",
    "overview": "overview",
    "diagnostics": "diagnostics",
}
FORMATS = ("pdf", "svg", "png")


def figure_options(e, kind: str) -> dict:
    """The `figure` keywords that draw explorer ``e``'s view ``kind`` as it is on screen: its
    layer, unit (the spectrum and operator show one unit: the one the views show for an
    aggregate), variant, t (the selected cut, else the one the views open on) and overview metric."""
    from ..views.charts import focus_unit
    from .live_chart import shown_position

    layer, unit, variant = e.layer, e.unit, e.variant
    if kind == "ess_time":
        return {"layers": [layer], "variant": variant, "unit": unit}
    if kind == "spectrum":
        tol = {"tol": e.tol} if e.relative else {}
        return {"layer": layer, "unit": focus_unit(e.result, layer, unit), "t": shown_position(e), **tol}
    if kind == "operator":
        return {"layer": layer, "unit": focus_unit(e.result, layer, unit), "t": shown_position(e), "variant": variant}
    if kind == "overview":
        return {"variant": variant, "unit": unit if isinstance(unit, str) else "mean", "value": e.overview_metric}
    if kind == "diagnostics":
        return {"variant": variant, "saturated": e.saturated, "collapsed": e.collapsed}
    raise ValueError(f"unknown view {kind!r}; views: {', '.join(FIGURE_VIEWS.values())}")


def figure_path(name: str, fmt: str, folder: Path | None = None) -> Path:
    """Where the figure goes: ``name`` with the format's suffix (a suffix typed for another
    format is replaced), relative to ``folder`` (default: the working directory)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    name = name.strip()
    if not name:
        raise ValueError("type a file name for the figure (e.g. ess_layer1)")
    path = Path(name)
    if path.suffix.lower() in tuple(f".{f}" for f in FORMATS):
        path = path.with_suffix("")
    path = path.with_name(f"{path.name}.{fmt}")
    return path if path.is_absolute() else (folder or Path.cwd()) / path


class SaveControl:
    """The control row of explorer ``e`` (``box``); `save` is what its button does."""

    def __init__(self, e):
        self.e = e
        self.view_w = W.Dropdown(options=list(FIGURE_VIEWS.items()), value="ess_time", layout=W.Layout(width="150px"))
        self.format_w = W.ToggleButtons(options=[(f.upper(), f) for f in FORMATS], style={"button_width": "48px"})
        self.width_w = W.ToggleButtons(
            options=[(f"{name} column", name) for name in PAPER_WIDTHS],
            tooltips=[f"{points} pt wide" for points in PAPER_WIDTHS.values()],
            style={"button_width": "128px"},
        )
        self.name_w = W.Text(value="ess_figure", placeholder="file name", layout=W.Layout(width="160px"))
        self.save_w = W.Button(description="save figure", icon="download", tooltip="write the view to the file")
        self.save_w.on_click(lambda _: self.save())
        self.box = W.HBox(
            [self.view_w, self.format_w, self.width_w, self.name_w, self.save_w],
            layout=W.Layout(align_items="center", flex_flow="row wrap"),
        )

    def save(self) -> Path | None:
        """Write the chosen view of the explorer's result; the path (None on failure, said in
        the status line)."""
        from ..views.figures import figure
        from ..views.render import save_figure

        e = self.e
        try:
            if e.result is None:
                raise ValueError("nothing to save yet: analyse a prompt first")
            kind, fmt = self.view_w.value, self.format_w.value
            path = figure_path(self.name_w.value, fmt)
            chart = figure(e.result, kind, width=self.width_w.value, **figure_options(e, kind))
            written = save_figure(chart, path)
        except Exception as error:  # noqa: BLE001  (said in the status line; the explorer stays as it is)
            e.status.say(f"figure not saved: {type(error).__name__}: {error}", "error")
            return None
        e.status.say(f"saved {self.view_w.label} ({self.width_w.value} column) to {written}", "ok")
        return written
