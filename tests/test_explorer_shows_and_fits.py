"""The explorer shows itself once where explore() is called (app/shown_once.py) and sizes its
panels to the width the browser reports (app/fit.py). The browser side of both is checked in
test_browser_explorer.py; here a fake kernel shell and fake measurements drive the Python side.
"""

from __future__ import annotations

import IPython
import IPython.display
import pytest

from ess_explorer.app import fit, widget
from ess_explorer.synthetic import reference_result

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


class FakeKernelShell:
    """What app/shown_once.py reads of a kernel's shell: a kernel and the cell's execution count."""

    kernel = object()
    execution_count = 5


@pytest.fixture
def drawn(monkeypatch):
    """The widget views the notebook would draw: each display of a widget's view bundle."""
    views = []
    shell = FakeKernelShell()

    def display(obj, raw=False, **_):
        if raw:
            if WIDGET_MIME in obj:
                views.append(obj[WIDGET_MIME]["model_id"])
        else:
            obj._ipython_display_()  # what IPython's formatter does with such an object

    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    monkeypatch.setattr(IPython.display, "display", display)
    return views, shell


def _explore():
    return widget.explore(result=reference_result(24), static=False)


def test_an_assigned_explore_shows_the_explorer(drawn):
    views, _ = drawn
    ex = _explore()  # `ex = explore()`: no cell result to show
    assert views == [ex.model_id]


def test_explore_as_the_last_line_shows_once_and_a_later_cell_shows_it_again(drawn):
    views, shell = drawn
    ex = _explore()
    IPython.display.display(ex)  # the cell's own result, shown by the display hook in the same cell
    assert views == [ex.model_id], "shown once, not twice"
    shell.execution_count += 1  # the next cell: `ex` on its own line
    IPython.display.display(ex)
    assert views == [ex.model_id, ex.model_id]


def test_the_ess_magic_shows_its_explorer_once(drawn, tmp_path):
    from ess_explorer.app import magic

    views, _ = drawn
    path = reference_result(20).save(tmp_path / "r.npz")
    ex = magic.ess_magic(f"--result {path}")  # the magic returns the explorer: the cell's result
    IPython.display.display(ex)
    assert views == [ex.model_id]


def test_outside_a_kernel_explore_displays_nothing(drawn, monkeypatch):
    views, _ = drawn
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)  # a script, or no IPython
    _explore()
    assert views == []


def test_scaled_spec_narrows_the_panels_and_keeps_the_original():
    spec = {
        "vconcat": [
            {"width": 720, "height": 190, "layer": [{"mark": "text", "encoding": {"x": {"value": 720}}}]},
            {"hconcat": [{"width": 270, "height": 270}, {"width": 130, "height": 40}]},
        ],
        "datasets": {"d": [{"t": 1}]},
    }
    half = fit.scaled_spec(spec, 0.5)
    assert half["vconcat"][0]["width"] == 360 and half["vconcat"][0]["height"] == 190
    assert half["vconcat"][0]["layer"][0]["encoding"]["x"] == {"value": 360}, "a label at the edge moves with it"
    floor = fit.PANEL_MIN_PX
    assert [p["width"] for p in half["vconcat"][1]["hconcat"]] == [floor, 130], "none below the floor, none widened"
    assert half["vconcat"][1]["hconcat"][0]["height"] == floor, "a square panel stays square"
    assert half["vconcat"][1]["hconcat"][1]["height"] == 40
    assert half["datasets"] is spec["datasets"], "the data is shared, not copied"
    assert spec["vconcat"][0]["width"] == 720, "the cached structure is not changed"
    assert fit.scaled_spec(spec, 1) is spec


def _drawn_width(scale: float, panels: float = 900, fixed: float = 200) -> int:
    """A chart whose panels take ``panels`` px at scale 1 and whose axes and menu take ``fixed``."""
    return round(panels * scale + fixed)


