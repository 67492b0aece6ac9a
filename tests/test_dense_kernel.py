"""The dense path's compiled kernel (core/dense_kernel.py) against its reference,
torch.linalg.eigvalsh, and the dense path with the kernel against the dense path without it.

The bound every eigenvalue must meet is the one the dense path's guard assumes of any
eigensolver (core/gram.py, GRAM_ERROR): GRAM_ERROR * n * eps * max |lambda|."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _contracts import assert_exact_contract
from test_precision import exact_spectra

from ess_explorer import entropy_ess, hankel_singular_values, tolerance_ess
from ess_explorer.core import dense_jobs, dense_kernel, spectra
from ess_explorer.core.gram import GRAM_ERROR
from ess_explorer.synthetic import trained_like_attention

pytestmark = pytest.mark.skipif(not dense_kernel.available(), reason="numba is not installed")
EPS = float(np.finfo(np.float64).eps)


@pytest.fixture(autouse=True)
def every_job_takes_the_kernel(monkeypatch):
    """The small operators here would take torch (`dense_jobs.takes`): this module tests the kernel."""
    monkeypatch.setattr(dense_jobs, "KERNEL_MIN_WORK", 0.0)


def test_only_a_job_of_kernel_min_work_takes_the_kernel(monkeypatch):
    heads = trained_like_attention(40, units=3, seed=0)
    taken, original = [], dense_jobs.cut_spectra
    monkeypatch.setattr(dense_jobs, "cut_spectra", lambda *args: taken.append(args) or original(*args))
    work = 3 * sum(dense_jobs.eigen_work(min(t, 40 - t)) for t in range(1, 40))  # every cut t >= 1 of 3 heads
    expected = hankel_singular_values(heads, precision="exact")
    for threshold, kernel in ((work + 1, False), (work, True)):
        taken.clear()
        monkeypatch.setattr(dense_jobs, "KERNEL_MIN_WORK", float(threshold))
        sigma = hankel_singular_values(heads, precision="exact")
        assert bool(taken) == kernel
        torch.testing.assert_close(sigma, expected, atol=2e-10 * float(expected.max()), rtol=0)
    assert not dense_jobs.takes(heads.to(torch.float32), range(40))  # float64 only
    monkeypatch.setattr(dense_kernel, "available", lambda: False)
    assert not dense_jobs.takes(heads, range(40))


def assert_within_the_bound(values: torch.Tensor, reference: torch.Tensor, n: int) -> None:
    scale = reference.abs().amax(-1, keepdim=True).clamp_min(1e-300)
    error = (values - reference).abs() / scale
    assert float(error.max()) <= GRAM_ERROR * max(n, 1) * EPS, f"worst error {float(error.max()):.2e} of max |lambda|"


def grams(count: int, n: int, seed: int, decay: float | None = None, rows: int | None = None) -> torch.Tensor:
    """Gram matrices H^T H of random (rows x n) H, columns scaled by exp(-k / decay)."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(count, rows or n + 3, n, generator=g, dtype=torch.float64)
    if decay is not None:
        h = h * torch.exp(-torch.arange(n, dtype=torch.float64) / decay)
    return h.mT @ h


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 31, 64, 130])
def test_eigenvalues_of_random_grams_match_lapack(n):
    matrices = grams(70, n, seed=n)  # 70: one full lane group and a part-filled one
    assert_within_the_bound(dense_kernel.symmetric_eigenvalues(matrices), torch.linalg.eigvalsh(matrices), n)


