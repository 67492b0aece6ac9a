"""The ESS-grade route for diagonal recurrences: Gramian eigenvalues, guarded, with the sweep behind.

sigma(H_t)^2 = eig(P_t Q_t) from the elementwise Gramian scans (the math and the error bound
are in core/gramian_naive.py; the contract in core/precision.py). On a CPU with numba the
compiled kernel (core/gramian_kernel.py) runs a large job (`uses_kernel`), in chunks of units
on parallel threads; for a small job, on any other device, or without numba, the blocked
torch route (core/gramian_blocked.py) does the same work in batched ops, every unit of a
call at once.
Every cut whose error bound could move its tolerance count (`Accuracy.certain`) is computed
again by the exact square-root sweep (core/sweeps.py), for its unit and cut only.
"""

from __future__ import annotations

import torch

from . import costs, dense_jobs, gramian_kernel
from .accelerator import accelerator_routes, worker_threads
from .cut_roots_kernel import cut_roots
from .eigen import svdvals
from .gramian_blocked import blocked_bytes_per_unit, gramian_spectra_blocked
from .gramian_naive import GRAMIAN_ERROR, GRAMIAN_NOISE
from .operators import DiagonalSSM, overflow_error
from .precision import Accuracy
from .sturm import TridiagonalSpectra
from .sweeps import balanced_chunk, over_chunks

__all__ = [
    "gramian_hankel_singular_values",
    "uses_kernel",
    "layer_uses_kernel",
    "job_work",
    "route_seconds",
    "wanted_cuts",
    "load",
]

# Units per call: the kernel keeps only its lanes' checkpoints, so its chunks are set by
# thread balance; the blocked route holds about `blocked_bytes_per_unit` per unit, within
# BLOCKED_CHUNK_BYTES on a CPU and GPU_BUDGET_BYTES (or a quarter of the free memory, if less)
# on a GPU: a Mamba-130m layer at L = 2048 (1536 channels, N = 16) is one call of about 3.4 GB.
BLOCKED_CHUNK_BYTES = 256 << 20
GPU_BUDGET_BYTES = 8 << 30


# The kernel compiles once per install (about 11 s). A job of less work than this (`job_work`:
# about 50,000 cuts at N = 16 with every cut wanted, 0.7 s for the torch route on 2 cores, a zoo
# model or a short prompt) takes torch, so that a fresh install's first small analysis does not
# wait for it.
KERNEL_MIN_WORK = 2e8
# Both routes step the Gramian recurrences through every one of the L tokens, whichever cuts are
# wanted; the torch route spends about this many units of a cut's N^3 per state entry and step.
# Measured on one Mamba-130m layer (1536 channels, N = 16), 2 cores, torch route against kernel:
# L = 512 with every 16th cut 1.58 s against 0.33, every 64th 1.26 against 0.26; L = 1024, every
# 64th 2.58 against 0.66; L = 96, every 3rd 0.73 against 0.13 (counting the cuts alone sent all
# of these to torch).
SCAN_WORK = 4.0


def job_work(units: int, cuts: int, length: int, state_size: int) -> float:
    """The Gramian route's work on a job, in units of a cut's N^3: every wanted cut's
    eigenproblem, and the scans through all L steps (SCAN_WORK per state entry and step)."""
    return float(units) * (cuts * state_size**3 + SCAN_WORK * length * state_size**2)


def kernel_speedup(state_size: int) -> float:
    """The kernel's speed over the blocked torch route per unit, one thread each, with its
    lanes full. Measured at L = 256: N = 16 8.1x, 32 4.9x, 64 2.7x, 128 1.3x (a lane group's
    N x N x LANES matrices leave the cache as N grows, while LAPACK's calls amortise)."""
    return 8.0 * (16 / state_size) ** 0.85


def route_seconds(device, units: int, cuts: int, state_size: int, length: int) -> float:
    """What this route takes on a whole layer's job, in seconds on 2 cores (core/costs.py): in
    the kernel where `layer_uses_kernel` sends the job, else blocked."""
    kernel = layer_uses_kernel(device, units, cuts, state_size, length)
    return costs.gramian_seconds(units, cuts, state_size, kernel, kernel_speedup(state_size))


