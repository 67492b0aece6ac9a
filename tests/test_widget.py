"""Widget logic, driven by setting widget values from Python (as Altair's JupyterChart
tests do: browser selections are simulated by setting ``chart._vl_selections``).

Models are injected (load_fn / analyze_fn) and backed by the synthetic reference layers,
so these tests need no trained model and no network.
"""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest
import torch

from ess_explorer.app import magic, widget
from ess_explorer.views import charts
from ess_explorer import tolerance_ess
from ess_explorer.result import ESSResult, LayerESS
from ess_explorer.synthetic import reference_result

PROMPT = " ".join(f"w{i}" for i in range(32))


def _strided(lay: LayerESS, stride: int) -> LayerESS:
    cols = np.arange(0, len(lay.positions), stride)
    fields = {name: getattr(lay, name)[:, cols] for name in ("tolerance_ess", "entropy_ess", "tss", "singular_values", "rank_bound")}
    return LayerESS(lay.layer, lay.family, lay.unit_kind, lay.positions[cols], operators=lay.operators, **fields)


class FakePipeline:
    """load_fn / analyze_fn over the synthetic reference: L = number of words, 4 layers."""

    def __init__(self, fail_load=None, fail_analyze=None):
        self.loads, self.calls = [], []
        self.fail_load, self.fail_analyze = fail_load, fail_analyze
        self._cache = {}

    def load(self, source):
        self.loads.append(source)
        if self.fail_load:
            raise self.fail_load
        return f"model<{source}>", "tokenizer"

    def analyze(self, model, *, prompt, tokenizer, layers, tol, relative, stride, progress):
        self.calls.append({"layers": list(layers), "stride": stride, "tol": tol, "relative": relative})
        if self.fail_analyze:
            raise self.fail_analyze
        length = len(prompt.split())
        if length not in self._cache:
            self._cache[length] = reference_result(length)
        full = self._cache[length]
        chosen = {i: (_strided(full.layers[i], stride) if stride else full.layers[i]) for i in layers}
        meta = {**full.meta, "model_id": model, "n_layers": 4, "stride": stride}
        return ESSResult(full.tokens, full.input_ids, chosen, meta)


@pytest.fixture
def fake():
    return FakePipeline()


@pytest.fixture
def ex(fake):
    return widget.explore("zoo:fake", PROMPT, load_fn=fake.load, analyze_fn=fake.analyze, static=False)


def _rows(ex) -> list[dict]:
    return ex.chart.spec["datasets"][charts.DATASETS["time"]]


def _param(ex, name) -> dict:
    return next(p for p in ex.chart.spec["params"] if p["name"] == name)


def test_opens_analysed_with_all_layers(ex, fake):
    assert fake.loads == ["zoo:fake"]
    assert sorted(c["layers"][0] for c in fake.calls) == [0, 1, 2, 3]  # one call per layer (the bar moves per layer)
    assert sorted(ex.result.layers) == [0, 1, 2, 3] and ex.result.length == 32
    assert "analysed 4 layers" in ex.status_w.value
    assert ex.progress_w.value == 1.0 and ex.progress_w.bar_style == "success"
    assert [label for label, _ in ex.layer_w.options][2] == "2 · mamba"
    assert set(ex.chart.spec["datasets"]) == set(charts.DATASETS.values())


def test_tolerance_recomputes_from_kept_values_not_the_model(ex, fake):
    calls = len(fake.calls)
    ex.unit_w.value = 1
    ex.tol_w.value = 1e-2
    op = torch.as_tensor(ex.result.layers[0].operators[1])
    assert [r["ess"] for r in _rows(ex)] == tolerance_ess(op, tol=1e-2, relative=True).numpy().tolist()
    ex.relative_w.value = False
    ex.tol_w.value = 0.05
    assert [r["ess"] for r in _rows(ex)] == tolerance_ess(op, tol=0.05, relative=False).numpy().tolist()
    assert len(fake.calls) == calls and len(fake.loads) == 1, "no model call for a tolerance change"


