"""The Gramian route for diagonal recurrences, in plain torch: the reference beside the kernel.

For one unit (core/operators.py, DiagonalSSM) the cut H_t = O_t R_t has

    sigma(H_t)^2 = eig(P_t Q_t),    P_t = R_t R_t^T,    Q_t = O_t^T O_t,

and both Gramians obey elementwise recurrences (N^2 independent scalar scans, no QR):

    P_1 = b_0 b_0^T,          P_{t+1} = (a_t a_t^T) * P_t + b_t b_t^T
    Q_{L-1} = (a a^T)(c c^T), Q_t     = (a_t a_t^T) * (Q_{t+1} + c_t c_t^T)

Per cut (docs/spectra.md, "The ESS-grade routes"):
1. balance: a diagonal change of the state's coordinates D (d_i = (Q_ii / P_ii)^(1/4)) maps
   P -> D P D and Q -> D^-1 Q D^-1 and leaves eig(P Q) alone; it makes the two diagonals
   equal, which removes a realisation's imbalance between modes (a mode written 1e4 times
   louder and read 1e4 times softer);
2. a shifted Cholesky P + delta I = C C^T (delta = CHOLESKY_SHIFT eps tr P: P may be
   singular), then sigma^2 = eigvalsh(C^T Q C);
3. the error bound of every sigma^2, ``GRAMIAN_ERROR`` eps ||P||_F ||Q||_F (balanced),
   returned per cut: the caller (core/precision.py) keeps a cut only where that error cannot
   move its tolerance count, and redoes the others by the square-root sweep.
4. the causal spectrum needs no second Gramian: sigma(R_t)^2 = eig(P_t), returned in the
   form core/sturm.py counts (here its eigenvalues on the diagonal; the kernel stops at
   P_t's tridiagonal form), with its own error bound GRAMIAN_ERROR eps ||P_t||_F.

Values past the structural rank bound min(t, L - t, N) (and min(t, N) for R_t) are exactly
zero and are set so; what the eigensolver returns there is rounding of size sqrt(error).

This module is the test oracle of core/gramian_kernel.py and of core/cuda_eigen_kernel.py, and
the route on devices those kernels do not run on (every step one batched torch op over the
chunk; on a GPU with numba-cuda, steps 1-3 are one kernel call).
"""

from __future__ import annotations

import torch

from . import cuda_eigen_kernel
from .eigen import cuda_kernel_takes, eigvalsh, kernel_or_torch

__all__ = [
    "CHOLESKY_SHIFT",
    "GRAMIAN_ERROR",
    "GRAMIAN_NOISE",
    "gramian_spectra_reference",
    "gramians",
    "spectra_from_gramians",
]

# The error of every computed sigma^2, in units of eps ||P||_F ||Q||_F (balanced): the
# rounding of the scans, the Cholesky, the sandwich and eigvalsh together. Measured on
# Mamba-like operators at most about 42 (tests/test_precision.py checks 2x headroom).
GRAMIAN_ERROR = 128.0
# The Cholesky's shift, in units of eps tr P (balanced). It lifts every eigenvalue of the
# sandwich by up to about delta ||Q||, so it sets the noise floor of the values the route
# cannot resolve, which entropy-ESS reads: at N eps tr P (N = 16) one cut of a random
# Mamba-130m layer moved entropy-ESS by 1.01e-5, at eps tr P the worst of those cuts moved
# 2.6e-6. A smaller shift can leave a rounding-negative pivot on a singular P; that cut gets
# an infinite error bound and is redone exactly (none of that layer's 784,896 cuts).
CHOLESKY_SHIFT = 1.0
# Where the values the route cannot resolve lie, in the same units: the shift and the rounding
# leave them below about 0.8 (measured: scalar decays whose inputs are all written along one
# direction of the state, true values 1e-13 sigma_1). Entropy-ESS reads those
# (core/precision.py `Accuracy.resolves_entropy`); the bound's 128 would redo 114 of 261,888
# cuts of 256 Mamba-130m-shaped channels at L = 1024, values the route does resolve.
GRAMIAN_NOISE = 2.0


def gramians(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, wanted: torch.Tensor):
    """(P_t, Q_t) at the cuts ``wanted`` (sorted, in 1..L-1): each (B, W, N, N).
    a, b, c: (B, L, N)."""
    units, length, n = a.shape
    slot = {int(t): i for i, t in enumerate(wanted.tolist())}
    p_out = a.new_empty(units, len(slot), n, n)
    q_out = a.new_empty(units, len(slot), n, n)
    p = a.new_zeros(units, n, n)
    for t in range(length - 1):  # p becomes P_{t+1}: what u_0..u_t wrote
        p = a[:, t, :, None] * a[:, t, None, :] * p + b[:, t, :, None] * b[:, t, None, :]
        if t + 1 in slot:
            p_out[:, slot[t + 1]] = p
    q = a.new_zeros(units, n, n)
    for t in range(length - 1, 0, -1):  # q becomes Q_t: what y_t..y_{L-1} read of h_{t-1}
        q = a[:, t, :, None] * a[:, t, None, :] * (q + c[:, t, :, None] * c[:, t, None, :])
        if t in slot:
            q_out[:, slot[t]] = q
    return p_out, q_out


