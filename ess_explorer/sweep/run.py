"""run_sweep(): ESS of many prompts x many models (or checkpoints), resumable, local or on Ray.

Plan: runs (sweep/inputs.py: one per model or checkpoint) x shards of ``shard_size``
prompts (in the given order, or grouped by length with ``bucket_by_length``). Each
(run, shard) is one unit of work and one Parquet file (sweep/table.py). The plan is recorded
in OUT/sweep.json; a rerun into the same OUT checks that prompts and options are the same
(else it refuses: the table would mix settings), may add models, and computes only the
shards whose file is missing.

Backends compute the same thing (sweep/worker.py: compute_shard) and return the same table:
- "local": in this process, one model at a time, a tqdm bar over sequences with an ETA;
- "ray": one Ray task per (run, shard) (sweep/ray_backend.py); the driver writes the files.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path

from tqdm.auto import tqdm

from .._version import __version__
from ..atomic import atomic_write
from ..bounded import read_json
from ..core.ess import DEFAULT_RELATIVE, DEFAULT_TOL, MODULATION_SCOPE, check_scope, check_tolerance
from ..core.gates import DEFAULT_GATES, check_gates
from ..core.precision import DEFAULT_PRECISION, check_precision
from ..sources import load_model
from .inputs import Run, expand_models, load_prompts
from .table import TABLE_DIR, read_metadata, read_table, shard_path, shard_problem, write_shard
from .worker import compute_shard

__all__ = ["run_sweep", "SweepResult", "Shard", "PLAN_FILE", "PROMPTS_FILE", "BACKENDS", "SWEEP_SCOPE", "sweep_scope"]

PLAN_FILE, PROMPTS_FILE = "sweep.json", "prompts.jsonl"
PLAN_FORMAT = 1
# Options added since PLAN_FORMAT 1, with the value an older plan (which lacks them) ran with.
LATER_OPTIONS = {"causal": True, "precision": "exact"}
BACKENDS = ("local", "ray")
SWEEP_SCOPE = MODULATION_SCOPE  # reset-aware: the sweep statistics' modulation reads the table's counts


def sweep_scope(scope: str | None, relative: bool) -> str:
    """The scope a sweep counts at: ``scope`` as given (checked), else SWEEP_SCOPE for a relative
    tolerance and "cut" for an absolute one (which has no scope)."""
    scope = (SWEEP_SCOPE if relative else "cut") if scope is None else scope
    check_scope(scope, relative)
    return scope


@dataclass(frozen=True)
class Shard:
    """One unit of work: run x prompt ids; ``index`` numbers the shard within the run."""

    run: Run
    index: int
    prompt_ids: tuple[int, ...]

    def path(self, out) -> Path:
        return shard_path(out, self.run.model, self.run.checkpoint_step, self.index)


@dataclass
class SweepResult:
    """What run_sweep() did: the folder, the runs, how many shards it computed and how many were
    already there. ``table()`` reads the whole table, ``metadata()`` every shard's metadata."""

    out: Path
    runs: list[Run]
    computed: int
    skipped: int
    shards: list[Shard] = field(default_factory=list, repr=False)

    def table(self):
        return read_table(self.out)

    def metadata(self) -> list[dict]:
        return read_metadata(self.out)


