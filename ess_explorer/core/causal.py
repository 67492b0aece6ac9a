"""Causal ESS: the tolerance-rank of the reachability factor of each cut.

For a factored operator H_t = O_t R_t (core/operators.py), the reachability matrix R_t
(N x t) takes the past inputs u_0..u_{t-1} to the state h_{t-1}. Causal ESS(t) counts the
singular values of R_t above the tolerance (same ``tol``, ``relative`` and ``scope`` rules
as tolerance-ESS, core/ess.py): how many state directions the past has actually written,
whether or not the future reads them. It drops to 1 at the step after an exact reset
(a_s = 0 leaves only b_s u_s in the state) while ESS, which also needs the future to read
the state, falls gradually.

The forward square-root sweep gives it without forming R_t: with U_c(t) upper triangular
and U_c(t)^T U_c(t) = R_t R_t^T (the transpose of the sweep's Lc_t),

    U_c(t + 1) = rank_one(U_c(t) diag(a_t), b_t),      sigma(R_t) = sigma(U_c(t)).

Causal ESS depends on the realisation (the model's own state coordinates), unlike ESS:
a state basis change S maps R_t to S R_t. It is reported for the realisation the model
computes with. Other families (core/units.py): softmax attention stores every past token
(its KV cache), so causal ESS(t) = t (min(t, w - 1) with a window); a gated short conv
keeps B_j u_j for its last k - 1 inputs, so sigma(R_t) = |B_j| over those j; a dense
operator with no known realisation has none (NaN, never a guess).

Under the "ess" contract (core/precision.py) a diagonal recurrence needs no sweep:
sigma(R_t)^2 = eig(P_t), P_t = R_t R_t^T, and the Gramian obeys the elementwise scan
P_{t+1} = (a_t a_t^T) * P_t + b_t b_t^T (core/gramian_naive.py), so causal ESS is the
eigenvalues of one N x N matrix per cut, batched, with no QR or SVD per step
(`reachability_gramian_singular_values`). Their error is at most GRAMIAN_ERROR eps ||P_t||_F;
a cut where that could move its count takes the sweep's exact values instead. A head whose
steps decay all N modes by one number (Mamba2) takes, on a CPU, the Gram of the few recent
rows of R_t that hold all but WINDOW_MASS of P_t (core/recent_kernel.py), whose trace left out
is added to that error.
"""

from __future__ import annotations

import torch

from . import dense_jobs, dense_kernel
from .accelerator import accelerator_routes, worker_threads
from .eigen import eigvalsh, kernel_takes, svdvals
from .gramian_naive import GRAMIAN_ERROR
from .operators import DPLRSSM, DiagonalSSM
from .precision import Accuracy
from .recent_kernel import RecentRows
from .scan import stacked_qr_r, times_transition
from .sweeps import _rank_one_update_upper, over_chunks

__all__ = ["reachability_singular_values", "reachability_gramian_singular_values", "shift_register_singular_values"]

# The reachability Gramians held at once by `reachability_gramian_singular_values`: the cuts
# of one batched eigvalsh, (units, cuts, N, N) float64 (Mamba2's 24 heads, N = 128: 32 cuts).
GRAMIAN_BLOCK_BYTES = 128 << 20
# A cut of a head whose steps decay all N modes by one number leaves out the rows of R_t that
# carry at most this times its largest row's weight (core/recent_kernel.py). Each eigenvalue
# of P_t then moves by at most that much of ||P_t|| (added to the cut's error bound, and far
# below the Gramian's own rounding, GRAMIAN_ERROR eps ||P_t||_F); their sum by as much
# (Lidskii), so the singular values by sqrt(N WINDOW_MASS) sigma_1 in all and entropy-ESS by
# at most 3e-7 for N = 128 (Fannes-Audenaert, as in core/row_scaled.py).
WINDOW_MASS = 1e-18


