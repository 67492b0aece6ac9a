"""The CUDA eigenvalue kernel (core/cuda_eigen_kernel.py) against its reference, torch.linalg.eigvalsh.

On a CPU the kernel runs in numba's CUDA simulator, in a subprocess (the simulator is chosen
when numba.cuda is first imported, so it cannot share a process with the real target); on a
GPU the gpu-marked tests run it for real, on a layer-sized batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

from ess_explorer.core import cuda_eigen_kernel, eigen

EPS = float(np.finfo(np.float64).eps)

# Each case: matrices built from a seeded generator, then the kernel's eigenvalues and flags
# and torch's eigenvalues, as JSON. Run under NUMBA_ENABLE_CUDASIM=1.
SIMULATED = textwrap.dedent(
    """
    import json, sys
    import numpy as np, torch
    from ess_explorer.core.cuda_eigen_kernel import launch, MAX_SIZE

    rng = np.random.default_rng(5)

    def symmetric(count, n):
        x = rng.standard_normal((count, n, n))
        return x + x.transpose(0, 2, 1)

    def graded(count, n, low):  # PSD, eigenvalues spread over 10^low .. 1
        q, _ = np.linalg.qr(rng.standard_normal((count, n, n)))
        lam = 10.0 ** rng.uniform(low, 0, (count, n))
        return q @ (lam[..., None] * q.transpose(0, 2, 1))

    def low_rank(count, n, rank):
        y = rng.standard_normal((count, n, rank))
        return y @ y.transpose(0, 2, 1)

    def wilkinson(n):  # W+_n: pairs of nearly equal eigenvalues
        m = np.diag(np.abs(np.arange(n) - (n - 1) / 2)) + np.diag(np.ones(n - 1), 1) + np.diag(np.ones(n - 1), -1)
        return m[None]

    cases = {f"random n={n}": symmetric(6, n) for n in (1, 2, 3, 7, 16, 17, 32)}
    cases.update({f"graded 1e-30 n={n}": graded(6, n, -30) for n in (16, 32)})
    cases.update({f"rank 3 n={n}": low_rank(6, n, 3) for n in (16, 32)})
    cases["wilkinson n=21"] = wilkinson(21)
    cases["identity x 1e-200"] = np.eye(16)[None] * 1e-200
    cases["identity x 1e200"] = np.eye(16)[None] * 1e200
    cases["zeros"] = np.zeros((2, 16, 16))
    cases["diagonal"] = np.diag(rng.uniform(-5, 5, 16))[None]
    bad = symmetric(3, 16)
    bad[1, 4, 2] = bad[1, 2, 4] = np.nan
    bad[2, 0, 0] = np.inf
    cases["non-finite"] = bad
    out = {}
    for name, matrices in cases.items():
        matrices = np.ascontiguousarray(matrices)
        values = np.full(matrices.shape[:-1], 123.0)
        failed = np.zeros(len(matrices), dtype=np.int32)
        launch(matrices, values, failed)
        reference = torch.linalg.eigvalsh(torch.from_numpy(np.nan_to_num(matrices))).numpy()
        out[name] = {"values": values.tolist(), "failed": failed.tolist(), "reference": reference.tolist()}
    try:
        launch(np.zeros((1, MAX_SIZE + 1, MAX_SIZE + 1)), np.zeros((1, MAX_SIZE + 1)), np.zeros(1, dtype=np.int32))
        out["too large"] = "accepted"
    except ValueError as error:
        out["too large"] = str(error)
    json.dump(out, sys.stdout)
    """
)


@pytest.fixture(scope="module")
def simulated() -> dict:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    run = subprocess.run([sys.executable, "-c", SIMULATED], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def test_simulated_kernel_gives_lapacks_eigenvalues_within_the_backward_error(simulated):
    """Every finite case: ascending, and each eigenvalue within 4 n eps ||A|| of LAPACK's (both
    backward stable: the bound the engine's guards assume), graded and rank-deficient spectra,
    Wilkinson's close pairs, and scales near the ends of the float range included."""
    for name, case in simulated.items():
        if name in ("non-finite", "too large"):
            continue
        values, reference = np.array(case["values"]), np.array(case["reference"])
        n = values.shape[-1]
        scale = np.abs(reference).max(-1, keepdims=True)
        assert not any(case["failed"]), name
        assert np.all(np.diff(values, axis=-1) >= 0), name
        assert np.all(np.abs(values - reference) <= 4 * n * EPS * scale), (
            name,
            float((np.abs(values - reference) / np.maximum(scale, 1e-300)).max() / (n * EPS)),
        )


