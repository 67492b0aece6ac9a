"""What the softmax-attention decoder LMs of tests/test_families.py (ATTENTION_CONFIGS: OPT,
GPT-NeoX / Pythia, BLOOM, GPT-Neo, Gemma, OLMo, Mixtral, GPT-OSS, DeepSeek, ...) need beyond
reconstruction: each layer's window follows its config, each head's T is a row of
probabilities (less the sink's share where the model has sinks), fused projections give
each head its own values, and latent attention counts its compressed cache.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from test_families import (
    ATTENTION_CONFIGS,
    CONFIGS,
    LENGTH,
    SPARSE_TOP,
    WINDOW,
    assert_reconstructs,
    build,
    tiny_model,
)

from ess_explorer import analyze
from ess_explorer.capture import capture, layer_slots
from ess_explorer.core.gates import gates_inside

# Layers whose T is windowed (i - j >= WINDOW masked); every other layer sees all j <= i.
WINDOWED = {
    "mixtral": [0, 1],  # config.sliding_window masks every layer
    "starcoder2": [0, 1],
    "ministral": [0],  # config.layer_types: "sliding_attention", "full_attention"
    "cohere2": [0],
    "olmo3": [0],
    "vaultgemma": [0],
    "exaone4": [0],
    "gpt_oss": [0],
    "cwm": [0],
    "cohere2_moe": [0],
    "exaone_moe": [0],
    "kolibri1": [0],
    "mellum": [0],
    "flint": [0],
    "afmoe": [0],
    "ministral3": [0, 1],
    "mimo_v2_flash": [0],
    "dots1": [0],
    "mistral3": [0, 1],
    "idefics2": [0, 1],  # Mistral's window
    "step3p7": [0],
    "muse_glimmer": [0],
    "muse_spark": [0],
    "zaya": [0],  # "hybrid_sliding"
    "inkling_text": [0],
    "inkling_mm_model": [0],
    **dict.fromkeys(("inkling2_text", "inkling2"), [0]),
    **dict.fromkeys(("inkling2_loop_text", "inkling2_loop"), [0, 1, 3, 5]),  # layers 0, 1 (each pass), 3
    "ergo": [0],
    "cohere_compass_text": [0],
    "cohere_compass": [0],
    "qwen2_5_omni_thinker": [0],  # Qwen2's windows
    "qwen2_audio": [0],  # Qwen2's windows
    "kolibri1_1": [0],
    **dict.fromkeys(("dots3_note_text", "dots3_note"), [0]),
    **dict.fromkeys(("laguna", "laguna_per_element", "beam"), [0]),
    "dory": [0, 3],  # keys: layer 0, layer 1 in loops 0 and 1, layer 2
    "aya_vision": [0],
    "cohere2_vision": [0],
    "gpt_neo": [1],  # config.attention_layers: "global", "local"
    "modernbert-decoder": [0],
}
SINKS = {"gpt_oss": [0, 1], "flint": [0, 1], "mimo_v2_flash": [0]}  # layers with a learned sink
SINKS.update(dict.fromkeys(("hy_v4", "hy_v4_vl"), [0, 1]))
SINKS.update(dict.fromkeys(("inkling2_text", "inkling2"), [0, 1]))  # a sink logit per head and token
SINKS.update(dict.fromkeys(("inkling2_loop_text", "inkling2_loop"), range(6)))
# Layers that attend only to the keys their indexer selects: at most SPARSE_TOP per query.
SPARSE = {"deepseek_v32": [0, 1], "glm_moe_dsa": [0, 1], "minimax_m3_vl_text": [0], "doge": [0, 1], "axk2": [0, 1]}
SPARSE.update(dict.fromkeys(("dots3_note_text", "dots3_note"), [1]))
SPARSE["mistral_large4"] = [0, 1]  # its second layer reuses the first's selection
SPARSE["kolibri1_1"] = [1, 2]
SPARSE.update(dict.fromkeys(("hy_v4", "hy_v4_vl"), [0, 1]))  # layer 1 with the keys layer 0's indexer selected


@pytest.mark.parametrize("name", sorted(ATTENTION_CONFIGS))
def test_each_layer_is_windowed_where_its_config_says_and_its_rows_are_probabilities(name):
    model, ids = build(name)
    layers = capture(model, ids, layer_slots(model))
    i, j = torch.tril_indices(LENGTH, LENGTH)
    far = (i - j) >= WINDOW
    for index, layer in layers.items():
        op = layer.dense(range(layer.n_units))
        rows = op.sum(-1)
        if index in SINKS.get(name, []):  # the sink takes its share of each row's weight
            assert torch.all(rows < 1 - 1e-3), name
        else:
            torch.testing.assert_close(rows, torch.ones_like(rows), msg=name)
        tss = layer.tss(np.arange(LENGTH))
        if index in WINDOWED.get(name, []):
            assert layer.window == WINDOW, f"{name} layer {index}"
            assert torch.all(op[:, i[far], j[far]] == 0) and torch.all(op[:, i[~far], j[~far]] > 0), name
            np.testing.assert_array_equal(tss, np.minimum(np.arange(LENGTH), WINDOW - 1))
        else:
            assert layer.window is None, f"{name} layer {index}"
            np.testing.assert_array_equal(tss, np.arange(LENGTH))
            if index in SPARSE.get(name, []):
                kept = (op > 0).sum(-1)
                assert kept.max() == SPARSE_TOP and torch.all(kept <= SPARSE_TOP), f"{name} layer {index}"
            else:
                assert torch.all(op[:, i, j] > 0), f"{name} layer {index}: a mask the config does not name"


def test_fused_projections_give_each_head_its_own_values():
    """GPT-NeoX (and GPT-NeoX Japanese), BLOOM, Persimmon and multi-head GPT-BigCode interleave
    [q | k | v] per head in one projection, CodeGen [q | v | k] per model-parallel shard;
    multi-query GPT-BigCode puts one k and one v head after every query: the values the adapter
    reads must be the model's own, head by head (a wrong split would still have the right shape)."""
    cases = (
        ("gpt_neox", 4),
        ("gpt_neox_japanese", 4),
        ("bloom", 4),
        ("codegen", 4),
        ("gpt_bigcode", 1),
        ("gpt_bigcode_heads", 4),
    )
    for name, kv_heads in cases:
        model, ids = build(name)
        layer = capture(model, ids, layer_slots(model))[0]
        assert layer.info["num_key_value_heads"] == kv_heads, name
        heads = layer.inputs.shape[0]
        if kv_heads == heads:
            assert not torch.allclose(layer.inputs[0], layer.inputs[1]), name
        else:
            assert all(torch.equal(layer.inputs[0], layer.inputs[h]) for h in range(heads)), name


