"""Reconstruction proofs for today's model families: the materialised T of every unit,
applied to the captured mixer input, reproduces the mixer output the model itself computed
(float32 model, 1e-4 relative), and `analyze` runs on each.

Tiny random models are built offline from configs (hidden 32-64, 2-4 layers), seeded.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
import transformers as tf

from ess_explorer import analyze
from ess_explorer.capture import MODEL_FAMILIES, MODEL_TYPES, capture, layer_slots

VOCAB = 64
LENGTH = 16
IDS = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, pad_token_id=0)
ATTN = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
MOE = dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32)
SMALL = dict(sliding_window=5, **ATTN, **IDS)
# Vision towers of the multimodal models, as small as they build (images are not analysed).
GEMMA_VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
TINY_VISION = dict(**GEMMA_VISION, image_size=28, patch_size=14)
LLAMA4_VISION = dict(
    **TINY_VISION, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32, pixel_shuffle_ratio=0.5
)
QWEN_VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32)
MROPE = dict(rope_type="default", mrope_section=[1, 1, 2], rope_theta=10000.0)  # Qwen-VL's positions


def windowed_hybrid(first: str) -> list[str]:
    """Layer types of a three-layer hybrid: ``first``, then a windowed and a full attention layer."""
    return [first, "sliding_attention", "full_attention"]


BLT_LAYERS = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64)
BLT_LOCAL = dict(num_hidden_layers=2, cross_attn_k=2, hidden_size_global=48, vocab_size=VOCAB, **BLT_LAYERS)


def _configs():
    from test_adapters import CONFIGS as ADAPTER_CONFIGS
    from test_adapters import DELTA

    gemma3_text = tf.Gemma3TextConfig(
        num_hidden_layers=2,
        head_dim=8,
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention"],
        **ATTN,
        **IDS,
    )
    # Gemma 4: layers 2 and 3 make no K, V of their own and read those of layers 0 and 1 (the
    # last of each layer type before them); full-attention layers have keys as values.
    gemma4_only = ("global_head_dim", "attention_k_eq_v", "num_global_key_value_heads")
    gemma4 = dict(
        num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention"] * 2,
        sliding_window=5,
        num_kv_shared_layers=2,
        head_dim=8,
        global_head_dim=16,
        attention_k_eq_v=True,
        num_global_key_value_heads=1,
        **ATTN,
        **IDS,
    )
    gemma4_text = tf.Gemma4TextConfig(**gemma4)
    gemma3n_text = tf.Gemma3nTextConfig(  # Gemma 4's attention, in AltUp / Laurel layers
        **{k: v for k, v in gemma4.items() if k not in gemma4_only},
        vocab_size_per_layer_input=VOCAB,
        hidden_size_per_layer_input=8,
        laurel_rank=4,
        altup_num_inputs=2,
        activation_sparsity_pattern=[0.0] * 4,
    )
    gemma4_unified_text = tf.Gemma4UnifiedTextConfig(**gemma4)
    llama4_text = tf.Llama4TextConfig(
        num_hidden_layers=2,
        head_dim=8,
        attention_chunk_size=6,
        no_rope_layers=[1, 0],
        num_local_experts=2,
        intermediate_size_mlp=64,
        **ATTN,
        **IDS,
    )
    qwen_hybrid = dict(  # Gated DeltaNet, then gated attention; routed and shared experts
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        head_dim=8,
        shared_expert_intermediate_size=16,
        **DELTA,
        **MOE,
        **ATTN,
        **IDS,
    )
    qwen3_5_moe_text = tf.Qwen3_5MoeTextConfig(**qwen_hybrid)
    # Qwen4-Exp: layer 1's indexer keeps SPARSE_TOP keys from blocks of 2, plus the last
    # incomplete block, so its selection is live at LENGTH.
    qwen4_exp_text = tf.AutoConfig.for_model(  # its "full_attention" layers are "indexed_attention"
        "qwen4_exp_text",
        indexer_n_heads=2,
        indexer_kv_heads=1,
        indexer_head_dim=8,
        indexer_budget=SPARSE_TOP,
        indexer_compress_ratio=QWEN4_BLOCK,
        hc_count=2,  # residual streams
        hc_lowrank=4,
        **qwen_hybrid,
    )
    # GLM-5.3-Flash: KDA, then latent attention over the keys of the pools of GLM5_POOL its
    # indexer selects (SPARSE_TOP keys) plus the incomplete last pool; layer 2 reuses layer 1's
    # selection ("shared").
    glm5_next_text = tf.AutoConfig.for_model(
        "glm5_next_text",
        num_hidden_layers=3,
        layer_types=["linear_attention", "indexed_attention", "indexed_attention"],
        indexer_types=["full", "full", "shared"],
        linear_num_heads=4,
        linear_head_dim=8,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        v_head_dim=6,
        index_topk=SPARSE_TOP,
        index_kpool=GLM5_POOL,
        index_n_heads=2,
        index_head_dim=8,
        hc_mult=2,  # residual streams
        **{**ATTN, "num_key_value_heads": 4},
        **IDS,
    )
    return {
        "qwen3": tf.Qwen3Config(num_hidden_layers=2, head_dim=8, **ATTN, **IDS),
        "qwen3_moe": tf.Qwen3MoeConfig(num_hidden_layers=2, head_dim=8, **MOE, **ATTN, **IDS),
        "gemma2": tf.Gemma2Config(
            num_hidden_layers=2, head_dim=8, sliding_window=5, attn_logit_softcapping=2.0, **ATTN, **IDS
        ),
        "gemma3_text": gemma3_text,
        # The multimodal classes (MODEL_BUILDERS): their language model is analysed, here the
        # text models of gemma3_text above and of qwen3_5_text in tests/test_adapters.py.
        "gemma3": tf.Gemma3Config(
            text_config={**gemma3_text.to_dict(), "max_position_embeddings": 256},
            vision_config=GEMMA_VISION,
            mm_tokens_per_image=4,
        ),
        "qwen3_5": tf.Qwen3_5Config(text_config=ADAPTER_CONFIGS["qwen3_5_text"].to_dict(), vision_config=QWEN_VISION),
        "gemma4_text": gemma4_text,
        "gemma4_unified_text": gemma4_unified_text,
        **{
            name: config_class(text_config=text.to_dict(), vision_config=GEMMA_VISION, audio_config=None)
            for name, config_class, text in (
                ("gemma4", tf.Gemma4Config, gemma4_text),
                ("gemma4_unified", tf.Gemma4UnifiedConfig, gemma4_unified_text),
            )
        },
        "gemma3n_text": gemma3n_text,
        "qwen3_5_moe_text": qwen3_5_moe_text,
        "qwen3_5_moe": tf.Qwen3_5MoeConfig(text_config=qwen3_5_moe_text.to_dict(), vision_config=QWEN_VISION),
        "qwen4_exp_text": qwen4_exp_text,
        "qwen4_exp": tf.AutoConfig.for_model(
            "qwen4_exp", text_config=qwen4_exp_text.to_dict(), vision_config=QWEN_VISION
        ),
        "glm5_next_text": glm5_next_text,
        "glm5_next": _shrunk_vision_language("glm5_next", glm5_next_text),
        # LFM3: attention with a sigmoid output gate per head (g_proj), or none
        "lfm3": tf.AutoConfig.for_model(
            "lfm3", num_hidden_layers=3, layer_types=windowed_hybrid("conv"), head_dim=8, **SMALL
        ),
        "lfm3_ungated": tf.AutoConfig.for_model(
            "lfm3", num_hidden_layers=3, layer_types=windowed_hybrid("conv"), use_attention_gate=False, **SMALL
        ),
        "lara_mini": tf.AutoConfig.for_model(
            "lara_mini",
            num_hidden_layers=3,
            layer_types=windowed_hybrid("linear_attention"),
            head_dim=8,
            shared_expert_intermediate_size=16,
            **DELTA,
            **MOE,
            **SMALL,
        ),
        "longcat_flash": tf.AutoConfig.for_model(  # two latent-attention blocks per layer
            "longcat_flash",
            num_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            ffn_hidden_size=64,
            q_lora_rank=16,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=4,
            head_dim=4,
            v_head_dim=6,
            moe_topk=2,  # transformers 5.24 fails at 1 (its expert loop squeezes the top-k axis)
            n_routed_experts=2,
            zero_expert_num=1,
            expert_ffn_hidden_size=16,
            **IDS,
        ),
        "phi3": tf.Phi3Config(num_hidden_layers=2, **ATTN, **IDS),
        "olmo2": tf.Olmo2Config(num_hidden_layers=2, **ATTN, **IDS),
        "granite": tf.GraniteConfig(num_hidden_layers=2, **ATTN, **IDS),
        "llama4_text": llama4_text,
        "llama4": tf.Llama4Config(text_config=llama4_text.to_dict(), vision_config=LLAMA4_VISION),
        "falcon": tf.FalconConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, **IDS),
        "lfm2_moe": tf.Lfm2MoeConfig(
            num_hidden_layers=2,
            layer_types=["conv", "full_attention"],
            num_dense_layers=1,
            num_experts=2,
            num_experts_per_tok=1,
            moe_intermediate_size=32,
            **ATTN,
            **IDS,
        ),
        "falcon_h1": tf.FalconH1Config(
            num_hidden_layers=2,
            mamba_d_ssm=64,
            mamba_n_heads=4,
            mamba_d_state=4,
            mamba_chunk_size=8,
            mamba_expand=2,
            **ATTN,
            **IDS,
        ),
        "granitemoehybrid": tf.GraniteMoeHybridConfig(
            num_hidden_layers=2,
            layer_types=["mamba", "attention"],
            mamba_n_heads=4,
            mamba_d_head=16,
            mamba_n_groups=1,
            mamba_d_state=4,
            mamba_chunk_size=8,
            num_local_experts=2,
            num_experts_per_tok=1,
            **ATTN,
            **IDS,
        ),
        "nemotron_h": tf.NemotronHConfig(
            layers_block_type=["mamba", "mlp", "attention", "moe"],
            mamba_num_heads=4,
            mamba_head_dim=16,
            n_groups=1,
            ssm_state_size=4,
            chunk_size=8,
            n_routed_experts=2,
            num_experts_per_tok=1,
            moe_intermediate_size=32,
            moe_shared_expert_intermediate_size=32,
            **ATTN,
            **IDS,
        ),
        # DiffLlama: query heads in pairs over one pair of KV heads' values (8 heads, 4 KV heads)
        "diffllama": tf.DiffLlamaConfig(
            **{**LM, "hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 4}
        ),
        "zamba": tf.ZambaConfig(
            num_hidden_layers=3,
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=4,
            mamba_d_state=4,
            n_mamba_heads=2,
            layers_block_type=["mamba", "hybrid", "hybrid"],
            **IDS,
        ),
        "recurrent_gemma": tf.RecurrentGemmaConfig(
            num_hidden_layers=2,
            hidden_size=32,
            lru_width=32,
            num_attention_heads=4,
            num_key_value_heads=1,
            intermediate_size=64,
            attention_window_size=5,
            block_types=["recurrent", "attention"],
            **IDS,
        ),
        "minimax": tf.MiniMaxConfig(
            num_hidden_layers=2,
            layer_types=["linear_attention", "full_attention"],
            head_dim=8,
            block_size=6,
            num_local_experts=2,
            num_experts_per_tok=1,
            **ATTN,
            **IDS,
        ),
        "rwkv": tf.RwkvConfig(
            num_hidden_layers=2, hidden_size=32, attention_hidden_size=32, intermediate_size=64, **IDS
        ),
        # BLT: local encoder and decoder over the bytes (window WINDOW), a global transformer over
        # patches of them between (skipped), patches from a one-layer entropy model
        "blt": tf.BltConfig(
            patch_size=4,
            local_attention_window_len=WINDOW,
            encoder_hash_byte_group_vocab=97,
            encoder_hash_byte_group_size=[3, 4],
            patcher_config=dict(num_hidden_layers=1, vocab_size=VOCAB, **BLT_LAYERS),
            encoder_config=BLT_LOCAL,
            decoder_config=BLT_LOCAL,
            global_config=dict(num_hidden_layers=2, **{**BLT_LAYERS, "hidden_size": 48}),
            vocab_size=VOCAB,
        ),
        "xlstm": tf.xLSTMConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_heads=2,
            qk_dim_factor=1.0,
            v_dim_factor=1.0,
            chunk_size=64,
            vocab_size=VOCAB,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
        ),
    }


WINDOW = 5


def in_transformers(model_type: str) -> bool:
    return model_type in tf.models.auto.configuration_auto.CONFIG_MAPPING_NAMES


SPARSE_TOP = 4  # keys a sparse-attention query keeps
QWEN4_BLOCK = 2  # tokens per key block of the Qwen4-Exp indexer (its compress ratio)
GLM5_POOL = 2  # keys per pool of the GLM-5.3-Flash indexer (index_kpool)
# The softmax-attention decoder LMs beyond those above (tests/test_attention_models.py checks
# their windows, fused projections and latent caches): 2 layers each.
LM = dict(num_hidden_layers=2, **ATTN, **IDS)
EXPERTS = dict(num_local_experts=2, num_experts_per_tok=1)
ROUTED = dict(n_routed_experts=2, num_experts_per_tok=1, moe_intermediate_size=16)  # DeepSeek-style routed experts
SLIDING = dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])
# Model types that transformers 5.25 added (the tested range starts at 5.24): their configs are
# built, and their tests run, where the installed transformers has them.
NEWER = {
    "param2moe": lambda: tf.AutoConfig.for_model("param2moe", **ROUTED, **LM),  # GLM-4 MoE's classes
    "ergo": lambda: tf.AutoConfig.for_model("ergo", moe_intermediate_size=16, **EXPERTS, **SLIDING, **LM),
    "minicpm5_moe": lambda: tf.AutoConfig.for_model("minicpm5_moe", head_dim=8, **ROUTED, **LM),  # gated heads
    "llava_onevision1_5": lambda: tf.AutoConfig.for_model(
        "llava_onevision1_5",
        text_config=tf.AutoConfig.for_model("qwen3", head_dim=8, **LM).to_dict(),
        vision_config=QWEN_VISION,
    ),
    "ovis2_5": lambda: _shrunk_vision_language("ovis2_5", tf.AutoConfig.for_model("qwen3", head_dim=8, **LM)),
    # Kolibri 1.1: a windowed layer, then two indexed layers, the second reading the first's K and V;
    # a query keeps SPARSE_TOP keys (2 chosen, 1 sink, 1 local) from a pool of 4 blocks of 2
    "kolibri1_1": lambda: tf.AutoConfig.for_model(
        "kolibri1_1",
        layer_types=["sliding_attention", "indexed_attention", "indexed_attention"],
        sliding_window=WINDOW,
        kv_source_layers=[0, 1, 1],
        index_layers=[1],
        index_topk=SPARSE_TOP - 2,
        index_num_sink_tokens=1,
        index_num_local_tokens=1,
        index_pool_size=8,
        index_compression=2,
        index_num_heads=2,
        head_dim=16,  # NVFP4 rounds blocks of 16 values
        **{**LM, "num_hidden_layers": 3},
    ),
}
NEWER_TYPES = tuple(NEWER)
# Cohere Compass's language model: Qwen3-VL's positions, a window on its "sliding_attention" layer
# and no RoPE on its full-attention layer.
COMPASS_TEXT = tf.AutoConfig.for_model(
    "cohere_compass_text", rope_parameters={"sliding_attention": MROPE, "full_attention": None}, **SLIDING, **LM
)
# Phi-4-multimodal's image and audio embedders, as small as they build (not analysed).
PHI4_TOWERS = dict(
    vision_config=dict(TINY_VISION, crop_size=28),
    audio_config=dict(
        GEMMA_VISION,
        num_blocks=1,
        ext_pw_out_channel=16,
        depthwise_separable_out_channel=16,
        nemo_conv_channels=16,
        input_size=8,
    ),
)
# The audio towers of Qwen2.5-Omni's and Qwen3-Omni's thinkers, as small as they build (not analysed).
OMNI_AUDIO = dict(encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, d_model=16, output_dim=32)
# Their thinkers: Qwen2.5-Omni's language model windowed on its "sliding_attention" layer (Qwen2's
# windows), Qwen3-Omni's with experts.
OMNI_THINKERS = dict(
    qwen2_5_omni_thinker=dict(
        text_config=dict(LM, rope_parameters=MROPE, use_sliding_window=True, **SLIDING),
        vision_config=dict(QWEN_VISION, fullatt_block_indexes=[0]),
        audio_config=OMNI_AUDIO,
    ),
    qwen3_omni_moe_thinker=dict(
        text_config=dict(LM, head_dim=8, rope_parameters=MROPE, **{**MOE, "moe_intermediate_size": 16}),
        vision_config=dict(QWEN_VISION, deepstack_visual_indexes=[]),
        audio_config=dict(OMNI_AUDIO, downsample_hidden_size=8),
    ),
)
# Speech and audio LMs: a language model of any supported type at model.language_model, after an
# audio tower, and its projector, as small as they build (not analysed). Qwen2-Audio's Qwen2 is
# windowed on its "sliding_attention" layer (Qwen2's windows), Granite Speech's Granite scaled by
# attention_multiplier, Granite Speech Plus's by all its multipliers (their LoRA adapters, for
# audio prompts, not built); VibeVoice-ASR around Qwen2, MOSS-Transcribe-Diarize around Qwen3.
VIBEVOICE_TOKENIZER = dict(hidden_size=8, num_filters=4, downsampling_ratios=[2], depths=[1, 1])
SPEECH_LMS = dict(
    qwen2_audio=dict(
        text_config=dict(LM, use_sliding_window=True, **SLIDING),
        audio_config=dict(encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, d_model=16),
    ),
    voxtral=dict(text_config=dict(LM, head_dim=8), audio_config=GEMMA_VISION),
    granite_speech=dict(
        text_config=tf.AutoConfig.for_model("granite", attention_multiplier=0.25, **LM).to_dict(),
        encoder_config=dict(num_layers=1, hidden_dim=16, num_heads=2, dim_head=8),
        projector_config=dict(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, encoder_hidden_size=16
        ),
        has_lora_adapter=False,
    ),
    glmasr=dict(text_config=LM, audio_config=dict(GEMMA_VISION, num_key_value_heads=2)),
    qwen3_asr=dict(text_config=dict(LM, head_dim=8), audio_config=dict(OMNI_AUDIO, downsample_hidden_size=8)),
    fun_asr_nano=dict(  # its adaptor as wide as the language model, with a quarter as many channels inside
        text_config=LM,
        audio_config=dict(GEMMA_VISION, num_timestamp_prediction_layers=1),
        adaptor_config=dict(
            hidden_size=32, intermediate_size=8, num_attention_heads=2, num_hidden_layers=1, projector_hidden_size=16
        ),
    ),
    omniasr=dict(
        text_config=LM,
        audio_config=dict(
            GEMMA_VISION,
            conv_dim=[8],
            conv_kernel=[10],
            conv_stride=[5],
            num_conv_pos_embeddings=4,
            num_conv_pos_embedding_groups=2,
        ),
    ),
    vibevoice_asr=dict(
        text_config=dict(LM, model_type="qwen2"),
        acoustic_tokenizer_encoder_config=VIBEVOICE_TOKENIZER,
        semantic_tokenizer_encoder_config=VIBEVOICE_TOKENIZER,
    ),
    moss_transcribe_diarize=dict(
        text_config=dict(LM, model_type="qwen3", head_dim=8),
        audio_config=dict(GEMMA_VISION, num_mel_bins=8, max_source_positions=16),
    ),
    granite_speech_plus=dict(
        text_config=dict(
            LM, model_type="granite", attention_multiplier=0.25, residual_multiplier=0.5, embedding_multiplier=2.0
        ),
        encoder_config=dict(
            input_dim=8, num_layers=1, hidden_dim=16, num_heads=2, dim_head=8, output_dim=8, context_size=4
        ),
        projector_config=dict(GEMMA_VISION, encoder_hidden_size=16),
        has_lora_adapter=False,
    ),
)
# Evolla, a protein-text model, and its protein encoder, whose features its adapters cross-attend
# to (a text prompt has none).
EVOLLA = dict(
    protein_encoder_config=GEMMA_VISION,
    resampler_depth=1,
    resampler_dim_head=8,
    resampler_heads=2,
    resampler_num_latents=4,
    aligner_num_add_layers=1,
    **LM,
)
# Nemotron 3.5 Transcribe's speech-recognition, diarization and word-timestamp towers (not analysed).
NEMO_ENCODER = dict(GEMMA_VISION, num_key_value_heads=2, num_mel_bins=8)
NEMO_TOWERS = dict(
    audio_config=dict(
        asr_config=NEMO_ENCODER,
        diarization_config=dict(audio_config=NEMO_ENCODER, head_config=dict(hidden_size=8, audio_hidden_size=16)),
    ),
    word_timestamp_config=dict(GEMMA_VISION, num_key_value_heads=2, vocab_size=8, blank_token_id=7),
)
# Muse Glimmer's language model (Muse Spark's is built on it): a window on its "sliding_attention"
# layer, no RoPE on its full-attention layer; and the projection widths of both.
MUSE_TEXT = dict(**SLIDING, layer_rope_theta=[10000.0, 0], head_dim=8, **LM)
MUSE_PROJECTIONS = dict(out_hidden_size=32, projector_hidden_size=32)
MLA = dict(
    **{**LM, "num_key_value_heads": 4},
    **ROUTED,
    first_k_dense_replace=1,
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=6,
)


# Dots 3 Note's windowed layers: latent heads of their own sizes.
DOTS_SLIDING = dict(
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=8,
    q_lora_rank=8,
    qk_nope_head_dim=4,
    qk_rope_head_dim=4,
    v_head_dim=4,
    head_dim=8,
)


# The sizes a vision-language model's default vision tower is shrunk to, whichever of these
# keys its config has (images are not analysed).
SHRUNK_VISION = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    depth=1,
    num_attention_heads=2,
    num_heads=2,
    num_key_value_heads=2,
    embed_dim=16,
    out_hidden_size=32,
)


def _shrunk_vision_language(model_type: str, text, **kwargs):
    vision = tf.AutoConfig.for_model(model_type).vision_config.to_dict()
    shrunk = {key: SHRUNK_VISION.get(key, value) for key, value in vision.items()}
    if isinstance(vision.get("layer_types"), list):  # one layer, one type
        shrunk["layer_types"] = vision["layer_types"][:1]
    return tf.AutoConfig.for_model(model_type, text_config=text.to_dict(), vision_config=shrunk, **kwargs)


MLLAMA_TEXT = tf.AutoConfig.for_model("mllama_text_model", cross_attention_layers=[1], **{**LM, "num_hidden_layers": 3})
MLLAMA_VISION = dict(
    hidden_size=16,
    num_hidden_layers=1,
    num_global_layers=1,
    intermediate_size=32,
    attention_heads=2,
    image_size=28,
    patch_size=14,
    vision_output_dim=32,
    intermediate_layers_indices=[0],
)

# Inkling: a short conv on V before the attention, and a relative-position bias from each token
# that reaches rel_extent keys back (fewer than LENGTH, so its cut-off is live).
INKLING_TEXT = tf.AutoConfig.for_model(
    "inkling_text",
    layer_types=["hybrid_sliding", "hybrid"],
    sliding_window=WINDOW,
    rel_extent=WINDOW + 3,
    d_rel=4,
    log_scaling_n_floor=4,  # the full layer's queries and bias grow with log t past 4 tokens
    head_dim=8,
    swa_num_attention_heads=4,
    swa_num_key_value_heads=2,
    swa_head_dim=8,
    n_shared_experts=1,
    **ROUTED,
    **LM,
)
INKLING_TOWERS = dict(  # its vision and audio towers, as small as they build
    vision_config=dict(text_hidden_size=32, hidden_size=16, n_layers=1, num_attention_heads=2, patch_size=14),
    audio_config=dict(text_hidden_size=32, n_mel_bins=8, mel_vocab_size=8),
)

# Inkling 2: Inkling's windows and bias, with V through a short conv (a per-token one in the full
# layers) and a norm inside v_proj, a sigmoid gate inside o_proj, and a sink per head and token.
INKLING2_TEXT = dict(
    layer_types=["hybrid_sliding", "hybrid"],
    sliding_window=WINDOW,
    rel_extent=WINDOW + 3,
    d_rel=4,
    log_scaling_n_floor=4,
    head_dim=8,
    swa_num_attention_heads=4,
    swa_num_key_value_heads=2,
    swa_head_dim=8,
    unpadded_vocab_size=VOCAB,
    **ROUTED,
    **LM,
)
# Inkling 2 Loop: layers 1 and 2 (windowed, full) run twice, between layers 0 and 3.
INKLING2_LOOP_TEXT = dict(
    INKLING2_TEXT,
    num_hidden_layers=4,
    layer_types=["hybrid_sliding", "hybrid_sliding", "hybrid", "hybrid_sliding"],
    n_layers_per_attn_res_block=1,
    loop_layer_index_start=1,
    loop_layer_index_end=3,
    loop_num_passes=2,
    loop_gate_rank=4,
)
INKLING2_VISION = dict(text_hidden_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, patch_size=14)


# The SAM encoder of DeepSeek-OCR 2 and Unlimited-OCR, as small as it builds.
OCR_SAM = dict(
    **GEMMA_VISION,
    output_channels=8,
    image_size=64,
    patch_size=16,
    window_size=2,
    downsample_channels=[8, 16],
    global_attn_indexes=[0],
    mlp_dim=16,
)


# Chameleon's and Emu3's image tokenizer, a VQ-GAN, as small as it builds (images are not analysed).
TINY_VQ = dict(base_channels=32, channel_multiplier=[1], num_res_blocks=1, attn_resolutions=[], num_attention_heads=1)


def _image_vocabulary(token_name) -> dict:
    """A vocabulary map with an image token and 16 image-code tokens (ids 40-55) named by ``token_name(i)``."""
    return {"<image>": VOCAB - 1, **{token_name(i): 40 + i for i in range(16)}}


# Their own sizes where a type has more than BERT's; BigBird decodes only with full attention.
BERT_DECODERS = {
    **dict.fromkeys(("bert", "bert-generation", "megatron-bert", "roberta", "camembert", "xlm-roberta"), {}),
    **dict.fromkeys(("xlm-roberta-xl", "roberta-prelayernorm", "data2vec-text", "ernie"), {}),
    "big_bird": dict(attention_type="original_full"),
    "electra": dict(embedding_size=16),
    "rembert": dict(input_embedding_size=16, output_embedding_size=16),
    "roformer": dict(embedding_size=32),
    "roc_bert": dict(pronunciation_vocab_size=8, pronunciation_embed_dim=8, shape_vocab_size=8, shape_embed_dim=8),
}


def _attention_configs():
    plain = (
        "gemma",
        "phi",
        "olmo",
        "olmoe",
        "granitemoe",
        "cohere",
        "smollm3",
        "glm",
        "glm4",
        "stablelm",
        "seed_oss",
        "arcee",
        "apertus",
        "nemotron",
        "ernie4_5",
        "nanochat",
        "apertus1p5_text",
        "hyperclovax",
        "jais2",
        "xglm",
        "aria_text",
        "exaone",  # these three: transformers builds them with Llama's classes
        "internlm3",
        "iquestcoder",
    )
    configs = {name: tf.AutoConfig.for_model(name, **LM) for name in plain}
    # Mixtures of experts, cut to two experts (their defaults build 3-38M parameters).
    experts = {
        "flex_olmo": dict(num_experts=2, num_experts_per_tok=1),
        "hy_v3": dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16),
        "minimax_m2": EXPERTS,
        "solar_open": ROUTED,
        "sarvam_moe": ROUTED,  # GLM-4 MoE's
    }
    configs.update({name: tf.AutoConfig.for_model(name, **kwargs, **LM) for name, kwargs in experts.items()})
    sliding_experts = {
        "cohere2_moe": {},
        "exaone_moe": dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16),
        "kolibri1": dict(num_local_experts=2, num_experts_per_tok=1, moe_intermediate_size=16),
        "mellum": dict(num_local_experts=2, num_experts_per_tok=1, moe_intermediate_size=16),
        "flint": {},
        "dots1": dict(ROUTED, n_shared_experts=1),
        "afmoe": dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16),  # gate_proj output gate
    }
    configs.update(
        {name: tf.AutoConfig.for_model(name, **kwargs, **SLIDING, **LM) for name, kwargs in sliding_experts.items()}
    )
    # Multi-head latent attention (DeepSeek's, in GLM-4.7-Flash, MiniCPM3, Youtu, Sarvam); the
    # sparse ones' indexers keep SPARSE_TOP of the keys, so their selection is live at LENGTH.
    latent = ("glm4_moe_lite", "minicpm3", "youtu", "sarvam_mla")
    configs.update({name: tf.AutoConfig.for_model(name, n_group=1, topk_group=1, **MLA) for name in latent})
    sparse = dict(index_topk=SPARSE_TOP, index_n_heads=2, index_head_dim=8, n_group=1, topk_group=1)
    configs.update({name: tf.AutoConfig.for_model(name, **sparse, **MLA) for name in ("deepseek_v32", "glm_moe_dsa")})
    configs["axk2"] = tf.AutoConfig.for_model(  # the indexer's selection and a sigmoid output gate
        "axk2",
        **sparse,
        mlp_layer_types=["dense", "sparse"],
        layer_types=["indexed_attention"] * 2,
        **{key: value for key, value in MLA.items() if key != "first_k_dense_replace"},
    )
    configs["axk1"] = tf.AutoConfig.for_model(
        "axk1", n_group=1, topk_group=1, mlp_layer_types=["dense", "sparse"], **MLA
    )
    # Dots 3 Note: latent heads gated per head by g_proj; a windowed layer with narrower heads of
    # its own ("swa_" sizes), then a layer over the keys its indexer selects.
    latent = {key: value for key, value in MLA.items() if key != "first_k_dense_replace"}
    configs["dots3_note_text"] = tf.AutoConfig.for_model(
        "dots3_note_text",
        **sparse,
        **latent,
        layer_types=["sliding_attention", "indexed_attention"],
        sliding_window=WINDOW,
        head_dim=12,
        n_shared_experts=1,
        shared_experts_intermediate_size=16,
        **{f"swa_{key}": value for key, value in DOTS_SLIDING.items()},
    )
    configs["dots3_note"] = tf.AutoConfig.for_model(  # its vision and audio towers, as small as they build
        "dots3_note",
        text_config=configs["dots3_note_text"].to_dict(),
        vision_config=dict(
            GEMMA_VISION, moe_intermediate_size=16, adapter_in_dim=16, adapter_out_dim=32, mlp_layer_types=["dense"]
        ),
        audio_config=dict(
            {**GEMMA_VISION, "num_key_value_heads": 2, "head_dim": 8},
            feature_size=8,
            downsample_hidden_size=8,
            adapter_input_size=16,
            adapter_out_dim=32,
            conv_output_size=16,
        ),
    )
    # AFMoE-like gated heads: Laguna's softplus gate, one per head (its layers with heads of their
    # own number) or per channel; Beam's sigmoid gate plus a bias per head; Dory's scaled by s_gate
    # with the L2 norm of all its heads after it, and its middle layer run twice (two loops).
    laguna = dict(head_dim=8, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16, **SLIDING, **LM)
    laguna["shared_expert_intermediate_size"] = 16
    configs["laguna"] = tf.AutoConfig.for_model("laguna", num_attention_heads_per_layer=[4, 6], **laguna)
    configs["laguna_per_element"] = tf.AutoConfig.for_model("laguna", gating="per-element", **laguna)
    configs["beam"] = tf.AutoConfig.for_model("beam", head_dim=8, **SLIDING, **LM)
    configs["dory"] = tf.AutoConfig.for_model(
        "dory",
        head_dim=8,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        n_input_layers=1,
        n_recurrent_layers=1,
        n_output_layers=1,
        n_recurrent_loops=2,
        **{**LM, "num_hidden_layers": 3},
    )
    # HY V4: latent heads with learned sinks and a sigmoid gate per channel (gate_proj), two residual
    # streams (iHC) around each layer; layer 0's indexer keeps SPARSE_TOP keys, "shared" layer 1 reuses them.
    hy_v4 = dict(**sparse, **latent, mlp_layer_types=["dense", "sparse"], indexer_types=["full", "shared"], hc_mult=2)
    configs["hy_v4"] = tf.AutoConfig.for_model("hy_v4", **hy_v4)
    configs["hy_v4_vl"] = tf.AutoConfig.for_model(  # its text model's positions: three sections of the rotary key
        "hy_v4_vl",
        text_config=tf.AutoConfig.for_model(
            "hy_v4_vl_text", rope_parameters=dict(MROPE, mrope_section=[1, 1, 0]), **hy_v4
        ).to_dict(),
        vision_config=dict(GEMMA_VISION, out_hidden_size=32, max_image_size=32),
    )
    configs.update(
        {
            "qwen2_moe": tf.Qwen2MoeConfig(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16, **LM),
            "mixtral": tf.MixtralConfig(sliding_window=WINDOW, **EXPERTS, **LM),  # the window on every layer
            "phimoe": tf.PhimoeConfig(sliding_window=None, **EXPERTS, **LM),
            "starcoder2": tf.Starcoder2Config(sliding_window=WINDOW, **LM),
            "ministral": tf.MinistralConfig(head_dim=8, **SLIDING, **LM),
            "ministral3": tf.Ministral3Config(sliding_window=WINDOW, **LM),  # the window on every layer
            # Layer 0 attends to the key blocks (of 2) its indexer picks: SPARSE_TOP of them.
            "minimax_m3_vl_text": tf.AutoConfig.for_model(
                "minimax_m3_vl_text",
                layer_types=["minimax_m3_sparse", "full_attention"],
                index_block_size=2,
                index_n_heads=2,
                index_topk_blocks=SPARSE_TOP // 2,
                index_local_blocks=1,
                head_dim=8,
                **EXPERTS,
                **LM,
            ),
            "cohere2": tf.Cohere2Config(**SLIDING, **LM),
            "olmo3": tf.Olmo3Config(**SLIDING, **LM),
            "vaultgemma": tf.VaultGemmaConfig(**SLIDING, **LM),
            "exaone4": tf.Exaone4Config(**SLIDING, **LM),
            "gpt_oss": tf.GptOssConfig(head_dim=8, **SLIDING, **EXPERTS, **LM),  # attention sinks
            "helium": tf.HeliumConfig(head_dim=8, **LM),
            "hunyuan_v1_dense": tf.HunYuanDenseV1Config(head_dim=8, **LM),
            "hunyuan_v1_moe": tf.HunYuanMoEV1Config(head_dim=8, num_experts=2, moe_topk=1, **LM),
            "ernie4_5_moe": tf.Ernie4_5_MoeConfig(moe_num_experts=2, moe_k=1, moe_intermediate_size=16, **LM),
            "glm4_moe": tf.Glm4MoeConfig(**ROUTED, n_group=1, topk_group=1, **LM),
            "granitemoeshared": tf.GraniteMoeSharedConfig(**EXPERTS, **LM),
            "cwm": tf.CwmConfig(head_dim=8, **SLIDING, **LM),
            "persimmon": tf.PersimmonConfig(**{**LM, "num_key_value_heads": 4}),  # per head [q | k | v]
            "opt": tf.OPTConfig(num_hidden_layers=2, hidden_size=32, ffn_dim=64, num_attention_heads=4, **IDS),
            "gpt_neox": tf.GPTNeoXConfig(**{**LM, "num_key_value_heads": 4}),  # Pythia; per head [q | k | v]
            "bloom": tf.BloomConfig(n_layer=2, hidden_size=32, n_head=4, **IDS),  # ALiBi; per head [q | k | v]
            "gptj": tf.GPTJConfig(n_layer=2, n_embd=32, n_head=4, rotary_dim=4, **IDS),
            # [q | v | k] in each of 4 model-parallel shards of qkv_proj (8 columns each)
            "codegen": tf.CodeGenConfig(n_layer=2, n_embd=32, n_head=4, rotary_dim=4, **IDS),
            # ALiBi, fused Wqkv clamped to +-0.05: most entries of this random model's V are clamped
            "mpt": tf.MptConfig(n_layers=2, d_model=32, n_heads=4, attn_config={"clip_qkv": 0.05}, **IDS),
            "biogpt": tf.BioGptConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, **IDS),
            "dbrx": tf.DbrxConfig(  # the same clamp, 2 KV heads
                d_model=32,
                n_heads=4,
                n_layers=2,
                attn_config={"kv_n_heads": 2, "clip_qkv": 0.05, "rope_theta": 10000.0},
                ffn_config={"moe_num_experts": 2, "moe_top_k": 1, "ffn_hidden_size": 32},
                **IDS,
            ),
            "gpt_bigcode": tf.GPTBigCodeConfig(n_layer=2, n_embd=32, n_head=4, multi_query=True, **IDS),
            # GPT-1: fused c_attn [q | k | v], probabilities only when output_attentions is passed
            "openai-gpt": tf.OpenAIGPTConfig(n_layer=2, n_embd=32, n_head=4, **IDS),
            "ctrl": tf.CTRLConfig(n_layer=2, n_embd=32, n_head=4, dff=64, **IDS),  # Wq, Wk, Wv, dense
            # GIT: BERT's layout (query, key, value; the heads' outputs projected after the module),
            # on a text prompt: no image tokens
            "git": tf.GitConfig(
                num_hidden_layers=2,
                hidden_size=32,
                num_attention_heads=4,
                intermediate_size=64,
                vision_config=TINY_VISION,
                **IDS,
            ),
            # BERT's family as decoders (config.is_decoder, as their causal-LM classes are built): BERT's layout
            **{
                name: tf.AutoConfig.for_model(
                    name,
                    is_decoder=True,
                    num_hidden_layers=2,
                    hidden_size=32,
                    num_attention_heads=4,
                    intermediate_size=64,
                    **extra,
                    **IDS,
                )
                for name, extra in BERT_DECODERS.items()
            },
            # XLM as its causal checkpoints are configured, of one language: q_lin, k_lin, v_lin, out_lin
            "xlm": tf.XLMConfig(causal=True, emb_dim=32, n_layers=2, n_heads=4, **IDS),
            "gpt_neox_japanese": tf.GPTNeoXJapaneseConfig(**{**LM, "num_key_value_heads": 4}),  # per head [q | k | v]
            # ModernBERT's decoder: window local_attention // 2 on its "sliding_attention" layers, out through Wo
            "modernbert-decoder": tf.AutoConfig.for_model(
                "modernbert-decoder",
                local_attention=2 * WINDOW,
                layer_types=["sliding_attention", "full_attention"],
                **LM,
            ),
            # ZAYA: Q and K convolved over time, half of each V head the previous token's; windowed
            # "hybrid_sliding" and full "hybrid" layers
            "zaya": tf.AutoConfig.for_model(
                "zaya",
                layer_types=["hybrid_sliding", "hybrid"],
                sliding_window=WINDOW,
                num_experts=2,
                num_experts_per_tok=1,
                moe_intermediate_size=16,
                router_hidden_size=16,
                head_dim=8,
                **LM,
            ),
            "inkling_text": INKLING_TEXT,
            "inkling_mm_model": tf.AutoConfig.for_model(
                "inkling_mm_model", text_config=INKLING_TEXT.to_dict(), **INKLING_TOWERS
            ),
            "inkling2_text": tf.AutoConfig.for_model("inkling2_text", **INKLING2_TEXT),
            "inkling2": tf.AutoConfig.for_model(
                "inkling2", text_config=dict(model_type="inkling2_text", **INKLING2_TEXT), vision_config=INKLING2_VISION
            ),
            "inkling2_loop_text": tf.AutoConfig.for_model("inkling2_loop_text", **INKLING2_LOOP_TEXT),
            # HRM-text: one layer per stack, its L stack twice per H cycle, two H cycles (8 calls)
            "hrm_text": tf.AutoConfig.for_model(
                "hrm_text", H_cycles=2, L_cycles=2, **{**LM, "num_hidden_layers": 1, "num_key_value_heads": 4}
            ),
            "inkling2_loop": tf.AutoConfig.for_model(
                "inkling2_loop",
                text_config=dict(model_type="inkling2_loop_text", **INKLING2_LOOP_TEXT),
                vision_config=INKLING2_VISION,
            ),
            # Doge's dynamic mask keeps the SPARSE_TOP keys of largest bias per query, so it is live here
            "doge": tf.AutoConfig.for_model("doge", keep_window_size=SPARSE_TOP, **LM),
            "gpt_bigcode_heads": tf.GPTBigCodeConfig(n_layer=2, n_embd=32, n_head=4, multi_query=False, **IDS),
            "gpt_neo": tf.GPTNeoConfig(
                num_layers=2,
                hidden_size=32,
                num_heads=4,
                attention_types=[[["global", "local"], 1]],
                window_size=WINDOW,
                **IDS,
            ),
            # Vision-language models: their language model (a text prompt), at model.language_model
            "mistral3": tf.Mistral3Config(  # Mistral's window on every layer
                text_config=tf.MistralConfig(sliding_window=WINDOW, **LM).to_dict(), vision_config=TINY_VISION
            ),
            "llava": tf.LlavaConfig(
                text_config=tf.LlamaConfig(**LM).to_dict(),
                vision_config={"model_type": "clip_vision_model", **TINY_VISION},
            ),
            "internvl": tf.InternVLConfig(
                text_config=tf.Qwen2Config(**LM).to_dict(),
                vision_config={**TINY_VISION, "image_size": [28, 28], "patch_size": [14, 14]},
            ),
            "vipllava": tf.VipLlavaConfig(
                text_config=tf.LlamaConfig(**LM).to_dict(),
                vision_config={"model_type": "clip_vision_model", **TINY_VISION},
                vision_feature_layers=[-1],
            ),
            **{  # Cohere 2's windowed and full layers
                name: config_class(
                    text_config=tf.Cohere2Config(**SLIDING, **LM).to_dict(),
                    vision_config={"model_type": "siglip_vision_model", **TINY_VISION},
                )
                for name, config_class in (
                    ("aya_vision", tf.AyaVisionConfig),
                    ("cohere2_vision", tf.Cohere2VisionConfig),
                )
            },
            **{  # the default vision tower of each, shrunk (SHRUNK_VISION)
                name: _shrunk_vision_language(name, text)
                for name, text in (
                    *((name, tf.LlamaConfig(**LM)) for name in ("llava_next", "llava_next_video", "video_llava")),
                    ("janus", tf.LlamaConfig(**LM)),
                    *((name, tf.LlamaConfig(**LM)) for name in ("deepseek_vl", "deepseek_vl_hybrid")),
                    *((name, tf.Qwen2Config(**LM)) for name in ("llava_onevision", "ovis2", "video_llama_3")),
                    ("lighton_ocr", tf.Qwen3Config(head_dim=8, **LM)),
                    ("qianfan_ocr", tf.Qwen3Config(head_dim=8, **LM)),
                    *((name, tf.Qwen2Config(**LM)) for name in ("got_ocr2", "pp_chart2table")),
                    ("idefics2", tf.MistralConfig(sliding_window=WINDOW, **LM)),  # at model.text_model
                    ("hyperclovax_vision_v2", tf.AutoConfig.for_model("hyperclovax", **LM)),
                )
            },
            # their language model at model.text_model
            # their own language model, with Qwen-VL's positions where they use them
            **{
                name: _shrunk_vision_language(
                    name,
                    tf.AutoConfig.for_model(
                        f"{name}_text" if name != "glmga" else "glm4v_text",
                        rope_parameters=dict(MROPE, partial_rotary_factor=1.0),
                        **({"head_dim": 8} if name in ("paddleocr_vl", "cosmos3_edge") else {}),
                        **LM,
                    ),
                )
                for name in ("glm_ocr", "paddleocr_vl", "cosmos3_edge", "glmga")
            },
            "granite_docling": _shrunk_vision_language(
                "granite_docling", tf.AutoConfig.for_model("granite_docling_text", **LM)
            ),  # at model.text_model
            # DeepSeek-OCR 2 and Unlimited-OCR: DeepSeek-V2's layers with Llama's attention. Unlimited-OCR's
            # "reference_sliding_attention" windows only what comes after the prompt: a prompt's T is causal.
            **{
                name: tf.AutoConfig.for_model(
                    name,
                    text_config=tf.AutoConfig.for_model(
                        f"{name}_text", mlp_layer_types=["dense", "sparse"], n_group=1, topk_group=1, **text
                    ).to_dict(),
                    vision_config=dict(sam_config=OCR_SAM, encoder_config=encoder),
                )
                for name, text, encoder in (
                    ("deepseek_ocr2", dict(ROUTED, **LM), dict(GEMMA_VISION, num_key_value_heads=2)),
                    (  # its eager attention has no grouped heads
                        "unlimited_ocr",
                        dict(ROUTED, sliding_window=WINDOW, **{**LM, "num_key_value_heads": 4}),
                        TINY_VISION,
                    ),
                )
            },
            # Llama 3.2 Vision: layer 1 cross-attends to the image (skipped on a text prompt)
            "mllama": tf.MllamaConfig(text_config=MLLAMA_TEXT.to_dict(), vision_config=MLLAMA_VISION),
            # Step 3.7: a sigmoid gate per head from g_proj, a window on its "sliding_attention" layer
            "step3p7": _shrunk_vision_language(
                "step3p7",
                tf.AutoConfig.for_model(
                    "step3p5",
                    **SLIDING,
                    mlp_layer_types=["dense", "sparse"],
                    **ROUTED,
                    share_expert_dim=16,
                    head_dim=8,
                    query_pre_attn_scalar=8,
                    **LM,
                ),
            ),
            # Muse Glimmer: a sigmoid gate per channel from gate_proj; its full-attention layer has no RoPE
            "muse_glimmer": _shrunk_vision_language(
                "muse_glimmer", tf.AutoConfig.for_model("muse_glimmer_text", **MUSE_TEXT), **MUSE_PROJECTIONS
            ),
            # Muse Spark: Muse Glimmer's heads, each divided by its RMS (o_norm) before the gate
            "muse_spark": _shrunk_vision_language(
                "muse_spark",
                tf.AutoConfig.for_model(
                    "muse_spark_text",
                    mlp_layer_types=["dense", "sparse"],
                    moe_intermediate_size=16,
                    moe_hidden_size=16,
                    **EXPERTS,
                    **MUSE_TEXT,
                ),
                **MUSE_PROJECTIONS,
                audio_config=dict(hidden_sizes=[8, 8, 8, 16], depths=[1, 1, 1, 1], out_hidden_size=32),
            ),
            # Chameleon and Emu3: images are tokens of their vocabulary (a tiny VQ-GAN maps them)
            "chameleon": tf.ChameleonConfig(
                vocabulary_map=_image_vocabulary(lambda i: f"IMGIMG{chr(65 + i)}Z"),
                vq_config=dict(TINY_VQ, embed_dim=32, num_embeddings=16, latent_channels=32, resolution=16),
                **LM,
            ),
            "emu3": tf.Emu3Config(  # its language model at model.text_model
                text_config=tf.AutoConfig.for_model("emu3_text_model", **LM).to_dict(),
                vocabulary_map=_image_vocabulary(lambda i: f"<|visual token {i:06d}|>"),
                vq_config=dict(TINY_VQ, codebook_size=16, embed_dim=4, latent_channels=4, hidden_size=32),
            ),
            "kosmos-2.5": tf.AutoConfig.for_model(  # its language model at text_model.model
                "kosmos-2.5",
                text_config=dict(embed_dim=32, layers=2, attention_heads=4, ffn_dim=64, **IDS),
                vision_config=dict(
                    hidden_size=16,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    intermediate_size=32,
                    head_dim=8,
                    patch_embed_hidden_size=48,
                ),
                latent_query_num=4,
            ),
            # Fuyu has no vision tower: image patches enter through a linear embedding
            "fuyu": tf.FuyuConfig(text_config=tf.PersimmonConfig(**{**LM, "num_key_value_heads": 4}).to_dict()),
            "idefics3": tf.Idefics3Config(text_config=tf.LlamaConfig(**LM).to_dict(), vision_config=TINY_VISION),
            "smolvlm": tf.SmolVLMConfig(text_config=tf.LlamaConfig(**LM).to_dict(), vision_config=TINY_VISION),
            "qwen2_vl": tf.Qwen2VLConfig(
                text_config=dict(LM, model_type="qwen2_vl_text", rope_parameters=MROPE),
                vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2),
            ),
            "qwen2_5_vl": tf.Qwen2_5_VLConfig(
                text_config=dict(LM, model_type="qwen2_5_vl_text", rope_parameters=MROPE), vision_config=QWEN_VISION
            ),
            "qwen3_vl": tf.Qwen3VLConfig(
                text_config=dict(LM, head_dim=8, rope_parameters=MROPE),
                vision_config=dict(QWEN_VISION, deepstack_visual_indexes=[]),
            ),
            "qwen3_vl_moe": tf.Qwen3VLMoeConfig(
                text_config=dict(LM, head_dim=8, rope_parameters=MROPE, **MOE),
                vision_config=dict(QWEN_VISION, deepstack_visual_indexes=[]),
            ),
            **{  # GLM-4.1V, 4.5V and 4.6V: Qwen-VL's positions
                name: tf.AutoConfig.for_model(
                    name,
                    text_config=dict(LM, rope_parameters=dict(MROPE, partial_rotary_factor=1.0), **text),
                    vision_config=QWEN_VISION,
                )
                for name, text in (
                    ("glm4v", {}),
                    ("glm4v_moe", ROUTED),
                    ("glm46v", {"model_type": "glm4v_text"}),
                )
            },
            "mimo_v2_flash": tf.AutoConfig.for_model(  # V narrower than K and scaled; sinks on windowed layers
                "mimo_v2_flash",
                head_dim=12,
                v_head_dim=8,
                **ROUTED,
                **SLIDING,
                **LM,
            ),
            "deepseek_v2": tf.DeepseekV2Config(**MLA),
            "deepseek_v3": tf.DeepseekV3Config(n_group=1, topk_group=1, **MLA),
            "mistral4": tf.AutoConfig.for_model("mistral4", n_group=1, topk_group=1, **MLA),  # DeepSeek's MLA
            "cohere_compass_text": COMPASS_TEXT,
            "phi4_multimodal": tf.AutoConfig.for_model("phi4_multimodal", **PHI4_TOWERS, **LM),  # Phi-3's layers
            "cohere_compass": _shrunk_vision_language("cohere_compass", COMPASS_TEXT),
            # Mistral Large 4: latent heads over the keys an indexer selects; its second layer reuses
            # the first's selection and latent (through its own kv_b_proj)
            "mistral_large4": _shrunk_vision_language(
                "mistral_large4",
                tf.AutoConfig.for_model(
                    "mistral_large4_text",
                    **{key: value for key, value in MLA.items() if key != "q_lora_rank"},
                    n_group=1,
                    topk_group=1,
                    index_topk=SPARSE_TOP,
                    index_head_dim=8,
                    index_n_heads=2,
                    head_dim=8,
                    indexer_types=["full", "shared"],
                    kv_source_layers=[0, 0],
                    no_rope_layers=[0, 0],  # no RoPE on either (the second reads the first's latent)
                ),
            ),
            "bitnet": tf.BitNetConfig(**LM),  # the RMS norm over all heads before o_proj
            "cosmos3_omni": tf.AutoConfig.for_model(  # around Qwen3-VL's language model
                "cosmos3_omni",
                text_config=dict(LM, head_dim=8, rope_parameters=MROPE),
                vision_config=dict(QWEN_VISION, deepstack_visual_indexes=[]),
            ),
            # Granite 4 Vision: Granite's attention scaled by attention_multiplier; its default CLIP tower
            # and Q-Former projectors, shrunk by hand (the Q-Former has one head per 64 vision channels)
            "granite4_vision": tf.AutoConfig.for_model(
                "granite4_vision",
                text_config=tf.AutoConfig.for_model("granite4_vision_text", attention_multiplier=0.25, **LM).to_dict(),
                vision_config=dict(TINY_VISION, hidden_size=64, model_type="clip_vision_model"),
                qformer_config=dict(num_hidden_layers=1, intermediate_size=32),
                downsample_rate="1/2",
                deepstack_layer_map=[[0, 0]],  # one projector of a vision layer's features for layer 0
                spatial_target_layers=[1] * 4,
            ),
            # HunYuan-VL: q/k norms after RoPE, over 4 position axes (text prompts: all the same)
            "hunyuan_vl": _shrunk_vision_language(
                "hunyuan_vl",
                tf.AutoConfig.for_model(
                    "hunyuan_vl_text", head_dim=8, rope_parameters=dict(MROPE, mrope_section=[1] * 4), **LM
                ),
            ),
            # Molmo2: q/k norms over the whole projection ("olmo"), post-norms, unscaled RoPE on layer 1
            "molmo2": tf.AutoConfig.for_model(
                "molmo2",
                text_config=tf.AutoConfig.for_model(
                    "molmo2_text", head_dim=8, qk_norm_type="olmo", norm_after=True, rope_scaling_layers=[0], **LM
                ).to_dict(),
                vision_config=dict(GEMMA_VISION, num_key_value_heads=2, head_dim=8),
                adapter_config=dict(
                    GEMMA_VISION, num_key_value_heads=2, head_dim=8, vision_feature_layer=[0], text_hidden_size=32
                ),
            ),
            # Apertus 1.5: its image and audio codes are ranges of the vocabulary, which must hold
            # both (the image range ends where the audio range starts): 16 codes each, ids 32-63
            "apertus1p5": tf.AutoConfig.for_model(
                "apertus1p5",
                text_config=tf.AutoConfig.for_model("apertus1p5_text", **LM).to_dict(),
                vision_config=dict(TINY_VQ, codebook_size=16, embed_dim=4, latent_channels=4),
                audio_config=dict(
                    num_filters=4,
                    upsampling_ratios=[2],
                    num_lstm_layers=1,
                    hidden_size=8,
                    codebook_dim=8,
                    codebook_size=16,
                ),
                image_token_id=VOCAB - 2,
                audio_token_id=VOCAB - 1,
                image_token_offset=VOCAB - 32,
                audio_token_offset=VOCAB - 16,
            ),
            **{name: tf.AutoConfig.for_model(name, **thinker) for name, thinker in OMNI_THINKERS.items()},
            **{name: tf.AutoConfig.for_model(name, **parts) for name, parts in SPEECH_LMS.items()},
            "evolla": tf.AutoConfig.for_model("evolla", **EVOLLA),
            # ERNIE 4.5 VL: plain attention with its own 3D positions; experts for text and for vision
            "ernie4_5_vl_moe": tf.AutoConfig.for_model(
                "ernie4_5_vl_moe",
                text_config=dict(
                    LM,
                    rope_parameters=MROPE,
                    mlp_layer_types=["dense", "sparse"],
                    moe_intermediate_size=[16, 16],
                    moe_num_experts=2,
                    moe_k=1,
                    moe_num_shared_experts=1,
                ),
                vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2),
            ),
        }
    )
    configs.update({name: make() for name, make in NEWER.items() if in_transformers(name)})
    return configs


ATTENTION_CONFIGS = _attention_configs()
CONFIGS = {**_configs(), **ATTENTION_CONFIGS}
ATT = "softmax_attention"
# Vision-language classes around a language model of one type each: that type's config here
# as their text config, and a tiny vision tower.
LANGUAGE_MODEL_OF = {
    "exaone4_5": ("exaone4", dict(QWEN_VISION, num_key_value_heads=2)),
    "aria": ("aria_text", TINY_VISION),
    "minimax_m3_vl": ("minimax_m3_vl_text", GEMMA_VISION),
    "lfm2_vl": ("lfm2", GEMMA_VISION),
    "lfm3_vl": ("lfm3", dict(GEMMA_VISION, num_key_value_heads=2)),
    "kimi_k25": ("deepseek_v3", GEMMA_VISION),
    "nemotron_h_omni": ("nemotron_h", None),  # its default vision tower, shrunk; a causal LM inside
    "shieldgemma2": ("gemma3_text", None),
    "perception_lm": ("llama", dict(model_args={"embed_dim": 8})),
    "fast_vlm": ("qwen2", dict(hidden_size=8)),
    **{name: ("qwen3_5_text", None) for name in ("minicpmv4_6", "minicpmv4_7", "minicpm_ocr")},
}


def _vision_language_configs():
    from test_adapters import CONFIGS as ADAPTER_CONFIGS

    texts = {**ADAPTER_CONFIGS, **CONFIGS}
    return {
        name: tf.AutoConfig.for_model(name, text_config=texts[text].to_dict(), vision_config=dict(vision))
        if vision
        else _shrunk_vision_language(name, texts[text])
        for name, (text, vision) in LANGUAGE_MODEL_OF.items()
    }


CONFIGS.update(_vision_language_configs())
# Nemotron 3.5 Transcribe: Nemotron-H's base model at model.language_model
CONFIGS["nemo_speechlm"] = tf.AutoConfig.for_model(
    "nemo_speechlm", text_config=CONFIGS["nemotron_h"].to_dict(), **NEMO_TOWERS
)
# Gemma 3n: its language model (the gemma3n_text config above) and an audio tower shrunk
CONFIGS["gemma3n"] = tf.AutoConfig.for_model(
    "gemma3n",
    text_config=CONFIGS["gemma3n_text"].to_dict(),
    vision_config=dict(hidden_size=8),
    audio_config=dict(
        hidden_size=8,
        input_feat_size=8,
        conf_num_hidden_layers=1,
        conf_num_attention_heads=2,
        sscp_conv_channel_size=[4, 4],
    ),
)
EXPECTED_FAMILIES = {
    "qwen3": [ATT] * 2,
    "qwen3_moe": [ATT] * 2,
    "gemma2": [ATT] * 2,
    "gemma3_text": [ATT] * 2,
    "gemma3": [ATT] * 2,
    "gemma4_text": [ATT] * 4,
    "gemma4": [ATT] * 4,
    "qwen3_5": ["gated_deltanet", ATT],
    "gemma4_unified_text": [ATT] * 4,
    "gemma3n_text": [ATT] * 4,
    "gemma3n": [ATT] * 4,
    "gemma4_unified": [ATT] * 4,
    "qwen3_5_moe_text": ["gated_deltanet", ATT],
    "qwen3_5_moe": ["gated_deltanet", ATT],
    "qwen4_exp_text": ["gated_deltanet", ATT],
    "qwen4_exp": ["gated_deltanet", ATT],
    "glm5_next_text": ["kda", ATT, ATT],
    "glm5_next": ["kda", ATT, ATT],
    "longcat_flash": [ATT] * 4,
    "lfm3": ["short_conv", ATT, ATT],
    "lfm3_ungated": ["short_conv", ATT, ATT],
    "lara_mini": ["gated_deltanet", ATT, ATT],
    "phi3": [ATT] * 2,
    "olmo2": [ATT] * 2,
    "granite": [ATT] * 2,
    "llama4_text": ["chunked_attention", ATT],
    "llama4": ["chunked_attention", ATT],
    "falcon": [ATT] * 2,
    "lfm2_moe": ["short_conv", ATT],
    "falcon_h1": ["mamba2", ATT] * 2,
    "granitemoehybrid": ["mamba2", ATT],
    "nemotron_h": ["mamba2", ATT],
    "diffllama": [ATT] * 2,
    "zamba": ["mamba", ATT, "mamba", ATT, "mamba"],  # keys 1, 2, 3, 4, 5: the shared block at each hybrid depth
    "recurrent_gemma": ["rg_lru", ATT],
    "minimax": ["lightning_attention", ATT],
    "blt": [ATT] * 4,  # keys 0, 1 (encoder) and 4, 5 (decoder); 2, 3 the global transformer's, skipped
    "rwkv": ["rwkv"] * 2,
    "xlstm": ["mlstm"] * 2,
    **{name: [ATT] * 2 for name in ATTENTION_CONFIGS},
    "dory": [ATT] * 4,  # keys 0-3: layer 1 once per loop
    # keys 0..5: layer 0, layers 1 and 2 once per pass, layer 3
    **dict.fromkeys(("inkling2_loop_text", "inkling2_loop"), [ATT] * 6),
    "hrm_text": [ATT] * 6,
}


def _language_model_families():
    from test_adapters import EXPECTED_FAMILIES as ADAPTER_FAMILIES

    families = {**ADAPTER_FAMILIES, **EXPECTED_FAMILIES}
    return {name: families[text] for name, (text, _) in LANGUAGE_MODEL_OF.items()}


EXPECTED_FAMILIES.update(_language_model_families())
EXPECTED_FAMILIES["nemo_speechlm"] = EXPECTED_FAMILIES["nemotron_h"]
# Language models that transformers also builds alone, as the base model of their class's text
# config (no LM head): each class's own text config above, read as inside the class.
TEXT_MODELS_ALONE = (
    *(f"{name}_text" for name in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "glm4v", "glm4v_moe")),
    *(f"{name}_text" for name in ("glm_ocr", "cosmos3_edge", "hunyuan_vl", "molmo2", "granite_docling")),
    *(f"{name}_text" for name in ("muse_glimmer", "muse_spark", "mistral_large4", "hy_v4_vl")),
)
for _text in TEXT_MODELS_ALONE:
    _class = _text.removesuffix("_text")
    CONFIGS[_text] = CONFIGS[_class].get_text_config()
    assert CONFIGS[_text].model_type == _text, f"{_class}'s text config is {CONFIGS[_text].model_type!r}"
    EXPECTED_FAMILIES[_text] = EXPECTED_FAMILIES[_class]
if "kolibri1_1" in CONFIGS:
    EXPECTED_FAMILIES["kolibri1_1"] = [ATT] * 3


# How to build the models the causal-LM auto class does not build from their config (it gives
# Qwen3.5's text model).
MODEL_BUILDERS = {
    "qwen3_5": tf.Qwen3_5ForConditionalGeneration,
    "qwen3_5_moe": tf.Qwen3_5MoeForConditionalGeneration,
    # Vision-language models it cannot build: load_model takes AutoModelForImageTextToText for them.
    **{
        name: tf.AutoModelForImageTextToText.from_config
        for name in (
            *("mistral3", "llava", "llava_next", "llava_onevision", "vipllava", "internvl", "aya_vision"),
            *("cohere2_vision", "idefics3", "smolvlm", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"),
            *("glm4v", "glm4v_moe", "glm46v", "llava_next_video", "video_llava", "janus", "deepseek_vl"),
            *("deepseek_vl_hybrid", "ovis2", "video_llama_3", "lighton_ocr"),
            *("hyperclovax_vision_v2", "fuyu", "got_ocr2", "pp_chart2table", "qianfan_ocr", "idefics2"),
            *("glm_ocr", "paddleocr_vl", "cosmos3_edge", "glmga", "granite_docling", "mllama", "chameleon"),
            *(
                "emu3",
                "kosmos-2.5",
                "step3p7",
                "muse_glimmer",
                "muse_spark",
                "qwen4_exp",
                "inkling_mm_model",
                "deepseek_ocr2",
            ),
            *("unlimited_ocr", "dots3_note", "mistral4", "cohere_compass", "cosmos3_omni", "mistral_large4"),
            *("glm5_next", "hy_v4_vl", "inkling2", "inkling2_loop", "llava_onevision1_5", "ovis2_5"),
            *("granite4_vision", "hunyuan_vl", "molmo2", "apertus1p5", *OMNI_THINKERS, "ernie4_5_vl_moe"),
        )
    },
    # no class with an LM head: their base model
    **{name: tf.AutoModel.from_config for name in ("glm5_next_text", *TEXT_MODELS_ALONE)},
    **{name: tf.AutoModelForImageTextToText.from_config for name in LANGUAGE_MODEL_OF},
    # It builds Llama 4's text model only, but a Llama 4 checkpoint holds the multimodal class.
    "llama4": tf.Llama4ForConditionalGeneration,
    # Speech and audio LMs: load_model builds them with AutoModelForMultimodalLM (MOSS-Transcribe-
    # Diarize's class is also a causal LM's); Evolla's config is in no auto class (also registered as
    # "EvollaModel").
    **{name: tf.AutoModelForMultimodalLM.from_config for name in (*SPEECH_LMS, "nemo_speechlm")},
    "evolla": tf.EvollaForProteinText2Text,
}
# Classes whose vision tower is timm's (not a dependency: `load_model` loads their language model
# alone), built with a stand-in for it: a text prompt never reaches the tower.
TIMM_TOWERS = {
    "gemma3n": tf.Gemma3nForConditionalGeneration,
    "perception_lm": tf.PerceptionLMForConditionalGeneration,
    "fast_vlm": tf.FastVlmForConditionalGeneration,
}


def _without_timm(model_class):
    def build_model(config):
        import importlib
        from unittest import mock

        modeling = importlib.import_module(model_class.__module__)
        build_tower = modeling.AutoModel.from_config

        def tower(sub_config, **kwargs):
            if isinstance(sub_config, (tf.TimmWrapperConfig, tf.Gemma3nVisionConfig)):
                return torch.nn.Linear(1, 1)
            return build_tower(sub_config, **kwargs)

        with mock.patch.object(modeling.AutoModel, "from_config", tower):
            return model_class(config)

    return build_model


MODEL_BUILDERS.update({name: _without_timm(model_class) for name, model_class in TIMM_TOWERS.items()})


def tiny_model(config, seed: int):
    """A random model of ``config`` (a copy; eval mode), seeded, and a seeded prompt (1, LENGTH)."""
    torch.manual_seed(seed)
    config = config.__class__.from_dict(config.to_dict())
    model = MODEL_BUILDERS.get(config.model_type, tf.AutoModelForCausalLM.from_config)(config).eval()
    ids = torch.randint(1, VOCAB, (1, LENGTH), generator=torch.Generator().manual_seed(seed + 1))
    return model, ids


def assert_reconstructs(name: str, layers: dict) -> None:
    """Each captured layer's T applied to its captured input gives the output the model computed."""
    for index, layer in layers.items():
        predicted, observed = layer.reconstruct()
        assert predicted.shape == observed.shape
        scale = observed.abs().max().item()
        assert scale > 1e-6, "the mixer output is all zero: the check would prove nothing"
        torch.testing.assert_close(predicted, observed, rtol=1e-4, atol=1e-4 * scale, msg=f"{name} layer {index}")


