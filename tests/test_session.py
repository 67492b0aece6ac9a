"""The explorer's analysis policy without any widget: one forward pass, the selected layer
first, each (layer, stride) once, results equal to `analyze`, the cache answering without
the model's weights, failures keeping the partial result."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ess_explorer import sources
from ess_explorer.analysis import CapturedPrompt, analyze
from ess_explorer.app import plan as P
from ess_explorer.app import session as S
from ess_explorer.io import ResultCache
from ess_explorer.synthetic import reference_result

MODEL = "zoo:mamba2_n4"  # 2 layers, a few hundred kB: the smallest built-in model
PROMPT = "ba 07 ko 31 xe 12 | ko 31 ba 07"


def test_plan_orders_selected_overview_then_refinement():
    assert S.plan([0, 1, 2, 3], 2, 4) == [(2, None), (0, 4), (1, 4), (3, 4), (0, None), (1, None), (3, None)]
    assert S.plan([0, 1, 2], 1, None) == [(1, None), (0, None), (2, None)], "short prompts: each layer once, exact"
    with pytest.raises(ValueError, match="not among"):
        S.plan([0, 1], 5, None)


def test_first_chart_is_strided_only_when_the_exact_layer_is_costly():
    import torch

    from ess_explorer.core.units import DenseCapture, SSMCapture

    def heads(units, length):
        return DenseCapture(layer=0, family="softmax_attention", operator=torch.zeros(units, length, length))

    assert P.first_chart_stride(heads(2, 64), 64) is None, "a small layer: exact at once"
    # 12 heads at L = 512 cost ~1e11 flops: as few cuts as allowed, FIRST_CHART_POSITIONS
    assert P.first_chart_stride(heads(12, 512), 512) == 512 // P.FIRST_CHART_POSITIONS
    channels = SSMCapture(layer=0, family="mamba", state_size=16, shape=(1536, 512))
    stride = P.first_chart_stride(channels, 512)
    assert stride is not None and len(range(0, 512, stride)) >= P.FIRST_CHART_POSITIONS
    assert P.first_chart_stride(object(), 512) is None, "an injected pipeline's own layer: no estimate"
    assert P.plan([0, 1, 2], 1, 4, first=8) == [(1, 8), (1, None), (0, 4), (2, 4), (0, None), (2, None)]


def test_overview_stride():
    assert S.overview_stride(S.OVERVIEW_POSITIONS) is None
    assert S.overview_stride(S.OVERVIEW_POSITIONS + 1) == 2
    assert S.overview_stride(1000) == 8  # ceil(1000 / 128)
    assert S.overview_stride(1000, None) is None and S.overview_stride(10, 3) == 3 and S.overview_stride(10, 1) is None
    with pytest.raises(ValueError, match="stride"):
        S.overview_stride(10, 0)


class Bar:
    """A tqdm stand-in that records what the session reports."""

    made: list = []

    def __init__(self, total=None, desc="", unit=""):
        self.total, self.n, self.descs, self.closed = total, 0, [desc], False
        Bar.made.append(self)

    def update(self, n=1):
        self.n += n

    def set_description(self, desc=None, refresh=True):
        self.descs.append(desc)

    def close(self):
        self.closed = True


@pytest.fixture(scope="module")
def loaded():
    return sources.load_model(MODEL)


def test_one_forward_pass_each_layer_once_and_equal_to_analyze(loaded):
    model, tokenizer = loaded
    forwards, computed, updates = [], [], []
    hook = model.register_forward_pre_hook(lambda *_: forwards.append(1))

    def layer_fn(captured, layer, **kw):
        computed.append((layer, kw["stride"]))
        return S.default_layer(captured, layer, **kw)

    Bar.made.clear()
    session = S.ExplorerSession(load_fn=lambda source: loaded, layer_fn=layer_fn, stride=2, progress=Bar)
    try:
        result = session.run(
            MODEL,
            PROMPT,
            layer=1,
            tol=1e-3,
            relative=True,
            on_result=lambda r, info: updates.append(
                (info["phase"], sorted(r.layers), len(r.layers[info["layer"]].positions))
            ),
        )
    finally:
        hook.remove()
    assert len(forwards) == 1 and session.forward_passes == 1
    assert computed == [(1, None), (0, 2), (0, None)], "selected exact first, the other at the stride, then refined"
    length = result.length
    assert updates[0] == ("selected", [1], length), "the first chart: the selected layer, every cut"
    assert updates[1] == ("overview", [0, 1], (length + 1) // 2)
    assert updates[-1] == ("refined", [0, 1], length)
    assert result.meta["exact_layers"] == [0, 1] and result.meta["overview_stride"] is None
    reference = analyze(model, prompt=PROMPT, tokenizer=tokenizer, progress=False)
    for index, lay in reference.layers.items():
        np.testing.assert_array_equal(result.layers[index].tolerance_ess, lay.tolerance_ess)
        np.testing.assert_allclose(result.layers[index].entropy_ess, lay.entropy_ess, rtol=1e-12)
    # progress: every bar reaches its total and is closed; the steps are named
    assert all(bar.closed and bar.n == bar.total for bar in Bar.made)
    said = " ".join(d for bar in Bar.made for d in bar.descs)
    assert "loading" in said and "forward pass" in said and "layer 0 at stride 2" in said


def _fake_captured(n_layers=4, length=40):
    full = reference_result(length)
    captured = CapturedPrompt(
        input_ids=list(full.input_ids),
        tokens=list(full.tokens),
        layers={i: None for i in range(n_layers)},
        meta={"n_layers": n_layers},
    )
    return full, captured


def _strided(lay, stride):
    cols = np.arange(0, len(lay.positions), stride or 1)
    fields = {
        k: getattr(lay, k)[:, cols] for k in ("tolerance_ess", "entropy_ess", "tss", "singular_values", "rank_bound")
    }
    return type(lay)(lay.layer, lay.family, lay.unit_kind, lay.positions[cols], operators=lay.operators, **fields)


def _fake_session(**kw):
    full, captured = _fake_captured()
    calls = []

    def layer_fn(cap, layer, *, stride, tol, relative, on_chunk=None):
        calls.append((layer, stride))
        return _strided(full.layers[layer], stride)

    session = S.ExplorerSession(
        load_fn=lambda s: ("model", "tok"),
        capture_fn=lambda m, t, p, gates, on_layer=None: captured,
        layer_fn=kw.pop("layer_fn", layer_fn),
        **kw,
    )
    return session, calls


def test_prioritised_layer_comes_next_and_its_overview_is_skipped():
    session, calls = _fake_session(stride=4)
    original = session.layer_fn

    def layer_fn(cap, layer, **kw):
        if not calls:
            session.prioritise(3)  # the user picks layer 3 while layer 0 is computed
        return original(cap, layer, **kw)

    session.layer_fn = layer_fn
    session.run("zoo:fake", "x", layer=0)
    assert calls == [(0, None), (3, None), (1, 4), (2, 4), (1, None), (2, None)]


def test_failure_keeps_the_partial_result_and_resume_finishes():
    session, calls = _fake_session(stride=4)
    original = session.layer_fn

    def flaky(cap, layer, **kw):
        if len(calls) == 4:
            calls.append("boom")
            raise RuntimeError("out of memory")
        return original(cap, layer, **kw)

    session.layer_fn = flaky
    with pytest.raises(RuntimeError, match="out of memory"):
        session.run("zoo:fake", "x", layer=1)
    partial = session.result
    assert sorted(partial.layers) == [0, 1, 2, 3] and partial.meta["overview_stride"] == 4
    assert partial.meta["exact_layers"] == [1]
    session.layer_fn = original
    done = session.resume()
    assert done.meta["exact_layers"] == [0, 1, 2, 3] and done.meta["overview_stride"] is None
    assert [c for c in calls if c != "boom"].count((0, None)) == 1, "nothing computed twice"


def test_cancel_stops_between_steps():
    session, calls = _fake_session(stride=4)
    original = session.layer_fn

    def layer_fn(cap, layer, **kw):
        session.cancel()
        return original(cap, layer, **kw)

    session.layer_fn = layer_fn
    with pytest.raises(S.Cancelled):
        session.run("zoo:fake", "x", layer=2)
    assert calls == [(2, None)] and sorted(session.result.layers) == [2]


def test_cancel_takes_effect_between_chunks_of_a_layer_and_resume_redoes_it():
    """A long layer reports each chunk of its units (on_chunk): the bar moves within it and a
    cancel stops it there, not after the whole layer; resume computes that layer again."""
    Bar.made.clear()
    session, calls = _fake_session(stride=4, progress=Bar)
    original = session.layer_fn
    chunks = []

    def layer_fn(cap, layer, **kw):
        kw["on_chunk"](1, 4)  # a quarter of the units done
        chunks.append(Bar.made[-1].n)
        if len(chunks) == 1:
            session.cancel()  # the user asks for something else while layer 2 is computed
            kw["on_chunk"](2, 4)
            raise AssertionError("the cancel did not stop the layer")
        return original(cap, layer, **kw)

    session.layer_fn = layer_fn
    with pytest.raises(S.Cancelled):
        session.run("zoo:fake", "x", layer=2)
    assert calls == [] and session.result is None and chunks == [40 // 4]  # a quarter of 40 cuts
    done = session.resume()
    assert calls[0] == (2, None) and done.meta["exact_layers"] == [0, 1, 2, 3]
    last = Bar.made[-1]  # the resumed run's: the partial reports add up to each layer's cuts
    assert last.n == last.total and last.closed


def test_bad_input_in_words():
    session, _ = _fake_session()
    with pytest.raises(ValueError, match="prompt is empty"):
        session.run("zoo:fake", "  ")
    with pytest.raises(ValueError, match="hub id / folder"):
        session.run("", "x")
    with pytest.raises(ValueError, match="stride"):
        S.ExplorerSession(stride="fast")


def test_cache_hit_answers_without_loading_weights(tmp_path, monkeypatch):
    cache = ResultCache(tmp_path)
    first = S.ExplorerSession(cache=cache)
    computed = first.run(MODEL, PROMPT, layer=0)
    assert first.cache_hit is False and len(list(tmp_path.glob("results/*/*.npz"))) == 1

    def no_weights(*args, **kwargs):
        raise AssertionError("a cache hit must not load the model")

    monkeypatch.setattr(sources, "load_model", no_weights)
    second = S.ExplorerSession(cache=cache)
    updates = []
    hit = second.run(MODEL, PROMPT, layer=0, on_result=lambda r, info: updates.append(info["phase"]))
    assert second.cache_hit is True and second.forward_passes == 0 and updates == ["cached"]
    for index, lay in computed.layers.items():
        np.testing.assert_array_equal(hit.layers[index].tolerance_ess, lay.tolerance_ess)
    with pytest.raises(AssertionError, match="must not load"):  # another tolerance is a miss
        S.ExplorerSession(cache=cache).run(MODEL, PROMPT, tol=1e-2)


def test_a_local_folder_imports_neither_the_zoo_training_code_nor_widgets(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(sources.model_dir("mamba2_n4"), folder)
    code = textwrap.dedent(f"""
        import sys
        from ess_explorer.app.session import ExplorerSession
        result = ExplorerSession().run({str(folder)!r}, {PROMPT!r})
        assert result.meta["exact_layers"] == [0, 1], result.meta
        training = ("ess_explorer.zoo.train", "ess_explorer.zoo.mqar", "ess_explorer.zoo.cards", "ess_explorer.zoo.claim")
        bad = [m for m in sys.modules if m.startswith(training + ("ipywidgets", "altair"))]
        assert not bad, bad
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_torch_thread_runs_with_the_callers_torch_thread_count():
    """The explorer's worker and forward-pass threads: a new thread can start with one torch
    thread, which would put the analysis on one core."""
    import torch

    before = torch.get_num_threads()
    seen = []
    try:
        torch.set_num_threads(3)
        thread = S.torch_thread(lambda: seen.append(torch.get_num_threads()), "test")
        thread.start()
        thread.join()
    finally:
        torch.set_num_threads(before)
    assert seen == [3] and thread.daemon


