"""analyze end to end on tiny random models: ESS equals the dense core's ESS of each unit's
materialised operator, every field of the result is filled, budgets hold, bad input fails
early with a ValueError and leaves the model as it was."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))  # the tiny-model builders live in test_adapters.py

import numpy as np
import pytest
import torch
import transformers as tf
from test_adapters import CONFIGS, IDS, LENGTH, REFUSED_CONFIG, VOCAB, build

from ess_explorer import entropy_ess, hankel_singular_values, tolerance_ess
from ess_explorer.analysis import analyze
from ess_explorer.capture import capture, layer_slots
from ess_explorer.core.gates import gates_inside
from ess_explorer.core.operators import DiagonalSSM
from ess_explorer.result import ESSResult

TOL = 1e-3


def _captured(model, ids, layer, gates="inside"):
    """One layer's capture under the gate policy analyze uses (core/gates.py)."""
    units = capture(model, ids, layer_slots(model))[layer]
    return gates_inside(units) if gates == "inside" else units


def _dense_reference(model, ids, layer, unit, relative=True, gates="inside"):
    """ESS of one unit from its materialised T by the dense core (one SVD per cut)."""
    op = _captured(model, ids, layer, gates).dense([unit])[0]
    sigma = hankel_singular_values(op, method="svd")
    return sigma, tolerance_ess(spectra=sigma, tol=TOL, relative=relative), entropy_ess(spectra=sigma)


@pytest.mark.parametrize(
    "name, layer, unit, gates",
    [
        ("gpt2", 1, 2, "inside"),
        ("mistral", 0, 3, "inside"),
        ("mamba", 1, 5, "inside"),
        ("mamba", 1, 5, "outside"),
        ("mamba2", 0, 1, "inside"),
        ("mamba2", 0, 1, "outside"),
        ("lfm2", 0, 7, "inside"),
        ("lfm2", 1, 0, "inside"),
        ("gla", 1, 1, "inside"),
        ("gla", 1, 1, "outside"),
        ("la", 0, 0, "inside"),
        ("qwen3_next", 1, 3, "inside"),  # gated attention: a head's channels share one SVD per cut
    ],
)
def test_ess_equals_dense_core_of_the_materialised_operator(name, layer, unit, gates):
    model, ids = build(name)
    result = analyze(model, ids, layers=[layer], progress=False, tol=TOL, gates=gates)
    assert result.meta["gates"] == gates
    lay = result.layers[layer]
    sigma, expected_tol, expected_ent = _dense_reference(model, ids, layer, unit, gates=gates)
    np.testing.assert_array_equal(lay.tolerance_ess[unit], expected_tol.numpy())
    np.testing.assert_allclose(lay.entropy_ess[unit], expected_ent.numpy(), rtol=1e-6, atol=1e-9)
    k = lay.singular_values.shape[-1]
    assert k >= 1
    # same values, to 1e-8 of each cut's largest (factored or windowed path against one SVD per cut)
    error = np.abs(lay.singular_values[unit] - sigma[:, :k].numpy())
    assert np.all(error <= 1e-8 * sigma[:, :1].numpy() + 1e-12)


