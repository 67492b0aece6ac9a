"""The row-scaled channels' compiled kernel (core/channel_kernel.py) against its torch reference.

The bound every eigenvalue must meet is the one the row-scaled path's guard assumes of any
eigensolver (core/gram.py, GRAM_ERROR): GRAM_ERROR * r * eps * lambda_1 of its own Gram."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ess_explorer.core import channel_kernel
from ess_explorer.core.gram import GRAM_ERROR

pytestmark = pytest.mark.skipif(not channel_kernel.available(), reason="numba is not installed")
EPS = float(np.finfo(np.float64).eps)


def factor_and_gates(rows: int, width: int, units: int, seed: int, decades: float = 12.0):
    """A head's factor U_r S_r (orthonormal columns times values falling over ``decades``
    decades, as a recurrence's cuts do) and per-channel gates in (0, 1], a few of them zero."""
    g = torch.Generator().manual_seed(seed)
    left, _ = torch.linalg.qr(torch.randn(rows, max(width, rows), generator=g, dtype=torch.float64))
    values = torch.logspace(0, -decades, width, dtype=torch.float64)
    base = (
        torch.randn(rows, width, generator=g, dtype=torch.float64) * values
        if rows < width
        else left[:, :width] * values
    )
    gate = torch.rand(units, rows, generator=g, dtype=torch.float64)
    gate[:, ::7] = 0.0  # a channel's gate closed on some rows
    return base, gate


@pytest.mark.parametrize(
    "rows, width, units",
    [
        (128, 1, 64),
        (128, 3, 1),
        (128, 16, 63),
        (200, 24, 65),
        (40, channel_kernel.MAX_SIZE, 130),
        (6, 20, 64),
        (5, 5, 3),
    ],
)
def test_the_kernel_is_within_the_bound_of_the_reference(rows, width, units):
    """Any factor width up to MAX_SIZE, fewer rows than columns (rank < r: the kernel keeps
    min(m, r) values), channel counts that leave lanes empty or span several lane groups."""
    base, gate = factor_and_gates(rows, width, units, seed=rows + width)
    got = channel_kernel.gram_eigenvalues(base, gate)
    expected = channel_kernel.reference(base, gate)
    assert got.shape == expected.shape == (units, min(rows, width))
    assert (got[:, :-1] >= got[:, 1:]).all() and (got >= 0).all()  # descending, clamped at 0
    scale = expected[:, :1].clamp_min(1e-300)
    worst = float(((got - expected).abs() / scale).max())
    assert worst <= GRAM_ERROR * width * EPS, f"worst error {worst:.2e} of lambda_1"


def test_the_reference_is_each_channels_own_eigvalsh():
    base, gate = factor_and_gates(30, 8, 5, seed=1)
    for unit in range(5):
        own = torch.linalg.eigvalsh(base.T @ torch.diag(gate[unit] ** 2) @ base).flip(-1).clamp_min(0)
        torch.testing.assert_close(channel_kernel.reference(base, gate)[unit], own, rtol=0, atol=1e-14)
    wide = torch.randn(4, 9, dtype=torch.float64)  # r > m: the m x m Gram, the same nonzero values
    own = torch.linalg.svdvals(gate[:2, :4, None] * wide) ** 2
    torch.testing.assert_close(channel_kernel.reference(wide, gate[:2, :4]), own, rtol=1e-12, atol=1e-14)


def test_wider_factors_and_a_job_too_small_for_a_compile_take_the_reference(monkeypatch):
    calls = []
    original = channel_kernel._grams_and_eigenvalues
    monkeypatch.setattr(channel_kernel, "_grams_and_eigenvalues", lambda *a: calls.append(1) or original(*a))
    base, gate = factor_and_gates(64, channel_kernel.MAX_SIZE + 1, 8, seed=2)
    channel_kernel.gram_eigenvalues(base, gate)
    channel_kernel.gram_eigenvalues(base[:, :10], gate, allow_kernel=False)
    channel_kernel.gram_eigenvalues(base[:, :10].float(), gate.float())  # float64 only
    assert calls == []
    channel_kernel.gram_eigenvalues(base[:, :10], gate)
    assert calls == [1]


def test_a_lane_whose_iteration_fails_is_recomputed_by_the_reference(monkeypatch):
    original = channel_kernel._grams_and_eigenvalues

    def failing(*args):
        original(*args)
        out, failed = args[-2:]
        out[2] = np.nan
        failed[2] = True

    monkeypatch.setattr(channel_kernel, "_grams_and_eigenvalues", failing)
    base, gate = factor_and_gates(50, 12, 6, seed=3)
    got = channel_kernel.gram_eigenvalues(base, gate)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[2], channel_kernel.reference(base, gate[2:3])[0], rtol=0, atol=0)


def test_an_overflowed_gram_is_not_answered_with_zeros():
    """A gate of 1e160 overflows its channel's Gram: the kernel hands that lane to the
    reference, which refuses it as torch does (the eigensolver would clamp a NaN lane's values
    to zeros, were it to converge)."""
    base, gate = factor_and_gates(20, 6, 3, seed=4)
    gate[1, 4] = 1e160
    with pytest.raises(torch.linalg.LinAlgError):
        channel_kernel.reference(base, gate)
    with pytest.raises(torch.linalg.LinAlgError):
        channel_kernel.gram_eigenvalues(base, gate)