def layer_uses_kernel(device, units: int, cuts: int, state_size: int, length: int) -> bool:
    """`uses_kernel` for a whole layer's ``units``, counted as such inside a chunk of them too,
    so that every chunk takes the route the layer recorded (core/layer.py)."""
    with dense_jobs.chunk_of_layer(1.0):
        return uses_kernel(device, units, cuts, state_size, length)


def wanted_cuts(positions, length: int) -> torch.Tensor:
    """The distinct cuts among ``positions`` that the route computes: 1..L-1 (cut 0 and cut L
    have no past or no future, so no values)."""
    positions = torch.as_tensor(positions).to(torch.long).cpu()
    return torch.unique(positions[(positions >= 1) & (positions < length)])


def uses_kernel(device: torch.device, units: int, cuts: int, state_size: int, length: int) -> bool:
    """Whether the compiled kernel computes the Gramian route on ``device`` for ``units`` x
    ``cuts`` cuts of state size N of operators of ``length`` L: on a CPU, with numba, for a job
    of at least KERNEL_MIN_WORK (`job_work`), where core/costs.py prices it below the blocked
    route. The kernel runs LANES units side by side whether they are there or not (8 heads of
    N = 64 cost it as much as 64, 6x the torch route's time: a Mamba2 zoo model with gates
    outside), and each block of lanes on one thread, so a job of one block leaves the second
    core to nothing. Kernel against blocked, 2 threads, L = 256 unless said, units x N
    (`kernel_speedup` x filled): 64 x 128 (1.4) 20.1 s against 15.6 s; 64 x 96 (1.7) 7.2 against
    6.8; 20 x 32 at L = 2048 (1.4) 2.4 against 2.0; 64 x 64 (2.5) 2.1 against 2.5; 128 x 128,
    two blocks (1.4) 23.3 against 29.7. Near its edge it errs by a little: 40 x 48 at L = 1024
    (2.0) went blocked at 1.06x the kernel's time, and 9 units of N = 16 (1.1), blocked from
    L = 4,400 (below that the job is under KERNEL_MIN_WORK), at 1.2x. The rule reads only the
    job's sizes (not this machine's thread count: costs.THREADS), so every process (a Ray
    worker, a resumed sweep) routes a job the same way."""
    if accelerator_routes(device) or not gramian_kernel.available():
        return False
    if dense_jobs.layer_work(job_work(units, cuts, length, state_size)) < KERNEL_MIN_WORK:  # the layer's job
        return False
    speedup = kernel_speedup(state_size)
    kernel = costs.gramian_seconds(units, cuts, state_size, True, speedup)
    return kernel < costs.gramian_seconds(units, cuts, state_size, False)


