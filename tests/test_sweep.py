"""Sweeps: inputs, the table against analyze, resumption after a kill, and Ray = local."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import ess_explorer
from ess_explorer import analyze, zoo
from ess_explorer.sweep import expand_models, load_prompts, read_metadata, read_table, run_sweep
from ess_explorer.sweep.run import SWEEP_SCOPE, plan_shards
from ess_explorer.sweep.table import COLUMNS, shard_path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["zoo:la_k16", "zoo:lfm2"]


def seg_prompts(n, start=0):
    task = zoo.task_of("mamba2_n16_reset")  # four segments joined by "|"
    return [task.prompt(seed=s) for s in range(start, start + n)]


def unit_multiplicity(layer):
    value = getattr(layer, "multiplicity", None)  # a per-unit array where the result records one
    return np.ones(layer.n_units, dtype=int) if value is None else np.asarray(value)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    # ess_explorer.sweep is the package and, called, the function (sweep.sweep)
    return ess_explorer.run_sweep(MODELS, seg_prompts(4), out=out, shard_size=2, progress=False)


# ---- inputs ---------------------------------------------------------------------------------
def test_prompts_from_text_jsonl_dataset_and_ids(tmp_path):
    text = tmp_path / "p.txt"
    text.write_text("a b c\n\n d e\n", encoding="utf-8")
    assert load_prompts(text) == ["a b c", " d e"]  # blank lines skipped, text kept as written
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"text": "x y"}\n{"input_ids": [5, 6, 7]}\n', encoding="utf-8")
    assert load_prompts(jsonl) == ["x y", [5, 6, 7]]

    class Dataset:  # what the sweep uses of a datasets.Dataset
        column_names = ["body", "label"]

        def __getitem__(self, column):
            return {"body": ["one two", "three four"], "label": [0, 1]}[column]

    assert load_prompts(Dataset(), text_field="body") == ["one two", "three four"]
    assert load_prompts([np.array([3, 4]), (1, 2, 3)]) == [[3, 4], [1, 2, 3]]
    for bad, message in [
        ([], "no prompts"),
        (["ok", ""], "prompt 1 is empty"),
        ([[1]], "at least 2"),
        ([[1.5, 2]], "integer token ids"),
        (tmp_path / "none.txt", "no prompt file"),
        (Dataset(), "no 'text' column"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_prompts(bad)


def test_training_run_expands_into_checkpoints_by_step(tmp_path):
    run = tmp_path / "run"
    for step in (20, 3, 100):
        shutil.copytree(zoo.model_dir("la_k16"), run / f"checkpoint-{step}")
    runs = expand_models([str(run), "zoo:lfm2"])
    assert [(r.model, r.checkpoint_step) for r in runs] == [
        (str(run), 3),
        (str(run), 20),
        (str(run), 100),
        ("zoo:lfm2", None),
    ]
    assert runs[0].source.endswith("checkpoint-3")
    with pytest.raises(ValueError, match="listed twice"):
        expand_models(["zoo:lfm2", "zoo:lfm2"])
    with pytest.raises(ValueError, match="neither a model folder"):
        expand_models([str(tmp_path)])


def test_shards_follow_the_prompt_order_or_group_by_length():
    runs = expand_models(["zoo:la_k16", "zoo:lfm2"])
    prompts = ["a b c d e f", [1, 2], "a b c", [1, 2, 3, 4, 5, 6, 7, 8]]
    plain = plan_shards(runs, prompts, 2, bucket_by_length=False)
    assert [(s.run.model, s.index, s.prompt_ids) for s in plain] == [
        ("zoo:la_k16", 0, (0, 1)),
        ("zoo:la_k16", 1, (2, 3)),
        ("zoo:lfm2", 0, (0, 1)),
        ("zoo:lfm2", 1, (2, 3)),
    ]
    by_length = plan_shards(runs[:1], prompts, 2, bucket_by_length=True)  # lengths 11, 2, 5, 8 (chars / ids)
    assert [s.prompt_ids for s in by_length] == [(1, 2), (3, 0)]


# ---- the table ------------------------------------------------------------------------------
def test_table_rows_are_analyze_of_each_prompt(local):
    assert isinstance(local, ess_explorer.SweepResult) and ess_explorer.sweep.read_table is read_table
    table = local.table()
    assert list(table.columns) == COLUMNS
    assert local.computed == 4 and local.skipped == 0  # 2 models x 2 shards of 2 prompts
    prompts = seg_prompts(4)
    for source in MODELS:
        model, tokenizer = zoo.load(source[4:])
        for prompt_id in (0, 3):
            mine = table[(table.model == source) & (table.prompt_id == prompt_id)].reset_index(drop=True)
            # the sweep counts at its default scope, the reset-aware "unit"
            assert SWEEP_SCOPE == "unit"
            result = analyze(model, prompt=prompts[prompt_id], tokenizer=tokenizer, progress=False, scope=SWEEP_SCOPE)
            frame = result.to_frame()
            assert len(mine) == len(frame)
            for column in ("layer", "unit", "t", "token", "family", "tolerance_ess", "entropy_ess", "tss"):
                np.testing.assert_array_equal(mine[column].to_numpy(), frame[column].to_numpy(), err_msg=column)
            assert mine.checkpoint_step.isna().all()
            # Per-unit multiplicity (1 where the result records none) and causal ESS when defined.
            lays = [result.layers[i] for i in sorted(result.layers)]
            multiplicity = [np.repeat(unit_multiplicity(lay), len(lay.positions)) for lay in lays]
            np.testing.assert_array_equal(mine.multiplicity.to_numpy(), np.concatenate(multiplicity))
            nuclear = np.concatenate([lay.singular_values.sum(-1).reshape(-1) for lay in lays])
            np.testing.assert_allclose(mine.nuclear_norm.to_numpy(), nuclear, rtol=1e-12)
            if "causal_ess" in mine:
                causal = np.concatenate([np.asarray(lay.causal_ess, dtype=float).reshape(-1) for lay in lays])
                np.testing.assert_array_equal(mine.causal_ess.to_numpy(), causal)
    assert "|" in set(table.token)  # token strings are the decoded tokens
    meta = read_metadata(local.out)
    assert sorted((m["run"]["model"], tuple(m["prompt_ids"])) for m in meta) == sorted(
        (m, ids) for m in MODELS for ids in [(0, 1), (2, 3)]
    )
    assert all(m["analysis"]["model_id"] == m["run"]["model"] and m["n_tokens"] == [131, 131] for m in meta)


def test_table_reads_as_a_hive_dataset_with_pandas(local):
    frame = pd.read_parquet(local.out / "table")  # the standard reader decodes model=zoo%3Ala_k16
    assert sorted(map(str, frame.model.unique())) == MODELS
    assert len(frame) == len(local.table())


def test_rerun_computes_nothing_and_other_options_are_refused(local):
    again = run_sweep(MODELS, seg_prompts(4), out=local.out, shard_size=2, progress=False)
    assert (again.computed, again.skipped) == (0, 4)
    with pytest.raises(ValueError, match="another prompts_sha256"):
        run_sweep(MODELS, seg_prompts(4, start=1), out=local.out, shard_size=2, progress=False)
    with pytest.raises(ValueError, match="another options"):
        run_sweep(MODELS, seg_prompts(4), out=local.out, shard_size=2, tol=1e-2, progress=False)
    fresh = local.out.parent / "refused"
    for options, message in [
        ({"tol": -1.0}, "tol must be"),
        ({"scope": "model"}, "scope must be"),
        ({"gates": "both"}, "gates must be"),
        ({"stride": 0}, "stride must be"),
    ]:
        with pytest.raises(ValueError, match=message):
            run_sweep(MODELS, seg_prompts(4), out=fresh, progress=False, **options)
    assert not fresh.exists()  # refused before anything was written
    with pytest.raises(ValueError, match="backend must be one of"):
        run_sweep(MODELS, seg_prompts(4), out=local.out, backend="dask")


def test_no_causal_sweep_leaves_the_column_empty_and_an_older_plan_resumes(local, tmp_path):
    table = local.table()
    skipped = run_sweep(MODELS, seg_prompts(4), out=tmp_path / "fast", shard_size=2, causal=False, progress=False)
    fast = skipped.table()
    assert fast.causal_ess.isna().all() and table.causal_ess.notna().any()
    for column in ("tolerance_ess", "entropy_ess", "tss"):
        np.testing.assert_array_equal(fast[column].to_numpy(), table[column].to_numpy(), err_msg=column)
    with pytest.raises(ValueError, match="another options"):  # one table never mixes the two
        run_sweep(MODELS, seg_prompts(4), out=local.out, shard_size=2, causal=False, progress=False)
    # a sweep folder written before the option existed (no "causal" in its plan) ran with causal ESS
    older = tmp_path / "older"
    shutil.copytree(local.out, older)
    plan = json.loads((older / "sweep.json").read_text())
    del plan["options"]["causal"]
    (older / "sweep.json").write_text(json.dumps(plan))
    again = run_sweep(MODELS, seg_prompts(4), out=older, shard_size=2, progress=False)
    assert (again.computed, again.skipped) == (0, 4)


# ---- resumption -----------------------------------------------------------------------------
def _cli(out, prompts_file, *extra):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return [
        sys.executable,
        "-m",
        "ess_explorer.app.cli",
        "sweep",
        "--models",
        ",".join(MODELS),
        "--prompts",
        str(prompts_file),
        "--out",
        str(out),
        "--shard-size",
        "1",
        "--quiet",
        *extra,
    ], env


def test_killed_sweep_resumes_and_equals_an_uninterrupted_one(tmp_path):
    # One reset-task sequence each (131 tokens, within lfm2's context of 256): each shard takes a while.
    prompts = seg_prompts(8)
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("\n".join(prompts) + "\n", encoding="utf-8")
    out = tmp_path / "killed"
    total = len(MODELS) * len(prompts)
    command, env = _cli(out, prompts_file, "--scope", SWEEP_SCOPE)  # as sweep() below counts by default
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    done = []
    while time.monotonic() < deadline and process.poll() is None:
        done = list((out / "table").glob("model=*/*.parquet")) if (out / "table").is_dir() else []
        if done:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    process.wait()
    assert process.returncode == -signal.SIGKILL, process.stderr.read().decode()[-2000:]
    present = {p: p.stat().st_mtime_ns for p in (out / "table").glob("model=*/*.parquet")}
    assert 1 <= len(present) < total

    resumed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"computed {total - len(present)}, {len(present)} already there" in resumed.stdout
    assert all(p.stat().st_mtime_ns == mtime for p, mtime in present.items())  # done shards untouched

    fresh = run_sweep(MODELS, prompts, out=tmp_path / "fresh", shard_size=1, progress=False)
    pd.testing.assert_frame_equal(read_table(out), fresh.table(), check_exact=True)
    plan = json.loads((out / "sweep.json").read_text())
    assert plan["n_prompts"] == len(prompts) and [r["model"] for r in plan["runs"]] == MODELS
    assert shard_path(out, "zoo:la_k16", None, 0).is_file()


# ---- Ray ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_ray_backend_gives_the_local_table(local, tmp_path):
    try:
        import ray
    except ImportError:
        if os.environ.get("REQUIRE_RAY"):
            raise
        pytest.skip("ray is not installed (pip install 'ess-explorer[ray]'); set REQUIRE_RAY=1 to fail instead")
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        remote = run_sweep(MODELS, seg_prompts(4), out=tmp_path / "ray", shard_size=2, backend="ray", progress=False)
    finally:
        ray.shutdown()
    assert remote.computed == 4
    pd.testing.assert_frame_equal(remote.table(), local.table(), check_exact=True)
    assert {m["backend"] for m in read_metadata(remote.out)} == {"ray"}


def test_shards_without_an_optional_column_read_with_nulls(local, tmp_path):
    import pyarrow.parquet as pq

    if "causal_ess" not in COLUMNS:
        pytest.skip("this version's results define no causal_ess")
    for path in (local.out / "table").glob("model=*/*.parquet"):  # as a version without causal ESS wrote them
        target = tmp_path / path.relative_to(local.out)
        target.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pq.read_table(path).drop_columns(["causal_ess"]), target)
    old = read_table(tmp_path)
    assert old.causal_ess.isna().all()
    pd.testing.assert_frame_equal(old.drop(columns="causal_ess"), local.table().drop(columns="causal_ess"))
