"""The two accuracy contracts (core/precision.py) against an SVD of every cut.

"ess": tolerance-ESS identical except where a singular value lies within 1e-6 (relative) of
tau; entropy-ESS and causal ESS within 1e-5 (relative). "exact": every value within
1e-6 sigma_k + 1e-10 sigma_1. Checked on the operators that stress each route: trained-like
attention (sinks, sharp and near-uniform heads), decays within 1e-6 of 0 and 1, realisations
whose Gramians are imbalanced by 1e8 (the guard must fall back), and spectra placed just
above and below tau.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _contracts import assert_exact_contract

from ess_explorer import DiagonalSSM, causal_ess, entropy_ess, hankel_singular_values, tolerance_ess
from ess_explorer.core import gramian, gramian_kernel, tridiagonal_kernel
from ess_explorer.core.gramian_naive import gramian_spectra_reference
from ess_explorer.core.layer import layer_arrays
from ess_explorer.core.precision import TAU_BAND, Accuracy, check_precision, zero_subnormal_cuts
from ess_explorer.core.row_scaled import row_scaled_hankel_singular_values
from ess_explorer.core.sturm import TridiagonalSpectra
from ess_explorer.core.units import SSMCapture
from ess_explorer.synthetic import diagonal_ssm, softmax_attention, trained_like_attention

TOL = 1e-3


def exact_spectra(dense: torch.Tensor) -> torch.Tensor:
    """The oracle: one numpy SVD per cut of each (L, L) operator, (U, L, L // 2)."""
    units, length, _ = dense.shape
    out = np.zeros((units, length, length // 2))
    for u in range(units):
        for t in range(1, length):
            values = np.linalg.svd(dense[u, t:, :t].numpy(), compute_uv=False)
            out[u, t, : len(values)] = values[: length // 2]
    return torch.from_numpy(out)


def reachability_exact(ssm: DiagonalSSM) -> torch.Tensor:
    """The oracle of causal ESS: numpy SVDs of R_t = [a_{t-1} R_{t-1} | b_{t-1}] (core/causal.py),
    built column by column, (U, L, N); row t = 0 zeros."""
    a, b = ssm.a.numpy(), ssm.b.numpy()
    units, length, state = a.shape
    out, reach = np.zeros((units, length, state)), np.zeros((units, state, 0))
    for t in range(1, length):
        reach = np.concatenate([a[:, t - 1, :, None] * reach, b[:, t - 1, :, None]], axis=-1)
        values = np.linalg.svd(reach, compute_uv=False)
        out[:, t, : values.shape[-1]] = values
    return torch.from_numpy(out)


def assert_ess_contract(fast: torch.Tensor, exact: torch.Tensor, tol: float = TOL) -> None:
    """The "ess" contract of ``fast`` spectra against ``exact`` ones (both (U, P, K))."""
    width = min(fast.shape[-1], exact.shape[-1])
    fast, exact = fast[..., :width], exact[..., :width]
    counted, expected = (tolerance_ess(spectra=x, tol=tol) for x in (fast, exact))
    tau = tol * exact[..., :1]
    near = ((exact - tau).abs() <= TAU_BAND * tau).any(-1)  # the only cuts allowed to differ
    assert bool(((counted == expected) | near).all()), f"{int(((counted != expected) & ~near).sum())} miscounts"
    entropy, reference = entropy_ess(spectra=fast), entropy_ess(spectra=exact)
    relative = (entropy - reference).abs() / reference.clamp_min(1e-300)
    assert float(relative.max()) <= 1e-5


def mamba_like(units: int, length: int, state: int, seed: int = 0, dt_shift: float = -4.0) -> DiagonalSSM:
    g = torch.Generator().manual_seed(seed)
    dt = torch.nn.functional.softplus(torch.randn(units, length, 1, generator=g, dtype=torch.float64) + dt_shift)
    rates = torch.arange(1, state + 1, dtype=torch.float64)
    b = torch.randn(units, length, state, generator=g, dtype=torch.float64)
    c = torch.randn(units, length, state, generator=g, dtype=torch.float64)
    return DiagonalSSM(torch.exp(-dt * rates), dt * b, c)


def decays_at(value: float, units: int = 3, length: int = 40, state: int = 6, seed: int = 1) -> DiagonalSSM:
    """Decays within 1e-6 of ``value`` (0: a reset at every step; 1: nothing forgets)."""
    g = torch.Generator().manual_seed(seed)
    jitter = 1e-6 * torch.rand(units, length, state, generator=g, dtype=torch.float64)
    a = value + jitter if value == 0 else value - jitter
    b, c = (torch.randn(units, length, state, generator=g, dtype=torch.float64) for _ in range(2))
    return DiagonalSSM(a, b, c)


def cancelling(units: int = 2, length: int = 48, scale: float = 1e4, seed: int = 2) -> DiagonalSSM:
    """Two modes with nearly equal decays written alike and read with opposite signs, scaled
    by 1e4: ||P|| ||Q|| is 1e8 times sigma_1^2, an imbalance no diagonal balance removes."""
    g = torch.Generator().manual_seed(seed)
    a = torch.empty(units, length, 4, dtype=torch.float64)
    a[..., 0], a[..., 1] = 0.9, 0.9 + 1e-6
    a[..., 2:] = 0.5 + 0.4 * torch.rand(units, length, 2, generator=g, dtype=torch.float64)
    b = torch.randn(units, length, 4, generator=g, dtype=torch.float64)
    b[..., 1] = b[..., 0]
    c = torch.randn(units, length, 4, generator=g, dtype=torch.float64)
    c[..., 0], c[..., 1] = scale * c[..., 0], -scale * c[..., 0]
    return DiagonalSSM(a, b, c)


# ---- the contracts on the routes ---------------------------------------------------------


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("kind", ["sink", "sharp", "uniform", "random"])
def test_dense_ess_contract_on_trained_like_heads(kind, batched):
    heads = trained_like_attention(96, units=2, head_dim=16, seed=3, mix=(kind,))
    exact = exact_spectra(heads)
    fast = hankel_singular_values(heads, precision="ess", batched=batched)
    assert_ess_contract(fast, exact)
    # the fast values are within the contract's resolution of the exact ones
    assert bool(((fast - exact).abs() <= Accuracy("ess").resolution * exact[..., :1] + 1e-15).all())


@pytest.mark.parametrize("batched", [False, True])
def test_dense_exact_contract_on_sink_heads(batched):
    heads = trained_like_attention(64, units=2, head_dim=16, seed=4, mix=("sink",))
    exact = exact_spectra(heads)
    sigma = hankel_singular_values(heads, precision="exact", batched=batched)
    assert_exact_contract(sigma, exact)


def entropy_error_against_svd(dense: torch.Tensor, positions: list[int], batched: bool = False, ssm=None) -> float:
    """The largest relative error of entropy-ESS under "ess" at ``positions`` of (U, L, L) (or
    of ``ssm``, whose materialised operator is ``dense``), against numpy SVDs of those cuts."""
    fast = entropy_ess(dense if ssm is None else ssm, precision="ess", positions=positions, batched=batched)
    errors = []
    for column, t in enumerate(positions):
        exact = torch.from_numpy(np.linalg.svd(dense[:, t:, :t].numpy(), compute_uv=False))[:, None]
        reference = entropy_ess(spectra=exact)[:, 0]
        errors.append(float(((fast[:, column] - reference).abs() / reference).max()))
    return max(errors)


def planted_tail(length: int = 1024, level: float = 1e-11) -> torch.Tensor:
    """(1, L, L) whose cut at L / 2 has one singular value 1 and L / 2 - 1 values at ``level``."""
    g = torch.Generator().manual_seed(0)
    half = length // 2
    u, _ = torch.linalg.qr(torch.randn(half, half, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(half, half, generator=g, dtype=torch.float64))
    values = torch.full((half,), level, dtype=torch.float64)
    values[0] = 1.0
    dense = torch.zeros(1, length, length, dtype=torch.float64)
    dense[0, half:, :half] = u @ torch.diag(values) @ v.T
    return dense


@pytest.mark.parametrize("batched", [False, True])
def test_entropy_holds_on_heads_with_all_their_weight_on_token_0(batched):
    # a sink logit of +30 leaves ~1e-13 to every other token: each wide cut's Gram H H^T is
    # near rank 1 with equal entries, whose eigenvalues' rounding puts values of 1e-9 to 2e-8
    # sigma_1 where the true ones are ~1e-13 (entropy-ESS 1.1e-5 off before the noise band's
    # guard, core/gram.py)
    heads = softmax_attention(1024, head_dim=64, units=2, seed=1, sink=30.0)
    assert entropy_error_against_svd(heads, [520, 640, 768, 896, 1000], batched) <= 1e-5


def test_a_cut_whose_unresolved_values_carry_entropy_is_redone(monkeypatch):
    from ess_explorer.core import precision

    dense = planted_tail()
    assert entropy_error_against_svd(dense, [512]) <= 1e-5
    monkeypatch.setattr(precision, "NOISE_ENTROPY", float("inf"))  # without the guard: past the contract
    assert entropy_error_against_svd(dense, [512]) > 1e-5


def rank_one_writes(units: int = 2, length: int = 160, state: int = 64, seed: int = 0) -> DiagonalSSM:
    """Scalar decays (a Mamba2 head) whose inputs are all written along one direction of the
    state (b_t = x_t d, plus 1e-13 noise): every cut has one singular value and the rest near
    1e-13 sigma_1, below what the Gramians' Cholesky shift lets the route resolve."""
    g = torch.Generator().manual_seed(seed)
    a = torch.exp(-0.05 * torch.rand(units, length, 1, generator=g, dtype=torch.float64)).expand(-1, -1, state)
    direction = torch.randn(units, 1, state, generator=g, dtype=torch.float64)
    b = direction * torch.randn(units, length, 1, generator=g, dtype=torch.float64)
    b = b + 1e-13 * torch.randn(units, length, state, generator=g, dtype=torch.float64)
    return DiagonalSSM(a, b, torch.randn(units, length, state, generator=g, dtype=torch.float64))


def test_the_gramian_route_redoes_a_cut_whose_unresolved_values_carry_entropy(monkeypatch):
    from ess_explorer.core import precision

    ssm = rank_one_writes()
    dense, positions = ssm.materialize(), list(range(8, 160, 8))
    assert entropy_error_against_svd(dense, positions, ssm=ssm) <= 1e-5
    monkeypatch.setattr(precision, "NOISE_ENTROPY", float("inf"))
    assert entropy_error_against_svd(dense, positions, ssm=ssm) > 1e-5


@pytest.mark.parametrize("route", ["reference", "kernel"])
def test_unresolved_entropy_is_what_the_values_within_the_error_contribute(route):
    from ess_explorer.core import entropy_kernel, precision

    if route == "kernel" and not entropy_kernel.available():
        pytest.skip("numba is not installed: the reference runs instead")
    function = precision.unresolved_entropy_reference if route == "reference" else entropy_kernel.unresolved_entropy
    sigma = torch.tensor([[1.0, 0.5, 1e-9, 1e-9, 0.0], [0.0] * 5], dtype=torch.float64)
    p = 1e-9 / (1.5 + 2e-9)
    got = function(sigma.square(), torch.tensor([1e-16, 1e-16], dtype=torch.float64))
    assert torch.allclose(got, torch.tensor([-2 * p * np.log(p), 0.0], dtype=torch.float64), rtol=1e-12, atol=0)
    assert float(function(sigma.square(), torch.tensor([1e-20, 1e-20], dtype=torch.float64)).abs().max()) == 0.0


def test_the_unresolved_entropy_kernel_equals_its_reference():
    """core/entropy_kernel.py against the reference on a layer-sized job (the size
    `unresolved_entropy` sends to it): graded spectra whose tails fall below the error or not,
    zeros past a rank, negative rounding, a NaN in a cut that can hold entropy and in one that
    cannot, and an error given per cut."""
    from ess_explorer.core import entropy_kernel, precision

    if not entropy_kernel.available():
        pytest.skip("numba is not installed: the reference runs instead")
    generator = torch.Generator().manual_seed(3)
    units, cuts, k = 48, 200, 16
    sigma = torch.rand(units, cuts, 1, dtype=torch.float64, generator=generator) * torch.logspace(
        0, -12, k, dtype=torch.float64
    ) ** torch.rand(units, cuts, 1, dtype=torch.float64, generator=generator)
    squares = sigma.square()
    squares[:, ::7, 10:] = 0.0  # rank 10
    squares[:, ::11, -1] = -1e-30  # rounding below zero
    squares[0, 0, 3] = float("nan")  # can hold entropy: its smallest square is within the error
    squares[0, 1, 3], squares[0, 1, -1] = float("nan"), 1.0  # cannot: its last square is above it
    error = 10.0 ** (-24 * torch.rand(units, cuts, dtype=torch.float64, generator=generator))
    assert entropy_kernel.applies(squares) and squares.numel() >= entropy_kernel.KERNEL_MIN_VALUES
    got = precision.unresolved_entropy(squares, error)
    want = precision.unresolved_entropy_reference(squares, error)
    assert bool(torch.isnan(got[0, 0])) and bool(torch.isnan(want[0, 0])) and float(got[0, 1]) == float(want[0, 1]) == 0
    got[0, :2], want[0, :2] = 0.0, 0.0
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-300)
    assert 0.2 < float((want > 0).double().mean()) < 0.9  # not vacuous: many cuts carry some, many none


@pytest.mark.parametrize(
    "ssm",
    [
        mamba_like(5, 80, 16),
        mamba_like(3, 60, 8, dt_shift=0.0),  # fast decays
        mamba_like(3, 60, 8, dt_shift=-7.0),  # broad (slow) decays
        decays_at(0.0),
        decays_at(1.0),
    ],
    ids=["mamba", "fast-decays", "slow-decays", "decays-near-0", "decays-near-1"],
)
def test_diagonal_ess_contract(ssm):
    exact = exact_spectra(ssm.materialize())
    fast, reach = gramian.gramian_hankel_singular_values(
        ssm, positions=torch.arange(ssm.length), accuracy=Accuracy("ess"), causal=True
    )
    assert_ess_contract(fast, exact)
    _, exact_reach = hankel_singular_values_with_reach(ssm)
    counted, expected = (tolerance_ess(spectra=x, tol=TOL) for x in (reach, exact_reach))
    np.testing.assert_array_equal(counted.numpy(), expected.numpy())  # causal ESS


def hankel_singular_values_with_reach(ssm):
    from ess_explorer.core.sweeps import factored_hankel_singular_values

    return factored_hankel_singular_values(ssm, positions=torch.arange(ssm.length), method="sweep", causal=True)


def test_an_imbalanced_realisation_falls_back_to_the_exact_route(monkeypatch):
    ssm = cancelling()
    positions = torch.arange(ssm.length)
    lam, error, _ = gramian_spectra_reference(ssm.a, ssm.b, ssm.c, positions[1:])
    uncertain = ~Accuracy("ess").certain(lam[..., 0], error, lam)
    assert bool(uncertain.any())  # the guard sees the imbalance ...
    calls = []
    real = gramian._exact_cuts
    monkeypatch.setattr(gramian, "_exact_cuts", lambda *a: calls.append(len(a[3])) or real(*a))
    fast = gramian.gramian_hankel_singular_values(ssm, positions=positions, accuracy=Accuracy("ess"))
    assert sum(calls) == int(uncertain.sum())  # ... and exactly those cuts are redone
    assert_ess_contract(fast, exact_spectra(ssm.materialize()))


def test_exact_cuts_equal_the_sweep():
    """The redo's one-segment roots (gramian._exact_cuts) against the square-root sweep, at
    cuts before, at and after exact resets (decay 0), and at both ends."""
    ssm = diagonal_ssm(40, 6, units=3, seed=1, resets=[10, 25])
    times = torch.tensor([1, 5, 10, 11, 20, 26, 39])
    units = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    sigma, reach = gramian._exact_cuts(ssm.a, ssm.b, ssm.c, units, times)
    expected, expected_reach = hankel_singular_values_with_reach(ssm)
    expected, expected_reach = expected[units, times][:, :6], expected_reach[units, times]
    scale = expected[:, :1].clamp_min(1e-300)
    assert bool(((sigma - expected).abs() <= 1e-6 * expected + 1e-10 * scale).all())
    assert_exact_contract(reach, expected_reach)


@pytest.mark.parametrize(
    "length, n, pairs, units",
    # many cuts of a unit, repeated pairs among them; L < N; N = 1; units in three blocks of lanes
    [(96, 16, 150, 9), (7, 16, 70, 9), (33, 1, 5, 9), (40, 3, 300, 150)],
)
def test_the_cut_roots_kernel_equals_its_reference(length, n, pairs, units):
    """core/cut_roots_kernel.py against its torch reference: decays within 1e-7 of 0 and 1 and
    zero (resets), a mode written 1e4 times louder and read 1e4 times softer, cuts at both ends;
    every singular value of R_G R_F^T, of R_F and of R_G within the "exact" contract of the
    reference's. Each unit's sweep serves all of its pairs, so a pair is read mid-sweep."""
    from ess_explorer.core import cut_roots_kernel
    from ess_explorer.core.compiled import available

    if not available():
        pytest.skip("numba is not installed: the reference runs instead")
    generator = torch.Generator().manual_seed(length + n)
    a = torch.rand(units, length, n, dtype=torch.float64, generator=generator)
    a[:, :, 0] = 1 - 1e-7
    a[:, :, -1] = 1e-7
    a[:, length // 3, n // 2] = 0.0  # a reset
    b, c = (torch.randn(units, length, n, dtype=torch.float64, generator=generator) for _ in range(2))
    b[..., n // 2] *= 1e4
    c[..., n // 2] *= 1e-4
    unit = torch.randint(0, units, (pairs,), generator=generator)
    times = torch.randint(1, length, (pairs,), generator=generator)
    times[:2] = torch.tensor([1, length - 1])
    roots = cut_roots_kernel.cut_roots(a, b, c, unit, times)
    expected = cut_roots_kernel.cut_roots_reference(a[unit], b[unit], c[unit], times)
    rank = min(length, n)
    both = (roots[1] @ roots[0].mT, expected[1] @ expected[0].mT)
    for got, want in (both, (roots[0], expected[0]), (roots[1], expected[1])):
        got, want = torch.linalg.svdvals(got)[:, :rank], torch.linalg.svdvals(want)[:, :rank]
        assert_exact_contract(got, want)
        assert float((want[:, 0] > 0).double().mean()) > 0.5  # not vacuous (a reset may zero a cut)


@pytest.mark.parametrize("kernel", [True, False])
def test_the_cut_roots_kernel_takes_no_pairs(kernel, monkeypatch):
    """No pair to redo gives no triangles (of the units' N x N), not an error: by the kernel
    and by the reference that runs where numba is missing."""
    from ess_explorer.core import cut_roots_kernel

    if not kernel:
        monkeypatch.setattr(cut_roots_kernel, "available", lambda: False)
    a = torch.rand(2, 10, 3, dtype=torch.float64)
    none = torch.zeros(0, dtype=torch.long)
    assert [tuple(x.shape) for x in cut_roots_kernel.cut_roots(a, a, a, none, none)] == [(0, 3, 3), (0, 3, 3)]


@pytest.mark.parametrize("scale", [1e-200, 1e200])
def test_the_cut_roots_kernel_keeps_rows_whose_squares_leave_the_range(scale):
    """Rows near 1e-200 (squares underflow to 0) and near 1e200 (squares overflow): the
    kernel's rotations take their lengths scaled there, and its triangles give the reference's
    singular values, not zeros or infinities."""
    from ess_explorer.core import cut_roots_kernel
    from ess_explorer.core.compiled import available

    if not available():
        pytest.skip("numba is not installed: the reference runs instead")
    generator = torch.Generator().manual_seed(5)
    a = 0.4 + 0.5 * torch.rand(2, 24, 4, dtype=torch.float64, generator=generator)
    b, c = (torch.randn(2, 24, 4, dtype=torch.float64, generator=generator) for _ in range(2))
    b[1] *= scale  # unit 1 writes, and is read, at the scale alone
    c[1] *= scale
    unit, times = torch.tensor([1, 1, 1, 0]), torch.tensor([1, 12, 23, 12])
    roots = cut_roots_kernel.cut_roots(a, b, c, unit, times)
    expected = cut_roots_kernel.cut_roots_reference(a[unit], b[unit], c[unit], times)
    for got, want in ((roots[0], expected[0]), (roots[1], expected[1])):
        got, want = torch.linalg.svdvals(got), torch.linalg.svdvals(want)
        assert bool((want[:3, 0] > 0.1 * scale).all()) and bool(want.isfinite().all())
        assert_exact_contract(got, want)


def test_a_growing_recurrence_in_the_cut_roots_kernel_raises_the_overflow_error():
    """A decay above 1 overflows the redo's triangles (the kernel's, then the reference's, which
    computes those pairs again): the Gramian route raises the overflow error, which says what to
    do, not a solver's complaint about non-finite input."""
    ssm = mamba_like(2, 600, 4, seed=3)
    grown = DiagonalSSM(torch.full_like(ssm.a, 4.0), ssm.b, ssm.c)
    with pytest.raises(ValueError, match="overflow"):
        gramian.gramian_hankel_singular_values(grown, positions=torch.arange(600), accuracy=Accuracy("ess"))


def test_without_the_guard_the_imbalanced_realisation_would_miscount():
    """The guard is needed: the raw Gramian eigenvalues of the cancelling realisation are
    wrong at the level a count reads (so the fall-back test above tests something)."""
    ssm = cancelling()
    lam, _, _ = gramian_spectra_reference(ssm.a, ssm.b, ssm.c, torch.arange(1, ssm.length))
    exact = exact_spectra(ssm.materialize())[:, 1:, : lam.shape[-1]]
    raw = lam.sqrt()
    assert float(((raw - exact).abs() / exact[..., :1]).max()) > 1e-4


def test_values_just_above_and_below_tau_are_counted_right():
    """A cut whose singular values are placed at tau (1 +- 1e-4) and far from it: both
    contracts count each side; values within 1e-6 of tau are the contract's only freedom."""
    length, t = 40, 20
    tau = TOL
    values = torch.tensor(
        [1.0, 0.3, tau * (1 + 1e-4), tau * (1 - 1e-4), tau * (1 + 1e-3), tau * 0.5, 1e-9], dtype=torch.float64
    )
    g = torch.Generator().manual_seed(5)
    left = torch.linalg.qr(torch.randn(length - t, len(values), generator=g, dtype=torch.float64)).Q
    right = torch.linalg.qr(torch.randn(t, len(values), generator=g, dtype=torch.float64)).Q
    dense = torch.zeros(1, length, length, dtype=torch.float64)
    dense[0, t:, :t] = left @ torch.diag(values) @ right.T
    for precision in ("ess", "exact"):
        sigma = hankel_singular_values(dense, positions=[t], precision=precision)
        assert int(tolerance_ess(spectra=sigma, tol=TOL)[0, 0]) == 4  # 1, 0.3, tau(1 + 1e-4), tau(1 + 1e-3)


def reset_at(
    step: int, units: int = 2, length: int = 24, state: int = 4, seed: int = 3, decay: float = 1e-200
) -> DiagonalSSM:
    """Decays of ``decay`` at ``step`` (an exact reset, but for a trace): every entry of the cut
    at t = step passes through it, so that cut's values are near ``decay`` (at 1e-200 their
    squares underflow; at 1e-312 they lie below float64's normal range)."""
    g = torch.Generator().manual_seed(seed)
    a = 0.5 + 0.5 * torch.rand(units, length, state, generator=g, dtype=torch.float64)
    a[:, step] = decay
    b, c = (torch.randn(units, length, state, generator=g, dtype=torch.float64) for _ in range(2))
    return DiagonalSSM(a, b, c)


@pytest.mark.parametrize("precision", ["ess", "exact"])
def test_a_cut_whose_squares_underflow_counts_as_an_svd_does(precision):
    # sigma_1 ~ 1e-200 at t = 12: a Gram or Gramian squares it to 0 (below float64's range),
    # and that cut then read ESS 0; an SVD of the cut sees its values, and ESS counts them
    # against the cut's own sigma_1
    ssm = reset_at(12)
    dense = ssm.materialize()
    exact = exact_spectra(dense)
    assert 1e-215 < float(exact[:, 12, 0].min()) and float(exact[:, 12, 0].max()) < 1e-185
    for op in (ssm, dense):
        sigma = hankel_singular_values(op, precision=precision)
        assert_ess_contract(sigma, exact)
        assert bool((tolerance_ess(spectra=sigma)[:, 12] >= 1).all())
    assert torch.equal(causal_ess(ssm, precision=precision), causal_ess(spectra=reachability_exact(ssm)))


@pytest.mark.parametrize("one_decay", [False, True])
@pytest.mark.parametrize("scale", [1e-200, 1e-321])
def test_causal_ess_of_writes_near_the_bottom_of_float64_counts_as_an_svd_does(one_decay, scale):
    # inputs written at 1e-200: every R_t lies near 1e-200, and the Gramian P_t = R_t R_t^T
    # underflows to zero; the exact redo must keep the values, not their squares. The causal
    # routes keep them even below float64's normal range (1e-321): R_t is the inputs
    # themselves, not a product through the realisation's factors as H_t's sweep is
    from ess_explorer.core.causal import reachability_gramian_singular_values

    g = torch.Generator().manual_seed(6)
    a = 0.5 + 0.5 * torch.rand(2, 20, 1 if one_decay else 4, generator=g, dtype=torch.float64)
    b, c = (torch.randn(2, 20, 4, generator=g, dtype=torch.float64) for _ in range(2))
    ssm = DiagonalSSM(a.expand(2, 20, 4).contiguous(), scale * b, c)
    expected = causal_ess(spectra=reachability_exact(ssm))
    assert int(expected[:, 1:].min()) >= 1
    for precision in ("ess", "exact"):
        assert torch.equal(causal_ess(ssm, precision=precision), expected)
    routed = reachability_gramian_singular_values(ssm, torch.arange(20), Accuracy("ess"))  # the gated heads' route
    assert torch.equal(tolerance_ess(spectra=routed), expected)


@pytest.mark.parametrize("kernel", [False, True])
def test_cuts_whose_gramians_norms_underflow_count_as_an_svd_does(kernel):
    # Mamba-like channels (N = 16 decay rates) whose inputs are written near 1e-90: P_t near
    # 1e-180 is a normal number, but its Frobenius norm (the error bound) sums squares near
    # 1e-360, which underflow to zero, and the kernel's Sturm count squares P_t's off-diagonal:
    # a bound of zero let the kernel's causal ESS stand 1-2 too high on 129 of these 288 cuts.
    # They go to the exact routes (`squares_underflow`), as a cut near 1e-200 does
    if kernel and not gramian_kernel.available():
        pytest.skip("numba is not installed")
    g = torch.Generator().manual_seed(6)
    step = 0.02 + torch.rand(6, 48, 1, generator=g, dtype=torch.float64)
    a = torch.exp(-step * torch.arange(1, 17, dtype=torch.float64))
    b, c = (torch.randn(6, 48, 16, generator=g, dtype=torch.float64) for _ in range(2))
    ssm = DiagonalSSM(a, 1e-90 * step * b, c)
    reach_exact = reachability_exact(ssm)
    assert 1e-95 < float(reach_exact[:, 1:, 0].min()) and float(reach_exact[..., 0].max()) < 1e-85
    expected = causal_ess(spectra=reach_exact, scope="unit")
    assert int(expected.max()) >= 6  # the count has room to go wrong
    sigma, reach = gramian.gramian_hankel_singular_values(
        ssm, positions=torch.arange(48), accuracy=Accuracy("ess", TOL, True, "unit"), causal=True, kernel=kernel
    )
    assert torch.equal(causal_ess(spectra=reach, scope="unit"), expected)
    assert_ess_contract(sigma, exact_spectra(ssm.materialize()))


@pytest.mark.parametrize("precision", ["ess", "exact"])
def test_gated_channels_of_a_cut_whose_squares_underflow_count_as_an_svd_does(precision):
    heads = reset_at(12).materialize()  # two owners
    owner_of = torch.tensor([0, 0, 1, 1])
    gates = torch.rand(4, heads.shape[-1], generator=torch.Generator().manual_seed(4), dtype=torch.float64) + 0.1
    sigma = row_scaled_hankel_singular_values(
        heads, owner_of, gates, torch.arange(heads.shape[-1]), max_rank=4, accuracy=Accuracy(precision)
    )
    exact = exact_spectra(gates[..., None] * heads[owner_of])
    assert_ess_contract(sigma, exact)
    assert bool((tolerance_ess(spectra=sigma)[:, 12] >= 1).all())


@pytest.mark.parametrize("precision", ["ess", "exact"])
def test_a_cut_below_float64s_normal_range_reads_as_zero_on_every_route(precision):
    # a decay of 1e-312 at t = 12 leaves that cut's values near 1e-312, below float64's smallest
    # normal number (2.2e-308), where values hold fewer bits and a sweep through a realisation's
    # factors loses them (a Mamba2 channel with sigma_1 = 2e-321 read 0 by the sweep and 1 by an
    # SVD): every route reads such a cut as zero, the layer's too; the cuts beside it keep theirs
    ssm = reset_at(12, decay=1e-312)
    heads = ssm.materialize()
    owner_of = torch.tensor([0, 0, 1, 1])
    gates = torch.rand(4, heads.shape[-1], generator=torch.Generator().manual_seed(4), dtype=torch.float64) + 0.1
    exact_heads, exact_channels = exact_spectra(heads), exact_spectra(gates[..., None] * heads[owner_of])
    for exact in (exact_heads, exact_channels):
        assert 0 < float(exact[:, 12, 0].min()) and float(exact[:, 12, 0].max()) < torch.finfo(torch.float64).tiny
        exact[:, 12] = 0.0
    routes = {
        "sweep or Gramians": (hankel_singular_values(ssm, precision=precision), exact_heads),
        "dense": (hankel_singular_values(heads, precision=precision), exact_heads),
        "channels": (
            row_scaled_hankel_singular_values(
                heads, owner_of, gates, torch.arange(heads.shape[-1]), max_rank=4, accuracy=Accuracy(precision)
            ),
            exact_channels,
        ),
    }
    for name, (sigma, exact) in routes.items():
        assert not bool(sigma[:, 12].any()), name
        assert_ess_contract(sigma, exact)
        assert int(tolerance_ess(spectra=sigma)[:, 12].max()) == 0
    layer = SSMCapture(layer=0, family="mamba", state_size=4, realize=lambda index: ssm[index], shape=(2, 24))
    counted = layer_arrays(layer, np.arange(24), tol=TOL, relative=True, precision=precision)
    np.testing.assert_array_equal(counted["tolerance_ess"], tolerance_ess(spectra=exact_heads).numpy())
    assert not counted["singular_values"][:, 12].any() and not counted["entropy_ess"][:, 12].any()


def test_only_a_cut_below_the_normal_range_is_filled_and_zero_rows_copy_nothing():
    # every spectrum has an all-zero row (cut 0) and padding; filling those copied the whole
    # tensor on every call of every route
    tiny = torch.finfo(torch.float64).tiny
    sigma = torch.tensor([[0.0, 0.0], [3.0, 1e-320], [tiny / 4, tiny / 8], [tiny, 0.0]], dtype=torch.float64)
    untouched = sigma[[0, 1, 3]]
    assert zero_subnormal_cuts(untouched) is untouched
    filled = zero_subnormal_cuts(sigma)
    assert filled[2].tolist() == [0.0, 0.0]
    assert torch.equal(filled[[0, 1, 3]], untouched) and sigma[2, 0] == tiny / 4


@pytest.mark.parametrize("tol, relative", [(1e-9, False), (1e-12, False), (1e-8, True)])
def test_a_tolerance_below_the_gram_routes_resolution_counts_as_an_svd_does(tol, relative):
    # a head with all its weight on token 0: sigma_1 ~ 7, the rest ~1e-11, which the Gram route
    # lifts to ~1e-7; tolerance_ess must hand its tau to the guard, which then redoes the cuts
    heads = softmax_attention(120, head_dim=32, units=2, seed=2, sink=30.0)
    expected = tolerance_ess(spectra=exact_spectra(heads), tol=tol, relative=relative)
    got = tolerance_ess(heads, tol=tol, relative=relative, precision="ess")
    assert torch.equal(got, expected)


def test_kernel_matches_its_reference():
    if not gramian_kernel.available():
        pytest.skip("numba is not installed: the reference is the route")
    ssm = mamba_like(70, 50, 6, seed=7)  # 70 units: a full lane group and a padded one
    wanted = torch.tensor([1, 2, 9, 25, 48, 49])
    expected = gramian_spectra_reference(ssm.a, ssm.b, ssm.c, wanted, causal=True)
    got = gramian_kernel.gramian_spectra_kernel(
        ssm.a.numpy(), ssm.b.numpy(), ssm.c.numpy(), wanted.numpy(), True, gramian.GRAMIAN_ERROR
    )
    scale = expected[0][..., :1].numpy()
    np.testing.assert_allclose(got[0] / scale, expected[0].numpy() / scale, atol=1e-12)
    np.testing.assert_allclose(got[1], expected[1].numpy(), rtol=1e-10)
    # the kernel stops at P_t's tridiagonal form, the reference has its eigenvalues: same
    # spectrum, same largest eigenvalue (to core/sturm.py's TOP_ACCURACY), same bound
    tridiagonal = TridiagonalSpectra(*(torch.from_numpy(x) for x in got[2][:3]))
    top = expected[2][2][..., None]
    np.testing.assert_allclose((tridiagonal.values() ** 2 / top).numpy(), (expected[2][0] / top).numpy(), atol=1e-12)
    np.testing.assert_allclose(got[2][2], expected[2][2].numpy(), rtol=1e-8)
    np.testing.assert_allclose(got[2][3], expected[2][3].numpy(), rtol=1e-10)


def test_the_gramian_kernel_runs_one_compiled_version_for_every_call():
    """numba compiles a version per combination of array layouts, at the first call that
    brings one (seconds, inside a job): every cut or some, with causal ESS or not, inputs
    shared by the units (an expanded C) or not, all run the version `gramian.load` compiles,
    and the outputs written through C-ordered copies are those of the reference."""
    if not gramian_kernel.available():
        pytest.skip("numba is not installed: the reference is the route")
    base = mamba_like(3, 20, 4, seed=14)
    shared = DiagonalSSM(base.a, base.b, base.c[:1].expand(3, 20, 4))  # a view: not C-ordered
    for ssm in (base, shared):
        exact = exact_spectra(ssm.materialize())[..., :4]
        for causal in (False, True):
            for positions in (torch.arange(20), torch.arange(0, 20, 3)):
                out = gramian.gramian_hankel_singular_values(
                    ssm, positions=positions, accuracy=Accuracy("ess"), causal=causal, kernel=True
                )
                sigma = out[0] if causal else out
                reference = exact[:, positions]
                assert bool(((sigma - reference).abs() <= Accuracy("ess").resolution * reference[..., :1]).all())
    # a caller's views as outputs (every other column: not C-ordered), cuts from row 1 on
    arrays = [x.numpy() for x in (base.a, base.b, base.c)]
    expected = gramian_kernel.gramian_spectra_kernel(*arrays, np.arange(1, 20), False, gramian.GRAMIAN_ERROR)
    lam, err = np.full((3, 20, 8), 7.0), np.full((3, 20, 2), 7.0)
    out = (lam[..., ::2], err[..., 0], None)
    gramian_kernel.gramian_spectra_kernel(*arrays, np.arange(1, 20), False, gramian.GRAMIAN_ERROR, out=out, first_row=1)
    np.testing.assert_array_equal(out[0][:, 1:], expected[0])
    np.testing.assert_array_equal(out[1][:, 1:], expected[1])
    assert (
        (lam[:, 0] == 7).all() and (lam[..., 1::2] == 7).all() and (err[:, 0] == 7).all() and (err[..., 1] == 7).all()
    )
    assert len(gramian_kernel._kernel.signatures) == 1


def _hard_tridiagonals(lanes: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(diag, off) (n, lanes) of tridiagonals the QL iteration finds hard, one kind per lane in
    turn: random, already diagonal, a zero coupling mid-way (two blocks), graded over 1e-200,
    equal eigenvalues (a multiple of the identity plus a tiny coupling), a 2 x 2 block at the end."""
    rng = np.random.default_rng(seed)
    diag, off = rng.standard_normal((n, lanes)), rng.standard_normal((n, lanes))
    for w in range(lanes):
        kind = w % 6
        if kind == 1:
            off[:, w] = 0.0
        elif kind == 2:
            off[n // 2, w] = 0.0
        elif kind == 3:
            scale = np.logspace(0, -200, n)
            diag[:, w] *= scale
            off[:, w] *= np.sqrt(scale * np.roll(scale, -1))
        elif kind == 4:
            diag[:, w] = 0.5
            off[:, w] *= 1e-300
        elif kind == 5:
            off[: n - 2, w] = 0.0
    off[n - 1] = 0.0
    return diag, off


def test_the_kernels_lane_eigensolver_is_exact_and_each_lane_its_own():
    """The compiled QL iteration (`_tridiagonal_eigenvalues`) against LAPACK on tridiagonals
    of every hard kind; and each lane's result bit for bit the same beside any other lanes."""
    if not gramian_kernel.available():
        pytest.skip("numba is not installed")
    from test_tridiagonal_kernel import lanes_against_lapack

    lanes, n = gramian_kernel.LANES, 16
    diag, off = _hard_tridiagonals(lanes, n, seed=0)
    d = lanes_against_lapack(diag, off)
    # the same lanes among other neighbours (shuffled, and beside another batch): same bits
    other_diag, other_off = _hard_tridiagonals(lanes, n, seed=1)
    order = np.random.default_rng(2).permutation(lanes)
    mixed_diag = np.where(np.arange(lanes) % 2 == 0, diag[:, order], other_diag)
    mixed_off = np.where(np.arange(lanes) % 2 == 0, off[:, order], other_off)
    tridiagonal_kernel._tridiagonal_eigenvalues(mixed_diag, mixed_off, n, np.zeros(lanes, dtype=np.bool_))
    even = np.arange(0, lanes, 2)
    np.testing.assert_array_equal(mixed_diag[:, even], d[:, order[even]])


def test_the_lane_solver_marks_an_overflowed_matrix_failed_and_solves_the_others():
    """`_symmetric_eigenvalues` (shared by the Gramian and channel kernels) on lanes holding
    symmetric matrices, one with an infinite and one with a NaN diagonal entry: those two are
    marked failed, every other lane's eigenvalues are LAPACK's, and none is left marked."""
    if not gramian_kernel.available():
        pytest.skip("numba is not installed")
    lanes, n = gramian_kernel.LANES, 12
    rng = np.random.default_rng(5)
    factors = rng.standard_normal((lanes, n, n))
    matrices = factors @ factors.transpose(0, 2, 1)  # (lanes, n, n) positive definite
    work = np.ascontiguousarray(matrices.transpose(1, 2, 0))  # (n, n, lanes)
    work[3, 3, 1] = np.inf
    work[0, 0, 2] = np.nan
    out = np.empty((n, lanes))
    failed = np.zeros(lanes, dtype=np.bool_)
    buffers = [np.empty((n, lanes)) for _ in range(4)]
    gramian_kernel._symmetric_eigenvalues(work, n, n, out, failed, *buffers)
    assert failed.tolist() == [w in (1, 2) for w in range(lanes)]
    for w in set(range(lanes)) - {1, 2}:
        exact = np.linalg.eigvalsh(matrices[w])[::-1]
        np.testing.assert_allclose(out[:, w], exact, rtol=0, atol=1e-13 * exact[0])


def test_the_cholesky_shift_keeps_the_unresolved_values_small(monkeypatch):
    """The shift delta = CHOLESKY_SHIFT eps tr P lifts the values the Gramian route cannot
    resolve, which entropy-ESS reads: at eps tr P the reference's entropy error on Mamba-like
    channels with mid-size steps is 5.4e-8, at 16 eps tr P (N eps, the earlier shift) 3.1e-7;
    neither route gets worse with the smaller shift."""
    import ess_explorer.core.gramian_naive as naive

    ssm = mamba_like(16, 160, 16, seed=4, dt_shift=0.0)
    exact = entropy_ess(spectra=exact_spectra(ssm.materialize()))
    errors = {}
    routes = (False, True) if gramian_kernel.available() else (False,)  # kernel=
    for factor in (16 * naive.CHOLESKY_SHIFT, naive.CHOLESKY_SHIFT):
        monkeypatch.setattr(naive, "CHOLESKY_SHIFT", factor)
        for kernel in routes:
            sigma = gramian.gramian_hankel_singular_values(
                ssm, positions=torch.arange(160), accuracy=Accuracy("ess"), kernel=kernel
            )
            errors[factor, kernel] = float(((entropy_ess(spectra=sigma) - exact).abs() / exact).nan_to_num().max())
    small, large = naive.CHOLESKY_SHIFT, 16 * naive.CHOLESKY_SHIFT
    assert errors[small, False] <= 1.5e-7 < errors[large, False]
    for kernel in routes:  # no worse: equal up to the rounding of the error itself (1e-8 of it)
        assert errors[small, kernel] <= errors[large, kernel] * (1 + 1e-6)


def test_only_a_job_of_kernel_min_work_takes_the_kernel(monkeypatch):
    """The Gramian route's choice (`gramian.uses_kernel`): the kernel from `job_work` =
    KERNEL_MIN_WORK on, the blocked torch route below it (a fresh install's small first job
    does not wait for the compile), and torch where the kernel's lanes would be mostly empty.
    The work counts the scans through all L steps, not the wanted cuts alone: a strided job
    on a Mamba layer takes the kernel (its torch route took 5x as long)."""
    if not gramian_kernel.available():
        pytest.skip("numba is not installed")
    ssm = mamba_like(24, 40, 16, seed=8)
    default = gramian.KERNEL_MIN_WORK
    calls, original = [], gramian_kernel.gramian_spectra_kernel
    monkeypatch.setattr(gramian_kernel, "gramian_spectra_kernel", lambda *a, **k: calls.append(a) or original(*a, **k))
    work = 24 * (39 * 16**3 + gramian.SCAN_WORK * 40 * 16**2)  # units x (cuts 1..39 x N^3 + scans)
    for threshold, kernel in ((work + 1, False), (work, True)):
        calls.clear()
        monkeypatch.setattr(gramian, "KERNEL_MIN_WORK", threshold)
        gramian.gramian_hankel_singular_values(ssm, positions=torch.arange(40), accuracy=Accuracy("ess"))
        assert bool(calls) == kernel
    assert not gramian.uses_kernel(torch.device("meta"), 10**6, 1000, 16, 1024)  # a CPU only
    monkeypatch.setattr(gramian, "KERNEL_MIN_WORK", default)  # the sizes below at the shipped threshold
    # its 64 lanes run whether units fill them or not: a few large heads take torch
    cpu = torch.device("cpu")
    assert gramian.uses_kernel(cpu, 1536, 1023, 16, 1024)  # a Mamba-130m layer: 24 full lane groups
    assert gramian.uses_kernel(cpu, 1536, 31, 16, 96)  # the same at L = 96, every third cut
    assert not gramian.uses_kernel(cpu, 64, 63, 16, 64)  # a zoo model's layer: 2e7
    assert gramian.uses_kernel(cpu, 64, 255, 64, 256)
    assert not gramian.uses_kernel(cpu, 8, 255, 64, 256)  # a Mamba2 zoo layer: 1/8 full, 6x slower
    assert not gramian.uses_kernel(cpu, 24, 511, 128, 512)  # Mamba2-130m's heads at L = 512
    # one block runs on one thread while the blocked route has two (measured: `uses_kernel`)
    assert not gramian.uses_kernel(cpu, 64, 255, 128, 256)  # 1.3x faster blocked
    assert not gramian.uses_kernel(cpu, 20, 2047, 32, 2048)  # 1.2x
    assert gramian.uses_kernel(cpu, 128, 255, 128, 256)  # two blocks on two threads: 1.3x faster
    calls.clear()
    gramian.load()  # a benchmark's warm-up: the kernel's own call, with causal ESS (one version for all)
    assert [args[4] for args in calls] == [True]


def test_kernel_and_reference_routes_give_the_same_spectra():
    if not gramian_kernel.available():
        pytest.skip("numba is not installed")
    ssm = mamba_like(9, 40, 16, seed=8)
    positions = torch.arange(0, 40, 3)
    options = dict(positions=positions, accuracy=Accuracy("ess"), causal=True)
    by_kernel = gramian.gramian_hankel_singular_values(ssm, kernel=True, **options)
    by_reference = gramian.gramian_hankel_singular_values(ssm, kernel=False, **options)
    torch.testing.assert_close(by_kernel[0], by_reference[0], atol=1e-9 * float(by_reference[0].max()), rtol=0)
    # eigenvalues of P_t (squares: their square roots differ by sqrt(eps) where they are rounding)
    reach_kernel, reach_reference = by_kernel[1].values() ** 2, by_reference[1].values() ** 2
    torch.testing.assert_close(reach_kernel, reach_reference, atol=1e-12 * float(reach_reference.max()), rtol=0)
    for tol in (1e-3, 1e-1):  # the Sturm counts of both forms
        counts = [tolerance_ess(spectra=x[1], tol=tol) for x in (by_kernel, by_reference)]
        torch.testing.assert_close(counts[0], counts[1])


def test_the_error_model_holds_with_headroom():
    """GRAMIAN_ERROR bounds the measured error of every sigma^2 with at least 2x to spare."""
    ssm = mamba_like(6, 120, 16, seed=9)
    wanted = torch.arange(1, ssm.length)
    lam, error, _ = gramian_spectra_reference(ssm.a, ssm.b, ssm.c, wanted)
    exact = exact_spectra(ssm.materialize())[:, 1:, :16]
    measured = (lam - exact**2).abs().amax(-1)
    assert bool((2 * measured <= error).all())


def scalar_decay_heads(units: int = 3, length: int = 40, state: int = 24, seed: int = 11) -> DiagonalSSM:
    """Mamba2-like heads: one decay per head and step for all N modes, N >= L / 2."""
    g = torch.Generator().manual_seed(seed)
    dt = torch.nn.functional.softplus(torch.randn(units, length, 1, generator=g, dtype=torch.float64) - 1)
    a = torch.exp(-dt * torch.rand(units, 1, 1, generator=g, dtype=torch.float64) * 4).expand(units, length, state)
    b = dt * torch.randn(units, length, state, generator=g, dtype=torch.float64)
    return DiagonalSSM(a, b, torch.randn(units, length, state, generator=g, dtype=torch.float64))


@pytest.mark.parametrize(
    "ssm",
    [mamba_like(4, 80, 16), mamba_like(3, 60, 8, dt_shift=0.0), decays_at(0.0), decays_at(1.0), scalar_decay_heads()],
    ids=["mamba", "fast-decays", "decays-near-0", "decays-near-1", "mamba2-heads"],
)
def test_causal_gramian_route_meets_the_contract(ssm):
    """sigma(R_t) from eig(P_t) (core/causal.py) against the exact sweep: the same causal
    ESS at every cut (none of these lies within the band around tau) and every value within
    the contract's resolution."""
    from ess_explorer.core.causal import reachability_gramian_singular_values, reachability_singular_values

    positions = torch.arange(ssm.length + 1)  # t = L too: the state after the last input
    exact = reachability_singular_values(ssm, positions)
    fast = reachability_gramian_singular_values(ssm, positions, Accuracy("ess"))
    assert fast.shape == exact.shape
    np.testing.assert_array_equal(
        tolerance_ess(spectra=fast, tol=TOL).numpy(), tolerance_ess(spectra=exact, tol=TOL).numpy()
    )
    assert bool(((fast - exact).abs() <= Accuracy("ess").resolution * exact[..., :1] + 1e-300).all())
    picked = reachability_gramian_singular_values(ssm, [5, 0, 5, 17], Accuracy("ess"))  # any order, repeats
    resolution = Accuracy("ess").resolution * exact[:, [5, 0, 5, 17], :1]  # other batches, other solvers
    assert bool(((picked - fast[:, [5, 0, 5, 17]]).abs() <= resolution).all())
    strided = positions[::7]  # the steps between two cuts taken in one product (`_steps_between`)
    fast_strided = reachability_gramian_singular_values(ssm, strided, Accuracy("ess"))
    np.testing.assert_array_equal(
        tolerance_ess(spectra=fast_strided, tol=TOL).numpy(), tolerance_ess(spectra=exact[:, strided], tol=TOL).numpy()
    )
    assert bool(((fast_strided - exact[:, strided]).abs() <= Accuracy("ess").resolution * exact[:, strided, :1]).all())


def test_causal_gramian_route_redoes_an_uncertain_cut_by_the_sweep(monkeypatch):
    """A tolerance placed on an exact singular value of R_t about 1e-6 of its sigma_1, far
    below what eig(P_t) resolves: that cut's count is not certain, so its unit takes the
    sweep's values, and only that unit."""
    from ess_explorer.core import causal

    ssm = mamba_like(3, 30, 6, seed=12)
    ssm.b[1, :, 5] *= 1e-6  # unit 1 writes one mode a million times softer
    exact = causal.reachability_singular_values(ssm, torch.arange(30))
    ratio = float(exact[1, 20, 5] / exact[1, 20, 0])
    assert ratio < 1e-5
    accuracy = Accuracy("ess", tol=ratio)
    calls = []
    real = causal.reachability_singular_values
    monkeypatch.setattr(
        causal, "reachability_singular_values", lambda s, *a, **k: calls.append(s.a.shape[0]) or real(s, *a, **k)
    )
    fast = causal.reachability_gramian_singular_values(ssm, torch.arange(30), accuracy)
    assert calls == [1]  # unit 1 alone
    torch.testing.assert_close(fast[1], exact[1], rtol=0, atol=0)


def test_the_reachability_error_model_holds_with_headroom():
    """GRAMIAN_ERROR bounds the error of eig(P_t) with 2x to spare on the hardest case
    measured: no decay and inputs of one sign, so P_t is a sum of t positive terms (L = 2048).
    The reference is the SVD of each R_t = [b_0 ... b_{t-1}] itself, not the square-root sweep:
    over 2,000 steps the sweep's own rounding reaches half this bound on some CPUs (4.9e-11
    against 1.0e-10 on an Intel Xeon), while the SVD of R_t stays near eps sigma_1^2."""
    from ess_explorer.core.gramian_naive import GRAMIAN_ERROR

    g = torch.Generator().manual_seed(13)
    b = torch.rand(2, 2048, 8, generator=g, dtype=torch.float64)  # a = 1: R_t^T is b's first t rows
    padded = torch.cat([torch.zeros(2, 7, 8, dtype=torch.float64), b], 1)  # zero rows: 8 values at every t
    exact = torch.stack([torch.linalg.svdvals(padded[:, : t + 7]) for t in range(1, 2048)], 1) ** 2  # (2, L - 1, 8)
    p = torch.cumsum(b[:, :-1, :, None] * b[:, :-1, None, :], 1)  # P_t, t = 1..L-1, summed in order
    measured = (torch.linalg.eigvalsh(p).flip(-1) - exact).abs().amax(-1)
    bound = GRAMIAN_ERROR * torch.finfo(torch.float64).eps * torch.linalg.matrix_norm(p)
    assert bool((2 * measured <= bound).all())


@pytest.mark.parametrize("route", ["channels", "causal"])
def test_only_a_job_that_repays_the_compile_takes_the_dense_kernel(route, monkeypatch):
    """The channels' spectra (core/row_scaled.py: their shared factors' Grams, or for these
    slow heads the dense route) and the causal Gramians (core/causal.py) take a compiled kernel
    only for a job of at least dense_jobs.KERNEL_MIN_WORK (a zoo model's first analysis does
    not wait for its compile); either way the same counts."""
    from ess_explorer.core import channel_kernel, dense_jobs, dense_kernel
    from ess_explorer.core.causal import reachability_gramian_singular_values
    from ess_explorer.core.row_scaled import row_scaled_hankel_singular_values

    if not dense_kernel.available():
        pytest.skip("numba is not installed")
    g = torch.Generator().manual_seed(15)
    b, c = (torch.randn(2, 56, 28, generator=g, dtype=torch.float64) for _ in range(2))
    heads = DiagonalSSM(torch.full((2, 56, 28), 0.98, dtype=torch.float64), b, c)  # slow: factors 24+ wide
    gate = torch.rand(40, 56, generator=torch.Generator().manual_seed(16), dtype=torch.float64) + 0.1
    owner_of = torch.arange(2).repeat_interleave(20)
    calls = []
    for module, name in (
        (dense_kernel, "symmetric_eigenvalues"),
        (dense_jobs, "cut_spectra"),
        (channel_kernel, "_grams_and_eigenvalues"),
    ):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, original=original, **k: calls.append(1) or original(*a, **k))

    def run() -> torch.Tensor:
        if route == "causal":
            return reachability_gramian_singular_values(heads, torch.arange(57), Accuracy("ess"))
        dense = heads.materialize()
        return row_scaled_hankel_singular_values(
            dense, owner_of, gate, torch.arange(56), max_rank=28, accuracy=Accuracy("ess")
        )

    counts = {}
    for threshold, kernel in ((float("inf"), False), (0.0, True)):
        calls.clear()
        monkeypatch.setattr(dense_jobs, "KERNEL_MIN_WORK", threshold)
        counts[kernel] = tolerance_ess(spectra=run(), tol=TOL)
        assert bool(calls) == kernel
    assert torch.equal(counts[False], counts[True])


def test_the_kernels_rules_count_the_layer_a_chunk_of_units_belongs_to(monkeypatch):
    """core/layer.py computes a layer in memory-bounded chunks of units; the kernels' rules read
    the layer's work (`dense_jobs.chunk_of_layer`): a chunk that is a quarter of its layer
    counts four times its own work, and a layer computed in chunks takes the kernel wherever
    the same layer in one chunk does, with the same counts."""
    from ess_explorer.core import dense_jobs, dense_kernel
    from ess_explorer.core import layer as layer_module

    if not dense_kernel.available():
        pytest.skip("numba is not installed")
    least = dense_jobs.KERNEL_MIN_WORK
    assert not dense_jobs.repays_kernel(least / 3)
    with dense_jobs.chunk_of_layer(0.25):
        assert dense_jobs.repays_kernel(least / 3)
        assert gramian.uses_kernel(torch.device("cpu"), 384, 127, 16, 128)  # a quarter of a Mamba layer
    assert not dense_jobs.repays_kernel(least / 3)  # the scope is left as it was
    assert not gramian.uses_kernel(torch.device("cpu"), 384, 31, 16, 128)

    ssm = mamba_like(8, 48, 8, seed=19)
    layer = SSMCapture(layer=0, family="mamba", state_size=8, realize=lambda index: ssm[index], shape=(8, 48))
    positions = np.arange(48)
    whole = layer_arrays(layer, positions, tol=TOL, relative=True, precision="ess")
    seen = []  # (a chunk's work, the layer's it was counted as)
    original = dense_jobs.layer_work
    monkeypatch.setattr(dense_jobs, "layer_work", lambda work: seen.append((work, original(work))) or seen[-1][1])
    monkeypatch.setattr(layer_module, "UNIT_CHUNK_VALUES", 2 * len(positions) * 8)  # 2 units a chunk
    chunked = layer_arrays(layer, positions, tol=TOL, relative=True, precision="ess")
    assert len(seen) == 4 and all(counted == pytest.approx(4 * work) for work, counted in seen)
    for field in ("tolerance_ess", "causal_ess"):
        np.testing.assert_array_equal(chunked[field], whole[field])


def test_a_chunk_of_units_takes_the_path_its_layer_recorded(monkeypatch):
    """`SSMCapture.spectra_path` counts the whole layer's units for the Gramian kernel, so
    inside a chunk of them (`dense_jobs.chunk_of_layer`) it does not count them again: a layer
    just too small for the kernel stays dense in every chunk (it went factored in a half
    chunk, against the dense path the layer recorded and sized its chunks for)."""
    from ess_explorer.core import dense_jobs

    if not gramian_kernel.available():
        pytest.skip("numba is not installed")
    layer, positions, ess = _short_prompt_layer(128, 24, 16), np.arange(24), Accuracy("ess")
    monkeypatch.setattr(gramian, "KERNEL_MIN_WORK", 1.5 * gramian.job_work(128, 23, 24, 16))
    assert layer.spectra_path(positions, accuracy=ess)["method"] == "dense"
    with dense_jobs.chunk_of_layer(0.5):
        assert layer.spectra_path(positions, accuracy=ess)["method"] == "dense"
    monkeypatch.setattr(gramian, "KERNEL_MIN_WORK", 0.5 * gramian.job_work(128, 23, 24, 16))
    with dense_jobs.chunk_of_layer(0.5):
        assert layer.spectra_path(positions, accuracy=ess)["method"] == "sweep"


def test_a_short_prompt_of_wide_heads_takes_the_kernel_for_its_causal_gramians(monkeypatch):
    """The causal Gramians' job is what LAPACK would spend without the kernel: every cut's
    N x N Gramian. Mamba2's 24 heads of N = 128 at L = 64 (cuts of rank t < N, which the kernel
    solves as t x t) are such a job at the shipped threshold: LAPACK took 0.7 s of a layer's 1.1 s."""
    from ess_explorer.core import dense_kernel
    from ess_explorer.core.causal import reachability_gramian_singular_values, reachability_singular_values

    if not dense_kernel.available():
        pytest.skip("numba is not installed")
    heads = mamba_like(24, 64, 128, seed=17)
    calls, original = [], dense_kernel.symmetric_eigenvalues
    monkeypatch.setattr(dense_kernel, "symmetric_eigenvalues", lambda *a, **k: calls.append(1) or original(*a, **k))
    fast = reachability_gramian_singular_values(heads, torch.arange(64), Accuracy("ess"))
    assert calls
    exact = reachability_singular_values(heads, torch.arange(64))
    assert torch.equal(*(tolerance_ess(spectra=x, tol=TOL) for x in (fast, exact)))


def one_decay_heads(units: int = 24, length: int = 160, state: int = 48, seed: int = 23) -> DiagonalSSM:
    """Mamba2-like heads, one decay per head and step for all N modes, L > N: decay rates from
    0.01 to 4 (slow heads need more than N rows, fast ones a few), input-dependent steps; head
    0 has exact resets (a = 0 every 37 steps), head 1 decays within 1e-6 of 0, head 2 within
    1e-6 of 1."""
    g = torch.Generator().manual_seed(seed)
    rate = torch.logspace(-2, 0.6, units, dtype=torch.float64)[:, None, None]
    dt = 0.5 * torch.rand(units, length, 1, generator=g, dtype=torch.float64)
    a = torch.exp(-rate * dt)
    a[0, ::37] = 0.0
    a[1] = 1e-6 * torch.rand(length, 1, generator=g, dtype=torch.float64)
    a[2] = 1 - 1e-6 * torch.rand(length, 1, generator=g, dtype=torch.float64)
    b = torch.randn(units, length, state, generator=g, dtype=torch.float64)
    return DiagonalSSM(a.expand(units, length, state).contiguous(), b, b.clone())


@pytest.mark.parametrize("stride", [1, 5])
def test_heads_with_one_decay_per_step_take_the_gram_of_their_recent_rows(stride, monkeypatch):
    """Where every step decays all N modes by one number (Mamba2's heads), each cut's Gramian is
    the Gram of the recent rows of R_t (core/recent_kernel.py): each is the product of those rows
    (b_j times the decays since, built row by row here), what it leaves out is P_t's trace
    less its own, within WINDOW_MASS of its largest row's weight; fast heads keep a few rows,
    slow ones take P_t; and the counts are the exact sweep's, every value within the contract's
    resolution, at every cut and at a stride."""
    from ess_explorer.core import causal, dense_jobs, dense_kernel, recent_kernel

    if not dense_kernel.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(dense_jobs, "KERNEL_MIN_WORK", 0.0)
    heads = one_decay_heads()
    a, b = heads.a[..., 0], heads.b
    seen, original = [], recent_kernel.RecentRows.grams

    def spy(self, t, p, out, mass):
        sizes, left_out, norms = original(self, t, p, out, mass)
        seen.append((t, p.clone(), out.clone(), sizes.clone(), left_out.clone(), norms.clone()))
        return sizes, left_out, norms

    monkeypatch.setattr(recent_kernel.RecentRows, "grams", spy)
    positions = torch.arange(0, heads.length + 1, stride)
    fast = causal.reachability_gramian_singular_values(heads, positions, Accuracy("ess"))
    assert [t for t, *_ in seen] == [t for t in positions.tolist() if t >= 1]
    n, narrow, whole = heads.state_size, 0, 0
    for t, p, gram, sizes, left_out, norms in seen:
        for unit in range(len(sizes)):
            w = int(sizes[unit])
            if w == n and t > n and float(left_out[unit]) == 0.0 and torch.equal(gram[unit], p[unit]):
                assert float(norms[unit]) == pytest.approx(float(torch.linalg.matrix_norm(p[unit])), rel=1e-14)
                whole += 1
                continue
            narrow += w < min(t, n)
            decayed = torch.stack([b[unit, j] * torch.prod(a[unit, j + 1 : t]) for j in range(t - w, t)])
            product = decayed @ decayed.mT
            scale = float(product.abs().max())
            torch.testing.assert_close(gram[unit, :w, :w], product, rtol=1e-12, atol=1e-14 * scale)
            assert float(norms[unit]) == pytest.approx(float(torch.linalg.matrix_norm(product)), rel=1e-12)
            top = float((decayed * decayed).sum(-1).max())
            assert 0.0 <= float(left_out[unit]) <= causal.WINDOW_MASS * top
            trace = float(p[unit].trace()) - float(product.trace())
            assert abs(float(left_out[unit]) - trace) <= 1e-13 * float(p[unit].trace())
    assert narrow and whole  # both kinds of cut were exercised
    exact = causal.reachability_singular_values(heads, positions)
    assert torch.equal(*(tolerance_ess(spectra=x, tol=TOL) for x in (fast, exact)))
    assert bool(((fast - exact).abs() <= Accuracy("ess").resolution * exact[..., :1] + 1e-300).all())


def test_heads_too_many_for_the_rows_gram_budget_take_the_early_cuts_product(monkeypatch):
    """The recent rows' route holds (3N)^2 values a unit; past GRAMIAN_BLOCK_BYTES (set low here)
    the heads take the product of their early rows and P_t instead, with the sweep's counts."""
    from ess_explorer.core import causal, dense_jobs, dense_kernel, recent_kernel

    if not dense_kernel.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(dense_jobs, "KERNEL_MIN_WORK", 0.0)
    heads = one_decay_heads(units=16, length=80, state=32)
    monkeypatch.setattr(causal, "GRAMIAN_BLOCK_BYTES", 16 * (3 * 32) ** 2 * 8 - 1)
    used, grams = [], recent_kernel.RecentRows.grams
    monkeypatch.setattr(recent_kernel.RecentRows, "grams", lambda *a: used.append(1) or grams(*a))
    positions = torch.arange(heads.length + 1)
    fast = causal.reachability_gramian_singular_values(heads, positions, Accuracy("ess"))
    assert not used
    exact = causal.reachability_singular_values(heads, positions)
    assert torch.equal(*(tolerance_ess(spectra=x, tol=TOL) for x in (fast, exact)))


def test_what_a_window_of_recent_rows_leaves_out_counts_in_the_cuts_error(monkeypatch):
    """A window that leaves out far more than WINDOW_MASS (set to 1e-3 here) makes its cuts'
    counts uncertain through the error bound, so their units take the exact sweep's values and
    every count stays the sweep's."""
    from ess_explorer.core import causal, dense_jobs, dense_kernel

    if not dense_kernel.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(dense_jobs, "KERNEL_MIN_WORK", 0.0)
    monkeypatch.setattr(causal, "WINDOW_MASS", 1e-3)
    heads = one_decay_heads()
    calls, real = [], causal.reachability_singular_values
    monkeypatch.setattr(
        causal, "reachability_singular_values", lambda s, *a, **k: calls.append(s.a.shape[0]) or real(s, *a, **k)
    )
    positions = torch.arange(heads.length + 1)
    fast = causal.reachability_gramian_singular_values(heads, positions, Accuracy("ess"))
    assert calls and calls[0] < heads.a.shape[0]  # some units redone, not all
    exact = real(heads, positions)
    assert torch.equal(*(tolerance_ess(spectra=x, tol=TOL) for x in (fast, exact)))


def _short_prompt_layer(units: int, length: int, state: int) -> SSMCapture:
    ssm = mamba_like(units, length, state, seed=11, dt_shift=-1.0)
    return SSMCapture(
        layer=0, family="mamba", state_size=state, realize=lambda index: ssm[index], shape=(units, length)
    )


def _assert_routes_keep_the_contract(layer, positions, fast_route: str, exact_route: str) -> None:
    """``layer`` takes ``fast_route`` under "ess" and ``exact_route`` under "exact", and the
    first gives every ESS within its contract of the second's."""
    fast = layer_arrays(layer, positions, tol=1e-3, relative=True, precision="ess")
    exact = layer_arrays(layer, positions, tol=1e-3, relative=True, precision="exact")
    assert fast["path"]["method"] == fast_route and exact["path"]["method"] == exact_route
    np.testing.assert_array_equal(fast["tolerance_ess"], exact["tolerance_ess"])
    np.testing.assert_array_equal(fast["causal_ess"], exact["causal_ess"])
    np.testing.assert_allclose(fast["entropy_ess"], exact["entropy_ess"], rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("length", [6, 24, 31])  # a prompt shorter than N; N >= L / 2 (the exact costs: dense)
def test_a_short_prompt_under_ess_takes_the_gramian_kernel_within_the_contract(length, monkeypatch):
    """Under "ess" a diagonal layer whose Gramian job is large enough for the kernel takes the
    factored path at any L (`SSMCapture.spectra_path`): the kernel's one pass instead of the
    dense path's many small Grams (5x as long on a Mamba-130m layer at L = 32). "exact" keeps
    the dense path, whose spectra are the reference; both contracts hold for ESS and causal ESS."""
    if not gramian_kernel.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(gramian, "KERNEL_MIN_WORK", 0.0)  # this small layer stands for a large one
    layer, positions = _short_prompt_layer(70, length, 16), np.arange(length)
    ess = Accuracy("ess")
    assert layer.spectra_path(positions, accuracy=ess)["method"] == "sweep"
    assert layer.spectra_path(positions)["method"] == "dense"
    monkeypatch.setattr(gramian, "KERNEL_MIN_WORK", float("inf"))  # a job too small for the kernel
    assert layer.spectra_path(positions, accuracy=ess)["method"] == "dense"
    monkeypatch.setattr(gramian, "KERNEL_MIN_WORK", 0.0)
    _assert_routes_keep_the_contract(layer, positions, fast_route="sweep", exact_route="dense")


def _heads(units: int, length: int, state: int) -> SSMCapture:
    """Mamba2's heads with gates outside: one decay per step for all N modes, each its own
    owner; realised one unit at a time (the route choice reads unit 0 only)."""

    def realize(index):
        ssm = mamba_like(len(torch.as_tensor(index).reshape(-1)), length, state, seed=5, dt_shift=-3.0)
        return DiagonalSSM(ssm.a[..., :1].expand_as(ssm.a), ssm.b, ssm.c)

    return SSMCapture(layer=0, family="mamba2", state_size=state, realize=realize, shape=(units, length))


# Mamba2-130m's heads with gates outside and Mamba2-1.3B's (the blocked Gramian route before),
# and twice Mamba2-1.3B's (two blocks of lanes: its kernel)
@pytest.mark.parametrize("units, length, kernel", [(24, 512, False), (64, 512, False), (128, 256, True)])
def test_under_ess_wide_diagonal_heads_take_the_dense_route_where_it_costs_less(units, length, kernel):
    """The exact routes' flops (`choose_ssm_path`) send N = 128 heads at L = 2N-4N to the
    Gramian route, which costs them 3-15x the dense route under "ess" (core/costs.py): that
    contract takes the dense route there, and the record says why; "exact" keeps its rule, and
    a longer prompt, where the dense cuts grow as g^3, keeps the Gramian route."""
    if kernel and not gramian_kernel.available():
        pytest.skip("numba is not installed")
    layer, positions, ess = _heads(units, length, 128), np.arange(length), Accuracy("ess")
    path = layer.spectra_path(positions, accuracy=ess)
    assert path["method"] == "dense" and "est. dense" in path["reason"], path
    assert layer.spectra_path(positions)["method"] == ("sweep" if length > 256 else "dense")
    assert _heads(units, 4 * length, 128).spectra_path(np.arange(4 * length), accuracy=ess)["method"] == "sweep"


def test_a_layer_switched_to_the_dense_route_under_ess_keeps_the_contract(monkeypatch):
    """A small layer stands for a large one (no time floor on a switch): the dense route it
    switches to gives every ESS as the exact reference does."""
    from ess_explorer.core import costs

    monkeypatch.setattr(costs, "SWITCH_SECONDS", 0.0)
    layer, positions = _heads(3, 256, 64), np.arange(256)
    assert layer.spectra_path(positions, accuracy=Accuracy("ess"))["method"] == "dense"
    _assert_routes_keep_the_contract(layer, positions, fast_route="dense", exact_route="sweep")


def test_the_gramian_routes_exact_redo_of_a_prompt_shorter_than_n_pads_its_values():
    """`_exact_cuts` on L < N: rank(H_t) <= L, so L values and zeros up to N (the Gramian
    route's width), equal to the SVD of each materialised cut and of R_t."""
    ssm = mamba_like(3, 5, 8, seed=2)
    times = torch.tensor([1, 2, 4])
    sigma, reach = gramian._exact_cuts(ssm.a, ssm.b, ssm.c, torch.arange(3), times)
    assert sigma.shape == reach.shape == (3, 8)
    dense = ssm.materialize()
    for k, t in enumerate(times.tolist()):
        want = torch.linalg.svdvals(dense[k, t:, :t])
        torch.testing.assert_close(sigma[k, : len(want)], want, rtol=1e-10, atol=1e-14)
        assert bool((sigma[k, len(want) :] < 1e-12 * want[0]).all())
        assert bool((reach[k, t:] == 0).all())  # R_t has t columns: rank t


def test_absolute_and_tiny_tolerances_take_the_exact_route():
    ssm = mamba_like(2, 40, 8, seed=10)
    exact = exact_spectra(ssm.materialize())[..., :8]
    sigma = gramian.gramian_hankel_singular_values(
        ssm, positions=torch.arange(40), accuracy=Accuracy("ess", tol=1e-9, relative=True)
    )
    assert_exact_contract(sigma, exact)


def test_precision_names_are_checked():
    assert check_precision("exact") == "exact"
    with pytest.raises(ValueError, match="precision must be one of 'ess', 'exact'"):
        check_precision("fast")
    with pytest.raises(ValueError, match="precision must be one of"):
        hankel_singular_values(torch.eye(4)[None].tril(), precision="float32")


# ---- the contract through analyze ----------------------------------------------------------


@pytest.fixture(scope="module", params=["mamba", "mamba2", "gpt2"])
def tiny_model(request):
    import transformers as tf

    torch.manual_seed(0)
    ids = dict(vocab_size=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if request.param == "mamba":
        config = tf.MambaConfig(num_hidden_layers=2, hidden_size=16, state_size=8, **ids)
    elif request.param == "mamba2":  # N >= L / 2: heads on the dense path, channels row-scaled copies
        config = tf.Mamba2Config(
            num_hidden_layers=2, hidden_size=16, state_size=24, num_heads=4, head_dim=8, n_groups=1, chunk_size=8, **ids
        )
    else:
        config = tf.GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=64, **ids)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    return model, [(7 * i + 3) % 64 for i in range(40)]


def test_analyze_records_the_contract_and_both_agree(tiny_model):
    from ess_explorer import analyze

    model, ids = tiny_model
    for scope in ("cut", "unit", "layer"):
        fast = analyze(model, ids, progress=False, scope=scope)
        exact = analyze(model, ids, progress=False, precision="exact", scope=scope)
        assert fast.meta["precision"] == "ess" and exact.meta["precision"] == "exact"
        for index, layer in exact.layers.items():
            np.testing.assert_array_equal(fast.layers[index].tolerance_ess, layer.tolerance_ess)
            np.testing.assert_allclose(fast.layers[index].entropy_ess, layer.entropy_ess, rtol=1e-5)
            np.testing.assert_array_equal(fast.layers[index].causal_ess, layer.causal_ess)
    with pytest.raises(ValueError, match="precision must be one of"):
        analyze(model, ids, progress=False, precision="fast")


# ---- inputs and the GPU dispatch ---------------------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        ({"stride": 1.5}, "stride must be a positive integer"),
        ({"stride": True}, "stride must be a positive integer"),
        ({"positions": ["a"]}, "positions must be integers"),
        ({"positions": [1.5]}, "positions must be integers"),
        ({"dtype": torch.int32}, "dtype must be a real floating-point"),
    ],
)
def test_spectra_options_are_checked_where_they_enter(options, message):
    with pytest.raises(ValueError, match=message):
        hankel_singular_values(torch.rand(1, 8, 8, dtype=torch.float64).tril(), **options)


def test_eigvalsh_dispatch_keeps_torch_off_the_gpu(monkeypatch):
    """The cuSOLVER route is taken only for a CUDA batch with n > 32: a CPU batch answers by
    torch even where the binding imports."""
    from ess_explorer.core import eigen

    monkeypatch.setattr(eigen, "cusolver_batched_available", lambda: True)
    monkeypatch.setattr(eigen, "_cusolver_eigvalsh", lambda m: pytest.fail("cuSOLVER called for a CPU tensor"))
    x = torch.randn(5, 40, 40, dtype=torch.float64)
    x = x @ x.mT
    torch.testing.assert_close(eigen.eigvalsh(x), torch.linalg.eigvalsh(x))


def test_cuda_batches_are_split_and_halved_where_cusolver_refuses(monkeypatch):
    """The GPU's batch splitting, on the CPU: a solver that refuses batches larger than 600
    (as cuSOLVER refuses batches of tens of thousands) gets at most the limit per call, the
    limit halves until the calls pass and stays there, every matrix is solved once, in
    order; an error that is not cuSOLVER's, or one at the smallest batch, is raised."""
    from ess_explorer.core import eigen

    calls = []

    def refusing(batch):
        calls.append(batch.shape[0])
        if batch.shape[0] > 600:
            raise RuntimeError("cusolver error: CUSOLVER_STATUS_INTERNAL_ERROR, when calling `cusolverDnXsyevBatched`")
        return torch.linalg.eigvalsh(batch)

    monkeypatch.setattr(eigen, "_cuda_eigvalsh", refusing)
    monkeypatch.setattr(eigen, "_cuda_batch", 2000)
    x = torch.randn(2500, 6, 6, dtype=torch.float64)
    x = x @ x.mT
    torch.testing.assert_close(eigen._in_cuda_batches(x), torch.linalg.eigvalsh(x), rtol=0, atol=0)
    assert calls == [2000, 1000, 500, 500, 500, 500, 500]
    assert eigen.cuda_batch_limit() == 500  # kept for the next call

    def failing(message):
        def solve(batch):
            calls.append(batch.shape[0])
            raise RuntimeError(message)

        return solve

    calls.clear()
    monkeypatch.setattr(eigen, "_cuda_eigvalsh", failing("cusolver error: CUSOLVER_STATUS_INTERNAL_ERROR"))
    with pytest.raises(RuntimeError, match="CUSOLVER_STATUS_INTERNAL_ERROR"):
        eigen._in_cuda_batches(x)
    assert calls == [500, 256]  # halved down to the smallest batch, then raised
    monkeypatch.setattr(eigen, "_cuda_eigvalsh", failing("CUDA out of memory"))
    monkeypatch.setattr(eigen, "_cuda_batch", 1000)
    with pytest.raises(RuntimeError, match="out of memory"):
        eigen._in_cuda_batches(x)
    assert eigen.cuda_batch_limit() == 1000


def test_a_cuda_batch_the_solver_does_not_converge_on_is_solved_by_lapack(monkeypatch):
    """cuSOLVER's batched solver may fail to converge where LAPACK does (LinAlgError): that
    batch alone is solved on the host, the others stay on the device's solver."""
    from ess_explorer.core import eigen

    calls = []

    def fails_once(batch):
        calls.append(batch.shape[0])
        if len(calls) == 2:
            raise torch.linalg.LinAlgError("linalg.eigh: (Batch element 3): The algorithm failed to converge")
        return torch.linalg.eigvalsh(batch) + 0.0

    monkeypatch.setattr(eigen, "_cuda_eigvalsh", fails_once)
    monkeypatch.setattr(eigen, "_cuda_batch", 300)
    x = torch.randn(700, 5, 5, dtype=torch.float64)
    x = x @ x.mT
    torch.testing.assert_close(eigen._in_cuda_batches(x), torch.linalg.eigvalsh(x), rtol=0, atol=0)
    assert calls == [300, 300, 100] and eigen.cuda_batch_limit() == 300


def test_an_svd_the_accelerators_solver_does_not_converge_on_is_solved_on_the_host(monkeypatch):
    """On an accelerator's routes (here on the CPU, core/accelerator.py) a batch whose SVD the
    device's solver gives up on (LinAlgError) is solved again by LAPACK on the host; on the
    CPU's own routes the error stands (LAPACK itself failed)."""
    from ess_explorer.core import eigen
    from ess_explorer.core.accelerator import accelerator_routes_on_cpu

    plain_values, plain_svd = torch.linalg.svdvals, torch.linalg.svd
    failures = []

    def once(solve):
        def flaky(x, **options):
            if not failures:
                failures.append(x.shape)
                raise torch.linalg.LinAlgError("linalg.svd: The algorithm failed to converge")
            return solve(x, **options)

        return flaky

    x = torch.randn(7, 9, 5, dtype=torch.float64)
    monkeypatch.setattr(torch.linalg, "svdvals", once(plain_values))
    monkeypatch.setattr(torch.linalg, "svd", once(plain_svd))
    with pytest.raises(torch.linalg.LinAlgError):
        eigen.svdvals(x)
    with accelerator_routes_on_cpu():
        failures.clear()
        torch.testing.assert_close(eigen.svdvals(x), plain_values(x), rtol=0, atol=0)
        failures.clear()
        u, sigma, vh = eigen.svd(x)
        torch.testing.assert_close(u @ torch.diag_embed(sigma) @ vh, x)
    assert failures == [x.shape]


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("n", [16, 48])
def test_cuda_eigvalsh_takes_a_layer_sized_batch(n):
    """A Mamba layer's Gramian route asks for about 1.5 million 16 x 16 solves at once, more
    than one cuSOLVER call takes: the answer still equals the CPU's."""
    from ess_explorer.core import eigen

    count = 3 * eigen.CUDA_BATCH + 17
    x = torch.randn(count, n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    x = x @ x.mT
    torch.testing.assert_close(eigen.eigvalsh(x.cuda()).cpu(), torch.linalg.eigvalsh(x), rtol=1e-10, atol=1e-9 * n)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("n", [16, 64, 200])
def test_cuda_batched_eigvalsh_equals_cpu(n):
    from ess_explorer.core import eigen

    x = torch.randn(300, n, n, dtype=torch.float64)
    x = x @ x.mT
    torch.testing.assert_close(eigen.eigvalsh(x.cuda()).cpu(), torch.linalg.eigvalsh(x), rtol=1e-10, atol=1e-9 * n)


@pytest.mark.gpu
@cuda
def test_cuda_gramian_route_meets_the_contract():
    ssm = mamba_like(70, 120, 16, seed=11)
    exact = exact_spectra(ssm.materialize())
    fast, reach = gramian.gramian_hankel_singular_values(
        ssm, positions=torch.arange(ssm.length), accuracy=Accuracy("ess"), causal=True, device="cuda"
    )
    assert_ess_contract(fast.cpu(), exact)


@pytest.mark.gpu
@cuda
def test_cuda_causal_gramian_route_equals_the_sweep():
    """The causal Gramian route on a GPU (whole Gramians, cuSOLVER's batched eigenvalues
    where nvmath is installed) against the CPU's exact sweep: the same causal ESS."""
    from ess_explorer.core.causal import reachability_gramian_singular_values, reachability_singular_values

    ssm = scalar_decay_heads(units=24, length=80, state=48)
    exact = reachability_singular_values(ssm, torch.arange(80))
    fast = reachability_gramian_singular_values(ssm, torch.arange(80), Accuracy("ess"), device="cuda").cpu()
    np.testing.assert_array_equal(
        tolerance_ess(spectra=fast, tol=TOL).numpy(), tolerance_ess(spectra=exact, tol=TOL).numpy()
    )
    assert bool(((fast - exact).abs() <= Accuracy("ess").resolution * exact[..., :1] + 1e-300).all())


def test_compiled_sturm_counts_match_the_torch_sequence():
    """The compiled count against its reference, at thresholds between eigenvalues, on them
    (a zero pivot), with zero off-diagonals (a split matrix) and per-cut thresholds."""
    if not gramian_kernel.available():
        pytest.skip("numba is not installed: the reference is the count")
    g = torch.Generator().manual_seed(13)
    diag = torch.rand(5, 70, 9, generator=g, dtype=torch.float64)  # 350 cuts: five lane groups and a tail
    off = 0.2 * torch.randn(5, 70, 9, generator=g, dtype=torch.float64)
    off[:, ::3, 4] = 0.0
    spectra = TridiagonalSpectra(diag, off, torch.zeros(5, 70, dtype=torch.float64))
    sigma = spectra.values()
    for tau in (torch.tensor(0.5), sigma[..., 2], 0.5 * (sigma[..., 3] + sigma[..., 4]), torch.tensor(-1.0)):
        compiled, reference = (spectra.count_above(tau, compiled=flag) for flag in (True, False))
        np.testing.assert_array_equal(compiled.numpy(), reference.numpy())
    between = 0.5 * (sigma[..., 3] + sigma[..., 4])
    np.testing.assert_array_equal(spectra.count_above(between, compiled=True).numpy(), np.full((5, 70), 4))


def hard_top_lanes(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(diag, off) (n, LANES) tridiagonals, trace-scaled, whose largest eigenvalue is hard to
    find: graded spectra, a zero matrix, a diagonal one, rank one, Wilkinson's W+ (its top
    pair agrees to 1e-14), a top eigenvalue repeated by a split (two equal blocks, where
    Laguerre's iteration slows to a linear rate) and near-equal diagonals."""
    from ess_explorer.core.compiled import LANES

    rng = np.random.default_rng(3)
    # kinds 0 and 1: the Householder forms (the kernel's own reduction) of Grams graded over 2
    # or 12 orders, as the Gramian kernel meets them
    grams = np.zeros((n, n, LANES))
    for w in range(0, LANES, 8):
        for kind in (0, 1):
            spectrum = 10.0 ** rng.uniform(-12 if kind else -2, 0, n)
            q = np.linalg.qr(rng.standard_normal((n, n)))[0]
            grams[:, :, w + kind] = (q * spectrum) @ q.T
    reduced, reduced_off = np.zeros((n, LANES)), np.zeros((n, LANES))
    gramian_kernel._tridiagonal(grams, n, reduced, reduced_off, np.empty((n, LANES)), np.empty((n, LANES)))
    diag, off = np.zeros((n, LANES)), np.zeros((n, LANES))
    for w in range(LANES):
        kind = w % 8
        if kind in (0, 1):
            d, e = reduced[:, w].copy(), reduced_off[:, w].copy()
        elif kind == 2:
            d, e = np.zeros(n), np.zeros(n)
        elif kind == 3:
            d, e = rng.uniform(0, 1, n), np.zeros(n)
        elif kind == 4:
            d, e = np.zeros(n), np.zeros(n)
            d[rng.integers(n)] = 1.0
        elif kind == 5:
            d, e = np.abs(np.arange(n) - (n - 1) / 2.0), np.ones(n)
        elif kind == 6 and n >= 4:  # two equal blocks (and a small last entry where n is odd)
            half = n // 2
            d = np.append(np.tile(rng.uniform(0, 1, half), 2), [0.01] * (n % 2))
            e = np.append(np.tile(np.append(rng.uniform(0.1, 0.5, half - 1), 0.0), 2), [0.0] * (n % 2))
        else:
            d, e = 1.0 + 1e-9 * rng.standard_normal(n), 1e-6 * rng.standard_normal(n)
        e[-1] = 0.0
        scale = np.abs(d).sum() or 1.0
        diag[:, w], off[:, w] = d / scale, e / scale
    return diag, off


@pytest.mark.parametrize("n", [1, 2, 16, 33])
def test_the_largest_eigenvalue_of_hard_lanes(n):
    """The Gramian kernel's lambda_max of P_t's tridiagonal form (core/sturm.py: Laguerre's
    iteration, certified by Sturm counts, else bisection) within its TOP_ACCURACY of LAPACK's,
    on lanes where each of those routes decides (a repeated top defeats Laguerre's 10 steps)."""
    if not gramian_kernel.available():
        pytest.skip("numba is not installed")
    from test_tridiagonal_kernel import lane_matrix

    from ess_explorer.core.compiled import LANES
    from ess_explorer.core.sturm import TOP_ACCURACY, _largest_eigenvalues

    diag, off = hard_top_lanes(n)
    top = np.empty(LANES)
    _largest_eigenvalues(diag, off, n, top, np.empty((n, LANES)), np.empty((10, LANES)))
    for w in range(LANES):
        matrix = lane_matrix(diag, off, w)
        exact = np.linalg.eigvalsh(matrix)[-1]
        assert abs(top[w] - exact) <= TOP_ACCURACY * abs(exact) + 1e-15 * np.abs(matrix).max(), (w, top[w], exact)


def test_sturm_counts_equal_counts_of_the_eigenvalues():
    """The causal counts of a tridiagonal form (core/sturm.py) against its eigenvalues at
    thresholds between them, and the scope reductions of tolerance_ess on it."""
    g = torch.Generator().manual_seed(12)
    diag = torch.rand(3, 7, 6, generator=g, dtype=torch.float64)
    off = 0.3 * torch.randn(3, 7, 6, generator=g, dtype=torch.float64)
    sigma = TridiagonalSpectra(diag, off, torch.zeros(3, 7, dtype=torch.float64)).values()
    spectra = TridiagonalSpectra(diag, off, sigma[..., 0] ** 2)
    for tau in (0.05, 0.3, 0.6, 0.9, 2.0):
        np.testing.assert_array_equal(spectra.count_above(torch.tensor(tau)).numpy(), (sigma > tau).sum(-1).numpy())
    for scope in ("cut", "unit", "layer"):
        np.testing.assert_array_equal(
            tolerance_ess(spectra=spectra, tol=0.4, scope=scope).numpy(),
            tolerance_ess(spectra=sigma, tol=0.4, scope=scope).numpy(),
        )
    np.testing.assert_array_equal(
        tolerance_ess(spectra=spectra, tol=0.5, relative=False).numpy(), (sigma > 0.5).sum(-1).numpy()
    )


def test_the_guard_certifies_a_larger_error_only_away_from_tau():
    """An error above the strict bound (2e-6 tau^2) is accepted where no eigenvalue lies
    within it of tau^2, for a cut's own tau only, and never above WINDOW_ERROR sigma_1^2."""
    from ess_explorer.core.precision import WINDOW_ERROR

    top = torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    error = torch.tensor([1e-11, 1e-11, 1e-11, 10 * WINDOW_ERROR], dtype=torch.float64)
    tau2 = TOL**2
    values = torch.tensor(
        [[1.0, 0.5, tau2 * 10], [1.0, tau2 * (1 + 1e-6), 0.0], [1.0, tau2 * (1 + 1e-4), 0.0], [1.0, 0.5, 0.0]],
        dtype=torch.float64,
    )
    assert Accuracy("ess").certain(top, error, values).tolist() == [True, False, True, False]
    assert not bool(Accuracy("ess", scope="unit").certain(top, error, values).any())  # tau not known yet
    assert not bool(Accuracy("ess").certain(top, error).any())  # without the values: the strict bound


def test_a_shift_certified_at_tau_never_moves_a_count():
    """Accuracy.shifted_error: singular values each moved by at most ``shift`` (a truncated
    factor) are certified from the moved values alone, and the certificate is never wrong.
    Values are placed around tau at distances of a fraction to a few times the shift, moved
    by up to the shift either way; wherever `certain` says the count stands, it does, but for
    a true value within the contract's band (TAU_BAND tau) of tau."""
    ess = Accuracy("ess")
    generator = torch.Generator().manual_seed(3)
    tau = TOL  # sigma_1 = 1
    for shift in (1e-12, 1e-10, 1e-9, 3e-9, 1e-8):
        offset = shift * (torch.rand(4000, generator=generator, dtype=torch.float64) * 6 - 3)
        true = torch.stack([torch.ones_like(offset), tau + offset], -1)  # (cuts, 2): sigma_1 and one near tau
        moved = true + torch.stack(
            [torch.zeros_like(offset), shift * (2 * torch.rand(4000, generator=generator) - 1)], -1
        )
        top = moved[:, 0] ** 2
        error = ess.shifted_error(top, torch.zeros_like(top), torch.full_like(top, shift))
        sure = ess.certain(top, error, moved**2)
        crossed = (moved[:, 1] > tau) != (true[:, 1] > tau)
        outside_band = (true[:, 1] - tau).abs() > TAU_BAND * tau
        assert not bool((sure & crossed & outside_band).any()), shift
        assert bool(sure.any())
        if shift > TAU_BAND * tau:  # moves that cross tau from outside the band: the window test's case
            assert bool((crossed & outside_band).any()) and bool((sure & ~crossed & outside_band).any())
    # The bound the shift must meet is about TAU_BAND tau, not TAU_BAND tau^2 / sigma_1: a shift
    # of 1e-10 sigma_1 (a thousand times what (2 sigma_1 + shift) shift would allow) is certain.
    top = torch.ones(1, dtype=torch.float64)
    assert bool(ess.certain(top, ess.shifted_error(top, top * 0, top * 1e-10)))
    assert not bool(ess.certain(top, ess.shifted_error(top, top * 0, top * 1e-8)))


def test_causal_ess_counts_the_reachability_factor():
    """causal_ess beside tolerance_ess: equal to the rank of R_t counted from an explicit
    reachability matrix, under both contracts; refused for a dense operator."""
    from ess_explorer import causal_ess

    ssm = diagonal_ssm(30, 5, units=2, seed=13, resets=[12])
    expected = np.zeros((2, 30), dtype=np.int64)
    for u in range(2):
        for t in range(1, 30):  # R_t: column j is prod_{m=j+1..t-1} a_m b_j
            columns = [ssm.b[u, j] * torch.prod(ssm.a[u, j + 1 : t], 0) for j in range(t)]
            sigma = torch.linalg.svdvals(torch.stack(columns, 1))
            expected[u, t] = int((sigma > TOL * sigma[0]).sum())
    for precision in ("ess", "exact"):
        np.testing.assert_array_equal(causal_ess(ssm, precision=precision).numpy(), expected)
    assert causal_ess(ssm)[:, 13].tolist() == [1, 1]  # the step after the reset: only u_12 is held
    np.testing.assert_array_equal(causal_ess(ssm, positions=[3, 20]).numpy(), expected[:, [3, 20]])
    with pytest.raises(ValueError, match="needs a realisation"):
        causal_ess(ssm.materialize())


def test_a_drawn_spectrum_is_exact_where_drawn():
    """Under "ess" the views and the figures draw no value below the contract's resolution
    and say so; under "exact" they draw the spectrum down to round-off, without the note."""
    import copy

    from ess_explorer import figure
    from ess_explorer.synthetic import reference_result
    from ess_explorer.views.data import drawn_floor, floor_note

    for precision in ("ess", "exact"):
        res = copy.deepcopy(reference_result(precision=precision))
        lay = res.layer(0)
        row = int(np.flatnonzero(np.asarray(lay.positions) == 24)[0])
        tail = lay.singular_values[0, row, 3:]  # below 1.4e-6 sigma_1 from the 4th value on, descending
        tail[:] = 1e-8 * lay.singular_values[0, row, 0] * 0.5 ** np.arange(tail.size)
        sigma_1 = lay.singular_values[0, row, 0]
        assert drawn_floor(res)[0] == (Accuracy("ess").resolution if precision == "ess" else 1e-13)
        spec = figure(res, "spectrum", layer=0, unit=0, positions=[24, 36]).to_dict()  # the paper figure
        drawn = [v["sigma"] for data in spec["datasets"].values() for v in data if "series" in v]
        assert (min(drawn) < 1e-6) == (precision == "exact")  # normalised by sigma_1
        assert ("not drawn below" in str(spec)) == (precision == "ess")
        panel = figure(res, "spectrum", layer=0, unit=0, positions=[24]).to_dict()  # the explorer's panel
        cut = next(v for data in panel["datasets"].values() for v in data if v.get("t") == 24 and "sigma" in v)
        assert (min(cut["sigma"]) < 1e-6 * sigma_1) == (precision == "exact")
        assert bool(floor_note(res)) == (precision == "ess")


def test_growing_decays_raise_the_overflow_error_under_ess():
    a = torch.full((2, 3000, 4), 1.5, dtype=torch.float64)
    with pytest.raises(ValueError, match="overflow the floating-point range"):
        hankel_singular_values(DiagonalSSM(a, torch.ones_like(a), torch.ones_like(a)), precision="ess")


@pytest.mark.parametrize("gated", [False, True])
def test_a_recurrent_layer_under_ess_is_one_chunk_of_units(gated, monkeypatch):
    """The Gramian route keeps no sweep buffer, so layer_arrays hands it a whole layer of
    channels at once (a few large calls, core/layer.py); the sweep of "exact" takes them in
    chunks its (units, P, N, N) buffer allows. Both give the same tolerance-ESS here. Gated:
    Mamba's form, each channel its own owner with its output gate folded in as a row scale."""
    from ess_explorer.core import layer as layer_module
    from ess_explorer.core.layer import layer_arrays
    from ess_explorer.core.units import SSMCapture

    ssm = mamba_like(40, 64, 16)
    gate = {"owner": torch.arange(40), "row_scale": torch.rand(40, 64, dtype=torch.float64) + 0.5} if gated else {}
    capture = SSMCapture(
        layer=0, family="mamba", state_size=16, realize=lambda index: ssm[index], shape=(40, 64), **gate
    )
    monkeypatch.setattr(layer_module, "FACTORED_CHUNK_BYTES", 8 * 64 * 16**2 * 8)  # 8 units per sweep chunk
    calls = {}
    results = {}
    for precision in ("ess", "exact"):
        calls[precision] = []
        results[precision] = layer_arrays(
            capture,
            np.arange(64),
            tol=1e-3,
            relative=True,
            precision=precision,
            on_chunk=lambda done, total, seen=calls[precision]: seen.append(done),
        )
    assert calls == {"ess": [40], "exact": [8, 16, 24, 32, 40]}
    np.testing.assert_array_equal(results["ess"]["tolerance_ess"], results["exact"]["tolerance_ess"])


def test_the_recent_rows_kernel_matches_its_torch_reference():
    """core/recent_kernel.py's compiled kernel against `reference`, at every cut of heads that
    keep a few rows, need more than N (P_t itself), have exact resets, write nothing (a zero
    Gram) or overflowed (inf weights: P_t, which the caller redoes): the same sizes, the same
    window Grams and the same left-out mass, in the same order of operations, so bit for bit;
    the norms (which only scale the error bound) to rounding."""
    from ess_explorer.core import recent_kernel

    if not recent_kernel.available():
        pytest.skip("numba is not installed")
    heads = one_decay_heads(units=8, length=120, state=40)
    a, b = heads.a[..., 0].clone(), heads.b.clone()
    b[3] = 0.0  # writes nothing
    b[4, 70] = 1e300  # overflows from t = 71 on
    recent = recent_kernel.RecentRows(a, b)
    n, p = heads.state_size, torch.zeros(8, 40, 40, dtype=torch.float64)
    kinds = set()
    for t in range(1, heads.length + 1):
        p = (a[:, t - 1, None, None] ** 2) * p + b[:, t - 1, :, None] * b[:, t - 1, None, :]
        fast, slow = torch.full((2, 8, n, n), float("nan"), dtype=torch.float64)
        sizes, left_out, norms = recent.grams(t, p, fast, 1e-18)
        ref_sizes, ref_left_out, ref_norms = recent_kernel.reference(
            t, recent.a, recent.weights, recent.trace, recent.rows, recent.first, 1e-18, p, slow
        )
        assert torch.equal(sizes, ref_sizes) and torch.equal(left_out, ref_left_out)
        torch.testing.assert_close(norms, ref_norms, rtol=1e-13, atol=0, equal_nan=True)
        for unit, w in enumerate(sizes.tolist()):
            assert torch.equal(fast[unit, :w, :w], slow[unit, :w, :w])
            kinds.add("whole" if w == n and t > n else "window" if w < min(t, n) else "all rows")
    assert kinds == {"whole", "window", "all rows"}