def build(name: str, seed: int = 0):
    """A tiny random model of ``name`` (eval mode) and a seeded prompt (1, LENGTH)."""
    model, ids = tiny_model(CONFIGS[name], seed)
    if name == "zaya":  # its key scale starts at 0: every head would attend uniformly
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.qk_norm.temp.uniform_(0.5, 2.0)
    if name in ("beam", "dory"):  # a gate bias at 0, a scale of one value: a gate term no check would see
        with torch.no_grad():
            for key, param in model.named_parameters():
                if key.endswith("gate_bias"):
                    param.normal_(0.0, 1.0)
                elif key.endswith(("s_gate", "sqk")):
                    param.mul_(torch.empty_like(param).uniform_(0.5, 1.5))
    if name == "hrm_text":  # its initial queries and keys are so small that every head attends uniformly
        with torch.no_grad():
            for key, param in model.named_parameters():
                if key.endswith(("q_proj.weight", "k_proj.weight")):
                    param.mul_(30.0)
    if name == "bitnet":  # its output norm's weight starts at 1: a weight no check would see
        with torch.no_grad():
            for slot in layer_slots(model):
                slot.module.attn_sub_norm.weight.uniform_(0.5, 1.5)
    if name in ("hy_v4", "hy_v4_vl", "hy_v4_vl_text"):  # its gate_proj starts at std 0.006: every gate would be ~0.5
        with torch.no_grad():
            for slot in layer_slots(model):
                slot.module.gate_proj.weight.normal_(0.0, 0.5)
    if name.startswith("inkling2"):  # unit scales before the L2 clips leave every head near uniform
        with torch.no_grad():
            for key, param in model.named_parameters():
                if key.endswith("norm.scale"):  # of the queries and the relative states
                    param.uniform_(5.0, 20.0)
                elif key.endswith("k_proj.linear.weight"):
                    param.mul_(5.0)
                elif key.endswith("static_weight"):  # the full layers' conv taps start at 0
                    param.normal_(0.0, 0.5)
                elif "message_gate" in key:  # Inkling 2 Loop: let a pass's messages change the next pass
                    param.normal_(0.0, 1.0)
    if name == "zamba":  # its init makes B, C ~ 1e-2 and D = 1: every channel's T ~ identity
        with torch.no_grad():
            for key, param in model.named_parameters():
                if key.endswith("x_proj_weight"):
                    param.normal_(0.0, 0.3)
                elif key.endswith("mamba.D"):
                    param.uniform_(-1.0, 1.0)
    return model, ids


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def built(request):
    model, ids = build(request.param)
    return request.param, model, ids, capture(model, ids, layer_slots(model))


