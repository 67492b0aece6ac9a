"""advise on synthetic operators whose needed state is known in closed form:

- a diagonal recurrence with N modes of which only k are driven (b = 0 on the others) has
  rank(H_t) <= k at every cut, and = min(k, t, L - t) generically: it needs a state of k, not N;
- attention restricted to a window w has rank(H_t) <= w - 1, = min(w - 1, t, L - t) generically;
- full attention reaches min(t, L - t): its largest value floor(L / 2) at t = L / 2.
"""

import json

import numpy as np
import pytest
import torch

from ess_explorer import ESSResult, LayerESS, advise
from ess_explorer.core.operators import DiagonalSSM
from ess_explorer.synthetic import softmax_attention

L = 40


def recurrence(state: int, driven: int, *, units: int = 3, seed: int = 0) -> DiagonalSSM:
    g = torch.Generator().manual_seed(seed)
    a = 0.85 + 0.14 * torch.rand(units, L, state, generator=g, dtype=torch.float64)
    b = torch.randn(units, L, state, generator=g, dtype=torch.float64)
    b[..., driven:] = 0.0  # modes driven by no input: the state they span is never written
    c = torch.randn(units, L, state, generator=g, dtype=torch.float64)
    return DiagonalSSM(a, b, c)


def windowed(window: int | None, *, units: int = 2, seed: int = 0) -> torch.Tensor:
    heads = softmax_attention(L, units=units, seed=seed)
    if window is not None:
        lag = torch.arange(L)[:, None] - torch.arange(L)[None, :]
        heads = heads * (lag < window)
    return heads


def result(layer: LayerESS, seed: int) -> ESSResult:
    meta = {"model_id": "synthetic", "tol": 1e-3, "relative": True, "scope": "cut", "gates": "inside"}
    return ESSResult(tokens=[f"x{i}" for i in range(L)], input_ids=list(range(L)), layers={0: layer}, meta=meta)


def ssm_results(state: int, driven, prompts: int = 4) -> list[ESSResult]:
    driven = [driven] * prompts if isinstance(driven, int) else driven
    return [
        result(LayerESS.from_operator(0, "mamba", recurrence(state, k, seed=s), tol=1e-3, relative=True), s)
        for s, k in enumerate(driven)
    ]


def attention_results(window, prompts: int = 3, multiplicity: int = 1) -> list[ESSResult]:
    return [
        result(
            LayerESS.from_operator(
                0,
                "softmax_attention",
                windowed(window, seed=s),
                tol=1e-3,
                relative=True,
                window=window,
                multiplicity=multiplicity,
            ),
            s,
        )
        for s in range(prompts)
    ]


def coverage(advice, n: int) -> float:
    return dict(advice.coverage)[n].value


@pytest.mark.parametrize("state, driven", [(8, 3), (8, 1), (6, 6)])
def test_a_recurrence_with_k_of_n_modes_driven_needs_k(state, driven):
    advice = advise(ssm_results(state, driven), n_boot=50).layer(0)
    assert advice.kind == "recurrent" and advice.state_per_unit == state
    assert advice.advised_per_unit.value == driven
    assert advice.advised_per_unit.low == advice.advised_per_unit.high == driven  # every prompt needs k
    assert advice.ratio.value == pytest.approx(driven / state)
    assert advice.advised_scalars.value == driven * advice.channels
    assert advice.units_active == 3
    assert advice.state_scalars == 3 * state
    # rank(H_t) <= k exactly: every cut is covered by k, not every cut by k - 1
    assert coverage(advice, state) == 1.0
    causal = advice.distribution("causal")  # the state the past writes: min(t, k)
    assert causal is not None and causal.per_unit[causal.levels.index(0.99)].value == driven


def test_coverage_counts_the_cuts_a_state_reproduces():
    # k = 3 of 8: ESS(t) = min(3, t, L - t) for generic parameters, so ESS <= 2 only at t in {1, 2, 38, 39}
    advice = advise(ssm_results(8, 3), n_boot=20).layer(0)
    low_cuts = sum(min(3, t, L - t) <= 2 for t in range(1, L))
    assert coverage(advice, 2) == pytest.approx(low_cuts / (L - 1))
    assert coverage(advice, 4) == 1.0


