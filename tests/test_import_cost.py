"""`import ess_explorer` imports no table, sweep or chart library until one is needed."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("pandas", "pyarrow", "ray", "altair", "ipywidgets")


def _loaded_after(code: str) -> dict[str, bool]:
    probe = f"import sys\n{code}\nimport json\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_ess_explorer_loads_no_pandas_pyarrow_ray_or_widgets():
    loaded = _loaded_after("import ess_explorer\nassert callable(ess_explorer.analyze)")
    assert not any(loaded.values()), loaded


def test_the_sweep_names_load_the_sweep_on_first_use():
    """The lazy names are the sweep's own: the package, run_sweep, summarize (pandas then)."""
    loaded = _loaded_after(
        "import ess_explorer\n"
        "from ess_explorer.sweep.run import run_sweep\n"
        "from ess_explorer.sweep import summarize\n"
        "assert ess_explorer.run_sweep is run_sweep and ess_explorer.summarize is summarize\n"
        "assert ess_explorer.sweep is sys.modules['ess_explorer.sweep']"
    )
    assert loaded["pandas"] and loaded["pyarrow"] and not loaded["altair"], loaded
