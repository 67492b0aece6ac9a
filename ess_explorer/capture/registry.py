"""The model types this package supports: config.model_type -> where each layer's sequence
mixer lives (a layout of capture/layouts.py) and which adapter (capture/__init__.py ADAPTERS)
reads it.

    REGISTRY      config.model_type -> ModelType: ``slots(model)`` -> [LayerSlot per layer]
                  (hybrids map layers through the config's layer types), the families its
                  layers can have, the layers it deliberately skips, and the words of the
                  support table
    REFUSED       model types refused with the reason (capture/refused.py);
                  `require_supported` raises for these and for any type not in REGISTRY,
                  and load_model calls it before reading weights

MODEL_TYPES (model type -> slots) and MODEL_FAMILIES (model type -> families) are views of
REGISTRY; `ess-explorer models --families` prints it and docs/families.md shows
`support_table()`, its rendering (scripts/docs_hooks.py), so neither can fall behind it. To
support a new model type, add one entry to REGISTRY (a multimodal class's to
capture/vision_language.py, a type analysed only as a decoder to capture/decoder_configs.py, whose entries
REGISTRY takes in) with a reconstruction test from a tiny config (tests/test_families.py).
"""

from __future__ import annotations

import difflib

from torch import nn

from .attention import AttentionAdapter
from .base import LayerSlot
from .decoder_configs import decoder_config_types
from .layouts import (
    ATTENTION_KINDS,
    ATTENTION_LAYERS,
    NEMOTRON_SKIP,
    ModelType,
    blt,
    blt_skipped,
    cycles,
    falcon_h1,
    gpt_neo,
    hybrid,
    language_model_config,
    layer_types,
    longcat_flash,
    looped,
    mixers,
    recurrent_gemma,
    shared_attention,
    uniform,
)
from .refused import REFUSED, not_causal, part_of_a_larger_model
from .vision_language import vision_language_types

__all__ = [
    "REGISTRY",
    "REFUSED",
    "ModelType",
    "language_model_config",
    "MODEL_TYPES",
    "MODEL_FAMILIES",
    "layer_slots",
    "require_supported",
    "skipped_layers",
    "support_table",
    "supported_families",
    "supported_model_types",
]


_ATT = AttentionAdapter.family  # softmax_attention
# Softmax attention at model.layers[i].self_attn, each with a reconstruction test.
_ATTENTION_TYPES = (
    *("llama", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "mistral", "ministral", "mixtral"),
    *("gemma", "gemma2", "gemma3_text", "vaultgemma", "phi", "phi3", "phimoe", "persimmon"),
    *("olmo", "olmo2", "olmo3", "olmoe", "granite", "granitemoe", "cohere", "cohere2"),
    *("smollm3", "helium", "glm", "glm4", "stablelm", "starcoder2", "exaone4", "seed_oss"),
    *("arcee", "apertus", "hunyuan_v1_dense", "hunyuan_v1_moe", "gpt_oss", "nemotron", "ernie4_5"),
    *("ernie4_5_moe", "glm4_moe", "granitemoeshared", "cwm", "nanochat", "ministral3", "cohere2_moe"),
    *("exaone_moe", "flex_olmo", "hy_v3", "hyperclovax", "jais2", "minimax_m2", "solar_open", "xglm"),
    *("kolibri1", "flint", "mellum", "apertus1p5_text", "aria_text", "mimo_v2_flash", "dots1"),
    "doge",  # its dynamic mask (a bias per key, top keep_window_size keys per query) is inside T
    "chameleon",  # image tokens and text in one vocabulary; a text prompt
    "zaya",  # compressed convolutional attention: V from its qkv_proj (attention.py _fused_values)
    "inkling_text",  # V after its short conv (v_sconv); a relative-position bias from each token, inside T
    "cohere_compass_text",  # windows from layer_types; its full-attention layers have no RoPE
    "phi4_multimodal",  # Phi-3's fused qkv_proj; its image and audio embedders are not analysed
    "evolla",  # its adapters cross-attend to protein features after some layers; a text prompt has none
    # Model types transformers builds with another type's classes (Llama, GLM-4 MoE).
    *("exaone", "internlm3", "iquestcoder", "sarvam_moe", "param2moe"),
    "ergo",  # V from its fused qkv_proj
)
_ATTENTION_NOTE = "softmax attention (GQA: one T per query head; windows, chunks and soft-capping from the config)"
_MAMBA2_HYBRID = {"mamba": ("mamba", "mamba2"), "linear_attention": ("mamba", "mamba2"), **ATTENTION_LAYERS}
_DELTA = {"linear_attention": ("linear_attn", "gated_deltanet")}
_GATED_DELTA = {**_DELTA, "full_attention": ("self_attn", "gated_attention")}  # Qwen3-Next, Qwen3.5


