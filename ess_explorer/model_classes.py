"""Which transformers class `load_model` (sources.py) builds from a config, and what of the
checkpoint that class may leave unread.

- `model_class(config)`: the class the checkpoint holds (`auto_class`), or, for a multimodal
  class whose vision tower needs a library this package does not install (timm), the causal-LM
  class of its language model alone, with the weight prefixes of the towers it leaves unread.
- `check_loading_info`: a ValueError naming every weight that does not match the config, other
  than those towers' (a random weight would make the analysis one of noise).
- `quiet_loading`: transformers' loading bar and load report off while a load runs, where they
  would only say what the two above already decide.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import NamedTuple

__all__ = ["BuiltClass", "auto_class", "check_loading_info", "model_class", "quiet_loading"]


# Multimodal types loaded as their language model alone (`model_class`): their vision towers
# are timm's. On a text prompt each runs exactly its language model (the towers only embed image
# and audio tokens). Per type: the weight prefixes of its towers, left unread, and the renaming of
# its language model's weights onto the causal-LM class, where transformers' own weight conversion
# does not do it (it maps Gemma 3n's "model.language_model." onto Gemma3nForCausalLM's "model.").
class _Alone(NamedTuple):
    towers: tuple[str, ...]
    key_mapping: dict | None = None


_UNDER_MODEL = {r"^model\.language_model\.": "model."}
_LANGUAGE_MODEL_ALONE = {
    "gemma3n": _Alone(("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")),
    "perception_lm": _Alone(("model.vision_tower.", "model.multi_modal_projector."), _UNDER_MODEL),
    "fast_vlm": _Alone(("model.vision_tower.", "model.multi_modal_projector."), _UNDER_MODEL),
}


class BuiltClass(NamedTuple):
    """What `load_model` builds: ``auto_class.from_pretrained(path, config=config, **kwargs)``,
    then `check_loading_info` with ``left_unread``."""

    auto_class: type
    config: object
    left_unread: tuple[str, ...] = ()
    kwargs: dict = {}


def model_class(config) -> BuiltClass:
    """The class to build for ``config``: its language model alone for a type of
    ``_LANGUAGE_MODEL_ALONE``, otherwise `auto_class`."""
    alone = _LANGUAGE_MODEL_ALONE.get(config.model_type)
    if alone is None:
        return BuiltClass(auto_class(config), config)
    from transformers import AutoModelForCausalLM

    kwargs = {"key_mapping": alone.key_mapping} if alone.key_mapping else {}
    return BuiltClass(AutoModelForCausalLM, config.text_config, alone.towers, kwargs)


def auto_class(config):
    """AutoModelForCausalLM where it builds the model of this config, otherwise, for a
    vision-language model, AutoModelForImageTextToText: its language model is what gets analysed.
    The second takes vision-language models the first cannot build (Mistral 3, LLaVA, Qwen2.5-VL,
    ...), and those it builds only the text model of (Llama 4, Qwen3.5): their checkpoints hold
    vision weights too, which the text model would leave unread (Llama 4's as unexpected keys,
    which `check_loading_info` refuses). Speech and audio language models (Qwen2-Audio, Voxtral,
    ...) are neither: AutoModelForMultimodalLM builds them with their audio towers, whose weights
    their checkpoints hold. A language model that has none of these classes (GLM-5.3-Flash's
    glm5_next_text) is built as its base model, AutoModel: the mixers are all there. A config class
    that transformers also registers under a second model type (EvollaConfig, as "EvollaModel") is
    in no auto class by that test: its class is the one the multimodal mapping finds for it."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForMultimodalLM

    causal, vision_language = AutoModelForCausalLM._model_mapping, AutoModelForImageTextToText._model_mapping
    if type(config) in causal and (
        causal[type(config)].config_class is type(config) or type(config) not in vision_language
    ):
        return AutoModelForCausalLM
    if type(config) in vision_language:
        return AutoModelForImageTextToText
    if type(config) in AutoModelForMultimodalLM._model_mapping:
        return AutoModelForMultimodalLM
    if type(config) in AutoModel._model_mapping:
        return AutoModel
    return AutoModelForMultimodalLM._model_mapping.get(type(config), AutoModel)


def check_loading_info(label: str, info: dict, left_unread: tuple[str, ...] = ()) -> None:
    """ValueError naming the weights that do not match the config (transformers would
    otherwise leave them randomly initialised, and the analysis would be of noise), other than
    unexpected weights under the prefixes ``left_unread`` (the towers of a language model
    loaded alone)."""
    problems = []
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = sorted(str(k) for k in (info.get(kind) or ()))
        if kind == "unexpected_keys":
            keys = [key for key in keys if not key.startswith(left_unread)]
        if keys:
            shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
            problems.append(f"{kind.replace('_', ' ')}: {shown}")
    if problems:
        raise ValueError(
            f"the weights of {label} do not match its config ({'; '.join(problems)}); "
            "use the config.json the weights were saved with, or the right weight files"
        )


@contextmanager
def quiet_loading(bar: bool, report: bool):
    """transformers' "Loading weights" bar off while the block runs when ``bar``, and its load
    report (a table of the unexpected weights) when ``report``: a language model loaded alone
    leaves its towers' weights unread on purpose, and `check_loading_info` refuses any other
    mismatch. Both are back as they were afterwards."""
    from transformers.utils import logging as hf_logging

    hide_bar = bar and hf_logging.is_progress_bar_enabled()
    reporter = logging.getLogger("transformers.modeling_utils")
    level = reporter.level
    if hide_bar:
        hf_logging.disable_progress_bar()
    if report:
        reporter.setLevel(logging.ERROR)
    try:
        yield
    finally:
        reporter.setLevel(level)
        if hide_bar:
            hf_logging.enable_progress_bar()
