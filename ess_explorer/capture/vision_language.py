"""The multimodal, vision-language and speech / audio LM classes: their language model, analysed on
a text prompt (images and audio are not analysed; docs/families.md). `vision_language_types(registry)`
gives their entries, which capture/registry.py adds to REGISTRY; the language model is read where
the class keeps it, in one of five ways:

- a plain softmax-attention language model of the class's own text type, at
  ``model.language_model`` (``model.text_model`` for Granite Docling and Emu3,
  ``text_model.model`` for Kosmos-2.5);
- heads with a sigmoid output gate (Step 3.7, Muse Glimmer, Muse Spark), read as AFMoE's, and
  Mistral Large 4's latent attention over the keys its indexer selects, read as DeepSeek-V3.2's;
- a wrapper around a language model of another type (Mistral 3 around Mistral, the LLaVA family
  and InternVL around Llama, Qwen2, ...; Idefics 2 / 3 and SmolVLM keep theirs at
  ``model.text_model``; the speech and audio LMs, Qwen2-Audio, Voxtral, Granite Speech, ..., around
  Qwen2, Llama, Granite and Qwen3): any softmax-attention type of the registry, read with that
  type's own layout (`_wrapped_attention`). BLIP-2 and InstructBLIP are not among them: their
  forward needs an image (capture/refused.py);
- always one supported type (Gemma 3 around gemma3_text, Kimi K2.5 around DeepSeek-V3, ...):
  that type's own entry, applied to the language model (`_of_language_model`);
- Llama 3.2 Vision (``mllama``): its self-attention layers; its cross-attention layers attend to
  the image, a text prompt skips them, and they are listed as skipped.

Where transformers also builds a class's language model alone (its text config's base model,
``AutoModel``: no LM head, no vision tower; Qwen2-VL's ``qwen2_vl_text``, ...), that text type is
supported too, read as inside its class at the base model's ``layers`` (`_ALONE`).
"""

from __future__ import annotations

import operator
from typing import Mapping

from torch import nn

from .attention import AttentionAdapter
from .base import LayerSlot
from .layouts import MLLAMA_CROSS, ModelType, language_model_config, mllama, uniform

__all__ = ["vision_language_types"]

