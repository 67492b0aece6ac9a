"""Files: result folders, tidy tables and the disk cache; all written through atomic.py.

Result directory (what ``ess-explorer analyze --out DIR`` writes, and what
``ess-explorer figure DIR`` reads):

    DIR/result.npz   the ESSResult (ESSResult.save: arrays + JSON header, no pickle)
    DIR/table.csv    the tidy table, one row per (layer, unit, t) (ESSResult.to_frame)
    DIR/meta.json    the metadata needed to regenerate a figure: model id and revision,
                     dtype, device, tolerance (tol, relative), convention, package version,
                     prompt and token count, and a per-layer summary

The cache of ESSResults is keyed by everything that determines the numbers: the key of a
run is `digest` of its description (runs.AnalysisRun: the model's identity, a hub id and
its revision or a local folder's / zoo model's file hashes; the token ids and the prompt
text; the analysed layers, the dtype, the tolerance and every other setting that changes
the numbers; the package version, so a new version never reuses an old entry).

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
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from .atomic import atomic_link, atomic_write, exclusive
from .bounded import read_json
from .core.diagnostics import COLLAPSED_AT, SATURATED_AT, layer_diagnostics
from .result import ESSResult
from .sources import CACHE_ENV, default_cache_dir, file_sha256  # one cache root: sources keeps GGUF weights there

if TYPE_CHECKING:  # pandas is imported where a table is made: `import ess_explorer` needs none
    import pandas as pd

__all__ = [
    "RESULT_FILE",
    "TABLE_FILE",
    "META_FILE",
    "REQUIRED_META",
    "result_metadata",
    "summary_table",
    "export_table",
    "write_result_dir",
    "read_result",
    "jsonable",
    "table_bytes",
    "CACHE_ENV",
    "default_cache_dir",
    "digest",
    "CacheKey",
    "ResultCache",
]

RESULT_FILE, TABLE_FILE, META_FILE = "result.npz", "table.csv", "meta.json"
# What a reader needs to regenerate a figure or re-run the analysis (ESSResult docstring).
REQUIRED_META = ("model_id", "revision", "dtype", "device", "tol", "relative", "convention", "package_version")
TABLE_SUFFIXES = (".csv", ".parquet")


def jsonable(value):
    """numpy scalars / arrays -> plain JSON values (meta may hold them)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def summary_table(
    result: ESSResult, *, variant: str = "tolerance", saturated: float | None = None, collapsed: float | None = None
) -> pd.DataFrame:
    """One row per analysed layer: layer, family, units (count and kind), scalars per unit
    (multiplicity), mean ESS and max ESS (mean over units, then mean / max over t), mean TSS,
    the layer totals in scalars at the peak cut (total_ess, total_tss: sum over units of
    multiplicity x value, comparable across families; docs/conventions.md), utilisation: per
    unit peak ESS over the peak of its attainable ceiling min(TSS, t, L - t), mean over units
    (diagnostics.layer_diagnostics), with the means over units of that numerator and
    denominator (peak_ess, peak_ceiling), its state, the paper's ratio to TSS
    (tss_utilisation), and the peak over t of the unit-mean causal ESS (NaN for a layer with
    no known realisation)."""
    saturated = SATURATED_AT if saturated is None else saturated
    collapsed = COLLAPSED_AT if collapsed is None else collapsed
    import pandas as pd

    rows = []
    for index in sorted(result.layers):
        lay = result.layers[index]
        ess = np.asarray(lay.ess(variant), dtype=np.float64)
        diag = layer_diagnostics(lay, variant=variant, saturated=saturated, collapsed=collapsed)
        over_units = ess.mean(0) if ess.size else np.zeros(0)
        rows.append(
            {
                "layer": int(index),
                "family": lay.family,
                "units": f"{lay.n_units} {lay.unit_kind}s",
                "mean_ess": float(over_units.mean()) if over_units.size else 0.0,
                "max_ess": float(over_units.max()) if over_units.size else 0.0,
                "multiplicity": _multiplicity_label(lay),
                "mean_tss": float(np.asarray(lay.tss, dtype=np.float64).mean()) if lay.tss.size else 0.0,
                "total_ess": float(diag["total_ess"]),
                "total_tss": float(diag["total_tss"]),
                "peak_ess": float(diag["peak_ess"]),
                "peak_ceiling": float(diag["peak_ceiling"]),
                "utilisation": float(diag["utilisation"]),
                "state": str(diag["state"]),
                "tss_utilisation": float(diag["tss_utilisation"]),
                "max_causal_ess": _peak_causal(lay),
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "layer",
            "family",
            "units",
            "multiplicity",
            "mean_ess",
            "max_ess",
            "mean_tss",
            "total_ess",
            "total_tss",
            "peak_ess",
            "peak_ceiling",
            "utilisation",
            "state",
            "tss_utilisation",
            "max_causal_ess",
        ],
    )