def _prompt_digest(prompts: list) -> str:
    text = json.dumps(prompts, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def plan_shards(runs: list[Run], prompts: list, shard_size: int, bucket_by_length: bool) -> list[Shard]:
    """Every (run, shard) of the sweep, runs in order. With ``bucket_by_length`` the prompts
    are grouped by length (characters of a string, count of a token list) so a shard holds
    prompts of similar cost; prompt ids stay the indices into ``prompts``."""
    order = list(range(len(prompts)))
    if bucket_by_length:
        order.sort(key=lambda i: (len(prompts[i]), i))
    chunks = [tuple(order[i : i + shard_size]) for i in range(0, len(order), shard_size)]
    return [Shard(run, index, chunk) for run in runs for index, chunk in enumerate(chunks)]


def _check_plan(out: Path, plan: dict, runs: list[Run]) -> dict:
    """The plan to record: ``plan`` with the runs of an earlier sweep in ``out`` first.
    ValueError when that sweep used other prompts or options."""
    path = out / PLAN_FILE
    if not path.is_file() or not any((out / TABLE_DIR).glob("model=*/*.parquet")):
        # no shard finished: nothing to mix, so a corrected rerun may replace the plan
        return {**plan, "runs": [r.to_dict() for r in runs]}
    try:
        old = read_json(path, str(path))
    except (OSError, ValueError) as error:
        raise ValueError(f"{path} is not a readable sweep plan ({error}); use another --out") from None
    if not isinstance(old, dict) or not isinstance(old.get("runs", []), list):
        raise ValueError(f"{path} is not a sweep plan (a JSON object with runs); use another --out")
    if isinstance(old.get("options"), dict):  # a plan from before an option existed used its default
        old["options"] = {**LATER_OPTIONS, **old["options"]}
    for key in ("format", "prompts_sha256", "n_prompts", "shard_size", "bucket_by_length", "options"):
        if old.get(key) != plan[key]:
            raise ValueError(
                f"{out} holds a sweep with another {key} ({old.get(key)!r} there, {plan[key]!r} now); "
                "resume it with the same prompts and options, or write to another --out"
            )
    known = [r for r in old.get("runs", [])]
    known += [r.to_dict() for r in runs if r.to_dict() not in known]
    return {**plan, "runs": known}


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_options(tol, relative, stride, units) -> None:
    """What analyze would refuse, refused before the plan is recorded (a rerun must match it)."""
    check_tolerance(tol, relative)
    if stride is not None and not _positive_int(stride):
        raise ValueError(f"stride must be a positive integer or None, got {stride!r}")
    if units is not None and not _positive_int(units):
        if isinstance(units, (str, bytes)) or not hasattr(units, "__iter__"):
            raise ValueError(f"units must be a positive count or a list of unit indices, got {units!r}")
        rows = list(units)
        if not rows or not all(isinstance(u, int) and not isinstance(u, bool) and u >= 0 for u in rows):
            raise ValueError(f"units must be a positive count or a non-empty list of unit indices, got {units!r}")


def _layer_list(layers) -> list[int] | None:
    """``layers`` as sorted indices; a string ("10") is refused, not read digit by digit."""
    if layers is None:
        return None
    given = [layers] if isinstance(layers, int) else layers
    if isinstance(layers, (str, bytes, bool)) or not hasattr(given, "__iter__"):
        raise ValueError(f"layers must be an int or a list of ints (e.g. [10]), got {layers!r}")
    chosen = list(given)
    if not chosen or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in chosen):
        raise ValueError(f"layers must be a non-empty list of non-negative ints, got {layers!r}")
    return sorted(set(chosen))