def test_reconstruction(built):
    """T (and the out_gate after it) reproduces each layer's output, and so does T with its gate
    inside (gates="inside", the default of `analyze`)."""
    from ess_explorer.core.gates import gates_inside

    name, model, _ids, layers = built
    assert model.config.model_type == CONFIGS[name].model_type and model.config.model_type in MODEL_TYPES
    assert [layers[i].family for i in sorted(layers)] == EXPECTED_FAMILIES[name]
    assert set(EXPECTED_FAMILIES[name]) <= set(MODEL_FAMILIES[model.config.model_type])
    assert_reconstructs(name, layers)
    assert_reconstructs(name, {index: gates_inside(layer) for index, layer in layers.items()})


# Where each family's gated output enters the output projection, and the norm weight (constant,
# outside T) between them.
PROJECTIONS = {
    "rwkv": "output",
    "rg_lru": "linear_out",
    "lightning_attention": "out_proj",
    "mamba2": "out_proj",
    "mlstm": "out_proj",
}


@pytest.mark.parametrize(
    "name, change",
    [
        ("rwkv", {}),  # sigmoid(receptance)
        ("recurrent_gemma", {}),  # gelu(linear_y)
        ("minimax", {}),  # sigmoid(output_gate) / rms of the norm over all heads
        ("falcon_h1", {}),  # silu(z), no norm
        ("falcon_h1", dict(mamba_rms_norm=True)),  # norm of y, then silu(z)
        ("falcon_h1", dict(mamba_rms_norm=True, mamba_norm_before_gate=False, mamba_n_groups=2)),  # norm of y silu(z)
        ("xlstm", {}),  # sigmoid(o) / sigma of the head's layer norm, after its centring
    ],
    ids=["rwkv", "recurrent_gemma", "minimax", "falcon_h1", "falcon_h1_norm", "falcon_h1_gate_then_norm", "xlstm"],
)
def test_the_output_gate_around_the_mixing_is_captured_and_is_what_the_model_projects(name, change):
    """RWKV's receptance, RG-LRU's y-branch, lightning attention's output gate (with the norm's
    1 / rms), Falcon-H1's silu(z) (with or without its norm) and xLSTM's sigmoid(o) (with its head
    norm's 1 / sigma) are each layer's out_gate: its outputs, times the norm's constant weight,
    are what the model feeds its output projection."""
    config = CONFIGS[name].from_dict({**CONFIGS[name].to_dict(), **change})
    model, ids = tiny_model(config, 0)
    slots = layer_slots(model)
    projected = {}
    for slot in slots:
        if slot.adapter in PROJECTIONS:
            projection = getattr(slot.module, PROJECTIONS[slot.adapter])
            projection.register_forward_pre_hook(lambda _m, args, i=slot.index: projected.__setitem__(i, args[0]))
    layers = capture(model, ids, slots)
    assert projected, name
    for index, observed in projected.items():
        layer = layers[index]
        assert layer.out_gate is not None, f"{name} layer {index}"
        module = next(s for s in slots if s.index == index).module
        norm = getattr(module, "norm", getattr(module, "multihead_norm", None))
        weight = norm.weight.detach().to(torch.float64) if hasattr(norm, "weight") else 1.0
        units, length, channels = layer.outputs.shape
        gated = layer.outputs.transpose(0, 1).reshape(length, units * channels)  # (L, D), the model's order
        torch.testing.assert_close(weight * gated, observed[0].to(torch.float64), rtol=1e-4, atol=1e-5)


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
        # ESS never exceeds the unit's capacity (docs/math.md: rank H_t <= TSS)
        assert np.all(ess <= tss + 1e-9), f"{name} layer {index}"


