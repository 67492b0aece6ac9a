"""The wheel works on its own: built from a copy of the source, installed into a fresh
virtual environment, `ess-explorer analyze` (no arguments, offline, from an unrelated
folder) finds the built-in default model and exits 0, and `ess_explorer.zoo.list_models()`
works right after `import ess_explorer`.

The fresh environment gets its dependencies (torch, transformers, ...) from the test's own
environment through a plain path entry, not its site hooks, so an editable install of the
checkout there cannot stand in for the wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from ess_explorer.sources import DEFAULT_MODEL

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "test-artifacts",
    ".pytest_cache",
    ".hypothesis",
    ".ess-cache",
    "notebooks",
    "tests",
    "benchmarks",
)


def _run(cmd, **kw):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=SKIP)  # building writes build/ and *.egg-info: never in the checkout
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(work / "dist"),
            str(source),
        ],
        cwd=work,
    )
    wheel = next((work / "dist").glob("ess_explorer-*.whl"))
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        ESS_EXPLORER_CACHE=str(work / "cache"),
    )
    env.pop("ESS_EXPLORER_ZOO_DIR", None)
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    return {"wheel": wheel, "venv": venv, "python": python, "env": env, "cwd": elsewhere, "site": site}


def test_the_wheel_ships_the_zoo(installed):
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    assets = [n for n in names if n.startswith("ess_explorer/zoo/assets/")]
    shipped = {n.split("/")[3] for n in assets if n.endswith("/config.json")}
    assert "mamba2_n16" in shipped, sorted(shipped)
    for model in shipped:
        assert f"ess_explorer/zoo/assets/{model}/model.safetensors" in names, model


def test_import_then_zoo_list_models_from_the_installed_wheel(installed):
    code = (
        "import ess_explorer, pathlib; print(pathlib.Path(ess_explorer.__file__).resolve());"
        " print(','.join(ess_explorer.zoo.list_models())); print(ess_explorer.zoo.DEFAULT_MODEL)"
    )
    out = _run([str(installed["python"]), "-c", code], env=installed["env"], cwd=installed["cwd"]).stdout.split()
    location, models, default = Path(out[0]), out[1].split(","), out[2]
    assert installed["site"].resolve() in location.parents, f"imported {location}, not the installed wheel"
    assert default in models and len(models) >= 2


def test_ess_explorer_analyze_with_no_arguments_offline(installed):
    done = _run(
        [str(installed["venv"] / "bin" / "ess-explorer"), "analyze"], env=installed["env"], cwd=installed["cwd"]
    )
    text = done.stdout + done.stderr
    assert f"zoo:{DEFAULT_MODEL}" in text, text[-2000:]