def test_variant_and_unit(ex):
    ex.variant_w.value = "entropy"
    assert ex.chart.spec["datasets"][charts.DATASETS["labels"]] == [{"variant": "entropy-ESS"}]
    lay = ex.result.layers[0]
    assert np.allclose([r["ess"] for r in _rows(ex)], lay.entropy_ess.mean(0), rtol=1e-3)
    ex.unit_w.value = "max"
    assert np.allclose([r["ess"] for r in _rows(ex)], lay.entropy_ess.max(0), rtol=1e-3)


def test_layer_dropdown_and_unit_list(ex, fake):
    calls = len(fake.calls)
    ex.unit_w.value = 1
    ex.layer_w.value = 1  # short conv: 4 channels
    assert [v for _, v in ex.unit_w.options] == ["mean", "max", "sum", 0, 1, 2, 3]
    assert ex.unit_w.value == 1
    rows = _rows(ex)
    assert rows[16]["ess"] == 3  # conv k = 4: ESS = k - 1
    assert "layer 1 (short_conv)" in str(ex.chart.spec)
    assert _param(ex, ex.names.layer)["value"] == [{"layer": 1}]
    assert len(fake.calls) == calls, "an exact layer already analysed needs no model call"


def test_browser_selections_reach_python(ex):
    """A click on the overview (layer) switches the layer; a click on ESS over time (t)
    is remembered and survives a tolerance change; hover is never synced."""
    assert set(ex.chart._vl_selections) == {ex.names.t, ex.names.layer}
    ex.chart._vl_selections = {
        ex.names.t: {"value": {"t": [7], "vlPoint": {"or": [{"t": 7}]}}, "store": []},
        ex.names.layer: {"value": {"layer": [0], "vlPoint": {"or": [{"layer": 0}]}}, "store": []},
    }
    assert ex.selected_t == 7 and ex.layer == 0
    ex.tol_w.value = 1e-5
    assert _param(ex, ex.names.t)["value"] == [{"t": 7}]
    ex.chart._vl_selections = {
        ex.names.t: {"value": {"t": [7], "vlPoint": {"or": [{"t": 7}]}}, "store": []},
        ex.names.layer: {"value": {"layer": [3], "vlPoint": {"or": [{"layer": 3}]}}, "store": []},
    }
    assert ex.layer == 3 and "layer 3 (linear_attention)" in str(ex.chart.spec)


def test_new_prompt_calls_analyze_and_keeps_the_model(ex, fake):
    ex.prompt_w.value = " ".join(["a"] * 20)
    ex.analyze_w.click()
    assert ex.result.length == 20 and len(fake.loads) == 1
    ex.model_w.value = widget.CUSTOM
    ex.source_w.value = "some/hub-model"
    ex.analyze_w.click()
    assert fake.loads[-1] == "some/hub-model" and ex.result.meta["model_id"] == "model<some/hub-model>"


@pytest.mark.parametrize("where", ["load", "analyze"])
def test_failure_keeps_previous_result_and_stays_usable(fake, where):
    ex = widget.explore("zoo:fake", PROMPT, load_fn=fake.load, analyze_fn=fake.analyze, static=False)
    before, spec_before = ex.result, ex.chart.spec
    if where == "load":
        ex.model_w.value = widget.CUSTOM
        ex.source_w.value = "no/such-model"
        fake.fail_load = ValueError("hub id 'no/such-model' cannot be reached offline")
    else:
        fake.fail_analyze = ValueError("the prompt is longer than the model's context (512)")
    ex.prompt_w.value = "x y z"
    assert ex.run() is False
    assert ex.result is before and ex.chart.spec is spec_before
    assert "⚠" in ex.status_w.value and ("offline" in ex.status_w.value or "context" in ex.status_w.value)
    assert ex.progress_w.bar_style == "danger" and not ex.analyze_w.disabled
    ex.tol_w.value = 1e-2  # still usable on the previous result
    assert len(_rows(ex)) == 32


def test_empty_prompt_is_refused_in_words(ex, fake):
    calls = len(fake.calls)
    ex.prompt_w.value = "   "
    assert ex.run() is False
    assert "prompt is empty" in ex.status_w.value and len(fake.calls) == calls