def test_result_fields_and_tss_per_family():
    expectations = {  # family -> TSS at t for this tiny model
        "gpt2": lambda t, cfg: t,
        "mistral": lambda t, cfg: np.minimum(t, cfg.sliding_window - 1),
        "mamba": lambda t, cfg: np.full_like(t, cfg.state_size),
        "mamba2": lambda t, cfg: np.full_like(t, cfg.state_size),
        "gla": lambda t, cfg: np.full_like(t, cfg.head_dim),
    }
    for name, tss in expectations.items():
        model, ids = build(name)
        result = analyze(model, ids, progress=False)
        assert result.input_ids == ids[0].tolist() and len(result.tokens) == LENGTH
        assert sorted(result.layers) == [0, 1]
        for index, lay in result.layers.items():
            t = np.arange(LENGTH)
            units = lay.n_units
            assert lay.layer == index
            assert (
                lay.tolerance_ess.shape
                == lay.entropy_ess.shape
                == lay.tss.shape
                == lay.rank_bound.shape
                == (units, LENGTH)
            )
            np.testing.assert_array_equal(lay.positions, t)
            np.testing.assert_array_equal(lay.tss[0], tss(t, CONFIGS[name]).astype(float))
            assert (lay.tolerance_ess <= lay.rank_bound).all()
            assert (lay.tolerance_ess[:, 0] == 0).all() and (lay.entropy_ess[:, 0] == 0).all()
            # gates inside (default): Mamba2's per-channel gates make each head channel a unit
            assert lay.unit_kind == ("channel" if lay.family in ("mamba", "mamba2") else "head")
        for key in ("model_id", "revision", "dtype", "device", "tol", "relative", "stride", "transformers", "top_k"):
            assert key in result.meta
        assert result.meta["transformers"] == tf.__version__ and result.meta["dtype"] == "float32"


def test_windowed_attention_rank_is_bounded_by_the_window():
    model, ids = build("mistral")
    lay = analyze(model, ids, layers=0, progress=False).layers[0]
    window = CONFIGS["mistral"].sliding_window
    assert lay.tolerance_ess.max() <= window - 1
    assert lay.tolerance_ess.max() == window - 1  # reached in the interior for random weights


def test_stride_computes_the_same_cuts():
    model, ids = build("mamba")
    full = analyze(model, ids, layers=[0], progress=False).layers[0]
    strided = analyze(model, ids, layers=[0], progress=False, stride=4).layers[0]
    np.testing.assert_array_equal(strided.positions, np.arange(0, LENGTH, 4))
    np.testing.assert_array_equal(strided.tolerance_ess, full.tolerance_ess[:, ::4])
    np.testing.assert_allclose(strided.entropy_ess, full.entropy_ess[:, ::4], rtol=1e-9)


@pytest.mark.parametrize("name", ["mamba", "gpt2"])
def test_no_causal_skips_the_reachability_and_keeps_the_rest(name, monkeypatch):
    """causal=False leaves causal ESS NaN (also attention's free structural count) and
    never asks for the reachability spectra; every other field is the full run's."""
    from ess_explorer.core.units import CapturedLayer, SSMCapture

    model, ids = build(name)
    full = analyze(model, ids, layers=[0], progress=False)
    for cls in (CapturedLayer, SSMCapture):
        monkeypatch.setattr(cls, "spectra_and_causal", lambda *a, **k: pytest.fail("causal spectra asked for"))
        monkeypatch.setattr(cls, "causal_spectra", lambda *a, **k: pytest.fail("causal spectra asked for"))
    skipped = analyze(model, ids, layers=[0], progress=False, causal=False)
    assert full.meta["causal"] is True and skipped.meta["causal"] is False
    assert np.isfinite(full.layers[0].causal_ess).all() and np.isnan(skipped.layers[0].causal_ess).all()
    np.testing.assert_array_equal(skipped.layers[0].tolerance_ess, full.layers[0].tolerance_ess)
    np.testing.assert_array_equal(skipped.layers[0].entropy_ess, full.layers[0].entropy_ess)
    np.testing.assert_array_equal(skipped.layers[0].singular_values, full.layers[0].singular_values)


def test_top_k_cuts_stored_values_not_the_ess():
    model, ids = build("gpt2")
    full = analyze(model, ids, layers=[0], progress=False).layers[0]
    cut = analyze(model, ids, layers=[0], progress=False, top_k=2).layers[0]
    assert cut.singular_values.shape[-1] == 2
    np.testing.assert_array_equal(cut.tolerance_ess, full.tolerance_ess)
    assert cut.tolerance_ess.max() > 2
    assert not cut.spectra_complete.all()


