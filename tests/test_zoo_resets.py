"""Learned resets against matched controls: the per-seed pairing, the t interval over seeds and
the verdict, on hand-made records; and the separator records a seed replica keeps."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from ess_explorer.zoo import resets

T_975_2 = 4.302653  # Student t quantile 0.975 with 2 degrees of freedom (tables)


def test_t_interval_on_known_numbers():
    got = resets.t_interval([1.0, 2.0, 3.0])  # mean 2, sd 1
    half = T_975_2 / 3**0.5
    assert got["n"] == 3 and got["mean"] == pytest.approx(2.0) and got["sd"] == pytest.approx(1.0)
    assert got["interval"] == pytest.approx([2.0 - half, 2.0 + half], abs=1e-5)
    assert resets.t_interval([0.4]) == {"n": 1, "mean": 0.4, "sd": None, "interval": None}
    with pytest.raises(ValueError, match="at least one value"):
        resets.t_interval([])


def _drop(graded: float, count: float, scales: tuple[float, ...]) -> dict:
    return {
        "graded_modulation": graded,
        "modulation": count,
        "layers": {str(i): {"past_scale": s} for i, s in enumerate(scales)},
    }


def _cards(reset_graded: dict[int, float], control_graded: dict[int, float], control_accuracy: float = 0.85) -> dict:
    """Shipped cards (seed 0) and replicas (NAME_sS) of a reset model and its control."""
    cards = {}
    for model, key, graded in (
        ("m_reset", "separator_drop", reset_graded),
        ("m_keep", "separator_control", control_graded),
    ):
        for seed, g in graded.items():
            name = model if seed == 0 else f"{model}_s{seed}"
            cards[name] = {
                "family": "fam",
                "training": {"seed": seed},
                "heldout": {"accuracy": 0.9 if model == "m_reset" else control_accuracy, "stale_accuracy": 0.7},
                key: _drop(g, 0.05, (0.3, 0.6) if model == "m_reset" else (0.9, 1.0)),
                **({} if seed == 0 else {"replica_of": model}),
            }
    return cards


def test_seed_pairs_pair_by_training_seed_and_take_reset_minus_control():
    cards = _cards({0: 0.7, 1: 0.6, 3: 0.9}, {0: 0.1, 1: 0.2, 2: 0.0})
    rows = resets.reset_seed_pairs(cards, "m_reset", "m_keep")
    assert [r["seed"] for r in rows] == [0, 1]  # seeds 2 and 3 have no partner
    assert [r["graded_difference"] for r in rows] == pytest.approx([0.6, 0.4])
    assert rows[0]["count_difference"] == pytest.approx(0.0)
    assert rows[0]["past_scale_difference"] == pytest.approx(0.3 - 0.9)  # smallest over layers of each
    assert rows[0]["accuracy_reset"] == 0.9 and rows[0]["accuracy_control"] == 0.85
    assert rows[0]["control_graded_own"] is None  # the hand-made control has no own-prompt record


def test_a_reset_is_seen_only_when_the_interval_lies_above_zero_with_the_margin():
    clear = resets.reset_seed_pairs(_cards({0: 0.7, 1: 0.8, 2: 0.9}, {0: 0.2, 1: 0.2, 2: 0.2}), "m_reset", "m_keep")
    summary = resets.reset_summary(clear)  # differences 0.5, 0.6, 0.7
    half = T_975_2 * 0.1 / 3**0.5
    assert summary["graded_difference"]["interval"] == pytest.approx([0.6 - half, 0.6 + half], abs=1e-5)
    assert summary["seen"] and summary["seeds"] == [0, 1, 2]
    line = resets.reset_line("m_reset", "m_keep", "fam", clear, summary)
    assert "n = 3 seeds" in line and "A learned reset is seen in fam" in line
    assert "held-out accuracy 0.900 (seeds 0.900-0.900) vs 0.850 (seeds 0.850-0.850)" in line
    noisy = resets.reset_seed_pairs(_cards({0: 0.7, 1: 0.1, 2: 1.1}, {0: 0.2, 1: 0.2, 2: 0.2}), "m_reset", "m_keep")
    assert resets.reset_summary(noisy)["graded_difference"]["interval"][0] < 0  # mean 0.47, sd 0.5
    assert not resets.reset_summary(noisy)["seen"]
    small = resets.reset_seed_pairs(_cards({0: 0.30, 1: 0.31, 2: 0.32}, {0: 0.2, 1: 0.2, 2: 0.2}), "m_reset", "m_keep")
    assert resets.reset_summary(small)["graded_difference"]["interval"][0] > 0
    assert not resets.reset_summary(small)["seen"]  # above 0, but a mean of 0.11 < GRADED_MARGIN
    one = resets.reset_seed_pairs(_cards({0: 0.9}, {0: 0.0}), "m_reset", "m_keep")
    lone = resets.reset_summary(one)
    assert not lone["seen"] and lone["graded_difference"]["interval"] is None
    line = resets.reset_line("m_reset", "m_keep", "fam", one, lone)
    assert "one seed, so no interval" in line and "is at least the margin 0.2" in line
    assert "Caveat" not in line  # accuracies 0.9 vs 0.85: within ACCURACY_GAP
    weak = resets.reset_seed_pairs(_cards({0: 0.9}, {0: 0.0}, control_accuracy=0.2), "m_reset", "m_keep")
    assert "learned its task much less well" in resets.reset_line(
        "m_reset", "m_keep", "fam", weak, resets.reset_summary(weak)
    )
    with pytest.raises(ValueError, match="at least one seed"):
        resets.reset_summary([])


def test_control_role_says_whether_the_control_saw_separators():
    assert resets.control_role({"trained_on_separators": True}).startswith("Matched control")
    assert resets.control_role({}) == "Control: no '|' in training"  # cards written before the field


def test_a_replica_of_the_keep_control_keeps_the_cards_separator_records(tmp_path, monkeypatch, one_thread):
    """measure_replica records separator_drop on the replica's own prompts and, for a control,
    separator_control on the prompts of the model it controls (the reset task), as the card does."""
    from dataclasses import replace

    from ess_explorer.zoo import cards, measure, seeds
    from ess_explorer.zoo.specs import RESET_TASK, ZOO
    from ess_explorer.zoo.train import seed_replica_name, train_model

    def fake_drop(model, task, **kw):  # which prompts were measured
        return {"length": task.length, "stale_answer": task.stale_answer}

    monkeypatch.setattr(cards, "separator_drop", fake_drop)
    monkeypatch.setattr(cards, "TEST_SAMPLES", 8)
    monkeypatch.setattr(measure, "sweep", lambda model, task, ks, n_samples: [{"pairs": int(k)} for k in ks])
    spec = replace(ZOO["gla_k16_keep"], seed=1)
    folder = tmp_path / seed_replica_name("gla_k16_keep", 1)
    train_model(spec, folder, steps=1, log=lambda *_: None, val_samples=4)
    record = seeds.measure_replica(folder)
    assert record["replica_of"] == "gla_k16_keep" and record["training"]["seed"] == 1
    assert record["separator_drop"] == {"length": RESET_TASK.length, "stale_answer": "earlier"}
    control = record["separator_control"]
    assert control["stale_answer"] == "none" and control["control_of"] == ["gla_k16_reset"]
    assert control["trained_on_separators"] is True
    assert {"stale_accuracy", "recall_accuracy", "n_stale"} <= set(record["heldout"])