def test_long_prompt_strided_overview_and_exact_selected_layer(fake):
    prompt = " ".join(f"w{i}" for i in range(200))  # > OVERVIEW_POSITIONS: stride 2
    ex = widget.explore("zoo:fake", prompt, layer=2, load_fn=fake.load, analyze_fn=fake.analyze, static=False)
    assert ex.result.meta["overview_stride"] == 2
    assert len(ex.result.layers[2].positions) == 200, "the selected layer is exact"
    assert len(ex.result.layers[1].positions) == 100
    assert "stride" not in str(ex.chart.spec["vconcat"][0]), "ESS over time shows the exact layer"
    assert "layers computed at stride 2, the selected layer exactly" in str(ex.chart.spec)
    calls = len(fake.calls)
    ex.layer_w.value = 1
    assert fake.calls[calls:] == [{"layers": [1], "stride": None, "tol": ex.tol, "relative": True}]
    assert len(ex.result.layers[1].positions) == 200
    ex.layer_w.value = 2
    assert len(fake.calls) == calls + 1, "an exact layer is not recomputed"
    assert ex.refine_w.layout.display != "none", "refining is offered while the overview is strided"
    calls = len(fake.calls)
    assert ex.refine() is True
    assert sorted(c["layers"][0] for c in fake.calls[calls:]) == [0, 3], "only the still-strided layers run"
    assert all(len(lay.positions) == 200 for lay in ex.result.layers.values())
    assert not ex.result.meta["overview_stride"] and "computed at stride" not in str(ex.chart.spec)
    assert ex.refine_w.layout.display == "none" and ex.layer_w.value == 2


def test_failed_refinement_keeps_the_strided_result(fake):
    prompt = " ".join(f"w{i}" for i in range(200))
    ex = widget.explore("zoo:fake", prompt, layer=2, load_fn=fake.load, analyze_fn=fake.analyze, static=False)
    before = ex.result

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    ex._analyze_fn = broken
    assert ex.refine() is False
    assert ex.result is before and "out of memory" in ex.status_w.value


def test_two_explorers_do_not_share_params(fake):
    a = widget.explore("zoo:fake", PROMPT, load_fn=fake.load, analyze_fn=fake.analyze, static=False)
    b = widget.explore(result=a.result, static=False)
    names_a = {p["name"] for p in a.chart.spec["params"]}
    names_b = {p["name"] for p in b.chart.spec["params"]}
    assert names_a and names_b and not names_a & names_b
    b.tol_w.value = 0.3
    assert a.tol == pytest.approx(1e-3) and a.chart.spec["datasets"] is not b.chart.spec["datasets"]


