"""The blocked Gramian route (core/gramian_blocked.py), the route of every device the compiled
kernel does not run on (a GPU), against its oracle `gramian_spectra_reference`, on the CPU:
the blocking, the scans' order and the launch count need no CUDA."""

from __future__ import annotations

import pytest
import torch
from test_precision import assert_ess_contract, cancelling, decays_at, exact_spectra, mamba_like

from ess_explorer.core import gramian, gramian_blocked
from ess_explorer.core.gramian_blocked import BLOCK, blocked_bytes_per_unit, gramian_spectra_blocked
from ess_explorer.core.gramian_naive import gramian_spectra_reference
from ess_explorer.core.precision import Accuracy


def assert_same_outputs(got, expected, imbalanced: bool = False) -> None:
    """Both routes do the same arithmetic but for the order of the scans' additions: equal to
    rounding, relative to each cut's largest value (within 1e-11 of it: decays near 0 leave
    P_t nearly rank one, and its Cholesky's other pivots rest on the shift of eps tr P alone,
    which amplifies the rounding to about 1e-12); for an imbalanced realisation, whose
    rounding the eigensolve amplifies, within the error bound each route states (the guard
    reads that bound, and it agrees)."""
    torch.testing.assert_close(got[1], expected[1], rtol=1e-10, atol=0)
    largest = expected[0][..., :1].clamp_min(1e-300)
    allowed = 2 * expected[1][..., None] if imbalanced else 1e-11 * largest
    assert bool(((got[0] - expected[0]).abs() <= allowed).all())
    if expected[2] is None:
        assert got[2] is None
        return
    top = expected[2][2][..., None].clamp_min(1e-300)
    assert float(((got[2][0] - expected[2][0]).abs() / top).max()) <= 1e-12
    torch.testing.assert_close(got[2][2], expected[2][2], rtol=1e-12, atol=0)
    torch.testing.assert_close(got[2][3], expected[2][3], rtol=1e-10, atol=0)


@pytest.mark.parametrize(
    ("length", "wanted"),
    [
        (2 * BLOCK + 5, None),  # every cut, a last block of 5
        (BLOCK + 1, None),  # a last block of one cut
        (3 * BLOCK, [1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK, 3 * BLOCK - 1]),  # block edges only
        (40, [7, 33]),  # one block, two cuts
    ],
)
@pytest.mark.parametrize("causal", [False, True])
def test_blocked_route_equals_its_reference(length, wanted, causal):
    ssm = mamba_like(5, length, 6, seed=length)
    cuts = torch.arange(1, length) if wanted is None else torch.tensor(wanted)
    got = gramian_spectra_blocked(ssm.a, ssm.b, ssm.c, cuts, causal)
    assert_same_outputs(got, gramian_spectra_reference(ssm.a, ssm.b, ssm.c, cuts, causal))


@pytest.mark.parametrize(
    ("ssm", "imbalanced"),
    [(decays_at(0.0), False), (decays_at(1.0), False), (cancelling(), True)],
    ids=["near 0", "near 1", "imbalanced"],
)
def test_blocked_route_at_the_edges_of_the_decays_and_an_imbalanced_realisation(ssm, imbalanced):
    """Decays within 1e-6 of 0 and 1, and a realisation whose ||P|| ||Q|| is 1e8 sigma_1^2: the
    same outputs, error bounds included, so the guard makes the same choices."""
    cuts = torch.arange(1, ssm.length)
    assert_same_outputs(
        gramian_spectra_blocked(ssm.a, ssm.b, ssm.c, cuts, True),
        gramian_spectra_reference(ssm.a, ssm.b, ssm.c, cuts, True),
        imbalanced=imbalanced,
    )


def test_the_route_off_the_kernel_meets_the_ess_contract():
    """gramian_hankel_singular_values without the kernel (the GPU's route) against numpy SVDs
    of every cut, the imbalanced realisation's fall-back included."""
    for ssm in (mamba_like(4, 70, 8, seed=3), cancelling()):
        positions = torch.arange(ssm.length)
        sigma = gramian.gramian_hankel_singular_values(ssm, positions=positions, accuracy=Accuracy("ess"), kernel=False)
        assert_ess_contract(sigma, exact_spectra(ssm.materialize())[..., : sigma.shape[-1]])