def _peak_causal(lay) -> float:
    causal = np.asarray(lay.causal_ess, dtype=np.float64)
    if causal.size == 0 or np.isnan(causal).all(axis=0).all():
        return float("nan")
    return float(np.nanmax(np.nanmean(causal, axis=0)))


def _multiplicity_label(lay) -> int | str:
    """The layer's channels per unit: one int when every unit has the same, else 'a-b'."""
    values = np.asarray(lay.multiplicity)
    if values.size == 0:
        return 1
    low, high = int(values.min()), int(values.max())
    return low if low == high else f"{low}-{high}"


def result_metadata(result: ESSResult) -> dict:
    """meta.json: the result's meta (every REQUIRED_META key present, None when unknown),
    the shape of what was analysed, and the per-layer summary."""
    meta = jsonable(dict(result.meta))
    for key in REQUIRED_META:
        meta.setdefault(key, None)
    return {
        "meta": meta,
        "length": result.length,
        "layers": {
            str(i): {
                "family": lay.family,
                "unit_kind": lay.unit_kind,
                "units": lay.n_units,
                "positions": int(len(lay.positions)),
                "kept_singular_values": int(lay.singular_values.shape[-1]),
                "operators_kept": sorted(int(u) for u in lay.operators),
            }
            for i, lay in sorted(result.layers.items())
        },
        "summary": jsonable(summary_table(result).to_dict(orient="records")),
        "files": {"result": RESULT_FILE, "table": TABLE_FILE, "meta": META_FILE},
        "how_to_reload": "ESSResult.load('result.npz'); ess-explorer figure DIR --kind KIND --out fig.pdf",
    }


