"""Benchmark: a sweep of zoo models x prompts from the command line, local vs Ray (prints; not a test).

Three runs of ``ess-explorer sweep`` into fresh folders, each a subprocess as a user runs it:
    local         --backend local (one process)
    ray           --backend ray --num-cpus N (a local Ray cluster of N one-CPU workers; started
                  and stopped by the command, so its start-up is in the wall time)
    killed+resume --backend local, killed (SIGKILL) once a few shards are written, then rerun
and checks that the three tables are identical (pandas, exact). Printed per run: wall seconds
(process start to exit, model loading included), sequences per second on that wall time,
and the compute seconds the shards record (analysis only; summed over workers).

    .venv/bin/python benchmarks/bench_sweep.py                          # 3 models x 50 prompts
    .venv/bin/python benchmarks/bench_sweep.py --prompts 200 --workers 4
Prompts are held-out sequences of the segmented MQAR task (three segments joined by "|").
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = "zoo:mamba2_n16_seg,zoo:gla_k16_seg,zoo:mamba2_n16"


def cli(out: Path, prompts: Path, models: str, *extra) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ess_explorer.app.cli",
        "sweep",
        "--models",
        models,
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--shard-size",
        "5",
        "--quiet",
        *extra,
    ]


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def killed_then_resumed(command: list[str], out: Path, after: int) -> tuple[float, int]:
    """Start, SIGKILL once ``after`` shard files exist, rerun; (total wall s, shards at the kill)."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    files = []
    while process.poll() is None:
        files = list(out.glob("table/model=*/*.parquet"))
        if len(files) >= after:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    process.wait()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start, len(files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import pandas as pd

    from ess_explorer import zoo
    from ess_explorer.sweep import read_metadata, read_table

    task = zoo.task_of("mamba2_n16_seg")
    root = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    try:
        prompts = root / "prompts.txt"
        prompts.write_text("\n".join(task.prompt(seed=10_000 + s) for s in range(args.prompts)) + "\n")
        n_models = len(args.models.split(","))
        sequences = n_models * args.prompts
        print(
            f"{n_models} models x {args.prompts} prompts = {sequences} sequences of {task.length} tokens; "
            f"{os.cpu_count()} CPUs (shared machine: treat as upper bounds)"
        )
        runs = {
            "local": timed(cli(root / "local", prompts, args.models)),
            f"ray ({args.workers} workers)": timed(
                cli(root / "ray", prompts, args.models, "--backend", "ray", "--num-cpus", str(args.workers))
            ),
        }
        wall, at_kill = killed_then_resumed(cli(root / "resumed", prompts, args.models), root / "resumed", after=3)
        runs[f"local, killed at {at_kill} shards + resumed"] = wall
        folders = dict(zip(runs, ["local", "ray", "resumed"]))
        reference = read_table(root / "local")
        print(f"{'run':<38} {'wall s':>8} {'seq/s':>7} {'compute s':>10}  table = local")
        for name, seconds in runs.items():
            folder = root / folders[name]
            compute = sum(m["seconds"] for m in read_metadata(folder))
            try:
                pd.testing.assert_frame_equal(read_table(folder), reference, check_exact=True)
                same = "yes"
            except AssertionError:
                same = "NO"
            print(f"{name:<38} {seconds:8.1f} {sequences / seconds:7.1f} {compute:10.1f}  {same}")
        print(f"rows per table: {len(reference)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
