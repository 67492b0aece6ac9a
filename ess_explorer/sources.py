"""Where models come from: a hub id, a local folder, a GGUF file or "zoo:NAME" -> model,
tokenizer, identity.

The one place that parses a model source. It also holds the zoo's catalogue (the shipped
model folders are package data under ``ess_explorer/zoo/assets/``; the zoo package itself,
with its task, training and cards, sits above the analysis and re-exports these names).

load_model:

Rules (docs/usage.md, "Models"):
- ``source`` is a hub id ("state-spaces/mamba-130m-hf"), a local folder in the standard
  transformers layout (config.json + *.safetensors), or "zoo:NAME" for a built-in model
  (ess_explorer.zoo.model_dir(NAME)).
- Safetensors only (``use_safetensors=True``): a folder with only pytorch_model.bin
  (a pickle) is refused with a ValueError that says how to convert it.
- ``trust_remote_code`` is False unless passed; float32; eval mode; the attention
  implementation is "eager" (the only one that returns attention probabilities).
- Offline: respects HF_HUB_OFFLINE; a hub id that cannot be reached (offline, no network,
  not in the cache) fails fast with a ValueError that says to set up a network or to pass
  a local folder / zoo:NAME. Without HF_HUB_OFFLINE, the hub's host is probed first with a
  short timeout (HUB_PROBE_TIMEOUT s): no network means the local cache alone, or that error.
- The weights must match the config: missing, unexpected or mis-shaped weights are a
  ValueError that names them (never a silently random model). A config.json that is not
  valid JSON, or that transformers refuses, is reported as such.
- The class built is the one the checkpoint holds (model_classes.py); a multimodal class whose
  vision tower needs a library this package does not install (timm: Gemma 3n, PerceptionLM,
  FastVLM) loads as its language model alone, its towers' weights left unread by name (any
  other mismatch still fails).
The tokenizer is None when the source ships none (a warning says to pass input_ids to
analyze then).

GGUF (how many people keep models on their own machines): a ``.gguf`` file, or a folder whose
only weights are one, loads through transformers' own GGUF reader (the optional ``gguf`` and
``accelerate`` packages: ``pip install 'ess-explorer[gguf]'``), which dequantises to float32.
The dequantised model and the file's tokenizer are kept as a safetensors folder in the cache
(``<cache>/gguf/<file hash>``), so the next load is an ordinary safetensors load. The file and
its quantisation (``general.file_type`` and the count of tensors per GGML type) are part of the
model's identity and of the result's metadata (``meta["gguf"]``).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import torch

from .bounded import read_json
from .capture.registry import language_model_config, require_supported
from .core.checks import check_device
from .model_classes import check_loading_info, model_class, quiet_loading
from .model_files import (  # noqa: F401  (CACHE_ENV, default_cache_dir: the cache root, for io)
    CACHE_ENV,
    GGUF_SUFFIX,
    HASH_BYTES_UP_TO,
    default_cache_dir,
    dequantised,
    dequantised_dir,
    file_sha256,
    gguf_info,
)

__all__ = [
    "ZOO_DIR",
    "ZOO_PREFIX",
    "DEFAULT_MODEL",
    "list_models",
    "model_dir",
    "card",
    "parse_source",
    "load_model",
    "folder_identity",
    "model_identity",
    "hub_commit",
    "identity_without_weights",
    "file_sha256",
    "CACHE_ENV",
    "default_cache_dir",
    "gguf_info",
]

ZOO_PREFIX = "zoo:"
ZOO_DIR = Path(os.environ.get("ESS_EXPLORER_ZOO_DIR", Path(__file__).resolve().parent / "zoo" / "assets"))

# The explorer's default model: Mamba2 (8 heads x 16 channels, state 16 per head) trained on recent
# recall with "|" between the recalls (142 tokens); held-out accuracy 0.997; two of its eight
# layer-0 heads are saturated on the example prompt. Its card says more.
DEFAULT_MODEL = "mamba2_n16_sep"

# Weight files up to HASH_BYTES_UP_TO (model_files.py) are hashed byte by byte; larger ones by
# size + mtime (a multi-GB checkpoint would otherwise cost seconds to minutes on every run).
_WEIGHT_PATTERNS = ("*.safetensors", "model.safetensors.index.json")

# Any of these in a folder means it ships a tokenizer.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "merges.txt",
)
HUB_PROBE_TIMEOUT = 3.0  # seconds to reach the hub's host before giving up on the network

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
    ``from_pretrained`` of the class it builds (`model_classes.model_class`; dtype and
    use_safetensors are fixed)."""
    from transformers import AutoConfig

    from . import architectures  # noqa: F401  (registers model_type "ess_linear_attention"; imports transformers)

    if not isinstance(trust_remote_code, bool):  # only an explicit True runs a model's own code
        raise ValueError(f"trust_remote_code must be True or False, got {trust_remote_code!r}")
    for fixed in ("use_safetensors", "dtype", "torch_dtype"):
        if fixed in kwargs:
            raise ValueError(f"load_model fixes {fixed} (safetensors, float32); do not pass it")
    if device is not None:
        check_device(device)  # before any file is read: a missing CUDA is not a load failure
    path, label = _resolve(source)
    gguf = parse_source(source)[0] == "gguf"
    if gguf:  # the dequantised copy in the cache, made on the first load
        path = str(dequantised(Path(path), trust_remote_code))
    common = {"revision": revision, "trust_remote_code": trust_remote_code}
    if parse_source(source)[0] == "hub" and not _offline() and not _hub_reachable():
        if not _in_hub_cache(path, revision):
            raise _unreachable(label, path, OSError(f"no connection to the hub within {HUB_PROBE_TIMEOUT:g} s"))
        common["local_files_only"] = True  # no network, but cached: use the cache without waiting
    try:
        config = AutoConfig.from_pretrained(path, **common)
    except OSError as error:
        if Path(path).is_dir():  # a local folder is never "offline": its config.json is bad
            raise ValueError(f"cannot read {Path(path) / 'config.json'}: {_first_line(error)}") from error
        raise _unreachable(label, path, error) from error
    except Exception as error:  # an unknown model_type, or a config transformers finds inconsistent
        if not trust_remote_code and "custom code" in str(error):
            raise ValueError(
                f"{label} ships its own Python code (auto_map in config.json), which ess-explorer never runs "
                "unless asked by name: use a model whose type transformers knows, or, if you trust the code, "
                "load_model(..., trust_remote_code=True)"
            ) from None
        raise ValueError(f"cannot read the config of {label}: {_first_line(error)}") from error
    require_supported(config.model_type, label, config)  # before gigabytes of weights are read for nothing
    _check_layer_count(config, label)
    built = model_class(config)
    if built.config is not config:  # a language model loaded alone
        require_supported(built.config.model_type, f"the language model of {label}", built.config)
    try:
        # a zoo model loads in milliseconds: no bar; towers left unread on purpose: no report of them
        with quiet_loading(bar=label.startswith(ZOO_PREFIX), report=bool(built.left_unread)):
            model, info = built.auto_class.from_pretrained(
                path,
                config=built.config,
                use_safetensors=True,
                dtype=torch.float32,
                attn_implementation=attn_implementation,
                output_loading_info=True,
                **common,
                **{**built.kwargs, **kwargs},
            )
    except OSError as error:
        raise ValueError(
            f"could not load safetensors weights for {label}: {_first_line(error)}. ess-explorer loads safetensors "
            "only; convert pickle weights with `model.save_pretrained(folder, safe_serialization=True)` in a trusted "
            "environment, or pick a repository that ships *.safetensors"
        ) from error
    except TypeError:  # a keyword from_pretrained does not take: the caller's mistake, shown as is
        raise
    except Exception as error:  # a truncated / corrupt safetensors file, a weight of the wrong shape
        files = sorted(p.name for p in Path(path).glob("*.safetensors")) if Path(path).is_dir() else []
        raise ValueError(
            f"could not load the weights of {label}{' (' + ', '.join(files) + ')' if files else ''}: "
            f"{_first_line(error)}; check that the weight files are complete and were saved with this config.json"
        ) from error
    check_loading_info(label, info, left_unread=built.left_unread)
    model.eval()
    if label.startswith(ZOO_PREFIX) or gguf:
        # Results and reports name the model by what the user asked for, not by a path
        # into this installation or the cache (analyze reads it as meta["model_id"]).
        model.config._name_or_path = label
    if gguf:
        model.config.gguf_source = gguf_info(label)  # analyze records it as meta["gguf"]
    if device is not None:
        model.to(device)
    return model, _tokenizer(path, revision, trust_remote_code, label)


