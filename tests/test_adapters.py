"""Reconstruction proofs: the materialised T of every unit, applied to the captured mixer
input, reproduces the mixer output the model itself computed (float32 model, 1e-4 relative).

Tiny random models are built offline from configs, seeded; one per supported family.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import transformers as tf

from ess_explorer import hankel_singular_values
from ess_explorer.capture import MODEL_TYPES, capture, layer_slots
from ess_explorer.core.short_conv import short_conv_hankel_singular_values, short_conv_operator

VOCAB = 64
LENGTH = 24
IDS = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, pad_token_id=0)
ATTN = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
# Gated DeltaNet: 2 query/key heads of size 8 read by 4 value heads of size 6 (grouped).
DELTA = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6)


def _configs():
    from ess_explorer import architectures as zoo_modeling

    zoo = dict(vocab_size=VOCAB, hidden_size=32, num_heads=2, head_dim=8, value_dim=8)
    return {
        "gpt2": tf.GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=64, **IDS),
        "llama": tf.LlamaConfig(num_hidden_layers=2, **ATTN, **IDS),
        "qwen2": tf.Qwen2Config(num_hidden_layers=2, **ATTN, **IDS),
        "mistral": tf.MistralConfig(num_hidden_layers=2, sliding_window=5, **ATTN, **IDS),
        "mamba": tf.MambaConfig(num_hidden_layers=2, hidden_size=16, state_size=4, **IDS),
        "falcon_mamba": tf.FalconMambaConfig(num_hidden_layers=2, hidden_size=16, state_size=4, **IDS),
        "mamba2": tf.Mamba2Config(
            num_hidden_layers=2, hidden_size=16, state_size=4, num_heads=4, head_dim=8, n_groups=1, chunk_size=8, **IDS
        ),
        "mamba2_groups": tf.Mamba2Config(  # two groups of B, C: heads 0-1 read group 0, heads 2-3 group 1
            num_hidden_layers=1, hidden_size=16, state_size=4, num_heads=4, head_dim=8, n_groups=2, chunk_size=8, **IDS
        ),
        "lfm2": tf.Lfm2Config(
            num_hidden_layers=2, layer_types=["conv", "full_attention"], conv_bias=True, **ATTN, **IDS
        ),
        "jamba": tf.JambaConfig(
            num_hidden_layers=2,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            num_experts=2,
            mamba_d_state=4,
            mamba_dt_rank=4,
            **ATTN,
            **IDS,
        ),
        "bamba": tf.BambaConfig(
            num_hidden_layers=2,
            attn_layer_indices=[1],
            mamba_n_heads=4,
            mamba_d_head=16,
            mamba_n_groups=1,
            mamba_d_state=4,
            mamba_chunk_size=8,
            **ATTN,
            **IDS,
        ),
        "zamba2": tf.Zamba2Config(
            num_hidden_layers=3,
            hidden_size=32,
            num_attention_heads=4,
            mamba_d_state=4,
            mamba_headdim=16,
            n_mamba_heads=4,
            mamba_ngroups=1,
            chunk_size=8,
            layers_block_type=["mamba", "hybrid", "mamba"],
            use_shared_attention_adapter=True,  # V = v_proj(x) + the depth's low-rank adapter
            adapter_rank=4,
            **IDS,
        ),
        "qwen3_next": tf.Qwen3NextConfig(
            num_hidden_layers=2,
            layer_types=["linear_attention", "full_attention"],
            head_dim=8,
            num_experts=2,
            num_experts_per_tok=1,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=16,
            **DELTA,
            **ATTN,
            **IDS,
        ),
        "qwen3_5_text": tf.Qwen3_5TextConfig(
            num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], head_dim=8, **DELTA, **ATTN, **IDS
        ),
        "olmo_hybrid": tf.OlmoHybridConfig(  # beta up to 2: transitions with negative eigenvalues
            num_hidden_layers=2,
            layer_types=["linear_attention", "full_attention"],
            linear_allow_neg_eigval=True,
            **DELTA,
            **ATTN,
            **IDS,
        ),
        "kimi_linear": tf.KimiLinearConfig(
            num_hidden_layers=2,
            layer_types=["linear_attention", "full_attention"],
            linear_head_dim=8,
            linear_num_heads=4,
            num_local_experts=2,
            num_experts_per_tok=1,
            moe_intermediate_size=16,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=4,
            v_head_dim=6,
            **{**ATTN, "num_key_value_heads": 4},
            **IDS,  # MLA: one kv head per head
        ),
        "bailing_hybrid": tf.AutoConfig.for_model(  # Ling 3: KDA, then latent attention gated per head
            "bailing_hybrid",
            num_hidden_layers=2,
            layer_types=["linear_attention", "full_attention"],
            head_dim=8,  # of the KDA heads (num_attention_heads of them)
            num_experts=2,
            num_experts_per_tok=1,
            moe_intermediate_size=16,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=4,
            v_head_dim=6,
            **{**ATTN, "num_key_value_heads": 4},
            **IDS,
        ),
        "la": zoo_modeling.EssLinearAttentionConfig(**zoo),
        "gla": zoo_modeling.EssLinearAttentionConfig(gated=True, **zoo),
    }


CONFIGS = _configs()
EXPECTED_FAMILIES = {
    "gpt2": ["softmax_attention"] * 2,
    "llama": ["softmax_attention"] * 2,
    "qwen2": ["softmax_attention"] * 2,
    "mistral": ["softmax_attention"] * 2,
    "mamba": ["mamba"] * 2,
    "falcon_mamba": ["mamba"] * 2,
    "mamba2": ["mamba2"] * 2,
    "mamba2_groups": ["mamba2"],
    "lfm2": ["short_conv", "softmax_attention"],
    "jamba": ["mamba", "softmax_attention"],
    "bamba": ["mamba2", "softmax_attention"],
    "zamba2": ["mamba2", "softmax_attention", "mamba2", "mamba2"],  # keys 1, 2, 3, 5: 2 the shared block
    "qwen3_next": ["gated_deltanet", "softmax_attention"],
    "qwen3_5_text": ["gated_deltanet", "softmax_attention"],
    "olmo_hybrid": ["gated_deltanet", "softmax_attention"],
    "kimi_linear": ["kda", "softmax_attention"],
    "bailing_hybrid": ["kda", "softmax_attention"],
    "la": ["linear_attention"] * 2,
    "gla": ["gated_linear_attention"] * 2,
}


def build(name: str, seed: int = 0):
    """A tiny random model of family ``name`` (eval mode) and a seeded prompt (1, LENGTH)."""
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(CONFIGS[name].__class__.from_dict(CONFIGS[name].to_dict())).eval()
    ids = torch.randint(1, VOCAB, (1, LENGTH), generator=torch.Generator().manual_seed(seed + 1))
    return model, ids


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def captured(request):
    model, ids = build(request.param)
    return request.param, model, capture(model, ids, layer_slots(model))


def test_every_registered_model_type_is_tested():
    from test_families import CONFIGS as FAMILY_CONFIGS  # today's families: tests/test_families.py
    from test_families import NEWER_TYPES, in_transformers

    tested = {config.model_type for config in [*CONFIGS.values(), *FAMILY_CONFIGS.values()]}
    absent = {name for name in NEWER_TYPES if not in_transformers(name)}  # not in this transformers
    assert set(MODEL_TYPES) - absent <= tested, (
        f"model types without a reconstruction test: {set(MODEL_TYPES) - tested}"
    )
    assert set(NEWER_TYPES) <= set(MODEL_TYPES)


def test_reconstruction(captured):
    name, _model, layers = captured
    assert [layers[i].family for i in sorted(layers)] == EXPECTED_FAMILIES[name]
    for index, layer in layers.items():
        predicted, observed = layer.reconstruct()
        assert predicted.shape == observed.shape == layer.inputs.shape
        assert observed.abs().max() > 1e-6, "the mixer output is all zero: the check would prove nothing"
        scale = observed.abs().max().item()
        torch.testing.assert_close(predicted, observed, rtol=1e-4, atol=1e-4 * scale, msg=f"{name} layer {index}")


def test_operators_are_causal_and_per_unit(captured):
    name, _model, layers = captured
    for layer in layers.values():
        op = layer.dense(range(min(layer.n_units, 6)))
        assert op.shape[-2:] == (LENGTH, LENGTH)
        assert torch.equal(torch.triu(op, diagonal=1), torch.zeros_like(op)), name
        if op.shape[0] > 1:  # each unit owns its own T
            assert not torch.allclose(op[0], op[1])


def test_gqa_one_operator_per_query_head():
    model, ids = build("llama")
    layer = capture(model, ids, layer_slots(model))[0]
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    assert layer.n_units == model.config.num_attention_heads
    # query heads 0 and 1 read the same V (kv head 0) but apply different T
    assert torch.equal(layer.inputs[0], layer.inputs[1])
    assert not torch.allclose(layer.dense([0])[0], layer.dense([1])[0])


def test_attention_rows_are_probabilities():
    model, ids = build("gpt2")
    op = capture(model, ids, layer_slots(model))[1].dense(range(4))
    torch.testing.assert_close(op.sum(-1), torch.ones(4, LENGTH, dtype=op.dtype))
    assert (op >= 0).all()


def test_sliding_window_from_config_matches_the_operator():
    model, ids = build("mistral")
    window = model.config.sliding_window
    for layer in capture(model, ids, layer_slots(model)).values():
        assert layer.window == window
        op = layer.dense(range(layer.n_units))
        lag = torch.arange(LENGTH)[:, None] - torch.arange(LENGTH)[None, :]
        assert (op[:, lag >= window] == 0).all()  # nothing outside the window
        assert (op[:, (lag >= 0) & (lag < window)] > 0).all()  # everything inside it
        assert layer.max_rank == window - 1


def test_qwen2_sliding_layers_follow_layer_types():
    config = tf.Qwen2Config(
        num_hidden_layers=2, use_sliding_window=True, sliding_window=4, max_window_layers=1, **ATTN, **IDS
    )
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    slots = layer_slots(model)
    assert [slot.window for slot in slots] == [None if kind == "full_attention" else 4 for kind in config.layer_types]
    assert any(slot.window == 4 for slot in slots)


def test_short_conv_operator_matches_a_convolution():
    """T built from (B, C, w) applied to u equals C * conv1d(B * u), computed by torch."""
    gen = torch.Generator().manual_seed(3)
    units, length, k = 5, 17, 4
    b, c, u = (torch.randn(units, length, generator=gen, dtype=torch.float64) for _ in range(3))
    w = torch.randn(units, k, generator=gen, dtype=torch.float64)
    conv = torch.nn.functional.conv1d((b * u)[None], w[:, None, :], padding=k - 1, groups=units)[0, :, :length]
    expected = c * conv
    got = (short_conv_operator(b, c, w) @ u[..., None])[..., 0]
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("k", [2, 3, 5])
def test_short_conv_spectra_equal_the_dense_core(k):
    gen = torch.Generator().manual_seed(k)
    units, length = 6, 19
    b, c = (torch.randn(units, length, generator=gen, dtype=torch.float64) for _ in range(2))
    w = torch.randn(units, k, generator=gen, dtype=torch.float64)
    positions = torch.arange(length)
    fast = short_conv_hankel_singular_values(b, c, w, positions)
    dense = hankel_singular_values(short_conv_operator(b, c, w), method="svd")
    assert fast.shape == (units, length, k - 1)
    torch.testing.assert_close(fast, dense[..., : k - 1], rtol=1e-10, atol=1e-12)
    assert (dense[..., k - 1 :] < 1e-10).all()  # rank(H_t) <= k - 1: nothing was cut off
    interior = slice(k - 1, length - k + 2)
    # generic B, C, w: the (k-1) x (k-1) block has full rank in the interior
    assert (fast[:, interior, -1] > 1e-10 * fast[:, interior, 0]).all()


def test_hooks_and_patches_are_removed_even_on_error():
    model, ids = build("mamba")
    module = sys.modules[type(model.backbone.layers[0].mixer).__module__]
    original = module.mamba_selective_scan
    slots = layer_slots(model)
    with pytest.raises(Exception):
        capture(model, ids.float(), slots)  # float ids: the embedding fails mid-pass
    assert module.mamba_selective_scan is original
    for sub in model.modules():
        assert not sub._forward_hooks and not sub._forward_pre_hooks
    capture(model, ids, slots)
    assert module.mamba_selective_scan is original


def test_la_mix_is_restored():
    model, ids = build("gla")
    mixer = model.model.layers[0].mixer
    capture(model, ids, layer_slots(model))
    assert "mix" not in vars(mixer)


def test_missing_attention_probabilities_are_an_error_not_an_empty_operator():
    from ess_explorer.capture import ADAPTERS

    model, _ = build("llama")
    slot = layer_slots(model)[0]
    with pytest.raises(RuntimeError, match="attn_implementation='eager'"):
        ADAPTERS["attention"].build(slot, {"probs": None})


TINY_BERT = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, vocab_size=VOCAB)
# X-MOD as a decoder: a causal LM this package does not read (its forward needs a language set first)
XMOD_DECODER = tf.XmodConfig(is_decoder=True, **TINY_BERT)


def test_unsupported_model_type_names_the_registry():
    model = tf.AutoModelForCausalLM.from_config(XMOD_DECODER)
    with pytest.raises(
        ValueError, match=r"'xmod'.*not supported\..*model types are supported: `ess-explorer models"
    ) as refused:
        layer_slots(model)
    assert "capture/registry.py" in str(refused.value) and "mamba" not in str(refused.value)  # no list of 258


def test_cpm_ant_is_refused_for_attending_both_ways_over_its_prompt():
    """CPM-Ant's forward puts the whole prompt in its context: its earlier outputs depend on its
    last token, as the reason says."""
    config = tf.CpmAntConfig(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=4, dim_head=8, dim_ff=32, vocab_size=VOCAB
    )
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(1, VOCAB, (1, 8))
    changed = ids.clone()
    changed[0, -1] = ids[0, -1] % (VOCAB - 1) + 1
    with torch.no_grad():
        earlier, earlier_changed = model(ids).logits[0, :-1], model(changed).logits[0, :-1]
    assert (earlier - earlier_changed).abs().max() > 1e-3
    with pytest.raises(ValueError, match=r"'cpmant'.*not supported: its forward puts the whole prompt in its context"):
        layer_slots(model)


@pytest.mark.parametrize(
    "config, reason",
    [
        (
            tf.BertConfig(**TINY_BERT),
            r"it is an encoder: every token attends to every other.* trained as a decoder \(config.is_decoder = True\) "
            "is supported",
        ),
        (  # BERT as the decoder of an encoder-decoder (EncoderDecoderModel's)
            tf.BertConfig(is_decoder=True, add_cross_attention=True, **TINY_BERT),
            "it is the decoder of an encoder-decoder: each of its layers also attends to the encoder's output",
        ),
        (  # XLM as its masked-LM checkpoints are configured
            tf.XLMConfig(emb_dim=16, n_layers=1, n_heads=2, vocab_size=VOCAB),
            r"it is an encoder: .* trained as a decoder \(config.causal = True\) is supported",
        ),
        (  # XLM as its causal checkpoints are configured: two languages, and their embedding
            tf.XLMConfig(causal=True, n_langs=2, emb_dim=16, n_layers=1, n_heads=2, vocab_size=VOCAB),
            r"it is multilingual \(2 languages\): its forward adds a language embedding to each token from `langs`",
        ),
        (  # BartForCausalLM's config: the decoder alone
            tf.BartConfig(
                is_decoder=True,
                is_encoder_decoder=False,
                d_model=16,
                encoder_layers=1,
                decoder_layers=1,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=16,
                decoder_ffn_dim=16,
                vocab_size=VOCAB,
            ),
            "it is the decoder of an encoder-decoder",
        ),
        (
            tf.T5Config(d_model=16, d_kv=8, d_ff=16, num_layers=1, num_heads=2, vocab_size=VOCAB),
            "it is an encoder-decoder: its encoder reads the prompt",
        ),
        (
            tf.Wav2Vec2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16),
            "it is an audio model .*: it reads a waveform or its features, not a text prompt",
        ),
        (
            tf.ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16),
            "it is a vision model",
        ),
    ],
    ids=["encoder", "bert-cross-attention", "xlm-encoder", "xlm-multilingual", "bart-decoder", "encoder-decoder"]
    + ["audio", "vision"],
)
def test_an_encoder_or_encoder_decoder_is_refused_with_that_reason_before_its_weights_are_read(
    tmp_path, config, reason
):
    """BERT as an encoder, T5, and a decoder that needs its encoder's output are no causal
    sequence models of a prompt, which `load_model` says from the config alone: the folder's
    weights file here is not even valid."""
    from ess_explorer.sources import load_model

    model = tf.AutoModel.from_config(config)
    with pytest.raises(ValueError, match=rf"'{config.model_type}'.*not supported: {reason}"):
        layer_slots(model)
    config.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=rf"'{config.model_type}'.*not supported: {reason}"):
        load_model(str(tmp_path))


def test_no_type_of_a_text_generating_class_is_called_an_audio_or_vision_model():
    """Whisper is in transformers' audio-classification class too, ShieldGemma 2 in its
    image-classification class: a type that generates text is never refused as reading no text."""
    from transformers.models.auto import modeling_auto as auto

    from ess_explorer.capture.refused import not_causal

    assert "whisper" in auto.MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES  # the case this guards
    generating = {*auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, *auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES}
    called = {name: not_causal(name) or "" for name in generating}
    assert not [name for name, why in called.items() if why.startswith(("it is an audio", "it is a vision"))]


def test_a_masked_lm_type_configured_as_a_decoder_is_not_called_an_encoder():
    """X-MOD with is_decoder attends causally: unsupported, but not for being an encoder; BERT
    with is_decoder and XLM with causal (of one language) are analysed."""
    from ess_explorer.capture.registry import require_supported

    with pytest.raises(ValueError, match=r"'xmod'.*not supported\. .*capture/registry.py") as refused:
        require_supported(XMOD_DECODER.model_type, "m", XMOD_DECODER)
    assert "encoder" not in str(refused.value)
    bert = tf.BertConfig(is_decoder=True, **TINY_BERT)
    xlm = tf.XLMConfig(causal=True, emb_dim=16, n_layers=1, n_heads=2, vocab_size=VOCAB)
    for config, model_class in ((bert, tf.BertLMHeadModel), (xlm, tf.XLMWithLMHeadModel)):
        require_supported(config.model_type, "m", config)
        assert len(layer_slots(model_class(config))) == 1


# A refused model type, as small as it builds: JetMoE, a mixture of attention heads routed per token.
REFUSED_CONFIG = tf.JetMoeConfig(
    num_hidden_layers=1,
    hidden_size=32,
    num_key_value_heads=2,
    kv_channels=8,
    num_local_experts=2,
    num_experts_per_tok=1,
    intermediate_size=32,
    **IDS,
)


def test_a_refused_model_type_says_why_and_the_docs_say_it_too():
    from pathlib import Path

    from ess_explorer.capture.registry import REFUSED

    with pytest.raises(ValueError, match=r"'jetmoe'.*not supported: its attention heads are experts routed per token"):
        layer_slots(tf.AutoModelForCausalLM.from_config(REFUSED_CONFIG))
    assert not set(REFUSED) & set(MODEL_TYPES)
    families = (Path(__file__).parents[1] / "docs" / "families.md").read_text()
    assert all(f"`{name}`" in families for name in REFUSED)


def _first_output_moves_with_the_last_token(outputs) -> bool:
    """Whether changing a prompt's last token moves the output at its first position (``outputs``:
    ids (1, 8) -> (1, 8, ...)): then T is not causal."""
    ids = torch.randint(1, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[0, -1] = ids[0, -1] % (VOCAB - 1) + 1
    with torch.no_grad():
        return bool((outputs(ids)[0, 0] - outputs(changed)[0, 0]).abs().max() > 1e-5)


def test_xlnet_and_moshi_are_refused_for_what_their_models_do():
    """The reasons REFUSED gives, checked on tiny models: XLNet as its checkpoints are configured
    makes its first output depend on the last token, and Moshi's forward fails on text alone."""
    config = tf.XLNetConfig(d_model=32, n_layer=1, n_head=4, d_inner=32, vocab_size=VOCAB)
    assert config.attn_type == "bi"
    torch.manual_seed(0)
    model = tf.XLNetLMHeadModel(config).eval()
    assert _first_output_moves_with_the_last_token(lambda ids: model(ids).logits)
    with pytest.raises(ValueError, match=r"'xlnet'.*not supported: .*every token attend to the whole prompt"):
        layer_slots(model)

    moshi = tf.MoshiConfig(
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        audio_vocab_size=16,
        num_codebooks=2,
        depth_num_hidden_layers=1,
        depth_hidden_size=16,
        depth_num_attention_heads=2,
        vocab_size=VOCAB,
    )
    model = tf.MoshiForConditionalGeneration(moshi).eval()
    with pytest.raises(TypeError), torch.no_grad():  # torch.cat of its two streams' audio codes: None
        model(input_ids=torch.randint(1, VOCAB, (1, 8)))
    with pytest.raises(ValueError, match=r"'moshi'.*not supported: its forward needs the audio codes"):
        layer_slots(model)


