"""Specs of the chart builders (ess_explorer.charts): data, encodings, params.

Expected values come from the core (ess.py on the kept operators), the diagnostics module
or the closed forms of the synthetic layers, never from the chart code itself.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ess_explorer import entropy_ess, hankel_singular_values, tolerance_ess
from ess_explorer.core.diagnostics import layer_diagnostics
from ess_explorer.result import ESSResult, LayerESS
from ess_explorer.synthetic import convolution, reference_result
from ess_explorer.views import charts, data, render

L = 48


@pytest.fixture(scope="module")
def result() -> ESSResult:
    return reference_result(L)


@pytest.fixture(scope="module")
def spec(result) -> dict:
    """One full linked spec (building it is the slow part: shared by the structure tests)."""
    return charts.linked_views(result, layer=0, names=charts.ViewNames("q")).to_dict()


def _data(result, **kw) -> dict:
    return charts.linked_data(result, **kw)


def _walk(node):
    """Every dict inside a spec (to look for marks, filters, encodings)."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _time_rows(data: dict) -> list[dict]:
    return (data["datasets"] if "datasets" in data else data)[charts.DATASETS["time"]]


# ---------------------------------------------------------------- the data ------------
def test_time_data_matches_core_at_a_new_tolerance(result):
    """ESS over time at tol = 1e-2 (not the analysis tol) equals the core's count on the
    kept operator of the same head."""
    spec = _data(result, layer=0, unit=1, tol=1e-2, relative=True)
    rows = _time_rows(spec)
    expected = tolerance_ess(torch.as_tensor(result.layers[0].operators[1]), tol=1e-2, relative=True).numpy()
    assert [r["t"] for r in rows] == list(range(L))
    assert [r["ess"] for r in rows] == expected.tolist()
    # the spectrum rows carry the focus unit's values: sigma_1 from the core
    sigma = hankel_singular_values(torch.as_tensor(result.layers[0].operators[1])).numpy()
    assert rows[20]["sigma"][0] == pytest.approx(sigma[20, 0], rel=1e-3)
    assert rows[20]["thr"] == pytest.approx(1e-2 * sigma[20, 0], rel=1e-3)
    assert rows[20]["unit_tol_ess"] == int(expected[20])


def test_absolute_tolerance_and_entropy_variant(result):
    op = torch.as_tensor(result.layers[3].operators[0])
    rows = _time_rows(_data(result, layer=3, unit=0, tol=0.5, relative=False))
    assert [r["ess"] for r in rows] == tolerance_ess(op, tol=0.5, relative=False).numpy().tolist()
    rows = _time_rows(_data(result, layer=3, unit=0, variant="entropy"))
    assert np.allclose([r["ess"] for r in rows], entropy_ess(op).numpy(), rtol=1e-3)


