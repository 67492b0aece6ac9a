"""The zoo's own linear-attention family, and (below) the shipped models."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ess_explorer.architectures import (
    EssLinearAttentionConfig,
    EssLinearAttentionForCausalLM,
    LinearAttentionMixer,
    linear_attention_reference,
)
from ess_explorer.core.operators import DiagonalSSM


def _random_qkv(gated: bool, length: int = 37, seed: int = 0, decay_scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, 3, length, 5, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, length, 4, generator=g, dtype=torch.float64)
    log_decay = -decay_scale * torch.rand(2, 3, length, 5, generator=g, dtype=torch.float64) if gated else None
    return q, k, v, log_decay


def _mixer(gated: bool) -> LinearAttentionMixer:
    cfg = EssLinearAttentionConfig(hidden_size=16, num_heads=3, head_dim=5, value_dim=4, gated=gated)
    return LinearAttentionMixer(cfg).double()


@pytest.mark.parametrize("gated", [False, True])
def test_mix_matches_the_recurrence(gated):
    # 37 is not a multiple of the GLA chunk length (16): exercises padding and the carried state.
    q, k, v, log_decay = _random_qkv(gated)
    out = _mixer(gated).mix(q, k, v, log_decay)
    ref = linear_attention_reference(q, k, v, log_decay)
    assert out.shape == (2, 3, 37, 4)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


def test_mix_is_the_diagonal_ssm_operator_per_value_channel():
    # T[i, j] = q_i . prod_{t=j+1..i} exp(log_decay_t) * k_j, applied to each value channel.
    q, k, v, log_decay = _random_qkv(True, length=20, seed=1)
    out = _mixer(True).mix(q, k, v, log_decay)
    ssm = DiagonalSSM(a=log_decay.exp(), b=k, c=q)  # batch (2, 3): one operator per head
    dense = ssm.materialize()  # (2, 3, L, L)
    torch.testing.assert_close(out, dense @ v, rtol=1e-10, atol=1e-10)


def test_gated_mix_is_finite_under_strong_decay_over_long_sequences():
    # Cumulative log-decay reaches about -15000: a naive q*exp(C), k*exp(-C) split overflows.
    q, k, v, log_decay = _random_qkv(True, length=300, seed=2, decay_scale=100.0)
    out = _mixer(True).mix(q.float(), k.float(), v.float(), log_decay.float())
    assert torch.isfinite(out).all()
    ref = linear_attention_reference(q, k, v, log_decay)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("gated", [False, True])
def test_save_and_reload_give_identical_logits(tmp_path, gated):
    torch.manual_seed(0)
    cfg = EssLinearAttentionConfig(vocab_size=40, hidden_size=32, num_heads=2, head_dim=8, value_dim=8, gated=gated)
    model = EssLinearAttentionForCausalLM(cfg).eval()
    with torch.no_grad():  # move away from the initialisation, so a re-initialisation on load would show
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert AutoConfig.from_pretrained(tmp_path).model_type == "ess_linear_attention"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded.model.layers[1].mixer, LinearAttentionMixer)
    assert loaded.model.layers[0].mixer.gated is gated
    ids = torch.randint(0, 40, (3, 29))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_forward_is_out_proj_of_the_mixed_heads():
    torch.manual_seed(0)
    mixer = _mixer(True)
    hidden = torch.randn(2, 11, 16, dtype=torch.float64)
    parts = mixer.project(hidden)
    assert parts["q"].shape == (2, 3, 11, 5) and parts["v"].shape == (2, 3, 11, 4)
    assert parts["log_decay"].shape == (2, 3, 11, 5) and (parts["log_decay"] <= 0).all()
    mixed = mixer.out_norm(mixer.mix(**parts)).transpose(1, 2).reshape(2, 11, 12)
    torch.testing.assert_close(mixer(hidden), mixer.out_proj(mixed))


def test_the_conv_is_causal():
    torch.manual_seed(0)
    mixer = _mixer(False)
    hidden = torch.randn(1, 12, 16, dtype=torch.float64)
    changed = hidden.clone()
    changed[:, 7:] += 1.0  # changing the future must not change the past
    torch.testing.assert_close(mixer(hidden)[:, :7], mixer(changed)[:, :7])


def test_bad_config_is_a_value_error():
    with pytest.raises(ValueError, match="head_dim"):
        EssLinearAttentionConfig(head_dim=0)


# ---- training (smoke) ---------------------------------------------------------------------


def test_a_few_training_steps_save_a_model_that_reloads_identically(tmp_path, one_thread):
    from dataclasses import replace

    from transformers import AutoTokenizer

    from ess_explorer.zoo.mqar import MQARTask
    from ess_explorer.zoo.train import ZOO, train_model

    spec = replace(ZOO["la_k16"], task=MQARTask(num_pairs=4), train_pairs=None, batch_size=8, lr=1e-2)
    record, trained = train_model(spec, tmp_path, steps=12, eval_every=6, log=lambda *_: None, val_samples=16)
    losses = [p["loss"] for p in record["training"]["curve"]]
    assert len(losses) == 2 and all(map(torch.isfinite, torch.tensor(losses)))
    assert losses[-1] < losses[0]  # 12 steps at lr 1e-2 move the loss down from ~log(123)
    for f in ("config.json", "model.safetensors", "tokenizer.json", "training.json"):
        assert (tmp_path / f).is_file(), f
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    prompt = spec.task.prompt(seed=3)
    ids = torch.tensor([tok(prompt)["input_ids"]])
    assert ids.tolist()[0] == spec.task.sample(1, seed=3).input_ids[0].tolist()
    with torch.no_grad():  # the saved model is the trained one (nothing re-initialised on load)
        torch.testing.assert_close(loaded(ids).logits, trained(ids).logits, rtol=0, atol=0)


def test_plateau_compares_the_last_fifth_of_training():
    from ess_explorer.zoo.train import plateau

    def curve(end_value):
        return [{"step": 100 * i, "val_accuracy": 0.5 if i < 10 else end_value} for i in range(1, 11)]

    flat, moving = plateau(curve(0.505)), plateau(curve(0.52))
    assert flat["plateau"] and flat["from_step"] == 800 and flat["to_step"] == 1000
    assert not moving["plateau"] and moving["change"] == pytest.approx(0.02)
    assert not plateau(curve(0.5)[:1])["plateau"]  # one point says nothing


def test_plateau_schedule_holds_the_full_rate_until_the_check_then_anneals():
    from dataclasses import replace

    from ess_explorer.zoo.train import ZOO, _lr_at, plateau_at_full_lr

    spec = replace(ZOO["la_k16"], schedule="plateau", anneal=0.2, warmup=0.1, lr=1e-3)
    steps = 1000
    assert _lr_at(50, spec, steps) == pytest.approx(1e-3 * 51 / 100)  # warmup
    assert _lr_at(700, spec, steps) == _lr_at(999, spec, steps) == 1e-3  # full rate while undecided
    assert _lr_at(400, spec, steps, anneal_from=400) == pytest.approx(1e-3)  # the anneal starts at the peak ...
    assert _lr_at(500, spec, steps, anneal_from=400) == pytest.approx(1e-3 * 0.55)  # ... half way: 0.1 + 0.45
    assert _lr_at(600, spec, steps, anneal_from=400) == pytest.approx(1e-4)  # ... and ends at 10% after 0.2 x steps

    def curve(values, every=100):
        return [{"step": every * (i + 1), "val_accuracy": v} for i, v in enumerate(values)]

    # a flat last 300 steps, all after warmup: plateau; a rise of 2 points: not; too few steps at full rate: not
    assert plateau_at_full_lr(curve([0.2, 0.5, 0.8, 0.9, 0.905, 0.9, 0.902]), since=100)
    assert not plateau_at_full_lr(curve([0.2, 0.5, 0.8, 0.88, 0.89, 0.9, 0.9]), since=100)
    assert not plateau_at_full_lr(curve([0.9, 0.9, 0.9]), since=100)


def test_a_plateau_run_anneals_after_the_check_and_records_why_it_ended(tmp_path, one_thread, monkeypatch):
    from dataclasses import replace

    from ess_explorer.zoo import train
    from ess_explorer.zoo.mqar import MQARTask

    spec = replace(
        train.ZOO["la_k16"], task=MQARTask(num_pairs=4), train_pairs=None, batch_size=4, schedule="plateau", anneal=0.25
    )
    checks = []
    monkeypatch.setattr(
        train, "plateau_at_full_lr", lambda curve, since: checks.append(curve[-1]["step"]) or len(checks) == 2
    )
    record, _ = train.train_model(spec, tmp_path, steps=40, eval_every=5, log=lambda *_: None, val_samples=4)
    tr = record["training"]
    # the check passes at the second evaluation (step 10); the anneal then takes 0.25 x 40 = 10 steps
    assert checks == [5, 10] and tr["anneal_from"] == 10 and tr["ended_by"] == "plateau"
    assert tr["steps_run"] == 20 and tr["curve"][-1]["step"] == 20
    budget, _ = train.train_model(replace(spec, schedule="cosine"), tmp_path / "b", steps=10, eval_every=5,
                                  log=lambda *_: None, val_samples=4)  # fmt: skip
    assert budget["training"]["ended_by"] == "budget" and budget["training"]["anneal_from"] is None
    with pytest.raises(ValueError, match="schedule must be one of"):
        train.train_model(replace(spec, schedule="linear"), tmp_path / "c", steps=2)


def test_main_task_models_train_on_every_k_of_the_sweep_at_one_length():
    from ess_explorer.zoo.cards import sweep_pairs
    from ess_explorer.zoo.train import ZOO

    spec = ZOO["mamba2_n16"]
    ks = [spec.task_at(step).num_pairs for step in range(6)]
    assert ks == [2, 4, 8, 16, 32, 2]
    assert {spec.task_at(step).length for step in range(5)} == {128}
    assert set(sweep_pairs(spec.task)) <= set(spec.train_pairs)
    assert [t.num_pairs for t in spec.validation_tasks()] == list(spec.train_pairs)


def test_stepwise_mamba_scan_matches_the_stock_scan(one_thread):
    from transformers.models.mamba import modeling_mamba

    from ess_explorer.zoo.train import ZooSpec, build_model, fast_mamba_training

    stock_scan = modeling_mamba.mamba_selective_scan
    spec = ZooSpec("mamba_n2", "mamba", "mamba", dict(state_size=2))
    model = build_model(spec).eval()
    ids = spec.task.sample(2, seed=0).input_ids
    with torch.no_grad():
        stock = model(ids).logits
        with fast_mamba_training():
            fast = model(ids).logits
        restored = model(ids).logits
    torch.testing.assert_close(fast, stock, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(restored, stock, rtol=0, atol=0)  # the patch is undone
    assert modeling_mamba.mamba_selective_scan is stock_scan


# ---- the shipped zoo ----------------------------------------------------------------------

import json  # noqa: E402
import math  # noqa: E402

from ess_explorer import zoo  # noqa: E402

SHIPPED = zoo.list_models()
FAMILIES = {"softmax_attention", "hybrid", "mamba2", "linear_attention", "gated_linear_attention"}


def _cards():
    return {name: zoo.card(name) for name in SHIPPED}


def test_the_zoo_has_every_family_two_state_sizes_and_the_documented_labels():
    cards = _cards()
    assert FAMILIES <= {c["family"] for c in cards.values()}
    tss = {c["ess"]["tss"] for c in cards.values() if c["family"] == "mamba2"}
    assert len(tss) >= 3, "Mamba2 is shipped at fewer than three state sizes"
    for c in cards.values():  # the label follows the documented thresholds
        u = c["ess"]["utilisation"]
        assert (c["ess"]["state"] == "saturated") == (u >= 0.9) and (c["ess"]["state"] == "collapsed") == (u <= 0.1)
    assert zoo.DEFAULT_MODEL in SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_card_has_its_learning_curve_plateau_check_and_sweep(name):
    from ess_explorer.zoo.train import plateau

    card = zoo.card(name)
    curve = card["training_curve"]
    assert curve and curve[-1]["step"] == card["training"]["steps_run"]
    assert card["training"]["plateau"] == plateau(curve)  # the recorded check is the documented one
    rows = card["sweep"]["rows"]
    assert len(rows) >= 4 and [r["pairs"] for r in rows] == sorted(r["pairs"] for r in rows)
    task = zoo.task_of(name)
    for row in rows:
        assert row["ess_per_kv"] == pytest.approx(row["ess"] / row["pairs"])
        assert row["tss_per_kv"] == pytest.approx(row["tss"] / row["pairs"])
        assert 0 <= row["ess"] <= row["tss"] + 1e-9 and row["cut"] == 2 * row["pairs"] and row["length"] == task.length
        # time aggregates of the layer totals: the claim's predictors, per kv like the single cut
        for name_ in ("ess", "entropy_ess", "tss"):
            for how in ("mean", "max"):
                assert row[f"{name_}_{how}_per_kv"] == pytest.approx(row[f"{name_}_{how}"] / row["pairs"])
            assert 0 <= row[f"{name_}_mean"] <= row[f"{name_}_max"] + 1e-9
        assert row["ess"] <= row["ess_max"] + 1e-9  # the cut t* is one of the cuts
    untrained = card["untrained"]["sweep"]
    assert [r["pairs"] for r in untrained] == [r["pairs"] for r in rows]
    assert max(r["accuracy"] for r in untrained) < 0.1  # an untrained copy answers at chance


def test_total_weights_are_under_25_mb():
    total = sum(p.stat().st_size for p in zoo.ZOO_DIR.rglob("*") if p.is_file())
    assert 0 < total < 25e6, f"assets/zoo holds {total / 1e6:.1f} MB"


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_loads_offline_and_reproduces_its_card(name, one_thread):
    folder = zoo.model_dir(name)
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "card.json", "README.md"):
        assert (folder / f).is_file(), f
    assert not list(folder.glob("*.bin")) and not list(folder.glob("*.pt"))  # no pickles
    model, tokenizer = zoo.load(name)  # its load time (target < 2 s) is in benchmarks/bench_views.py
    card = zoo.card(name)
    task = zoo.task_of(name)
    assert tokenizer(card["example_prompt"])["input_ids"] == task.sample(1, seed=30_000).input_ids[0].tolist()
    got = zoo.evaluate(name, n_samples=128)  # a different, smaller held-out sample than the card's
    p, n = card["heldout"]["accuracy"], got["n_queries"]
    # 4 standard errors, doubled for queries of one sequence being correlated, + 1% slack
    tolerance = 4 * math.sqrt(2 * p * (1 - p) / n) + 0.01
    assert abs(got["accuracy"] - p) <= tolerance, (got["accuracy"], p, tolerance)
    json.dumps(card)  # machine-readable


def test_gated_mix_gradients_match_the_recurrence():
    # training relies on backward through the chunked form (masked exponents, carried state)
    q, k, v, log_decay = (x.requires_grad_() for x in _random_qkv(True, length=21, seed=3))
    weights = torch.randn(2, 3, 21, 4, dtype=torch.float64)
    grads = torch.autograd.grad((_mixer(True).mix(q, k, v, log_decay) * weights).sum(), (q, k, v, log_decay))
    ref = torch.autograd.grad((linear_attention_reference(q, k, v, log_decay) * weights).sum(), (q, k, v, log_decay))
    for got, want in zip(grads, ref):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_shipped_weights_reproduce_one_cards_ess_and_accuracy(one_thread):
    """Re-measure from the shipped weights: the default model's held-out accuracy on the card's
    exact sample and its ESS at the memory cut (same prompts, same tolerance)."""
    from ess_explorer.zoo.measure import memory_cut

    name = zoo.DEFAULT_MODEL
    card = zoo.card(name)
    model, _ = zoo.load(name)
    got = zoo.evaluate(name, n_samples=card["heldout"]["n_samples"])
    assert got["accuracy"] == card["heldout"]["accuracy"] and got["n_queries"] == card["heldout"]["n_queries"]
    ess = memory_cut(model, zoo.task_of(name), n_prompts=card["ess"]["n_prompts"], seed=card["ess"]["seed"])
    for key in ("ess", "entropy_ess", "tss", "ess_per_kv", "utilisation", "ess_mean", "ess_max", "tss_mean"):
        assert ess[key] == pytest.approx(card["ess"][key], rel=1e-6), key


def test_a_sweep_row_reproduces_from_the_weights(one_thread):
    name = zoo.DEFAULT_MODEL
    row = zoo.sweep_difficulty(name)[0]
    fresh = zoo.sweep_difficulty(name, ks=[row["pairs"]], cached=False)[0]
    assert fresh["accuracy"] == row["accuracy"]
    assert fresh["ess"] == pytest.approx(row["ess"], rel=1e-6) and fresh["tss"] == row["tss"]


def test_reset_models_have_matched_controls():
    """The control of a reset-task model is its spec on the same prompts (the keep task draws the
    same inputs) with the same architecture, budget, learning rate and seed: only the stale answers
    differ, so '|' carries no reset for it."""
    from dataclasses import replace

    from ess_explorer.zoo.specs import RESET_CONTROLS, RESET_KEEP_TASK, RESET_TASK, ZOO

    matched = {m: c for m, c in RESET_CONTROLS.items() if ZOO[m].task == RESET_TASK}
    assert {ZOO[m].family for m in matched} >= {"mamba2", "gated_linear_attention"}
    for model, control in matched.items():
        spec = ZOO[control]
        assert spec.task == RESET_KEEP_TASK == replace(RESET_TASK, stale_answer="earlier")
        assert replace(spec, name=model, task=RESET_TASK, description="") == replace(ZOO[model], description="")


def test_learned_resets_against_their_controls():
    """Each model trained where '|' ends old bindings drops or scales its state at '|' more than its
    control (the same architecture, trained where '|' carries no reset or never appears), measured
    on the same prompts (reset-aware tolerance). One seed (the shipped models); the claim states
    the interval over seeds where replicas were trained."""
    from ess_explorer.zoo.mqar import MQARTask
    from ess_explorer.zoo.resets import ACCURACY_GAP, GRADED_MARGIN
    from ess_explorer.zoo.specs import RESET_CONTROLS

    pairs = [(m, c) for m, c in RESET_CONTROLS.items() if m in SHIPPED and c in SHIPPED]
    assert len({zoo.card(m)["family"] for m, _ in pairs}) >= 2, pairs  # two families trained on separators
    for model, control in pairs:
        drop, ctrl = zoo.card(model)["separator_drop"], zoo.card(control)["separator_control"]
        assert MQARTask.from_dict(ctrl["task"]) == zoo.task_of(model) and ctrl["separators"] == drop["separators"]
        assert ctrl["modulation"] <= 0.2, (control, ctrl["modulation"])
        # what the zoo shows instead of an emptied state (modulation >= 0.5 is not reached): a partial
        # reset, "|" scaling the whole past down further than in the control ...
        scale = min(lay["past_scale"] for lay in drop["layers"].values())
        assert scale < 0.9 * min(lay["past_scale"] for lay in ctrl["layers"].values()), (model, scale)
    # ... and by more than half in the Mamba2 models
    for model, control in pairs:
        if zoo.card(model)["family"] == "mamba2":
            scale = min(lay["past_scale"] for lay in zoo.card(model)["separator_drop"]["layers"].values())
            assert scale < 0.5, (model, scale)
    # The graded modulation (nuclear norm) sees that partial reset where the count cannot: on the reset task,
    # in two families, the trained model's drop at "|" exceeds its control's by the claim's margin, while
    # the count stays under 0.1 for both
    reset_pairs = [(m, c) for m, c in pairs if zoo.task_of(m).stale_queries]  # keeping the past costs accuracy
    assert len({zoo.card(m)["family"] for m, _ in reset_pairs}) >= 2, reset_pairs
    for model, control in reset_pairs:
        drop, ctrl = zoo.card(model)["separator_drop"], zoo.card(control)["separator_control"]
        assert drop["graded_modulation"] >= ctrl["graded_modulation"] + GRADED_MARGIN, (model, drop, ctrl)
        assert drop["modulation"] < 0.1 and ctrl["modulation"] < 0.1
    # a control that learned its task as well as its reset model keeps the past: it answers a key of an
    # earlier segment with that key's old value (the reset model answers "--")
    learned = [
        (m, c)
        for m, c in reset_pairs
        if zoo.card(c)["heldout"]["accuracy"] >= zoo.card(m)["heldout"]["accuracy"] - ACCURACY_GAP
    ]
    assert learned, reset_pairs
    for model, control in learned:
        assert zoo.card(control)["heldout"]["stale_accuracy"] >= 0.8, control
        assert zoo.card(model)["heldout"]["stale_accuracy"] >= 0.8, model


def test_learned_collapse_with_room_to_spare():
    """A model whose state is collapsed (utilisation <= 0.1) over whole prompts where the rank cap
    allows >= 0.5, while its untrained copy is not: the collapse is learned, not built in."""
    found = []
    for name in SHIPPED:
        card = zoo.card(name)
        base = card["untrained"]["utilisation"]["layers"]
        for i, lay in card["utilisation"]["layers"].items():
            if lay["utilisation"] <= 0.1 and lay["rank_cap_allows"] >= 0.5 and base[i]["utilisation"] > 0.1:
                found.append((name, i))
    assert found


def test_the_default_model_is_accurate_long_and_segmented():
    card = zoo.card(zoo.DEFAULT_MODEL)
    prompt = zoo.task_of(zoo.DEFAULT_MODEL).prompt(seed=0)  # what the explorer opens on
    assert card["heldout"]["accuracy"] >= 0.95
    assert len(prompt.split()) >= 128 and "|" in prompt.split()