def test_simulated_kernel_flags_what_it_cannot_solve(simulated):
    """A matrix with a NaN or an infinite entry is flagged (the host solves it), the others of
    its batch are not; an all-zero matrix is solved (zeros), not flagged; n past MAX_SIZE is
    refused with a message."""
    assert simulated["non-finite"]["failed"] == [0, 1, 1]
    first = np.array(simulated["non-finite"]["values"][0])
    assert np.allclose(first, simulated["non-finite"]["reference"][0], rtol=0, atol=1e-12)
    assert simulated["zeros"]["values"] == [[0.0] * 16] * 2
    assert f"n <= {cuda_eigen_kernel.MAX_SIZE}" in simulated["too large"]


def test_eigvalsh_routes_small_cuda_batches_to_the_kernel_only_where_it_runs(monkeypatch):
    """The rule (`eigen.cuda_kernel_takes`): float64, 0 < n <= MAX_SIZE, the kernel available
    and not turned off. Without numba-cuda and a GPU (this machine) it is never taken."""
    batch = torch.zeros(4, 16, 16, dtype=torch.float64)
    if not torch.cuda.is_available():
        assert not cuda_eigen_kernel.available() and not eigen.cuda_kernel_takes(batch)
    monkeypatch.setattr(cuda_eigen_kernel, "available", lambda: True)
    assert eigen.cuda_kernel_takes(batch)
    assert not eigen.cuda_kernel_takes(batch.float())
    assert not eigen.cuda_kernel_takes(
        torch.zeros(4, cuda_eigen_kernel.MAX_SIZE + 1, cuda_eigen_kernel.MAX_SIZE + 1, dtype=torch.float64)
    )
    monkeypatch.setattr(eigen, "use_cuda_kernel", False)
    assert not eigen.cuda_kernel_takes(batch)


def test_a_kernel_that_cannot_run_falls_back_to_cusolver_once(monkeypatch):
    """A toolkit or driver numba-cuda cannot use: the call warns once and answers by the
    cuSOLVER route, and later batches go there directly."""
    calls = []

    def broken(flat):
        calls.append(len(flat))
        raise RuntimeError("NVVM not found")

    monkeypatch.setattr(cuda_eigen_kernel, "symmetric_eigenvalues", broken)
    monkeypatch.setattr(cuda_eigen_kernel, "available", lambda: True)
    monkeypatch.setattr(eigen, "_kernel_failed_once", False)
    x = torch.randn(5, 16, 16, dtype=torch.float64)
    x = x + x.mT
    with pytest.warns(UserWarning, match="NVVM not found"):
        values = eigen._small_cuda_batch(x)  # CPU tensors stand in for the device's
    assert torch.allclose(values, torch.linalg.eigvalsh(x), rtol=0, atol=1e-12)
    assert calls == [5] and not eigen.cuda_kernel_takes(x)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n", [16, 32])
def test_cuda_kernel_equals_lapack_on_a_layer_sized_batch(n):
    """Past cuSOLVER's batch limit (3 x 16,384 + 17 matrices), graded PSD matrices as the
    Gramian route's sandwiches are: within 4 n eps ||A|| of LAPACK's on the host."""
    if not cuda_eigen_kernel.available():
        pytest.skip("numba-cuda is not installed")
    g = torch.Generator().manual_seed(n)
    count = 3 * 16384 + 17
    q, _ = torch.linalg.qr(torch.randn(count, n, n, generator=g, dtype=torch.float64))
    lam = 10.0 ** (-20 * torch.rand(count, n, generator=g, dtype=torch.float64))
    matrices = (q * lam[:, None, :]) @ q.mT
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback would warn: the kernel itself must answer
        got = cuda_eigen_kernel.symmetric_eigenvalues(matrices.cuda()).cpu()
        routed = eigen.eigvalsh(matrices.cuda()).cpu()
    reference = torch.linalg.eigvalsh(matrices)
    bound = 4 * n * EPS * reference.abs().amax(-1, keepdim=True)
    assert ((got - reference).abs() <= bound).all()
    assert torch.equal(routed, got)
