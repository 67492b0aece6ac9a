"""Model types that are refused, with the reason (docs/families.md, "Not supported"): layers that
look like softmax attention but whose head outputs are not T times values a hook can read, and
classes that are not a causal sequence model run on a text prompt. `require_supported`
(capture/registry.py) raises with the reason, before any weights are read.
"""

from __future__ import annotations

__all__ = ["REFUSED"]

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
    "deepseek_v4": "besides a window of recent tokens it attends to entries its compressors pool from "
    f"windows of tokens (HCA / CSA), with projections and gates of their own, {_NOT_T}",
    "voxtral_realtime": "its forward needs audio (input_features): a streaming model, it adds an audio "
    "embedding to every text token's, so a text prompt alone is not an input it takes",
    "kyutai_speech_to_text": "each of its input tokens is a text token together with the audio codes of one "
    "frame (input_ids of shape batch x length x (1 + num_codebooks)), so a text prompt alone is not an input it takes",
    "diffusion_gemma": "it is a block-diffusion model: its forward also runs a decoder that refines a canvas of "
    "tokens attending to each other both ways (and to the prompt's cache), so its T is not causal",
    **dict.fromkeys(
        ("blip-2", "instructblip", "instructblipvideo"),
        "its forward requires pixel_values: its language model reads the image's query features before the "
        "prompt, so a text prompt alone is not an input it takes",
    ),
    "kosmos-2": "its forward requires an image (pixel_values or image_embeds), whose latent queries it places "
    "among the prompt's tokens, so a text prompt alone is not an input it takes",
    "paligemma": "its prompt is a prefix whose tokens attend to each other both ways (token_type_ids), so its T "
    "over a prompt is not causal",
    **dict.fromkeys(
        ("pi0", "pi05"),
        "it is a robot policy built on PaliGemma: its forward denoises a chunk of actions from the robot's state, "
        "attending to an image-and-prompt prefix that attends to itself both ways, so it is not a causal model "
        "run on a prompt",
    ),
}