@pytest.mark.parametrize("how", ["mean", "max", "sum"])
def test_aggregate_over_units(result, how):
    """unit="mean"/"max"/"sum" reduces ESS and TSS the same way over the 4 conv channels."""
    lay = result.layers[1]
    rows = _time_rows(_data(result, layer=1, unit=how))
    reduce = {"mean": np.mean, "max": np.max, "sum": np.sum}[how]
    assert np.allclose([r["ess"] for r in rows], reduce(lay.tolerance_ess, axis=0), rtol=1e-3)
    assert np.allclose([r["tss"] for r in rows], reduce(lay.tss, axis=0), rtol=1e-3)
    # a short conv with k = 4 has ESS = 3 = TSS inside the sequence (docs/math.md closed form)
    assert rows[L // 2]["ess"] == {"mean": 3, "max": 3, "sum": 12}[how]


def test_separators_are_marked(result, spec):
    rows = _time_rows(spec)
    assert (
        [r["t"] for r in rows if r["sep"]] == [t for t, tok in enumerate(result.tokens) if tok == "|"] == [15, 31, 47]
    )


def test_lower_bound_flag_when_few_values_kept():
    """Keeping K = 2 values of a rank-3 conv: a recomputed count that reaches K is not exact."""
    op = convolution(40, 4, units=1, seed=3)
    lay = LayerESS.from_operator(
        0, "short_conv", op, np.full(40, 3.0), tol=1e-3, relative=True, top_k=2, keep_operators=[0]
    )
    res = ESSResult(["a"] * 40, list(range(40)), {0: lay}, {"tol": 1e-3, "relative": True})
    rows = _time_rows(_data(res, layer=0, unit=0, tol=1e-4))
    mid = rows[20]
    assert mid["ess"] == 2 and mid["exact"] is False and mid["complete"] is False
    # at the analysis tolerance the stored counts come from the full spectrum: exact 3
    rows = _time_rows(_data(res, layer=0, unit=0))
    assert rows[20]["ess"] == 3 and rows[20]["exact"] is True


# ---------------------------------------------------------------- encodings & params ---
def test_params_are_unique_per_instance_and_named(result):
    a = charts.ess_over_time(result, layer=0).to_dict()
    b = charts.ess_over_time(result, layer=0).to_dict()
    names_a = {p["name"] for p in a["params"]}
    names_b = {p["name"] for p in b["params"]}
    assert len(names_a) == 2 and not names_a & names_b
    fixed = charts.linked_structure(result, layer=2, t=10, names=charts.ViewNames("demo")).to_dict()
    params = {p["name"]: p for p in fixed["params"]}
    assert set(params) == {"demo_t", "demo_hover", "demo_layer"}
    assert params["demo_t"]["value"] == [{"t": 10}]
    assert params["demo_t"]["select"]["fields"] == ["t"] and params["demo_t"]["select"]["on"] == "click"
    assert params["demo_layer"]["value"] == [{"layer": 2}]
    assert params["demo_hover"]["select"]["on"] == "pointerover"


def test_default_t_is_the_ess_peak(result, spec):
    t0 = next(p for p in spec["params"] if p["name"] == "q_t")["value"][0]["t"]
    # softmax attention: ESS = min(t, L - t) peaks at L / 2
    assert t0 == L // 2


def test_spectrum_and_outline_follow_the_t_selection(spec):
    nodes = list(_walk(spec))
    filters = [n for n in nodes if n.get("filter") == {"param": "q_t"}]
    assert len(filters) >= 4  # selected rule + label on view 1, spectrum, outline
    flattens = [n for n in nodes if n.get("flatten") == ["sigma"]]
    assert flattens, "the spectrum flattens the per-t arrays in the browser"
    assert any(w.get("op") == "row_number" and w.get("as") == "k" for n in nodes for w in n.get("window", []))
    log_scales = [n for n in nodes if n.get("field") == "sigma" and n.get("scale", {}).get("type") == "log"]
    assert log_scales
    # tolerance rule on thr; H_t box from (0, t) to (t, L)
    assert any(n.get("y", {}).get("field") == "thr" for n in nodes if isinstance(n.get("y"), dict))
    boxes = [n for n in nodes if isinstance(n.get("x2"), dict) and n["x2"].get("field") == "t"]
    assert boxes and boxes[0]["y"]["field"] == "t" and boxes[0]["y2"]["field"] == "end"
    assert any(n.get("calculate") == str(L) and n.get("as") == "end" for n in nodes)


def test_no_python_needed_for_t(spec):
    """Everything t drives is a filter on the param inside the one spec: no data is per-t."""
    assert set(spec["datasets"]) == set(charts.DATASETS.values())
    assert "vconcat" in spec and all(v in json.dumps(spec) for v in ("q_t", "q_layer"))


# ---------------------------------------------------------------- operator ------------
def test_operator_cells_small_and_outlined(result):
    rows, block = charts.operator_data(result, layer=0, unit=0)
    assert block == 1
    op = np.abs(result.layers[0].operators[0])
    assert len(rows) == int((np.tril(op) > op.max() * 1e-8).sum()) == L * (L + 1) // 2
    cell = next(r for r in rows if r["i0"] == 30 and r["j0"] == 7)
    assert cell["logabs"] == pytest.approx(np.log10(op[30, 7]), abs=1e-3)
    assert all(r["j0"] <= r["i0"] for r in rows)  # causal: nothing above the diagonal


def test_operator_is_downsampled_for_long_prompts():
    """L = 320 -> 5 x 5 blocks (<= 64 per side): a few thousand cells, not 51k, and the
    thin conv band survives (block max)."""
    length = 320
    op = convolution(length, 4, units=1, seed=1)
    lay = LayerESS.from_operator(
        0, "short_conv", op, np.full(length, 3.0), tol=1e-3, relative=True, top_k=4, keep_operators=[0]
    )
    res = ESSResult(["x"] * length, list(range(length)), {0: lay}, {"tol": 1e-3, "relative": True})
    rows, block = charts.operator_data(res, layer=0, unit=0)
    assert block == 5 and len(rows) <= 64 * 65 // 2
    assert all(0 <= r["i0"] - r["j0"] <= 5 for r in rows), "only blocks on the band hold values"
    assert max(r["logabs"] for r in rows) == pytest.approx(np.log10(np.abs(op.numpy()).max()), abs=1e-3)
    heat = charts.operator_heatmap(res, layer=0, unit=0).to_dict()
    assert "5×5 blocks" in json.dumps(heat, ensure_ascii=False)
    assert all(len(r["sigma"]) <= charts.MAX_SPECTRUM_K for r in _time_rows(heat))


def test_operator_not_kept_shows_a_note(result):
    lay = result.layers[1]
    stripped = LayerESS(**{**lay.__dict__, "operators": {}})
    res = ESSResult(result.tokens, result.input_ids, {1: stripped}, dict(result.meta))
    spec = charts.operator_heatmap(res, layer=1, unit=2).to_dict()
    assert "was not kept" in json.dumps(spec)


# ---------------------------------------------------------------- overview & diagnostics
def test_overview_values_and_layer_selection(result):
    spec = charts.overview(result, layer=2, names=charts.ViewNames("o")).to_dict()
    rows = spec["datasets"][charts.DATASETS["overview"]]
    assert len(rows) == 4 * L
    lay = result.layers[2]
    t = 20
    expected = lay.tolerance_ess[:, t].mean() / lay.tss[:, t].mean()
    cell = next(r for r in rows if r["layer"] == 2 and r["t0"] == t)
    assert cell["value"] == pytest.approx(expected, rel=1e-3)
    assert spec["params"][0]["name"] == "o_layer" and spec["params"][0]["select"]["fields"] == ["layer"]


def test_overview_stride_is_stated(result, monkeypatch):
    assert "stride" not in json.dumps(charts.overview(result).to_dict())  # 192 cells: no stride needed
    monkeypatch.setattr(data, "MAX_OVERVIEW_CELLS", 50)
    stride = int(np.ceil(4 * L / 50))
    spec = charts.overview(result).to_dict()
    rows = spec["datasets"][charts.DATASETS["overview"]]
    assert {r["t0"] for r in rows if r["layer"] == 0} == set(range(0, L, stride))
    assert f"shown at stride {stride}" in json.dumps(spec)


def test_diagnostics_use_the_diagnostics_module(result):
    spec = charts.diagnostics_chart(result, saturated=0.8, collapsed=0.2).to_dict()
    rows = {r["layer"]: r for r in spec["datasets"][charts.DATASETS["diagnostics"]]}
    for index, lay in result.layers.items():
        diag = layer_diagnostics(lay, saturated=0.8, collapsed=0.2)
        assert rows[index]["utilisation"] == pytest.approx(diag["utilisation"], abs=1e-4)
        assert rows[index]["state"] == diag["state"]
    # the SSM empties its state at every separator: ESS(sep) = 0, modulation 1
    assert rows[2]["modulation"] == pytest.approx(1.0)
    assert rows[0]["modulation"] < 0.5  # attention keeps everything
    thresholds = spec["datasets"][charts.DATASETS["thresholds"]]
    assert {t["x"] for t in thresholds} == {0.8, 0.2}
    assert {t["name"] for t in thresholds} == {"saturated ≥ 0.8", "collapsed ≤ 0.2"}


# ---------------------------------------------------------------- errors & output ------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"layer": 9}, "layer 9 was not analysed"),
        ({"layer": 0, "unit": 5}, "out of range"),
        ({"layer": 0, "unit": "median"}, "unit must be"),
        ({"layer": 0, "variant": "rank"}, "variant must be"),
        ({"layer": 0, "tol": -1.0}, "tol must be"),
        ({"layer": 0, "saturated": 0.1, "collapsed": 0.5}, "collapsed < saturated"),
    ],
)
def test_bad_options_raise_clear_errors(result, kwargs, message):
    with pytest.raises(ValueError, match=message):
        charts.linked_views(result, **kwargs)