def test_gemma4_shared_layers_read_the_values_of_the_layer_whose_cache_they_share():
    """Gemma 4's (and Gemma 3n's) last layers make no K or V: each reads the cache of the last
    earlier layer of its type (here 2 <- 0, sliding, and 3 <- 1, full attention; Gemma 4's full
    layers have their keys as values)."""
    for name in ("gemma4_text", "gemma4", "gemma4_unified_text", "gemma4_unified", "gemma3n_text"):
        model, ids = build(name)
        layers = capture(model, ids, layer_slots(model))
        assert [layers[i].info["kv_shared"] for i in range(4)] == [False, False, True, True]
        assert [layers[i].window for i in range(4)] == [WINDOW, None, WINDOW, None]
        if name != "gemma3n_text":  # Gemma 4's full-attention layers: a wider head, one KV head
            assert layers[1].info["head_dim"] == 16 and layers[1].info["num_key_value_heads"] == 1
        for reader, owner in ((2, 0), (3, 1)):
            assert torch.equal(layers[reader].inputs, layers[owner].inputs), name
            assert not torch.allclose(layers[reader].dense([0])[0], layers[owner].dense([0])[0]), name


def test_latent_attention_counts_its_compressed_cache():
    """DeepSeek's MLA caches the latent and one rotary key per token, not K and V per head."""
    latent = ("deepseek_v2", "deepseek_v3", "glm4_moe_lite", "minicpm3", "youtu", "sarvam_mla", "axk1")
    for name in (*latent, "deepseek_v32", "axk2"):
        model, ids = build(name)
        layer = capture(model, ids, layer_slots(model))[0]
        config = model.config
        indexer_key = config.index_head_dim if name in ("deepseek_v32", "axk2") else 0
        assert layer.info["state_scalars_per_tss"] == config.kv_lora_rank + config.qk_rope_head_dim + indexer_key
        assert layer.inputs.shape[-1] == config.v_head_dim
        if name == "axk2":  # its sigmoid output gate, per head and value channel, stays outside T
            assert layer.out_gate.shape == layer.inputs.shape and torch.all((layer.out_gate > 0) & (layer.out_gate < 1))


