"""The ESS core: closed forms, factored == dense, properties and bad input."""

import numpy as np
import pytest
import torch
from _contracts import assert_spectra_match
from hypothesis import given, settings
from hypothesis import strategies as st

from ess_explorer import DiagonalSSM, aggregate_units, entropy_ess, hankel_singular_values, tolerance_ess
from ess_explorer.synthetic import convolution, diagonal_ssm, linear_attention, softmax_attention

TIGHT = 1e-9  # relative tolerance far above float64 noise, far below any generic singular value


def cut_bound(length):
    t = np.arange(length)
    return np.minimum(t, length - t)


# ---- closed forms (docs/math.md) ---------------------------------------------------------


@pytest.mark.parametrize("key_size", [1, 3, 8])
def test_linear_attention_ess_is_min_of_key_size_and_cut(key_size):
    length = 40
    op = linear_attention(length, key_size, units=2, seed=key_size)
    expected = np.minimum(key_size, cut_bound(length))
    for operator in (op, op.materialize()):
        ess = tolerance_ess(operator, tol=TIGHT).numpy()
        np.testing.assert_array_equal(ess, np.broadcast_to(expected, ess.shape))


def test_a_scalar_decay_operator_is_the_recurrence_on_every_impulse(monkeypatch):
    """materialize's route for a decay shared by the modes (Mamba2: core/operators.py)
    against the recurrence itself (`apply`) on each impulse, with an exact reset (a = 0), no
    decay (a = 1) and a skip d on the diagonal."""
    from ess_explorer.core import operators

    g = torch.Generator().manual_seed(7)
    units, length, n = 3, 30, 5
    a = torch.rand(units, length, 1, generator=g, dtype=torch.float64)
    a[0, 12], a[1] = 0.0, 1.0
    b, c = (torch.randn(units, length, n, generator=g, dtype=torch.float64) for _ in range(2))
    d = torch.randn(units, length, generator=g, dtype=torch.float64)
    calls = []
    real = operators._scalar_decay_operator
    monkeypatch.setattr(operators, "_scalar_decay_operator", lambda *x: calls.append(1) or real(*x))
    dense = DiagonalSSM(a.expand(units, length, n), b, c, d=d).materialize()
    assert calls == [1]
    each = lambda x: x[:, None].expand(units, length, *x.shape[1:])  # noqa: E731  one copy per impulse
    impulses = DiagonalSSM(each(a.expand(units, length, n)), each(b), each(c), d=each(d))
    columns = impulses.apply(torch.eye(length, dtype=torch.float64).expand(units, length, length))  # [u, j] = T e_j
    torch.testing.assert_close(dense, columns.mT, rtol=1e-12, atol=1e-14)
    assert bool((dense[0, 12:, :12] == 0).all())  # the reset forgets everything before it


@pytest.mark.parametrize("kernel", [2, 4, 7])
def test_convolution_ess_is_kernel_minus_one_away_from_the_ends(kernel):
    length = 48
    ess = tolerance_ess(convolution(length, kernel, units=3, seed=kernel), tol=TIGHT).numpy()
    bound = cut_bound(length)
    interior = bound >= kernel - 1
    assert (ess[:, interior] == kernel - 1).all()
    assert (ess[:, ~interior] == bound[~interior]).all()  # near the ends the cut itself is smaller


def test_time_varying_diagonal_ssm_ess_is_min_of_modes_and_cut():
    length, modes = 50, 5
    ssm = diagonal_ssm(length, modes, units=3, seed=1)
    ess = tolerance_ess(ssm, tol=TIGHT).numpy()
    np.testing.assert_array_equal(ess, np.broadcast_to(np.minimum(modes, cut_bound(length)), ess.shape))


def test_lti_ssm_tolerance_ess_falls_below_its_state_size():
    # Constant fast decays: Hankel singular values decay geometrically, so a relative
    # tolerance of 1e-3 sees fewer than n modes even though rank(H_t) = n.
    length, modes = 64, 8
    a = torch.linspace(0.05, 0.6, modes, dtype=torch.float64).expand(length, modes)
    ones = torch.ones(length, modes, dtype=torch.float64)
    ssm = DiagonalSSM(a, ones, ones)
    middle = length // 2
    assert tolerance_ess(ssm, tol=1e-14)[middle] == modes
    assert tolerance_ess(ssm, tol=1e-3)[middle] < modes
    entropy = entropy_ess(ssm)
    assert (entropy <= modes).all() and entropy[middle] < tolerance_ess(ssm, tol=1e-3)[middle]