def test_gemma_sliding_and_global_layers_follow_layer_types():
    for name in ("gemma2", "gemma3_text", "gemma3"):
        model, ids = build(name)
        layers = capture(model, ids, layer_slots(model))
        sliding, full = layers[0].dense([0])[0], layers[1].dense([0])[0]
        assert layers[0].window == 5 and layers[1].window is None
        i, j = torch.tril_indices(LENGTH, LENGTH)
        far = (i - j) >= 5
        assert torch.all(sliding[i[far], j[far]] == 0) and torch.all(sliding[i[~far], j[~far]] > 0)
        assert torch.all(full[i, j] > 0)


@pytest.mark.parametrize("name", ["llama4_text", "llama4"])
def test_llama4_chunked_layer_is_block_diagonal_and_its_tss_resets_per_chunk(name):
    model, ids = build(name)
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


def test_falcon_h1_analyses_both_parallel_mixers_as_labelled_slots(tmp_path):
    from ess_explorer.result import ESSResult

    model, ids = build("falcon_h1")
    result = analyze(model, ids, progress=False)
    assert ESSResult.load(result.save(tmp_path / "r.npz")).meta["slots"] == result.meta["slots"]
    assert sorted(result.layers) == [0, 1, 2, 3]
    assert result.meta["slots"] == {
        "0": "layer 0 mamba2",
        "1": "layer 0 attention",
        "2": "layer 1 mamba2",
        "3": "layer 1 attention",
    }
    assert result.layers[0].family == "mamba2" and result.layers[1].family == ATT
    # one mixer alone: its key, not a layer index
    only = analyze(model, ids, layers=[3], progress=False)
    assert sorted(only.layers) == [3] and only.layers[3].family == ATT


