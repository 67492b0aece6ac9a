"""The CUDA kernels (core/cuda_eigen_kernel.py, core/cuda_block_kernel.py) against their references.

On a CPU the kernel runs in numba's CUDA simulator, in a subprocess (the simulator is chosen
when numba.cuda is first imported, so it cannot share a process with the real target); on a
GPU the gpu-marked tests run it for real, on a layer-sized batch.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ess_explorer.core import cuda_block_kernel, cuda_eigen_kernel, eigen

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

    # what the Gramian route gives the solver: the balanced sandwiches C^T Q C and the causal
    # Gramians P of Mamba-like units, slow (dt ~ e^-4) and fast (dt ~ 1) decays
    from ess_explorer.core import gramian_naive

    solved = []
    gramian_naive.eigvalsh = lambda x, allow_kernel=True: solved.append(x.clone()) or torch.linalg.eigvalsh(x)
    g = torch.Generator().manual_seed(3)
    for shift in (-4.0, 0.0):
        dt = torch.nn.functional.softplus(torch.randn(3, 40, 1, generator=g, dtype=torch.float64) + shift)
        a = torch.exp(-dt * torch.arange(1, 17, dtype=torch.float64))
        b = dt * torch.randn(3, 40, 16, generator=g, dtype=torch.float64)
        c = torch.randn(3, 40, 16, generator=g, dtype=torch.float64)
        gramian_naive.gramian_spectra_reference(a, b, c, torch.arange(1, 40), causal=True)
    cases["mamba sandwiches and causal gramians"] = torch.cat([x.reshape(-1, 16, 16) for x in solved]).numpy()
    out = {}
    for name, matrices in cases.items():
        matrices = np.ascontiguousarray(matrices)
        values = np.full(matrices.shape[:-1], 123.0)
        failed = np.zeros(len(matrices), dtype=np.int32)
        launch(matrices, values, failed)
        reference = torch.linalg.eigvalsh(torch.from_numpy(np.nan_to_num(matrices))).numpy()
        out[name] = {"values": values.tolist(), "failed": failed.tolist(), "reference": reference.tolist()}
    # the block kernel (n > 32): a few matrices, the simulator runs its 128 threads as Python's
    from ess_explorer.core.cuda_block_kernel import launch_block

    q, _ = np.linalg.qr(rng.standard_normal((1, 37, 37)))
    block_cases = {
        "random n=40": symmetric(1, 40),
        "graded 1e-30 n=37": q @ ((10.0 ** rng.uniform(-30, 0, (1, 37)))[..., None] * q.transpose(0, 2, 1)),
        "rank 4 n=48": low_rank(1, 48, 4),
        "identity n=33": np.eye(33)[None] * 3.0,
        "small n=1, 2": None,
    }
    for name, matrices in block_cases.items():
        if matrices is None:
            matrices = np.array([[[2.0, 1.0], [1.0, 2.0]]])
        matrices = np.ascontiguousarray(matrices)
        values, failed = np.full(matrices.shape[:-1], 123.0), np.zeros(len(matrices), dtype=np.int32)
        launch_block(matrices.copy(), values, failed)
        reference = torch.linalg.eigvalsh(torch.from_numpy(matrices)).numpy()
        out["block " + name] = {"values": values.tolist(), "failed": failed.tolist(), "reference": reference.tolist()}
    bad = symmetric(2, 34)
    bad[1, 3, 5] = bad[1, 5, 3] = np.nan
    values, failed = np.zeros((2, 34)), np.zeros(2, dtype=np.int32)
    launch_block(bad.copy(), values, failed)
    out["block non-finite"] = {"failed": failed.tolist(), "values": values.tolist()}

    # the Gramian route's per-cut steps, fused, against its torch route on the same Gramians
    from ess_explorer.core.cuda_eigen_kernel import launch_gramian

    g = torch.Generator().manual_seed(4)
    pairs = []
    for shift in (-4.0, 0.0, 2.0):
        dt = torch.nn.functional.softplus(torch.randn(3, 40, 1, generator=g, dtype=torch.float64) + shift)
        a = torch.exp(-dt * torch.arange(1, 17, dtype=torch.float64))
        b = dt * torch.randn(3, 40, 16, generator=g, dtype=torch.float64)
        c = torch.randn(3, 40, 16, generator=g, dtype=torch.float64)
        pairs.append(gramian_naive.gramians(a, b, c, torch.arange(1, 40)))
    p, q = (torch.cat([pair[k] for pair in pairs]).reshape(-1, 16, 16).clone() for k in (0, 1))
    p[5, 2, 2] = float("nan")  # not finite: redone exactly
    p[6] = -torch.eye(16, dtype=p.dtype)  # its Cholesky fails: redone exactly
    q[7] = -q[7] - torch.eye(16, dtype=q.dtype)  # wrong but finite: solved
    p[8], q[8] = 0.0, 0.0  # nothing written, nothing read
    lam, error = np.zeros((len(p), 16)), np.zeros(len(p))
    launch_gramian(p.numpy(), q.numpy(), gramian_naive.CHOLESKY_SHIFT, gramian_naive.GRAMIAN_ERROR, lam, error)
    reference = gramian_naive._sandwich_spectra(p, q)
    out["gramian cuts"] = {
        "lam": lam.tolist(), "error": error.tolist(),
        "reference_lam": reference[0].tolist(), "reference_error": reference[1].tolist(),
    }
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
    Wilkinson's close pairs, scales near the ends of the float range, and the very matrices the
    Gramian route solves for Mamba-like units included (its GRAMIAN_ERROR bound was measured
    with LAPACK's solver: the kernel's error must be of the same order); the block kernel's
    ("block ...", n > 32 and the smallest n) the same way."""
    for name, case in simulated.items():
        if name in ("non-finite", "too large", "gramian cuts", "block non-finite"):
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
    assert simulated["block non-finite"]["failed"] == [0, 1]
    assert simulated["block non-finite"]["values"][1] == [0.0] * 34


