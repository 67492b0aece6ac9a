"""The explorer's chart fits its output area: measured in the browser, sized in Python.

The linked views are one Vega-Lite concatenation whose panels have fixed widths (about
1000 px drawn). Vega-Lite's ``width: "container"`` does not apply to a concatenation, and
scaling the drawn SVG with CSS would move every click away from the mark under the
pointer (Vega reads pointer positions in unscaled pixels). So the browser only measures:
`WidthProbe`, an anywidget of no size beside the chart, reports the width the output area
gives the explorer (its root box, 100% wide) and the width the chart takes there (its
``.vega-embed`` element, the action menu included), as one pair after each redraw. `ChartFit` turns the two into a factor
for the panel widths (`scaled_spec`) and asks for a redraw when the factor changes.

The drawn width is ``a * scale + b``: the panels scale, their axes, legends and the action
menu (``b``) do not. After one measurement the factor goes down in proportion (which leaves
the chart still too wide by part of ``b``); after two at different factors ``a`` and ``b``
are solved for and the next factor fits. A factor never exceeds 1 (the designed size) nor
falls below MIN_SCALE (the text would no longer fit the panels). Titles, legends and axes do
not narrow, so when panels side by side would need a factor below STACK_BELOW (JupyterLab at
1100 px with the file browser open: about 670 px), they are stacked one above the other
(`scaled_spec(stacked=True)`) and fitted again; with GROW_SLACK_PX more room than when they
were stacked, they go side by side again. Outside a browser nothing is measured and the
chart keeps its designed layout and size.
"""

from __future__ import annotations

import copy
from typing import Callable

import anywidget
import traitlets as T

__all__ = [
    "WidthProbe",
    "ChartFit",
    "scaled_spec",
    "next_scale",
    "MIN_SCALE",
    "PANEL_MIN_PX",
    "STACK_BELOW",
    "MARGIN_PX",
    "GROW_SLACK_PX",
]

MIN_SCALE = 0.4  # below this the axis titles no longer fit their panels
PANEL_MIN_PX = 200  # a narrower panel would crowd its labels (the thresholds' names on utilisation)
STACK_BELOW = 0.75  # side by side at a smaller factor, the legends would crowd the panels
MARGIN_PX = 6  # room kept between the chart and the edge of the output area
GROW_SLACK_PX = 40  # a narrower chart grows back only when this much room is unused

_PROBE_ESM = """
export default {
  render({ model, el }) {
    el.classList.add("ess-width-probe");
    el.style.height = "0px";
    el.style.overflow = "hidden";
    let last = "", resize = null, redrawn = null, tries = 0, timer = null, ticker = null, sent = 0, waited = 0;
    // the explorer's root box is as wide as the output area (width 100%); the probe itself has
    // no width. The view is rendered before it is attached: wait for the root to appear.
    const start = () => {
      const root = el.closest(".ess-explorer");
      if (!root) {
        if (tries++ < 400) timer = setTimeout(start, 50);
        return;
      }
      const measure = () => {
        const embed = root.querySelector(".vega-embed");
        if (!embed || !embed.querySelector("svg")) return;  // no chart yet, or one being replaced
        const available = Math.floor(root.getBoundingClientRect().width);
        const drawn = Math.ceil(Math.max(embed.scrollWidth, embed.getBoundingClientRect().width));
        const key = available + "x" + drawn;
        el.dataset.measured = key;  // what was measured last (seen in the page's DOM)
        // still too wide two seconds after the last report: a redraw was lost, report again
        waited = key === last && drawn > available ? waited + 1 : 0;
        if (available > 0 && (key !== last || waited >= 2)) {
          last = key;
          waited = 0;
          // a custom message, not a state change: state changes wait for the kernel's reply to
          // the previous one, and a lost reply would hold every later report back
          model.send({ measured: [available, drawn, ++sent] });
        }
      };
      ticker = setInterval(measure, 1000);
      resize = new ResizeObserver(measure);
      resize.observe(root);
      redrawn = new MutationObserver(() => requestAnimationFrame(measure));
      redrawn.observe(root, { childList: true, subtree: true, attributes: true, attributeFilter: ["width"] });
      requestAnimationFrame(measure);
    };
    start();
    return () => {
      clearTimeout(timer);
      clearInterval(ticker);
      if (resize) resize.disconnect();
      if (redrawn) redrawn.disconnect();
    };
  }
};
"""


class WidthProbe(anywidget.AnyWidget):
    """Reports, from the browser, ``measured`` = (the explorer's width, its chart's width, the
    report's number), widths in CSS pixels measured after the same redraw; (0, 0, 0) before
    anything is measured. A chart still too wide is reported again every two seconds (a
    redraw can be lost while the page re-attaches the output)."""

    _esm = _PROBE_ESM
    measured = T.Tuple(T.Int(), T.Int(), T.Int(), default_value=(0, 0, 0))

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.on_msg(self._on_report)

    def _on_report(self, _widget, content, _buffers) -> None:
        report = content.get("measured") if isinstance(content, dict) else None
        if isinstance(report, list) and len(report) == 3 and all(isinstance(v, int) for v in report):
            self.measured = tuple(report)