def test_longcat_flash_analyses_both_attention_blocks_of_each_layer_as_labelled_slots():
    model, ids = build("longcat_flash")
    result = analyze(model, ids, progress=False)
    assert result.meta["slots"] == {f"{2 * i + j}": f"layer {i} attention {j}" for i in (0, 1) for j in (0, 1)}
    layers = capture(model, ids, layer_slots(model))
    assert layers[0].inputs.shape[-1] == 6 and not torch.equal(layers[0].inputs, layers[1].inputs)


def test_zamba_shared_attention_is_analysed_at_every_depth_it_is_called():
    model, ids = build("zamba")
    shared = [layer.shared_transf.self_attn for layer in model.model.layers[1:]]
    assert shared[0].q_proj.weight is shared[1].q_proj.weight, "one set of weights, called at two depths"
    # The tiny init leaves attention near uniform and the stream between the two calls nearly
    # unchanged: sharpen the shared attention and let layer 1's mixer move the stream.
    with torch.no_grad():
        shared[0].q_proj.weight.mul_(20.0)
        model.model.layers[1].mamba_decoder.mamba.out_proj.weight.mul_(50.0)
    result = analyze(model, ids, progress=False)
    assert result.meta["slots"] == {
        "1": "layer 0 mamba",
        "2": "layer 1 shared attention",
        "3": "layer 1 mamba",
        "4": "layer 2 shared attention",
        "5": "layer 2 mamba",
    }
    # each call reads its own depth's input: the same weights apply different operators
    first, second = result.layers[2].operators, result.layers[4].operators
    assert result.layers[2].family == result.layers[4].family == ATT and first and second
    assert np.abs(first[0] - second[0]).max() > 1e-3
    only = analyze(model, ids, layers=[4], progress=False)  # the second call alone
    np.testing.assert_allclose(only.layers[4].operators[0], second[0])