def test_simulated_gramian_kernel_gives_the_torch_routes_cuts(simulated):
    """The fused per-cut steps (balance, shifted Cholesky, sandwich, eigenvalues, bound) against
    the torch route on the same Gramians of Mamba-like units (slow, fast and very fast decays):
    the same error bound (to rounding), the same cuts marked for the exact route (a NaN, a
    failed Cholesky), a wrong but finite Gramian solved as torch solves it, nothing written
    giving zeros; each value within an eighth of the cut's bound of torch's, which both routes
    must meet against the exact values."""
    case = simulated["gramian cuts"]
    lam, error = np.array(case["lam"]), np.array(case["error"])
    reference_lam, reference_error = np.array(case["reference_lam"]), np.array(case["reference_error"])
    assert np.array_equal(np.isinf(error), np.isinf(reference_error))
    assert np.isinf(error[[5, 6]]).all() and np.isfinite(error[7]) and error[8] == 0.0
    finite = np.isfinite(error)
    assert np.allclose(error[finite], reference_error[finite], rtol=1e-12, atol=0)
    assert np.all(lam[~finite] == 0.0) and np.all(lam[8] == 0.0)
    assert np.all(np.diff(lam, axis=-1) <= 0) and np.all(lam >= 0)
    assert np.all(np.abs(lam - reference_lam)[finite] <= error[finite, None] / 8)


def on_gpu(*shape, dtype=torch.float64):
    """What `eigen.cuda_kernel_takes` reads of a CUDA tensor (none can be made without a GPU)."""
    return SimpleNamespace(shape=shape, dtype=dtype, device=torch.device("cuda"))


def test_small_cuda_batches_go_to_the_kernel_only_where_it_runs(monkeypatch):
    """The rule (`eigen.cuda_kernel_takes`, for `eigvalsh` and the Gramian route's per-cut
    steps): a CUDA tensor, float64, 0 < n <= MAX_SIZE, the kernel available and not turned off.
    Without numba-cuda and a GPU (this machine) it is never taken."""
    if not torch.cuda.is_available():
        assert not cuda_eigen_kernel.available() and not eigen.cuda_kernel_takes(on_gpu(4, 16, 16))
    monkeypatch.setattr(cuda_eigen_kernel, "available", lambda: True)
    assert eigen.cuda_kernel_takes(on_gpu(4, 16, 16)) and eigen.cuda_kernel_takes(on_gpu(2, 9, 32, 32))
    assert not eigen.cuda_kernel_takes(torch.zeros(4, 16, 16, dtype=torch.float64))  # the CPU's
    assert not eigen.cuda_kernel_takes(on_gpu(4, 16, 16, dtype=torch.float32))
    size = cuda_eigen_kernel.MAX_SIZE + 1
    assert not eigen.cuda_kernel_takes(on_gpu(4, size, size))
    monkeypatch.setattr(eigen, "use_cuda_kernel", False)
    assert not eigen.cuda_kernel_takes(on_gpu(4, 16, 16))


