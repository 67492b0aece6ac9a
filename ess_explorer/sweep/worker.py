"""The unit of sweep work, the same in every backend: one run's model x one shard of prompts
-> one table (sweep/table.py: SCHEMA) and its metadata.

A worker keeps the last model it loaded (``cached_model``), so the shards of one run that land
on the same worker process (in-process, or a Ray worker) load the model once.
"""

from __future__ import annotations

import datetime as _dt
import platform
import time

import pyarrow as pa

from ..runs import RunRequest, RunSettings, RunSteps, run_cached
from ..sources import load_model
from .inputs import Run
from .table import SCHEMA, result_table

__all__ = ["compute_shard", "cached_model", "ANALYSIS_OPTIONS"]

# The analysis options a sweep records and passes through (runs.RunSettings: what changes the numbers).
ANALYSIS_OPTIONS = ("layers", "tol", "relative", "scope", "gates", "stride", "units", "causal", "precision")

_LOADED: dict = {}  # source -> (model, tokenizer): at most one model per process


def cached_model(source: str, device=None):
    """(model, tokenizer) of ``source``, loaded once per process; loading another source
    drops the previous model first (one model's memory per worker)."""
    key = (source, None if device is None else str(device))
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = load_model(source, device=device)
    return _LOADED[key]


def _excerpt(prompt) -> str:
    text = repr(prompt if isinstance(prompt, str) else list(prompt))
    return text if len(text) <= 40 else text[:37] + "..."


def compute_shard(run: Run, model, tokenizer, items, options: dict) -> tuple[pa.Table, dict]:
    """Analyse each (prompt_id, prompt) of ``items`` with ``model``; returns the rows of all
    of them (prompt by prompt) and the shard's metadata: the run, the prompt ids and lengths,
    analyze's meta of the first prompt (model id, revision, dtype, tolerance, versions), the
    host and the seconds spent. ``options`` holds ANALYSIS_OPTIONS."""
    start = time.perf_counter()
    settings = RunSettings(**{name: options[name] for name in ANALYSIS_OPTIONS if name in options})
    steps = RunSteps(load=lambda source, revision: (model, tokenizer))  # loaded once per run by the caller
    tables, lengths, first_meta = [], [], None
    for prompt_id, prompt in items:
        try:
            given = prompt if isinstance(prompt, str) else list(prompt)
            request = RunRequest(run.source, given, settings=settings)
            result, _, _ = run_cached(request, steps=steps, progress=False, keep_operators=None)
        except ValueError as error:  # say which prompt: a sweep has thousands
            raise ValueError(f"prompt {prompt_id} ({_excerpt(prompt)}) under {run.model}: {error}") from None
        tables.append(result_table(result, prompt_id=int(prompt_id), checkpoint_step=run.checkpoint_step))
        lengths.append(result.length)
        first_meta = first_meta or {k: v for k, v in result.meta.items() if k != "prompt"}  # prompts.jsonl has it
    meta = {
        "run": run.to_dict(),
        "prompt_ids": [int(p) for p, _ in items],
        "n_tokens": lengths,
        "analysis": first_meta,
        "host": platform.node(),
        "seconds": round(time.perf_counter() - start, 4),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    table = pa.concat_tables(tables) if tables else SCHEMA.empty_table()
    return table, meta