# Far above any released model (about 130 layers at most): a config beyond it is damaged or
# hostile, and building it would take gigabytes before the weights are even compared.
MAX_LAYERS = 2048


def _check_layer_count(config, label: str) -> None:
    layers = getattr(language_model_config(config), "num_hidden_layers", None)
    if isinstance(layers, int) and layers > MAX_LAYERS:
        raise ValueError(
            f"the config of {label} declares {layers} layers, above the limit of {MAX_LAYERS}; "
            "it is damaged or not a real model: restore the config.json the weights were saved with"
        )


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _offline() -> bool:
    # huggingface_hub's own reading of its variable (its true words), not `environment_switch`
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _hub_reachable() -> bool:
    """True when the hub's host accepts a connection within HUB_PROBE_TIMEOUT seconds."""
    import socket
    from urllib.parse import urlparse

    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT).close()
    except OSError:
        return False
    return True


def _in_hub_cache(repo_id: str, revision) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except Exception:  # noqa: BLE001 (an invalid repo id: not cached)
        return False
    return isinstance(found, str)


def hub_commit(repo_id: str, revision: str | None = None) -> str | None:
    """The commit `load_model` would load for a hub id, found without loading anything: the
    revision itself when it is a commit hash; offline (HF_HUB_OFFLINE, or the hub out of
    reach) the cached snapshot of that revision, which is what loading would use; else the
    hub's answer. None when it cannot be told."""
    if revision is not None and re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    try:
        if _offline() or not _hub_reachable():
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
            return Path(found).parent.name if isinstance(found, str) else None  # snapshots/<commit>/
        from huggingface_hub import HfApi

        return HfApi().model_info(repo_id, revision=revision, timeout=HUB_PROBE_TIMEOUT).sha
    except Exception:  # noqa: BLE001 (an unknown id, no network: loading will say what is wrong)
        return None