def test_dots3_note_reads_each_layers_own_latent_sizes_and_gates_each_head_once():
    """Dots 3 Note's windowed layers have latent heads of their own sizes (its "swa_" config);
    each layer's values, cache and per-head sigmoid gate (g_proj) follow its own module."""
    model, ids = build("dots3_note_text")
    layers = capture(model, ids, layer_slots(model))
    assert layers[0].inputs.shape[-1] != layers[1].inputs.shape[-1]  # the two kinds differ here
    for index, indexer_key in ((0, 0), (1, model.config.index_head_dim)):
        module, layer = model.model.layers[index].self_attn, layers[index]
        assert layer.inputs.shape[-1] == module.v_head_dim
        assert layer.info["state_scalars_per_tss"] == module.kv_lora_rank + module.qk_rope_head_dim + indexer_key
        gate = layer.out_gate  # (H, L, v_head_dim): one sigmoid per head and token
        assert torch.equal(gate, gate[..., :1].expand_as(gate)) and torch.all((gate > 0) & (gate < 1))


@pytest.mark.parametrize("name", ["hy_v4", "hy_v4_vl"])
def test_hy_v4_shared_layer_attends_to_the_keys_the_earlier_indexer_selected(name):
    """HY V4's "shared" layer 1 has no indexer: it reuses layer 0's top-k selection, folded into its
    own mask, so its T keeps exactly layer 0's keys, and only layer 0's cache holds an indexer key.
    Each head's sigmoid gate (gate_proj), per value channel, is the out_gate: T with the gate
    inside reproduces the output too."""
    model, ids = build(name)
    layers = capture(model, ids, layer_slots(model))
    selected = [layers[index].dense(range(layers[index].n_units)) > 0 for index in (0, 1)]
    recent = torch.tril(torch.ones(LENGTH, LENGTH, dtype=torch.bool)).triu(-(SPARSE_TOP - 1))
    assert not torch.equal(selected[0][0], recent)  # the indexer chose, not a window
    assert torch.equal(selected[1], selected[0])
    config = model.config.get_text_config()
    latent = config.kv_lora_rank + config.qk_rope_head_dim
    assert [layers[index].info["state_scalars_per_tss"] for index in (0, 1)] == [latent + config.index_head_dim, latent]
    for layer in layers.values():
        gate = layer.out_gate  # (H, L, v_head_dim)
        assert gate.shape == layer.inputs.shape and torch.all((gate > 0) & (gate < 1))
        assert not torch.equal(gate, gate[..., :1].expand_as(gate))  # one per channel, not per head
    assert_reconstructs(name, {index: gates_inside(layer) for index, layer in layers.items()})


def test_gemma4_attending_both_ways_is_refused_before_the_forward_pass():
    """A bidirectional Gemma 4 has no causal T: the capture says so instead of measuring it."""
    config = CONFIGS["gemma4_text"].__class__.from_dict(
        {**CONFIGS["gemma4_text"].to_dict(), "use_bidirectional_attention": "all"}
    )
    model, ids = tiny_model(config, 0)
    calls = []
    model.model.embed_tokens.register_forward_hook(lambda *_: calls.append(1))
    with pytest.raises(ValueError, match="attends in both directions"):
        capture(model, ids, layer_slots(model))
    assert not calls, "the model ran before the refusal"


def test_values_narrower_than_keys_are_read_at_their_own_width_and_scale():
    """MiMo-V2-Flash: v_head_dim 8 against head_dim 12, V scaled by attention_value_scale after
    v_proj (the reconstruction fails without the scale); its windowed layers double the KV heads."""
    model, ids = build("mimo_v2_flash")
    layers = capture(model, ids, layer_slots(model))
    for index, kv_heads in ((0, 4), (1, 2)):
        layer = layers[index]
        assert layer.inputs.shape[-1] == 8 and layer.info["num_key_value_heads"] == kv_heads
        assert layer.info["state_scalars_per_tss"] == kv_heads * (12 + 8)


@pytest.mark.parametrize("name", ["inkling2_text", "inkling2"])
def test_inkling2_values_after_its_conv_and_norm_and_its_gate_inside_o_proj(name):
    """Inkling 2's v_proj returns V heads first, after a short conv and a norm per head; its o_proj
    gates each channel by sigmoid(gate_proj(x)) before its linear. The gate is the unit's out_gate,
    and T with it outside or folded in reproduces what o_proj's linear received."""
    from ess_explorer.core.gates import gates_inside

    model, ids = build(name)
    for layer in capture(model, ids, layer_slots(model)).values():
        gate = layer.out_gate  # (H, L, head_dim): one sigmoid per head, token and channel
        assert gate.shape == layer.inputs.shape and torch.all((gate > 0) & (gate < 1))
        assert not torch.equal(gate, gate[..., :1].expand_as(gate))
        rms = layer.inputs.pow(2).mean(-1)  # the unweighted norm per head leaves rms 1 per token
        torch.testing.assert_close(rms, torch.ones_like(rms), rtol=1e-2, atol=1e-2)  # less its eps
        for captured in (layer, gates_inside(layer)):
            predicted, observed = captured.reconstruct()
            scale = observed.abs().max().item()
            torch.testing.assert_close(predicted, observed, rtol=1e-4, atol=1e-4 * scale)
        predicted, observed = layer.reconstruct()
        assert (predicted / gate - observed).abs().max() > 1e-2 * observed.abs().max(), "the gate is live"