_ATT = AttentionAdapter.family  # softmax_attention
# Classes whose language model, at model.language_model, is of their own type + "_text".
_OWN_TEXT_TYPE = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "glm4v", "glm4v_moe", "glm_ocr")
_OWN_TEXT_TYPE += ("paddleocr_vl", "cosmos3_edge")  # GLM-4.1V and 4.5V are glm4v and glm4v_moe
# DeepSeek-V2's layers with Llama's attention; Unlimited-OCR's "reference_sliding_attention" windows
# only the tokens generated after the prompt: a prompt is attended to whole, and T is causal.
_OWN_TEXT_TYPE += ("deepseek_ocr2", "unlimited_ocr")
_OWN_TEXT_TYPE += ("cohere_compass",)  # Qwen3-VL's positions and vision tower around Cohere's attention
# Granite's attention (deepstack features join image tokens only); HunYuan's q/k norms after RoPE;
# Molmo2's q/k norms, its image tokens attending to each other both ways (a text prompt has none).
_OWN_TEXT_TYPE += ("granite4_vision", "hunyuan_vl", "molmo2")
_OWN_TEXT_TYPE += ("ernie4_5_vl_moe",)  # ERNIE 4.5 VL: its text and vision experts are MLPs
# Wrappers, by where they keep their language model.
_WRAPPERS = {
    "model.language_model": (
        *("mistral3", "llava", "llava_next", "llava_next_video", "video_llava", "llava_onevision"),
        *("vipllava", "internvl", "aya_vision", "cohere2_vision", "ovis2"),
        *("deepseek_vl", "deepseek_vl_hybrid", "janus", "video_llama_3", "lighton_ocr"),
        *("hyperclovax_vision_v2", "fuyu", "got_ocr2", "pp_chart2table", "qianfan_ocr"),
        *("llava_onevision1_5", "ovis2_5"),
        # vision towers that are timm's: `load_model` loads the language model alone (model_classes.py),
        # and a whole model built where timm is installed is read here
        *("perception_lm", "fast_vlm"),
        # speech and audio LMs: an audio tower whose features fill the audio tokens of the prompt
        *("qwen2_audio", "voxtral", "granite_speech", "granite_speech_plus", "glmasr", "qwen3_asr"),
        *("fun_asr_nano", "omniasr", "vibevoice_asr", "moss_transcribe_diarize"),
    ),
    "model.text_model": ("idefics2", "idefics3", "smolvlm"),
}
# Classes around one supported type each (their language model at model.language_model).
_AROUND_ONE_TYPE = (
    *((name, f"{name}_text") for name in ("gemma3", "gemma4", "gemma4_unified", "qwen3_5", "qwen3_5_moe")),
    ("qwen4_exp", "qwen4_exp_text"),
    ("glm5_next", "glm5_next_text"),
    ("exaone4_5", "exaone4"),
    ("aria", "aria_text"),
    ("minimax_m3_vl", "minimax_m3_vl_text"),
    ("lfm2_vl", "lfm2"),
    ("lfm3_vl", "lfm3"),
    ("kimi_k25", "deepseek_v3"),
    ("shieldgemma2", "gemma3_text"),
    ("inkling_mm_model", "inkling_text"),
    ("inkling2", "inkling2_text"),
    ("inkling2_loop", "inkling2_loop_text"),
    ("dots3_note", "dots3_note_text"),
    ("hy_v4_vl", "hy_v4"),  # its text model's layers are HY V4's
    ("apertus1p5", "apertus1p5_text"),  # images and audio are tokens of its vocabulary
    *((name, "qwen3_5_text") for name in ("minicpmv4_6", "minicpmv4_7", "minicpm_ocr")),
    ("nemo_speechlm", "nemotron_h"),  # Nemotron 3.5 Transcribe: Nemotron-H's base model, after its audio towers
    ("gemma3n", "gemma3n_text"),  # its vision tower is timm's, as PerceptionLM's above
)
# Language models whose config has a type of its own but whose layers are another type's.
_READ_AS = {"hy_v4_vl_text": "hy_v4"}
# The language models transformers builds alone as well (module docstring): text type -> the
# adapter of its heads. The other classes' text configs have no model class of their own.
_ALONE = {
    **dict.fromkeys(
        (
            *(f"{name}_text" for name in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "glm4v", "glm4v_moe")),
            *(f"{name}_text" for name in ("glm_ocr", "cosmos3_edge", "hunyuan_vl", "molmo2", "granite_docling")),
        ),
        "attention",
    ),
    **dict.fromkeys(("muse_glimmer_text", "muse_spark_text"), "projected_gate_attention"),
    "mistral_large4_text": "latent_attention",
}


def _wrapped_attention(registry: Mapping[str, ModelType], where: str):
    """The language model at ``where`` of a wrapper class, read with the layout of the type its
    text config names, which must be a softmax-attention type of the registry (any other is
    refused with the list)."""

    def layout(model: nn.Module) -> list[LayerSlot]:
        text_type = language_model_config(model.config).model_type
        entry = registry.get(text_type)
        if entry is None or entry.families != (_ATT,):
            allowed = sorted(name for name, entry in registry.items() if entry.families == (_ATT,))
            raise ValueError(
                f"{model.config.model_type} with a {text_type!r} language model is not supported: its language "
                f"model must be one of the softmax-attention model types ({', '.join(allowed)})"
            )
        return entry.slots(operator.attrgetter(where)(model))

    return layout


def _of_language_model(
    registry: Mapping[str, ModelType], text_type: str, where: str = "model.language_model"
) -> ModelType:
    """The entry of a vision-language class whose language model (at ``where``) is always of
    the supported type ``text_type``: that type's own layout, applied to it. Under ``model.`` the
    language model is a base model (its layers at ``where.layers``), elsewhere a causal LM
    (at ``where.model.layers``). A language model of another type (a config may name one) is
    refused: that type's modules would be read as ``text_type``'s."""
    text, read = registry[text_type], operator.attrgetter(where)
    skipped = text.skipped
    base_model = where if where.startswith("model.") else f"{where}.model"

    def language_model(model: nn.Module) -> nn.Module:
        found = read(model).config.model_type
        if _READ_AS.get(found, found) != text_type:
            raise ValueError(
                f"{model.config.model_type} with a {found!r} language model is not supported: ess-explorer reads "
                f"its language model as {text_type}"
            )
        return read(model)

    return ModelType(
        lambda model: text.slots(language_model(model)),
        text.families,
        f"{base_model}.{text.layers.removeprefix('model.')}",
        f"the language model of the multimodal class, as {text_type} (text prompts): {text.kinds}",
        None if skipped is None else lambda model: skipped(language_model(model)),
    )