def identity_without_weights(source: str, revision: str | None = None):
    """(model_identity, tokenizer) of ``source`` read without its weights, so a cached result
    is found before any loading: a zoo model or local folder from its files; a hub id from
    the commit `load_model` would load (`hub_commit`) and that commit's tokenizer. The
    identity equals ``model_identity(source, loaded_model, revision=revision)``. None when
    it cannot be read that way (no tokenizer, unknown commit)."""
    from transformers import AutoTokenizer

    try:
        kind, value = parse_source(source)
        if kind == "hub":
            commit = hub_commit(value, revision)
            if commit is None:
                return None
            tokenizer = AutoTokenizer.from_pretrained(
                value, revision=commit, local_files_only=_offline(), trust_remote_code=False
            )
            return model_identity(source, revision=revision or commit), tokenizer
        if kind == "gguf":  # the tokenizer of the dequantised copy, once the first load made it
            folder = dequantised_dir(Path(value))
            if not (folder / "config.json").is_file():
                return None
        else:
            folder = model_dir(value) if kind == "zoo" else Path(value).expanduser()
        return model_identity(source), AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except (OSError, ValueError, TypeError):  # remote code refused included: loading will say so
        return None


# ---- the zoo's catalogue ------------------------------------------------------------------


def list_models() -> list[str]:
    """Names of the zoo models present on disk (folders with a config.json), sorted."""
    if not ZOO_DIR.is_dir():
        return []
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "config.json").is_file())


