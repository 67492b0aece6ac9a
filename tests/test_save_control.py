"""The explorer's "save figure" control (app/save_control.py) and the hints of its expert
controls (app/expert_controls.py), driven from Python on the synthetic reference result."""

from __future__ import annotations

import re

import pytest

import ess_explorer.views.figures as figures
from ess_explorer.app import expert_controls, save_control, widget
from ess_explorer.synthetic import reference_result
from ess_explorer.views.theme import PAPER_WIDTHS

MAGIC = {"pdf": b"%PDF-", "png": b"\x89PNG\r\n\x1a\n"}


@pytest.fixture
def ex():
    return widget.explore(result=reference_result(24), static=False)


@pytest.fixture
def calls(monkeypatch):
    """The keywords each `figure` call received (the real figure is drawn)."""
    seen = []
    real = figures.figure

    def spy(result, kind, **kw):
        seen.append({"result": result, "kind": kind, **kw})
        return real(result, kind, **kw)

    monkeypatch.setattr(figures, "figure", spy)
    return seen


def _state(ex, layer, t, variant):
    ex.layer, ex.variant = layer, variant
    ex.selected_t = t


@pytest.mark.parametrize(
    "view, fmt, width",
    [("ess_time", "pdf", "single"), ("spectrum", "svg", "double"), ("operator", "png", "single")],
)
def test_save_writes_the_current_view_at_the_chosen_width_and_format(
    ex, calls, tmp_path, monkeypatch, view, fmt, width
):
    monkeypatch.chdir(tmp_path)  # the notebook's working directory
    layer = sorted(ex.result.layers)[1]
    t = int(ex.result.layer(layer).positions[5])
    _state(ex, layer, t, "causal")
    saver = ex.saver
    saver.view_w.value, saver.format_w.value, saver.width_w.value = view, fmt, width
    saver.name_w.value = "my_figure.pdf"  # a typed suffix of another format is replaced
    path = saver.save()
    assert path == tmp_path / f"my_figure.{fmt}" and path.exists()
    data = path.read_bytes()
    if fmt == "svg":
        drawn = float(re.search(rb'<svg[^>]* width="([0-9.]+)"', data)[1])
        assert PAPER_WIDTHS[width] - 2 <= drawn <= PAPER_WIDTHS[width], "the paper width, axes included"
    else:
        assert data.startswith(MAGIC[fmt])
    (call,) = calls
    assert call["result"] is ex.result and call["kind"] == view and call["width"] == width
    if view == "ess_time":
        assert call["layers"] == [layer] and call["variant"] == "causal" and call["unit"] == ex.unit
    else:
        assert call["layer"] == layer and call["t"] == t
    assert str(path) in ex.status_w.value and "✓" in ex.status_w.value


def test_save_overview_and_diagnostics_follow_the_metric_and_variant(ex, calls, tmp_path):
    ex.overview_metric, ex.variant = "ess", "entropy"
    ex.saver.name_w.value = str(tmp_path / "overview")
    ex.saver.view_w.value = "overview"
    assert ex.saver.save().suffix == ".pdf"
    ex.saver.view_w.value = "diagnostics"
    ex.saver.name_w.value = str(tmp_path / "diagnostics")
    assert ex.saver.save().exists()
    assert calls[0]["value"] == "ess" and calls[0]["variant"] == "entropy"
    assert calls[1]["variant"] == "entropy" and calls[1]["saturated"] == ex.saturated


def test_a_failed_save_is_said_and_leaves_the_explorer_as_it_was(ex, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    layer = sorted(ex.result.layers)[2]
    ex.layer = layer
    spec_before = ex.chart.spec
    ex.saver.name_w.value = "   "
    assert ex.saver.save() is None
    assert "figure not saved" in ex.status_w.value and "file name" in ex.status_w.value
    assert ex.layer == layer and ex.chart.spec is spec_before and not list(tmp_path.iterdir())


def test_figure_path_refuses_an_unknown_format():
    with pytest.raises(ValueError, match="pdf, svg, png"):
        save_control.figure_path("x", "jpg")


def test_expert_controls_say_what_they_do_and_sit_apart(ex):
    hints = expert_controls.EXPERT_HINTS
    assert ex.scope_w.tooltip == hints["scope"] and ex.gates_w.tooltip == hints["gates"]
    assert set(ex.relative_w.tooltips) == {hints["relative"]}
    (advanced,) = [c for c in ex.children if isinstance(c, widget.W.Accordion)]
    assert advanced.selected_index is None, "closed: a first look needs none of them"
    inside = [w for row in advanced.children[0].children for w in row.children]
    assert {ex.relative_w, ex.scope_w, ex.gates_w} <= set(inside)
    texts = " ".join(w.value for w in inside if isinstance(w, widget.W.HTML))
    assert "σ₁" in texts and "runs the analysis again" in texts
    everyday = next(row for row in ex.children if ex.layer_w in getattr(row, "children", ()))
    assert not {ex.relative_w, ex.scope_w, ex.gates_w} & set(everyday.children)


def test_the_unit_menu_is_as_wide_as_its_longest_label(ex):
    labels = [label for label, _ in ex.unit_w.options]
    chars = int(re.match(r"calc\((\d+)ch", ex.unit_w.layout.width)[1])
    assert chars > len("unit") + max(len(label) for label in labels), ex.unit_w.layout.width
    assert [value for _, value in ex.unit_w.options][:3] == ["mean", "max", "sum"]  # the aggregates lead
