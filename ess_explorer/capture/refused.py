"""Model types that are refused, with the reason (docs/families.md, "Not supported"): layers that
look like softmax attention but whose head outputs are not T times values a hook can read, and
classes that are not a causal sequence model run on a text prompt. `require_supported`
(capture/registry.py) raises with the reason, before any weights are read. Encoders and
encoder-decoders (BERT, T5, Whisper, ...), the decoders of encoder-decoders alone (BartForCausalLM,
...), and audio and vision models (wav2vec2, ViT, ...), are not listed one by one: `not_causal`
tells them from their config and transformers' auto classes, so a type this list has never seen
gets the reason too. BERT's family and XLM are supported as decoders and refused as encoders, by
their config (capture/decoder_configs.py).
"""

from __future__ import annotations

__all__ = ["REFUSED", "DECODER_OF_ENCODER_DECODER", "ENCODER", "not_causal", "part_of_a_larger_model"]

_CAUSAL_MODELS = (
    "ESS measures causal sequence models: decoder-only language models, state-space models and their hybrids"
)
ENCODER = (
    "it is an encoder: every token attends to every other (both ways), so its T is not causal and no cut of it "
    f"maps past inputs alone to future outputs. {_CAUSAL_MODELS}"
)
DECODER_OF_ENCODER_DECODER = (
    "it is the decoder of an encoder-decoder: each of its layers also attends to the encoder's output "
    "(encoder_hidden_states), which a text prompt does not give, and run on a prompt alone it skips that "
    f"attention, so it would not be the model it was trained as. {_CAUSAL_MODELS}"
)

_NOT_T = "so its head outputs are not an operator T applied to values a hook can read"
REFUSED: dict[str, str] = {
    **dict.fromkeys(
        ("granite_swa", "granitemoe_swa"),
        f"its sink scales each row after the softmax, from logits the layer does not return, {_NOT_T}",
    ),
    "jetmoe": f"its attention heads are experts routed per token (a mixture of attention heads), {_NOT_T}",
    **dict.fromkeys(
        ("gemma4_assistant", "gemma4_unified_assistant"),
        "it drafts tokens for Gemma 4 from its backbone's hidden states and keys and values "
        "(shared_kv_states), not from a prompt",
    ),
    **{
        name: f"its thinker (model.thinker, model type {name}_thinker) is supported, but the class itself has no "
        "forward pass (generate runs the thinker, then a talker on the thinker's hidden states)"
        for name in ("qwen2_5_omni", "qwen3_omni_moe")
    },
    "reformer": "its LSH attention layers hash queries and keys into buckets by random rotations (drawn anew "
    "at each forward pass unless config.hash_seed is set) and attend within chunks of the sorted order, over "
    f"several hashing rounds, {_NOT_T}",
    "deepseek_v4": "besides a window of recent tokens it attends to entries its compressors pool from "
    f"windows of tokens (HCA / CSA), with projections and gates of their own, {_NOT_T}",
    "voxtral_realtime": "its forward needs audio (input_features): a streaming model, it adds an audio "
    "embedding to every text token's, so a text prompt alone is not an input it takes",
    "kyutai_speech_to_text": "each of its input tokens is a text token together with the audio codes of one "
    "frame (input_ids of shape batch x length x (1 + num_codebooks)), so a text prompt alone is not an input it takes",
    "moshi": "its forward needs the audio codes of both of its streams (moshi_audio_codes and user_audio_codes, "
    "or their waveforms) beside the text tokens: each step of its temporal transformer reads a text token with "
    "one frame of each stream's codes, so a text prompt alone is not an input it takes",
    "xlnet": "its attention is two-stream relative-position attention for permutation language modelling, and "
    "its checkpoints (config.attn_type 'bi') let every token attend to the whole prompt, so its T is not causal",
    "diffusion_gemma": "it is a block-diffusion model: its forward also runs a decoder that refines a canvas of "
    "tokens attending to each other both ways (and to the prompt's cache), so its T is not causal",
    "idefics": "its forward requires an image (exactly one of pixel_values, image_encoder_embeddings or "
    "perceiver_embeddings): its gated cross-attention layers attend to the image's features, so a text prompt "
    "alone is not an input it takes",
    "blip": "its captioning and question-answering classes require pixel_values: their text decoder attends to "
    "the image's features, so a text prompt alone is not an input it takes",
    **dict.fromkeys(
        ("blip-2", "instructblip", "instructblipvideo"),
        "its forward requires pixel_values: its language model reads the image's query features before the "
        "prompt, so a text prompt alone is not an input it takes",
    ),
    "kosmos-2": "its forward requires an image (pixel_values or image_embeds), whose latent queries it places "
    "among the prompt's tokens, so a text prompt alone is not an input it takes",
    "trocr": DECODER_OF_ENCODER_DECODER,  # TrOCR's text decoder, of a vision encoder-decoder
    # encoders outside transformers' masked-LM class (`not_causal` reads that), named close to decoders
    **dict.fromkeys(("embedding_gemma2", "embedding_gemma2_text", "openai_privacy_filter"), ENCODER),
    "cpmant": "its forward puts the whole prompt in its context, whose tokens attend to each other both ways "
    "(after prompt_length learned prompt tokens), so its T over a prompt is not causal",
    "paligemma": "its prompt is a prefix whose tokens attend to each other both ways (token_type_ids), so its T "
    "over a prompt is not causal",
    **dict.fromkeys(
        ("pi0", "pi05"),
        "it is a robot policy built on PaliGemma: its forward denoises a chunk of actions from the robot's state, "
        "attending to an image-and-prompt prefix that attends to itself both ways, so it is not a causal model "
        "run on a prompt",
    ),
}