def next_scale(
    scale: float, available: int, drawn: int, previous: tuple[float, int] | None = None
) -> tuple[float, tuple[float, int] | None]:
    """(the factor for the panel widths, the measurement to keep) after the chart drawn at
    ``scale`` measured ``drawn`` px in an area of ``available`` px. ``previous``: an
    earlier (scale, drawn) at another factor, from which the fixed part is solved (module
    docstring). The factor stays when the chart fits with less than GROW_SLACK_PX unused.

    A chart too wide always narrows by at least the proportional step and 1% (a pair measured
    across two redraws, say while the analysis updates the views, can give a wrong slope, and
    a step too small to redraw would leave the chart too wide); a chart with room grows by the
    proportional step only, which never overshoots (the fixed part does not grow)."""
    if available <= 0 or drawn <= 0:
        return scale, previous
    target = available - MARGIN_PX
    if target >= drawn and (scale >= 1 or drawn >= target - GROW_SLACK_PX):
        return scale, (scale, drawn)
    wanted = scale * target / drawn  # as if everything scaled
    if drawn > target:
        solved = wanted
        if previous is not None and abs(previous[0] - scale) > 1e-6:
            slope = (drawn - previous[1]) / (scale - previous[0])  # px per unit of factor: the panels' a
            fixed = drawn - slope * scale
            if slope > 0 and fixed >= 0:
                solved = (target - fixed) / slope
        wanted = min(solved, wanted, scale - 0.01)
    return min(1.0, max(MIN_SCALE, wanted)), (scale, drawn)


def scaled_spec(spec: dict, scale: float, *, stacked: bool = False) -> dict:
    """A copy of the linked spec ``spec`` whose panels are ``scale`` times as wide: every
    numeric ``width`` (none below PANEL_MIN_PX, or its designed width when smaller), the
    ``height`` of a square panel (the operator) and the x of marks placed by value (the labels
    at a panel's edge) with their panel. ``stacked``: each row of panels side by
    side (an ``hconcat`` in the top ``vconcat``) becomes one row per panel; the panels and
    their params keep their names, so the links between the views stay. ``spec`` itself is
    not changed; the datasets are shared, not copied."""
    if scale == 1 and not stacked:
        return spec
    data = spec.get("datasets")
    out = copy.deepcopy({k: v for k, v in spec.items() if k != "datasets"})
    if stacked and "vconcat" in out:
        out["vconcat"] = [panel for row in out["vconcat"] for panel in row.get("hconcat", [row])]
    _scale_node(out, scale)
    if data is not None:
        out["datasets"] = data
    return out


def _scale_node(node, scale: float, factor: float | None = None) -> None:
    """Narrow the panels under ``node`` by ``scale``, none below PANEL_MIN_PX (or its designed
    width, when smaller); ``factor``: the enclosing panel's own, for marks placed by value."""
    if isinstance(node, list):
        for item in node:
            _scale_node(item, scale, factor)
        return
    if not isinstance(node, dict):
        return
    width = node.get("width")
    if isinstance(width, (int, float)) and not isinstance(width, bool) and width > 0:
        narrowed = round(max(width * scale, min(width, PANEL_MIN_PX)), 1)
        factor = narrowed / width
        if node.get("height") == width:
            node["height"] = narrowed
        node["width"] = narrowed
    x = node.get("encoding", {}).get("x") if isinstance(node.get("encoding"), dict) else None
    if isinstance(x, dict) and isinstance(x.get("value"), (int, float)):
        x["value"] = round(x["value"] * (scale if factor is None else factor), 1)
    for key, value in node.items():
        if key not in ("encoding", "datasets", "data"):
            _scale_node(value, scale, factor)


class ChartFit:
    """The factor the explorer's panels are drawn at (1: their designed size) and whether
    they are stacked, kept in step with ``probe``'s measurements (module docstring);
    ``redraw()`` is called when either changes."""

    def __init__(self, probe: WidthProbe, redraw: Callable[[], None]):
        self.probe, self.redraw = probe, redraw
        self.scale, self.stacked = 1.0, False
        self._previous: tuple[float, int] | None = None
        self._stacked_at = 0  # the width at which the panels were stacked
        probe.observe(self._measured, names="measured")

    def _measured(self, change) -> None:
        available, drawn, _report = change["new"]
        scale, previous = next_scale(self.scale, available, drawn, self._previous)
        stacked = self.stacked
        if not stacked and scale < STACK_BELOW:
            stacked, self._stacked_at = True, available
        elif stacked and available > self._stacked_at + GROW_SLACK_PX:
            stacked = False
        if stacked != self.stacked:  # another layout: fitted afresh from its designed size
            scale, previous = 1.0, None
        self._previous = previous
        if abs(scale - self.scale) > 0.005 or stacked != self.stacked:
            self.scale, self.stacked = scale, stacked
            self.redraw()
