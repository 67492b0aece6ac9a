"""How an ESSResult is laid out in its ``.npz`` file beyond plain arrays (result.py writes and
reads it): spectra as float32 byte planes, the counts at the analysis tolerance kept when the
spectra are cut, operators as blocks of their largest |T|, and the stamp that tells a result
still matches the file it came from. Numpy and the standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = [
    "BYTE_PLANES",
    "SAVED_SPECTRUM_K",
    "SAVED_OPERATOR_SIDE",
    "SCOPES_OF",
    "byte_planes",
    "from_byte_planes",
    "saved_counts",
    "loaded_counts",
    "saved_block",
    "block_max",
    "file_stamp",
    "held",
]

# What a saved file keeps: the spectrum view draws the top 64 values of a cut, and the
# operator view at most 64 x 64 blocks (views/data.py takes both from here, through result.py).
SAVED_SPECTRUM_K = 64
SAVED_OPERATOR_SIDE = 64
# How singular values are laid out in a file (header "spectra"): the float32 values' bytes
# in four planes, lowest byte first.
BYTE_PLANES = "float32-byteplanes"
SCOPES_OF = {True: ("cut", "unit", "layer"), False: ("cut",)}  # relative or absolute tolerance


def held(result) -> str:
    return json.dumps([result.tokens, list(result.input_ids), result.meta, sorted(result.layers)], default=str)


def file_stamp(path, result) -> tuple:
    path = Path(path).resolve()
    stat = path.stat()
    return path, stat.st_size, stat.st_mtime_ns, held(result)


def byte_planes(sigma) -> np.ndarray:
    """(4, U, P, K) uint8: the bytes of float32 ``sigma`` (U, P, K), little-endian, plane by plane."""
    values = np.ascontiguousarray(np.asarray(sigma, dtype="<f4"))
    return np.moveaxis(values.view(np.uint8).reshape(values.shape + (4,)), -1, 0).copy()


def from_byte_planes(planes: np.ndarray, i: int) -> np.ndarray:
    if planes.dtype != np.uint8 or planes.ndim != 4 or planes.shape[0] != 4:
        raise ValueError(f"field L{i}/singular_values is not float32 byte planes (4, U, P, K)")
    return np.ascontiguousarray(np.moveaxis(planes, 0, -1)).view("<f4")[..., 0]


def saved_counts(lay, meta: dict) -> dict | None:
    """tolerance-ESS at the analysis tolerance for every scope, counted from the spectra this
    layer holds, when a file keeps fewer values than that (else a recount is the same)."""
    if lay.singular_values.shape[-1] <= SAVED_SPECTRUM_K or meta.get("tol") is None:
        return None
    tol, relative = float(meta["tol"]), bool(meta.get("relative", True))
    scopes = SCOPES_OF[relative]
    pairs = [lay.tolerance_ess_at(tol, relative, scope) for scope in scopes]
    return {
        "tol": tol,
        "relative": relative,
        "scopes": list(scopes),
        "ess": np.stack([ess for ess, _ in pairs]).astype(np.int32),
        "exact": np.stack([exact for _, exact in pairs]),
    }


def loaded_counts(data, i: int, info: dict, shape: tuple) -> dict | None:
    stored = info.get("counts")
    if stored is None:
        return None
    scopes = info.get("count_scopes")
    ess, exact = data[f"L{i}/counts"], data[f"L{i}/counts_exact"]
    if (
        not isinstance(stored, dict)
        or not isinstance(stored.get("tol"), (int, float))
        or not isinstance(stored.get("relative"), bool)
        or not isinstance(scopes, list)
        or not set(scopes) <= set(SCOPES_OF[True])
        or ess.shape != (len(scopes), *shape)
        or exact.shape != ess.shape
        or not np.issubdtype(ess.dtype, np.integer)
        or exact.dtype != np.bool_
    ):
        raise ValueError(f"field L{i}/counts does not match layers.{i}.counts")
    out = {"tol": float(stored["tol"]), "relative": stored["relative"]}
    out.update({scope: (ess[k].astype(np.int64), exact[k]) for k, scope in enumerate(scopes)})
    return out


def saved_block(lay, length: int) -> int:
    """The block side a file stores this layer's operators at: 1 (T itself) up to
    SAVED_OPERATOR_SIDE positions, else the view's block (a multiple of the layer's own)."""
    block = max(lay.operator_block, -(-length // SAVED_OPERATOR_SIDE))
    return -(-block // lay.operator_block) * lay.operator_block


def block_max(op: np.ndarray, factor: int) -> np.ndarray:
    """The largest |T| of each factor x factor block of ``op`` (``op`` itself for factor 1)."""
    if factor <= 1:
        return op
    n = -(-op.shape[0] // factor)
    padded = np.zeros((n * factor, n * factor), dtype=np.float32)
    padded[: op.shape[0], : op.shape[1]] = np.abs(op)
    return padded.reshape(n, factor, n, factor).max(axis=(1, 3))