def test_a_run_opens_on_the_most_used_layer_when_all_are_known_else_the_middle_one(tmp_path):
    from _deep import N_LAYERS, deep_result, level

    from ess_explorer.core.diagnostics import layer_diagnostics

    deep = deep_result()
    layer, why = S.opening_layer(range(N_LAYERS), deep)
    scores = [layer_diagnostics(deep.layer(i))["utilisation"] for i in range(N_LAYERS)]
    assert layer == int(np.argmax(scores)) == max(range(N_LAYERS), key=level)
    assert why.startswith("the highest utilisation against the ceiling")
    assert S.opening_layer(range(N_LAYERS)) == (15, "the middle layer of 30")
    assert S.opening_layer([0, 1])[0] == 0
    # a cached run opens on its most used layer, and says so
    cache = ResultCache(tmp_path)
    S.ExplorerSession(cache=cache).run(MODEL, PROMPT)
    second = S.ExplorerSession(cache=cache)
    hit = second.run(MODEL, PROMPT)
    assert second.cache_hit and second.opened == S.opening_layer(hit.layers, hit)


def test_the_eta_follows_each_kind_of_task_not_a_count_of_cuts():
    """A layer at a stride costs more per cut than exactly (another engine path, fixed work
    spread over fewer cuts): counted in cuts alike, an LLM's ETA reads about twice the real
    time. Timed per kind of task, it stays within 1.5x of the real time from the first
    layer on."""
    import dataclasses
    import time

    full, captured = _fake_captured(n_layers=4, length=40)
    # four layers of one family (an LLM's): layer 0 of the reference result four times
    full.layers = {i: dataclasses.replace(full.layers[0], layer=i) for i in range(4)}
    seconds = {None: 0.3, 4: 0.2}  # exact: 40 cuts; at stride 4: 10 cuts, two thirds of the time
    told = []

    class Clocked(Bar):
        def set_eta(self, eta):
            told.append((time.perf_counter(), eta))

    def layer_fn(cap, layer, *, stride, tol, relative, on_chunk=None):
        time.sleep(seconds[stride])
        return _strided(full.layers[layer], stride)

    session = S.ExplorerSession(
        load_fn=lambda s: ("model", "tok"),
        capture_fn=lambda m, t, p, gates, on_layer=None: captured,
        layer_fn=layer_fn,
        stride=4,
        progress=Clocked,
    )
    session.run("fake", "prompt", layer=0)
    end = time.perf_counter()
    assert len(told) == 7  # after each task: the selected layer, 3 strided, 3 exact
    for when, eta in told[:-1]:
        actual = end - when
        assert actual / 1.5 <= eta <= actual * 1.5, (eta, actual)
    assert told[-1][1] == 0.0
    # what counting cuts alike would have said after the strided layers: far above the real time
    _, after_overview = told[3]
    linear = (told[3][0] - told[0][0] + 0.3) / 70 * 120
    assert linear > 1.5 * (end - told[3][0]) and after_overview < 1.5 * (end - told[3][0])


def test_the_clock_carries_the_strided_to_exact_ratio_from_one_family_to_another():
    clock = P.TaskClock()
    assert clock.remaining([("mamba", None, 40)]) is None  # nothing timed yet: no guess
    clock.record("softmax_attention", 4, 10, 1.0)  # 0.1 s per cut at a stride
    clock.record("softmax_attention", None, 40, 1.2)  # 0.03 s per cut exactly
    clock.record("mamba", 4, 10, 0.2)  # a cheaper family, so far only at a stride
    # exact Mamba: its strided rate times attention's exact / strided ratio, 0.02 x 0.3 x 40 cuts
    assert clock.estimate("mamba", None, 40) == pytest.approx(0.24)
    assert clock.estimate("softmax_attention", 4, 10) == pytest.approx(1.0)
    assert clock.remaining([("mamba", None, 40), ("softmax_attention", None, 40)]) == pytest.approx(1.44)
    # a family not seen at all: the mean rate of its kind of task over the families timed
    assert clock.estimate("short_conv", 4, 10) == pytest.approx(0.6)
