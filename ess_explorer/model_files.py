"""The files a model is read from: their hashes, the cache root, and GGUF files.

A GGUF file loads through transformers' own GGUF reader, which dequantises it to float32;
the first load keeps that model and the file's tokenizer as an ordinary safetensors folder
under the cache root (`dequantised`), so later loads are plain safetensors loads. What
identifies a GGUF file (its name, digest, architecture, quantisation and tensor types) is
`gguf_info`; sources.py resolves sources and loads models with these.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

import torch

__all__ = [
    "CACHE_ENV",
    "GGUF_SUFFIX",
    "HASH_BYTES_UP_TO",
    "default_cache_dir",
    "file_sha256",
    "file_digest",
    "gguf_info",
    "dequantised",
    "dequantised_dir",
]

CACHE_ENV = "ESS_EXPLORER_CACHE"
GGUF_SUFFIX = ".gguf"
# Files up to this size are hashed byte by byte; larger ones by size + mtime (a multi-GB
# checkpoint would otherwise cost seconds to minutes on every run).
HASH_BYTES_UP_TO = 256 * 1024 * 1024


def default_cache_dir() -> Path:
    """$ESS_EXPLORER_CACHE, else ~/.cache/ess-explorer."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ess-explorer"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    """sha256 of a file, or its size and time above HASH_BYTES_UP_TO (as for weight files)."""
    stat = path.stat()
    if stat.st_size <= HASH_BYTES_UP_TO:
        return file_sha256(path)
    return f"size={stat.st_size},mtime_ns={stat.st_mtime_ns}"


def gguf_info(file) -> dict:
    """What identifies a GGUF file: its name, digest (`file_digest`), architecture,
    ``general.file_type`` (e.g. "MOSTLY_Q8_0") and the count of tensors per GGML type (a file
    may mix types: norms stay F32 in a Q4_K_M file). Reads the header only."""
    gguf = gguf_module()
    file = Path(file)
    reader = gguf.GGUFReader(str(file))

    def value(key):
        field = reader.fields.get(key)
        return None if field is None else field.contents()

    file_type = value("general.file_type")
    try:
        file_type = gguf.LlamaFileType(file_type).name if file_type is not None else None
    except ValueError:  # a type this gguf version does not name: keep the number
        pass
    types: dict[str, int] = {}
    for tensor in reader.tensors:
        types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
    return {
        "file": file.name,
        "sha256": file_digest(file),
        "architecture": value("general.architecture"),
        "file_type": file_type,
        "tensor_types": dict(sorted(types.items())),
    }


def gguf_module():
    try:
        import accelerate  # noqa: F401  (transformers' GGUF loading needs it)
        import gguf
    except ImportError as error:
        raise ValueError(
            f"loading a GGUF file needs the gguf and accelerate packages ({error}); "
            "install them with `pip install 'ess-explorer[gguf]'`"
        ) from error
    return gguf


def dequantised_dir(file: Path) -> Path:
    return default_cache_dir() / "gguf" / hashlib.sha256(file_digest(file).encode()).hexdigest()[:32]


def dequantised(file: Path, trust_remote_code: bool) -> Path:
    """The safetensors folder of a GGUF file's dequantised weights, config and tokenizer,
    made on the first call through transformers' GGUF loader (module docstring)."""
    folder = dequantised_dir(file)
    if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
        return folder
    gguf_module()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    common = {"gguf_file": file.name, "trust_remote_code": trust_remote_code}
    try:
        model = AutoModelForCausalLM.from_pretrained(str(file.parent), dtype=torch.float32, **common)
    except Exception as error:  # an architecture transformers cannot read from GGUF, a damaged file
        raise ValueError(
            f"could not load the GGUF file {file}: {str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}"
        ) from error
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(file.parent), **common)
    except Exception as error:  # noqa: BLE001 (a model without a usable tokenizer still analyses ids)
        warnings.warn(
            f"no tokenizer in {file} ({str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}); pass input_ids to analyze",
            stacklevel=3,
        )
        tokenizer = None
    # The weights are float32 now: saved as an ordinary model (transformers refuses to save one
    # it still marks as GGUF-quantised), written beside the final folder and moved into place.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    import shutil

    staging = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    model.save_pretrained(staging)
    if tokenizer is not None:
        tokenizer.save_pretrained(staging)
    shutil.rmtree(folder, ignore_errors=True)  # a copy cut short (the check above found it incomplete)
    try:
        os.replace(staging, folder)
    except OSError:  # another process made it first: theirs is the same
        shutil.rmtree(staging, ignore_errors=True)
    return folder
