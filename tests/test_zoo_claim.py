"""The zoo's measurements (state in scalars, unit-scope drop at separators), the claim's
statistics with bootstrap intervals, and the difficulty-sweep figure."""

from __future__ import annotations

import numpy as np
import pytest

from ess_explorer.core.diagnostics import modulation_values
from ess_explorer.result import LayerESS
from ess_explorer.synthetic import diagonal_ssm
from ess_explorer.zoo import claim as claim_mod
from ess_explorer.zoo import claim_stats


def _layer_with_near_reset(sep: int, length: int = 24, factor: float = 1.0) -> LayerESS:
    """x_{t+1} = a_t x_t + b_t u_t: scaling a and b at sep - 1 scales the state x_sep, so every
    past contribution to outputs from sep on (the whole cut H_sep) is multiplied by ``factor``
    (a model whose state includes the current input, reset by the separator's decay)."""
    ssm = diagonal_ssm(length, 4, units=2, seed=1)
    a, b = ssm.a.clone(), ssm.b.clone()
    a[:, sep - 1, :] *= factor
    b[:, sep - 1, :] *= factor
    return LayerESS.from_operator(
        0, "mamba", type(ssm)(a, b, ssm.c, ssm.d), np.full(length, 4.0), tol=1e-3, relative=True
    )


def test_unit_scope_tolerance_sees_a_near_reset_that_the_per_cut_tolerance_misses():
    sep = 12
    plain = _layer_with_near_reset(sep)
    lay = _layer_with_near_reset(sep, factor=1e-5)
    per_cut = lay.tolerance_ess
    scoped = modulation_values(lay)
    # the cut at the separator is the whole past scaled by 1e-5: per-cut relative ESS is unchanged ...
    assert (per_cut[:, sep] == plain.tolerance_ess[:, sep]).all() and (per_cut[:, sep] == 4).all()
    # ... while against the unit's largest sigma_1 it is empty there (not before it, nor without the reset)
    assert (scoped[:, sep] == 0).all() and (scoped[:, sep - 2] >= 1).all()
    assert (modulation_values(plain)[:, sep] >= 1).all()
    # scoped <= per-cut everywhere (the unit-scope threshold is never lower than the cut's own)
    assert (scoped <= per_cut).all()


def test_unit_scope_matches_analyze_scope_unit_on_a_zoo_model():
    # the modulation's count from the kept spectra and analyze's own scope="unit" tolerance agree
    from ess_explorer import analyze, zoo

    name = zoo.DEFAULT_MODEL
    model, _ = zoo.load(name)
    ids = zoo.task_of(name).sample(1, seed=3).input_ids[0][:40]
    per_cut = analyze(model, input_ids=ids, progress=False, keep_operators=None, gates="outside")
    scoped = analyze(model, input_ids=ids, progress=False, keep_operators=None, gates="outside", scope="unit")
    for index, lay in per_cut.layers.items():
        assert np.array_equal(modulation_values(lay), scoped.layer(index).tolerance_ess)


def _card(name, rows, untrained_rows, family="mamba2", main=True, architecture=None, seed=0):
    """A card whose sweep rows carry ess (every aggregation: mean, max, cut) and tss per K."""

    def row(k, acc, ess, tss):
        out = {"pairs": k, "accuracy": acc}
        for keys in (("ess_per_kv", "entropy_ess_per_kv", "tss_per_kv"),) + tuple(
            (f"ess_{how}_per_kv", f"entropy_ess_{how}_per_kv", f"tss_{how}_per_kv") for how in ("mean", "max")
        ):
            out.update(dict(zip(keys, (ess, ess / 2, tss))))
        return out

    card = {
        "family": family,
        "training": {"train_pairs": [2, 4] if main else None, "seed": seed},
        "sweep": {"rows": [row(*r) for r in rows]},
        "untrained": {"sweep": [row(*r) for r in untrained_rows]},
        "heldout": {"accuracy": rows[0][1]},
    }
    if architecture:
        card.pop("untrained")
        card["replica_of"] = architecture
    return card


