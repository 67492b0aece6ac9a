"""verify: a result checked against plain SVDs of a sample of its cuts.

The reference is torch.linalg.svdvals of each sampled cut of the layer's own dense T, so a
passing check on real analyses says the engine's routes meet their contract there, and a
result changed by more than the contract allows must fail at the cuts changed."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from test_adapters import CONFIGS
from test_families import build

from ess_explorer import analyze, read_result, verify, write_result_dir
from ess_explorer.app import cli
from ess_explorer.core.precision import Accuracy


@pytest.fixture(scope="module")
def hybrid():
    """Mamba2 heads split into gated channels (gates inside: the row-scaled route) and
    attention heads, 2 layers, analysed under each contract."""
    model, _ = build("falcon_h1")
    ids = torch.randint(1, 64, (60,), generator=torch.Generator().manual_seed(3)).tolist()
    return model, {
        precision: analyze(model, ids, progress=False, precision=precision) for precision in ("ess", "exact")
    }


@pytest.mark.parametrize("precision", ["ess", "exact"])
def test_a_real_analysis_meets_its_contract_at_every_sampled_cut(hybrid, precision):
    model, results = hybrid
    report = verify(results[precision], model, units=6, cuts=10)
    assert report.precision == precision
    assert report.passed, str(report)
    expected = sum(min(6, lay.tolerance_ess.shape[0]) * 10 for lay in results[precision].layers.values())
    assert len(report.rows) == expected
    assert {row["layer"] for row in report.rows} == set(results[precision].layers)
    middle = results[precision].length // 2
    assert all(any(row["t"] == middle and row["layer"] == k for row in report.rows) for k in results[precision].layers)
    assert max(row["entropy_error"] for row in report.rows) < (1e-5 if precision == "ess" else 1e-9)
    causal = [row for row in report.rows if row["causal_ess_sweep"] is not None]
    mamba2 = [k for k, lay in results[precision].layers.items() if lay.family == "mamba2"]
    assert {row["layer"] for row in causal} == set(mamba2)  # attention's is its KV cache: not re-derived
    assert all(row["causal_ess"] == row["causal_ess_sweep"] for row in causal)


def test_values_are_held_to_the_resolution_where_a_small_absolute_tau_forces_the_gram_to_its_limit():
    """An absolute tolerance far below sigma_1 (1e-4 against sigma_1 near 1) puts the "ess"
    contract's resolution (about 1.4e-7) below what a Gram resolves: its counts may still be
    certain away from tau, but its values near the floor are not, so those cuts must go to the
    exact route. Lightning attention's channels with their gates inside (the row-scaled route):
    before, 108 of these 3,456 cuts kept values up to 3.9x what the contract allows."""
    model, _ = build("minimax", 381)
    ids = torch.randint(1, 64, (1, 97), generator=torch.Generator().manual_seed(381))
    result = analyze(model, ids, progress=False, gates="inside", relative=False, tol=1e-4)
    report = verify(result, model, units=10**6, cuts=10**6)
    assert len(report.rows) == 3456 and report.passed, str(report)


def test_scopes_unit_and_layer_count_against_the_largest_sigma_1():
    """Each scope's counts pass; the per-cut counts, which differ from them, fail under them."""
    model, _ = build("zamba")  # layer keys 1..5, not 0..n-1; Mamba channels and attention heads
    ids = torch.randint(1, 64, (40,), generator=torch.Generator().manual_seed(4)).tolist()
    per_cut = analyze(model, ids, progress=False, scope="cut", layers=[1, 2])
    for scope in ("unit", "layer"):
        result = analyze(model, ids, progress=False, scope=scope, layers=[1, 2])
        report = verify(result, model, units=100, cuts=100)  # every unit and cut of this small model
        assert report.passed, str(report)
        swapped = copy.deepcopy(result)
        for key, lay in swapped.layers.items():
            lay.tolerance_ess = per_cut.layers[key].tolerance_ess.copy()
        differ = sum(int((result.layers[k].tolerance_ess != per_cut.layers[k].tolerance_ess).sum()) for k in (1, 2))
        assert differ > 0  # the premise: a larger sigma_1 counts fewer values somewhere
        assert len(verify(swapped, model, units=100, cuts=100).failures) == differ