REGISTRY: dict[str, ModelType] = {
    "gpt2": ModelType(uniform("transformer.h", "attn", "attention"), (_ATT,), "transformer.h[i].attn", _ATTENTION_NOTE),
    **{
        name: ModelType(
            uniform("model.layers", "self_attn", "attention"), (_ATT,), "model.layers[i].self_attn", _ATTENTION_NOTE
        )
        for name in _ATTENTION_TYPES
    },
    **{
        name: ModelType(uniform(path, attribute, "attention"), (_ATT,), f"{path}[i].{attribute}", _ATTENTION_NOTE)
        for name, path, attribute in (
            ("opt", "model.decoder.layers", "self_attn"),
            ("gpt_neox", "gpt_neox.layers", "attention"),
            ("bloom", "transformer.h", "self_attention"),
            ("gptj", "transformer.h", "attn"),
            ("codegen", "transformer.h", "attn"),
            ("mpt", "transformer.blocks", "attn"),
            ("dbrx", "transformer.blocks", "norm_attn_norm.attn"),
            ("biogpt", "biogpt.layers", "self_attn"),
            ("gpt_bigcode", "transformer.h", "attn"),
            ("openai-gpt", "transformer.h", "attn"),  # GPT-1
            ("ctrl", "transformer.h", "multi_head_attention"),
            ("gpt_neox_japanese", "gpt_neox_japanese.layers", "attention"),
            ("modernbert-decoder", "model.layers", "attn"),  # windows from layer_types
            ("git", "git.encoder.layer", "attention.self"),  # GIT's text decoder on a text prompt (no image)
        )
    },
    "gpt_neo": ModelType(
        gpt_neo, (_ATT,), "transformer.h[i].attn.attention", '"local" layers: a window of config.window_size'
    ),
    **{
        name: ModelType(
            uniform("model.layers", "self_attn", "latent_attention"),
            (_ATT,),
            "model.layers[i].self_attn",
            "latent attention (MLA: values from kv_b_proj)",
        )
        for name in (
            *("deepseek_v2", "deepseek_v3", "glm4_moe_lite", "minicpm3", "youtu", "sarvam_mla", "axk1"),
            "mistral4",  # Mistral 4: DeepSeek's latent attention
        )
    },
    **{
        name: ModelType(
            uniform("model.layers", "self_attn", "latent_attention"),
            (_ATT,),
            "model.layers[i].self_attn",
            "latent attention (MLA) over the keys its indexer selects (DeepSeek sparse attention: the "
            "selection is part of T)",
        )
        for name in ("deepseek_v32", "glm_moe_dsa")
    },
    "axk2": ModelType(
        uniform("model.layers", "self_attn", "gated_latent_attention"),
        (_ATT,),
        "model.layers[i].self_attn",
        "latent attention (MLA) over the keys its indexer selects, with a sigmoid output gate from q_gate_proj "
        "(out_gate)",
    ),
    "hy_v4": ModelType(  # its hyper-connections (iHC) mix the residual streams around the layer, outside T
        uniform("model.layers", "self_attn", "gated_latent_attention"),
        (_ATT,),
        "model.layers[i].self_attn",
        "latent attention (MLA) with learned sinks and a sigmoid output gate per channel from gate_proj "
        '(out_gate), over the keys its indexer selects; "shared" layers (config.indexer_types) reuse an '
        "earlier layer's selection (part of T either way)",
    ),
    "dots3_note_text": ModelType(
        hybrid(
            "model.layers",
            {kind: ("self_attn", "gated_latent_attention") for kind in ("sliding_attention", "indexed_attention")},
        ),
        (_ATT,),
        "model.layers[i].self_attn",
        'latent attention (MLA) with a sigmoid gate per head from g_proj (out_gate); "sliding_attention" layers '
        'windowed, "indexed_attention" layers over the keys their indexer selects (part of T)',
    ),
    "longcat_flash": ModelType(
        longcat_flash,
        (_ATT,),
        "model.layers[i].self_attn[0, 1]",
        "two latent-attention (MLA) blocks per layer in turn: keys 2i and 2i + 1, labelled",
    ),
    "minimax_m3_vl_text": ModelType(
        uniform("model.layers", "self_attn", "attention"),
        (_ATT,),
        "model.layers[i].self_attn",
        '"minimax_m3_sparse" layers: attention over the key blocks their indexer selects (part of T); '
        '"full_attention" layers: softmax attention',
    ),
    "minicpm5_moe": ModelType(
        uniform("model.layers", "self_attn", "gated_attention"),
        (_ATT,),
        "model.layers[i].self_attn",
        "softmax attention with a sigmoid output gate from q_gate_proj ([query | gate] per head; out_gate)",
    ),
    "afmoe": ModelType(
        uniform("model.layers", "self_attn", "projected_gate_attention"),
        (_ATT,),
        "model.layers[i].self_attn",
        "softmax attention with a sigmoid output gate from gate_proj (out_gate); windows from layer_types",
    ),
    "laguna": ModelType(
        uniform("model.layers", "self_attn", "softplus_gate_attention"),
        (_ATT,),
        "model.layers[i].self_attn",
        "softmax attention with a softplus output gate from g_proj, per head or per channel (config.gating; "
        "out_gate); heads per layer from config.num_attention_heads_per_layer, windows from layer_types",
    ),
    "beam": ModelType(
        uniform("model.layers", "self_attn", "projected_gate_attention"),
        (_ATT,),
        "model.layers[i].self_attn",
        "softmax attention with a sigmoid output gate from gate_proj plus a bias per head (gate_bias; out_gate); "
        "windows from layer_types",
    ),
    "dory": ModelType(
        looped(
            "projected_gate_attention",
            lambda config: (
                config.n_input_layers,
                config.n_input_layers + config.n_recurrent_layers,
                config.n_recurrent_loops,
            ),
        ),
        (_ATT,),
        "model.layers[i].self_attn",
        "softmax attention (unit-norm q, k) with a sigmoid output gate from gate_proj scaled by s_gate, and the "
        "L2 norm over its heads (attn_sub_norm) in the out_gate; windows from layer_types; the recurrent "
        'layers once per loop, keyed in the order they run, labelled "layer i pass p"',
    ),
    "diffllama": ModelType(
        uniform("model.layers", "self_attn", "diff_attention"),
        (_ATT,),
        "model.layers[i].self_attn",
        "differential attention: a unit per head pair, T = A_p - lambda A_(p+H/2) over the pair's values "
        "[v_a | v_b], its weightless norm's per-token scale the out_gate",
    ),
    "bitnet": ModelType(
        uniform("model.layers", "self_attn", "projected_gate_attention"),
        (_ATT,),
        "model.layers[i].self_attn",
        "softmax attention; the RMS norm over all heads before o_proj (attn_sub_norm): its per-token scale "
        "in the out_gate, its weight outside T",
    ),
    "inkling2_text": ModelType(
        uniform("model.layers", "self_attn", "projected_gate_attention"),
        (_ATT,),
        "model.layers[i].self_attn",
        "softmax attention with a sigmoid output gate from o_proj.gate_proj (out_gate); V after its short conv "
        'and norm (v_proj); "hybrid_sliding" layers windowed',
    ),
    "inkling2_loop_text": ModelType(
        looped(
            "projected_gate_attention",
            lambda config: (config.loop_layer_index_start, config.loop_layer_index_end, config.loop_num_passes),
        ),
        (_ATT,),
        "model.layers[i].self_attn",
        "as inkling2_text; the loop's layers (config.loop_layer_index_start to loop_layer_index_end - 1) run "
        'config.loop_num_passes times: a slot per call, keyed in the order they run, labelled "layer i pass p"',
    ),
    "hrm_text": ModelType(
        cycles("projected_gate_attention"),
        (_ATT,),
        "model.L_module.layers[i].self_attn, model.H_module.layers[i].self_attn",
        "softmax attention with a sigmoid output gate from gate_proj (out_gate); the L stack runs "
        "config.L_cycles times per H cycle, then the H stack: a slot per call, keyed in the order they run, "
        'labelled "L layer i cycle h.l" / "H layer i cycle h"; a prompt is causal (the bidirectional '
        "instruction block of prefix_lm needs token_type_ids, which analyze does not pass)",
    ),
    "falcon": ModelType(
        uniform("transformer.h", "self_attention", "attention"),
        (_ATT,),
        "transformer.h[i].self_attention",
        _ATTENTION_NOTE,
    ),
    "llama4_text": ModelType(
        uniform("model.layers", "self_attn", "attention"),
        (_ATT, "chunked_attention"),
        "model.layers[i].self_attn",
        '"chunked_attention" layers: chunked attention (TSS t mod C); the others softmax attention',
    ),
    **{
        name: ModelType(
            uniform("backbone.layers", "mixer", "mamba"),
            ("mamba",),
            "backbone.layers[i].mixer",
            "mamba (one T per channel)",
        )
        for name in ("mamba", "falcon_mamba")
    },
    "mamba2": ModelType(
        uniform("backbone.layers", "mixer", "mamba2"), ("mamba2",), "backbone.layers[i].mixer", "mamba2 (SSD)"
    ),
    **{
        name: ModelType(
            hybrid("model.layers", {"conv": ("conv", "short_conv"), **ATTENTION_LAYERS}),
            ("short_conv", _ATT),
            "model.layers[i]",
            '"conv" -> .conv, short conv; "full_attention" -> .self_attn, attention',
        )
        for name in ("lfm2", "lfm2_moe")
    },
    "lfm3": ModelType(
        hybrid(
            "model.layers",
            {
                "conv": ("conv", "short_conv"),
                **{kind: ("self_attn", "projected_gate_attention") for kind in ATTENTION_KINDS},
            },
        ),
        ("short_conv", _ATT),
        "model.layers[i]",
        '"conv" -> .conv, short conv; attention layer types -> .self_attn, attention with a sigmoid output '
        "gate per head from g_proj (out_gate), where config.use_attention_gate",
    ),
    "jamba": ModelType(
        hybrid(
            "model.layers", {"mamba": ("mamba", "mamba"), "linear_attention": ("mamba", "mamba"), **ATTENTION_LAYERS}
        ),
        ("mamba", _ATT),
        "model.layers[i]",
        'layers_block_type "mamba" -> .mamba, mamba; "attention" -> .self_attn, attention',
    ),
    "bamba": ModelType(
        hybrid("model.layers", _MAMBA2_HYBRID),
        ("mamba2", _ATT),
        "model.layers[i]",
        '"linear_attention" -> .mamba, mamba2; "full_attention" -> .self_attn, attention',
    ),
    "granitemoehybrid": ModelType(
        hybrid("model.layers", _MAMBA2_HYBRID),
        ("mamba2", _ATT),
        "model.layers[i]",
        '"mamba" -> .mamba, mamba2; "attention" -> .self_attn, attention',
    ),
    "zamba2": ModelType(
        shared_attention("shared_transformer", "zamba2_attention", "mamba2"),
        ("mamba2", _ATT),
        "model.layers[i]",
        '"mamba" -> .mamba, mamba2; "hybrid" -> the shared attention block .shared_transformer.self_attn '
        "(attention, V with its depth's adapter) and .mamba_decoder.mamba: keys 2i and 2i + 1, labelled",
    ),
    "zamba": ModelType(
        shared_attention("shared_transf", "attention", "mamba"),
        ("mamba", _ATT),
        "model.layers[i]",
        '"mamba" -> .mamba, mamba; "hybrid" -> the shared attention block .shared_transf.self_attn (attention) '
        "and .mamba_decoder.mamba: keys 2i and 2i + 1, labelled",
    ),
    "falcon_h1": ModelType(
        falcon_h1,
        ("mamba2", _ATT),
        "model.layers[i]",
        ".mamba (mamba2) and .self_attn (attention) in parallel: two slots per layer, keys 2i and 2i + 1, labelled",
    ),
    "nemotron_h": ModelType(
        mixers(
            "model.layers",
            "mixer",
            {"mamba": "mamba2", "linear_attention": "mamba2", **{k: "attention" for k in ATTENTION_KINDS}},
            NEMOTRON_SKIP,
        ),
        ("mamba2", _ATT),
        "model.layers[i].mixer",
        '"mamba" -> mamba2; "attention" -> attention; "mlp" / "moe": no slot, listed as skipped with the reason',
        skipped=lambda model: {
            i: NEMOTRON_SKIP[kind] for i, kind in enumerate(layer_types(model)) if kind in NEMOTRON_SKIP
        },
    ),
    "blt": ModelType(  # Byte Latent Transformer
        blt,
        (_ATT,),
        "model.local_encoder.layers[i].self_attn, model.local_decoder.layers[i].self_attn",
        "softmax attention over the prompt's bytes, windowed by config.local_attention_window_len: the local "
        "encoder's layers, then the local decoder's, keyed in the order the pass runs them and labelled "
        '"encoder layer i" / "decoder layer i"; the global transformer runs over patches of bytes: its layers\' '
        "keys are listed as skipped with the reason",
        skipped=blt_skipped,
    ),
    "recurrent_gemma": ModelType(
        recurrent_gemma,
        ("rg_lru", _ATT),
        "model.layers[i].temporal_block",
        '"recurrent" -> RG-LRU; "attention" -> local attention',
    ),
    "minimax": ModelType(
        hybrid("model.layers", {"linear_attention": ("self_attn", "lightning_attention"), **ATTENTION_LAYERS}),
        ("lightning_attention", _ATT),
        "model.layers[i].self_attn",
        '"linear_attention" -> lightning attention; "full_attention" -> attention',
    ),
    "rwkv": ModelType(
        uniform("rwkv.blocks", "attention", "rwkv"), ("rwkv",), "rwkv.blocks[i].attention", "RWKV-4 time mixing"
    ),
    "xlstm": ModelType(
        uniform("backbone.blocks", "mlstm_layer", "mlstm"), ("mlstm",), "backbone.blocks[i].mlstm_layer", "mLSTM"
    ),
    "ess_linear_attention": ModelType(
        uniform("model.layers", "mixer", "linear_attention"),
        ("linear_attention", "gated_linear_attention"),
        "model.layers[i].mixer",
        "the zoo's own linear attention, gated or not",
    ),
    **{
        name: ModelType(
            hybrid("model.layers", _GATED_DELTA),
            ("gated_deltanet", _ATT),
            "model.layers[i]",
            '"linear_attention" -> .linear_attn, Gated DeltaNet (DPLR; the scale of its gated norm the '
            'out_gate); "full_attention" -> .self_attn, gated attention',
        )
        for name in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
    },
    "qwen4_exp_text": ModelType(
        hybrid("model.layers", {**_DELTA, "indexed_attention": _GATED_DELTA["full_attention"]}),
        ("gated_deltanet", _ATT),
        "model.layers[i]",
        '"linear_attention" -> .linear_attn, Gated DeltaNet (DPLR; the scale of its gated norm the '
        'out_gate); "indexed_attention" -> .self_attn, gated attention over the blocks of keys its indexer '
        "selects (the selection is inside T)",
    ),
    **{
        name: ModelType(
            uniform("model.layers", "self_attn", "gemma4_attention"),
            (_ATT,),
            "model.layers[i].self_attn",
            "softmax attention; V after v_norm; the KV-sharing last layers read an earlier layer's V",
        )
        for name in ("gemma4_text", "gemma4_unified_text", "gemma3n_text")  # Gemma 3n's attention is Gemma 4's
    },
    "kolibri1_1": ModelType(
        uniform("model.layers", "self_attn", "kolibri_attention"),
        (_ATT,),
        "model.layers[i].self_attn",
        '"sliding_attention": windowed attention; "indexed_attention": attention over the keys its indexer '
        "selects (part of T), to values rounded to NVFP4, some reading an earlier layer's K and V",
    ),
    "lara_mini": ModelType(
        hybrid("model.layers", {**_DELTA, **ATTENTION_LAYERS}),
        ("gated_deltanet", _ATT),
        "model.layers[i]",
        '"linear_attention" -> .linear_attn, Gated DeltaNet (the scale of its gated norm the out_gate); '
        '"sliding_attention" / "full_attention" -> .self_attn, attention',
    ),
    "olmo_hybrid": ModelType(
        hybrid("model.layers", {**_DELTA, **ATTENTION_LAYERS}),
        ("gated_deltanet", _ATT),
        "model.layers[i]",
        '"linear_attention" -> .linear_attn, Gated DeltaNet (the scale of its gated norm the out_gate); '
        '"full_attention" -> .self_attn, attention',
    ),
    "kimi_linear": ModelType(
        hybrid(
            "model.layers",
            {"linear_attention": ("self_attn", "kda"), "full_attention": ("self_attn", "latent_attention")},
        ),
        ("kda", _ATT),
        "model.layers[i].self_attn",
        '"linear_attention" -> KDA (per-key decay; the scale of its gated norm the out_gate); '
        '"full_attention" -> latent attention (MLA)',
    ),
    "bailing_hybrid": ModelType(  # Ling 3
        hybrid(
            "model.layers",
            {"linear_attention": ("self_attn", "kda"), "full_attention": ("self_attn", "gated_latent_attention")},
        ),
        ("kda", _ATT),
        "model.layers[i].self_attn",
        '"linear_attention" -> KDA (per-key decay; the scale of its gated norm the out_gate); '
        '"full_attention" -> latent attention (MLA) with a sigmoid gate per head from g_proj (out_gate)',
    ),
    "glm5_next_text": ModelType(  # GLM-5.3-Flash's language model
        hybrid(
            "model.layers",
            {"linear_attention": ("self_attn", "kda"), "indexed_attention": ("self_attn", "latent_attention")},
        ),
        ("kda", _ATT),
        "model.layers[i].self_attn",
        '"linear_attention" -> KDA (per-key decay; the scale of its gated norm the out_gate); '
        '"indexed_attention" -> latent attention (MLA) over the key pools its indexer selects, plus the '
        "incomplete last pool (the selection is inside T)",
    ),
}
REGISTRY.update(decoder_config_types())  # BERT's family and XLM, as decoders only
REGISTRY.update(vision_language_types(REGISTRY))  # their language model, on a text prompt