def test_png_and_single_views_are_complete_specs(result, spec):
    png = render.to_png(spec)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    for build in (charts.ess_over_time, charts.spectrum, charts.operator_heatmap):
        spec = build(result, layer=1, unit=0).to_dict()
        used = {n["name"] for n in _walk(spec) if set(n) == {"name"} and str(n["name"]).startswith("ess_")}
        assert used <= set(spec["datasets"]), f"{build.__name__} reads a dataset it does not carry"
        assert any(p["name"].endswith("_t") for p in spec["params"])


def test_tolerance_change_recomputes_from_the_kept_values():
    """A tolerance change rebuilds only linked_data, from LayerESS.tolerance_ess_at (no
    model, no spectra): its ESS must be exactly that recount. The time it takes is in
    benchmarks/bench_views.py."""
    rng = np.random.default_rng(0)
    length, heads, k = 64, 3, 16
    sigma = np.sort(rng.lognormal(-3, 2, size=(heads, length, k)), axis=-1)[..., ::-1].copy()
    pos = np.arange(length)
    lay = LayerESS(
        0,
        "softmax_attention",
        "head",
        pos,
        (sigma > 1e-3 * sigma[..., :1]).sum(-1),
        np.full((heads, length), 5.0),
        np.broadcast_to(pos, (heads, length)).astype(float),
        sigma,
        np.broadcast_to(np.minimum(pos, length - pos), (heads, length)).copy(),
        {0: np.tril(rng.random((length, length)))},
    )
    res = ESSResult(["w"] * length, list(range(length)), {0: lay}, {"tol": 1e-3, "relative": True})
    for tol in (1e-6, 1e-2, 0.3):
        data = charts.linked_data(res, layer=0, unit=1, tol=tol)[charts.DATASETS["time"]]
        expected, _ = lay.tolerance_ess_at(tol, relative=True)
        assert [row["unit_tol_ess"] for row in data] == expected[1].tolist()
