"""Reconstruction proofs for today's model families: the materialised T of every unit,
applied to the captured mixer input, reproduces the mixer output the model itself computed
(float32 model, 1e-4 relative), and `analyze` runs on each.

Tiny random models are built offline from configs (hidden 32-64, 2-4 layers), seeded.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
import transformers as tf

from ess_explorer import analyze
from ess_explorer.capture import MODEL_TYPES, capture, layer_slots

VOCAB = 64
LENGTH = 16
IDS = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, pad_token_id=0)
ATTN = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
MOE = dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32)


def _configs():
    return {
        "qwen3": tf.Qwen3Config(num_hidden_layers=2, head_dim=8, **ATTN, **IDS),
        "qwen3_moe": tf.Qwen3MoeConfig(num_hidden_layers=2, head_dim=8, **MOE, **ATTN, **IDS),
        "gemma2": tf.Gemma2Config(
            num_hidden_layers=2, head_dim=8, sliding_window=5, attn_logit_softcapping=2.0, **ATTN, **IDS
        ),
        "gemma3_text": tf.Gemma3TextConfig(
            num_hidden_layers=2, head_dim=8, sliding_window=5, layer_types=["sliding_attention", "full_attention"],
            **ATTN, **IDS,
        ),
        "phi3": tf.Phi3Config(num_hidden_layers=2, **ATTN, **IDS),
        "olmo2": tf.Olmo2Config(num_hidden_layers=2, **ATTN, **IDS),
        "granite": tf.GraniteConfig(num_hidden_layers=2, **ATTN, **IDS),
        "llama4_text": tf.Llama4TextConfig(
            num_hidden_layers=2, head_dim=8, attention_chunk_size=6, no_rope_layers=[1, 0], num_local_experts=2,
            intermediate_size_mlp=64, **ATTN, **IDS,
        ),
        "falcon": tf.FalconConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, **IDS),
        "lfm2_moe": tf.Lfm2MoeConfig(
            num_hidden_layers=2, layer_types=["conv", "full_attention"], num_dense_layers=1, num_experts=2,
            num_experts_per_tok=1, moe_intermediate_size=32, **ATTN, **IDS,
        ),
    }


CONFIGS = _configs()
ATT = "softmax_attention"
EXPECTED_FAMILIES = {
    "qwen3": [ATT] * 2,
    "qwen3_moe": [ATT] * 2,
    "gemma2": [ATT] * 2,
    "gemma3_text": [ATT] * 2,
    "phi3": [ATT] * 2,
    "olmo2": [ATT] * 2,
    "granite": [ATT] * 2,
    "llama4_text": ["chunked_attention", ATT],
    "falcon": [ATT] * 2,
    "lfm2_moe": ["short_conv", ATT],
}


def build(name: str, seed: int = 0):
    """A tiny random model of ``name`` (eval mode) and a seeded prompt (1, LENGTH)."""
    torch.manual_seed(seed)
    config = CONFIGS[name].__class__.from_dict(CONFIGS[name].to_dict())
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(1, VOCAB, (1, LENGTH), generator=torch.Generator().manual_seed(seed + 1))
    return model, ids


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def built(request):
    model, ids = build(request.param)
    return request.param, model, ids, capture(model, ids, layer_slots(model))


def test_reconstruction(built):
    name, model, _ids, layers = built
    assert model.config.model_type in MODEL_TYPES
    assert [layers[i].family for i in sorted(layers)] == EXPECTED_FAMILIES[name]
    for index, layer in layers.items():
        predicted, observed = layer.reconstruct()
        assert predicted.shape == observed.shape
        scale = observed.abs().max().item()
        assert scale > 1e-6, "the mixer output is all zero: the check would prove nothing"
        torch.testing.assert_close(predicted, observed, rtol=1e-4, atol=1e-4 * scale, msg=f"{name} layer {index}")


def test_operators_are_causal_and_per_unit(built):
    name, _model, _ids, layers = built
    for layer in layers.values():
        op = layer.dense(range(min(layer.n_units, 4)))
        assert op.shape[-2:] == (LENGTH, LENGTH)
        assert torch.equal(torch.triu(op, diagonal=1), torch.zeros_like(op)), name
        if op.shape[0] > 1:
            assert not torch.allclose(op[0], op[1]), name


def test_analyze_runs(built):
    name, model, ids, layers = built
    result = analyze(model, ids, progress=False)
    assert sorted(result.layers) == sorted(layers)
    for index, layer_ess in result.layers.items():
        tss = np.asarray(layer_ess.tss)
        ess = np.asarray(layer_ess.ess("tolerance"))
        assert np.all(np.isfinite(ess)), f"{name} layer {index}"
        # ESS never exceeds the unit's capacity (ESS.md: rank H_t <= TSS)
        assert np.all(ess <= tss + 1e-9), f"{name} layer {index}"


def test_gemma_sliding_and_global_layers_follow_layer_types():
    for name in ("gemma2", "gemma3_text"):
        model, ids = build(name)
        layers = capture(model, ids, layer_slots(model))
        sliding, full = layers[0].dense([0])[0], layers[1].dense([0])[0]
        assert layers[0].window == 5 and layers[1].window is None
        i, j = torch.tril_indices(LENGTH, LENGTH)
        far = (i - j) >= 5
        assert torch.all(sliding[i[far], j[far]] == 0) and torch.all(sliding[i[~far], j[~far]] > 0)
        assert torch.all(full[i, j] > 0)


def test_llama4_chunked_layer_is_block_diagonal_and_its_tss_resets_per_chunk():
    model, ids = build("llama4_text")
    layer = capture(model, ids, layer_slots(model))[0]
    op = layer.dense([0])[0]
    i, j = torch.tril_indices(LENGTH, LENGTH)
    same = (i // 6) == (j // 6)
    assert torch.all(op[i[~same], j[~same]] == 0) and torch.all(op[i[same], j[same]] > 0)
    t = np.arange(LENGTH)
    np.testing.assert_array_equal(layer.tss(t), t % 6)
    # rank of the cut at t is at most the tokens of t's chunk before t
    for cut in range(1, LENGTH):
        rank = torch.linalg.matrix_rank(op[cut:, :cut]).item()
        assert rank <= cut % 6