def _monotone_cards():
    # accuracy rises with ESS/kv exactly (Spearman 1 over all points) while TSS/kv ranks it backwards
    return {
        "a": _card("a", [(2, 0.1, 1.0, 40.0), (4, 0.2, 2.0, 30.0)], [(2, 0.01, 5.0, 40.0), (4, 0.01, 5.5, 30.0)]),
        "b": _card("b", [(2, 0.3, 3.0, 20.0), (4, 0.4, 4.0, 10.0)], [(2, 0.01, 5.2, 20.0), (4, 0.01, 5.1, 10.0)], "la"),
        "c": _card("c", [(2, 0.5, 5.0, 9.0), (4, 0.6, 6.0, 8.0)], [(2, 0.01, 5.3, 9.0), (4, 0.01, 5.4, 8.0)], "gla"),
    }


def test_claim_over_time_aggregates_with_every_test_corrected():
    cards = _monotone_cards()
    pts = claim_mod.points(cards)
    assert [p["architecture"] for p in pts] == ["a", "a", "b", "b", "c", "c"]
    corr = claim_stats.correlations(pts, claim_mod.PREDICTORS)
    for how in ("mean", "max", ""):
        key = f"ess_{how}_per_kv" if how else "ess_per_kv"
        assert corr[key]["spearman"] == pytest.approx(1.0)
    assert corr["tss_mean_per_kv"]["spearman"] == pytest.approx(-1.0)
    record = claim_mod.claim(cards, n_boot=200)
    tests = record["tests"]
    # 2 groups x 3 aggregations x 2 predictors, plus 2 per family left out (3 families) on the main task
    assert tests["m"] == 12 + 6 == len(tests["tests"])
    t = tests["tests"]["[main_task] mean: ESS/kv - TSS/kv"]
    assert t["difference"] == pytest.approx(2.0)
    assert t["interval"] == pytest.approx([2.0, 2.0])  # every resample is still monotone
    # no resample at or below 0: p = 2 (0 + 1) / (200 + 1); Holm multiplies the smallest p by the 18 tests
    assert t["p"] == pytest.approx(2 / 201) and t["p_holm"] == pytest.approx(18 * 2 / 201) and not t["holds"]
    assert "single cut t* = 2K (variant)" in claim_mod.PREDICTORS["ess_per_kv"]
    trained = record["groups"]["main_task"]["trained"]
    assert trained["resampled"].startswith("architectures (one seed each")
    # the control takes the predictors from the untrained copies, the accuracy from the trained models
    control = claim_mod.points(cards, untrained=True)
    assert [p["accuracy"] for p in control] == [p["accuracy"] for p in pts]
    assert [p["ess_mean_per_kv"] for p in control] == [5.0, 5.5, 5.2, 5.1, 5.3, 5.4]
    assert set(record["per_family"]) == {"mamba2", "la", "gla"}
    text = "\n".join(claim_mod.verdict(record)) + claim_mod.format_claim(record, cards)
    assert "Holm" in text and "Bonferroni" in text and "without la" in text