@pytest.mark.parametrize("window", [4, 7])
def test_attention_over_a_window_needs_at_most_w_minus_1(window):
    advice = advise(attention_results(window), n_boot=50, sizes=range(1, 9)).layer(0)
    assert advice.kind == "attention"
    assert advice.state_per_unit == window - 1  # the KV cache of a window holds w - 1 past tokens
    assert advice.advised_per_unit.value == window - 1
    assert coverage(advice, window - 1) == 1.0 and coverage(advice, window - 2) < 1.0
    tolerance = advice.distribution("tolerance")
    assert tolerance.per_unit[-1].value <= window - 1  # every quantile, the largest included
    assert advice.full_attention_state == L // 2  # generic full attention on the same cuts: min(t, L - t)
    assert advice.candidate  # at most half of that
    causal = advice.distribution("causal")  # the cache of a window: min(t, w - 1) past tokens
    assert causal.per_unit[-1].value == window - 1


def test_full_attention_reaches_its_ceiling_and_is_no_candidate():
    advice = advise(attention_results(None), n_boot=50).layer(0)
    assert advice.state_per_unit == L - 1 and advice.ceiling_peak == L // 2
    # min(t, L - t) over t = 1..39: the value 20 is 1 cut in 39 (2.6% > 1%), so q = 0.99 needs 20
    assert advice.advised_per_unit.value == advice.full_attention_state == L // 2
    assert not advice.candidate
    assert advice.ceiling_use.value > 0.99
    assert coverage(advice, 16) == pytest.approx(sum(min(t, L - t) <= 16 for t in range(1, L)) / (L - 1))


def test_the_kv_cache_counts_kv_heads_not_query_heads():
    results = attention_results(None, multiplicity=8)  # 2 query heads of head_dim 8
    gqa = advise(results, kv_heads=1, n_boot=10).layer(0)
    assert gqa.kv_heads == 1 and gqa.head_dim == 8
    assert gqa.state_scalars == 2 * 1 * 8 * (L - 1)
    mha = advise(results, n_boot=10)
    assert mha.layer(0).state_scalars == 2 * 2 * 8 * (L - 1)
    assert "no GQA" in json.dumps(mha.data["notes"])
    with pytest.raises(ValueError, match="kv_heads"):
        advise(results, kv_heads=3, n_boot=10)


def test_intervals_come_from_resampling_prompts():
    # half the prompts drive 2 modes, half 5: the need depends on which prompts are drawn
    results = ssm_results(8, [2, 5, 2, 5, 2, 5])
    advice = advise(results, n_boot=400, seed=1)
    layer = advice.layer(0)
    assert layer.advised_per_unit.value == 5
    mean = layer.distribution("tolerance").mean_per_unit
    assert mean.low < mean.value < mean.high
    assert 2 <= layer.advised_per_unit.low <= layer.advised_per_unit.high == 5
    assert advise(results, n_boot=400, seed=1).to_dict() == advice.to_dict()  # seeded
    assert advise(results, n_boot=400, seed=2).to_dict() != advice.to_dict()


def test_a_table_and_its_results_give_the_same_advice():
    from ess_explorer.sweep.table import result_table

    results = ssm_results(8, 3)
    frames = [result_table(r, prompt_id=i, checkpoint_step=None).to_pandas() for i, r in enumerate(results)]
    import pandas as pd

    table = pd.concat(frames, ignore_index=True).assign(model="synthetic")
    by_table = advise(table, n_boot=30).to_dict()
    by_results = advise(results, n_boot=30).to_dict()
    assert by_table["layers"] == by_results["layers"]
    assert by_results["data"]["tol"] == 1e-3 and by_results["data"]["gates"] == "inside"
    assert by_results["data"]["n_prompts"] == 4 and by_results["data"]["length"] == {"min": L, "max": L}


def test_json_round_trip_and_frame(tmp_path):
    advice = advise(ssm_results(8, 3, prompts=2), n_boot=10)
    text = advice.to_json(tmp_path / "advice.json")
    assert json.loads((tmp_path / "advice.json").read_text()) == json.loads(text) == advice.to_dict()
    frame = advice.to_frame()
    assert list(frame["advised_per_unit"]) == [3.0] and list(frame["kind"]) == ["recurrent"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(quantile=0), "quantile"),
        (dict(quantile=1.5), "quantile"),
        (dict(variant="rank"), "variant"),
        (dict(confidence=1.0), "confidence"),
        (dict(n_boot=0), "n_boot"),
    ],
)
def test_bad_options_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        advise(ssm_results(8, 3, prompts=1), **kwargs)


