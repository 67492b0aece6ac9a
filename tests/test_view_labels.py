"""The views say what they show: variant names, the spectrum panel against the curve, the
attainable ceiling per variant, the k axis, the tooltip and the unit menu.

Expected numbers come from the result's arrays (computed by the core) or from numpy on them,
never from the view code.
"""

from __future__ import annotations

import json

import pytest
from test_charts import _walk  # every dict inside a spec

from ess_explorer.synthetic import reference_result
from ess_explorer.views import charts, labels
from ess_explorer.views.specs import K_TICKS_ALL

L = 48


@pytest.fixture(scope="module")
def result():
    return reference_result(L)


def _rows(result, **kw) -> dict:
    return {row["t"]: row for row in charts.linked_data(result, **kw)[charts.DATASETS["time"]]}


@pytest.mark.parametrize(
    "variant, name, other",
    [
        ("tolerance", "tolerance-ESS", "entropy"),
        ("entropy", "entropy-ESS", "tolerance"),
        ("causal", "causal ESS", "entropy"),
    ],
)
def test_the_curve_is_named_by_its_variant(result, variant, name, other):
    (row,) = charts.linked_data(result, layer=2, variant=variant)[charts.DATASETS["labels"]]
    assert row["variant"].startswith(name) and other not in row["variant"]
    # the ceiling it is judged against: causal ESS counts R_t (state x t), no L - t
    assert row["ceiling"] == ("ceiling min(TSS, t)" if variant == "causal" else "ceiling min(TSS, t, L−t)")


@pytest.mark.parametrize("variant", ["tolerance", "entropy", "causal"])
def test_for_one_unit_the_panel_states_the_curves_number(result, variant):
    """Layer 2 (Mamba, 4 channels), channel 1: the panel's statement leads with that channel's
    ESS of the variant the curve shows, the curve's own value at t."""
    lay = result.layer(2)
    stored = {"tolerance": lay.tolerance_ess, "entropy": lay.entropy_ess, "causal": lay.causal_ess}[variant][1]
    rows = _rows(result, layer=2, unit=1, variant=variant)
    for t in (5, 20, 40):
        row = rows[t]
        assert row["ess"] == pytest.approx(stored[t], rel=1e-3)
        lead = row["count_label"].split(" · ")[0]
        number = float(lead.split()[2 if variant == "causal" else 1].replace(",", ""))
        assert number == pytest.approx(stored[t], rel=1e-2), row["count_label"]
        assert row["curve_label"] == "", "a single unit: the panel's number is the curve's"
    assert "causal ESS" in rows[5]["count_label"] if variant == "causal" else "causal" not in rows[5]["count_label"]


def test_for_an_aggregate_the_panel_gives_the_curves_value_beside_the_drawn_unit(result):
    lay = result.layer(2)
    rows = _rows(result, layer=2, unit="mean", variant="entropy")
    expected = lay.entropy_ess.mean(0)
    for t in (5, 20):
        text = rows[t]["curve_label"]
        assert text.startswith("the curve at this t: entropy-ESS mean over 4 channels")
        assert float(text.rsplit("= ", 1)[1]) == pytest.approx(expected[t], rel=1e-2)
        # and the drawn channel's own entropy-ESS leads the panel's statement
        assert float(rows[t]["count_label"].split()[1]) == pytest.approx(lay.entropy_ess[0, t], rel=1e-2)
    spec = charts.spectrum(result, layer=2, unit="mean", variant="entropy").to_dict()
    assert spec["title"]["subtitle"][0] == "channel 0 drawn, one of the 4 the curve's mean is over"
    texts = [node["encoding"]["text"].get("field") for node in _walk(spec) if "text" in node.get("encoding", {})]
    assert "curve_label" in texts


def test_causal_ess_stays_under_its_ceiling_and_utilisation_under_one(result):
    """Attention's causal ESS is t (the KV cache): above min(t, L - t) past L/2, so it is
    judged against min(TSS, t); every variant's utilisation is then at most 1."""
    lay = result.layer(0)
    rows = _rows(result, layer=0, unit=0, variant="causal")
    assert all(row["ess"] <= row["ceiling"] + 1e-9 for row in rows.values())
    assert rows[40]["ceiling"] == pytest.approx(min(lay.tss[0, 40], 40)) and rows[40]["ceiling"] > L - 40
    for variant in ("tolerance", "entropy", "causal"):
        for row in charts.diagnostics_data(result, variant=variant):
            assert row["utilisation"] is None or 0 <= row["utilisation"] <= 1 + 1e-9, (variant, row)


def test_an_undefined_variant_is_said_not_sent_as_nan(result):
    """A short conv has no realisation: its causal ESS is NaN. The diagnostics say so and the
    data stays strict JSON (a NaN breaks the browser's parser)."""
    data = charts.linked_data(result, layer=1, variant="causal")
    json.dumps(data, allow_nan=False)
    (conv,) = [row for row in data[charts.DATASETS["diagnostics"]] if row["layer"] == 1]
    assert conv["utilisation"] is None and conv["state"] == "n/a"
    spec = charts.diagnostics_chart(result, variant="causal").to_dict()
    assert any(node.get("value") == "not defined for this variant" for node in _walk(spec))


def test_few_singular_values_get_one_tick_each(result):
    """Layer 2 keeps 4 values per cut: ticks 1, 2, 3, 4, never a repeated label."""
    spec = charts.spectrum(result, layer=2, unit=0).to_dict()
    (axis,) = [node["axis"] for node in _walk(spec) if node.get("field") == "k" and "axis" in node][:1]
    kmax = result.layer(2).singular_values.shape[-1]
    assert kmax <= K_TICKS_ALL and axis["values"] == list(range(1, kmax + 1))
    long = charts.spectrum(result, layer=0, unit=0).to_dict()  # attention: 24 values, Vega's integer ticks
    (axis,) = [node["axis"] for node in _walk(long) if node.get("field") == "k" and "axis" in node][:1]
    assert "values" not in axis and axis["tickMinStep"] == 1


def test_the_subtitle_says_where_the_hovered_token_is_shown(result):
    """The subtitle promises the token at the top of the plot: a text layer shows the token
    field of the hovered row there (the voronoi tooltip cannot show strings)."""
    spec = charts.ess_over_time(result, layer=2).to_dict()
    assert "hover: the token at the top" in spec["title"]["subtitle"]
    hover = spec["layer"][5]
    assert hover["mark"]["type"] == "text" and hover["encoding"]["text"]["field"] == "token"
    names = {node["name"] for node in _walk(spec) if isinstance(node.get("name"), str) and "select" in node}
    (hover_param,) = [name for name in names if name.endswith("_hover")]
    assert hover["transform"][0]["filter"]["param"] == hover_param
    assert hover["encoding"]["y"] == {"value": 10}  # at the top of the plot


def test_unit_menu_labels_fit_a_narrow_menu(result):
    lay = result.layer(2)
    options = labels.unit_menu_options(lay)
    assert [value for _, value in options] == ["mean", "max", "sum", 0, 1, 2, 3]
    assert max(len(text) for text, _ in options) <= labels.UNIT_MENU_CHARS
    assert len({text for text, _ in options}) == len(options)