def test_diffllama_pairs_its_heads_into_one_differential_operator():
    """Head pair p applies A_p - lambda A_(p+H/2) to the values of two KV heads: its rows sum to
    1 - lambda (each softmax row sums to 1), its values are 2 head_dim wide, and T' with the
    norm's scale inside reproduces the layer."""
    from ess_explorer.core.gates import gates_inside

    model, ids = build("diffllama")
    config = model.config
    for index, layer in capture(model, ids, layer_slots(model)).items():
        attention = model.model.layers[index].self_attn
        products = [
            torch.exp(torch.sum(q * k, dtype=torch.float64)).item()
            for q, k in ((attention.lambda_q1, attention.lambda_k1), (attention.lambda_q2, attention.lambda_k2))
        ]
        lam = products[0] - products[1] + attention.lambda_init
        assert layer.n_units == config.num_attention_heads // 2 and layer.inputs.shape[-1] == 2 * attention.head_dim
        rows = layer.dense(range(layer.n_units)).sum(-1)
        torch.testing.assert_close(rows, torch.full_like(rows, 1 - lam), atol=1e-6, rtol=0)
        inside = gates_inside(layer)
        predicted, observed = inside.reconstruct()
        scale = observed.abs().max().item()
        torch.testing.assert_close(predicted, observed, rtol=1e-4, atol=1e-4 * scale)


def test_zamba2_shared_attention_is_analysed_at_each_depth_with_that_depths_value_adapter():
    """Zamba2's shared block (one set of weights at both hybrid depths here) adds a low-rank
    adapter of the depth to V: each call is a slot whose values include it, and the block's own
    output is T times those values (reading v_proj alone would miss it)."""
    from test_adapters import CONFIGS as ADAPTER_CONFIGS  # its zamba2: a mamba, a hybrid, a mamba layer

    config = ADAPTER_CONFIGS["zamba2"].to_dict()
    config.update(layers_block_type=["mamba", "hybrid", "hybrid"], num_mem_blocks=1)
    del config["hybrid_layer_ids"]  # derived from layers_block_type again
    config = tf.Zamba2Config.from_dict(config)
    model, ids = tiny_model(config, seed=0)
    slots = {slot.index: slot for slot in layer_slots(model)}
    assert [slots[key].label for key in sorted(slots)] == [
        "layer 0 mamba",
        "layer 1 shared attention",
        "layer 1 mamba",
        "layer 2 shared attention",
        "layer 2 mamba",
    ]
    assert slots[2].module.v_proj.weight is slots[4].module.v_proj.weight  # tied across the depths
    layers = capture(model, ids, list(slots.values()))
    assert_reconstructs("zamba2", layers)
    for key in (2, 4):
        attention = slots[key].module
        seen = {}
        handle = attention.v_proj.register_forward_hook(lambda _m, _a, out: seen.setdefault("v", out.detach()))
        with torch.no_grad():
            model(ids)
        handle.remove()
        v_proj = seen["v"][0].reshape(LENGTH, -1, attention.head_dim).transpose(0, 1)  # (H_kv, L, hd)
        group = layers[key].n_units // v_proj.shape[0]
        assert (layers[key].inputs[::group] - v_proj).abs().max() > 1e-2 * v_proj.abs().max()
    assert not torch.allclose(layers[2].inputs, layers[4].inputs)