def test_operator_budget_and_mamba_never_dense_for_all_channels(monkeypatch):
    sizes = []
    original = DiagonalSSM.materialize

    def counting(self):
        sizes.append(int(np.prod(self.batch_shape)))
        return original(self)

    monkeypatch.setattr(DiagonalSSM, "materialize", counting)
    model, ids = build("mamba")
    result = analyze(model, ids, progress=False)
    channels = model.config.intermediate_size
    for lay in result.layers.values():
        assert lay.n_units == channels and sorted(lay.operators) == [0, 1, 2, 3]
    assert sizes == [4, 4]  # the 4 kept channels of each layer in one call, never all channels
    reference = _captured(model, ids, 1).dense([2])[0]
    np.testing.assert_allclose(result.layers[1].operators[2], reference.numpy(), rtol=1e-6, atol=1e-7)
    heads = analyze(model=build("gpt2")[0], input_ids=ids, progress=False, layers=0).layers[0]
    assert sorted(heads.operators) == [0, 1, 2, 3]  # all heads of a small layer
    none = analyze(model, ids, progress=False, layers=0, keep_operators=None).layers[0]
    assert none.operators == {}
    # a Mamba2 head split into its channels by the gate policy keeps operators as a channel
    # family does (a few), not as a head family (all of them)
    model2, ids2 = build("mamba2")
    split = analyze(model2, ids2, progress=False, layers=0, gates="inside").layers[0]
    whole = analyze(model2, ids2, progress=False, layers=0, gates="outside").layers[0]
    assert split.unit_kind == "channel" and sorted(split.operators) == [0, 1, 2, 3] and split.n_units > 4
    assert whole.unit_kind == "head" and sorted(whole.operators) == list(range(whole.n_units))


def test_channels_split_by_the_gate_share_their_heads_reachability(monkeypatch):
    """With gates inside, a Mamba2 head's channels differ in c only (core/gates.py): causal
    ESS sweeps each head's reachability once for all its requested channels, and every
    channel gets the values of its own sweep; the Hankel spectra are unchanged."""
    import ess_explorer.core.units as units_module
    from ess_explorer.core.causal import reachability_singular_values

    model, ids = build("mamba2")
    outside, inside = _captured(model, ids, 0, "outside"), _captured(model, ids, 0, "inside")
    channels = inside.n_units // outside.n_units
    picked = [1, channels + 1, channels + 2, 3, 2 * channels]  # heads 0, 1, 1, 0, 2
    positions = torch.arange(LENGTH)
    swept = []

    def counting(ssm, *args, **kwargs):
        swept.append(int(np.prod(ssm.batch_shape)))
        return reachability_singular_values(ssm, *args, **kwargs)

    monkeypatch.setattr(units_module, "reachability_singular_values", counting)
    sigma, shared = inside.spectra_and_causal(picked, positions)
    assert swept == [3]  # one sweep, one unit per head
    assert shared.values.shape[0] == 3  # and one row per head, not copied to each channel
    reach = shared.per_unit()
    own = torch.cat([reachability_singular_values(inside.ssm([unit]), positions) for unit in picked])
    torch.testing.assert_close(reach, own, rtol=1e-12, atol=0)
    torch.testing.assert_close(reach, outside.causal_spectra([0, 1, 1, 0, 2], positions), rtol=1e-12, atol=0)
    assert reach[:, -1, 0].min() > 0  # a real spectrum, not zeros
    torch.testing.assert_close(sigma, inside.spectra(picked, positions), rtol=1e-12, atol=0)
    # where the factored path is the scan (a GPU), the owners' reachability comes from its roots
    monkeypatch.setattr(
        type(inside), "spectra_path", lambda self, positions, device=None, accuracy=None: {"method": "scan"}
    )
    swept.clear()
    torch.testing.assert_close(inside.causal_spectra(picked, positions), own, rtol=1e-9, atol=1e-12)
    assert swept == []  # no per-step reachability sweep on that route


