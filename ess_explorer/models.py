"""load_model: a causal LM and its tokenizer from a hub id, a local folder or the zoo.

Rules (README "Loading models"):
- ``source`` is a hub id ("state-spaces/mamba-130m-hf"), a local folder in the standard
  transformers layout (config.json + *.safetensors), or "zoo:NAME" for a built-in model
  (ess_explorer.zoo.model_dir(NAME)).
- Safetensors only (``use_safetensors=True``): a folder with only pytorch_model.bin
  (a pickle) is refused with a ValueError that says how to convert it.
- ``trust_remote_code`` is False unless passed; float32; eval mode; the attention
  implementation is "eager" (the only one that returns attention probabilities).
- Offline: respects HF_HUB_OFFLINE; a hub id that cannot be reached (offline, no network,
  not in the cache) fails fast with a ValueError that says to set up a network or to pass
  a local folder / zoo:NAME.
The tokenizer is None when the source ships none (pass input_ids to analyze then).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

__all__ = ["load_model"]

_PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")


def load_model(
    source: str,
    *,
    revision: str | None = None,
    trust_remote_code: bool = False,
    device=None,
    attn_implementation: str = "eager",
    **kwargs,
):
    """(model, tokenizer) for ``source`` (see the module docstring). ``kwargs`` go to
    ``AutoModelForCausalLM.from_pretrained`` (dtype and use_safetensors are fixed)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if not isinstance(source, (str, os.PathLike)) or not str(source).strip():
        raise ValueError("source must be a hub id, a local folder, or 'zoo:NAME'")
    for fixed in ("use_safetensors", "dtype", "torch_dtype"):
        if fixed in kwargs:
            raise ValueError(f"load_model fixes {fixed} (safetensors, float32); do not pass it")
    _register_project_models()
    path, label = _resolve(str(source))
    common = {"revision": revision, "trust_remote_code": trust_remote_code}
    try:
        config = AutoConfig.from_pretrained(path, **common)
    except OSError as error:
        raise _unreachable(label, path, error) from error
    except ValueError as error:  # an unknown model_type without trust_remote_code
        raise ValueError(f"cannot read the config of {label}: {error}") from error
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path,
            config=config,
            use_safetensors=True,
            dtype=torch.float32,
            attn_implementation=attn_implementation,
            **common,
            **kwargs,
        )
    except OSError as error:
        raise ValueError(
            f"could not load safetensors weights for {label}: {error}. ess-explorer loads safetensors only; "
            "convert pickle weights with `model.save_pretrained(folder, safe_serialization=True)` in a trusted "
            "environment, or pick a repository that ships *.safetensors"
        ) from error
    model.eval()
    if label.startswith("zoo:"):
        # Results and reports name the model by what the user asked for, not by a path
        # into this installation (analyze reads it as meta["model_id"]).
        model.config._name_or_path = label
    if device is not None:
        model.to(device)
    return model, _tokenizer(path, revision, trust_remote_code)


def _register_project_models() -> None:
    """Importing the zoo's modeling registers model_type "ess_linear_attention"."""
    try:
        from .zoo import modeling  # noqa: F401
    except ImportError:
        pass


def _resolve(source: str) -> tuple[str, str]:
    """(what to pass to from_pretrained, a label for messages); checks local folders."""
    if source.startswith("zoo:"):
        name = source[4:]
        from . import zoo

        model_dir = getattr(zoo, "model_dir", None)
        if model_dir is None:
            raise ValueError("this installation has no built-in zoo models (ess_explorer.zoo.model_dir is missing)")
        try:
            folder = Path(model_dir(name))
        except (KeyError, FileNotFoundError, ValueError) as error:
            names = getattr(zoo, "list_models", lambda: [])()
            raise ValueError(f"no zoo model {name!r}; available: {', '.join(map(str, names)) or 'none'} ({error})") from error
        return _check_folder(folder), source
    folder = Path(source).expanduser()
    if folder.exists() or source.startswith((".", "/", "~")):
        return _check_folder(folder), str(folder)
    return source, f"hub id {source!r}"


def _check_folder(folder: Path) -> str:
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder; pass a hub id, a local model folder, or zoo:NAME")
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} has no config.json: not a transformers model folder")
    if not any(folder.glob("*.safetensors")) and not (folder / "model.safetensors.index.json").is_file():
        pickles = [name for name in _PICKLE_WEIGHTS if (folder / name).exists()]
        if pickles:
            raise ValueError(
                f"{folder} has only {', '.join(pickles)} (pickle) weights; ess-explorer loads safetensors only. "
                "Convert them once in a trusted environment with "
                "`AutoModelForCausalLM.from_pretrained(folder).save_pretrained(folder, safe_serialization=True)`"
            )
        raise ValueError(f"{folder} has no *.safetensors weights")
    return str(folder)


def _unreachable(label: str, path: str, error: Exception) -> ValueError:
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    why = "HF_HUB_OFFLINE is set and it is not in the local cache" if offline else "the hub could not be reached or has no such model"
    return ValueError(
        f"cannot load {label}: {why} ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}). "
        "Set up a network connection (and unset HF_HUB_OFFLINE), or pass a local model folder or zoo:NAME "
        "(ess_explorer.zoo.list_models())."
    )


def _tokenizer(path: str, revision, trust_remote_code):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError) as error:
        warnings.warn(f"no tokenizer for {path} ({error}); pass input_ids to analyze", stacklevel=3)
        return None