@pytest.mark.parametrize("name", ["inkling2_loop_text", "inkling2_loop"])
def test_inkling2_loop_layers_are_analysed_at_every_pass(name):
    """Inkling 2 Loop runs its layers 1 and 2 twice (one module each, each pass on its own input):
    every call is a slot, keyed in the order the calls run, and reads that call's T and values."""
    model, ids = build(name)
    slots = layer_slots(model)
    assert [(slot.index, slot.call) for slot in slots] == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (5, 0)]
    assert slots[1].module is slots[3].module and slots[2].module is slots[4].module
    result = analyze(model, ids, progress=False)
    assert result.meta["slots"] == {
        "0": "layer 0",
        "1": "layer 1 pass 0",
        "2": "layer 2 pass 0",
        "3": "layer 1 pass 1",
        "4": "layer 2 pass 1",
        "5": "layer 3",
    }
    built = []
    layers = capture(model, ids, slots, on_layer=lambda key, _layer: built.append(key))
    assert built == list(range(6)), "each slot is built as soon as the call it reads has run"
    assert [layers[key].window for key in range(6)] == [WINDOW, WINDOW, None, WINDOW, None, WINDOW]
    for first, second in ((1, 3), (2, 4)):  # the same weights apply other operators to other values
        assert (layers[first].dense([0]) - layers[second].dense([0])).abs().max() > 1e-2
        assert not torch.allclose(layers[first].inputs, layers[second].inputs)
    only = analyze(model, ids, layers=[3], progress=False)  # the second call alone
    np.testing.assert_allclose(only.layers[3].operators[0], result.layers[3].operators[0])


def test_hrm_text_analyses_each_call_of_its_two_stacks_in_the_order_they_run():
    """HRM-text runs its L stack L_cycles times per H cycle, then its H stack (the same modules
    each time, on a new input): every call is a slot with its own T and values."""
    model, ids = build("hrm_text")
    slots = layer_slots(model)
    low, high = model.model.L_module.layers[0].self_attn, model.model.H_module.layers[0].self_attn
    assert [(slot.module, slot.call) for slot in slots] == [
        (low, 0), (low, 1), (high, 0), (low, 2), (low, 3), (high, 1)
    ]  # fmt: skip
    result = analyze(model, ids, progress=False)
    assert [result.meta["slots"][str(key)] for key in range(6)] == [
        "L layer 0 cycle 0.0", "L layer 0 cycle 0.1", "H layer 0 cycle 0",
        "L layer 0 cycle 1.0", "L layer 0 cycle 1.1", "H layer 0 cycle 1",
    ]  # fmt: skip
    layers = capture(model, ids, slots)
    for first, second in ((0, 1), (2, 5)):  # the same weights apply other operators to other values
        assert (layers[first].dense([0]) - layers[second].dense([0])).abs().max() > 1e-2
    only = analyze(model, ids, layers=[4], progress=False)  # a later call alone
    np.testing.assert_allclose(only.layers[4].operators[0], result.layers[4].operators[0])


def test_blt_analyses_its_local_layers_over_the_bytes_and_lists_its_global_layers_as_skipped():
    """BLT's local encoder and decoder attend over the prompt's bytes, windowed; its global
    transformer runs over patches of them, so its layers' keys are skipped with the reason."""
    model, ids = build("blt")
    result = analyze(model, ids, progress=False)
    assert sorted(result.layers) == [0, 1, 4, 5]
    assert result.meta["slots"] == {
        "0": "encoder layer 0", "1": "encoder layer 1", "4": "decoder layer 0", "5": "decoder layer 1"
    }  # fmt: skip
    assert set(result.meta["skipped_layers"]) == {"2", "3"}
    assert "patches of bytes" in result.meta["skipped_layers"]["2"]
    layers = capture(model, ids, layer_slots(model))
    stacks = model.model.local_encoder.layers, model.model.local_decoder.layers
    assert [slot.module for slot in layer_slots(model)] == [layer.self_attn for stack in stacks for layer in stack]
    assert {slot.window for slot in layer_slots(model)} == {WINDOW}  # the window TSS counts
    i, j = torch.tril_indices(LENGTH, LENGTH)
    far = (i - j) >= WINDOW
    for layer in layers.values():
        op = layer.dense(range(layer.n_units))
        assert op.shape[-1] == ids.shape[-1] == LENGTH  # a T over the bytes, not over patches
        assert torch.all(op[:, i[far], j[far]] == 0) and torch.all(op[:, i[~far], j[~far]] > 0)
    with pytest.raises(ValueError, match="layer index 2 is out of range"):
        analyze(model, ids, layers=[2], progress=False)


def test_nemotron_mlp_blocks_are_skipped_with_a_reason_not_silently():
    model, ids = build("nemotron_h")
    result = analyze(model, ids, progress=False)
    assert sorted(result.layers) == [0, 2]
    assert set(result.meta["skipped_layers"]) == {"1", "3"}
    assert "no sequence mixer" in result.meta["skipped_layers"]["1"]
    with pytest.raises(ValueError, match="layer index 1 is out of range.*0, 2"):
        analyze(model, ids, layers=[1], progress=False)


def test_rwkv_operator_is_a_causal_weighted_average():
    # T = diag(1 / den) N with den = N 1: every row of every channel's T sums to 1
    model, ids = build("rwkv")
    layer = capture(model, ids, layer_slots(model))[0]
    op = layer.dense(range(layer.n_units))
    torch.testing.assert_close(op.sum(-1), torch.ones(layer.n_units, LENGTH, dtype=torch.float64))
    assert torch.all(op >= 0)


def test_recurrent_gemma_local_attention_window_and_one_state_per_channel():
    model, ids = build("recurrent_gemma")
    layers = capture(model, ids, layer_slots(model))
    op = layers[1].dense([0])[0]
    i, j = torch.tril_indices(LENGTH, LENGTH)
    far = (i - j) >= 5
    assert layers[1].window == 5 and torch.all(op[i[far], j[far]] == 0)
    np.testing.assert_array_equal(layers[0].tss(np.arange(1, LENGTH)), np.ones(LENGTH - 1))
    lru = layers[0].dense(range(4))
    for cut in range(1, LENGTH):  # a diagonal recurrence with one state: every cut has rank <= 1
        assert all(torch.linalg.matrix_rank(t[cut:, :cut]).item() <= 1 for t in lru)


def test_every_model_type_lists_its_families():
    from ess_explorer.core.diagnostics import FAMILIES

    assert set(MODEL_FAMILIES) == set(MODEL_TYPES)
    assert all(family in FAMILIES for families in MODEL_FAMILIES.values() for family in families)


def test_cli_models_families_lists_every_supported_type(capsys):
    from ess_explorer.app import cli
    from ess_explorer.capture.registry import REFUSED

    assert cli.main(["models", "--families"]) == 0
    supported, refused = capsys.readouterr().out.split("\nnot supported, and why:\n")
    listed = {line.split()[0]: line.split(None, 1)[1] for line in supported.splitlines()}
    assert set(listed) == set(MODEL_TYPES)
    assert "rg_lru" in listed["recurrent_gemma"] and "softmax_attention" in listed["recurrent_gemma"]
    why = {line.split()[0]: line.split(None, 1)[1] for line in refused.splitlines()}
    assert why == REFUSED


def test_unsupported_model_type_names_the_closest_supported_ones():
    config = tf.Qwen3Config(num_hidden_layers=1, head_dim=8, **ATTN, **IDS)
    model = tf.AutoModelForCausalLM.from_config(config)
    model.config.model_type = "qwen4"  # an unknown type, one edit away from qwen2 / qwen3
    with pytest.raises(ValueError, match=r"'qwen4'.*not supported\. Closest supported: qwen[23], qwen[23]") as error:
        layer_slots(model)
    assert "text-generating" not in str(error.value)  # a type transformers does not know may be a model of its own


def test_a_part_of_a_multimodal_model_is_sent_to_the_whole_model():
    """Step 3.7's text config (step3p5) and a vision tower's config are types transformers builds
    no text-generating class of."""
    from ess_explorer.capture.registry import require_supported

    for model_type, closest in (("step3p5", "step3p7"), ("qwen2_5_vl_vision", "qwen2_5_vl")):
        with pytest.raises(
            ValueError,
            match=rf"Closest supported: .*{closest}.* no text-generating class .*"
            r"part of a larger model .*analyse that model",
        ):
            require_supported(model_type, "model")


@pytest.mark.parametrize(
    "layout",
    [
        dict(multi_query=True),  # every query head, then one key, then one value
        dict(multi_query=False),  # query, key and value interleaved per head
        dict(new_decoder_architecture=True, num_kv_heads=2),  # per KV group: its queries, key, value
    ],
    ids=["multi_query", "interleaved", "kv_groups"],
)
def test_falcon_value_heads_follow_each_fused_layout(layout):
    """V is read from Falcon's one fused projection, whose column order the config chooses:
    a wrong split would give V of the wrong heads and o_h != T_h v_{g(h)}."""
    torch.manual_seed(0)
    config = tf.FalconConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=4, **layout, **IDS)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(1, VOCAB, (1, LENGTH), generator=torch.Generator().manual_seed(1))
    layer = capture(model, ids, layer_slots(model))[0]
    kv_heads = 1 if layout.get("multi_query") else layout.get("num_kv_heads", 4)
    assert layer.info["num_key_value_heads"] == kv_heads
    predicted, observed = layer.reconstruct()
    scale = observed.abs().max().item()
    torch.testing.assert_close(predicted, observed, rtol=1e-4, atol=1e-4 * scale)


def test_a_multimodal_model_is_held_to_its_language_models_context():
    """Gemma 3's multimodal config has no max_position_embeddings of its own: the prompt is
    checked against its language model's (256 here), not let through unchecked."""
    model, _ = build("gemma3")
    with pytest.raises(ValueError, match="more than the model's context of 256"):
        analyze(model, [1] * 257, progress=False)


def test_roberta_is_held_to_the_positions_its_numbering_leaves():
    """RoBERTa numbers positions from pad_token_id + 1: its table of max_position_embeddings rows
    holds that many fewer positions, and a longer prompt is refused before its forward fails."""
    model, _ = build("roberta")
    config = model.config
    context = config.max_position_embeddings - config.pad_token_id - 1
    analyze(model, [1] * context, layers=[0], progress=False)  # the longest prompt that runs
    with pytest.raises(ValueError, match=f"more than the model's context of {context} "):
        analyze(model, [1] * (context + 1), progress=False)
    with pytest.raises(RuntimeError, match="out of bounds"):  # what the check spares the user
        model(torch.ones(1, context + 1, dtype=torch.long))


def test_hybrids_attention_layers_keep_their_windows_and_lfm3_gates_each_head():
    gates = {}
    for name in ("lfm3", "lfm3_ungated", "lara_mini"):
        model, ids = build(name)
        layers = capture(model, ids, layer_slots(model))
        assert layers[1].window == WINDOW and layers[2].window is None, name
        gates[name] = layers[1].out_gate  # (H, L, head_dim) or None
    assert torch.equal(gates["lfm3"], gates["lfm3"][..., :1].expand_as(gates["lfm3"]))  # one per head and token
    assert gates["lfm3_ungated"] is None and gates["lara_mini"] is None


def test_qwen4_exp_indexed_layer_keeps_only_the_key_blocks_its_indexer_selects():
    """A query at t sees its SPARSE_TOP best keys in whole blocks of QWEN4_BLOCK plus the rest of
    an incomplete last block (t + 1 mod QWEN4_BLOCK keys); T holds exactly that selection."""
    model, ids = build("qwen4_exp_text")
    layer = capture(model, ids, layer_slots(model))[1]
    kept = (layer.dense(range(layer.n_units)) > 0).sum(-1)  # (H, L): keys each query attends to
    visible = torch.arange(1, LENGTH + 1)
    tail = visible % QWEN4_BLOCK
    expected = torch.minimum(visible, SPARSE_TOP + tail)  # all keys while they fit in the budget
    assert torch.equal(kept, expected.expand_as(kept))
    assert layer.out_gate.shape == layer.inputs.shape  # Qwen3.5's sigmoid gate, per head and channel


