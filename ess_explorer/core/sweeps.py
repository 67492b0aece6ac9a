"""Hankel singular values of factored operators by square-root sweeps.

The math (why H_t = O_t R_t, the triangular square roots, the rank-one recursions and why
no Gramian or product of decays is formed) is in docs/spectra.md and in the docstring of
`core/operators.py`.
"""

from __future__ import annotations

import torch

from .accelerator import accelerator_routes, worker_threads
from .checks import require
from .eigen import svdvals
from .operators import DPLRSSM, DiagonalSSM
from .scan import scan_chunk, stacked_qr_r, times_transition
from .workers import in_threads

__all__ = ["balanced_chunk", "factored_hankel_singular_values", "over_chunks", "single_threaded_torch"]


def _rank_one_update_upper(r: torch.Tensor, x: torch.Tensor, rotations: bool | None = None) -> torch.Tensor:
    """Upper-triangular R' with R'^T R' = R^T R + x x^T, batched over the first dim.

    The LINPACK ``dchud`` scheme: N Givens rotations fold x into R row by row, so no
    square of R is formed and R's small singular values keep their relative accuracy.
    A rotation of the pair (row_k of R, x) is a multiplication of z = row_k + i x by
    conj(z_k) / |z_k|; complex arithmetic does it in a few vectorised ops per row.
    ``rotations``: Givens (True) or a batched QR (False); default by device (see below).
    r: (B, N, N) upper triangular (diagonal of any sign), updated IN PLACE and returned;
    x: (B, N), overwritten (it ends as zeros). In place because fresh large tensors on
    every step cost more in page faults than the arithmetic.
    """
    n = r.shape[-1]
    if not (accelerator_routes(r.device) if rotations is None else rotations):
        # On CPU one batched LAPACK QR of the stacked [R; x^T]. In one thread the N vectorised
        # rotations below are faster for a large batch (0.9 against 3.2 ms for 768 16 x 16
        # factors), but they are about 6N small torch ops whose Python steps hold the GIL, so
        # with a thread per core a whole Mamba layer gains nothing from them (6.2 against 5.8 s
        # at L = 512 on one machine, within run-to-run noise on another); the QR is one call
        # that releases the GIL. On a GPU the rotations avoid per-matrix solvers.
        r.copy_(stacked_qr_r(r, x[:, None, :]))
        return r
    for k in range(n):
        z = torch.complex(r[:, k, k:], x[:, k:])  # (B, N - k)
        pivot = z[:, :1]
        size = pivot.abs()
        # conj(z_k) / |z_k| from its real and imaginary parts: torch's complex division by a
        # subnormal |z_k| (below 2.2e-308: a state after near-zero decays, as in trained Mamba2
        # heads) gives inf and NaN. A zero pivot (row k and x both vanish at k) needs no rotation.
        nonzero = size > 0
        divisor = torch.where(nonzero, size, 1)
        phase = torch.where(nonzero, torch.complex(pivot.real / divisor, -pivot.imag / divisor), 1)
        z = z * phase
        r[:, k, k:] = z.real
        x[:, k:] = z.imag
    return r