# A zoo name is a name: "zoo:../x" or "zoo:/abs" must never reach a folder outside the zoo.
_ZOO_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def model_dir(name: str) -> Path:
    """The folder of zoo model ``name`` (loadable with from_pretrained, offline)."""
    if not isinstance(name, str) or not _ZOO_NAME.fullmatch(name) or ".." in name:
        raise ValueError(
            f"{name!r} is not a zoo model name (letters, digits, _ . -; no paths); pass a folder without "
            f"'zoo:', or one of: {', '.join(list_models()) or 'none'}"
        )
    folder = ZOO_DIR / name
    if not (folder / "config.json").is_file():
        raise ValueError(f"no zoo model named {name!r}; available: {', '.join(list_models()) or 'none'}")
    return folder


def card(name: str) -> dict:
    """The model card (card.json) of a zoo model."""
    path = model_dir(name) / "card.json"
    if not path.is_file():
        raise ValueError(
            f"zoo model {name!r} has no card.json yet; write it with `python -m ess_explorer.zoo.train --cards-only --only {name}`"
        )
    return json.loads(path.read_text())


def parse_source(source) -> tuple[str, str]:
    """("zoo", NAME) for "zoo:NAME", ("gguf", file) for a .gguf file or a folder whose only
    weights are one .gguf file, ("folder", path) for another existing folder or a path-like
    string, else ("hub", id). The one parser of model sources."""
    if not isinstance(source, (str, os.PathLike)) or not str(source).strip():
        raise ValueError(
            f"a model source must be a hub id, a local folder, a .gguf file, or 'zoo:NAME'; got {source!r}"
        )
    text = str(source).strip()
    if text.startswith(ZOO_PREFIX):
        return "zoo", text[len(ZOO_PREFIX) :]
    path = Path(text).expanduser()
    if text.lower().endswith(GGUF_SUFFIX):
        return "gguf", str(path)
    if path.is_dir() and not _has_safetensors(path):
        found = sorted(path.glob(f"*{GGUF_SUFFIX}"))
        if len(found) == 1:
            return "gguf", str(found[0])
        if len(found) > 1:
            raise ValueError(
                f"{path} holds several GGUF files ({', '.join(f.name for f in found)}); pass the one to load"
            )
    if isinstance(source, os.PathLike) or path.exists() or text.startswith((".", "/", "~")):
        return "folder", text
    return "hub", text


def _has_safetensors(folder: Path) -> bool:
    return any(folder.glob("*.safetensors")) or (folder / "model.safetensors.index.json").is_file()


def _resolve(source: str) -> tuple[str, str]:
    """(what to pass to from_pretrained, a label for messages); checks local folders."""
    kind, value = parse_source(source)
    if kind == "zoo":
        return _check_folder(model_dir(value)), ZOO_PREFIX + value
    if kind == "gguf":
        file = Path(value)
        if not file.is_file():
            raise ValueError(f"{file} is not a file; pass a .gguf file or the folder that holds one")
        return str(file.resolve()), str(file.resolve())
    if kind == "folder":
        folder = Path(value).expanduser()
        return _check_folder(folder), str(folder)
    return value, f"hub id {value!r}"