# Views of the registry (one table): model type -> slots, and model type -> its families.
MODEL_TYPES = {name: entry.slots for name, entry in REGISTRY.items()}
MODEL_FAMILIES = {name: entry.families for name, entry in REGISTRY.items()}


def skipped_layers(model: nn.Module) -> dict[int, str]:
    """Layers of ``model`` that get no LayerSlot, with the reason (recorded in
    ESSResult.meta["skipped_layers"]; never skipped silently)."""
    entry = REGISTRY.get(getattr(getattr(model, "config", None), "model_type", None))
    return entry.skipped(model) if entry is not None and entry.skipped is not None else {}


def support_table() -> str:
    """The registry as a Markdown table (docs/families.md shows it): every model type, where
    its layers are, the families they can have and how its layer kinds map to them."""
    rows = ["| model_type | layers | families | layer kinds |", "|---|---|---|---|"]
    for name in supported_model_types():
        entry = REGISTRY[name]
        rows.append(f"| {name} | `{entry.layers}` | {', '.join(entry.families)} | {entry.kinds} |")
    return "\n".join(rows) + "\n"


def supported_model_types() -> list[str]:
    return sorted(REGISTRY)


def supported_families() -> dict[str, tuple[str, ...]]:
    """Every supported model type -> the families its analysed layers can have (sorted by type)."""
    return {name: REGISTRY[name].families for name in supported_model_types()}