def test_bad_sources_are_refused():
    import pandas as pd

    with pytest.raises(ValueError, match="columns"):
        advise(pd.DataFrame({"model": ["m"]}))
    with pytest.raises(ValueError, match="sweep table"):
        advise(42)
    results = ssm_results(8, 3, prompts=1)
    results[0].layers[0].causal_ess[:] = np.nan  # as for a dense operator with no known realisation
    with pytest.raises(ValueError, match="causal"):
        advise(results, variant="causal", n_boot=5)
    assert advise(results, n_boot=5).layer(0).distribution("causal") is None


def write_sweep(folder, results, model="synthetic"):
    from ess_explorer.sweep.table import result_table, shard_path, write_shard

    for index, res in enumerate(results):
        rows = result_table(res, prompt_id=index, checkpoint_step=None)
        meta = {"run": {"model": model}, "prompt_ids": [index], "n_tokens": [res.length], "analysis": res.meta}
        write_shard(shard_path(folder, model, None, index), rows, meta)
    return folder


def test_the_cli_advises_on_a_sweep_folder(tmp_path, capsys):
    from ess_explorer.app.cli import main

    folder = write_sweep(tmp_path / "sweep", ssm_results(8, 3, prompts=3))
    out = tmp_path / "advice.json"
    assert main(["advise", str(folder), "--quantile", "0.9", "--n-boot", "50", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["quantile"] == 0.9 and saved["data"]["n_prompts"] == 3
    assert saved["data"]["tol"] == 1e-3 and saved["data"]["length"] == {"min": L, "max": L}
    (layer,) = saved["layers"]
    assert layer["advised_per_unit"] == {"value": 3.0, "low": 3.0, "high": 3.0}
    assert "layer 0 (mamba, 3 units): state 8 per unit, advised 3 [3, 3]" in printed


def test_the_cli_reports_attention_with_its_kv_heads(tmp_path, capsys):
    from ess_explorer.app.cli import main

    folder = write_sweep(tmp_path / "sweep", attention_results(4, prompts=2, multiplicity=8))
    assert main(["advise", str(folder), "--kv-heads", "1", "--n-boot", "20"]) == 0
    printed = capsys.readouterr().out
    assert "KV cache 48 scalars (1 KV heads)" in printed  # 2 x 1 x 8 x (w - 1)
    assert "a recurrent candidate" in printed


def test_the_cli_refuses_bad_input_in_one_line(tmp_path, capsys):
    from ess_explorer.app.cli import main

    assert main(["advise", str(tmp_path / "missing")]) == 1
    assert "not a folder" in capsys.readouterr().err
    assert main(["advise", str(tmp_path), "--quantile", "1.5"]) == 2
    assert "quantile" in capsys.readouterr().err
    assert main(["advise", str(tmp_path)]) == 1  # a folder with no sweep table
    assert "no sweep table" in capsys.readouterr().err


def check_record(advised_gap, quarter_gap):
    """A hand-made record of scripts/advice_check.py: one teacher at 0.99, students whose gaps are given
    as (mean, low, high)."""

    def student(n, gap):
        mean, low, high = gap
        return {
            "state_size": n,
            "seeds": [0, 1, 2],
            "per_seed": [0.99 - mean] * 3,
            "mean": 0.99 - mean,
            "low": 0.99 - high,
            "high": 0.99 - low,
            "gap_to_teacher": {"mean": mean, "low": low, "high": high, "n": 3},
        }

    def dist(mean, at_q):
        return {"mean_per_unit": {"value": mean}, "quantiles": [{"q": 0.99, "per_unit": {"value": at_q}}]}

    layer = {
        "layer": 0,
        "advised_per_unit": {"value": 8, "low": 7, "high": 9},
        "state_per_unit": 32,
        "distributions": {"tolerance": dist(5.5, 8), "entropy": dist(2.5, 4)},
    }
    teacher = {
        "family": "mamba2",
        "accuracy": 0.99,
        "low": 0.98,
        "high": 0.995,
        "advised": 8,
        "advised_from_layer": 0,
        "advice": {"layers": [layer]},
        "sizes": {"advised": 8, "half": 4, "quarter": 2},
        "students": {
            "advised": student(8, advised_gap),
            "half": student(4, advised_gap),
            "quarter": student(2, quarter_gap),
        },
    }
    return {
        "prompts": 4,
        "quantile": 0.99,
        "variant": "tolerance",
        "seeds": [0, 1, 2],
        "student": {"architecture": "a", "training": "b", "evaluation": "c", "interval": "d"},
        "teachers": {"teacher": teacher},
        "students": [{"state_size": n, "seed": s, "accuracy": 0.9} for n in (2, 4, 8) for s in (0, 1, 2)],
        "cpu_seconds": 60.0,
        "threads": 1,
    }


@pytest.mark.parametrize(
    "advised_gap, quarter_gap, holds",
    [
        ((0.01, -0.01, 0.03), (0.20, 0.10, 0.30), True),
        ((0.01, -0.01, 0.03), (0.20, 0.02, 0.38), False),  # the quarter's interval reaches 3 points
        ((0.05, 0.04, 0.06), (0.20, 0.10, 0.30), False),  # the advised student is 5 points below
    ],
)
def test_the_check_verdict_follows_the_intervals(advised_gap, quarter_gap, holds):
    from ess_explorer.zoo.readme import advice_check_lines, advice_check_verdicts

    (line,) = advice_check_verdicts(check_record(advised_gap, quarter_gap))
    assert ("The prediction holds" in line) == holds
    text = "\n".join(advice_check_lines(check_record(advised_gap, quarter_gap)))
    assert "| `teacher` | mamba2 | 0.990 [0.980, 0.995] | 8 (layer 0, [7, 9]; has 32) | quarter | 2 |" in text
    assert "mean tolerance-ESS per unit 5.5; at the same quantile entropy-ESS 4 (" in text


def test_the_check_figure_draws_every_size_against_the_teacher(tmp_path):
    from ess_explorer.views.advice import advice_check_figure, advice_check_frame
    from ess_explorer.views.render import save_figure

    record = check_record((0.01, -0.01, 0.03), (0.20, 0.10, 0.30))
    frame = advice_check_frame(record)
    assert len(frame) == 9 and set(frame["order"]) == {0, 1, 2}
    assert save_figure(advice_check_figure(record), tmp_path / "check.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="teachers"):
        advice_check_frame({})


def test_the_report_shows_the_advice_next_to_the_summary(tmp_path):
    from ess_explorer.app.report import report_html

    results = ssm_results(8, 3, prompts=2)
    advice = advise(results, n_boot=10)
    page = report_html(results[0], advice=advice, embed_data=False)
    assert page.index("Per-layer summary") < page.index("<h2>Advice</h2>") < page.index("<h2>Prompt, as")
    assert "<td>3 [3, 3]</td>" in page and "<td>0.38 [0.38, 0.38]</td>" in page  # advised 3 of 8
    assert page.count("<svg") >= 1
    assert "<h2>Advice</h2>" not in report_html(results[0], embed_data=False)


def test_advice_on_a_sweep_of_a_zoo_attention_model_reads_its_kv_heads(tmp_path):
    from ess_explorer import run_sweep, zoo

    task = zoo.task_of("llama")
    prompts = [" ".join(task.prompt(seed=s).split()[:24]) for s in range(3)]
    done = run_sweep(["zoo:llama"], prompts, out=tmp_path / "sweep", layers=[0], progress=False)
    advice = advise(done, n_boot=50)
    layer = advice.layer(0)
    config = json.loads((zoo.model_dir("llama") / "config.json").read_text())
    kv, heads = config["num_key_value_heads"], config["num_attention_heads"]
    head_dim = config["hidden_size"] // heads
    assert layer.kind == "attention" and layer.units == heads and layer.head_dim == head_dim
    assert layer.kv_heads == kv and advice.data["notes"]["kv_heads of zoo:llama layer 0"] == "the model's config"
    assert layer.state_scalars == 2 * kv * head_dim * (layer.length - 1)
    assert layer.advised_per_unit.value <= layer.length // 2  # no cut of L tokens has a larger rank
    assert 0 < layer.ceiling_use.value <= 1
    assert advice.data["n_prompts"] == 3 and advice.data["gates"] == "inside"