def test_on_chunk_reports_each_chunk_of_units_and_can_stop_the_layer(monkeypatch):
    """core/layer.py calls on_chunk(done, units) after each chunk of units; raising from it
    stops the layer there (the explorer's cancel), before the remaining chunks are computed."""
    import ess_explorer.core.layer as layer_module
    from ess_explorer.result import LayerESS

    model, ids = build("mamba")
    layer = _captured(model, ids, 0)
    monkeypatch.setattr(layer_module, "UNIT_CHUNK_VALUES", 3 * LENGTH * layer.state_size)  # 3 units a chunk
    reports = []
    LayerESS.from_units(layer, tol=TOL, relative=True, on_chunk=lambda done, units: reports.append((done, units)))
    units = layer.n_units
    assert reports == [(min(done, units), units) for done in range(3, units + 3, 3)]

    computed = []
    original = type(layer).spectra_and_causal
    monkeypatch.setattr(
        type(layer), "spectra_and_causal", lambda self, *a, **k: computed.append(1) or original(self, *a, **k)
    )

    def stop(done, units):
        if done >= 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        LayerESS.from_units(layer, tol=TOL, relative=True, on_chunk=stop)
    assert len(computed) == 2 < -(-units // 3)


def test_units_selects_rows():
    model, ids = build("mamba")
    full = analyze(model, ids, layers=[0], progress=False).layers[0]
    some = analyze(model, ids, layers=[0], progress=False, units=[5, 2])
    np.testing.assert_array_equal(some.layers[0].tolerance_ess, full.tolerance_ess[[5, 2]])
    assert some.meta["units"] == [5, 2]
    with pytest.raises(ValueError, match="out of range"):
        analyze(model, ids, layers=[0], progress=False, units=[10_000])


def test_sdpa_model_is_switched_to_eager_and_back():
    config = tf.GPT2Config(n_layer=1, n_head=4, n_embd=32, n_positions=64, **IDS)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    ids = torch.randint(1, VOCAB, (1, LENGTH))
    lay = analyze(model, ids, progress=False).layers[0]
    assert model.config._attn_implementation == "sdpa"
    assert lay.tolerance_ess.max() > 1  # real attention, not an empty one


def test_prompt_with_tokenizer():
    tokenizer = tf.ByT5Tokenizer()
    config = tf.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, n_positions=64, vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=1
    )
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    result = analyze(model, prompt="a=1; b=2", tokenizer=tokenizer, progress=False)
    assert "".join(result.tokens) == "a=1; b=2"
    assert result.input_ids == [ord(ch) + 3 for ch in "a=1; b=2"]
    in_place_of_ids = analyze(model, "a=1; b=2", tokenizer=tokenizer, progress=False)  # the text as the prompt
    assert in_place_of_ids.input_ids == result.input_ids


def test_a_chat_is_formatted_by_the_template_and_its_turn_ends_are_the_separators():
    tokenizer = tf.ByT5Tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    config = tf.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, n_positions=128, vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=1
    )
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    chat = [
        {"role": "user", "content": "key 3?"},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "and 4?"},
    ]
    result = analyze(model, chat=chat, tokenizer=tokenizer, progress=False)
    text = "user: key 3?</s>assistant: 7</s>user: and 4?</s>"
    assert result.meta["prompt"] == text and result.meta["chat"] == chat
    ends = result.meta["separators"]
    assert len(ends) == 3 and ends[-1] == result.length - 1
    assert [result.input_ids[t] for t in ends] == [tokenizer.eos_token_id] * 3
    assert "".join(result.tokens[: ends[0]]) == "user: key 3?"
    from ess_explorer.views.data import separator_positions

    assert separator_positions(result) == ends  # the diagnostics' modulation reads these
    explicit = analyze(model, chat=chat, tokenizer=tokenizer, separators=[5], progress=False, layers=[0])
    assert explicit.meta["separators"] == [5]
    with pytest.raises(ValueError, match="exactly one of"):
        analyze(model, chat=chat, prompt="x", tokenizer=tokenizer, progress=False)
    with pytest.raises(ValueError, match="role"):
        analyze(model, chat=[{"role": "user"}], tokenizer=tokenizer, progress=False)
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        analyze(model, chat=chat, tokenizer=tokenizer, progress=False)
    with pytest.raises(ValueError, match="separators must lie"):
        analyze(model, prompt="abc", tokenizer=tokenizer, separators=[9], progress=False)


