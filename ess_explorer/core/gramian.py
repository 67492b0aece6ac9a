"""The ESS-grade route for diagonal recurrences: Gramian eigenvalues, guarded, with the sweep behind.

sigma(H_t)^2 = eig(P_t Q_t) from the elementwise Gramian scans (the math and the error bound
are in core/gramian_naive.py; the contract in core/precision.py). On a CPU with numba the
compiled kernel (core/gramian_kernel.py) runs, in chunks of units on parallel threads; on any
other device, or without numba, the torch reference does the same work in batched ops.
Every cut whose error bound could move its tolerance count (`Accuracy.certain`) is computed
again by the exact square-root sweep (core/sweeps.py), for its unit and cut only.
"""

from __future__ import annotations

import torch

from . import gramian_kernel
from .gramian_naive import GRAMIAN_ERROR, gramian_spectra_reference
from .operators import DiagonalSSM
from .precision import Accuracy
from .sweeps import balanced_chunk, factored_hankel_singular_values, over_chunks

__all__ = ["gramian_hankel_singular_values", "uses_kernel"]

# Units per call: the reference holds about REFERENCE_COPIES (units, cuts, N, N) float64 arrays
# at once (both Gramians, the balanced pair, the root and the sandwich); the kernel only its
# lanes' checkpoints, so its chunks are set by thread balance. On a GPU the chunk grows to
# GPU_BUDGET_BYTES (or a quarter of the free memory, if less): a Mamba-130m layer at L = 1024
# (1536 channels, N = 16) is then 3 calls, within 8 GB.
REFERENCE_COPIES = 8
REFERENCE_CHUNK_BYTES = 256 << 20
GPU_BUDGET_BYTES = 8 << 30


def uses_kernel(device: torch.device) -> bool:
    """Whether the compiled kernel computes the Gramian route on ``device``."""
    return device.type == "cpu" and gramian_kernel.available()


def gramian_hankel_singular_values(
    ssm: DiagonalSSM,
    *,
    positions: torch.Tensor,
    accuracy: Accuracy,
    top_k: int | None = None,
    dtype: torch.dtype = torch.float64,
    device=None,
    causal: bool = False,
    kernel: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """sigma(H_t) of every unit of ``ssm`` at ``positions``, as `factored_hankel_singular_values`
    returns them ((*batch, P, K), descending, and with ``causal`` also sigma(R_t), (*batch, P, N)),
    within ``accuracy`` (an "ess" contract). kernel: force the compiled kernel (True) or the
    torch reference (False); default `uses_kernel`."""
    device = torch.device(device) if device is not None else ssm.a.device
    batch_shape, length, n = ssm.batch_shape, ssm.length, ssm.state_size
    k_out = min(n, length // 2) if top_k is None else min(top_k, n, length // 2)
    positions = positions.to(torch.long).cpu()
    a, b, c = (x.reshape(-1, length, n) for x in (ssm.a, ssm.b, ssm.c))
    units = a.shape[0]
    inside = (positions >= 1) & (positions < length)
    wanted = torch.unique(positions[inside])
    row_of_wanted = torch.searchsorted(wanted, positions[inside])
    lam = torch.zeros(units, len(wanted), n, dtype=torch.float64)
    error = torch.zeros(units, len(wanted), dtype=torch.float64)
    reach = torch.zeros(units, len(wanted), n, dtype=torch.float64) if causal else None
    use_kernel = uses_kernel(device) if kernel is None else kernel

    def run(sl: slice) -> None:
        if use_kernel:
            parts = gramian_kernel.gramian_spectra_kernel(
                *(x[sl].to(torch.float64).numpy() for x in (a, b, c)), wanted.numpy(), causal, GRAMIAN_ERROR
            )
            parts = [None if x is None else torch.from_numpy(x) for x in parts]
        else:
            on = (x[sl].to(device=device, dtype=torch.float64) for x in (a, b, c))
            parts = [None if x is None else x.cpu() for x in gramian_spectra_reference(*on, wanted.to(device), causal)]
        lam[sl], error[sl] = parts[0], parts[1]
        if causal:
            reach[sl] = parts[2]

    if units and len(wanted):
        workers = torch.get_num_threads() if device.type == "cpu" else 1
        if use_kernel:  # whole lane groups per thread, and every thread busy
            lanes = gramian_kernel.LANES
            chunk = lanes * balanced_chunk(-(-units // lanes), max(1, 4096 // lanes), workers)
        else:
            budget = REFERENCE_CHUNK_BYTES
            if device.type == "cuda":
                budget = min(GPU_BUDGET_BYTES, torch.cuda.mem_get_info(device)[0] // 4)
            chunk = balanced_chunk(units, budget // max(1, REFERENCE_COPIES * 8 * len(wanted) * n * n), workers)
        over_chunks(run, units, chunk, workers)
        _redo_uncertain(a, b, c, wanted, lam, error, reach, accuracy)
    sigma = lam[..., :k_out].sqrt()
    out = torch.zeros(units, len(positions), k_out, dtype=torch.float64)
    out[:, inside] = sigma[:, row_of_wanted]
    out = out.to(device=device, dtype=dtype).reshape(*batch_shape, len(positions), k_out)
    if not causal:
        return out
    reach_out = torch.zeros(units, len(positions), n, dtype=torch.float64)
    reach_out[:, inside] = reach.sqrt()[:, row_of_wanted]
    return out, reach_out.to(device=device, dtype=dtype).reshape(*batch_shape, len(positions), n)


# Units per sweep of the redo. A sweep costs a QR per stop for every unit it carries, plus a
# fixed Python cost per call (about 1 ms): small groups share the calls without making many
# units pay for each other's stops (a whole Mamba layer: 1.1 s one unit per call, 2.4 s all
# units in one call, 0.4 s in groups of 16).
REDO_GROUP = 16


def _redo_uncertain(a, b, c, wanted, lam, error, reach, accuracy: Accuracy) -> None:
    """Recompute, by the exact sweep, the cuts whose count the Gramian route cannot certify,
    IN PLACE (lam and reach hold squares), in groups of REDO_GROUP units that stop at the
    union of their uncertain cuts. A non-finite bound (a Gramian that overflowed) lands here
    too; the sweep then raises the overflow error, as the exact route does."""
    uncertain = ~accuracy.certain(lam[..., 0], error)  # (U, W)
    units = torch.nonzero(uncertain.any(-1)).flatten()
    for start in range(0, len(units), REDO_GROUP):
        group = units[start : start + REDO_GROUP]
        rows = torch.nonzero(uncertain[group].any(0)).flatten()
        op = DiagonalSSM.derived(a=a[group], b=b[group], c=c[group])
        result = factored_hankel_singular_values(
            op, positions=wanted[rows], dtype=torch.float64, method="sweep", causal=reach is not None
        )
        sigma, reach_sigma = result if reach is not None else (result, None)
        unit_index, row_index = torch.nonzero(uncertain[group][:, rows], as_tuple=True)
        target = (group[unit_index], rows[row_index])
        lam[target] = 0.0
        lam[target[0], target[1], : sigma.shape[-1]] = sigma[unit_index, row_index] ** 2
        if reach is not None:
            reach[target] = reach_sigma[unit_index, row_index] ** 2