@pytest.mark.parametrize("setting, on", [(None, True), ("0", False), ("off", False), ("1", True)])
def test_the_environment_turns_the_cuda_kernels_off(setting, on):
    """ESS_EXPLORER_CUDA_KERNELS=0 (docs/usage.md) keeps every CUDA batch on torch's and
    cuSOLVER's routes, read when the engine is imported."""
    env = {k: v for k, v in os.environ.items() if k != eigen.KERNELS_ENV}
    if setting is not None:
        env[eigen.KERNELS_ENV] = setting
    code = "from ess_explorer.core import eigen; print(eigen.use_cuda_kernel)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(on)


@pytest.fixture
def fresh_choices(monkeypatch):
    """`eigen.kernel_or_torch` with nothing chosen yet in this process."""
    monkeypatch.setattr(eigen, "_choices", {})
    monkeypatch.setattr(eigen, "_timings", {})
    monkeypatch.setattr(eigen, "_kernel_failed_once", False)


def symmetric_batch(count: int, n: int) -> torch.Tensor:
    x = torch.randn(count, n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(count + n))
    return x + x.mT


def slowly(seconds: float, answer):
    """A route that takes ``seconds`` and answers ``answer``, counting its calls."""

    def route():
        route.calls += 1
        time.sleep(seconds)
        return answer

    route.calls = 0
    return route


def test_each_size_class_takes_the_route_its_first_large_batch_timed_faster(fresh_choices):
    """On its first batch of at least CALIBRATION_WORK in a size class, each route is run twice
    (warmed, then timed); the faster answers that batch and every later one of the class, the
    other is not run again; another class is timed on its own."""
    big = symmetric_batch(2, 400)  # 2 x 400^3 > CALIBRATION_WORK
    values = torch.linalg.eigvalsh(big)
    kernel, torch_route = slowly(0.0, values), slowly(0.05, values.clone())
    assert eigen.kernel_or_torch("t", big, kernel, torch_route, eigen._same_eigenvalues) is values
    assert (kernel.calls, torch_route.calls) == (2, 2)
    eigen.kernel_or_torch("t", big, kernel, torch_route, eigen._same_eigenvalues)
    assert (kernel.calls, torch_route.calls) == (3, 2)
    choice, kernel_seconds, torch_seconds = eigen.route_choices()[("t", 9)]  # n = 257 .. 512
    assert choice == "kernel" and kernel_seconds < torch_seconds

    slow, fast = slowly(0.05, values), slowly(0.0, values.clone())
    eigen.kernel_or_torch("t", symmetric_batch(4, 300), slow, fast, lambda *_: True)  # the same class
    assert slow.calls == 1 and fast.calls == 0
    other = symmetric_batch(2, 600)  # n = 513 .. 1024: a class of its own
    eigen.kernel_or_torch("t", other, slow, fast, lambda *_: True)
    assert eigen.route_choices()[("t", 10)][0] == "torch"
    assert (slow.calls, fast.calls) == (3, 2)


def test_batches_below_the_calibration_work_take_the_routes_default(fresh_choices):
    small = symmetric_batch(3, 16)  # 3 x 16^3: far below CALIBRATION_WORK
    kernel, torch_route = slowly(0.0, "kernel"), slowly(0.0, "torch")
    assert eigen.kernel_or_torch("s", small, kernel, torch_route, eigen._same_eigenvalues) == "kernel"
    assert (
        eigen.kernel_or_torch("s", small, kernel, torch_route, eigen._same_eigenvalues, kernel_first=False) == "torch"
    )
    assert eigen.route_choices() == {}


