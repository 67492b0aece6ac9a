"""The routes written for a GPU, run on the CPU (core/accelerator.py): batched dense cuts, the
scan, the blocked Gramian route, owners' SVDs without carried factors, the dense route of
gated channels, the causal sweep without trimming, and no compiled CPU kernel anywhere. Their
logic needs no CUDA, so every family's layers must meet both accuracy contracts on them
against the CPU's exact spectra, here, on a machine without a GPU."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch
from _contracts import assert_exact_contract
from test_adapters import VOCAB, build

from ess_explorer import analyze
from ess_explorer.core import channel_kernel, dense_jobs, dense_kernel, gramian, gramian_kernel, sturm
from ess_explorer.core.accelerator import accelerator_routes, accelerator_routes_on_cpu, worker_threads
from ess_explorer.core.sweeps import _rank_one_update_upper

LENGTH = 48  # within every tiny config's context (GPT-2's: 64)
# one family per route: factored diagonal (Mamba), gated channels of shared heads (Mamba2),
# dense attention (GPT-2), DPLR delta rule (Qwen3-Next), short conv + attention (LFM2)
FAMILIES = ["mamba", "mamba2", "gpt2", "qwen3_next", "lfm2"]
# the compiled CPU kernels' entry points (core/compiled.py): none may run on a GPU's routes
KERNELS = [
    (dense_kernel, "_forms"),
    (dense_kernel, "_lane_eigenvalues"),
    (channel_kernel, "_grams_and_eigenvalues"),
    (gramian_kernel, "_kernel"),
    (sturm, "_sturm_counts"),
]


@contextmanager
def kernels_refused():
    """Inside, every compiled kernel raises when called, and every job is large enough to take
    one on the CPU routes (so that refusing them is not vacuous)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a compiled CPU kernel ran on the accelerator's routes")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dense_jobs, "KERNEL_MIN_WORK", 0.0)
        patch.setattr(gramian, "KERNEL_MIN_WORK", 0.0)
        for module, name in KERNELS:
            patch.setattr(module, name, refuse)
        yield


def prompt() -> list[int]:
    return torch.randint(1, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(7)).tolist()


def test_the_switch_sets_the_routes_and_restores_them():
    assert not accelerator_routes("cpu") and not accelerator_routes(None)
    assert accelerator_routes(torch.device("cuda")) and worker_threads("cuda") == 1
    with accelerator_routes_on_cpu():
        assert accelerator_routes("cpu") and worker_threads("cpu") == 1
        with accelerator_routes_on_cpu():
            pass
        assert accelerator_routes("cpu")  # a nested scope leaves the outer one on
    assert not accelerator_routes("cpu") and worker_threads("cpu") == torch.get_num_threads()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("precision", ["ess", "exact"])
def test_the_accelerator_routes_meet_each_contract_against_the_cpu_exact_spectra(family, precision):
    model, _ = build(family)
    ids = prompt()
    with accelerator_routes_on_cpu(), kernels_refused():
        routed = analyze(model, ids, progress=False, precision=precision, keep_operators=False)
    exact = analyze(model, ids, progress=False, precision="exact", keep_operators=False)
    for index, reference in exact.layers.items():
        layer = routed.layers[index]
        np.testing.assert_array_equal(layer.tolerance_ess, reference.tolerance_ess)
        np.testing.assert_array_equal(layer.causal_ess, reference.causal_ess)  # NaN where no realisation
        np.testing.assert_allclose(layer.entropy_ess, reference.entropy_ess, rtol=1e-5, atol=1e-12)
        if precision == "exact":  # every kept value within the exact contract of the SVD's
            assert_exact_contract(layer.singular_values, reference.singular_values)


def test_the_cpu_routes_would_have_run_the_kernels_the_accelerator_routes_refuse():
    """The guard above is not vacuous: with every job large enough, the CPU routes of the same
    families call a compiled kernel (where numba is installed)."""
    pytest.importorskip("numba")
    for family in ("mamba", "mamba2", "gpt2"):
        model, _ = build(family)
        with kernels_refused(), pytest.raises(AssertionError, match="compiled CPU kernel"):
            analyze(model, prompt(), progress=False, keep_operators=False)


def test_the_accelerator_routes_are_the_ones_recorded():
    """What the result records as its path is the route that ran: the scan and batched cuts
    under the switch, the sweep and one call per cut without it."""
    model, _ = build("mamba")
    with accelerator_routes_on_cpu():
        routed = analyze(model, prompt(), progress=False, precision="exact", keep_operators=False)
    plain = analyze(model, prompt(), progress=False, precision="exact", keep_operators=False)
    assert {layer.path["method"] for layer in routed.layers.values()} == {"scan"}
    assert {layer.path["method"] for layer in plain.layers.values()} == {"sweep"}


@pytest.mark.parametrize("scale", [1.0, 1e-309, 1e150])
def test_givens_rotations_fold_tiny_and_huge_rows_as_the_qr_does(scale):
    """The accelerator's rank-one update (Givens rotations as complex phases) against the CPU's
    QR of the stacked [R; x]: R'^T R' = R^T R + x x^T, also where the pivots are subnormal (a
    state after near-zero decays) or huge."""
    generator = torch.Generator().manual_seed(0)
    r = torch.linalg.qr(torch.randn(6, 8, 8, dtype=torch.float64, generator=generator)).R * scale
    r[:, 5:, :] = 0.0  # rows not yet written: zero pivots need no rotation
    x = torch.randn(6, 8, dtype=torch.float64, generator=generator) * scale
    rotated = _rank_one_update_upper(r.clone(), x.clone(), rotations=True)
    stacked = _rank_one_update_upper(r.clone(), x.clone(), rotations=False)
    assert bool(torch.isfinite(rotated).all())
    want = torch.linalg.svdvals(stacked)
    torch.testing.assert_close(torch.linalg.svdvals(rotated) / scale, want / scale, rtol=1e-12, atol=1e-12)