def test_a_result_changed_beyond_its_contract_fails_where_it_was_changed(hybrid):
    model, results = hybrid
    result = results["ess"]
    layer = min(result.layers)

    def changed(edit):
        bad = copy.deepcopy(result)
        edit(bad.layers[layer])
        return verify(bad, model, layers=[layer], units=3, cuts=5)

    counts = changed(lambda lay: lay.tolerance_ess.__iadd__(1))
    assert not counts.passed and all(not row["ok"] for row in counts.rows if row["t"] > 0)
    assert all(row["tolerance_ess"] == row["tolerance_ess_svd"] + 1 for row in counts.failures)

    entropy = changed(lambda lay: lay.entropy_ess.__imul__(1 + 1e-4))
    assert not entropy.passed and min(row["entropy_error"] for row in entropy.failures) > 1e-5

    causal = changed(lambda lay: lay.causal_ess.__iadd__(1))
    assert not causal.passed and all(not row["ok"] for row in causal.rows if row["t"] > 0)
    assert all(row["causal_ess"] == row["causal_ess_sweep"] + 1 for row in causal.failures)
    assert "causal ESS" in str(causal)

    within = changed(lambda lay: lay.entropy_ess.__imul__(1 + 1e-7))
    assert within.passed, str(within)

    def move_sigma_1(lay, fraction):
        lay.singular_values[..., 0] *= 1 + fraction

    values = changed(lambda lay: move_sigma_1(lay, 1e-3))  # far beyond 1.4e-6 sigma_1 + 1e-6 sigma_1
    assert not values.passed and min(row["values_error"] for row in values.failures) > 1
    assert verify(result, model, layers=[layer], units=3, cuts=5).passed


def test_the_kept_values_are_held_to_the_exact_contract_only_under_exact(hybrid):
    """A change of 1e-6 sigma_1 in the second value is within the "ess" resolution (1.4e-6
    sigma_1) and beyond the "exact" bound (1e-6 sigma_2 + 1e-10 sigma_1)."""
    model, results = hybrid
    assert Accuracy("ess").resolution > 1e-6
    for precision, passes in (("ess", True), ("exact", False)):
        bad = copy.deepcopy(results[precision])
        layer = min(bad.layers)
        lay = bad.layers[layer]
        lay.singular_values[..., 1] += 1e-6 * lay.singular_values[..., 0]
        report = verify(bad, model, layers=[layer], units=3, cuts=5)
        assert report.passed == passes, str(report)


def test_a_saved_result_verifies(hybrid, tmp_path):
    model, results = hybrid
    folder = write_result_dir(results["exact"], tmp_path / "run")
    loaded = read_result(folder)
    report = verify(loaded, model, units=2, cuts=4)
    changes = [row["operator_change"] for row in report.rows]  # None: a unit whose T the result did not keep
    assert report.passed and 0 in changes and set(changes) <= {0, None}  # its kept T reread


def test_the_report_says_where_the_forward_pass_gave_another_operator(hybrid):
    """verify compares each checked unit's T of its own pass with the T the result kept: equal
    for a reproducible model, and a difference is reported where it is (a model whose pass is
    not bitwise reproducible gives the reference another T)."""
    model, results = hybrid
    result = results["ess"]
    layer = min(result.layers)
    report = verify(result, model, layers=[layer], units=3, cuts=3)
    changes = {row["unit"]: row["operator_change"] for row in report.rows}  # None: T not kept
    assert changes[0] == 0 and set(changes.values()) <= {0, None}
    assert "another T" not in str(report)
    moved = copy.deepcopy(result)
    moved.layers[layer].operators[0][7, 3] += 0.01  # as if this pass had given another T at unit 0
    report = verify(moved, model, layers=[layer], units=3, cuts=3)
    changes = {row["unit"]: row["operator_change"] for row in report.rows}
    assert changes[0] == pytest.approx(0.01, rel=1e-4) and all(c in (0, None) for u, c in changes.items() if u != 0)
    assert report.passed and "another T than the analysed one at 1 unit(s)" in str(report)


def test_the_wrong_model_or_options_are_refused_before_any_pass(hybrid):
    model, results = hybrid
    other, _ = build("qwen3")
    with pytest.raises(ValueError, match="falcon_h1.*pass the model the result came from"):
        verify(results["ess"], other)
    with pytest.raises(ValueError, match="float64.*load it in float32"):
        verify(results["ess"], copy.deepcopy(model).to(torch.float64))
    with pytest.raises(ValueError, match=r"layers \[7\] are not in the result"):
        verify(results["ess"], model, layers=[7])
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="units must be a positive int"):
            verify(results["ess"], model, units=bad)
    with pytest.raises(TypeError, match="ESSResult"):
        verify({"layers": {}}, model)