def run_sweep(
    models,
    prompts,
    *,
    out,
    layers=None,
    backend: str = "local",
    shard_size: int = 16,
    bucket_by_length: bool = False,
    text_field: str = "text",
    tol: float = DEFAULT_TOL,
    relative: bool = DEFAULT_RELATIVE,
    scope: str | None = None,
    gates: str = DEFAULT_GATES,
    stride: int | None = None,
    units=None,
    causal: bool = True,
    precision: str = DEFAULT_PRECISION,
    device=None,
    progress: bool = True,
    ray_address: str | None = None,
    ray_init: dict | None = None,
    num_gpus: float | None = None,
) -> SweepResult:
    """ESS of every prompt under every model, into the sweep folder ``out``.

    models : a source or a list (hub ids, folders, "zoo:NAME", training output folders with
        checkpoint-STEP subfolders); see sweep/inputs.py.
    prompts : a list of strings / token-id lists, a .txt (one per line) or .jsonl file
        (``text_field``), or a datasets.Dataset.
    scope : which sigma_1 a relative tolerance refers to; default SWEEP_SCOPE, the reset-aware
        "unit" (the modulation of the sweep statistics reads the table's counts; "cut" without
        ``relative``).
    layers, tol, relative, gates, stride, units, causal, precision : as in analyze (the
        same for every run; ``causal=False`` leaves the causal_ess column NaN and saves its spectra).
    backend : "local" (this process) or "ray" (``ray_address`` to join a running cluster,
        else ``ray.init(**ray_init)`` starts a local one; ``device="cuda"`` asks each task for
        ``num_gpus`` GPUs, default 1).
    shard_size : prompts per file (the most a crash can lose per running task).

    Returns a SweepResult (``.table()`` is the tidy DataFrame). Raises ValueError (before any
    work) for bad models, prompts or options, or an ``out`` that holds another sweep.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if not isinstance(shard_size, int) or isinstance(shard_size, bool) or shard_size < 1:
        raise ValueError(f"shard_size must be a positive integer, got {shard_size!r}")
    _check_options(tol, relative, stride, units)
    scope = sweep_scope(scope, relative)
    check_gates(gates)
    check_precision(precision)
    runs = expand_models(models)
    items = load_prompts(prompts, text_field=text_field)
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a folder; give a folder for the sweep")
    options = {
        "layers": _layer_list(layers),
        "tol": float(tol),
        "relative": bool(relative),
        "scope": scope,
        "gates": gates,
        "stride": stride,
        "units": units if units is None or isinstance(units, int) else [int(u) for u in units],
        "causal": bool(causal),
        "precision": precision,
    }
    plan = {
        "format": PLAN_FORMAT,
        "prompts_sha256": _prompt_digest(items),
        "n_prompts": len(items),
        "shard_size": shard_size,
        "bucket_by_length": bool(bucket_by_length),
        "options": options,
        "package_version": __version__,
    }
    record = _check_plan(out, plan, runs)
    if backend == "ray":
        from .ray_backend import check_address

        check_address(ray_address)
    out.mkdir(parents=True, exist_ok=True)
    # the prompts match the plan's digest: rewriting them repairs a damaged copy
    atomic_write(out / PROMPTS_FILE, "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in items))
    atomic_write(out / PLAN_FILE, json.dumps(record, indent=2))

    shards = plan_shards(runs, items, shard_size, bucket_by_length)
    pending = [s for s in shards if not _finished(s, out)]
    total = sum(len(s.prompt_ids) for s in pending)
    bar = tqdm(total=total, unit="seq", desc=f"sweep ({backend})", disable=not progress or not pending)

    def finish(shard: Shard, table, meta) -> None:
        meta["backend"] = backend
        write_shard(shard.path(out), table, meta)
        bar.update(len(shard.prompt_ids))

    try:
        if backend == "local":
            _run_local(pending, items, options, device, finish)
        else:
            from .ray_backend import run_ray

            run_ray(
                pending,
                items,
                options,
                device=device,
                address=ray_address,
                init=ray_init,
                num_gpus=num_gpus,
                finish=finish,
            )
    finally:
        bar.close()
    return SweepResult(out, runs, computed=len(pending), skipped=len(shards) - len(pending), shards=shards)


def _finished(shard: Shard, out: Path) -> bool:
    """True for a shard whose file is there and whole; a damaged file is recomputed, with a warning."""
    path = shard.path(out)
    if not path.is_file():
        return False
    problem = shard_problem(path, shard.prompt_ids)
    if problem is not None:
        warnings.warn(f"recomputing the damaged shard {path.relative_to(out)}: {problem}", stacklevel=3)
    return problem is None


def _run_local(pending: list[Shard], prompts: list, options: dict, device, finish) -> None:
    for run, group in groupby(pending, key=lambda s: s.run):
        model, tokenizer = load_model(run.source, device=device)  # once per run; dropped after its shards
        for shard in group:
            items = [(i, prompts[i]) for i in shard.prompt_ids]
            finish(shard, *compute_shard(run, model, tokenizer, items, options))
        del model, tokenizer