def test_a_kernel_that_disagrees_with_torch_is_dropped(fresh_choices):
    big = symmetric_batch(2, 400)
    values = torch.linalg.eigvalsh(big)
    wrong = values.clone()
    wrong[0, -1] *= 1 + 1e-9  # far outside two backward-stable solvers' 16 n eps
    kernel, torch_route = slowly(0.0, wrong), slowly(0.05, values)
    with pytest.warns(UserWarning, match="disagree"):
        assert eigen.kernel_or_torch("d", big, kernel, torch_route, eigen._same_eigenvalues) is values
    eigen.kernel_or_torch("d", big, kernel, torch_route, eigen._same_eigenvalues)
    assert kernel.calls == 2 and torch_route.calls == 3  # torch's from then on, although slower


def test_a_kernel_that_cannot_run_falls_back_to_torch_once(monkeypatch, fresh_choices):
    """A toolkit or driver numba-cuda cannot use: the call warns once and answers by torch's
    route, and no later batch is offered to a kernel."""

    def broken():
        raise RuntimeError("NVVM not found")

    monkeypatch.setattr(cuda_eigen_kernel, "available", lambda: True)
    x = symmetric_batch(5, 16)
    with pytest.warns(UserWarning, match="NVVM not found"):
        values = eigen.kernel_or_torch("f", x, broken, lambda: torch.linalg.eigvalsh(x), eigen._same_eigenvalues)
    assert torch.equal(values, torch.linalg.eigvalsh(x))
    assert not eigen.cuda_kernel_takes(on_gpu(5, 16, 16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n", [16, 32])
def test_cuda_kernel_equals_lapack_on_a_layer_sized_batch(n, fresh_choices):
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
    assert ((routed - reference).abs() <= bound).all()  # the kernel's or cuSOLVER's, as timed


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_gramian_kernel_equals_the_torch_route(monkeypatch):
    """The fused per-cut steps on the GPU against the torch route on the same GPU (cuSOLVER's
    Cholesky and eigensolver), on the Gramians of 64 Mamba-like units at 200 cuts: the same
    bounds and marks, each value within an eighth of its cut's bound."""
    if not cuda_eigen_kernel.available():
        pytest.skip("numba-cuda is not installed")
    from ess_explorer.core import gramian_naive

    g = torch.Generator().manual_seed(7)
    dt = torch.nn.functional.softplus(torch.randn(64, 201, 1, generator=g, dtype=torch.float64) - 2)
    a = torch.exp(-dt * torch.arange(1, 17, dtype=torch.float64))
    b = dt * torch.randn(64, 201, 16, generator=g, dtype=torch.float64)
    c = torch.randn(64, 201, 16, generator=g, dtype=torch.float64)
    p, q = (x.cuda() for x in gramian_naive.gramians(a, b, c, torch.arange(1, 201)))
    lam, error = cuda_eigen_kernel.gramian_cut_spectra(p, q, gramian_naive.CHOLESKY_SHIFT, gramian_naive.GRAMIAN_ERROR)
    monkeypatch.setattr(eigen, "use_cuda_kernel", False)
    reference_lam, reference_error = gramian_naive._sandwich_spectra(p, q)
    assert torch.equal(error.isinf(), reference_error.isinf())
    finite = error.isfinite()
    assert torch.allclose(error[finite], reference_error[finite], rtol=1e-12, atol=0)
    assert ((lam - reference_lam).abs()[finite] <= error[finite][:, None] / 8).all()


# numba's simulator runs the kernels as Python and checks no types: this compiles them for the
# GPU (to PTX for sm_90, numba's CUDA target and the toolkit's NVVM), where a CUDA toolkit is
# installed, with or without a GPU.
COMPILED = textwrap.dedent(
    """
    import json, sys, types
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda, float64, int32, int64

    # no driver here: a device function's compile asks the current device its compute capability
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
    from ess_explorer.core import cuda_block_kernel, cuda_eigen_kernel as kernels

    matrices, vectors, flags = float64[:, :, ::1], float64[:, ::1], int32[::1]
    out = {}
    for size in (16, kernels.MAX_SIZE):
        eigenvalues, gramian_cut = kernels._kernels(size)
        signature = (matrices, int64, vectors, flags)
        out[f"eigenvalues {size}"] = cuda.compile_ptx(eigenvalues.py_func, signature, cc=(9, 0))[0]
    signature = (matrices, matrices, float64, float64, vectors, float64[::1])
    out["gramian cuts 16"] = cuda.compile_ptx(gramian_cut.py_func, signature, cc=(9, 0))[0]
    signature = (matrices, vectors, flags)
    out["block"] = cuda.compile_ptx(cuda_block_kernel._block_kernel().py_func, signature, cc=(9, 0))[0]
    json.dump(out, sys.stdout)
    """
)


def cuda_toolkit() -> Path | None:
    """A CUDA toolkit with NVVM: $CUDA_HOME, else the newest under /usr/local."""
    candidates = [os.environ.get("CUDA_HOME"), *sorted(glob.glob("/usr/local/cuda*"), reverse=True)]
    for candidate in filter(None, candidates):
        if any(Path(candidate).glob("**/libnvvm.so*")):
            return Path(candidate)
    return None


@pytest.mark.skipif(cuda_toolkit() is None, reason="needs a CUDA toolkit (NVVM)")
def test_kernels_compile_for_the_gpu_without_spills(tmp_path):
    """Both kernels type-check and compile for the GPU (the simulator cannot tell: a builtin
    max() of floats ran there and failed here), and where ptxas is at hand their registers hold
    everything: no spill to local memory beyond the thread's own matrices."""
    toolkit = cuda_toolkit()
    env = {**os.environ, "CUDA_HOME": str(toolkit)}
    run = subprocess.run([sys.executable, "-c", COMPILED], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    compiled = json.loads(run.stdout)
    assert set(compiled) == {"eigenvalues 16", "eigenvalues 32", "gramian cuts 16", "block"}
    ptxas = next(iter(toolkit.glob("**/bin/ptxas")), None)
    for name, ptx in compiled.items():
        assert ".entry" in ptx and ".target sm_90" in ptx, name
        if ptxas is not None:
            source = tmp_path / f"{name.replace(' ', '_')}.ptx"
            source.write_text(ptx)
            report = subprocess.run(
                [str(ptxas), "-arch=sm_90", "-v", str(source), "-o", str(tmp_path / "out.cubin")],
                capture_output=True,
                text=True,
            )
            assert report.returncode == 0, report.stderr[-2000:]
            assert "0 bytes spill stores" in report.stderr, (name, report.stderr[-1000:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n", [33, 100, 300])
def test_cuda_block_kernel_equals_lapack(n, fresh_choices):
    """The block kernel on graded PSD Grams (attention's cut Grams are such), and the engine's
    `eigvalsh` whichever route it chose for them: within 4 n eps ||A|| of LAPACK's."""
    if not cuda_eigen_kernel.available():
        pytest.skip("numba-cuda is not installed")
    g = torch.Generator().manual_seed(n)
    q, _ = torch.linalg.qr(torch.randn(40, n, n, generator=g, dtype=torch.float64))
    lam = 10.0 ** (-20 * torch.rand(40, n, generator=g, dtype=torch.float64))
    matrices = (q * lam[:, None, :]) @ q.mT
    reference = torch.linalg.eigvalsh(matrices)
    bound = 4 * n * EPS * reference.abs().amax(-1, keepdim=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither a fallback nor a disagreement
        got = cuda_block_kernel.block_eigenvalues(matrices.cuda()).cpu()
        routed = eigen.eigvalsh(matrices.cuda()).cpu()
    assert ((got - reference).abs() <= bound).all()
    assert ((routed - reference).abs() <= bound).all()


def test_two_routes_cuts_agree_but_for_a_few_marked_apart():
    """The calibration's check of the Gramian-cut kernel (gramian_naive._same_cuts): a cut
    whose Cholesky fails in one rounding only may be marked in one route alone; values that
    differ by more than a quarter of their bound, or many cuts marked apart, do not agree."""
    from ess_explorer.core.gramian_naive import _same_cuts

    g = torch.Generator().manual_seed(0)
    lam = torch.rand(4, 500, 16, generator=g, dtype=torch.float64).sort(-1, descending=True).values
    error = torch.full((4, 500), 1e-6, dtype=torch.float64)
    assert _same_cuts((lam, error), (lam + 2e-7, error))
    marked = error.clone()
    marked[0, :2] = float("inf")
    assert _same_cuts((lam, marked), (lam, error))
    marked[0, :10] = float("inf")
    assert not _same_cuts((lam, marked), (lam, error))
    assert not _same_cuts((lam, error), (lam + 3e-7, error))
    assert not _same_cuts((lam, error), (lam, error * 1.01))
