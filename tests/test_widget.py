"""Widget logic, driven by setting traitlets and widget values from Python (as Altair's
JupyterChart tests do: browser selections are simulated by setting ``chart._vl_selections``,
what its JavaScript sets).

The pipeline is injected (the session's load_fn / capture_fn / layer_fn) and backed by the
synthetic reference layers, so these tests need no trained model and no network. The
policy itself (one forward pass, order, cache) is tested without widgets in
test_session.py.
"""

from __future__ import annotations

import base64
import re
import threading

import numpy as np
import pytest
import torch

from ess_explorer import tolerance_ess
from ess_explorer.analysis import CapturedPrompt
from ess_explorer.app import magic, widget
from ess_explorer.result import LayerESS
from ess_explorer.synthetic import reference_result
from ess_explorer.views import charts

PROMPT = " ".join(f"w{i}" for i in range(32))


def _strided(lay: LayerESS, stride) -> LayerESS:
    cols = np.arange(0, len(lay.positions), stride or 1)
    fields = {
        name: getattr(lay, name)[:, cols]
        for name in ("tolerance_ess", "entropy_ess", "tss", "singular_values", "rank_bound")
    }
    return LayerESS(lay.layer, lay.family, lay.unit_kind, lay.positions[cols], operators=lay.operators, **fields)


class FakePipeline:
    """The session's pipeline over the synthetic reference: L = number of words, 4 layers."""

    def __init__(self, fail_load=None, fail_layer=None):
        self.loads, self.captures, self.calls, self.gates = [], [], [], []
        self.fail_load, self.fail_layer = fail_load, fail_layer
        self.gate = None  # a threading.Event the load waits for (to see the widget before the result)
        self._cache = {}

    def load(self, source):
        self.loads.append(source)
        if self.gate is not None:
            assert self.gate.wait(30)
        if self.fail_load:
            raise self.fail_load
        return f"model<{source}>", "tokenizer"

    def capture(self, model, tokenizer, prompt, gates="inside", on_layer=None):
        self.captures.append(prompt)
        self.gates.append(gates)
        length = len(prompt.split())
        if length not in self._cache:
            self._cache[length] = reference_result(length)
        full = self._cache[length]
        return CapturedPrompt(
            input_ids=list(full.input_ids),
            tokens=list(full.tokens),
            layers={i: full.layers[i] for i in range(4)},
            meta={**full.meta, "model_id": model, "n_layers": 4},
        )

    def layer(self, captured, layer, *, stride, tol, relative, on_chunk=None):
        self.calls.append({"layer": layer, "stride": stride, "tol": tol, "relative": relative})
        if on_chunk is not None:  # halfway through the units, as the real pipeline reports
            on_chunk(1, 2)
        if self.fail_layer:
            raise self.fail_layer
        return _strided(captured.layers[layer], stride)

    def options(self):
        return dict(load_fn=self.load, capture_fn=self.capture, layer_fn=self.layer, static=False, cache=False)


@pytest.fixture
def fake():
    return FakePipeline()


def _open(fake, *args, **kw):
    ex = widget.explore(*args, **fake.options(), **kw)
    assert ex.wait(60) is not None, "the analysis did not end"
    return ex


@pytest.fixture
def ex(fake):
    return _open(fake, "zoo:fake", PROMPT)


def _rows(ex) -> list[dict]:
    return ex.chart.spec["datasets"][charts.DATASETS["time"]]


def _param(ex, name) -> dict:
    return next(p for p in ex.chart.spec["params"] if p["name"] == name)


def _select(ex, t=None, layer=None):
    """What the chart's JavaScript sends when t / a layer is clicked."""
    value = {}
    if t is not None:
        value[ex.names.t] = {"value": {"t": [t], "vlPoint": {"or": [{"t": t}]}}, "store": []}
    if layer is not None:
        value[ex.names.layer] = {"value": {"layer": [layer], "vlPoint": {"or": [{"layer": layer}]}}, "store": []}
    ex.chart._vl_selections = {**ex.chart._vl_selections, **value}


