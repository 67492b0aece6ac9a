"""DPLRSSM: diagonal-plus-low-rank transitions (the delta rule) on the factored path."""

import pytest
import torch
from _contracts import assert_exact_contract, assert_spectra_match

from ess_explorer import DPLRSSM, DiagonalSSM, entropy_ess, hankel_singular_values, tolerance_ess


def uniform(g, shape, low, high):
    return low + (high - low) * torch.rand(shape, generator=g, dtype=torch.float64)


def gated_delta(length, modes, units, seed, alpha, beta, per_key=False):
    """A_t = alpha_t (I - beta_t k k^T) with ||k|| = 1 (Gated DeltaNet), or
    (I - beta_t k k^T) diag(alpha_t) with per-key alpha (KDA). alpha, beta: (low, high)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.nn.functional.normalize(torch.randn(units, length, modes, generator=g, dtype=torch.float64), dim=-1)
    step_beta = uniform(g, (units, length, 1), *beta)
    if per_key:
        decay = uniform(g, (units, length, modes), *alpha)
        p, q = -step_beta * k, decay * k
    else:
        decay = uniform(g, (units, length, 1), *alpha).expand(units, length, modes)
        p, q = -decay * step_beta * k, k
    b = step_beta * k
    c = torch.randn(units, length, modes, generator=g, dtype=torch.float64) / modes**0.5
    return DPLRSSM(
        decay, p[..., None], q[..., None], b, c, torch.randn(units, length, generator=g, dtype=torch.float64)
    )


def random_dplr(length, modes, rank, units, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (units, length, modes)
    low = (units, length, modes, rank)
    scale = 0.5 / modes**0.5
    return DPLRSSM(
        uniform(g, shape, 0.2, 0.95),
        scale * torch.randn(low, generator=g, dtype=torch.float64),
        scale * torch.randn(low, generator=g, dtype=torch.float64),
        torch.randn(shape, generator=g, dtype=torch.float64),
        torch.randn(shape, generator=g, dtype=torch.float64),
        torch.randn(units, length, generator=g, dtype=torch.float64),
    )


def explicit_operator(ssm: DPLRSSM) -> torch.Tensor:
    """T[i, j] = c_i . A_i ... A_{j+1} b_j (+ d_i) from dense transition matrices (one unit)."""
    length = ssm.length
    transitions = torch.diag_embed(ssm.a) + ssm.p @ ssm.q.transpose(-1, -2)  # (L, N, N)
    dense = torch.zeros(length, length, dtype=torch.float64)
    for j in range(length):
        state = ssm.b[j]
        for i in range(j, length):
            if i > j:
                state = transitions[i] @ state
            dense[i, j] = ssm.c[i] @ state
    return dense + torch.diag(ssm.d)


def test_materialize_matches_explicit_products_and_apply():
    ssm = random_dplr(12, 4, 2, units=2, seed=0)
    dense = ssm.materialize()
    for unit in range(2):
        torch.testing.assert_close(dense[unit], explicit_operator(ssm[unit]), rtol=1e-12, atol=1e-12)
    u = torch.randn(2, 12, dtype=torch.float64)
    torch.testing.assert_close(ssm.apply(u), (dense @ u[..., None])[..., 0], rtol=1e-12, atol=1e-12)


def test_rank_zero_is_the_diagonal_ssm():
    g = torch.Generator().manual_seed(3)
    a, b, c = (torch.rand(2, 40, 6, generator=g, dtype=torch.float64) for _ in range(3))
    empty = torch.zeros(2, 40, 6, 0, dtype=torch.float64)
    dplr, diagonal = DPLRSSM(a, empty, empty, b, c), DiagonalSSM(a, b, c)
    torch.testing.assert_close(dplr.materialize(), diagonal.materialize(), rtol=0, atol=0)
    torch.testing.assert_close(hankel_singular_values(dplr), hankel_singular_values(diagonal), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize(
    "alpha, beta, per_key",
    [
        ((0.3, 0.99), (0.0, 1.0), False),  # generic Gated DeltaNet
        ((0.999, 1.0), (1e-4, 1e-3), False),  # A_t close to I: every eigenvalue near 1
        ((0.999, 1.0), (0.999, 1.0), False),  # a projection: one eigenvalue near 0, the rest near 1
        ((1e-6, 1e-2), (0.2, 0.8), False),  # decays near 0: state emptied almost every step
        ((0.9, 1.0), (1.95, 2.0), False),  # beta up to 2 (negative eigenvalues, OLMo hybrid): near -1
        ((0.5, 1.0), (0.0, 1.0), True),  # KDA: per-key decay
    ],
)
def test_delta_rule_spectra_match_dense_svd(alpha, beta, per_key):
    ssm = gated_delta(80, 8, units=2, seed=int(100 * beta[1]), alpha=alpha, beta=beta, per_key=per_key)
    dense = hankel_singular_values(ssm.materialize(), method="svd")
    assert_spectra_match(hankel_singular_values(ssm), dense)


def test_generic_rank_two_spectra_match_dense_svd():
    ssm = random_dplr(64, 6, 2, units=3, seed=5)
    dense = hankel_singular_values(ssm.materialize(), method="svd")
    assert_spectra_match(hankel_singular_values(ssm), dense)


def test_length_512_matches_dense():
    ssm = gated_delta(512, 8, units=1, seed=11, alpha=(0.9, 1.0), beta=(0.0, 1.0))
    dense = hankel_singular_values(ssm.materialize(), method="auto")
    assert_spectra_match(hankel_singular_values(ssm), dense)


def test_both_ess_variants_accept_a_dplr_operator():
    ssm = gated_delta(48, 6, units=2, seed=2, alpha=(0.5, 1.0), beta=(0.0, 1.0))
    dense = ssm.materialize()
    assert torch.equal(tolerance_ess(ssm), tolerance_ess(dense))
    torch.testing.assert_close(entropy_ess(ssm), entropy_ess(dense), rtol=1e-9, atol=1e-12)
    assert torch.equal(tolerance_ess(ssm, positions=[0, 5, 40]), tolerance_ess(dense)[:, [0, 5, 40]])


def test_indexing_and_to():
    ssm = random_dplr(10, 3, 1, units=4, seed=1)
    assert ssm.batch_shape == (4,) and ssm.length == 10 and ssm.state_size == 3 and ssm.rank == 1
    torch.testing.assert_close(ssm[2].materialize(), ssm.materialize()[2])
    assert ssm.to(torch.float32).a.dtype == torch.float32


def test_bad_inputs_are_clear_value_errors():
    a = torch.rand(2, 10, 4, dtype=torch.float64)
    pq = torch.rand(2, 10, 4, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match="p and q must both have shape"):
        DPLRSSM(a, pq, pq[..., :3, :], a, a)
    with pytest.raises(ValueError, match="p and q must both have shape"):
        DPLRSSM(a, pq[..., 0], pq[..., 0], a, a)
    with pytest.raises(ValueError, match="a, b and c must share one shape"):
        DPLRSSM(a, pq, pq, a[:, :5], a)
    with pytest.raises(ValueError, match="d must have shape"):
        DPLRSSM(a, pq, pq, a, a, torch.zeros(2, 9, dtype=torch.float64))
    bad = pq.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="p contains NaN"):
        DPLRSSM(a, bad, pq, a, a)
    with pytest.raises(ValueError, match="real floating-point"):
        DPLRSSM(a.to(torch.complex128), pq, pq, a, a)
    with pytest.raises(ValueError, match="real floating-point"):
        DPLRSSM(torch.ones(2, 10, 4, dtype=torch.long), pq, pq, a, a)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_scan_and_sweep_of_a_delta_rule_match_the_cpu():
    ssm = gated_delta(256, 16, units=4, seed=13, alpha=(0.9, 1.0), beta=(0.0, 1.0))
    cpu = hankel_singular_values(ssm)
    for method in ("auto", "sweep"):  # auto: the scan on a GPU
        assert_spectra_match(hankel_singular_values(ssm, device="cuda", method=method).cpu(), cpu)


def test_causal_ess_of_a_delta_rule_is_the_rank_of_its_reachability_matrix():
    from ess_explorer.core.causal import reachability_singular_values

    ssm = gated_delta(24, 5, units=2, seed=21, alpha=(0.5, 1.0), beta=(0.0, 1.0))
    sigma = reachability_singular_values(ssm, torch.arange(24))
    for unit in range(2):
        a, p, q, b = (x[unit] for x in (ssm.a, ssm.p, ssm.q, ssm.b))
        reach = torch.zeros(5, 0, dtype=torch.float64)
        for t in range(1, 24):  # R_t = [A_{t-1} R_{t-1}, b_{t-1}]
            transition = torch.diag(a[t - 1]) + p[t - 1] @ q[t - 1].T
            reach = torch.cat([transition @ reach, b[t - 1][:, None]], dim=1)
            expected = torch.linalg.svdvals(reach)
            width = min(5, t)
            torch.testing.assert_close(sigma[unit, t, :width], expected[:width], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("rank", [0, 1])
def test_one_sweep_gives_the_spectra_and_the_reachability_spectra(rank):
    """causal=True reads sigma(R_t) off the sweep's forward half: the same values as the
    separate forward sweep of core/causal.py, and the same Hankel spectra as without it."""
    from ess_explorer.core.causal import reachability_singular_values
    from ess_explorer.core.sweeps import factored_hankel_singular_values

    ssm = (
        gated_delta(40, 6, units=3, seed=31, alpha=(0.3, 1.0), beta=(0.0, 1.0)) if rank else random_dplr(40, 6, 0, 3, 7)
    )
    positions = torch.arange(40)
    sigma, reach = factored_hankel_singular_values(ssm, positions=positions, method="sweep", causal=True)
    torch.testing.assert_close(sigma, factored_hankel_singular_values(ssm, positions=positions, method="sweep"))
    torch.testing.assert_close(reach, reachability_singular_values(ssm, positions), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "alpha, beta, per_key",
    [
        ((0.3, 0.99), (0.0, 1.0), False),
        ((0.999, 1.0), (0.999, 1.0), False),  # a projection: eigenvalues near 0 and 1
        ((1e-6, 1e-2), (0.2, 0.8), False),  # decays near 0
        ((0.9, 1.0), (1.95, 2.0), False),  # eigenvalues near -1
        ((0.5, 1.0), (0.0, 1.0), True),  # KDA
    ],
)
def test_the_scan_of_delta_rule_transitions_matches_dense_svd_and_the_sweep(alpha, beta, per_key):
    """The blocked scan (the GPU default) combines DPLR transitions as N x N products within
    each block; its spectra are the dense SVD's and the sweep's, and its forward roots give
    the reachability sweep's causal spectrum."""
    from ess_explorer.core.causal import reachability_singular_values
    from ess_explorer.core.sweeps import factored_hankel_singular_values

    ssm = gated_delta(83, 8, units=2, seed=int(100 * beta[1]) + 1, alpha=alpha, beta=beta, per_key=per_key)
    dense = hankel_singular_values(ssm.materialize(), method="svd")
    positions = torch.arange(ssm.length)
    scan, reach = factored_hankel_singular_values(ssm, positions=positions, method="scan", causal=True)
    assert_spectra_match(scan, dense)
    assert_spectra_match(scan, hankel_singular_values(ssm, method="sweep"))
    reference = reachability_singular_values(ssm, positions)
    assert_exact_contract(reach, reference)


@pytest.mark.parametrize("block", [1, 4, 9, 100])
def test_the_dplr_scan_is_exact_for_any_block_size(block):
    from ess_explorer.core.scan import scan_chunk

    ssm = random_dplr(64, 6, 2, units=3, seed=block)
    wanted = torch.tensor([1, 8, 9, 10, 40, 63])
    dense = hankel_singular_values(ssm.materialize(), method="svd", positions=wanted)
    scan = scan_chunk(ssm.a, ssm.b, ssm.c, wanted, block=block, low_rank=(ssm.p, ssm.q))
    assert_spectra_match(scan, dense)