def test_next_scale_fits_in_two_measurements():
    available = 700
    scale, previous = fit.next_scale(1.0, available, _drawn_width(1.0))
    assert scale < 1 and _drawn_width(scale) > available - fit.MARGIN_PX, "a proportional first step"
    scale, previous = fit.next_scale(scale, available, _drawn_width(scale), previous)
    assert available - fit.MARGIN_PX - 1 <= _drawn_width(scale) <= available - fit.MARGIN_PX
    assert fit.next_scale(scale, available, _drawn_width(scale), previous)[0] == scale, "a fitting chart stays"


def test_next_scale_grows_back_but_never_past_the_designed_size_nor_below_the_floor():
    scale, previous = fit.next_scale(0.5, 1400, _drawn_width(0.5))
    assert scale == 1.0
    assert fit.next_scale(1.0, 300, _drawn_width(1.0))[0] == fit.MIN_SCALE
    assert fit.next_scale(0.8, 0, 0)[0] == 0.8, "nothing measured (no browser): unchanged"


def test_the_explorer_redraws_at_the_width_its_browser_reports(drawn):
    ex = _explore()
    designed = ex.chart.spec["vconcat"][0]["width"]
    ex.views.probe.measured = (900, 1000, 1)  # what the probe's JS sends: a little too wide
    assert ex.views.fit.scale < 1 and not ex.views.fit.stacked
    assert ex.chart.spec["vconcat"][0]["width"] == pytest.approx(designed * ex.views.fit.scale, abs=0.1)
    ex.layer = sorted(ex.result.layers)[1]  # a redraw for another reason keeps the fitted width
    assert ex.chart.spec["vconcat"][0]["width"] == pytest.approx(designed * ex.views.fit.scale, abs=0.1)


def test_stacked_puts_each_panel_in_a_row_of_its_own():
    spec = {"vconcat": [{"width": 720}, {"hconcat": [{"name": "a", "width": 360}, {"name": "b", "width": 270}]}]}
    stacked = fit.scaled_spec(spec, 1.0, stacked=True)
    assert [p.get("name") for p in stacked["vconcat"]] == [None, "a", "b"]
    assert "hconcat" in spec["vconcat"][1], "the original keeps its rows"


def test_a_narrow_output_area_stacks_the_panels_and_a_wide_one_puts_them_back(drawn):
    ex = _explore()
    rows = len(ex.chart.spec["vconcat"])
    ex.views.probe.measured = (660, 1010, 1)  # JupyterLab at 1100 px with the file browser open
    assert ex.views.fit.stacked and ex.views.fit.scale == 1.0, "stacked, then fitted afresh"
    assert len(ex.chart.spec["vconcat"]) > rows and not any("hconcat" in row for row in ex.chart.spec["vconcat"][:3])
    ex.views.probe.measured = (660, 700, 2)  # the stacked chart, still too wide: it narrows
    assert ex.views.fit.stacked and ex.views.fit.scale < 1
    ex.views.probe.measured = (1300, 640, 3)  # the window grew
    assert not ex.views.fit.stacked and len(ex.chart.spec["vconcat"]) == rows


def test_a_chart_too_wide_always_narrows_even_after_a_misleading_pair():
    """A previous pair measured across two redraws gives a steep slope, whose solution would be
    within a rounding step of the current factor: the chart narrows anyway."""
    scale, _ = fit.next_scale(0.9, 934, 963, previous=(0.95, 1900))
    assert scale <= 0.9 * (934 - fit.MARGIN_PX) / 963 and scale <= 0.89


def test_the_probe_takes_its_reports_as_messages_and_ignores_malformed_ones():
    probe = fit.WidthProbe()
    probe._on_report(probe, {"measured": [900, 1000, 1]}, [])
    assert probe.measured == (900, 1000, 1)
    probe._on_report(probe, {"measured": ["wide", 1000, 2]}, [])
    assert probe.measured == (900, 1000, 1)