def test_mimebundle_carries_a_static_png(fake):
    ex = widget.explore(result=reference_result(24))
    bundle = ex._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    png = base64.b64decode(bundle["image/png"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_prompt_buttons(ex):
    ex.example_w.click()
    assert ex.prompt_w.value == widget.example_prompt("zoo:fake")
    ex.model_w.value = widget.CUSTOM
    ex.source_w.value = "gpt2"
    assert ex.mqar_w.disabled
    ex._random_mqar()
    assert "built-in zoo models only" in ex.status_w.value
    ex.example_w.click()
    assert ex.prompt_w.value == widget.EXAMPLE_PROMPT


def test_bad_options_raise():
    with pytest.raises(ValueError, match="variant"):
        widget.explore(result=reference_result(16), variant="rank")
    with pytest.raises(ValueError, match="collapsed < saturated"):
        widget.explore(result=reference_result(16), saturated=0.1, collapsed=0.2)


# ---------------------------------------------------------------- the %ess magic ------
def test_magic_parses_the_issue_example():
    model, prompt, options = magic.parse_ess_args('--model zoo:NAME --layer 1 "prompt text"')
    assert (model, prompt) == ("zoo:NAME", "prompt text")
    assert options == {"layer": 1, "unit": "mean", "variant": "tolerance"}
    model, prompt, options = magic.parse_ess_args("--unit 3 --variant entropy --tol 1e-2 --absolute --stride 4 a b")
    assert model is None and prompt == "a b"
    assert options == {"layer": None, "unit": 3, "variant": "entropy", "tol": 1e-2, "relative": False, "stride": 4}


@pytest.mark.parametrize("line, message", [("--layer one x", "invalid int"), ("--unit median x", "unit must be"),
                                           ('"unbalanced', "quote"), ("--bogus 1", "unrecognized")])
def test_magic_bad_lines_print_usage_not_a_traceback(line, message, capsys):
    assert magic.ess_magic(line) is None
    assert message in capsys.readouterr().out


def test_magic_registers_and_opens_a_saved_result(tmp_path):
    registered = {}

    class Shell:
        def register_magic_function(self, fn, magic_kind, magic_name):
            registered[(magic_kind, magic_name)] = fn

    magic.load_ipython_extension(Shell())
    fn = registered[("line", "ess")]
    path = reference_result(20).save(tmp_path / "r.npz")
    ex = fn(f"--result {path} --layer 2 --unit 1")
    assert isinstance(ex, widget.ESSExplorer) and ex.layer == 2 and ex.unit == 1 and ex.result.length == 20


def test_extension_is_reachable_from_the_package():
    import ess_explorer

    if not hasattr(ess_explorer, "load_ipython_extension"):
        pytest.skip("ess_explorer/__init__.py does not re-export load_ipython_extension yet (lead)")
    assert ess_explorer.load_ipython_extension is magic.load_ipython_extension


def test_static_png_survives_nbconvert_html_without_widget_state():
    """The output as a kernel stores it (the widget's mimebundle), saved without widget
    state (JupyterLab's default): nbconvert's HTML shows the PNG, not an empty widget."""
    nbformat = pytest.importorskip("nbformat")
    nbconvert = pytest.importorskip("nbconvert")
    ex = widget.explore(result=reference_result(24))
    cell = nbformat.v4.new_code_cell("explore()")
    cell.outputs = [nbformat.v4.new_output("display_data", data=ex._repr_mimebundle_())]
    notebook = nbformat.v4.new_notebook(cells=[cell])
    page, _ = nbconvert.HTMLExporter().from_notebook_node(notebook)
    assert re.search(r'<img[^>]*src="data:image/png;base64,', page)
    assert "application/vnd.jupyter.widget-view+json" not in page


def test_real_default_model_and_analyze():
    """explore() with no arguments: the zoo's default model, its example prompt, the real
    load_model and analyze (the wiring the injected tests stand in for)."""
    from ess_explorer import zoo

    if zoo.DEFAULT_MODEL not in zoo.list_models():
        pytest.skip(f"the zoo's default model {zoo.DEFAULT_MODEL} is not built on this machine")
    ex = widget.explore(static=False)
    assert ex.source == f"zoo:{zoo.DEFAULT_MODEL}" and "✓" in ex.status_w.value, ex.status_w.value
    assert ex.prompt_w.value == zoo.task_of(zoo.DEFAULT_MODEL).prompt(seed=0)
    assert ex.result.meta["source"] == ex.source and len(ex.result.layers) >= 1
    lay = ex.result.layers[ex.layer]
    assert ex.result.length == len(ex.prompt_w.value.split()) == len(lay.positions)
    ex.tol_w.value = 1e-1  # a coarser tolerance can only lower the counts
    coarse = [r["ess"] for r in _rows(ex)]
    ex.tol_w.value = 1e-6
    fine = [r["ess"] for r in _rows(ex)]
    assert all(c <= f for c, f in zip(coarse, fine)) and sum(fine) > sum(coarse)
    assert not ex.mqar_w.disabled
    ex._random_mqar()
    assert ex.run() and ex.result.length == len(ex.prompt_w.value.split())


def test_load_ext_and_ess_magic_in_ipython(tmp_path):
    """%load_ext ess_explorer registers %ess in a real IPython shell."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "ess_explorer")
    path = reference_result(20).save(tmp_path / "r.npz")
    ex = shell.run_line_magic("ess", f"--result {path} --layer 1 --variant entropy")
    assert isinstance(ex, widget.ESSExplorer) and ex.layer == 1 and ex.variant == "entropy"