def test_bootstrap_resamples_architectures_then_seeds():
    cards = _monotone_cards()
    cards["a_s1"] = _card("a_s1", [(2, 0.15, 1.5, 40.0), (4, 0.25, 2.5, 30.0)], [], architecture="a", seed=1)
    cards["a_s2"] = _card("a_s2", [(2, 0.12, 1.2, 40.0), (4, 0.22, 2.2, 30.0)], [], architecture="a", seed=2)
    rows = claim_mod.points(cards)
    draws, design = claim_stats.hierarchical_draws(rows, n_boot=300, seed=0)
    assert design == {"architectures": 3, "seeds_per_architecture": {"a": 3, "b": 1, "c": 1}}
    for draw in draws:
        picked = [rows[i] for i in draw]
        # a model's K points move together; a drawn architecture brings as many models as it has seeds
        models = [r["model"] for r in picked]
        assert all(models.count(m) % 2 == 0 for m in set(models))
        per_arch = {a: sum(r["architecture"] == a for r in picked) // 2 for a in ("a", "b", "c")}
        assert per_arch["a"] % 3 == 0 and len(draw) // 2 == per_arch["a"] + per_arch["b"] + per_arch["c"]
        assert sum(v // (3 if a == "a" else 1) for a, v in per_arch.items()) == 3  # 3 architectures drawn
    # with seeds inside an architecture, replicas of "a" are drawn at the inner level
    assert any(len({rows[i]["model"] for i in d if rows[i]["architecture"] == "a"}) < 3 for d in draws if d)
    record = claim_mod.claim(cards, n_boot=50)
    assert record["groups"]["all"]["trained"]["resampled"] == "architectures, then seeds within each"


def test_holm_and_bonferroni_corrections():
    assert claim_stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert claim_stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    rng = np.random.default_rng(0)
    draws = {"clear": list(rng.normal(1.0, 0.1, 2000)), "weak": list(rng.normal(0.2, 0.12, 2000))}
    out = claim_stats.corrected_tests({"clear": 1.0, "weak": 0.2}, draws)
    assert out["m"] == 2 and out["tests"]["clear"]["holds"]
    weak = out["tests"]["weak"]
    lo, hi = weak["interval"]
    blo, bhi = weak["bonferroni_interval"]
    assert blo < lo and bhi > hi  # level 1 - 0.05 / 2 is wider
    # Holm: the smaller p times 2, the larger times 1 but never below the step before it
    assert out["tests"]["clear"]["p"] < weak["p"]
    assert weak["p_holm"] == pytest.approx(max(2 * out["tests"]["clear"]["p"], weak["p"]))


def test_bootstrap_interval_is_wide_when_models_disagree():
    # two models with opposite trends: pooled Spearman is weak and its interval spans zero
    cards = {
        "up": _card("up", [(2, 0.1, 1.0, 9.0), (4, 0.9, 9.0, 9.0)], []),
        "down": _card("down", [(2, 0.9, 2.0, 8.0), (4, 0.1, 8.0, 8.0)], []),
        "flat": _card("flat", [(2, 0.5, 3.0, 7.0), (4, 0.5, 7.0, 7.0)], []),
    }
    boot = claim_stats.bootstrap(claim_mod.points(cards), ["ess_mean_per_kv"], {}, n_boot=300, seed=0)
    lo, hi = boot["correlations"]["ess_mean_per_kv"]["spearman"]
    assert lo < 0 < hi


def test_difficulty_figure_draws_accuracy_and_state_per_pair():
    from ess_explorer.views.difficulty import difficulty_figure, difficulty_frame

    rows = [{"pairs": k, "accuracy": 1 / k, "ess_per_kv": 64 / k, "tss_per_kv": 128 / k} for k in (2, 4, 8)]
    frame = difficulty_frame({"m": rows}, untrained={"m": rows})
    assert sorted(set(frame["quantity"])) == ["ESS/kv", "TSS/kv", "untrained ESS/kv"]
    assert len(frame) == 9
    spec = difficulty_figure({"m": rows}, untrained={"m": rows}).to_dict()
    assert len(spec["hconcat"]) == 2
    assert spec["hconcat"][1]["layer"][1]["encoding"]["y"]["scale"]["type"] == "log"
    with pytest.raises(ValueError, match="lacks"):
        difficulty_frame({"m": [{"pairs": 2}]})
    # the same figure through the package's figure kinds, at the double column width
    from ess_explorer import figure
    from ess_explorer.views.theme import PAPER_WIDTHS

    via_kind = figure({"m": rows}, "difficulty", untrained={"m": rows}, width="double").to_dict()
    assert via_kind["hconcat"][1]["layer"][1]["encoding"]["y"]["scale"]["type"] == "log"
    assert via_kind.get("width", PAPER_WIDTHS["double"]) <= PAPER_WIDTHS["double"]


def test_claim_command_on_two_shipped_models(capsys):
    from ess_explorer import zoo

    names = ["mamba2_n16", "gla_k16"]
    record = claim_mod.main(["--only", *names, "--boot", "20", "--json", "--no-seeds"])
    rec = record["groups"]["all"]["trained"]
    assert rec["n_models"] == 2 and rec["n_points"] == sum(len(zoo.card(n)["sweep"]["rows"]) for n in names)
    # the statistic over the cards' points is the one scipy computes directly
    pts = claim_mod.points({n: zoo.card(n) for n in names})
    from scipy import stats

    want = stats.spearmanr([p["ess_mean_per_kv"] for p in pts], [p["accuracy"] for p in pts])[0]
    assert rec["correlations"]["ess_mean_per_kv"]["spearman"] == pytest.approx(want)
    lo, hi = rec["intervals"]["ess_mean_per_kv"]["spearman"]
    assert lo <= hi
    assert '"groups"' in capsys.readouterr().out


def test_seed_replicas_are_measured_once_and_kept(tmp_path, monkeypatch):
    from ess_explorer.zoo import seeds

    folder = tmp_path / "replicas"
    for name in ("llama_s1", "la_k16_s1", "half_written"):
        (folder / name).mkdir(parents=True)
    for name in ("llama_s1", "la_k16_s1"):  # training.json is written last: a folder without it is in training
        (folder / name / "training.json").write_text("{}")
    measured = []

    def fake(sub):
        measured.append(sub.name)
        return {"replica_of": sub.name.rsplit("_s", 1)[0], "training": {"seed": 1}, "heldout": {"accuracy": 0.5}}

    monkeypatch.setattr(seeds, "measure_replica", fake)
    out = tmp_path / "seeds.json"
    first = seeds.main([str(folder), "--out", str(out)])
    assert sorted(first) == ["la_k16_s1", "llama_s1"] and sorted(measured) == sorted(first)
    assert seeds.replica_cards(out) == first
    measured.clear()
    seeds.main([str(folder), "--out", str(out)])  # nothing new: nothing re-measured
    assert measured == []
    seeds.main([str(folder), "--out", str(out), "--redo"])
    assert sorted(measured) == ["la_k16_s1", "llama_s1"]
    assert seeds.replica_cards(tmp_path / "absent.json") == {}


def test_collapse_verdict_needs_low_use_and_an_accuracy_cost():
    def record(utilisation, accuracy):
        row = {"model": "m", "layer": "0", "utilisation": utilisation, "rank_cap_allows": 1.0, "untrained": 0.5}
        collapse = [{**row, "length": 128, "accuracy": accuracy}]
        return {"tests": {"tests": {}, "m": 0}, "groups": {}, "per_family": {}, "resets": [], "collapse": collapse}

    efficient = " ".join(claim_mod.verdict(record(0.099, 1.0)))
    assert "Collapsed by training" in efficient and "not the paper's failure mode" in efficient
    assert "not the paper's failure mode" in " ".join(claim_mod.verdict(record(0.03, 0.99)))  # no accuracy cost
    assert "the paper's failure mode, a state left unused" in " ".join(claim_mod.verdict(record(0.03, 0.5)))


def test_card_shows_its_seed_replicas_and_the_claims_tests_that_concern_it():
    from ess_explorer.sources import card as read_card
    from ess_explorer.zoo.cards import render_readme

    shipped = read_card("la_k16")
    k = shipped["task"]["num_pairs"]
    row = {"pairs": k, "ess_mean_per_kv": 12.5, "entropy_ess_mean_per_kv": 7.25, "tss_mean_per_kv": 64.0}
    replicas = {
        "la_k16_s1": {
            "replica_of": "la_k16",
            "training": {"seed": 1},
            "heldout": {"accuracy": 0.4},
            "sweep": {"rows": [row]},
        },
        "gla_k16_s1": {
            "replica_of": "gla_k16",
            "training": {"seed": 1},
            "heldout": {"accuracy": 0.9},
            "sweep": {"rows": []},
        },
    }
    test = {"difference": 0.31, "bonferroni_interval": [0.05, 0.6], "p_holm": 0.02, "holds": True}
    family_out = {"difference": -0.1, "bonferroni_interval": [-0.4, 0.2], "p_holm": 1.0, "holds": False}
    record = {
        "models": ["la_k16", "la_k16_s1"],
        "tests": {
            "m": 24,
            "tests": {
                "[main_task] mean: ESS/kv - TSS/kv": test,
                "[main_task without linear_attention] mean: ESS/kv - TSS/kv": family_out,
            },
        },
    }
    text = render_readme(shipped, replicas, record)
    assert "| 1 | 0.400 | 12.5 | 7.2 | 64.0 |" in text  # the replica of this model, at the card's K
    assert "| 0 | " in text and "0.900" not in text  # the shipped run beside it; another model's replica left out
    assert "all main-task architectures: +0.31, Bonferroni interval [+0.05, +0.60], Holm p 0.020: holds." in text
    assert "without the linear_attention family: -0.10" in text and "does not hold after correction" in text
    # without records the card has neither section
    plain = render_readme(shipped)
    assert "Over training seeds" not in plain and "In the zoo's claim" not in plain