def test_the_scans_cost_a_few_launches_per_step_whatever_the_number_of_units(monkeypatch):
    """One fused op per scan step over every unit: the count of ops does not grow with the
    units, and stays near 3 L (a forward scan for the checkpoints, the blocks' forward scan
    again and the backward scan)."""
    calls = []
    original = torch.addcmul
    monkeypatch.setattr(gramian_blocked.torch, "addcmul", lambda *a, **k: calls.append(1) or original(*a, **k))
    length = 2 * BLOCK + 9
    counts = []
    for units in (1, 30):
        calls.clear()
        ssm = mamba_like(units, length, 4, seed=units)
        gramian_spectra_blocked(ssm.a, ssm.b, ssm.c, torch.arange(1, length))
        counts.append(len(calls))
    assert counts[0] == counts[1] <= 3 * length


def test_a_mamba_layer_at_2048_is_one_call_within_the_gpu_budget():
    """The stated budget: a Mamba-130m layer (1536 channels, N = 16) at L = 2048 with causal ESS
    fits GPU_BUDGET_BYTES in one call of the blocked route."""
    per_unit = blocked_bytes_per_unit(2048, 2047, 16, causal=True)
    assert 1536 * per_unit <= gramian.GPU_BUDGET_BYTES


def test_a_mamba_layer_at_2048_is_one_chunk_of_layer_arrays_on_a_gpu():
    """On a GPU the Gramian route's outputs stay on the device, and layer_arrays hands it the
    whole Mamba-130m-shaped layer at once (one round of copies to the host per layer); on the
    CPU the chunk keeps its host memory bound. Shapes only: nothing is computed."""
    from ess_explorer.core.layer import _chunk_size
    from ess_explorer.core.units import SSMCapture

    units, length = 1536, 2048
    probe = mamba_like(1, 8, 16)
    capture = SSMCapture(layer=0, family="mamba", state_size=16, realize=lambda index: probe, shape=(units, length))
    path, accuracy = {"method": "scan"}, Accuracy("ess")
    assert _chunk_size(capture, length, 16, path, accuracy, torch.device("cuda")) >= units
    assert _chunk_size(capture, length, 16, path, accuracy, None) < units


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_blocked_route_on_cuda_equals_the_cpu_reference():
    ssm = mamba_like(70, BLOCK + 37, 16, seed=12)
    cuts = torch.arange(1, ssm.length)
    on_gpu = gramian_spectra_blocked(ssm.a.cuda(), ssm.b.cuda(), ssm.c.cuda(), cuts, True)
    got = (on_gpu[0].cpu(), on_gpu[1].cpu(), tuple(x.cpu() for x in on_gpu[2]))
    assert_same_outputs(got, gramian_spectra_reference(ssm.a, ssm.b, ssm.c, cuts, True))


def test_gramians_that_cannot_be_factored_never_reach_the_eigensolver(monkeypatch):
    """A Gramian with a NaN (or one whose Cholesky fails) leaves NaN in its sandwich; cuSOLVER's
    batched solver refuses a whole batch holding one (LinAlgError, the likely cause of a GPU's
    failure on a Mamba-130m at L = 2048) where LAPACK quietly answers it. With a solver as
    strict as cuSOLVER's, such cuts are marked for the exact route (infinite error), a finite
    sandwich is solved as it is, and every other cut keeps the values the plain solver gives."""
    from ess_explorer.core import gramian_naive

    ssm = mamba_like(3, 40, 6, seed=2)
    a, b, c = (x.reshape(-1, 40, 6) for x in (ssm.a, ssm.b, ssm.c))
    wanted = torch.arange(1, 40)
    p, q = gramian_naive.gramians(a, b, c, wanted)
    expected = gramian_naive.spectra_from_gramians(p, q, wanted, 40)
    p, q = p.clone(), q.clone()
    p[1, 7, 2, 2] = float("nan")  # not finite
    q[2, 20] = -q[2, 20] - torch.eye(6, dtype=q.dtype)  # wrong but finite: solved, not marked
    p[0, 30] = -torch.eye(6, dtype=p.dtype)  # the Cholesky fails

    def strict(matrices):
        if not bool(torch.isfinite(matrices).all()):
            raise torch.linalg.LinAlgError("linalg.eigh: the algorithm failed to converge")
        return torch.linalg.eigvalsh(matrices)

    monkeypatch.setattr(gramian_naive, "eigvalsh", strict)
    lam, error, _ = gramian_naive.spectra_from_gramians(p, q, wanted, 40)
    assert torch.isinf(error[1, 7]) and torch.isinf(error[0, 30]) and torch.isfinite(error[2, 20])
    keep = torch.ones_like(error, dtype=torch.bool)
    keep[1, 7] = keep[0, 30] = keep[2, 20] = False
    torch.testing.assert_close(lam[keep], expected[0][keep], rtol=0, atol=0)
    torch.testing.assert_close(error[keep], expected[1][keep], rtol=0, atol=0)
