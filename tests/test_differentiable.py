"""Differentiable ESS (core/differentiable.py): gradients through the dense and the factored
routes, checked by finite differences, and the two routes against each other and against the
engine's own (gradient-free) counts."""

import pytest
import torch

from ess_explorer.core.differentiable import (
    differentiable_singular_values,
    entropy_ess_grad,
    soft_tolerance_ess,
)
from ess_explorer.core.ess import entropy_ess, tolerance_ess
from ess_explorer.core.operators import DPLRSSM, DiagonalSSM

L, N = 6, 3  # N = L / 2: every cut is full rank, so no zero singular value spoils a gradient


def _ssm_fields(seed: int = 0, units: int = 2):
    """a in (0.3, 0.9), b and c Gaussian: generic, so the singular values of every cut are
    distinct and nonzero (where SVD gradients exist)."""
    gen = torch.Generator().manual_seed(seed)
    a = 0.3 + 0.6 * torch.rand(units, L, N, generator=gen, dtype=torch.float64)
    b = torch.randn(units, L, N, generator=gen, dtype=torch.float64)
    c = torch.randn(units, L, N, generator=gen, dtype=torch.float64)
    return a.requires_grad_(), b.requires_grad_(), c.requires_grad_()


def _dense(seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, L, L, generator=gen, dtype=torch.float64).tril().requires_grad_()


def test_gradcheck_dense_entropy_and_soft_tolerance():
    # Only the lower triangle enters; the upper entries are kept at zero by the function so
    # that gradcheck's perturbations stay causal.
    def entropy(t):
        return entropy_ess_grad(t.tril())

    def soft(t):
        return soft_tolerance_ess(t.tril(), tol=0.3, temperature=0.5)

    assert torch.autograd.gradcheck(entropy, (_dense(),))
    assert torch.autograd.gradcheck(soft, (_dense(),))


def test_gradcheck_factored_entropy_and_soft_tolerance():
    def entropy(a, b, c):
        return entropy_ess_grad(DiagonalSSM(a, b, c))

    def soft(a, b, c):
        return soft_tolerance_ess(DiagonalSSM(a, b, c), tol=0.3, temperature=0.5)

    assert torch.autograd.gradcheck(entropy, _ssm_fields())
    assert torch.autograd.gradcheck(soft, _ssm_fields(seed=3))


def test_gradcheck_factored_with_fewer_modes_than_the_cut():
    # N = 2 < min(t, L - t) = 3 at t = 3: the factored route holds only the two nonzero values
    gen = torch.Generator().manual_seed(5)
    a = (0.3 + 0.6 * torch.rand(1, L, 2, generator=gen, dtype=torch.float64)).requires_grad_()
    b = torch.randn(1, L, 2, generator=gen, dtype=torch.float64).requires_grad_()
    c = torch.randn(1, L, 2, generator=gen, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda *f: entropy_ess_grad(DiagonalSSM(*f)), (a, b, c))


def test_factored_and_dense_routes_agree_in_values_and_gradients():
    a, b, c = _ssm_fields(seed=7)
    ssm = DiagonalSSM(a, b, c)
    for fn in (entropy_ess_grad, lambda op: soft_tolerance_ess(op, tol=0.2, temperature=0.3)):
        factored, dense = fn(ssm), fn(ssm.materialize())
        torch.testing.assert_close(factored, dense, rtol=1e-10, atol=1e-12)
        weights = torch.arange(1.0, 1 + factored.numel(), dtype=torch.float64).reshape(factored.shape)
        grads_f = torch.autograd.grad((weights * factored).sum(), (a, b, c))
        grads_d = torch.autograd.grad((weights * dense).sum(), (a, b, c))
        for gf, gd in zip(grads_f, grads_d):
            assert gf.abs().max() > 0
            torch.testing.assert_close(gf, gd, rtol=1e-8, atol=1e-10)


def test_values_match_the_engine():
    a, b, c = (x.detach() for x in _ssm_fields(seed=11))
    ssm = DiagonalSSM(a, b, c)
    torch.testing.assert_close(entropy_ess_grad(ssm), entropy_ess(ssm).to(torch.float64), rtol=1e-10, atol=1e-12)
    dense = _dense(seed=12).detach()
    torch.testing.assert_close(entropy_ess_grad(dense), entropy_ess(dense), rtol=1e-10, atol=1e-12)
    # at a small temperature the surrogate is the count, unless a value sits near tau
    sigma = differentiable_singular_values(ssm)
    ratio = sigma[..., 1:] / sigma[..., :1].clamp_min(1e-300)
    tol = 0.05
    assert ((ratio - tol).abs() > 0.01).all(), "test operator has a value too close to tau"
    soft = soft_tolerance_ess(ssm, tol=tol, temperature=1e-3)
    torch.testing.assert_close(soft, tolerance_ess(ssm, tol=tol).to(torch.float64), rtol=0, atol=1e-6)


def test_positions_and_padding():
    a, b, c = (x.detach() for x in _ssm_fields())
    ssm = DiagonalSSM(a, b, c)
    sigma = differentiable_singular_values(ssm, positions=[0, 1, 3])
    assert sigma.shape == (2, 3, N)
    assert (sigma[:, 0] == 0).all()  # no past at t = 0
    assert (sigma[:, 1, 1:] == 0).all()  # one past input: rank 1
    dense_sigma = differentiable_singular_values(ssm.materialize(), positions=[0, 1, 3])
    torch.testing.assert_close(sigma, dense_sigma, rtol=1e-10, atol=1e-12)


def test_a_training_step_moves_entropy_ess_the_way_asked():
    a, b, c = _ssm_fields(seed=2, units=1)
    before = entropy_ess_grad(DiagonalSSM(a, b, c)).sum()
    before.backward()
    with torch.no_grad():
        b_next, c_next = b - 1e-2 * b.grad, c - 1e-2 * c.grad
    after = entropy_ess_grad(DiagonalSSM(a.detach(), b_next, c_next)).sum()
    assert after < before


def test_bad_input_is_refused_clearly():
    with pytest.raises(ValueError, match="numpy array has no gradient"):
        entropy_ess_grad(_dense().detach().numpy())
    with pytest.raises(ValueError, match="lower triangular"):
        entropy_ess_grad(torch.ones(L, L, dtype=torch.float64))
    dplr = DPLRSSM(
        a=torch.full((L, 2), 0.5, dtype=torch.float64),
        p=torch.zeros(L, 2, 1, dtype=torch.float64),
        q=torch.zeros(L, 2, 1, dtype=torch.float64),
        b=torch.ones(L, 2, dtype=torch.float64),
        c=torch.ones(L, 2, dtype=torch.float64),
    )
    with pytest.raises(ValueError, match="DPLRSSM: materialise it"):
        entropy_ess_grad(dplr)
    with pytest.raises(ValueError, match="temperature"):
        soft_tolerance_ess(_dense(), temperature=0)
    with pytest.raises(ValueError, match="tol must be > 0"):
        soft_tolerance_ess(_dense(), tol=0.0, relative=False)
    with pytest.raises(ValueError, match="positions must lie"):
        entropy_ess_grad(_dense(), positions=[L])