def _check_folder(folder: Path) -> str:
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder; pass a hub id, a local model folder, a .gguf file, or zoo:NAME")
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} has no config.json: not a transformers model folder")
    try:
        config = read_json(folder / "config.json", str(folder / "config.json"))  # bounded: never /dev/zero
    except ValueError as error:
        raise ValueError(f"{error}; restore the file the model was saved with") from None
    if not isinstance(config, dict):
        raise ValueError(f"{folder / 'config.json'} must hold a JSON object, got {type(config).__name__}")
    if not any(folder.glob("*.safetensors")) and not (folder / "model.safetensors.index.json").is_file():
        pickles = [name for name in _PICKLE_WEIGHTS if (folder / name).exists()]
        if pickles:
            raise ValueError(
                f"{folder} has only {', '.join(pickles)} (pickle) weights; ess-explorer loads safetensors only. "
                "Convert them once in a trusted environment with "
                "`AutoModelForCausalLM.from_pretrained(folder).save_pretrained(folder, safe_serialization=True)`"
            )
        raise ValueError(f"{folder} has no *.safetensors weights (nor one .gguf file)")
    return str(folder)


def _unreachable(label: str, path: str, error: Exception) -> ValueError:
    why = (
        "HF_HUB_OFFLINE is set and it is not in the local cache"
        if _offline()
        else "the hub could not be reached or has no such model"
    )
    return ValueError(
        f"cannot load {label}: {why} ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}). "
        "Set up a network connection (and unset HF_HUB_OFFLINE), or pass a local model folder or zoo:NAME "
        "(ess_explorer.zoo.list_models())."
    )


def _tokenizer(path: str, revision, trust_remote_code, label: str = ""):
    from transformers import AutoTokenizer

    folder = Path(path)
    if folder.is_dir() and not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        warnings.warn(
            f"{label or path} ships no tokenizer: the tokenizer is None; pass input_ids to analyze "
            "(token ids, not a prompt)",
            stacklevel=3,
        )
        return None
    try:
        return AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    except Exception as error:  # noqa: BLE001 (a damaged tokenizer file fails in many ways)
        warnings.warn(
            f"the tokenizer files of {label or path} cannot be read ({_first_line(error)}): the tokenizer is None; "
            "repair or remove them, or pass input_ids to analyze",
            stacklevel=3,
        )
        return None


# ---- identity (what the cache keys a model by) -------------------------------------------


def folder_identity(folder) -> dict:
    """Identity of a local model folder: sha256 of config.json and of each weight file
    (size + mtime for files above HASH_BYTES_UP_TO). Tokenizer files are not hashed: the
    cache key holds the token ids themselves."""
    folder = Path(folder)
    config = folder / "config.json"
    if not config.is_file():
        raise ValueError(f"{folder} has no config.json: not a model folder")
    weights = {}
    for pattern in _WEIGHT_PATTERNS:
        for path in sorted(folder.glob(pattern)):
            stat = path.stat()
            weights[path.name] = (
                file_sha256(path)
                if stat.st_size <= HASH_BYTES_UP_TO
                else f"size={stat.st_size},mtime_ns={stat.st_mtime_ns}"
            )
    return {"kind": "folder", "config_sha256": file_sha256(config), "weights": weights}


def model_identity(source, model=None, *, revision: str | None = None) -> dict:
    """What identifies the model behind ``source`` for the cache.

    A local folder, or "zoo:NAME": folder_identity of its files. A hub id: the id and
    the revision (the one asked for, else the commit the loaded model came from,
    ``model.config._commit_hash`` where transformers records it, else `hub_commit`; None
    when unknown).
    """
    kind, value = parse_source(source)
    if kind == "zoo":
        return {"source": ZOO_PREFIX + value, **folder_identity(model_dir(value))}
    if kind == "gguf":
        return {"kind": "gguf", "source": str(Path(value).resolve()), **gguf_info(value)}
    if kind == "folder":
        folder = Path(value).expanduser()
        return {"source": str(folder.resolve()), **folder_identity(folder)}
    commit = getattr(getattr(model, "config", None), "_commit_hash", None) if model is not None else None
    # transformers 5 no longer records the commit on the config: ask where loading took it from
    return {"kind": "hub", "source": value, "revision": revision or commit or hub_commit(value)}