def test_opens_analysed_with_all_layers(ex, fake):
    assert fake.loads == ["zoo:fake"] and len(fake.captures) == 1, "one load, one forward pass"
    # no layer asked for: the middle one opens (layer 0 of a deep model is the least telling)
    assert [c["layer"] for c in fake.calls] == [2, 0, 1, 3], "each layer once, the selected one first"
    assert sorted(ex.result.layers) == [0, 1, 2, 3] and ex.result.length == 32 and ex.layer == 2
    assert "analysed 4 layers" in ex.status_w.value and not ex.busy and ex.last_error is None
    assert "opened on layer 2: the middle layer of 4" in ex.status_w.value
    assert ex.progress_w.value == 1.0 and ex.progress_w.bar_style == "success"
    assert [label for label, _ in ex.layer_w.options][2] == "2 · mamba"
    assert set(ex.chart.spec["datasets"]) == set(charts.DATASETS.values())


def test_widget_and_progress_are_there_before_the_first_result(fake):
    """explore() returns while the model still loads: the controls, a progress bar and a
    status in words are shown; the views follow when the session reports."""
    fake.gate = threading.Event()
    ex = widget.explore("zoo:fake", PROMPT, **fake.options())
    try:
        assert ex.busy and ex.result is None and ex.chart is None
        assert "loading zoo:fake" in ex.status_w.value and ex.analyze_w.disabled
        assert ex.progress_w in ex.children[3].children
    finally:
        fake.gate.set()
    assert ex.wait(60) is True and ex.chart is not None and not ex.busy


def test_state_is_traitlets_that_can_be_set_and_observed(ex):
    seen = []
    ex.observe(lambda change: seen.append((change["name"], change["new"])), names=["layer", "tol", "unit"])
    ex.layer = 1
    assert ex.layer_w.value == 1 and "layer 1 (short_conv)" in str(ex.chart.spec)
    ex.tol = 1e-2
    assert ex.tol_w.value == pytest.approx(1e-2)
    ex.unit_w.value = 2  # a control sets the traitlet too
    assert ex.unit == 2
    assert seen == [("layer", 1), ("tol", 1e-2), ("unit", 2)]
    with pytest.raises(Exception, match="layer must be one of"):
        ex.layer = 9
    ex.variant, ex.relative, ex.prompt = "entropy", False, "a b c"
    assert (ex.variant_w.value, ex.relative_w.value, ex.prompt_w.value) == ("entropy", False, "a b c")
    ex.model = "some/hub-model"
    assert ex.model_w.value == widget.CUSTOM and ex.source_w.value == "some/hub-model"
    ex.model_w.value = "zoo:fake" if "zoo:fake" in [v for _, v in ex.model_w.options] else ex.model_w.options[0][1]
    assert ex.model == ex.model_w.value


def test_tolerance_recomputes_from_kept_values_not_the_model(ex, fake):
    calls = len(fake.calls)
    ex.unit_w.value = 1
    ex.tol_w.value = 1e-2
    op = torch.as_tensor(ex.result.layers[ex.layer].operators[1])
    assert [r["ess"] for r in _rows(ex)] == tolerance_ess(op, tol=1e-2, relative=True).numpy().tolist()
    ex.relative_w.value = False
    ex.tol_w.value = 0.05
    assert [r["ess"] for r in _rows(ex)] == tolerance_ess(op, tol=0.05, relative=False).numpy().tolist()
    assert len(fake.calls) == calls and len(fake.loads) == 1, "no model call for a tolerance change"


def test_variant_and_unit(ex):
    ex.variant_w.value = "entropy"
    assert ex.chart.spec["datasets"][charts.DATASETS["labels"]][0]["variant"].startswith("entropy-ESS")
    lay = ex.result.layers[ex.layer]
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
    assert set(ex.chart.selections.trait_names()) >= {ex.names.t, ex.names.layer}
    _select(ex, t=7, layer=0)
    assert ex.selected_t == 7 and ex.layer == 0
    ex.tol_w.value = 1e-5
    assert _param(ex, ex.names.t)["value"] == [{"t": 7}]
    _select(ex, layer=3)
    assert ex.layer == 3 and "layer 3 (linear_attention)" in str(ex.chart.spec)
    ex.selected_t = 5  # set from Python: the views follow
    assert _param(ex, ex.names.t)["value"] == [{"t": 5}]


def test_new_prompt_runs_once_and_keeps_the_model(ex, fake):
    ex.prompt = " ".join(["a"] * 20)
    ex.analyze_w.click()
    assert ex.wait(60) and ex.result.length == 20 and len(fake.loads) == 1
    ex.model_w.value = widget.CUSTOM
    ex.source_w.value = "some/hub-model"
    assert ex.run(wait=True)
    assert fake.loads[-1] == "some/hub-model" and ex.result.meta["model_id"] == "model<some/hub-model>"
    assert len(fake.captures) == 3, "one forward pass per analysis"