# A spreadsheet reads a cell that starts with one of these as a formula ("CSV injection").
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def escape_formula_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` whose text cells that a spreadsheet would run as a formula
    (starting with =, +, -, @, tab or CR) are prefixed with a single quote. Only text
    (object / string) columns change: numbers stay numbers."""
    import pandas as pd

    frame = frame.copy()
    for name in frame.columns:
        column = frame[name]
        if column.dtype == object or pd.api.types.is_string_dtype(column.dtype):
            frame[name] = column.map(
                lambda cell: "'" + cell if isinstance(cell, str) and cell.startswith(FORMULA_PREFIXES) else cell
            )
    return frame


def table_bytes(result: ESSResult, fmt: str) -> bytes:
    """The tidy table as CSV (formula-like text cells escaped) or Parquet bytes."""
    frame = result.to_frame()
    if fmt == "csv":
        return escape_formula_cells(frame).to_csv(index=False).encode("utf-8")
    import io  # the standard library's; this module is ess_explorer.io

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    # The metadata travels inside the Parquet file, so the table alone is self-describing.
    schema_meta = dict(table.schema.metadata or {})
    schema_meta[b"ess_explorer"] = json.dumps(result_metadata(result)["meta"]).encode("utf-8")
    table = table.replace_schema_metadata(schema_meta)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def export_table(result: ESSResult, path) -> Path:
    """The tidy table (ESSResult.to_frame) as .csv or .parquet, by suffix; written atomically.
    A Parquet file also carries the metadata under the schema key ``ess_explorer``."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise ValueError(f"cannot tell the table format from {path.name!r}; use a name ending in .csv or .parquet")
    return atomic_write(path, table_bytes(result, suffix[1:]))


def write_result_dir(result: ESSResult, out_dir) -> Path:
    """Write result.npz, table.csv and meta.json into ``out_dir`` (created) as a unit; returns it.

    Every member's place is checked before anything is written (a folder where a file should
    be refuses the whole write); the members are written to a staging folder inside
    ``out_dir`` and renamed into place, meta.json last, under a lock, so concurrent writers
    take turns; meta.json records the sha256 of the other two, so `read_result` refuses a
    folder whose members come from different runs (e.g. after a crash between the renames).
    A result loaded from a file or saved to one (a cache entry) is not written again:
    result.npz becomes a hard link to that file (a copy on another file system), and a folder
    whose result.npz already is that file keeps the table and metadata it has.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{out_dir} exists and is not a directory; give a directory for the result")
    out_dir.mkdir(parents=True, exist_ok=True)
    with exclusive(out_dir):
        for name in (RESULT_FILE, TABLE_FILE, META_FILE):
            target = out_dir / name
            if target.exists() and not target.is_file():
                raise ValueError(f"{target} exists and is not a file; remove it or write the result to another --out")
        source = result.saved_file()
        written = all((out_dir / name).is_file() for name in (TABLE_FILE, META_FILE))
        if source is not None and _same_file(source, out_dir / RESULT_FILE) and written:
            return out_dir  # written by an earlier run from the same file
        staging = Path(tempfile.mkdtemp(prefix=".staging.", dir=out_dir))
        try:
            if source is None:
                result.save(staging / RESULT_FILE)
            else:
                atomic_link(source, staging / RESULT_FILE)
            export_table(result, staging / TABLE_FILE)
            meta = result_metadata(result)
            meta["members"] = {name: file_sha256(staging / name) for name in (RESULT_FILE, TABLE_FILE)}
            atomic_write(staging / META_FILE, json.dumps(meta, indent=2).encode("utf-8"))
            for name in (RESULT_FILE, TABLE_FILE, META_FILE):
                os.replace(staging / name, out_dir / name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _same_file(a: Path, b: Path) -> bool:
    try:
        return b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _check_members(folder: Path) -> None:
    """ValueError when meta.json's record of the members does not match result.npz (a
    folder left mixing two runs); folders without the record (older versions) pass."""
    try:
        meta = read_json(folder / META_FILE, str(folder / META_FILE))
    except (OSError, ValueError):
        return  # no or unreadable meta.json: result.npz stands on its own
    members = meta.get("members") if isinstance(meta, dict) else None
    recorded = members.get(RESULT_FILE) if isinstance(members, dict) else None
    if isinstance(recorded, str) and file_sha256(folder / RESULT_FILE) != recorded:
        raise ValueError(
            f"{folder} mixes files of different runs ({RESULT_FILE} is not the one {META_FILE} records); "
            "write the result again with `ess-explorer analyze --out`"
        )


def read_result(path) -> ESSResult:
    """An ESSResult from a result directory (its result.npz, checked against meta.json's
    record of it) or an .npz file. FileNotFoundError when nothing is there; ValueError when
    the file is not a result or the folder mixes runs."""
    path = Path(path)
    if path.is_dir():
        if (path / RESULT_FILE).is_file():
            _check_members(path)
        path = path / RESULT_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"no ESS result at {path} (give a directory written by `ess-explorer analyze` or a .npz)"
        )
    try:
        return ESSResult.load(path)
    except ValueError:
        raise
    except Exception as error:  # a truncated zip raises BadZipFile, zlib.error, EOFError ...
        raise ValueError(
            f"{path} is not a readable ESS result ({type(error).__name__}: {error}); recompute it"
        ) from error


# ---- the cache ------------------------------------------------------------------------------


class CacheKey(str):
    """A cache key (the sha256 hex digest) that carries the record it digests, so an entry
    can be checked against the run it claims to be before it is served."""

    record: str | None = None


def digest(record: dict) -> CacheKey:
    """The cache key of ``record`` (a JSON-able description of a run, runs.AnalysisRun): the
    sha256 hex of its canonical JSON (sorted keys, no spaces), carrying that JSON."""
    text = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)
    key = CacheKey(hashlib.sha256(text.encode("utf-8")).hexdigest())
    key.record = text
    return key


def _mismatch(key: str, result: ESSResult) -> str | None:
    """Why the entry ``result`` is not the run ``key`` describes (None: it is). The entry must
    carry the very record the key digests, and its own token ids, layers and options must be
    those of that record: a result copied under another run's key is never served."""
    if result.meta.get("cache_key") != key or not result.layers:
        return "it records another key"
    text = getattr(key, "record", None)
    if text is None:  # a bare digest: nothing more to compare
        return None
    if result.meta.get("cache_record") != text:
        return "it was written for another run (model, prompt or options)"
    record = json.loads(text)
    if [int(i) for i in result.input_ids] != record["input_ids"]:
        return f"it holds {len(result.input_ids)} other tokens than this run's {len(record['input_ids'])}"
    if record["layers"] is not None and sorted(result.layers) != record["layers"]:
        return "it holds other layers"
    meta = result.meta
    if (meta.get("tol"), meta.get("relative"), meta.get("stride")) != (
        record["tol"],
        record["relative"],
        record["stride"],
    ):
        return "it was computed with another tolerance or stride"
    return None


def _forget(path: Path) -> None:
    """Delete a bad cache entry; a read-only cache keeps it (the next put warns)."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


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
        try:
            if not path.is_file():
                return None
        except OSError:  # an unreadable cache folder is a miss
            return None
        try:
            result = ESSResult.load(path)
        # ESSResult.load turns most damage into ValueError, but a truncated zip raises
        # zipfile.BadZipFile, corrupt data zlib.error or EOFError: every failure is a miss.
        except Exception as error:  # noqa: BLE001
            warnings.warn(
                f"ignoring an unreadable cache entry {path.name} ({type(error).__name__}); recomputing", stacklevel=2
            )
            _forget(path)
            return None
        why = _mismatch(key, result)
        if why is not None:
            warnings.warn(f"ignoring cache entry {path.name}: {why}; recomputing", stacklevel=2)
            _forget(path)
            return None
        return result

    def put(self, key: str, result: ESSResult) -> Path | None:
        """Store ``result`` (its meta gains "cache_key"); atomic via a unique temp file.

        A cache that cannot be written (a read-only folder, a file where a folder should
        be, a full disk) never costs the result: a warning says why, nothing half written
        stays behind (atomic.py), and None is returned instead of the entry's path.
        """
        if not isinstance(result, ESSResult):
            raise ValueError(f"the cache stores ESSResults, got {type(result).__name__}")
        path = self.path(key)
        result.meta["cache_key"] = str(key)
        if getattr(key, "record", None) is not None:
            result.meta["cache_record"] = key.record
        try:
            return result.save(path)  # atomic (atomic.py)
        except (OSError, ValueError) as error:  # ValueError: the entry's path is a folder
            result.meta.pop("cache_key", None)
            result.meta.pop("cache_record", None)
            why = getattr(error, "strerror", None) or error
            warnings.warn(
                f"could not write the cache entry under {self.root} ({type(error).__name__}: "
                f"{why}); the result is kept but not cached. Free space, fix the "
                f"folder's permissions, set ${CACHE_ENV} to a writable folder, or use --no-cache",
                stacklevel=2,
            )
            return None

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