def _rank_mask(values: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """Values (..., W, N) descending with entries at k >= rank (W,) set to zero."""
    k = torch.arange(values.shape[-1], device=values.device)
    return torch.where(k < rank[:, None].to(values.device), values, values.new_zeros(()))


def gramian_spectra_reference(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, wanted: torch.Tensor, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
    """(sigma^2 (B, W, N) descending, error of each sigma^2 (B, W), and with ``causal`` the
    reachability Gramians as (diag, off, top, error): eig(P_t) (B, W, N) descending on the
    diagonal, zeros (B, W, N), the largest eigenvalue (B, W), its error bound (B, W)).

    a, b, c: (B, L, N) float64; wanted: sorted cuts in 1..L-1. The error is inf where a
    Gramian is not finite (a growing recurrence): such cuts go to the exact route, which
    raises the overflow error."""
    p, q = gramians(a, b, c, wanted)
    return spectra_from_gramians(p, q, wanted, a.shape[1], causal)


def _sandwich_spectra(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1-3 of the module docstring on (P_t, Q_t) (B, W, N, N): (sigma^2 (B, W, N)
    descending, each cut's error bound (B, W)), inf where the cut cannot be solved here (the
    caller redoes it exactly) and its values then zeros. core/cuda_eigen_kernel.py fuses the
    same steps on a GPU."""
    n = p.shape[-1]
    eps = torch.finfo(p.dtype).eps
    tiny = torch.finfo(p.dtype).tiny
    dp, dq = p.diagonal(0, -2, -1), q.diagonal(0, -2, -1)
    both = (dp > tiny) & (dq > tiny)
    d = torch.where(both, (dq.clamp_min(tiny) / dp.clamp_min(tiny)) ** 0.25, torch.ones_like(dp))
    pb = p * d[..., :, None] * d[..., None, :]
    qb = q / (d[..., :, None] * d[..., None, :])
    shift = CHOLESKY_SHIFT * eps * pb.diagonal(0, -2, -1).sum(-1)
    eye = torch.eye(n, dtype=p.dtype, device=p.device)
    root, info = torch.linalg.cholesky_ex(pb + (shift[..., None, None] + tiny) * eye)
    sandwich = root.mT @ qb @ root
    # A failed Cholesky or a Gramian that is not finite leaves NaN here; cuSOLVER refuses a batch
    # holding one (LinAlgError) where LAPACK answers it: such cuts are solved as zeros, then
    # marked below for the exact route.
    solvable = (info == 0) & torch.isfinite(sandwich).flatten(-2).all(-1)
    lam = eigvalsh(sandwich.masked_fill_(~solvable[..., None, None], 0.0)).flip(-1).clamp_min(0)
    error = GRAMIAN_ERROR * eps * torch.linalg.matrix_norm(pb) * torch.linalg.matrix_norm(qb)
    bad = ~solvable | ~torch.isfinite(error) | ~torch.isfinite(lam).all(-1)
    error = torch.where(bad, torch.full_like(error, float("inf")), error)
    lam = torch.where(bad[..., None], torch.zeros_like(lam), lam)
    return lam, error


def _same_cuts(got: tuple, expected: tuple) -> bool:
    """Two computations of `_sandwich_spectra`: the same cuts marked for the exact route (but a
    few whose Cholesky fails in one rounding and not the other: a singular P's pivots are near
    zero), the same bounds (to rounding), and every value within a quarter of its cut's bound
    of the other's."""
    (lam, error), (lam_expected, error_expected) = got, expected
    finite = torch.isfinite(error) & torch.isfinite(error_expected)
    marked_apart = int((torch.isfinite(error) != torch.isfinite(error_expected)).sum())
    return bool(
        marked_apart <= max(2, 1e-4 * error.numel())
        and torch.allclose(error[finite], error_expected[finite], rtol=1e-9, atol=0)
        and ((lam - lam_expected).abs()[finite] <= error[finite][..., None] / 4).all()
    )


def spectra_from_gramians(
    p: torch.Tensor, q: torch.Tensor, wanted: torch.Tensor, length: int, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
    """Steps 1-4 of the module docstring on the Gramians (P_t, Q_t) (B, W, N, N) of the cuts
    ``wanted`` (W,) of operators of length ``length``: the outputs of
    `gramian_spectra_reference` (core/gramian_blocked.py computes the Gramians its own way
    and shares this)."""
    n = p.shape[-1]
    if cuda_kernel_takes(p, most=cuda_eigen_kernel.GRAMIAN_MAX_SIZE):  # a GPU: steps 1-3 fused, a thread a cut
        lam, error = kernel_or_torch(
            "Gramian cuts",
            p,
            lambda: cuda_eigen_kernel.gramian_cut_spectra(p, q, CHOLESKY_SHIFT, GRAMIAN_ERROR),
            lambda: _sandwich_spectra(p, q),
            _same_cuts,
        )
    else:
        lam, error = _sandwich_spectra(p, q)
    t = wanted.to(torch.long)
    lam = _rank_mask(lam, torch.clamp(torch.minimum(t, length - t), max=n))
    reach = None
    if causal:
        finite = torch.isfinite(p).flatten(-2).all(-1)
        values = eigvalsh(torch.where(finite[..., None, None], p, torch.zeros_like(p))).flip(-1)
        reach_error = GRAMIAN_ERROR * torch.finfo(p.dtype).eps * torch.linalg.matrix_norm(p)
        reach_error = torch.where(finite, reach_error, torch.full_like(reach_error, float("inf")))
        reach = (values, torch.zeros_like(values), values[..., 0], reach_error)
    return lam, error, reach