def test_result_saves_and_loads(tmp_path):
    model, ids = build("lfm2")
    result = analyze(model, ids, progress=False)
    loaded = ESSResult.load(result.save(tmp_path / "r.npz"))
    assert loaded.meta == result.meta and loaded.input_ids == result.input_ids
    for index, lay in result.layers.items():
        np.testing.assert_array_equal(loaded.layers[index].singular_values, lay.singular_values.astype(np.float32))
        assert loaded.layers[index].family == lay.family


def _untouched(model):
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(input_ids=[]), "at least 2"),
        (dict(input_ids=[5]), "at least 2"),
        (dict(input_ids=list(range(1, 60)) + [VOCAB]), r"token ids must lie in \[0, 63\]"),
        (dict(input_ids=[-1, 3, 4]), "token ids"),
        (dict(input_ids=[1] * 65), "more than the model's context of 64"),
        (dict(input_ids=[1, 2, 3], layers=[2]), r"layer index 2 is out of range: the model has layers 0..1"),
        (dict(input_ids=[1, 2, 3], layers=-1), "out of range"),
        (dict(input_ids=torch.ones(2, 5, dtype=torch.long)), "batch 1"),
        (dict(), "exactly one of input_ids or prompt"),
        (dict(input_ids=[1, 2], prompt="x"), "exactly one"),
        (dict(prompt="x"), "needs tokenizer"),
        (dict(input_ids="x y"), r"input_ids is text: pass the prompt with its tokenizer"),
        (dict(input_ids="x y", prompt="x y", tokenizer=tf.ByT5Tokenizer()), "pass the prompt once"),
        (dict(input_ids=[1, 2, 3], stride=0), "stride"),
        (dict(input_ids=[1, 2, 3], top_k=0), "top_k"),
        (dict(input_ids=[1, 2, 3], tol=-1.0), "tol"),
        (dict(input_ids=[1, 2, 3], keep_operators="all"), "keep_operators"),
        (dict(input_ids=[1, 2, 3], causal="no"), "causal must be True or False"),
    ],
)
def test_bad_input_is_a_clear_value_error(kwargs, match):
    model, _ = build("gpt2")
    implementation = model.config._attn_implementation
    with pytest.raises(ValueError, match=match):
        analyze(model, progress=False, **kwargs)
    assert _untouched(model) and model.config._attn_implementation == implementation


def test_empty_prompt_string():
    model, _ = build("gpt2")
    with pytest.raises(ValueError, match="empty"):
        analyze(model, prompt="", tokenizer=tf.ByT5Tokenizer(), progress=False)


def test_unsupported_model_is_refused_before_any_work():
    model = tf.AutoModelForCausalLM.from_config(REFUSED_CONFIG)
    with pytest.raises(ValueError, match="not supported"):
        analyze(model, [1, 2, 3], progress=False)
    assert _untouched(model)


@pytest.mark.parametrize("name", ["gpt2", "mamba2"])
def test_a_forward_pass_that_overflows_is_a_clear_value_error(name):
    # weights scaled to extremes make the model's own output NaN; before, the NaN reached a
    # solver and surfaced as a LinAlgError from inside the engine
    model, ids = build(name)
    weight = next(p for n, p in model.named_parameters() if n.endswith("weight") and p.ndim == 2 and "embed" not in n)
    kept = weight.detach().clone()
    with torch.no_grad():
        weight.fill_(float("inf"))
    with pytest.raises(ValueError, match=r"layer 0: the model's forward pass on this prompt produced NaN or infinite"):
        analyze(model, ids, progress=False)
    assert _untouched(model)
    with torch.no_grad():
        weight.copy_(kept)
    assert bool(np.isfinite(analyze(model, ids, progress=False).layers[0].entropy_ess).all())