@pytest.mark.parametrize(
    "model_type, sizes",
    [
        ("openai_privacy_filter", dict(num_local_experts=2, num_experts_per_tok=1, sliding_window=4)),
        ("embedding_gemma2_text", dict(sliding_window=4, hidden_size_per_layer_input=8, embedding_dim=16)),
    ],
)
def test_encoders_outside_the_masked_lm_class_are_refused_as_encoders(model_type, sizes):
    """EmbeddingGemma 2 and the OpenAI privacy filter are in no masked-LM class, which `not_causal`
    reads; their first output depends on the last token (checked on tiny models), and they are
    refused as the encoders they are."""
    config = tf.AutoConfig.for_model(model_type, num_hidden_layers=2, head_dim=8, **ATTN, **sizes, **IDS)
    torch.manual_seed(0)
    model = tf.AutoModel.from_config(config).eval()
    assert _first_output_moves_with_the_last_token(lambda ids: model(ids).last_hidden_state)
    with pytest.raises(ValueError, match=rf"'{model_type}'.*not supported: it is an encoder: every token attends"):
        layer_slots(model)


def test_reformer_is_refused_for_its_random_hashing():
    """Reformer's LSH attention hashes by rotations drawn at each forward pass (no hash_seed, as
    its config defaults): the same prompt twice gives two outputs, so no one T produced them."""
    config = tf.ReformerConfig(
        attn_layers=["lsh"],
        is_decoder=True,
        hidden_size=16,
        num_attention_heads=2,
        attention_head_size=8,
        feed_forward_size=16,
        axial_pos_embds=False,
        max_position_embeddings=16,
        lsh_attn_chunk_length=4,
        num_buckets=2,
        num_hashes=2,
        vocab_size=VOCAB,
    )
    assert config.hash_seed is None
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(1, VOCAB, (1, 8))
    with torch.no_grad():
        assert (model(ids).logits - model(ids).logits).abs().max() > 1e-4
    with pytest.raises(ValueError, match=r"'reformer'.*not supported: its LSH attention layers hash"):
        layer_slots(model)