@pytest.mark.parametrize("where", ["load", "analyze"])
def test_failure_keeps_previous_result_and_stays_usable(fake, where):
    ex = _open(fake, "zoo:fake", PROMPT)
    before, spec_before = ex.result, ex.chart.spec
    if where == "load":
        ex.model = "no/such-model"
        fake.fail_load = ValueError("hub id 'no/such-model' cannot be reached offline")
    else:
        fake.fail_layer = ValueError("the prompt is longer than the model's context (512)")
    ex.prompt = "x y z"
    assert ex.run(wait=True) is False
    assert ex.result is before and ex.chart.spec is spec_before
    assert "⚠" in ex.status_w.value and ("offline" in ex.status_w.value or "context" in ex.status_w.value)
    assert ex.last_error and ex.progress_w.bar_style == "danger" and not ex.analyze_w.disabled and not ex.busy
    ex.tol_w.value = 1e-2  # still usable on the previous result
    assert len(_rows(ex)) == 32


def test_empty_prompt_is_refused_in_words(ex, fake):
    calls = len(fake.calls)
    ex.prompt = "   "
    assert ex.run() is False
    assert "prompt is empty" in ex.status_w.value and len(fake.calls) == calls


def test_long_prompt_strided_overview_then_refined_each_layer_once(fake):
    prompt = " ".join(f"w{i}" for i in range(40))  # stride 4 (the auto stride is tested in test_session.py)
    ex = _open(fake, "zoo:fake", prompt, layer=2, stride=4)
    assert len(fake.captures) == 1
    assert [(c["layer"], c["stride"]) for c in fake.calls] == [
        (2, None),
        (0, 4),
        (1, 4),
        (3, 4),
        (0, None),
        (1, None),
        (3, None),
    ]
    assert all(len(lay.positions) == 40 for lay in ex.result.layers.values())
    assert not ex.result.meta["overview_stride"] and "computed at stride" not in str(ex.chart.spec)
    assert ex.layer == 2 and ex.refine_w.layout.display == "none"


def test_a_failed_refinement_keeps_the_strided_result_and_can_continue(fake):
    prompt = " ".join(f"w{i}" for i in range(40))
    original = fake.layer

    def flaky(captured, layer, **kw):
        if len(fake.calls) == 4:  # the first refinement step
            fake.calls.append("boom")
            raise RuntimeError("out of memory")
        return original(captured, layer, **kw)

    ex = widget.explore("zoo:fake", prompt, layer=2, stride=4, **{**fake.options(), "layer_fn": flaky})
    assert ex.wait(60) is False
    assert ex.result.meta["overview_stride"] == 4 and ex.result.meta["exact_layers"] == [2]
    assert "out of memory" in ex.status_w.value and "layers computed at stride 4" in str(ex.chart.spec)
    assert ex.refine_w.layout.display != "none"
    ex.layer = 1  # a strided layer: computed next, exactly
    assert ex.wait(60) is True
    assert ex.result.meta["exact_layers"] == [0, 1, 2, 3]
    assert [c["layer"] for c in fake.calls if c != "boom"][4] == 1 and len(fake.captures) == 1


def test_two_explorers_do_not_share_params(fake):
    a = _open(fake, "zoo:fake", PROMPT)
    b = widget.explore(result=a.result, static=False)
    names_a = {p["name"] for p in a.chart.spec["params"]}
    names_b = {p["name"] for p in b.chart.spec["params"]}
    assert names_a and names_b and not names_a & names_b
    b.tol_w.value = 0.3
    assert a.tol == pytest.approx(1e-3) and a.chart.spec["datasets"] is not b.chart.spec["datasets"]