def load() -> None:
    """Compile the kernel's route (once per install, about 12 s; numba's disk cache then loads
    it per process) on a tiny problem, through the call a real job makes, with causal ESS and
    its Sturm counts: for a benchmark, so that it times none of it (a small warm-up job would
    take torch: `uses_kernel`). Any call compiles what it needs by itself; the kernel takes
    every array C-ordered, so one compiled version serves every job."""
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.rand(2, 8, 4, generator=g, dtype=torch.float64) for _ in range(3))
    _, reach = gramian_hankel_singular_values(
        DiagonalSSM(a, b, c), positions=torch.arange(8), accuracy=Accuracy("ess"), causal=True, kernel=True
    )
    reach.count_above(torch.tensor(1e-3))


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
    returns them ((*batch, P, K), descending), within ``accuracy`` (an "ess" contract). With
    ``causal`` also sigma(R_t) as a `TridiagonalSpectra` (*batch, P): causal ESS is a count,
    and the Gramian's tridiagonal form gives it at any tolerance (core/sturm.py). kernel:
    force the compiled kernel (True) or the blocked torch route (False); default `uses_kernel`."""
    device = torch.device(device) if device is not None else ssm.a.device
    batch_shape, length, n = ssm.batch_shape, ssm.length, ssm.state_size
    k_out = min(n, length // 2) if top_k is None else min(top_k, n, length // 2)
    positions = positions.to(torch.long).cpu()
    a, b, c = (x.reshape(-1, length, n) for x in (ssm.a, ssm.b, ssm.c))
    units = a.shape[0]
    inside = (positions >= 1) & (positions < length)
    wanted = wanted_cuts(positions, length)
    # Every cut 0..L-1 (the usual case): the wanted cuts are rows 1.. of the output, so the
    # routes write straight into it (row 0, no past, stays zero) and nothing is gathered.
    every_cut = len(positions) == length and bool((positions == torch.arange(length)).all())
    rows = len(positions) if every_cut else len(wanted)
    use_kernel = uses_kernel(device, units, len(wanted), n, length) if kernel is None else kernel
    # where the results live: the kernel's CPU, else the device, so that on a GPU the
    # spectra, the guard and the ESS that follow stay there (one copy to the host per layer)
    store = torch.device("cpu") if use_kernel else device
    lam = torch.empty(units, rows, n, dtype=torch.float64, device=store)
    error = torch.empty(units, rows, dtype=torch.float64, device=store)
    # causal: P_t's (diag, off, top, error), as the kernel returns them
    reach = (
        [torch.empty_like(lam), torch.empty_like(lam), torch.empty_like(error), torch.empty_like(error)]
        if causal
        else None
    )
    reach_scale = torch.ones_like(error) if causal else None  # of the cuts redone exactly (TridiagonalSpectra)
    if every_cut:
        for x in (lam, error, *(reach or ())):
            x[:, 0] = 0.0
    cuts = slice(1, None) if every_cut else slice(None)
    lam_w, error_w = lam[:, cuts], error[:, cuts]  # (U, W, ...) views: the wanted cuts
    reach_w = None if reach is None else [x[:, cuts] for x in reach]

    def run(sl: slice) -> None:
        if use_kernel:  # whole rows (C-ordered: nothing copied), cut t into row t when every cut is wanted
            arrays = [x[sl].numpy() for x in (lam, error, *(reach or ()))]
            gramian_kernel.gramian_spectra_kernel(
                *(x[sl].to(torch.float64).numpy() for x in (a, b, c)),
                wanted.numpy(),
                causal,
                GRAMIAN_ERROR,
                out=(arrays[0], arrays[1], tuple(arrays[2:]) if causal else None),
                first_row=1 if every_cut else 0,
            )
            return
        on = (x[sl].to(device=device, dtype=torch.float64) for x in (a, b, c))
        lam_part, error_part, reach_part = gramian_spectra_blocked(*on, wanted.to(device), causal)
        mine = (lam_w[sl], error_w[sl], *(x[sl] for x in reach_w or ()))
        for whole, part in zip(mine, (lam_part, error_part, *(reach_part or ()))):
            whole.copy_(part)

    if units and len(wanted):
        workers = worker_threads(device)
        if use_kernel:  # whole lane groups per thread, and every thread busy
            lanes = gramian_kernel.LANES
            chunk = lanes * balanced_chunk(-(-units // lanes), max(1, 4096 // lanes), workers)
        else:
            budget = BLOCKED_CHUNK_BYTES
            if device.type == "cuda":
                budget = min(GPU_BUDGET_BYTES, torch.cuda.mem_get_info(device)[0] // 4)
            chunk = balanced_chunk(units, budget // blocked_bytes_per_unit(length, len(wanted), n, causal), workers)
        over_chunks(run, units, chunk, workers)
        scale_w = None if reach_scale is None else reach_scale[:, cuts]
        redone = _redo_uncertain(a, b, c, wanted, lam_w, error_w, reach_w, scale_w, accuracy)
        sigma_w = lam_w.sqrt_()  # singular values from here on, in place (lam: sigma)
        if redone is not None:  # written as values: their squares may underflow (`squares_underflow`)
            unit, row, exact = redone
            sigma_w[unit, row] = exact
    else:
        lam.sqrt_()
    if not every_cut:  # gather the rows of ``positions`` (t = 0, t >= L: no past or future, zeros)
        row = torch.searchsorted(wanted, positions[inside])
        lam = _spread(lam, inside, row)
        if reach is not None:
            reach = [_spread(x, inside, row) for x in reach]
            reach_scale = _spread(reach_scale, inside, row).masked_fill_(~inside.to(reach_scale.device), 1.0)
    out = lam[..., :k_out].to(device=device, dtype=dtype).reshape(*batch_shape, len(positions), k_out)
    if not causal:
        return out
    tridiagonal = TridiagonalSpectra(*(x.to(device=device, dtype=dtype) for x in (*reach[:3], reach_scale)))
    return out, tridiagonal.reshape(*batch_shape, len(positions))


def _spread(values: torch.Tensor, inside: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """values (U, W, ...) of the wanted cuts as rows of the positions (U, P, ...): row
    ``row[k]`` at each position inside 1..L-1, zeros elsewhere."""
    full = values.new_zeros(values.shape[0], len(inside), *values.shape[2:])
    full[:, inside.to(values.device)] = values[:, row.to(values.device)]
    return full


def _redo_uncertain(a, b, c, wanted, lam, error, reach, reach_scale, accuracy: Accuracy):
    """Recompute exactly (`_exact_cuts`) the cuts whose count the Gramian route cannot certify
    (for ESS, or with ``reach`` for causal ESS) or whose unresolved values carry entropy
    (`Accuracy.resolves_entropy`, at the noise floor GRAMIAN_NOISE). Writes reach IN PLACE (the
    tridiagonal form, an exact spectrum as its diagonal, scaled by ``reach_scale``:
    `TridiagonalSpectra.from_values`) and returns (units, rows, singular values) of the cuts
    redone, or None, for the caller to write over lam's values once lam holds values, not
    squares: squared, a cut near 1e-200 underflows to zero. A non-finite bound (a Gramian that overflowed) lands here too; where
    the exact factors overflow as well, the operator's spectra leave the floating-point range:
    the exact route's overflow error."""
    noise = error * (GRAMIAN_NOISE / GRAMIAN_ERROR)
    # (U, W); the values are kept: no window test
    uncertain = ~(accuracy.certain(lam[..., 0], error) & accuracy.resolves_entropy(lam, noise))
    if reach is not None:
        uncertain |= ~accuracy.certain(reach[2], reach[3])
    unit, row = torch.nonzero(uncertain, as_tuple=True)
    if not len(unit):
        return None
    on = unit.to(a.device)  # the operator's device (the results may be on another)
    sigma, reach_sigma = _exact_cuts(a, b, c, on, wanted[row.cpu()])
    sigma = sigma.to(lam.device)
    if reach is not None:
        exact = TridiagonalSpectra.from_values(reach_sigma.to(lam.device))
        reach[0][unit, row], reach[1][unit, row], reach[2][unit, row] = exact.diag, exact.off, exact.top
        reach_scale[unit, row] = exact.scale
    return unit, row, sigma


