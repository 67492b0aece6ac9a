"""The collapse failure-mode pair: the rule on hand-made numbers, the fresh prompt sets, the
initialisation that makes the collapsed model, the pair's place outside the MQAR claim, and its cards."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from ess_explorer.zoo import collapse
from ess_explorer.zoo.collapse import failure_verdict, run_reading, seed_summary

T_975_2 = 4.302652729911275  # Student t quantile, 0.975, 2 degrees of freedom (tables)


def _runs(shares, accuracies):
    return [
        {"seed": s, "utilisation": u, "share_of_cap": u, "accuracy": a}
        for s, (u, a) in enumerate(zip(shares, accuracies))
    ]


def test_seed_summary_is_the_mean_with_its_t_interval_over_seeds():
    summary = seed_summary(_runs([0.02, 0.025, 0.03], [0.2, 0.25, 0.3]))
    assert summary["n_seeds"] == 3
    share, acc = summary["share_of_cap"], summary["accuracy"]
    assert share["mean"] == pytest.approx(0.025) and share["sd"] == pytest.approx(0.005)
    half = T_975_2 * 0.005 / 3**0.5
    assert share["interval"] == pytest.approx([0.025 - half, 0.025 + half])
    assert acc["interval"] == pytest.approx([0.25 - 10 * half, 0.25 + 10 * half])


def test_run_reading_averages_its_prompt_sets():
    sets = [
        {"utilisation": 0.1, "share_of_cap": 0.2, "accuracy": 0.5},
        {"utilisation": 0.3, "share_of_cap": 0.4, "accuracy": 0.7},
    ]
    run = run_reading(4, sets)
    assert (run["seed"], run["utilisation"], run["share_of_cap"]) == (4, pytest.approx(0.2), pytest.approx(0.3))
    assert run["accuracy"] == pytest.approx(0.6) and run["sets"] is sets
    with pytest.raises(ValueError, match="at least one prompt set"):
        run_reading(0, [])


def test_failure_needs_low_use_under_the_share_and_an_accuracy_interval_below_the_twins():
    twin = seed_summary(_runs([0.6, 0.7, 0.8], [0.2, 0.25, 0.3]))  # accuracy 0.25 [0.126, 0.374]
    # share 0.025 [0.0126, 0.0374], accuracy 0.03 [0.0052, 0.0548]: both halves hold
    shown = failure_verdict(seed_summary(_runs([0.02, 0.025, 0.03], [0.02, 0.03, 0.04])), twin)
    assert shown["low_use"] and shown["accuracy_cost"] and shown["shown"]
    assert shown["line"].startswith("collapse failure mode: shown")
    # mean share 0.03 is under 0.05, but the interval's upper end (0.0548) is not: no low use
    loose = failure_verdict(seed_summary(_runs([0.02, 0.03, 0.04], [0.02, 0.03, 0.04])), twin)
    assert not loose["low_use"] and loose["accuracy_cost"] and not loose["shown"]
    assert "not shown" in loose["line"]
    # low use at the twin's accuracy: efficient compression, no accuracy cost
    efficient = failure_verdict(seed_summary(_runs([0.02, 0.025, 0.03], [0.2, 0.25, 0.3])), twin)
    assert efficient["low_use"] and not efficient["accuracy_cost"] and not efficient["shown"]
    # accuracy mean far below, but the twin's interval reaches below the collapsed model's upper end
    spread = seed_summary(_runs([0.6, 0.7, 0.8], [0.03, 0.1, 0.2]))  # lower end < 0
    wide = failure_verdict(seed_summary(_runs([0.02, 0.025, 0.03], [0.02, 0.03, 0.04])), spread)
    assert not wide["accuracy_cost"] and not wide["shown"]
    # one seed has no interval: it cannot show the failure mode
    single = failure_verdict(seed_summary(_runs([0.001], [0.0])), twin)
    assert not single["low_use"] and not single["shown"] and "one seed" in single["line"]


def test_fresh_prompt_sets_are_clear_of_every_seed_the_cards_and_training_use():
    from ess_explorer.zoo.measure import ESS_PROMPTS, ESS_SEED
    from ess_explorer.zoo.specs import TEST_SEED, VALIDATION_SEED

    used = set(range(ESS_SEED, ESS_SEED + ESS_PROMPTS))
    used |= set(range(TEST_SEED, TEST_SEED + 1024)) | set(range(VALIDATION_SEED, VALIDATION_SEED + 256))
    fresh = {s + i for s in collapse.FRESH_SEEDS for i in range(collapse.FRESH_SAMPLES)}
    assert len(collapse.FRESH_SEEDS) >= 3 and not fresh & used


def test_the_collapsing_initialisation_forgets_where_the_default_keeps(one_thread):
    """Before any training, the collapsed spec's state already holds almost nothing (exp(dt A) <=
    1/e per token), while the same architecture at its default initialisation uses far more."""
    from ess_explorer.zoo.specs import FAILURE_PAIRS, ZOO, build_model

    ((collapsed, twin),) = FAILURE_PAIRS.items()
    task = ZOO[collapsed].task
    read = {
        n: collapse.fresh_readings(build_model(ZOO[n]).eval(), task, seeds=(50_000,), n_prompts=1, n_samples=8)[0]
        for n in (collapsed, twin)
    }
    for r in read.values():
        assert r["share_of_cap"] == pytest.approx(r["utilisation"] / r["rank_cap_allows"])
        assert 0 <= r["accuracy"] <= 1
    assert read[collapsed]["share_of_cap"] < 0.5 * read[twin]["share_of_cap"]


def test_the_claim_leaves_out_the_failure_mode_pair(monkeypatch):
    from ess_explorer import sources
    from ess_explorer.zoo import claim as claim_mod
    from ess_explorer.zoo.specs import FAILURE_PAIRS

    pair = [n for p in FAILURE_PAIRS.items() for n in p]
    assert set(claim_mod.NOT_IN_CLAIM) == set(pair) and all(
        "failure-mode pair" in r for r in claim_mod.NOT_IN_CLAIM.values()
    )
    read = []
    real_card = sources.card
    monkeypatch.setattr(sources, "list_models", lambda: ["mamba2_n16", "gla_k16", *pair])
    monkeypatch.setattr(sources, "card", lambda n: read.append(n) or real_card(n))
    record = claim_mod.main(["--boot", "10", "--json", "--no-seeds"])
    assert sorted(read) == ["gla_k16", "mamba2_n16"] and record["groups"]["all"]["trained"]["n_models"] == 2


SHIPPED_PAIR = [
    n for p in __import__("ess_explorer.zoo.specs", fromlist=["FAILURE_PAIRS"]).FAILURE_PAIRS.items() for n in p
]


@pytest.mark.parametrize("name", SHIPPED_PAIR)
def test_the_pairs_cards_carry_the_record_and_its_verdict(name):
    from ess_explorer import zoo
    from ess_explorer.zoo.collapse import FAILURE_RECORD, card_field

    path = zoo.ZOO_DIR / FAILURE_RECORD
    if name not in zoo.list_models() or not path.is_file():
        pytest.skip("the pair is not shipped yet")
    record = json.loads(path.read_text())
    card = zoo.card(name)
    assert card["failure_mode"] == card_field(record, name)
    pair = record["pairs"][card["failure_mode"]["collapsed"]]
    models = pair["models"]
    for rec in models.values():  # the summaries are the t intervals of the runs, the runs the means of their sets
        assert rec["summary"] == seed_summary(rec["runs"])
        for run in rec["runs"]:
            assert len(run["sets"]) == len(record["fresh_seeds"])
            assert run["share_of_cap"] == pytest.approx(sum(s["share_of_cap"] for s in run["sets"]) / len(run["sets"]))
    collapsed, twin = (models[n]["summary"] for n in (card["failure_mode"]["collapsed"], pair["twin"]))
    assert pair["verdict"] == failure_verdict(collapsed, twin)
    shipped = [r for r in models[name]["runs"] if r["seed"] == card["training"]["seed"]]
    assert len(shipped) == 1  # the shipped weights are one of the seeds
    assert pair["verdict"]["line"] in (zoo.model_dir(name) / "README.md").read_text()
    # the typed reader exposes the same field, and only the pair's cards have one
    assert zoo.read_card(name).failure_mode == card["failure_mode"]
    assert zoo.read_card("mamba2_n16").failure_mode is None


def test_a_pair_measured_on_one_side_keeps_its_runs_without_a_verdict():
    one = [{"seed": 0, "utilisation": 0.02, "share_of_cap": 0.02, "accuracy": 0.03, "sets": []}]
    record = collapse.failure_record({"a": one}, pairs={"a": "b"})
    assert record["pairs"]["a"]["verdict"] is None and list(record["pairs"]["a"]["models"]) == ["a"]
    assert collapse._recorded_runs(record) == {"a": one}  # what a resumed measurement keeps
    both = collapse.failure_record({"a": one, "b": one}, pairs={"a": "b"})
    assert both["pairs"]["a"]["verdict"]["line"].startswith("collapse failure mode: not shown")
    assert not both["pairs"]["a"]["accuracy_apart"]["every_seed_below"]  # equal accuracies: not below
    low = [{**one[0], "seed": s, "accuracy": a} for s, a in enumerate([0.02, 0.05])]
    high = [{**one[0], "seed": s, "accuracy": a} for s, a in enumerate([0.14, 0.99])]
    apart = collapse.failure_record({"a": low, "b": high}, pairs={"a": "b"})["pairs"]["a"]["accuracy_apart"]
    assert apart == {"collapsed_best": 0.05, "twin_worst": 0.14, "every_seed_below": True}
    assert collapse.failure_record({}, pairs={"a": "b"})["pairs"] == {}