def factored_hankel_singular_values(
    ssm: DiagonalSSM | DPLRSSM,
    *,
    positions: torch.Tensor,
    top_k: int | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    chunk_bytes: int | None = None,
    method: str = "auto",
    causal: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Singular values of H_t for every unit of ``ssm`` at the given positions.

    Returns ``(*batch, P, K)`` with K = min(top_k, N, L // 2), descending, row 0 (t = 0)
    all zeros. Units are processed in chunks whose stored square roots take about
    ``chunk_bytes`` (default 512 MiB; on CUDA a quarter of the free memory, at most 8 GiB); on CPU the chunks run in parallel threads (one per torch thread),
    each with single-threaded torch ops, since the work is many small ops and small
    LAPACK calls that torch would not spread over cores by itself.

    method: "sweep" (one batched step per time step, core/sweeps.py), "scan" (a blocked
    scan, about 2 sqrt(L) batched calls, core/scan.py) or "auto": the sweep on CPU (fewer
    flops; Python steps cost little there), the scan on any other device (each step is a
    kernel launch there). Both give the same values to rounding.

    causal=True also returns sigma(R_t) of the reachability factor, (*batch, P, N), the
    spectrum causal ESS counts (core/causal.py): the forward half of the sweep or the scan
    already carries that factor, so this costs one N x N SVD per cut and no second pass.
    """
    require(method in ("auto", "sweep", "scan"), f"method must be 'auto', 'sweep' or 'scan', got {method!r}")
    device = torch.device(device) if device is not None else ssm.a.device
    batch_shape, length, n = ssm.batch_shape, ssm.length, ssm.state_size
    k_out = min(n, length // 2) if top_k is None else min(top_k, n, length // 2)  # rank(H_t) <= L // 2
    positions = positions.to(torch.long).cpu()
    a, b, c = (x.reshape(-1, length, n) for x in (ssm.a, ssm.b, ssm.c))
    # The low-rank part of A_t (DPLRSSM); a DiagonalSSM is the r = 0 case and has none.
    has_low_rank = isinstance(ssm, DPLRSSM) and ssm.rank > 0
    low_rank = [x.reshape(-1, length, n, ssm.rank) for x in (ssm.p, ssm.q)] if has_low_rank else None
    units = a.shape[0]
    out = torch.zeros(units, len(positions), k_out, dtype=dtype, device=device)
    reach_out = torch.zeros(units, len(positions), n, dtype=dtype, device=device) if causal else None
    inside = (positions >= 1) & (positions < length)  # t = 0 has no past: stays zero
    wanted = torch.unique(positions[inside])

    def result():
        shaped = out.reshape(*batch_shape, len(positions), k_out)
        return (shaped, reach_out.reshape(*batch_shape, len(positions), n)) if causal else shaped

    if units == 0 or len(wanted) == 0:
        return result()
    if method == "auto":
        method = "scan" if accelerator_routes(device) else "sweep"
    if chunk_bytes is None:  # a GPU is fed larger chunks: fewer, larger launches
        chunk_bytes = 512 << 20 if device.type != "cuda" else min(8 << 30, torch.cuda.mem_get_info(device)[0] // 4)
    bytes_per_unit = len(wanted) * n * n * torch.finfo(dtype).bits // 8
    if method == "scan":  # the local roots of both halves at every step (and a DPLR's transition
        # products beside them), plus the stacked fix-up
        bytes_per_unit = (
            (2 * length * (2 if has_low_rank else 1) + 4 * len(wanted)) * n * n * torch.finfo(dtype).bits // 8
        )
    workers = worker_threads(device)
    chunk = balanced_chunk(units, chunk_bytes // max(1, bytes_per_unit), workers)
    row_of_wanted = torch.searchsorted(wanted, positions[inside])

    def run(sl: slice) -> None:
        ac, bc, cc = (x[sl].to(device=device, dtype=dtype) for x in (a, b, c))
        pq = None if low_rank is None else tuple(x[sl].to(device=device, dtype=dtype) for x in low_rank)
        if method == "sweep":
            sigma = _sweep_chunk(ac, bc, cc, wanted, low_rank=pq, causal=causal)  # (chunk, W, N)
        else:
            sigma = scan_chunk(ac, bc, cc, wanted, causal=causal, low_rank=pq)  # (chunk, W, N)
        if causal:
            sigma, reach = sigma
            reach_out[sl, inside] = reach[:, row_of_wanted]
        out[sl, inside] = sigma[:, row_of_wanted, :k_out]

    over_chunks(run, units, chunk, workers)
    return result()


def balanced_chunk(total: int, most: int, workers: int) -> int:
    """The chunk size for ``total`` items in chunks of at most ``most`` whose count is a
    multiple of ``workers``: equal chunks, so that no thread is left with one more chunk
    than the others (3 chunks on 2 threads take as long as 4)."""
    rounds = -(-total // max(1, most * workers))  # chunks per worker
    return max(1, -(-total // (rounds * workers)))


def over_chunks(run, total: int, size: int, workers: int) -> None:
    """run(chunk) for the slices of ``size`` items that cover range(total): in ``workers``
    threads, each with single-threaded torch ops, when there are several of both; else one
    after the other in this thread. Batched small LAPACK calls (QR, SVD) loop over the batch
    on one core, so only threads over chunks put both cores to work."""
    size = max(1, size)
    chunks = [slice(start, min(total, start + size)) for start in range(0, total, size)]

    def run_single_threaded(sl: slice) -> None:
        with single_threaded_torch():
            run(sl)

    if workers > 1 and len(chunks) > 1:  # on an interrupt or an error, the chunks not yet begun are dropped
        in_threads(run_single_threaded, chunks, workers)
    else:
        for sl in chunks:
            run(sl)


class single_threaded_torch:
    """Run torch ops single-threaded inside, restoring the thread count after.

    Use it inside each worker thread: OpenMP's thread count is per thread, so setting it
    in the thread that starts a pool leaves every worker with a full team of its own
    (oversubscribed cores, and slower than no threads at all)."""

    def __enter__(self):
        self.saved = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.saved)


def _segment_update(state: torch.Tensor, scales: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    """m diagonal steps of a sweep at once, IN PLACE: the root X (B, N, N) after steps
    p + 1..p + m from the root after step p. scales, vectors: (m, B, N).

    Over the segment P -> D P D + sum_j (d_j v_j)(d_j v_j)^T, with D the product of all m
    scales and d_j that of the scales after step j (docs/spectra.md), so the new root is
    the R factor of [X D; (d_j v_j)^T ...]: one QR of (N + m) x N instead of m updates.
    Only products of decays and QRs of stacked factors are formed, as in the scan
    (core/scan.py); a product that underflows drops a term below 1e-300 of the state.
    """
    after = torch.ones_like(scales)  # after[j] = prod_{k > j} scales[k]
    if scales.shape[0] > 1:
        after[:-1] = scales[1:].flip(0).cumprod(0).flip(0)
    total = scales[0] * after[0]  # (B, N)
    rows = (vectors * after).transpose(0, 1)  # (B, m, N)
    state.copy_(stacked_qr_r(state * total[:, None, :], rows))
    return state


def _sweep_chunk(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    wanted: torch.Tensor,
    rotations: bool | None = None,
    low_rank: tuple[torch.Tensor, torch.Tensor] | None = None,
    causal: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Square-root sweeps for a chunk of units. a, b, c: (B, L, N); wanted: sorted t's;
    low_rank: (p, q), each (B, L, N, r), for transitions A_t = diag(a_t) + p_t q_t^T, or None
    for diagonal ones. Returns (B, len(wanted), N); with ``causal`` also sigma(U_c(t)) =
    sigma(R_t) at the same cuts, (B, len(wanted), N).

    Both sweeps have the form S <- rank_one(S M, vector) (`scan.times_transition`):
        forward   U_c(t+1) = rank_one(U_c(t) A_t^T, b_t)          U_c^T U_c = R_t R_t^T
        backward  W_t      = rank_one(W_{t+1} A_{t+1}, c_t)       U_o(t) = W_t A_t
    (A_t = diag(a_t) for a DiagonalSSM.)
    They are independent, so one loop runs them together on a stacked batch of 2B (the
    cost is the number of small torch ops, not flops): at step s the forward half makes
    U_c(s + 1) and the backward half W_{L-1-s}. Whichever root of a cut t comes first
    waits in ``buffer``; when its partner arrives the slot is replaced by the product
    U_o(t) U_c(t)^T, since H_t = (Q_o U_o(t)) (U_c(t)^T Q_c^T) gives
    sigma(H_t) = sigma(U_o(t) U_c(t)^T). Memory: one (W, B, N, N) buffer.
    Only the steps after which a root is needed are stopped at; the diagonal steps between
    two stops are taken as one segment (`_segment_update`), so cuts at a stride s cost
    about 2 L / s QRs instead of L.
    """
    units, length, n = a.shape
    slot = {int(t): i for i, t in enumerate(wanted.tolist())}
    # every slot is written (each wanted t is a stop of both halves): no zero fill, which
    # costs as much as a tenth of the sweep at (1536 channels, L = 1024)
    # Roots and products are kept column-major (`.mT` of a row-major block), LAPACK's order:
    # the QRs and the final SVD then copy them as blocks instead of transposing them.
    # Slot-major (W, B, N, N): a slot is one contiguous block, not B blocks a slot apart.
    buffer = torch.empty(len(slot), units, n, n, dtype=a.dtype, device=a.device).mT
    reach_sigma = torch.zeros(units, len(slot), n, dtype=a.dtype, device=a.device) if causal else None

    if low_rank is not None:
        rotations = False  # S A_t is not triangular: the QR route re-triangularises it
        p, q = low_rank
        zero = torch.zeros_like(p[:, :1])
        p_next, q_next = (torch.cat([x[:, 1:], zero], 1) for x in (p, q))
        # Per step: forward multiplies by A_t^T (left q, right p), backward by A_{t+1}.
        lefts = torch.cat([q, p_next.flip(1)]).transpose(0, 1).contiguous()  # (L, 2B, N, r)
        rights = torch.cat([p, q_next.flip(1)]).transpose(0, 1).contiguous()

    def store_product(i: int, observe: torch.Tensor, t: int, reach: torch.Tensor) -> None:
        """buffer[i] = U_o(t) U_c(t)^T with U_o(t) = W_t A_t, written as its transpose
        U_c U_o^T into the row-major view of the column-major slot (a block copy)."""
        if low_rank is None:  # one multiply; clone-then-scale would be a second pass per cut
            observe = observe * a[:, t, None, :]
        else:
            observe = times_transition(observe.clone(), a[:, t], low_rank[0][:, t], low_rank[1][:, t])
        buffer[i].mT.copy_(reach @ observe.mT)

    # Time-major copies so that each step reads contiguous rows; the backward half runs
    # in reversed time and its scale is a_{t+1} (zero past the end, where W is still 0).
    shifted = torch.cat([a[:, 1:], torch.zeros_like(a[:, :1])], 1)
    scales = torch.cat([a, shifted.flip(1)]).transpose(0, 1).contiguous()  # (L, 2B, N)
    vectors = torch.cat([b, c.flip(1)]).transpose(0, 1).contiguous()  # (L, 2B, N)
    state = torch.zeros(2 * units, n, n, dtype=a.dtype, device=a.device).mT  # [U_c ; W], column-major
    vector = torch.empty(2 * units, n, dtype=a.dtype, device=a.device)
    # The steps after which a root is needed: t - 1 (forward) and L - 1 - t (backward) for
    # each wanted t. Between two of them the diagonal steps are taken as one segment.
    stops = sorted({int(t) - 1 for t in wanted} | {length - 1 - int(t) for t in wanted})
    if low_rank is not None:  # a DPLR transition is not diagonal: every step on its own
        stops = list(range(stops[-1] + 1))
    previous = -1
    for step in stops:
        if step > previous + 1:
            _segment_update(state, scales[previous + 1 : step + 1], vectors[previous + 1 : step + 1])
        else:
            if low_rank is None:
                times_transition(state, scales[step])
            else:
                times_transition(state, scales[step], lefts[step], rights[step])
            vector.copy_(vectors[step])
            _rank_one_update_upper(state, vector, rotations)
        previous = step
        reach, observe = state[:units], state[units:]
        forward_t, backward_t = step + 1, length - 1 - step
        if causal and forward_t in slot:  # U_c(t): what the past u_0..u_{t-1} wrote
            reach_sigma[:, slot[forward_t]] = svdvals(reach)
        if forward_t == backward_t and forward_t in slot:
            store_product(slot[forward_t], observe, forward_t, reach)
            continue
        if forward_t in slot:  # W_t was stored earlier iff the backward half passed t already
            i = slot[forward_t]
            if forward_t > backward_t:
                store_product(i, buffer[i], forward_t, reach)
            else:
                buffer[i] = reach
        if backward_t in slot:
            i = slot[backward_t]
            if backward_t < forward_t:
                store_product(i, observe, backward_t, buffer[i])
            else:
                buffer[i] = observe
    sigma = svdvals(buffer).transpose(0, 1)  # (B, W, N)
    return (sigma, reach_sigma) if causal else sigma