@pytest.mark.parametrize(
    "kind",
    ["graded", "rank-deficient", "identity", "zero", "indefinite", "zero-diagonal", "tiny", "huge", "sink"],
)
@pytest.mark.parametrize("n", [40, 101])  # panels of 4 reflectors, the last of 2; of 3, rows left over
def test_eigenvalues_of_hard_matrices_match_lapack(kind, n):
    if kind == "graded":  # eigenvalues from 1 down to 1e-200: all but the top few are rounding
        matrices = grams(4, n, seed=1, decay=n / 460)
    elif kind == "rank-deficient":  # H^T H of a wide H: rank 10 of n
        matrices = grams(4, n, seed=2, rows=10)
    elif kind == "identity":  # one eigenvalue, n times
        matrices = 3.0 * torch.eye(n, dtype=torch.float64).expand(4, n, n).clone()
    elif kind == "zero":
        matrices = torch.zeros(4, n, n, dtype=torch.float64)
    elif kind == "indefinite":
        matrices = torch.randn(4, n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
        matrices = matrices + matrices.mT
    elif kind == "zero-diagonal":  # the scale cannot come from the trace
        matrices = torch.randn(4, n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
        matrices = (matrices + matrices.mT) * (1 - torch.eye(n, dtype=torch.float64)) * 1e-20
    elif kind == "tiny":
        matrices = grams(4, n, seed=5) * 1e-280
    elif kind == "huge":
        matrices = grams(4, n, seed=6) * 1e280
    else:  # the Gram of an attention-sink head's cut: one value far above the rest
        head = trained_like_attention(2 * n, units=4, head_dim=8, seed=7, mix=("sink",))
        cut = head[:, n:, :n]
        matrices = cut.mT @ cut
    assert_within_the_bound(dense_kernel.symmetric_eigenvalues(matrices), torch.linalg.eigvalsh(matrices), n)


def test_leading_blocks_of_each_size_and_the_rest_zero():
    matrices = grams(6, 50, seed=8)
    sizes = np.array([50, 1, 0, 17, 33, 2])
    values = dense_kernel.symmetric_eigenvalues(matrices, sizes)
    for b, size in enumerate(sizes):
        if size:
            expected = torch.linalg.eigvalsh(matrices[b, :size, :size])
            assert_within_the_bound(values[b, :size], expected, size)
        assert bool((values[b, size:] == 0).all())


@pytest.mark.parametrize("n", [20, 70])  # 5 and 17 panels of reflectors
def test_only_the_upper_triangle_is_read(n):
    matrices = grams(3, n, seed=9)
    scrambled = matrices.triu() + torch.randn(3, n, n, dtype=torch.float64).tril(-1)
    np.testing.assert_array_equal(
        dense_kernel.symmetric_eigenvalues(scrambled).numpy(), dense_kernel.symmetric_eigenvalues(matrices).numpy()
    )


def test_the_lane_solver_is_exact_at_the_dense_paths_sizes():
    """The QL iteration shared with the Gramian kernel, on tridiagonals of every hard kind at
    n = 200 (it was built for n = 16)."""
    from test_precision import _hard_tridiagonals
    from test_tridiagonal_kernel import lanes_against_lapack

    lanes_against_lapack(*_hard_tridiagonals(dense_kernel.LANES, 200, seed=3))


def test_a_lane_that_does_not_converge_is_answered_by_lapack(monkeypatch):
    real = dense_kernel._lane_eigenvalues

    def gives_up_on_slot_2(diag, off, sizes, order, first, last, failed):
        real(diag, off, sizes, order, first, last, failed)
        diag[2] = np.nan  # what a lane left behind is not read
        failed[2] = True

    monkeypatch.setattr(dense_kernel, "_lane_eigenvalues", gives_up_on_slot_2)
    matrices = grams(5, 30, seed=10)
    assert_within_the_bound(dense_kernel.symmetric_eigenvalues(matrices), torch.linalg.eigvalsh(matrices), 30)
    # the dense path: the failed (unit, cut) gets an SVD of its cut
    heads = trained_like_attention(40, units=2, head_dim=8, seed=11, mix=("random",))
    sigma = hankel_singular_values(heads, precision="exact")
    reference = torch.stack([torch.linalg.svdvals(heads[:, t:, :t])[:, :1] for t in range(1, 40)], 1)
    np.testing.assert_allclose(sigma[:, 1:, :1].numpy(), reference.numpy(), rtol=1e-9)


def test_without_numba_the_reference_answers(monkeypatch):
    monkeypatch.setattr(dense_kernel, "available", lambda: False)
    matrices = grams(3, 12, seed=12)
    np.testing.assert_array_equal(
        dense_kernel.symmetric_eigenvalues(matrices).numpy(), torch.linalg.eigvalsh(matrices, UPLO="U").numpy()
    )


def test_cut_forms_are_the_forms_of_each_cuts_gram():
    """`cut_forms` builds each cut's Gram by rank-one updates; its eigenvalues are those of the
    Gram of the cut itself, on both sides of L / 2 and for cuts that skip positions."""
    length = 37
    op = trained_like_attention(length, units=1, head_dim=8, seed=13, mix=("random",))[0]
    for tall, cuts in ((True, [18, 15, 9, 2, 1]), (False, [19, 20, 27, 36])):
        forms = dense_kernel.TridiagonalForms.empty(len(cuts), (length + 1) // 2)
        dense_kernel.cut_forms(op.numpy(), np.array(cuts), np.arange(len(cuts)), tall, forms, np.zeros((19, 19)))
        values, failed = forms.eigenvalues()
        assert not bool(failed.any())
        for k, t in enumerate(cuts):
            cut = op[t:, :t]
            gram = cut.mT @ cut if tall else cut @ cut.mT
            size = gram.shape[-1]
            assert size == min(t, length - t)
            assert_within_the_bound(values[k, :size], torch.linalg.eigvalsh(gram), size)
            assert bool((values[k, size:] == 0).all())


@pytest.mark.parametrize("kind", ["sink", "sharp", "uniform", "random"])
def test_the_dense_path_gives_the_same_spectra_with_and_without_the_kernel(kind, monkeypatch):
    heads = trained_like_attention(90, units=3, head_dim=16, seed=14, mix=(kind,))
    positions = [0, 1, 2, 30, 44, 45, 46, 60, 88, 89]
    with_kernel = {p: hankel_singular_values(heads, precision=p, positions=positions) for p in ("exact", "ess")}
    monkeypatch.setattr(dense_kernel, "available", lambda: False)
    for precision, fast in with_kernel.items():
        torch_route = hankel_singular_values(heads, precision=precision, positions=positions)
        scale = torch_route[..., :1].clamp_min(1e-300)
        if precision == "exact":  # both within the exact contract of an SVD: 1e-10 sigma_1 apart at most
            assert float(((fast - torch_route).abs() / scale).max()) <= 2e-10
            # and each value within it: 1e-6 of itself + 1e-10 sigma_1 (the cuts whose Gram
            # values cannot promise that are redone by SVD, most of them for sinks)
            svd = exact_spectra(heads)[:, positions]
            assert_exact_contract(fast, svd)
        else:  # the same counts, entropy within the contract
            assert torch.equal(tolerance_ess(spectra=fast), tolerance_ess(spectra=torch_route))
            relative = (entropy_ess(spectra=fast) - entropy_ess(spectra=torch_route)).abs()
            assert float((relative / entropy_ess(spectra=torch_route).clamp_min(1e-300)).max()) <= 1e-5


def test_descending_roots_read_each_cuts_own_size():
    """Each (unit, cut)'s first size ascending eigenvalues, as singular values: descending,
    rounding below zero clamped, zero past the size whatever the solver left there."""
    values = torch.tensor(
        [[[-1e-20, 4.0, 9.0, 7.0], [0.25, 1.0, 4.0, 16.0]], [[1.0, 1.0, 1.0, 5.0], [0.0, 0.0, 0.0, 0.0]]]
    )
    sigma = dense_jobs.descending_roots(values.clone(), [3, 4])
    expected = torch.tensor(
        [[[3.0, 2.0, 0.0, 0.0], [4.0, 2.0, 1.0, 0.5]], [[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]]
    )
    assert torch.equal(sigma, expected)


def test_the_dense_budget_counts_the_kernels_forms():
    """The tridiagonal forms of every (unit, cut) are held until all are solved: each cut
    more costs its output row and two rows of L / 2 for its forms, per unit."""
    fewer, more = (spectra.dense_bytes(12, 512, cuts, 1, 8, copies=False) for cuts in (255, 511))
    assert more - fewer == 8 * 12 * 256 * (1 + 2 * 256)


class RecordingBar:
    """A stand-in for tqdm that adds up its updates (from any thread)."""

    def __init__(self, *args, total=None, **kwargs):
        import threading

        self.total, self.done, self.lock = total, 0.0, threading.Lock()

    def update(self, n=1):
        with self.lock:
            self.done += n

    def close(self):
        pass


def test_the_progress_bar_moves_with_the_kernels_calls_and_ends_full(monkeypatch):
    bars = []
    monkeypatch.setattr(spectra, "tqdm", lambda *a, **k: bars.append(RecordingBar(*a, **k)) or bars[-1])
    monkeypatch.setattr(dense_jobs, "CALL_WORK", 1.0)  # one cut per call
    seen = []
    real = dense_kernel.cut_forms

    def watching(*args, **kwargs):
        seen.append(bars[-1].done)  # what the bar showed when this call began
        return real(*args, **kwargs)

    monkeypatch.setattr(dense_kernel, "cut_forms", watching)
    heads = trained_like_attention(40, units=2, head_dim=8, seed=15, mix=("random",))
    hankel_singular_values(heads, positions=[0, 5, 5, 20, 39], progress=True)
    assert bars[-1].done == pytest.approx(5)  # every row of positions, the repeated cut twice
    assert len(set(seen)) > 2  # it moved while the kernel ran, not only at the end


def test_an_interrupt_stops_the_kernels_workers(monkeypatch):
    calls = []
    real = dense_kernel.cut_forms

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(dense_kernel, "cut_forms", interrupted)
    monkeypatch.setattr(dense_jobs, "CALL_WORK", 1.0)  # one cut per call: 4 units x 63 cuts
    heads = trained_like_attention(64, units=4, head_dim=8, seed=16, mix=("random",))
    with pytest.raises(KeyboardInterrupt):
        hankel_singular_values(heads)
    assert len(calls) <= 2 + torch.get_num_threads()  # each other worker finishes at most its current call


def test_a_gram_that_overflows_is_answered_by_the_svd_of_its_cut():
    """Entries near 1e200 are finite, their Grams are not: the dense path's kernel leaves
    those cuts to an SVD, which gives their (finite) values."""
    heads = trained_like_attention(30, units=1, head_dim=8, seed=17, mix=("random",)) * 1e200
    sigma = hankel_singular_values(heads, precision="exact", positions=[10, 20])
    for row, t in enumerate([10, 20]):
        expected = torch.linalg.svdvals(heads[0, t:, :t])
        np.testing.assert_allclose(sigma[0, row, : len(expected)].numpy(), expected.numpy(), rtol=1e-12)


def test_a_long_prompts_cuts_go_in_groups_within_the_forms_budget(monkeypatch):
    heads = trained_like_attention(60, units=2, head_dim=8, seed=18, mix=("random",))
    whole = hankel_singular_values(heads, precision="exact")
    monkeypatch.setattr(dense_jobs, "FORMS_BUDGET_BYTES", 7 * 16 * 2 * 30)  # 7 cuts of 2 units at a time
    assert dense_jobs.forms_group(2, 60) == 7
    grouped = hankel_singular_values(heads, precision="exact")
    scale = whole[..., :1].clamp_min(1e-300)
    assert float(((grouped - whole).abs() / scale).max()) <= 1e-12  # each group's Grams start afresh
    # and the budget check counts one group's forms, not every cut's
    assert spectra.dense_bytes(2, 60, 59, 1, 8, False) - spectra.dense_bytes(2, 60, 58, 1, 8, False) == 8 * 2


def test_eigvalsh_sends_cpu_float64_batches_of_16_or_more_to_the_kernel(monkeypatch):
    from ess_explorer.core import eigen

    calls = []
    real = dense_kernel.symmetric_eigenvalues
    monkeypatch.setattr(
        dense_kernel, "symmetric_eigenvalues", lambda m, *a, **k: calls.append(m.shape) or real(m, *a, **k)
    )
    batch = grams(16, 24, seed=19)
    values = eigen.eigvalsh(batch.reshape(4, 4, 24, 24))
    assert calls == [(16, 24, 24)] and values.shape == (4, 4, 24)
    assert_within_the_bound(values.reshape(16, 24), torch.linalg.eigvalsh(batch), 24)
    for torch_answers in (grams(15, 24, seed=20), grams(16, 23, seed=21), grams(16, 24, seed=22).float()):
        eigen.eigvalsh(torch_answers)  # too few, too small, not float64
    assert len(calls) == 1


def test_strided_operators_give_the_same_spectra():
    """A transposed or expanded view is read as its values, not its memory."""
    heads = trained_like_attention(32, units=1, head_dim=8, seed=23, mix=("random",))
    expanded = heads.expand(3, 32, 32)  # stride 0 over the batch
    np.testing.assert_array_equal(
        hankel_singular_values(expanded, precision="ess")[1].numpy(),
        hankel_singular_values(heads, precision="ess")[0].numpy(),
    )
    matrices = grams(20, 30, seed=24)
    matrices = (matrices + matrices.mT) / 2  # symmetric to the bit: its transpose has the same values
    np.testing.assert_array_equal(
        dense_kernel.symmetric_eigenvalues(matrices.mT).numpy(), dense_kernel.symmetric_eigenvalues(matrices).numpy()
    )
