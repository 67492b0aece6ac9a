"""Softmax attention's state in scalars is its KV cache: layer totals of TSS count
2 x KV heads x head_dim per cached token (GQA aware), while per-head TSS stays t."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
import transformers as tf
from test_adapters import build

from ess_explorer import analyze
from ess_explorer.capture import capture, layer_slots
from ess_explorer.core.diagnostics import layer_diagnostics
from ess_explorer.result import ESSResult, LayerESS

LENGTH = 12
IDS = dict(vocab_size=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1)

# (config, query heads, KV heads, head_dim, window)
MODELS = {
    "llama_gqa": (tf.LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **SMALL, **IDS), 4, 2, 8, None),
    "gpt2": (tf.GPT2Config(n_layer=1, n_head=4, n_embd=32, n_positions=64, **IDS), 4, 4, 8, None),
    "mistral_window": (
        tf.MistralConfig(num_attention_heads=4, num_key_value_heads=1, sliding_window=5, **SMALL, **IDS),
        4,
        1,
        8,
        5,
    ),
}


def _analyze(name: str):
    config = MODELS[name][0]
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config.__class__.from_dict(config.to_dict())).eval()
    ids = torch.randint(1, 64, (1, LENGTH), generator=torch.Generator().manual_seed(1))
    return analyze(model, ids, progress=False, causal=False)


@pytest.fixture(scope="module", params=sorted(MODELS))
def analysed(request):
    return request.param, _analyze(request.param)


def test_total_tss_is_the_kv_cache(analysed):
    name, result = analysed
    _, heads, kv_heads, head_dim, window = MODELS[name]
    lay = result.layers[0]
    t = np.asarray(lay.positions, dtype=np.float64)
    cached = t if window is None else np.minimum(t, window - 1)  # tokens the cache holds at cut t
    np.testing.assert_array_equal(lay.total_tss(), 2 * kv_heads * head_dim * cached)
    # per-head units stay: one operator per query head, TSS = cached tokens, value channels
    assert lay.n_units == heads
    np.testing.assert_array_equal(lay.tss, np.broadcast_to(cached, lay.tss.shape))
    np.testing.assert_array_equal(lay.multiplicity, head_dim)
    # ESS totals stay per query head x value channels
    np.testing.assert_allclose(lay.total("tolerance"), head_dim * lay.tolerance_ess.sum(0))
    assert layer_diagnostics(lay)["total_tss"] == pytest.approx(2 * kv_heads * head_dim * cached.max())


def test_the_kv_cache_survives_a_save(analysed, tmp_path):
    _, result = analysed
    loaded = ESSResult.load(result.save(tmp_path / "r.npz"))
    np.testing.assert_array_equal(loaded.layers[0].total_tss(), result.layers[0].total_tss())


def test_a_layer_without_state_weight_counts_its_multiplicity():
    # results written before the KV cache was recorded, and every non-attention layer
    units, positions = 3, np.arange(6)
    tss = np.broadcast_to(np.minimum(positions, 2).astype(float), (units, 6))
    lay = LayerESS(
        0,
        "mamba2",
        "head",
        positions,
        tolerance_ess=np.zeros((units, 6), dtype=np.int64),
        entropy_ess=np.zeros((units, 6)),
        tss=tss,
        singular_values=np.zeros((units, 6, 2)),
        rank_bound=np.zeros((units, 6), dtype=np.int64),
        multiplicity=np.array([5, 5, 5]),
    )
    np.testing.assert_array_equal(lay.total_tss(), 15 * tss[0])
    with pytest.raises(ValueError, match="state_weight must be positive"):
        LayerESS(**{**lay.__dict__, "state_weight": np.array([1.0, 0.0, 1.0])})


def test_latent_attention_caches_its_latent():
    model, ids = build("kimi_linear")  # MLA: kv_lora_rank 16, qk_rope_head_dim 4, 4 heads of v_head_dim 6
    layer = capture(model, ids, layer_slots(model))[1]
    assert layer.family == "softmax_attention"
    # the compressed latent (16) and the shared rotary key (4) per token, not 2 x 4 heads x 6
    assert layer.unit_state_weight() * layer.n_units == pytest.approx(16 + 4)