def vision_language_types(registry: Mapping[str, ModelType]) -> dict[str, ModelType]:
    """The entries of the multimodal classes (module docstring); ``registry`` holds the text
    types they read, and a wrapper reads it again at each call (it sees every type added)."""
    return {
        **{
            name: ModelType(
                uniform(f"{where}.layers", "self_attn", "attention"),
                (_ATT,),
                f"{where}.layers[i].self_attn",
                f"the language model of the multimodal class, as {text} (text prompts)",
            )
            for name, text, where in (
                *((name, f"{name}_text", "model.language_model") for name in _OWN_TEXT_TYPE),
                *((name, "glm4v_text", "model.language_model") for name in ("glm46v", "glmga")),  # GLM-4.6V
                ("cosmos3_omni", "qwen3_vl_text", "model.language_model"),
                # the thinkers of Qwen2.5-Omni and Qwen3-Omni (their audio and vision towers not analysed)
                ("qwen2_5_omni_thinker", "qwen2_5_omni_text", "model.language_model"),
                ("qwen3_omni_moe_thinker", "qwen3_omni_moe_text", "model.language_model"),
                ("granite_docling", "granite_docling_text", "model.text_model"),
                ("emu3", "emu3_text_model", "model.text_model"),  # images are tokens of its vocabulary
                # Kosmos-2.5: its image's latent queries fill the prompt's image tokens (a text prompt has none)
                ("kosmos-2.5", "kosmos_2_5_text_model", "text_model.model"),
            )
        },
        **{
            name: ModelType(
                uniform("model.language_model.layers", "self_attn", "projected_gate_attention"),
                (_ATT,),
                "model.language_model.layers[i].self_attn",
                "the language model of the multimodal class: softmax attention with a sigmoid output gate "
                f"(out_gate) from {gate}; windows from layer_types",
            )
            for name, gate in (
                ("step3p7", "g_proj (per head or per channel, config.gating)"),
                ("muse_glimmer", "gate_proj (per channel)"),
                ("muse_spark", "gate_proj (per channel), after o_norm's 1 / rms_t per head"),
            )
        },
        "mistral_large4": ModelType(
            uniform("model.language_model.layers", "self_attn", "latent_attention"),
            (_ATT,),
            "model.language_model.layers[i].self_attn",
            "the language model of the multimodal class: latent attention (MLA) over the keys its indexer "
            'selects (part of T; "shared" indexer layers reuse an earlier selection), some layers reading an '
            "earlier layer's latent",
        ),
        **{
            name: ModelType(
                _wrapped_attention(registry, where),
                (_ATT,),
                f"{where}: the layers of its language model's type",
                "the language model of the multimodal class, when it is one of the softmax-attention types "
                "above (text prompts)",
            )
            for where, names in _WRAPPERS.items()
            for name in names
        },
        **{name: _of_language_model(registry, text_type) for name, text_type in _AROUND_ONE_TYPE},
        # a whole causal LM at language_model
        "llama4": _of_language_model(registry, "llama4_text", where="language_model"),  # Llama 4 Scout, Maverick
        "nemotron_h_omni": _of_language_model(registry, "nemotron_h", where="language_model"),  # Nemotron Nano VL
        **{
            text: ModelType(
                uniform("model.layers", "self_attn", adapter),
                (_ATT,),
                "model.layers[i].self_attn",
                f"the language model of {text.removesuffix('_text')} alone (its base model: no LM head), read as "
                "inside that class",
            )
            for text, adapter in _ALONE.items()
        },
        **{text: registry[read_as] for text, read_as in _READ_AS.items()},  # HY V4 VL's: HY V4's layers
        "mllama": ModelType(  # Llama 3.2 Vision
            mllama,
            (_ATT,),
            "model.language_model.layers[i].self_attn",
            "self-attention layers; the cross-attention layers (config.cross_attention_layers) attend to the "
            "image and are listed as skipped",
            skipped=lambda model: dict.fromkeys(
                language_model_config(model.config).cross_attention_layers, MLLAMA_CROSS
            ),
        ),
    }