def _exact_cuts(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, units: torch.Tensor, times: torch.Tensor):
    """sigma(H_t) and sigma(R_t) (each (k, N), descending) of k (unit, cut) pairs, exact: the
    units' a, b, c (U, L, N), each pair's unit units[k] and cut t = times[k].

    H_t = G F^T with F_j = b_j prod_{m=j+1..t-1} a_m (j < t: R_t^T) and G_i = c_i prod_{m=t..i} a_m
    (i >= t: O_t), so sigma(H_t) = sigma(R_G R_F^T) from the R factors of the two factors, and
    sigma(R_t) = sigma(R_F): one segment of the square-root sweep (core/sweeps.py) from zero,
    for all pairs at once (core/cut_roots_kernel.py: a compiled kernel, or its torch reference).
    Raises the overflow error where those factors leave the floating-point range (a growing
    recurrence), naming each unit of the pairs once."""
    reach_root, observe_root = cut_roots(a, b, c, units, times)
    product = observe_root @ reach_root.mT
    if not (bool(product.isfinite().all()) and bool(reach_root.isfinite().all())):
        grown = units.unique()
        raise overflow_error(DiagonalSSM.derived(a=a[grown], b=b[grown], c=c[grown]))
    n = a.shape[-1]  # a prompt shorter than N has rank below it: zeros after its L values
    rank = min(a.shape[1], n)
    pad = (0, n - rank)
    sigma = torch.nn.functional.pad(svdvals(product)[..., :rank], pad)
    return sigma, torch.nn.functional.pad(svdvals(reach_root)[..., :rank], pad)
