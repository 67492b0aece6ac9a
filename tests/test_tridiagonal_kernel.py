"""The lane QL iteration (core/tridiagonal_kernel.py): its unmasked row against the masked
row's arithmetic, and whole QL runs against LAPACK where lanes finish at very different times."""

from __future__ import annotations

import numpy as np
import pytest

from ess_explorer.core import compiled
from ess_explorer.core.compiled import LANES

pytestmark = pytest.mark.skipif(not compiled.available(), reason="numba is not installed")


def masked_row(d, e, i, s, c, g, p, runs):
    """One row of the QL sweep as the masked loop writes it, every lane on (numpy, in place)."""
    f, b = s * e[i], c * e[i]
    r = np.sqrt(f * f + g * g)
    rotate = r > 0
    inv = 1.0 / np.where(rotate, r, 1.0)
    sn, cn = f * inv, g * inv
    gi = d[i + 1] - p
    r2 = (d[i] - gi) * sn + 2.0 * cn * b
    pn = sn * r2
    e[i + 1] = r
    d[i + 1] = np.where(rotate, gi + pn, gi)
    s[:], c[:] = np.where(rotate, sn, s), np.where(rotate, cn, c)
    g[:], p[:] = np.where(rotate, cn * r2 - b, g), np.where(rotate, pn, p)
    runs *= rotate


def test_the_unmasked_row_is_the_masked_rows_arithmetic_and_counts_the_lanes_it_stops():
    from ess_explorer.core.tridiagonal_kernel import _rotate_all

    rng = np.random.default_rng(0)
    n, i = 6, 2
    d, e = rng.standard_normal((n, LANES)), rng.standard_normal((n, LANES))
    s, c, g, p = (rng.uniform(0.1, 1.0, LANES) for _ in range(4))
    runs = np.ones(LANES)
    # lane 1 stops here (f = g = 0: r = 0); lane 2 is done (zero off-diagonals, g = p = 0)
    e[i, 1], g[1] = 0.0, 0.0
    e[:, 2], g[2], p[2], runs[2] = 0.0, 0.0, 0.0, 0.0
    expected = [x.copy() for x in (d, e, s, c, g, p, runs)]
    masked_row(expected[0], expected[1], i, *expected[2:])
    got = [x.copy() for x in (d, e, s, c, g, p, runs)]
    stopped = _rotate_all(got[0], got[1], i, *got[2:])

    assert stopped == 1
    np.testing.assert_array_equal(got[6], expected[6])  # runs: lane 1 stopped, lane 2 stays off
    assert (got[0][:, 2] == d[:, 2]).all() and (got[1][:, 2] == 0).all()  # the done lane is untouched
    assert got[0][i + 1, 1] == d[i + 1, 1] - p[1] and got[1][i + 1, 1] == 0.0  # the stopped lane: no rotation
    keep = np.ones(LANES, dtype=bool)
    keep[1:3] = False  # a stopped or done lane's rotation state is never read again
    # the kernel contracts a * b + c into one rounding (fastmath "contract"), numpy does not
    close = dict(rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(got[0], expected[0], **close)  # d
    np.testing.assert_allclose(got[1], expected[1], **close)  # e
    for k in range(2, 6):
        np.testing.assert_allclose(got[k][keep], expected[k][keep], **close)


@pytest.mark.parametrize("n", [16, 96])
def test_lanes_that_finish_early_leave_the_others_exact(n):
    """Diagonal-heavy lanes converge in a sweep or two and sit done through the others'
    sweeps, padded lanes are done from the start: every lane still matches LAPACK."""
    from ess_explorer.core.tridiagonal_kernel import _tridiagonal_eigenvalues

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
    d, e, failed = diag.copy(), off.copy(), np.zeros(LANES, dtype=np.bool_)
    _tridiagonal_eigenvalues(d, e, n, failed)
    assert not failed.any()
    for w in range(LANES):
        matrix = np.diag(diag[:, w]) + np.diag(off[:-1, w], 1) + np.diag(off[:-1, w], -1)
        exact = np.linalg.eigvalsh(matrix)
        np.testing.assert_allclose(np.sort(d[:, w]), exact, rtol=0, atol=1e-13 * np.abs(exact).max())