@pytest.mark.parametrize("name", ["glm5_next_text", "glm5_next"])
def test_glm5_next_latent_layers_keep_the_key_pools_their_indexer_selects(name):
    """A query at t sees the keys of its best whole pools of GLM5_POOL (SPARSE_TOP keys) plus the
    incomplete last pool (t + 1 mod GLM5_POOL keys); layer 2 reuses layer 1's selection and caches
    no indexer state. T holds the selection; only the KDA layer carries an out_gate (its gated
    norm's act(z) / rms_t, as Kimi Linear's)."""
    model, ids = build(name)
    layers = capture(model, ids, layer_slots(model))
    visible = torch.arange(1, LENGTH + 1)
    expected = torch.minimum(visible, SPARSE_TOP + visible % GLM5_POOL)  # all keys while they fit
    selected = [layers[i].dense(range(layers[i].n_units)) > 0 for i in (1, 2)]
    for kept in selected:
        assert torch.equal(kept.sum(-1), expected.expand(kept.shape[0], -1))
    assert torch.equal(selected[0], selected[1])  # the "shared" layer: layer 1's selection
    config = CONFIGS["glm5_next_text"]  # glm5_next's language model too
    latent = config.kv_lora_rank + config.qk_rope_head_dim
    scalars = [layers[i].info["state_scalars_per_tss"] for i in (1, 2)]
    assert scalars == [latent + 2 * config.index_head_dim, latent]  # each key and its pool logits
    assert [index for index, layer in layers.items() if layer.out_gate is not None] == [0]


# Mistral 3: no causal-LM class; Llama 4: the causal-LM class would build the text model only
# and leave the checkpoint's vision weights unread; SmolVLM: its language model at model.text_model;
# LFM2-VL: a hybrid language model, through LFM2's own layout; Nemotron-H omni: a causal LM inside.
# The speech and audio LMs: AutoModelForMultimodalLM's classes, with their audio towers; Evolla: a
# config class no auto class finds by its name.
@pytest.mark.parametrize(
    "name",
    [
        *("mistral3", "llama4", "smolvlm", "lfm2_vl", "nemotron_h_omni", "got_ocr2", "minicpmv4_6"),
        *(*OMNI_THINKERS, "ernie4_5_vl_moe", *SPEECH_LMS, "nemo_speechlm", "evolla", "kosmos-2.5"),
    ],
)
def test_a_vision_language_folder_loads_its_own_class_and_its_language_model_is_analysed(tmp_path, name):
    import warnings

    from ess_explorer.sources import load_model

    model, ids = build(name)
    model.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the folder ships no tokenizer
        loaded, _tokenizer = load_model(str(tmp_path))
    assert type(loaded) is type(model)  # the class the checkpoint holds, not a causal LM
    result = analyze(loaded, ids, progress=False)
    assert [result.layers[key].family for key in sorted(result.layers)] == EXPECTED_FAMILIES[name]


@pytest.mark.parametrize("name", sorted(TIMM_TOWERS))
def test_a_class_with_a_timm_tower_loads_its_language_model_alone_which_is_what_it_runs(tmp_path, capfd, name):
    """Gemma 3n's, PerceptionLM's and FastVLM's vision towers need timm, so `load_model` loads
    their causal LM alone from the whole model's checkpoint, the towers' weights left unread and
    transformers' report of them not shown: on a text prompt it computes the whole model's
    logits, and its analysis is the whole model's."""
    import warnings

    from ess_explorer.sources import load_model

    whole, ids = build(name)
    whole.save_pretrained(tmp_path)
    capfd.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the folder ships no tokenizer
        loaded, _tokenizer = load_model(str(tmp_path))
    assert "LOAD REPORT" not in "".join(capfd.readouterr())
    assert type(loaded) is tf.AutoModelForCausalLM._model_mapping[type(whole.config.text_config)]
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, whole(ids).logits, rtol=1e-5, atol=1e-5)
    alone, together = analyze(loaded, ids, progress=False), analyze(whole, ids, progress=False)
    assert sorted(alone.layers) == sorted(together.layers) == list(range(len(EXPECTED_FAMILIES[name])))
    for key in alone.layers:
        for variant in ("tolerance", "entropy"):
            np.testing.assert_allclose(alone.layers[key].ess(variant), together.layers[key].ess(variant), rtol=1e-6)


def test_a_language_model_loaded_alone_leaves_only_its_towers_weights_unread():
    """Weights outside the towers named for a language model loaded alone still fail the load."""
    from ess_explorer.model_classes import check_loading_info

    towers = ("model.vision_tower.", "model.audio_tower.")
    check_loading_info("m", {"unexpected_keys": {"model.vision_tower.a", "model.audio_tower.b"}}, left_unread=towers)
    with pytest.raises(ValueError, match=r"unexpected keys: model\.layers\.9\.w\)"):
        check_loading_info("m", {"unexpected_keys": {"model.vision_tower.a", "model.layers.9.w"}}, left_unread=towers)
    with pytest.raises(ValueError, match=r"missing keys: lm_head\.weight"):
        check_loading_info("m", {"missing_keys": {"lm_head.weight"}}, left_unread=towers)


def test_a_class_around_one_type_refuses_a_language_model_of_another_type():
    """Nemotron 3.5 Transcribe is read as Nemotron-H; its config may name another language model,
    whose layers that layout would misread: refused, naming both types."""
    config = tf.AutoConfig.for_model("nemo_speechlm", text_config=dict(LM, model_type="llama"), **NEMO_TOWERS)
    model = tf.AutoModelForMultimodalLM.from_config(config).eval()
    with pytest.raises(ValueError, match="nemo_speechlm with a 'llama' language model is not supported.*as nemotron_h"):
        layer_slots(model)


@pytest.mark.parametrize("name", sorted(OMNI_THINKERS))
def test_a_whole_omni_model_is_refused_and_its_thinker_is_analysed(name):
    """Qwen2.5-Omni and Qwen3-Omni hold a thinker and a talker, and have no forward pass of their
    own: the refusal names the thinker, which is analysed as its own type (built here without
    the talker, config.enable_audio_output)."""
    whole = name.removesuffix("_thinker")
    config = tf.AutoConfig.for_model(whole, thinker_config=OMNI_THINKERS[name], enable_audio_output=False)
    torch.manual_seed(0)
    model = tf.AutoModelForMultimodalLM.from_config(config).eval()
    _, ids = tiny_model(CONFIGS[name], 0)
    with pytest.raises(
        ValueError, match=rf"'{whole}'.*not supported: its thinker \(model.thinker, model type {name}\)"
    ):
        layer_slots(model)
    assert model.thinker.config.model_type == name
    layers = capture(model.thinker, ids, layer_slots(model.thinker))
    assert sorted(layers) == [0, 1]
    assert_reconstructs(f"{whole}'s thinker", layers)


def test_the_deprecated_ernie4_5_vl_class_is_read_as_ernie4_5_vl_moe():
    """Ernie4_5_VL_MoeForConditionalGeneration, the class's former name, is a subclass with the
    same config (model type ernie4_5_vl_moe): the same layers are analysed."""
    torch.manual_seed(0)
    model = tf.Ernie4_5_VL_MoeForConditionalGeneration(CONFIGS["ernie4_5_vl_moe"]).eval()
    _, ids = tiny_model(CONFIGS["ernie4_5_vl_moe"], 0)
    layers = capture(model, ids, layer_slots(model))
    assert sorted(layers) == [0, 1]
    assert_reconstructs("Ernie4_5_VL_MoeForConditionalGeneration", layers)


def test_a_vision_language_wrapper_around_another_kind_of_language_model_is_refused():
    from test_adapters import CONFIGS as ADAPTER_CONFIGS  # its lfm2: short convolutions and attention

    text = ADAPTER_CONFIGS["lfm2"].to_dict()
    config = tf.LlavaConfig(text_config=text, vision_config={"model_type": "clip_vision_model", **TINY_VISION})
    model = tf.AutoModelForImageTextToText.from_config(config)
    with pytest.raises(ValueError, match="llava with a 'lfm2' language model is not supported"):
        layer_slots(model)


def test_a_vision_language_wrapper_reads_its_language_model_with_that_types_own_layout():
    """A LLaVA around GPT-NeoX (layers at .layers, fused per-head [q | k | v] in .attention):
    the wrapper reads the language model as gpt_neox is read, not at a path of its own."""
    config = tf.LlavaConfig(
        text_config=CONFIGS["gpt_neox"].to_dict(), vision_config={"model_type": "clip_vision_model", **TINY_VISION}
    )
    model, ids = tiny_model(config, 0)
    layers = capture(model, ids, layer_slots(model))
    assert sorted(layers) == [0, 1] and all(layer.info["num_key_value_heads"] == 4 for layer in layers.values())
    assert_reconstructs("llava around gpt_neox", layers)


def test_switching_a_multimodal_model_to_eager_attention_and_back_prints_nothing(caplog):
    """transformers warns at each switch that it cannot match Gemma 4 unified's vision sub-config."""
    model, ids = build("gemma4_unified")
    with caplog.at_level("WARNING"):
        analyze(model, ids, layers=[0], progress=False)
    assert model.config._attn_implementation == "sdpa"  # switched back
    assert not [r for r in caplog.records if "sub-config" in r.getMessage()]


def test_a_language_model_on_sdpa_inside_an_eager_model_is_switched_and_switched_back():
    """GOT-OCR 2's vision tower has only an eager implementation, so the model's own config says
    eager while its language model runs sdpa and returns no probabilities: the capture switches
    the language model too, and restores both."""
    model, ids = build("got_ocr2")
    text = model.config.text_config
    assert (model.config._attn_implementation, text._attn_implementation) == ("eager", "sdpa")
    layers = capture(model, ids, layer_slots(model))
    assert_reconstructs("got_ocr2", layers)
    assert (model.config._attn_implementation, text._attn_implementation) == ("eager", "sdpa")
    assert model.model.language_model.layers[0].self_attn.config._attn_implementation == "sdpa"


def test_eager_only_tokenizers_inside_an_sdpa_model_keep_eager_when_switched_back():
    """Apertus 1.5's image and audio tokenizers have only an eager implementation (sdpa is refused)
    inside a class on sdpa: the capture restores each sub-model's own implementation."""
    model, ids = build("apertus1p5")
    config = model.config

    def implementations():
        return [config._attn_implementation, *(getattr(config, key)._attn_implementation for key in config.sub_configs)]

    before = implementations()
    assert before == ["sdpa", "sdpa", "eager", "eager"]  # the model, its text, vision and audio configs
    assert_reconstructs("apertus1p5", capture(model, ids, layer_slots(model)))
    assert implementations() == before
    assert model.model.language_model.layers[0].self_attn.config._attn_implementation == "sdpa"


def test_mllama_cross_attention_layers_are_listed_as_skipped():
    """A text prompt skips Llama 3.2 Vision's cross-attention layers: the analysis keeps the
    self-attention layers' own indices and says why the others have no result."""
    from ess_explorer.capture import skipped_layers

    model, ids = build("mllama")
    assert sorted(capture(model, ids, layer_slots(model))) == [0, 2]
    assert list(skipped_layers(model)) == [1] and "cross-attention" in skipped_layers(model)[1]
    result = analyze(model, ids, progress=False)
    assert sorted(result.layers) == [0, 2]
    assert list(map(int, result.meta["skipped_layers"])) == [1]


def test_mistral_large4_second_layer_reads_the_first_layers_latent_and_selection():
    """Its second layer makes no latent and runs no indexer: its values are its own kv_b_proj of
    the first layer's latent (the reconstruction test holds them), its cache that latent, counted
    for it too, and its keys the first layer's selection."""
    model, ids = build("mistral_large4")
    first, second = (capture(model, ids, layer_slots(model))[i] for i in (0, 1))
    text = model.config.text_config
    assert first.info["state_scalars_per_tss"] == text.kv_lora_rank + text.index_head_dim
    assert second.info["state_scalars_per_tss"] == text.kv_lora_rank and second.info["kv_shared"]
    assert "kv_shared" not in first.info
    kept = lambda layer: layer.dense(range(layer.n_units)) > 0  # noqa: E731
    assert torch.equal(kept(first)[0], kept(second)[0])  # one selection, every head


@pytest.mark.skipif(not in_transformers("kolibri1_1"), reason="Kolibri 1.1 came with transformers 5.25")
def test_kolibri_indexed_layers_read_rounded_values_and_the_last_reads_the_layer_before():
    """T's input on an indexed layer is its V rounded to NVFP4, as its forward rounds it (reading
    v_proj would miss the output by the rounding); the last layer reads the second's V."""
    model, ids = build("kolibri1_1")
    layers = capture(model, ids, layer_slots(model))
    assert [layers[i].info["kv_shared"] for i in range(3)] == [False, False, True]
    attention = model.model.layers[1].self_attn
    seen = {}
    handle = attention.v_proj.register_forward_hook(lambda _m, _a, out: seen.setdefault("v", out.detach()))
    with torch.no_grad():
        model(ids)
    handle.remove()
    rounded = sys.modules[type(attention).__module__].nvfp4_fake_quantize(seen["v"])
    per_head = lambda v: v[0].reshape(LENGTH, -1, attention.head_dim).transpose(0, 1)  # noqa: E731
    group = attention.num_key_value_groups
    torch.testing.assert_close(layers[1].inputs[::group], per_head(rounded).to(layers[1].inputs.dtype))
    assert (seen["v"] - rounded).abs().max() > 1e-2 * seen["v"].abs().max()
    torch.testing.assert_close(layers[2].inputs, layers[1].inputs)