def test_softmax_attention_is_generically_full_rank():
    length = 32
    ess = tolerance_ess(softmax_attention(length, units=2, seed=3), tol=TIGHT).numpy()
    np.testing.assert_array_equal(ess, np.broadcast_to(cut_bound(length), ess.shape))


def test_entropy_ess_of_equal_singular_values_is_their_count():
    sigma = torch.tensor([[0.0, 0.0, 0.0], [2.0, 2.0, 0.0], [1.0, 1.0, 1.0], [5.0, 0.0, 0.0]], dtype=torch.float64)
    np.testing.assert_allclose(entropy_ess(spectra=sigma[None]).numpy()[0], [0.0, 2.0, 3.0, 1.0])


@pytest.mark.parametrize("scale", [8.98846567e307, 1e-320])  # near the float64 maximum; subnormal
@pytest.mark.parametrize("grad", [False, True])
def test_entropy_ess_does_not_see_the_scale_even_at_the_ends_of_float64(scale, grad):
    """sigma log sigma overflows near the float64 maximum (it gave NaN); the entropy of
    equal values is still their count, with or without the gradient's formula."""
    sigma = torch.tensor([[[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]], dtype=torch.float64) * scale
    sigma.requires_grad_(grad)
    np.testing.assert_allclose(entropy_ess(spectra=sigma).detach().numpy()[0], [2.0, 1.0], rtol=1e-12)


def test_relative_and_absolute_tolerance():
    sigma = torch.tensor([[[10.0, 1.0, 0.05]]], dtype=torch.float64)
    assert tolerance_ess(spectra=sigma, tol=0.01, relative=True).item() == 2  # threshold 0.1
    assert tolerance_ess(spectra=sigma, tol=0.01, relative=False).item() == 3  # threshold 0.01
    assert tolerance_ess(spectra=sigma, tol=1.0, relative=False).item() == 1  # strictly above


# ---- factored path == dense path ------------------------------------------------------


def random_ssm(length, modes, units, seed, decay_low, decay_high, lti=False):
    g = torch.Generator().manual_seed(seed)
    shape = (units, 1 if lti else length, modes)
    a = decay_low + (decay_high - decay_low) * torch.rand(shape, generator=g, dtype=torch.float64)
    b = torch.randn(shape, generator=g, dtype=torch.float64)
    c = torch.randn(shape, generator=g, dtype=torch.float64)
    expand = lambda x: x.expand(units, length, modes)  # noqa: E731
    return DiagonalSSM(expand(a), expand(b), expand(c), torch.randn(units, length, generator=g, dtype=torch.float64))


@pytest.mark.parametrize(
    "length, modes, low, high, lti",
    [
        (64, 4, 0.3, 0.99, False),
        (96, 8, 1e-6, 1e-2, False),  # decays very close to 0: state emptied almost every step
        (96, 8, 0.999, 1.0, False),  # decays very close to 1: a near-perfect integrator
        (80, 6, 0.2, 0.9, True),  # LTI: Hankel values decay fast, down to ~1e-10 sigma_1
        (128, 16, 0.5, 0.999, False),
    ],
)
def test_factored_matches_dense_svd(length, modes, low, high, lti):
    ssm = random_ssm(length, modes, units=2, seed=length + modes, decay_low=low, decay_high=high, lti=lti)
    dense = hankel_singular_values(ssm.materialize(), method="svd")
    assert_spectra_match(hankel_singular_values(ssm), dense)


def test_factored_keeps_values_that_squaring_would_lose():
    """The LTI case has singular values between 1e-13 and 1e-9 of sigma_1: a Gramian
    eig(W_c W_o) would return noise of size ~1e-8 * sigma_1 there; the sweeps must not."""
    ssm = random_ssm(80, 8, units=1, seed=7, decay_low=0.1, decay_high=0.5, lti=True)
    dense = hankel_singular_values(ssm.materialize(), method="svd")
    ratio = dense[..., :8] / dense[..., :1].clamp_min(1e-300)
    assert ((ratio > 1e-13) & (ratio < 1e-9)).any(), "the test case must contain tiny singular values"
    assert_spectra_match(hankel_singular_values(ssm), dense)


@pytest.mark.slow
def test_factored_matches_dense_at_length_512():
    ssm = random_ssm(512, 8, units=1, seed=11, decay_low=0.8, decay_high=1.0)
    dense = hankel_singular_values(ssm.materialize(), method="auto")
    assert_spectra_match(hankel_singular_values(ssm), dense)


def test_factored_handles_exact_zero_decays():
    # a = 0 at a separator: nothing crosses it, so every cut that straddles it has ESS 0.
    ssm = diagonal_ssm(40, 4, units=2, seed=5, resets=[20])
    ess = tolerance_ess(ssm, tol=TIGHT)
    assert (ess[:, 20] == 0).all() and (ess[:, 21] > 0).all()
    assert_spectra_match(hankel_singular_values(ssm), hankel_singular_values(ssm.materialize(), method="svd"))


def test_dense_auto_equals_svd():
    op = torch.cat([softmax_attention(64, units=1, seed=2), diagonal_ssm(64, 4, seed=3).materialize()])
    auto = hankel_singular_values(op, method="auto")
    exact = hankel_singular_values(op, method="svd")
    assert ((auto - exact).abs() <= 1e-9 * exact + 1e-13 * exact[..., :1]).all()


def test_positions_stride_and_top_k_select_rows_and_columns():
    op = softmax_attention(30, units=2, seed=4)
    full = hankel_singular_values(op)
    assert full.shape == (2, 30, 15)
    torch.testing.assert_close(hankel_singular_values(op, stride=4), full[:, ::4])
    torch.testing.assert_close(hankel_singular_values(op, positions=[3, 17]), full[:, [3, 17]])
    torch.testing.assert_close(hankel_singular_values(op, top_k=3), full[..., :3])
    ssm = diagonal_ssm(30, 4, units=2, seed=4)
    torch.testing.assert_close(
        hankel_singular_values(ssm, positions=[0, 5, 29, 5]), hankel_singular_values(ssm)[:, [0, 5, 29, 5]]
    )


def test_batch_dimensions_are_kept():
    op = softmax_attention(12, units=6, seed=1).reshape(2, 3, 12, 12)
    sigma = hankel_singular_values(op)
    assert sigma.shape == (2, 3, 12, 6)
    torch.testing.assert_close(sigma[1, 2], hankel_singular_values(op[1, 2]))
    assert tolerance_ess(op).shape == (2, 3, 12) and entropy_ess(op).shape == (2, 3, 12)


def test_numpy_and_float32_inputs():
    op = softmax_attention(16, seed=0)[0]
    from_numpy = tolerance_ess(op.numpy().astype(np.float32))
    torch.testing.assert_close(from_numpy, tolerance_ess(op))


def test_aggregate_units():
    ess = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    torch.testing.assert_close(aggregate_units(ess, "mean"), torch.tensor([2.0, 4.0], dtype=torch.float64))
    torch.testing.assert_close(aggregate_units(ess, "sum"), torch.tensor([4.0, 8.0], dtype=torch.float64))
    torch.testing.assert_close(aggregate_units(ess, "max"), torch.tensor([3.0, 6.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="how must be one of"):
        aggregate_units(ess, "median")


# ---- properties -----------------------------------------------------------------------

lower_triangular = st.integers(2, 14).flatmap(
    lambda n: st.lists(st.floats(-10, 10, allow_nan=False), min_size=n * n, max_size=n * n).map(
        lambda values: np.tril(np.array(values).reshape(n, n))
    )
)


@settings(max_examples=60, deadline=None)
@given(lower_triangular, st.floats(1e-3, 1e3))
def test_properties_of_both_ess(op, scale):
    length = op.shape[0]
    tol_ess = tolerance_ess(op).numpy()
    ent_ess = entropy_ess(op).numpy()
    bound = cut_bound(length)
    assert tol_ess[0] == 0 and ent_ess[0] == 0
    assert (tol_ess >= 0).all() and (tol_ess <= bound).all()
    assert (ent_ess >= 0).all() and (ent_ess <= bound + 1e-9).all()
    nonzero = ent_ess > 0
    assert (ent_ess[nonzero] >= 1 - 1e-9).all()
    np.testing.assert_array_equal(tolerance_ess(op * scale).numpy(), tol_ess)  # relative tol: scale-free
    np.testing.assert_allclose(entropy_ess(op * scale).numpy(), ent_ess, rtol=1e-9, atol=1e-12)


# ---- bad input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.zeros((3, 4)), "square"),
        (np.zeros(5), "shape"),
        (np.array([[1.0, 0.0], [np.nan, 1.0]]), "NaN or infinite"),
        (np.array([[1.0, 0.5], [0.0, 1.0]]), r"not lower triangular.*\(0, 1\).*0.5"),
        ("not an array", "numpy array or a torch tensor"),
        (np.zeros((3, 3), dtype=np.int64), "floating-point"),
    ],
)
def test_bad_operators_raise_clear_errors(bad, message):
    with pytest.raises(ValueError, match=message):
        hankel_singular_values(bad)


@pytest.mark.parametrize("length", [1, 2, 63, 64, 65, 130])
def test_one_bad_entry_anywhere_is_found_by_the_band_checks(length):
    # validate_operator reads an operator band by band (checks.largest_above_diagonal), never
    # as a masked copy: one entry above the diagonal, or one NaN / inf, must show wherever it
    # sits: on a band's edge, in its diagonal block, in the last unit of a batch.
    from ess_explorer.core.checks import all_finite, largest_above_diagonal

    base = torch.randn(3, length, length, dtype=torch.float64, generator=torch.Generator().manual_seed(length)).tril()
    assert all_finite(base) and largest_above_diagonal(base) == 0.0
    spots = [(i, j) for i in (0, 62, 63, 64, length - 2) for j in (i + 1, 64, 65, length - 1) if 0 <= i < j < length]
    for unit in (0, 2):
        for i, j in spots:
            bad = base.clone()
            bad[unit, i, j] = -2.5
            assert largest_above_diagonal(bad, rows=64) == torch.triu(bad, 1).abs().max().item() == 2.5
            with pytest.raises(ValueError, match=rf"not lower triangular.*\({unit}, {i}, {j}\)"):
                hankel_singular_values(bad)
        for value in (float("nan"), float("inf"), -float("inf")):
            bad = base.clone()
            bad[unit, length - 1, 0] = value
            assert not all_finite(bad)
            with pytest.raises(ValueError, match="NaN or infinite"):
                hankel_singular_values(bad)


def test_bad_ssm_and_options_raise_clear_errors():
    x = torch.ones(2, 5, 3)
    with pytest.raises(ValueError, match="share one shape"):
        DiagonalSSM(x, x, torch.ones(2, 5, 4))
    with pytest.raises(ValueError, match=r"d must have shape \(\*batch, L\)"):
        DiagonalSSM(x, x, x, torch.ones(2, 4))
    with pytest.raises(ValueError, match="NaN or infinite"):
        DiagonalSSM(x * float("inf"), x, x)
    op = softmax_attention(8)[0]
    with pytest.raises(ValueError, match="tol must be"):
        tolerance_ess(op, tol=-1.0)
    with pytest.raises(ValueError, match="positions must lie"):
        hankel_singular_values(op, positions=[8])
    with pytest.raises(ValueError, match="method must be"):
        hankel_singular_values(op, method="eig")
    with pytest.raises(ValueError, match="non-negative"):
        entropy_ess(spectra=-torch.ones(4, 2, dtype=torch.float64))


def test_square_spectra_are_read_as_spectra_when_said_so():
    # 16 strided cuts of an N = 16 model give a 16 x 16 spectra array: not an operator.
    ssm = diagonal_ssm(64, 16, seed=2)
    sigma = hankel_singular_values(ssm, stride=4)[0]
    assert sigma.shape == (16, 16)
    expected = tolerance_ess(ssm, tol=TIGHT)[0, ::4]
    torch.testing.assert_close(tolerance_ess(spectra=sigma, tol=TIGHT), expected)
    with pytest.raises(ValueError, match="not lower triangular"):
        tolerance_ess(sigma, tol=TIGHT)  # inferred as an operator, and rejected as one


@pytest.mark.parametrize("rotations", [False, True])
def test_rank_one_update_of_a_triangular_factor(rotations):
    from ess_explorer.core.sweeps import _rank_one_update_upper

    g = torch.Generator().manual_seed(0)
    r = torch.randn(5, 6, 6, generator=g, dtype=torch.float64).triu()
    r[0, 2, :] = 0.0  # a zero row (a decay of exactly 0 zeroes a column, then a row pivot)
    x = torch.randn(5, 6, generator=g, dtype=torch.float64)
    expected = r.mT @ r + x[:, :, None] * x[:, None, :]
    updated = _rank_one_update_upper(r.clone(), x.clone(), rotations)
    torch.testing.assert_close(updated.mT @ updated, expected)
    assert (updated.tril(-1) == 0).all()


def test_rotation_sweep_equals_qr_sweep():
    # The GPU uses Givens rotations, the CPU a batched QR: both must give the same spectra.
    from ess_explorer.core.sweeps import _sweep_chunk

    ssm = random_ssm(40, 5, units=3, seed=3, decay_low=0.0, decay_high=1.0)
    wanted = torch.arange(1, 40)
    by_qr = _sweep_chunk(ssm.a, ssm.b, ssm.c, wanted, rotations=False)
    by_rotations = _sweep_chunk(ssm.a, ssm.b, ssm.c, wanted, rotations=True)
    torch.testing.assert_close(by_rotations, by_qr, rtol=1e-9, atol=1e-12 * by_qr.max().item())


def test_finite_spectra_sees_nan_and_inf_anywhere():
    """The engine's one-pass finiteness check of its spectra (core/checks.py): a NaN or an
    infinity anywhere, the last cut's last value included, is seen; zeros and empty are fine."""
    from ess_explorer.core.checks import finite_spectra

    sigma = torch.rand(3, 40, 8, dtype=torch.float64)
    assert finite_spectra(sigma) and finite_spectra(torch.zeros(2, 0, 3)) and finite_spectra(torch.zeros(2, 5, 3))
    for bad in (float("nan"), float("inf")):
        for where in ((0, 0, 0), (2, 39, 7), (1, 17, 3)):
            spoiled = sigma.clone()
            spoiled[where] = bad
            assert not finite_spectra(spoiled), (bad, where)


@pytest.mark.parametrize("scope", ["cut", "unit", "layer"])
def test_spectra_counted_and_their_entropy_taken_in_blocks_equal_one_pass(scope, monkeypatch):
    """core/ess.py takes a layer's spectra in blocks of rows on a CPU; with blocks of 10 values
    (uneven: 7 rows of 6 values per 3 units x 7 cuts = 21 rows) every count and entropy equals
    the direct formulas, all-zero cuts included."""
    from ess_explorer.core import ess

    g = torch.Generator().manual_seed(3)
    sigma = torch.rand(3, 7, 6, generator=g, dtype=torch.float64).sort(-1, descending=True).values
    sigma = sigma * torch.logspace(0, -5, 6, dtype=torch.float64)
    sigma[1, 2] = 0.0  # an all-zero cut
    sigma[2, :, 3:] = 0.0  # a zero tail
    reference = ess.tolerance_reference(sigma, scope)
    counts = (sigma > 1e-3 * reference).sum(-1)
    p = sigma / sigma.sum(-1, keepdim=True).clamp_min(1e-300)
    entropy = torch.where(sigma.sum(-1) > 0, torch.exp(-torch.special.xlogy(p, p).sum(-1)), 0.0)
    monkeypatch.setattr(ess, "BLOCK_VALUES", 10)
    assert torch.equal(ess.count_above_tolerance(sigma, 1e-3, True, scope), counts)
    assert torch.equal(ess.count_above_tolerance(sigma, 1e-2, False, "cut"), (sigma > 1e-2).sum(-1))
    torch.testing.assert_close(ess.entropy_of(sigma), entropy, rtol=1e-13, atol=0)
    assert ess.entropy_of(sigma)[1, 2] == 0 and ess.entropy_of(sigma[..., :0]).shape == (3, 7)