def test_step3p7_gates_each_head_by_one_number_per_token():
    """Step 3.7's g_proj makes one sigmoid gate per head and token (config.gating): the unit's
    out_gate, the same for all of a head's value channels, and the operator stays T alone."""
    model, ids = build("step3p7")
    for layer in capture(model, ids, layer_slots(model)).values():
        gate = layer.out_gate  # (H, L, head_dim)
        assert gate.shape == layer.inputs.shape and torch.all((gate > 0) & (gate < 1))
        assert torch.equal(gate, gate[..., :1].expand_as(gate))


@pytest.mark.parametrize("name", ["laguna", "laguna_per_element", "beam", "dory", "bitnet"])
def test_afmoe_like_gates_reconstruct_outside_and_inside_t(name):
    """Laguna's softplus gate (per head or per channel), Beam's gate bias, Dory's gate scale and
    the L2 norm over its heads, BitNet's weighted RMS norm over its heads: each layer's output
    (before a norm's weight) is out_gate * (T v), and T' = diag(g) T alone gives it with the gate
    inside; without the gate it would not."""
    from ess_explorer.core.gates import gates_inside

    model, ids = build(name)
    for index, layer in capture(model, ids, layer_slots(model)).items():
        inside = gates_inside(layer)
        assert inside.out_gate is None
        for captured in (inside, layer):  # the gate inside T, then outside it
            predicted, observed = captured.reconstruct()
            scale = observed.abs().max().item()
            assert scale > 1e-6, "the mixer output is all zero: the check would prove nothing"
            torch.testing.assert_close(predicted, observed, rtol=1e-4, atol=1e-4 * scale, msg=f"{name} layer {index}")
        ungated = torch.einsum("hij,hjc->hic", layer.dense(range(layer.n_units)), layer.inputs.to(torch.float64))
        assert (ungated - observed).abs().max() > 1e-2 * scale, f"{name} layer {index}: the gate changes nothing"
        gate = layer.out_gate  # (H, L, head_dim)
        per_head = torch.equal(gate, gate[..., :1].expand_as(gate))
        # config.gating; BitNet's norm scales every channel of a token alike; the others per channel
        assert per_head == (name in ("laguna", "bitnet")), f"{name} layer {index}"
        assert torch.all(gate > 0)


def test_laguna_layers_have_their_own_number_of_heads_over_the_shared_kv_heads():
    """config.num_attention_heads_per_layer: 4 query heads in layer 0, 6 in layer 1, each its own
    T over the 2 KV heads, whose cache alone is the layer's state."""
    model, ids = build("laguna")
    layers = capture(model, ids, layer_slots(model))
    assert [layers[i].n_units for i in (0, 1)] == model.config.num_attention_heads_per_layer == [4, 6]
    for layer in layers.values():
        assert layer.info["num_key_value_heads"] == 2 and layer.info["state_scalars_per_tss"] == 2 * (8 + 8)


def test_dory_analyses_its_looped_layer_once_per_loop():
    """Dory runs layer 1 in each of its two loops, on a different input: two operators, two slots
    keyed in the order they run, labelled; either call alone is the same as in the whole pass."""
    model, ids = build("dory")
    result = analyze(model, ids, progress=False)
    assert result.meta["slots"] == {"0": "layer 0", "1": "layer 1 pass 0", "2": "layer 1 pass 1", "3": "layer 2"}
    first, second = result.layers[1].operators, result.layers[2].operators
    assert np.abs(first[0] - second[0]).max() > 1e-3
    for key, operators in ((1, first), (2, second)):
        alone = analyze(model, ids, layers=[key], progress=False)
        np.testing.assert_allclose(alone.layers[key].operators[0], operators[0])
    layers = capture(model, ids, layer_slots(model))
    assert [layers[key].window for key in range(4)] == [WINDOW, None, None, WINDOW]
    assert not torch.equal(layers[1].inputs, layers[2].inputs)