def test_the_report_says_what_failed(hybrid):
    model, results = hybrid
    bad = copy.deepcopy(results["exact"])
    layer = min(bad.layers)
    bad.layers[layer].tolerance_ess[0] += 2
    report = verify(bad, model, layers=[layer], units=2, cuts=3)
    text = str(report)
    assert "FAILED" in text and f"layer {layer} unit 0" in text
    assert report.to_frame().shape[0] == len(report.rows)
    assert np.all(report.to_frame().query("unit != 0")["ok"])


def test_the_command_line_verifies_after_writing_the_result(capsys, tmp_path, monkeypatch):
    from ess_explorer import zoo

    default = zoo.DEFAULT_MODEL
    if default not in zoo.list_models():
        pytest.skip(f"the default zoo model {default!r} is not on disk yet")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ESS_EXPLORER_CACHE", str(tmp_path / "cache"))
    words = " ".join(zoo.task_of(default).prompt(seed=1).split()[:12])
    argv = ["analyze", "--prompt", words, "-q", "--out", str(tmp_path / "d"), "--verify", "5"]
    code = cli.main(argv)
    out = capsys.readouterr().out
    assert code == 0 and "PASSED" in out and (tmp_path / "d" / "result.npz").exists()
    from ess_explorer import verification

    checked = verification._compare  # every cut found out of contract
    monkeypatch.setattr(verification, "_compare", lambda *a, **k: {**checked(*a, **k), "ok": False})
    code = cli.main(argv)  # a cache hit: the weights are loaded for the check alone
    assert code == 1 and "FAILED" in capsys.readouterr().out


def test_a_preview_at_a_stride_is_checked_at_its_own_cuts(hybrid):
    model, _ = hybrid
    ids = torch.randint(1, 64, (50,), generator=torch.Generator().manual_seed(5)).tolist()
    preview = analyze(model, ids, progress=False, stride=7, units=[1, 3])
    report = verify(preview, model, units=2, cuts=4)
    assert report.passed, str(report)
    assert {row["t"] % 7 for row in report.rows} == {0} and {row["unit"] for row in report.rows} == {0, 1}
    assert any(row["t"] == 28 for row in report.rows)  # the computed cut nearest the middle, 25


def test_causal_ess_of_heads_from_their_recent_rows_is_checked_against_the_exact_sweep(monkeypatch):
    """A Mamba2 model whose heads take the causal route of core/recent_kernel.py (the kernel's
    threshold lowered so a tiny model takes it): its causal ESS meets the sweep's at every
    sampled cut, under the scopes "cut" and "unit"; under "layer" it is not checked."""
    import transformers as tf

    from ess_explorer.core import dense_jobs, recent_kernel

    if not recent_kernel.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(dense_jobs, "KERNEL_MIN_WORK", 0.0)
    used, grams = [], recent_kernel.RecentRows.grams
    monkeypatch.setattr(recent_kernel.RecentRows, "grams", lambda *a: used.append(1) or grams(*a))
    torch.manual_seed(5)  # the tests' tiny Mamba2 with N = 32 (the kernel's smallest size is 24)
    config = tf.Mamba2Config.from_dict({**CONFIGS["mamba2"].to_dict(), "state_size": 32, "num_hidden_layers": 1})
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(1, 64, (72,), generator=torch.Generator().manual_seed(6)).tolist()
    for scope, checked in (("cut", True), ("unit", True), ("layer", False)):
        used.clear()
        result = analyze(model, ids, progress=False, scope=scope)
        assert used  # the route under check ran
        report = verify(result, model, units=8, cuts=12)
        assert report.passed, str(report)
        swept = [row for row in report.rows if row["causal_ess_sweep"] is not None]
        assert bool(swept) == checked and all(row["causal_ess"] == row["causal_ess_sweep"] for row in swept)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["ess", "exact"])
def test_an_analysis_on_the_gpu_verifies_and_equals_the_cpus(precision):
    """Mamba2 channels and attention heads analysed on a GPU, the model on the GPU too: the
    check (its SVDs on the GPU, the stored numbers on the host) passes, and the counts equal
    the CPU's away from tau."""
    model, _ = build("falcon_h1")
    ids = torch.randint(1, 64, (60,), generator=torch.Generator().manual_seed(3)).tolist()
    on_cpu = analyze(model, ids, progress=False, precision=precision)
    model = model.cuda()
    on_gpu = analyze(model, ids, progress=False, precision=precision, device="cuda")
    report = verify(on_gpu, model, units=6, cuts=10)
    assert report.passed, str(report)
    for key, lay in on_gpu.layers.items():
        np.testing.assert_allclose(lay.entropy_ess, on_cpu.layers[key].entropy_ess, rtol=1e-5)
        assert (lay.tolerance_ess != on_cpu.layers[key].tolerance_ess).mean() < 0.01
