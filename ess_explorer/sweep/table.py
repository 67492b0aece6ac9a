"""The sweep table: one tidy Parquet dataset, partitioned by model, written shard by shard.

Layout of a sweep folder ``OUT``:

    OUT/sweep.json                        the plan: runs, prompt digest, shard size, options
    OUT/prompts.jsonl                     the prompts, one JSON line each (prompt_id = line index)
    OUT/table/model=<quoted>/<shard>.parquet
                                          one file per (run, prompt shard), written atomically;
                                          its schema metadata (key ``ess_explorer``) is the JSON
                                          metadata of the runs inside it (analyze's meta, timing)

``<quoted>`` is the model name URI-quoted (``zoo%3Amamba2_n16``), the Hive convention that
``pyarrow.dataset`` and ``pandas.read_parquet(OUT / "table")`` decode. A shard file exists
only once complete (atomic.py), so a file present is a shard done: an interrupted sweep
loses at most the shards in flight, and a rerun computes only the missing ones.

Columns, one row per (model, checkpoint_step, prompt_id, layer, unit, t):
    model (partition), checkpoint_step (int, null when unknown), prompt_id, layer, unit,
    multiplicity (how many scalar channels share the unit's T; 1 where the result has none),
    t, token (the display string of token t), family, tolerance_ess, entropy_ess,
    causal_ess (only when LayerESS defines it), tss, nuclear_norm (sum of the kept singular
    values of the cut, what the graded modulation compares; null in shards written before it).
"""

from __future__ import annotations

import io as _io
import json
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..atomic import atomic_write
from ..core.diagnostics import cut_nuclear_norms
from ..io import jsonable
from ..result import ESSResult, LayerESS

__all__ = [
    "SCHEMA",
    "COLUMNS",
    "TABLE_DIR",
    "METADATA_KEY",
    "result_table",
    "shard_path",
    "write_shard",
    "read_table",
    "read_metadata",
    "shard_problem",
]

TABLE_DIR = "table"
METADATA_KEY = b"ess_explorer"

_FIELDS = [
    ("checkpoint_step", pa.int64()),
    ("prompt_id", pa.int64()),
    ("layer", pa.int64()),
    ("unit", pa.int64()),
    ("multiplicity", pa.int64()),
    ("t", pa.int64()),
    ("token", pa.string()),
    ("family", pa.string()),
    ("tolerance_ess", pa.int64()),
    ("entropy_ess", pa.float64()),
    ("causal_ess", pa.float64()),
    ("tss", pa.float64()),
    ("nuclear_norm", pa.float64()),
]
SCHEMA = pa.schema(_FIELDS)  # of a shard file (the model comes from its folder)
COLUMNS = ["model"] + [name for name, _ in _FIELDS]  # of the table read back


def _per_unit(layer: LayerESS, name: str, default) -> np.ndarray:
    """(U,) values of an optional per-unit field of LayerESS (``default`` where absent)."""
    value = getattr(layer, name, None)
    if value is None:
        return np.full(layer.n_units, default)
    return np.broadcast_to(np.asarray(value), (layer.n_units,))


def result_table(result: ESSResult, *, prompt_id: int, checkpoint_step: int | None) -> pa.Table:
    """The rows of one analysed prompt (columns SCHEMA), layers then units then t."""
    columns: dict[str, list] = {name: [] for name in SCHEMA.names}
    tokens = np.asarray(result.tokens, dtype=object)
    for index in sorted(result.layers):
        lay = result.layers[index]
        units, n_pos = lay.tolerance_ess.shape
        n = units * n_pos
        t = np.tile(np.asarray(lay.positions, dtype=np.int64), units)
        columns["checkpoint_step"].append(np.full(n, -1 if checkpoint_step is None else checkpoint_step))
        columns["prompt_id"].append(np.full(n, prompt_id, dtype=np.int64))
        columns["layer"].append(np.full(n, index, dtype=np.int64))
        columns["unit"].append(np.repeat(np.arange(units, dtype=np.int64), n_pos))
        columns["multiplicity"].append(np.repeat(_per_unit(lay, "multiplicity", 1).astype(np.int64), n_pos))
        columns["t"].append(t)
        columns["token"].append(tokens[t] if len(tokens) else np.full(n, "", dtype=object))
        columns["family"].append(np.full(n, lay.family, dtype=object))
        columns["tolerance_ess"].append(np.asarray(lay.tolerance_ess, dtype=np.int64).reshape(-1))
        columns["entropy_ess"].append(np.asarray(lay.entropy_ess, dtype=np.float64).reshape(-1))
        columns["causal_ess"].append(np.asarray(lay.causal_ess, dtype=np.float64).reshape(-1))
        columns["tss"].append(np.asarray(lay.tss, dtype=np.float64).reshape(-1))
        columns["nuclear_norm"].append(cut_nuclear_norms(lay).reshape(-1))
    arrays = []
    for field in SCHEMA:
        values = np.concatenate(columns[field.name]) if columns[field.name] else np.zeros(0)
        mask = values == -1 if field.name == "checkpoint_step" and checkpoint_step is None else None
        arrays.append(pa.array(values, type=field.type, mask=mask))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def shard_path(out, model: str, checkpoint_step: int | None, shard: int) -> Path:
    """Where the shard ``shard`` of run (model, checkpoint_step) lives."""
    step = "none" if checkpoint_step is None else f"{int(checkpoint_step):010d}"
    return Path(out) / TABLE_DIR / f"model={quote(model, safe='')}" / f"step-{step}-shard-{int(shard):06d}.parquet"