def test_static_copy_is_hidden_by_the_live_widget_and_drawn_at_its_size(fake):
    from ess_explorer.app import static

    ex = widget.explore(result=reference_result(24))
    bundle = ex.static_bundle()
    assert set(bundle) == {"text/plain", "text/html"}, "the PNG is stored once, inside the HTML"
    png = base64.b64decode(re.search(r'src="data:image/png;base64,([^"]+)"', bundle["text/html"])[1])
    width, height = static.png_size(png)
    shown = re.search(r'<img [^>]*width="(\d+)" height="(\d+)"', bundle["text/html"])
    assert (int(shown[1]), int(shown[2])) == (width // 2, height // 2), "rendered at 2x, shown at 1x"
    assert f'class="{static.STATIC_CLASS}"' in bundle["text/html"]
    assert any(static.HIDE_STATIC_CSS == getattr(child, "value", None) for child in ex.children)
    assert "image/png" not in ex._repr_mimebundle_(), "the widget's own output is the live view only"


def test_prompt_buttons(ex):
    ex.example_w.click()
    assert ex.prompt_w.value == widget.example_prompt("zoo:fake")
    ex.model_w.value = widget.CUSTOM
    ex.source_w.value = "gpt2"
    assert ex.mqar_w.disabled
    ex.mqar_w.click()  # a fresh sequence of the model's task
    assert "built-in zoo models only" in ex.status_w.value
    ex.example_w.click()
    assert ex.prompt_w.value == widget.EXAMPLE_PROMPT


def test_bad_options_raise():
    with pytest.raises(ValueError, match="variant"):
        widget.explore(result=reference_result(16), variant="rank")
    with pytest.raises(ValueError, match="collapsed < saturated"):
        widget.explore(result=reference_result(16), saturated=0.1, collapsed=0.2)
    with pytest.raises(ValueError, match="stride"):
        widget.explore(result=reference_result(16), stride=0)


def test_a_result_in_place_of_the_model_is_opened_and_a_model_in_memory_is_told_to_pass_its_result():
    result = reference_result(16)
    shown = widget.explore(result, layer=2, static=False, auto_analyze=False)
    assert shown.result is result and shown.layer == 2
    with pytest.raises(TypeError, match="two results"):
        widget.explore(result, result=result, static=False)
    with pytest.raises(TypeError, match=r"not a Linear: .*explore\(analyze\(model, input_ids\)\)"):
        widget.explore(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------- the %ess magic ------
def test_magic_parses_the_issue_example():
    model, prompt, options = magic.parse_ess_args('--model zoo:NAME --layer 1 "prompt text"')
    assert (model, prompt) == ("zoo:NAME", "prompt text")
    assert options == {"layer": 1, "unit": "mean", "variant": "tolerance"}
    model, prompt, options = magic.parse_ess_args("--unit 3 --variant entropy --tol 1e-2 --absolute --stride 4 a b")
    assert model is None and prompt == "a b"
    assert options == {"layer": None, "unit": 3, "variant": "entropy", "tol": 1e-2, "relative": False, "stride": 4}


@pytest.mark.parametrize(
    "line, message",
    [
        ("--layer one x", "invalid int"),
        ("--unit median x", "unit must be"),
        ('"unbalanced', "quote"),
        ("--bogus 1", "unrecognized"),
    ],
)
def test_magic_bad_lines_print_usage_not_a_traceback(line, message, capsys):
    assert magic.ess_magic(line) is None
    assert message in capsys.readouterr().out


def test_magic_help_prints_usage_and_opens_nothing(capsys, monkeypatch):
    monkeypatch.setattr(widget, "explore", lambda *a, **k: pytest.fail("--help must open no explorer"))
    for line in ("--help", "-h", "--model zoo:x --help"):
        assert magic.ess_magic(line) is None
        out = capsys.readouterr().out
        assert out.startswith("usage: %ess") and "--variant {tolerance,entropy,causal}" in out and "--wait" in out


def test_magic_wait_returns_once_the_analysis_has_ended(monkeypatch):
    """--wait: the magic blocks on the explorer's analysis (a notebook run for export then
    shows the finished figure); without it, it returns at once."""
    calls = []

    class Explorer:
        def __init__(self, model, prompt, **options):
            calls.append(("explore", model, prompt, options))

        def wait(self, timeout=None):
            calls.append(("wait", timeout))
            return True

    monkeypatch.setattr(widget, "explore", Explorer)
    assert isinstance(magic.ess_magic('--wait --model zoo:x "a b"'), Explorer)
    assert calls == [
        ("explore", "zoo:x", "a b", {"layer": None, "unit": "mean", "variant": "tolerance"}),
        ("wait", None),
    ]
    calls.clear()
    magic.ess_magic("--model zoo:x")
    assert [c[0] for c in calls] == ["explore"]


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

    assert ess_explorer.load_ipython_extension is magic.load_ipython_extension


def test_real_default_model_and_analyze():
    """explore() with no arguments: the zoo's default model, its example prompt, the real
    load_model and analyze (the wiring the injected tests stand in for)."""
    from ess_explorer import zoo

    assert zoo.DEFAULT_MODEL in zoo.list_models(), "the zoo's default model ships with the package"
    ex = widget.explore(static=False, cache=False)
    assert ex.wait(300) is True, ex.status_w.value
    assert ex.model == f"zoo:{zoo.DEFAULT_MODEL}" and "✓" in ex.status_w.value, ex.status_w.value
    assert ex.prompt_w.value == zoo.task_of(zoo.DEFAULT_MODEL).prompt(seed=0)
    assert ex.result.meta["source"] == ex.model and len(ex.result.layers) >= 1
    lay = ex.result.layers[ex.layer]
    assert ex.result.length == len(ex.prompt_w.value.split()) == len(lay.positions)
    ex.tol_w.value = 1e-1  # a coarser tolerance can only lower the counts
    coarse = [r["ess"] for r in _rows(ex)]
    ex.tol_w.value = 1e-6
    fine = [r["ess"] for r in _rows(ex)]
    assert all(c <= f for c, f in zip(coarse, fine)) and sum(fine) > sum(coarse)
    assert not ex.mqar_w.disabled
    ex.mqar_w.click()  # a fresh sequence of the model's task
    assert ex.run(wait=True) and ex.result.length == len(ex.prompt_w.value.split())


def test_load_ext_and_ess_magic_in_ipython(tmp_path):
    """%load_ext ess_explorer registers %ess in a real IPython shell."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "ess_explorer")
    path = reference_result(20).save(tmp_path / "r.npz")
    ex = shell.run_line_magic("ess", f"--result {path} --layer 1 --variant entropy")
    assert isinstance(ex, widget.ESSExplorer) and ex.layer == 1 and ex.variant == "entropy"


def test_scope_recounts_against_the_units_largest_sigma(ex):
    """scope "unit": tau = tol x the unit's largest sigma_1, so a cut whose sigma_1 is smaller
    than the unit's largest counts fewer values than with the per-cut scope (which counts
    sigma_1 itself at every cut); the data follow the recount of the kept values."""
    ex.layer, ex.unit, ex.tol = 2, 0, 0.3
    per_cut = [r["ess"] for r in _rows(ex)]
    ex.scope = "unit"
    per_unit = [r["ess"] for r in _rows(ex)]
    lay = ex.result.layer(2)
    expected = lay.tolerance_ess_at(0.3, True, "unit")[0][0]
    assert per_unit == [float(v) for v in expected]
    assert all(u <= c for u, c in zip(per_unit, per_cut)) and per_unit != per_cut
    ex.relative = False  # an absolute tolerance has no scope: the scope control is ignored
    assert [r["ess"] for r in _rows(ex)] == [float(v) for v in lay.tolerance_ess_at(0.3, False)[0][0]]


def test_causal_variant_shows_the_causal_ess(ex):
    ex.layer, ex.unit, ex.variant = 2, 0, "causal"
    causal = ex.result.layer(2).causal_ess[0]
    assert [r["ess"] for r in _rows(ex)] == [float(v) if np.isfinite(v) else None for v in causal]


def test_changing_the_gate_policy_runs_the_analysis_again(ex, fake):
    assert fake.gates == ["inside"]
    ex.gates = "outside"
    assert ex.wait(60)
    assert fake.gates == ["inside", "outside"] and len(fake.captures) == 2


@pytest.mark.parametrize(
    "options, said", [({"layer": 99}, "layer 99 is not in the result"), ({"unit": 999}, "unit 999")]
)
def test_a_layer_or_unit_the_model_lacks_is_said_not_replaced_silently(fake, options, said):
    ex = _open(fake, "zoo:fake", PROMPT, **options)
    # the explorer opens on its own choice of layer instead, and says which
    assert said in ex.status_w.value and f"showing layer {ex.layer}, mean" in ex.status_w.value
    assert ex.layer in ex.result.layers and ex.unit == "mean"


def test_the_progress_bar_counts_down_from_the_sessions_estimate():
    import ipywidgets as W

    from ess_explorer.app.controls import ProgressBar

    said = []
    bar = ProgressBar(W.FloatProgress(), lambda text, kind: said.append(text), total=100, desc="layer 3", unit="cut")
    bar.update(50)  # a count alone: the ETA extrapolates it
    bar.set_eta(120.0)
    assert 119.0 <= bar.eta_s() <= 120.0 and said[-1].endswith("ETA 120 s")
    bar.update(10)  # the told estimate holds until the next, whatever the count says
    assert bar.eta_s() > 100
