"""A disk cache of ESSResults, keyed by everything that determines the numbers.

Key = sha256 of a canonical JSON of: the model's identity (a hub id and its revision, or
for a local folder / zoo model a hash of its config.json and weight files), the token
ids (and the prompt text), the analysed layers, the model dtype, tol / relative / stride
and any other analysis option, and the package version (a new version may compute
differently, so it never reuses an old entry).

Entries are ESSResult ``.npz`` files (no pickle), written to a unique temporary file in
the cache folder and moved into place with os.replace, so a reader never sees half an
entry and two writers never clobber each other's temporary file. Every read is validated:
an entry that does not load (truncated, corrupt, another format) or whose recorded key
differs is treated as a miss, deleted, recomputed and overwritten; never trusted.

Location: $ESS_EXPLORER_CACHE, else ~/.cache/ess-explorer (results under ``results/``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Callable

from . import __version__
from .result import ESSResult

__all__ = ["CACHE_ENV", "default_cache_dir", "folder_identity", "model_identity", "cache_key", "ResultCache"]

CACHE_ENV = "ESS_EXPLORER_CACHE"
# Weight files up to this size are hashed byte by byte; larger ones by size + mtime (a
# multi-GB checkpoint would otherwise cost seconds to minutes on every run).
HASH_BYTES_UP_TO = 256 * 1024 * 1024
_WEIGHT_PATTERNS = ("*.safetensors", "model.safetensors.index.json")


def default_cache_dir() -> Path:
    """$ESS_EXPLORER_CACHE, else ~/.cache/ess-explorer."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ess-explorer"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
                _sha256_file(path) if stat.st_size <= HASH_BYTES_UP_TO else f"size={stat.st_size},mtime_ns={stat.st_mtime_ns}"
            )
    return {"kind": "folder", "config_sha256": _sha256_file(config), "weights": weights}


def model_identity(source: str, model=None, *, revision: str | None = None) -> dict:
    """What identifies the model behind ``source`` for the cache.

    A local folder, or "zoo:NAME": folder_identity of its files. A hub id: the id and
    the revision (the one asked for, else the commit the loaded model came from,
    ``model.config._commit_hash``; None when unknown).
    """
    source = str(source)
    if source.startswith("zoo:"):
        from . import zoo

        return {"source": source, **folder_identity(zoo.model_dir(source[4:]))}
    folder = Path(source).expanduser()
    if folder.is_dir():
        return {"source": str(folder.resolve()), **folder_identity(folder)}
    commit = getattr(getattr(model, "config", None), "_commit_hash", None) if model is not None else None
    return {"kind": "hub", "source": source, "revision": revision or commit}


def cache_key(identity: dict, input_ids, *, layers, dtype: str, tol: float, relative: bool, stride=None,
              prompt: str | None = None, version: str = __version__, **options) -> str:
    """sha256 hex of the canonical JSON of everything that determines a result."""
    record = {
        "identity": identity,
        "input_ids": [int(i) for i in input_ids],
        "prompt": prompt,
        "layers": None if layers is None else sorted(int(i) for i in layers),
        "dtype": str(dtype),
        "tol": float(tol),
        "relative": bool(relative),
        "stride": None if stride is None else int(stride),
        "version": str(version),
        "options": {k: options[k] for k in sorted(options)},
    }
    text = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ResultCache:
    """ESSResults on disk under ``root/results/<key[:2]>/<key>.npz``.

    get(key) -> ESSResult or None (a miss, also for an unreadable entry); put(key, result);
    get_or_compute(key, compute) -> (result, hit).
    """

    def __init__(self, root=None):
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()

    def path(self, key: str) -> Path:
        if not isinstance(key, str) or len(key) < 8 or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"a cache key is a lowercase hex digest, got {key!r}")
        return self.root / "results" / key[:2] / f"{key}.npz"

    def get(self, key: str) -> ESSResult | None:
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            result = ESSResult.load(path)
        # ESSResult.load turns most damage into ValueError, but a truncated zip raises
        # zipfile.BadZipFile, corrupt data zlib.error or EOFError: every failure is a miss.
        except Exception as error:  # noqa: BLE001
            warnings.warn(f"ignoring an unreadable cache entry {path.name} ({type(error).__name__}); recomputing",
                          stacklevel=2)
            path.unlink(missing_ok=True)
            return None
        if result.meta.get("cache_key") != key or not result.layers:
            warnings.warn(f"ignoring cache entry {path.name}: it records another key; recomputing", stacklevel=2)
            path.unlink(missing_ok=True)
            return None
        return result

    def put(self, key: str, result: ESSResult) -> Path:
        """Store ``result`` (its meta gains "cache_key"); atomic via a unique temp file."""
        if not isinstance(result, ESSResult):
            raise ValueError(f"the cache stores ESSResults, got {type(result).__name__}")
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        result.meta["cache_key"] = key
        handle, tmp = tempfile.mkstemp(prefix=f".{key[:12]}.", suffix=".npz", dir=path.parent)
        os.close(handle)
        try:
            written = result.save(tmp)
            os.replace(written, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
            Path(str(tmp) + ".tmp").unlink(missing_ok=True)  # ESSResult.save's own temp, on failure
        return path

    def get_or_compute(self, key: str, compute: Callable[[], ESSResult]) -> tuple[ESSResult, bool]:
        """(result, True) from the cache, or (compute(), False) after storing it."""
        cached = self.get(key)
        if cached is not None:
            return cached, True
        result = compute()
        self.put(key, result)
        return result, False

    def clear(self) -> int:
        """Delete every cached result; returns how many files were removed."""
        removed = 0
        for path in (self.root / "results").glob("*/*.npz"):
            path.unlink(missing_ok=True)
            removed += 1
        return removed