def write_shard(path, table: pa.Table, metadata: dict) -> Path:
    """Write one shard atomically, its metadata as JSON in the schema metadata."""
    if table.schema.remove_metadata() != SCHEMA:
        raise ValueError(f"a shard must have the sweep schema, got {table.schema}")
    table = table.replace_schema_metadata({METADATA_KEY: json.dumps(jsonable(metadata)).encode("utf-8")})
    buffer = _io.BytesIO()
    pq.write_table(table, buffer)
    return atomic_write(path, buffer.getvalue())


def shard_problem(path, prompt_ids) -> str | None:
    """Why the shard file ``path`` is not a finished shard of ``prompt_ids`` (None: it is):
    unreadable (truncated, emptied, another file), another schema, or rows of other prompts."""
    try:
        file = pq.ParquetFile(path)
        meta = json.loads((file.schema_arrow.metadata or {}).get(METADATA_KEY, b"null"))
        ids = file.read(columns=["prompt_id"]).column("prompt_id").to_pylist()
    except Exception as error:  # noqa: BLE001 (pyarrow raises several kinds for a damaged file)
        return f"unreadable ({type(error).__name__})"
    if file.schema_arrow.remove_metadata() != SCHEMA:
        return "another schema"
    wanted = [int(i) for i in prompt_ids]
    if not isinstance(meta, dict) or meta.get("prompt_ids") != wanted or sorted(set(ids)) != sorted(wanted):
        return "rows of other prompts"
    return None


def _shard_files(out) -> list[Path]:
    root = Path(out) / TABLE_DIR
    if not root.is_dir():
        raise FileNotFoundError(
            f"no sweep table in {out} (expected {root}); run `ess-explorer sweep --out {out}` first"
        )
    return sorted(p for p in root.glob("model=*/*.parquet") if not p.name.startswith("."))


def read_table(out):
    """The whole sweep table of folder ``out`` as a pandas DataFrame (columns COLUMNS),
    sorted by model, checkpoint_step, prompt_id, layer, unit, t. checkpoint_step is a
    nullable integer (``<NA>`` when unknown)."""
    import pandas as pd
    import pyarrow.dataset as ds

    files = _shard_files(out)
    if not files:
        return pd.DataFrame({name: pd.Series(dtype=object) for name in COLUMNS})
    partitioning = ds.partitioning(pa.schema([("model", pa.string())]), flavor="hive")
    dataset = ds.dataset(
        [str(p) for p in files],
        format="parquet",
        partitioning=partitioning,
        partition_base_dir=str(Path(out) / TABLE_DIR),
        # The full schema: a shard written before an optional column existed (causal_ess, nuclear_norm)
        # reads with nulls there instead of failing.
        schema=SCHEMA.append(pa.field("model", pa.string())),
    )
    frame = dataset.to_table().to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    for name in COLUMNS:
        if name not in ("model", "checkpoint_step", "token", "family") and str(frame[name].dtype) == "Int64":
            frame[name] = frame[name].astype(np.int64)  # no nulls there; plain ints compare and plot simply
    frame = frame[COLUMNS].sort_values(["model", "checkpoint_step", "prompt_id", "layer", "unit", "t"], kind="stable")
    return frame.reset_index(drop=True)


def read_metadata(out) -> list[dict]:
    """The metadata of every shard of sweep folder ``out`` (what analyze recorded per run)."""
    records = []
    for path in _shard_files(out):
        meta = pq.read_schema(path).metadata or {}
        if METADATA_KEY in meta:
            records.append(json.loads(meta[METADATA_KEY]))
    return records