def reachability_singular_values(
    ssm: DiagonalSSM | DPLRSSM, positions, *, dtype: torch.dtype = torch.float64, device=None
) -> torch.Tensor:
    """sigma(R_t) for every unit of ``ssm`` at ``positions``: (*batch, P, N), descending.

    Row t = 0 (no past) is all zeros. Cost: one forward sweep, O(L N^3) per unit. A DPLR
    transition A_t = diag(a_t) + p_t q_t^T enters as U_c A_t^T = U_c (diag(a_t) + q_t p_t^T),
    after which the factor is re-triangularised by QR.

    Before step t < N the state holds t inputs, so only the first t rows of U_c can be
    nonzero: on CPU those steps take the QR of the (t + 1) x N stack and the SVD of its
    (t + 1) x N factor, O(t^2 N) instead of O(N^3) (the early cuts of a large state). On
    CPU the units run in chunks on parallel threads (`over_chunks`).
    """
    device = torch.device(device) if device is not None else ssm.a.device
    positions = torch.as_tensor(positions, dtype=torch.long).flatten().cpu()
    length, n = ssm.length, ssm.state_size
    a, b = (x.reshape(-1, length, n) for x in (ssm.a, ssm.b))
    low_rank = None
    if isinstance(ssm, DPLRSSM) and ssm.rank > 0:
        low_rank = [x.reshape(-1, length, n, ssm.rank) for x in (ssm.p, ssm.q)]
    units = a.shape[0]
    out = torch.zeros(units, len(positions), n, dtype=dtype, device=device)
    wanted = {}
    for row, t in enumerate(positions.tolist()):
        if 1 <= t <= length:
            wanted.setdefault(t, []).append(row)
    trim = not accelerator_routes(device)  # a GPU keeps one shape per step (rotations, no per-size calls)

    def run(sl: slice) -> None:
        ac, bc = (x[sl].to(device=device, dtype=dtype) for x in (a, b))
        pq = None if low_rank is None else [x[sl].to(device=device, dtype=dtype) for x in low_rank]
        state = torch.zeros(ac.shape[0], n, n, dtype=dtype, device=device)
        vector = torch.empty(ac.shape[0], n, dtype=dtype, device=device)
        for step in range(max(wanted)):
            live = min(step, n) if trim else n  # rows of U_c that can be nonzero: one per input so far
            if pq is None:
                state[:, :live].mul_(ac[:, step, None, :])  # U_c diag(a_t): the past decays
            else:  # U_c A_t^T, no longer triangular: the QR below re-triangularises it
                times_transition(state[:, :live], ac[:, step], pq[1][:, step], pq[0][:, step])
            vector.copy_(bc[:, step])
            if live < n:  # b_t u_t enters as one more row: R of the (live + 1) x N stack
                state[:, : live + 1] = stacked_qr_r(state[:, :live], vector[:, None])
            else:
                _rank_one_update_upper(state, vector, rotations=False if pq is not None else None)
            rows = wanted.get(step + 1)  # the state now holds u_0..u_step: R_{step + 1}
            if rows:
                values = svdvals(state[:, : min(live + 1, n)])
                out[sl, rows, : values.shape[-1]] = values[:, None, :]

    if units and wanted:
        workers = worker_threads(device)
        over_chunks(run, units, -(-units // max(1, workers)), workers)
    return out.reshape(*ssm.batch_shape, len(positions), n)


def reachability_gramian_singular_values(
    ssm: DiagonalSSM, positions, accuracy: Accuracy, *, dtype: torch.dtype = torch.float64, device=None
) -> torch.Tensor:
    """sigma(R_t) of every unit of ``ssm`` at ``positions`` within ``accuracy`` (an "ess"
    contract), as `reachability_singular_values` returns them: from eig(P_t) (module
    docstring), the Gramians of a block of cuts in one eigvalsh. The units with a cut whose
    count the error bound cannot certify (`Accuracy.certain`) take the exact sweep's values."""
    device = torch.device(device) if device is not None else ssm.a.device
    positions = torch.as_tensor(positions, dtype=torch.long).flatten().cpu()
    length, n = ssm.length, ssm.state_size
    a, b = (x.reshape(-1, length, n).to(device=device, dtype=torch.float64) for x in (ssm.a, ssm.b))
    units = a.shape[0]
    wanted = sorted({t for t in positions.tolist() if 1 <= t <= length})
    squares = torch.zeros(units, len(wanted), n, dtype=torch.float64, device=device)  # eig(P_t), descending
    error = torch.zeros(units, len(wanted), dtype=torch.float64, device=device)
    block = max(1, min(len(wanted), GRAMIAN_BLOCK_BYTES // (8 * max(1, units) * n * n)))
    eps = torch.finfo(torch.float64).eps
    # On a CPU the kernel solves each matrix's leading block only (dense_kernel): a cut t < N
    # then takes the t x t Gram of R_t's columns, F_t F_t^T (the same nonzero eigenvalues as
    # P_t = F_t^T F_t), a t^3 solve instead of N^3 (3/8 of Mamba2's at L = 2N). Where eigvalsh
    # would not take the kernel (small batches, small N: core/eigen.py; a job too small to repay
    # its compile: dense_jobs), neither does this. The job is what LAPACK would spend without
    # it, on every cut's N x N Gramian (counting the trimmed t x t ones instead left Mamba2's
    # heads at L = 64 to LAPACK at 128 x 128: 0.7 s of a layer's 1.1 s).
    allow_kernel = dense_jobs.repays_kernel(units * len(wanted) * dense_jobs.eigen_work(n))
    trim = allow_kernel and kernel_takes(units * block, n, torch.float64, device)
    # P_t (or F_t F_t^T) of a block of cuts, solved together; cut-major, so that a last, partial
    # block is a view (no copy of up to GRAMIAN_BLOCK_BYTES) and every slot is written before use
    held = a.new_empty(block, units, n, n)
    sizes = torch.full((block, units), n, dtype=torch.long)
    # Where each step decays all N modes by one number (Mamba2's heads), a cut takes the Gram of
    # the few recent rows of R_t that carry all but WINDOW_MASS of P_t (core/recent_kernel.py):
    # a fast-forgetting head's cut is a w x w problem with w far below N. It holds the rows'
    # Gram of a span of N cuts, under (3N)^2 values a unit: within the block's budget (24 heads
    # of N = 128: 28 MB), or the early cuts' product below instead.
    fits = units * (3 * n) ** 2 * 8 <= GRAMIAN_BLOCK_BYTES
    one_decay = bool((a == a[..., :1]).all())
    recent = RecentRows(a[..., 0], b) if trim and fits and one_decay else None
    early = a.new_zeros(units, n, n) if trim and recent is None else None  # F_t: rows j < min(t, N)
    left_out = a.new_zeros(block, units)  # the trace of what each slot's window left out of P_t
    frobenius = a.new_zeros(block, units)  # each slot's ||P_t||_F (or its window's)
    p = a.new_zeros(units, n, n)
    step = 0
    for slot, t in enumerate(wanted):  # sorted and distinct: t > step
        if t == step + 1:  # p becomes P_t: what u_0..u_step wrote
            decay, written = a[:, step], b[:, step : step + 1]
            if one_decay:  # a scalar scale, in place: no (U, N, N) temporaries
                p.mul_(decay[:, :1, None] ** 2).addcmul_(written.mT, written)
            else:
                p = torch.addcmul(b[:, step, :, None] * b[:, step, None, :], decay[:, :, None] * decay[:, None, :], p)
        else:  # strided cuts: the steps between two cuts in one product
            decay, written = _steps_between(a[:, step:t], b[:, step:t])
            p = (decay[:, :, None] * decay[:, None, :]) * p + written.mT @ written
        if early is not None and step < n:  # F_t's rows j < min(t, N): b_j times the decays since
            early[:, :step] *= decay[:, None, :]
            early[:, step : min(t, n)] = written[:, : min(t, n) - step]
        step = t
        k = slot % block
        if recent is not None:
            sizes[k], left_out[k], frobenius[k] = recent.grams(t, p, held[k], WINDOW_MASS)
        else:
            if trim and t < n:
                held[k] = 0.0
                torch.matmul(early[:, :t], early[:, :t].mT, out=held[k, :, :t, :t])
                sizes[k] = t
            else:
                held[k], sizes[k] = p, n
            frobenius[k] = torch.linalg.matrix_norm(held[k])
        if k == block - 1 or slot == len(wanted) - 1:
            first, count = slot - k, k + 1
            solved = held[:count]  # (count, units, n, n)
            bound = GRAMIAN_ERROR * eps * frobenius[:count]
            finite = torch.isfinite(bound)  # not: a growing recurrence overflowed (its unit is redone)
            if not bool(finite.all()):
                solved = torch.where(finite[..., None, None], solved, 0.0)
            if trim:
                flat = dense_kernel.symmetric_eigenvalues(solved.reshape(-1, n, n), sizes[:count].reshape(-1))
                values = flat.reshape(count, units, n)
            else:
                values = eigvalsh(solved, allow_kernel)
            squares[:, first : first + count] = values.sort(-1, descending=True).values.transpose(0, 1)
            error[:, first : first + count] = torch.where(finite, bound + left_out[:count], float("inf")).T
    rank = torch.clamp(torch.as_tensor(wanted, device=device), max=n)  # P_t holds t inputs
    squares = torch.where(torch.arange(n, device=device) < rank[:, None], squares.clamp_min(0), 0.0)
    redo = (~accuracy.certain(squares[..., 0], error, squares)).any(-1).nonzero().flatten()
    sigma = squares.sqrt_()
    if len(redo):  # as values: squared, a cut near 1e-200 would underflow (precision.squares_underflow)
        sigma[redo] = reachability_singular_values(
            DiagonalSSM.derived(a=a[redo], b=b[redo], c=b[redo]), torch.as_tensor(wanted), device=device
        )
    inside = (positions >= 1) & (positions <= length)  # the rest (no past) stay zero
    row = torch.searchsorted(torch.as_tensor(wanted, dtype=torch.long), positions[inside])
    out = torch.zeros(units, len(positions), n, dtype=dtype, device=device)
    out[:, inside.to(device)] = sigma[:, row.to(device)].to(dtype)  # one gather, no per-cut launch
    return out.reshape(*ssm.batch_shape, len(positions), n)


def _steps_between(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What k steps of P <- (a_s a_s^T) * P + b_s b_s^T (a, b: (U, k, N)) do at once:
    P_end = (d d^T) * P + W^T W, d = a_0 * ... * a_{k-1} elementwise (U, N), and W (U, k, N)
    with row s = b_s * a_{s+1} * ... * a_{k-1}, the input of step s decayed over the steps
    after it. A strided run's cuts (the explorer's first chart: every 16th of 512) take one
    (N x k) (k x N) product per unit between two cuts instead of k launches of N x N ones."""
    after = a.flip(1).cumprod(1).flip(1)  # after[:, s] = a_s * ... * a_{k-1}
    written = b.clone()
    written[:, :-1] *= after[:, 1:]
    return after[:, 0], written


def shift_register_singular_values(gate_in: torch.Tensor, kernel_size: int, positions) -> torch.Tensor:
    """sigma(R_t) of a gated short conv, whose state is B_j u_j for its last k - 1 inputs:
    R_t is diagonal with entries B_j, j = max(0, t - k + 1)..t - 1. gate_in: (U, L);
    returns (U, P, k - 1), descending, zero padded."""
    units, length = gate_in.shape
    width = max(kernel_size - 1, 1)
    out = torch.zeros(units, len(positions), width, dtype=gate_in.dtype, device=gate_in.device)
    for row, t in enumerate(torch.as_tensor(positions).flatten().tolist()):
        window = gate_in[:, max(0, t - kernel_size + 1) : t].abs()
        if window.shape[-1]:
            out[:, row, : window.shape[-1]] = window.sort(-1, descending=True).values
    return out
