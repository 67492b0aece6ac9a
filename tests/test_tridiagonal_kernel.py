"""The lane QL iteration (core/tridiagonal_kernel.py): its unmasked row against LAPACK's
dsterf row written in numpy, and whole QL runs against LAPACK where lanes finish at very
different times."""

from __future__ import annotations

import numpy as np
import pytest

from ess_explorer.core import compiled
from ess_explorer.core.compiled import LANES

pytestmark = pytest.mark.skipif(not compiled.available(), reason="numba is not installed")


def root_free_row(d, e2, i, s, c, gamma, p, sigma):
    """One row of the root-free QL sweep as LAPACK's dsterf writes it, every lane on (numpy,
    in place; e2 holds the squared off-diagonals)."""
    bb = e2[i].copy()
    r = p + bb
    e2[i + 1] = s * r
    old_c = c.copy()
    with np.errstate(invalid="ignore"):  # 0 / 0 in a done lane (r = 0), whose values are not read
        c[:] = p / r
        s[:] = bb / r
    old_gamma = gamma.copy()
    gamma[:] = c * (d[i] - sigma) - s * old_gamma
    d[i + 1] = old_gamma + (d[i] - gamma)
    p[:] = np.where(c != 0, gamma * gamma / np.where(c != 0, c, 1.0), old_c * bb)


def lane_matrix(diag: np.ndarray, off: np.ndarray, w: int) -> np.ndarray:
    """Lane w of the tridiagonals (diag, off) (n, LANES) as a full symmetric matrix."""
    return np.diag(diag[:, w]) + np.diag(off[:-1, w], 1) + np.diag(off[:-1, w], -1)


def lanes_against_lapack(diag: np.ndarray, off: np.ndarray) -> np.ndarray:
    """The lane QL on copies of the tridiagonals (diag, off) (n, LANES): asserts that no lane
    failed and that each lane's values lie within 1e-13 of its largest of LAPACK's
    (`eigvalsh` of the full matrix); returns the values (n, LANES), unsorted, as the kernel
    leaves them."""
    from ess_explorer.core.tridiagonal_kernel import _tridiagonal_eigenvalues

    n = diag.shape[0]
    d, e, failed = diag.copy(), off.copy(), np.zeros(LANES, dtype=np.bool_)
    _tridiagonal_eigenvalues(d, e, n, failed)
    assert not failed.any()
    for w in range(LANES):
        exact = np.linalg.eigvalsh(lane_matrix(diag, off, w))
        np.testing.assert_allclose(np.sort(d[:, w]), exact, rtol=0, atol=1e-13 * np.abs(exact).max() + 1e-300)
    return d


def test_the_unmasked_row_is_dsterfs_row_and_leaves_a_finished_lane_as_it_is():
    from ess_explorer.core.tridiagonal_kernel import _rotate_all

    rng = np.random.default_rng(0)
    n, i = 6, 2
    d, e2 = rng.standard_normal((n, LANES)), rng.uniform(0.1, 1.0, (n, LANES))
    s, c, gamma, p, sigma = (rng.uniform(0.1, 1.0, LANES) for _ in range(5))
    runs = np.ones(LANES)
    gamma[3] = 0.0  # lane 3 rotates with p = 0: c = 0, and p comes from the old c (dsterf's branch)
    p[3] = 0.0
    # lane 2 is done: zero off-diagonals, gamma = p = s = 0, runs 0
    e2[:, 2], gamma[2], p[2], s[2], runs[2] = 0.0, 0.0, 0.0, 0.0, 0.0
    expected = [x.copy() for x in (d, e2, s, c, gamma, p)]
    root_free_row(*expected[:2], i, *expected[2:], sigma)
    got = [x.copy() for x in (d, e2, s, c, gamma, p)]
    _rotate_all(got[0], got[1], i, *got[2:], sigma, runs)

    assert (got[0][:, 2] == d[:, 2]).all() and (got[1][:, 2] == 0).all()  # the done lane is untouched
    assert got[3][3] == 0.0 and got[5][3] == c[3] * e2[i, 3]  # p = 0: the c = 0 branch
    live = np.ones(LANES, dtype=bool)
    live[2] = False  # a done lane's rotation state is never read again
    # the kernel contracts a * b + c into one rounding (fastmath "contract") and divides by r
    # once (1 / r times p and bb), numpy does neither
    close = dict(rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(got[0][:, live], expected[0][:, live], **close)  # d
    np.testing.assert_allclose(got[1][:, live], expected[1][:, live], **close)  # e^2
    for k in range(2, 6):
        np.testing.assert_allclose(got[k][live], expected[k][live], **close)


@pytest.mark.parametrize("n", [16, 96])
def test_lanes_that_finish_early_leave_the_others_exact(n):
    """Diagonal-heavy lanes converge in a sweep or two and sit done through the others'
    sweeps, padded lanes are done from the start: every lane still matches LAPACK."""
    rng = np.random.default_rng(n)
    diag = rng.standard_normal((n, LANES))
    off = rng.standard_normal((n, LANES))
    off[:, ::3] *= 1e-9  # nearly diagonal: done early
    off[:, 1::7] = 0.0  # already diagonal
    size = np.full(LANES, n)
    size[5::11] = rng.integers(1, n, len(size[5::11]))  # shorter matrices, zero-padded
    for w in range(LANES):
        diag[size[w] :, w] = 0.0
        off[size[w] - 1 :, w] = 0.0
    lanes_against_lapack(diag, off)


@pytest.mark.parametrize("n", [16, 64])
def test_blocks_and_graded_lanes_match_lapack(n):
    """Lanes split into several blocks from the start (exact zeros inside, as a rank-deficient
    Gram's Householder form has them), and lanes graded over 30 orders of magnitude in either
    direction, whose off-diagonals become negligible inside a block during the sweeps: each
    block is found when the lane's top reaches it, and every value matches LAPACK to its
    own scale."""
    rng = np.random.default_rng(n + 1)
    diag = rng.uniform(0.1, 1.0, (n, LANES))
    off = rng.uniform(0.1, 1.0, (n, LANES))
    for w in range(0, LANES, 3):  # blocks: zeros at random rows
        off[rng.choice(n - 1, 3, replace=False), w] = 0.0
    grade = np.logspace(0, -30, n)[:, None]
    diag[:, 1::3] *= grade
    off[:, 1::3] *= grade
    diag[:, 2::3] *= grade[::-1]
    off[:, 2::3] *= grade[::-1]
    off[n - 1] = 0.0
    lanes_against_lapack(diag, off)