def test_one_call_takes_every_owner_each_with_its_own_factor():
    """`ChannelLanes`: owners of different widths (one wider than the kernel takes, so the
    reference answers it) and unit counts (one spanning two lane blocks), their units
    interleaved, in one call: each unit as `reference` of its own owner's factor gives it,
    zero past its owner's width; a unit of an owner left out stays zero."""
    rows = 70
    owner_of = torch.tensor([0, 1, 2, 0, 3] * 14 + [1] * 60)  # owner 1: 74 units, two blocks
    widths = {0: 5, 1: 30, 2: channel_kernel.MAX_SIZE + 3, 3: 12}
    bases = {o: factor_and_gates(rows, w, 1, seed=10 + o)[0] for o, w in widths.items()}
    _, gate = factor_and_gates(rows, 1, len(owner_of), seed=9)
    lanes = channel_kernel.ChannelLanes(owner_of, torch.cat([torch.ones(len(owner_of), 3), gate], 1))
    got, left_out = lanes.eigenvalues({o: bases[o] for o in (0, 1, 2)}, 3)  # rows 3: of the gates
    assert left_out == {0: (0, 0.0), 1: (0, 0.0), 2: (0, 0.0)}  # no trim: every row kept
    assert got.shape == (len(owner_of), widths[2])
    for owner in (0, 1, 2):
        units = (owner_of == owner).nonzero().flatten()
        expected = channel_kernel.reference(bases[owner], gate[units])
        scale = expected[:, :1].clamp_min(1e-300)
        assert float(((got[units, : widths[owner]] - expected).abs() / scale).max()) <= GRAM_ERROR * 64 * EPS
        assert (got[units, widths[owner] :] == 0).all()
    assert (got[owner_of == 3] == 0).all()


def decaying_rows_base(rows: int, width: int, seed: int, per_row: float) -> torch.Tensor:
    """A factor whose row i has norm about 10^(-per_row i): a fast head's future outputs."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(0, -per_row * (rows - 1), rows, dtype=torch.float64)
    return torch.randn(rows, width, generator=g, dtype=torch.float64) * scale[:, None]


def test_decayed_rows_leaves_out_the_trailing_rows_within_the_trim():
    """`decayed_rows` against a row-by-row count: the longest run of last rows whose Frobenius
    norm together is within trim x the largest column's norm; at least one row stays."""
    base = decaying_rows_base(120, 7, seed=20, per_row=0.25)
    for trim in (1e-3, 1e-11, 1e-20):
        limit = trim * float(base.norm(dim=0).max())
        left = 0
        while left < len(base) - 1 and float(base[len(base) - left - 1 :].norm()) <= limit:
            left += 1
        kept, norm = channel_kernel.decayed_rows(base, trim)
        assert kept == len(base) - left and 0 < left < len(base) - 1  # rows left out, not all
        assert norm == pytest.approx(float(base[kept:].norm()), rel=1e-12)
    assert channel_kernel.decayed_rows(base, 1e6) == (1, pytest.approx(float(base[1:].norm()), rel=1e-12))
    assert channel_kernel.decayed_rows(base, 0.0) == (len(base), 0.0)


def test_the_kernel_leaves_out_the_rows_decayed_rows_gives_and_solves_the_rest():
    """With a trim, each owner's factor loses the rows `decayed_rows` leaves out (the kernel's
    own count of them, in numba), and its channels get the reference's values of the rows
    kept; without one (or where the trim leaves nothing out) every row is used."""
    owner_of = torch.tensor([0] * 5 + [1] * 70 + [2] * 3)
    bases = {
        0: decaying_rows_base(90, 4, seed=21, per_row=0.3),
        1: decaying_rows_base(90, 30, seed=22, per_row=0.2),
        2: factor_and_gates(90, 6, 1, seed=23)[0],  # orthonormal columns: no row negligible
    }
    _, gate = factor_and_gates(90, 1, len(owner_of), seed=24)
    gate[:, 50:] *= 1e12  # so that the rows left out weigh in the channels' Grams of all rows
    lanes = channel_kernel.ChannelLanes(owner_of, gate)
    trim = 1e-9
    got, left_out = lanes.eigenvalues(bases, 0, trim=trim)
    for owner, base in bases.items():
        kept, norm = channel_kernel.decayed_rows(base, trim)
        assert left_out[owner][0] == len(base) - kept and left_out[owner][1] == pytest.approx(norm, rel=1e-10)
        units = (owner_of == owner).nonzero().flatten()
        expected = channel_kernel.reference(base[:kept], gate[units, :kept])
        scale = expected[:, :1].clamp_min(1e-300)
        width = base.shape[-1]
        assert float(((got[units, :width] - expected).abs() / scale).max()) <= GRAM_ERROR * width * EPS
        if kept < len(base):  # so the test can fail: all rows would give other values
            every_row = channel_kernel.reference(base, gate[units])
            assert float(((every_row - expected).abs() / scale).max()) > 1e3 * GRAM_ERROR * width * EPS
    assert left_out[0][0] > 40 and left_out[1][0] > 10 and left_out[2][0] == 0


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_factor_that_is_not_finite_keeps_every_row_and_is_refused(bad):
    """No row of an overflowed factor is left out as decayed (its norm is not a number to
    charge): the kernel's count and the torch one keep them all, and the solver refuses the
    Grams as torch would, rather than answer from the rows before the overflow."""
    base = decaying_rows_base(40, 5, seed=25, per_row=0.3)
    base[30, 2] = bad  # a row the trim would leave out
    assert channel_kernel.decayed_rows(base, 1e-9) == (40, 0.0)
    lanes = channel_kernel.ChannelLanes(torch.zeros(3, dtype=torch.long), torch.ones(3, 40, dtype=torch.float64))
    with pytest.raises(torch.linalg.LinAlgError):
        lanes.eigenvalues({0: base}, 0, trim=1e-9)