def not_causal(model_type, config=None) -> str | None:
    """Why a model type outside the registry is no causal sequence model, where its config or
    transformers' auto classes tell: an encoder-decoder (``config.is_encoder_decoder``, or a
    type of the sequence-to-sequence auto class), the decoder of one alone (its causal-LM class:
    ``is_decoder``), an encoder (a type of the masked-LM auto class whose config does not make
    it a decoder: ``is_decoder``, or XLM's ``causal``), or an audio or vision model (a type of
    the auto classes that read audio, or images, and of no class that generates text:
    `_reads_no_text`). None where none holds."""
    from transformers.models.auto import modeling_auto as auto

    if getattr(config, "is_encoder_decoder", False) or (
        config is None and model_type in auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES
    ):
        return (
            "it is an encoder-decoder: its encoder reads the prompt with every token attending to every other, "
            f"so its T is not causal, and its decoder also attends to the encoder's output. {_CAUSAL_MODELS}"
        )
    decoder = getattr(config, "is_decoder", False) or getattr(config, "causal", False)
    if model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES and not decoder:
        return ENCODER
    if decoder and _among(model_type, auto, _SEQ_TO_SEQ_CLASSES):
        return DECODER_OF_ENCODER_DECODER  # BartForCausalLM, WhisperForCausalLM, ...: the decoder alone
    return _reads_no_text(model_type, auto)


# transformers' auto classes of sequence-to-sequence models, of models that read audio, and of
# models that read images
_SEQ_TO_SEQ_CLASSES = ("SEQ_TO_SEQ_CAUSAL_LM", "SPEECH_SEQ_2_SEQ")
_AUDIO_CLASSES = ("CTC", "AUDIO_CLASSIFICATION", "AUDIO_FRAME_CLASSIFICATION", "AUDIO_XVECTOR")
_VISION_CLASSES = ("IMAGE_CLASSIFICATION", "OBJECT_DETECTION", "SEMANTIC_SEGMENTATION", "DEPTH_ESTIMATION")
# ... and of models that generate text: a type in one of these is never called an audio or vision model
_TEXT_CLASSES = ("CAUSAL_LM", "IMAGE_TEXT_TO_TEXT", "MULTIMODAL_LM")


def _among(model_type, auto, classes) -> bool:
    """Whether ``model_type`` is a type of one of transformers' auto ``classes`` (read by name:
    a class a later transformers renames only makes a reason fall back to the generic one)."""
    return any(model_type in getattr(auto, f"MODEL_FOR_{name}_MAPPING_NAMES", {}) for name in classes)


def _reads_no_text(model_type, auto) -> str | None:
    """Why a type of transformers' audio or vision auto classes, and of none that generates
    text (Whisper and ShieldGemma 2 are in both), is no model of a text prompt."""
    if _among(model_type, auto, _TEXT_CLASSES):
        return None
    if _among(model_type, auto, _AUDIO_CLASSES):
        return (
            "it is an audio model (a type of transformers' speech-recognition or audio-classification classes): it "
            f"reads a waveform or its features, not a text prompt. {_CAUSAL_MODELS}"
        )
    if _among(model_type, auto, _VISION_CLASSES):
        return (
            "it is a vision model (a type of transformers' image-classification, detection, segmentation or "
            f"depth-estimation classes), not a sequence model of a text prompt. {_CAUSAL_MODELS}"
        )
    return None


def part_of_a_larger_model(model_type) -> str:
    """For a type transformers knows but builds no text-generating class of (no causal-LM,
    image-text-to-text or multimodal-LM class: a multimodal class's vision or text config, an
    embedding model, ...), the advice to analyse the model it is part of; "" for any other (a
    type transformers does not know may be a model of its own)."""
    from transformers.models.auto import configuration_auto
    from transformers.models.auto import modeling_auto as auto

    if model_type not in configuration_auto.CONFIG_MAPPING_NAMES or _among(model_type, auto, _TEXT_CLASSES):
        return ""
    return (
        " transformers has no text-generating class of this type (causal LM, image-text-to-text or multimodal LM): "
        "if it is part of a larger model (the vision or text config of a multimodal class), analyse that model."
    )