# Model types with a per-token gate around some mixer (Qwen3-Next / Qwen3.5: the sigmoid
# output gate of their attention layers; Ling 3: one per latent head; the delta rule's
# layers: the gated norm after the kernel).
GATED = {
    "mamba",
    "falcon_mamba",
    "mamba2",
    "mamba2_groups",
    "jamba",
    "bamba",
    "zamba2",
    "la",
    "gla",
    "qwen3_next",
    "qwen3_5_text",
    "bailing_hybrid",
    "olmo_hybrid",
    "kimi_linear",
}


def test_reconstruction_with_gates_inside(captured):
    """gates="inside": T' = diag(g) T alone reproduces the gated output (no out_gate left)."""
    from ess_explorer.core.gates import gates_inside

    name, _model, layers = captured
    gated_layers = 0
    for index, layer in layers.items():
        inside = gates_inside(layer)
        assert inside.out_gate is None
        gated_layers += layer.out_gate is not None
        predicted, observed = inside.reconstruct()
        scale = observed.abs().max().item()
        torch.testing.assert_close(predicted, observed, rtol=1e-4, atol=1e-4 * scale, msg=f"{name} layer {index}")
        # Same scalars either way: units x channels per unit.
        assert inside.n_units * inside.unit_multiplicity() == layer.n_units * layer.unit_multiplicity()
    assert (gated_layers > 0) == (name in GATED), f"{name}: which layers carry a gate"