def require_supported(model_type, what: str, config=None) -> None:
    """ValueError unless ``model_type`` is supported: the reason for a refused one, for a
    registered one its ``config`` makes no causal model (BERT's family as an encoder), or for an
    encoder, encoder-decoder, audio or vision model (`not_causal`, from ``config`` where given),
    the closest supported ones otherwise. ``what`` names the model in the message. load_model calls it on the config,
    before any weights are read."""
    entry = REGISTRY.get(model_type)  # never also in REFUSED (tests/test_adapters.py)
    if entry is not None:
        why = entry.refuses(config) if entry.refuses is not None and config is not None else None
        if why is None:
            return
    else:
        why = REFUSED.get(model_type) or not_causal(model_type, config)
    if why:
        raise ValueError(f"model type {model_type!r} ({what}) is not supported: {why} (docs/families.md)")
    close = difflib.get_close_matches(str(model_type), supported_model_types(), n=3, cutoff=0.5)
    hint = (f" Closest supported: {', '.join(close)}." if close else "") + part_of_a_larger_model(model_type)
    # The count and where to find the list, not the list: some 260 names on one line bury the hint.
    raise ValueError(
        f"model type {model_type!r} ({what}) is not supported.{hint} {len(REGISTRY)} model types are supported: "
        "`ess-explorer models --families` lists them and docs/families.md says what T is for each. "
        "Model types are registered in one place, ess_explorer/capture/registry.py (REGISTRY): add the "
        "model type there."
    )


def layer_slots(model: nn.Module) -> list[LayerSlot]:
    """Every layer of ``model`` as a LayerSlot; ValueError for an unsupported model type."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    require_supported(model_type, type(model).__name__, config)
    return REGISTRY[model_type].slots(model)
