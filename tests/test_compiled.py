"""The compiled kernels give the same bits whether a process compiled them or loaded them from
numba's disk cache.

A sweep's shards run in other processes (Ray workers, a resumed CLI) than the one that first
compiled the kernels after an install, and a resumed or distributed table must equal the
uninterrupted one exactly. A reassociating kernel that calls a helper it does not inline broke
this (core/compiled.py): the dense kernel's tridiagonal forms differed in their last bits.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ess_explorer.core import compiled

ROOT = Path(__file__).resolve().parents[1]

# Every entry point of the dense kernel (which reassociates), the Gramian kernel (with causal
# ESS) and the row-scaled channels' kernel, on inputs large enough that LLVM's vectorised
# loops, not their scalar remainders, do the sums.
SCRIPT = """
import sys
import numpy as np
import torch
from ess_explorer.core import channel_kernel, dense_kernel, gramian_kernel

rng = np.random.default_rng(0)
out = {}
grams = rng.standard_normal((70, 60, 60))
grams = grams @ grams.transpose(0, 2, 1)
out["symmetric"] = dense_kernel.symmetric_eigenvalues(torch.from_numpy(grams), workers=1).numpy()
forms = dense_kernel.TridiagonalForms.empty(70, 60)
forms.reduce(grams, np.full(70, 60), range(70))
out["forms"] = np.concatenate([forms.diag, forms.off, forms.scale[:, None]], axis=1)
op = np.tril(rng.standard_normal((90, 90)))
forms = dense_kernel.TridiagonalForms.empty(4, 45)
dense_kernel.cut_forms(op, [45, 30], [0, 1], True, forms, np.zeros((45, 45)))
dense_kernel.cut_forms(op, [50, 70], [2, 3], False, forms, np.zeros((45, 45)))
out["cut_forms"] = np.concatenate([forms.diag, forms.off, forms.scale[:, None]], axis=1)
a = 0.85 + 0.14 * rng.random((2, 60, 24))
b, c = rng.standard_normal((2, 2, 60, 24))
lam, err, reach = gramian_kernel.gramian_spectra_kernel(a, b, c, np.arange(1, 60), True, 10.0)
out["gramian"] = np.concatenate([x.reshape(-1) for x in (lam, err, *reach)])
base, gate = torch.from_numpy(rng.standard_normal((90, 20))), torch.from_numpy(rng.random((70, 90)))
out["channels"] = channel_kernel.gram_eigenvalues(base, gate).numpy()
np.savez(sys.argv[1], **out)
"""


@pytest.mark.slow
@pytest.mark.skipif(not compiled.available(), reason="numba is not installed")
def test_a_fresh_compile_and_the_disk_cache_give_the_same_bits(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PYTHONPATH": str(ROOT)}
    results = []
    for run in ("compiled", "cached"):  # the first process compiles into the empty cache folder
        path = tmp_path / f"{run}.npz"
        subprocess.run([sys.executable, "-c", SCRIPT, str(path)], env=env, check=True, timeout=600)
        results.append(np.load(path))
    assert any((tmp_path / "numba").rglob("*.nbc")), "the second process found no cache to load"
    fresh, cached = results
    for name in fresh.files:
        np.testing.assert_array_equal(fresh[name], cached[name], err_msg=name)


def test_a_kernels_first_call_warms_it_up_and_only_a_slow_warm_up_says_it_compiles(monkeypatch, capsys):
    """Before a kernel's first call in a process, a tiny warm-up loads or compiles it; only a
    warm-up longer than NOTICE_AFTER (a compile after an install, 9-12 s with nothing on
    screen) prints one line, once per process. A long real call prints nothing (a large job
    is not a compile), a kernel the process already runs is not warmed again, and the
    warm-up's own call of the kernel does not recurse."""
    import threading
    import time

    if not compiled.available():
        pytest.skip("numba is not installed: nothing compiles")
    monkeypatch.setattr(compiled, "NOTICE_AFTER", 0.05)
    monkeypatch.setattr(compiled, "_announced", threading.Event())

    class Kernel:  # a dispatcher: a signature once it has run
        def __init__(self, warm_seconds: float):
            self.signatures, self.warm_ups, self.warm_seconds = [], 0, warm_seconds

        def warm_up(self):
            self.warm_ups += 1
            self(long=False)  # the warm-up's call goes through the same entry

        def __call__(self, long: bool):
            compiled.first_call(self, self.warm_up)
            time.sleep(self.warm_seconds if not self.signatures else (0.3 if long else 0.0))
            self.signatures = ["(float64,)"]

    fast = Kernel(0.0)
    fast(long=True)  # loaded from the cache, then a long job
    fast(long=True)
    assert fast.warm_ups == 1 and capsys.readouterr().err == ""
    slow = Kernel(0.3)  # compiling
    slow(long=False)
    assert slow.warm_ups == 1 and "compiling the CPU kernels" in capsys.readouterr().err
    Kernel(0.3)(long=False)  # another compile: said once per process
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(not compiled.available(), reason="numba is not installed")
def test_a_kernels_disk_cache_goes_stale_when_any_kernel_file_changes(tmp_path, monkeypatch):
    """A kernel carries compiled copies of helpers from other kernel files (the QL in three
    kernels), and numba checks its cache against the kernel's own file alone: so the cache
    also records every kernel file's contents, and a change to any of them compiles again."""
    (tmp_path / "tiny_kernel.py").write_text("def double(x):\n    return 2.0 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tiny_kernel", raising=False)
    import tiny_kernel

    def misses() -> int:  # a new dispatcher each time, as in a new process
        kernel = compiled.jit(tiny_kernel.double)
        assert kernel(1.5) == 3.0
        return sum(kernel.stats.cache_misses.values())

    assert misses() == 1  # compiled, and saved to tmp_path/__pycache__
    assert misses() == 0  # loaded
    monkeypatch.setattr(compiled, "_kernels_digest", lambda: "another kernel file changed")
    assert misses() == 1
    assert misses() == 0


def test_the_cache_key_reads_every_module_that_defines_kernels():
    core = ROOT / "ess_explorer" / "core"
    defining = {
        path.stem for path in core.glob("*.py") if "@jit" in path.read_text() or "@compiled.jit" in path.read_text()
    }
    assert defining | {"compiled"} == set(compiled.KERNEL_MODULES)