def test_bailing_hybrid_decays_each_key_and_gates_each_latent_head_once():
    """Ling 3's linear layers are KDA (a decay per key dimension, not one per head); its latent
    heads are multiplied by one sigmoid per head and token from g_proj, kept outside T."""
    model, ids = build("bailing_hybrid")
    layers = capture(model, ids, layer_slots(model))
    decay = layers[0].realize(torch.arange(layers[0].n_units)).a  # (H, L, K)
    assert not torch.allclose(decay, decay[..., :1].expand_as(decay))
    gate = layers[1].out_gate  # (H, L, v_head_dim)
    assert torch.equal(gate, gate[..., :1].expand_as(gate)) and torch.all((gate > 0) & (gate < 1))
    assert not torch.allclose(gate[0], gate[1])


def test_mamba2_gate_is_the_gated_norms_scale():
    """weight * (y * g) is exactly what the model's gated RMSNorm returned."""
    model, ids = build("mamba2")
    seen = {}
    norm = layer_slots(model)[0].module.norm
    handle = norm.register_forward_hook(lambda _m, _a, out: seen.setdefault("out", out.detach()))
    try:
        layer = capture(model, ids, layer_slots(model))[0]
    finally:
        handle.remove()
    heads, length, head_dim = layer.outputs.shape
    ours = layer.outputs.transpose(0, 1).reshape(length, heads * head_dim) * norm.weight.detach().to(torch.float64)
    torch.testing.assert_close(ours, seen["out"][0].to(torch.float64), rtol=1e-5, atol=1e-6)
    # Channels of a head have different gates, so gates inside makes each channel a unit.
    from ess_explorer.core.gates import gates_inside

    inside = gates_inside(layer)
    assert inside.n_units == heads * head_dim and inside.unit_multiplicity() == 1
    assert inside.info["unit_kind"] == "channel"


def test_scan_signature_reads_the_function_a_kernels_module_wraps():
    """With the ``kernels`` package, transformers turns a scan function into an nn.Module whose
    forward(*args, **kwargs) calls the function it closes over: its parameters are read there."""
    from ess_explorer.capture.mamba import scan_signature

    def scan(hidden_states, dt, A, D=None, **kwargs):
        return hidden_states

    def function_module(func):  # the shape of kernels' _create_func_module
        class Func(torch.nn.Module):
            def forward(self, *args, **kwargs):
                return func(*args, **kwargs)

        return Func()

    assert list(scan_signature(function_module(scan)).parameters) == ["hidden_states", "dt", "A", "D", "kwargs"]
    assert list(scan_signature(scan).parameters) == ["hidden_states", "dt", "A", "D", "kwargs"]
    with pytest.raises(RuntimeError, match="wraps no function"):
        scan_signature(lambda *args, **kwargs: None)
    # and the installed transformers' own scan functions bind by name
    from transformers.models.mamba2 import modeling_mamba2

    assert "hidden_states" in scan_signature(modeling_mamba2.mamba2_chunk_scan).parameters


def test_an_adapter_that_finds_nothing_under_another_transformers_says_what_to_install(monkeypatch):
    """A modeling change in a transformers release outside the tested range shows up as an
    adapter reading a key or attribute that is not there: the error names the installed and
    the tested versions. Inside the range the adapter's own error is left as it is."""
    from ess_explorer.capture import ADAPTERS
    from ess_explorer.capture.base import transformers_outside_tested_range

    model, ids = build("mamba")
    slots = layer_slots(model)

    def build_fails(slot, raw):
        raise KeyError("hidden_states")

    monkeypatch.setattr(ADAPTERS["mamba"], "build", build_fails)
    assert transformers_outside_tested_range() is None
    with pytest.raises(KeyError):
        capture(model, ids, slots)
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.99.0")
    message = transformers_outside_tested_range()
    assert message is not None and "5.99.0" in message and "pip install 'transformers" in message
    with pytest.raises(
        RuntimeError, match=r"layer 0: the mamba adapter failed \(KeyError\('hidden_states'\)\).*5\.99\.0"
    ):
        capture(model, ids, slots)


def test_the_kernel_fallback_notice_is_not_shown_during_a_capture():
    """transformers 5.25 tells that its scans fall back to their PyTorch reference on the CPU:
    the path the capture reads, so the notice is noise there; other notices still pass."""
    import logging

    from packaging.version import Version

    logger = logging.getLogger("transformers.integrations.hub_kernels")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    try:
        model, ids = build("mamba2")
        if hasattr(logging.Logger, "warning_once"):  # transformers says it once per process
            logging.Logger.warning_once.cache_clear()
        capture(model, ids, layer_slots(model))
        logger.warning("another notice")
        assert seen == ["another notice"]
        if hasattr(logging.Logger, "warning_once"):
            logging.Logger.warning_once.cache_clear()
        with torch.no_grad():
            model(ids)  # outside a capture the notice is transformers' to give
        if Version(tf.__version__) >= Version("5.25"):
            assert any("falling back" in message for message in seen)
    finally:
        logger.removeHandler(handler)
