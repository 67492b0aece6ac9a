"""Spectra of the cuts H_t = T[t:, :t]: the dense path, and the dispatch to the factored one.

Conventions (docs/conventions.md):
- 0-based time. H_t = T[t:, :t] maps the past inputs u_0..u_{t-1} to the present and
  future outputs y_t..y_{L-1}; the diagonal (direct feed-through) is excluded.
  Row t = 0 has no past: its singular values and both ESS are 0.
- Spectra come back as (*batch, P, K): row p holds sigma(H_t) for t = positions[p], descending,
  zero padded to K = the largest rank any computed cut can have.

No torch.nn and no UI here: tensors in, tensors out.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch
from tqdm.auto import tqdm

from . import dense_jobs
from .accelerator import accelerator_routes, worker_threads
from .checks import all_finite, as_tensor, finite_spectra, largest_above_diagonal, require
from .eigen import eigvalsh, svdvals
from .gram import gram_unsafe, gram_values
from .gramian import gramian_hankel_singular_values
from .operators import FACTORED_OPERATORS, DiagonalSSM, overflow_error
from .precision import EXACT, Accuracy, check_precision, zero_subnormal_cuts
from .sweeps import factored_hankel_singular_values, single_threaded_torch
from .workers import in_threads

__all__ = [
    "hankel_singular_values",
    "validate_operator",
    "choose_ssm_path",
    "DENSE_BUDGET_BYTES",
    "DENSE_CHUNK_CELLS",
    "dense_bytes",
]

# The most memory the dense path may allocate (its copy of T, the output and one cut's
# Gram matrix), checked before anything is allocated; raise it deliberately if needed.
DENSE_BUDGET_BYTES = 2 * 1024**3
DENSE_CHUNK_CELLS = 32_000_000  # dense T cells a caller makes at once for this path (~256 MB in float64)


def dense_bytes(batch: int, length: int, n_positions: int, k_out: int, itemsize: int, copies: bool) -> int:
    """Bytes the dense path allocates for ``batch`` operators of size L: the output
    (batch, P, K), the Gram matrices (batch, L/2, L/2) in flight (the running one and one
    per worker thread plus one queued, `_recursive_gram_fill`), the compiled kernel's
    tridiagonal forms of a group of cuts (two (batch, cuts, L/2), `dense_jobs.forms_group`)
    and, when the operator is converted to another dtype or device, its copy (batch, L, L)."""
    half = (length + 1) // 2
    grams = min(n_positions + 1, torch.get_num_threads() + 2)
    forms = 2 * min(n_positions, dense_jobs.forms_group(batch, length)) * half
    return itemsize * batch * (n_positions * k_out + grams * half * half + forms + (length * length if copies else 0))


def validate_operator(op, name: str = "op") -> torch.Tensor:
    """Check a dense operator of shape (*batch, L, L): square, finite, lower triangular."""
    tensor = as_tensor(op, name)
    require(
        tensor.ndim >= 2,
        f"{name} must have shape (*batch, L, L); got a tensor with {tensor.ndim} dimension(s)",
    )
    require(
        tensor.shape[-1] == tensor.shape[-2],
        f"{name} must be square in its last two dimensions (L x L); got shape {tuple(tensor.shape)}",
    )
    require(
        tensor.shape[-1] >= 1 and tensor.numel() > 0,
        f"{name} is empty (shape {tuple(tensor.shape)}); an operator needs L >= 1 and at least one unit",
    )
    require(tensor.is_floating_point(), f"{name} must be a floating-point tensor, got {tensor.dtype}")
    require(all_finite(tensor), f"{name} contains NaN or infinite values")
    worst = largest_above_diagonal(tensor)
    if worst > 0:
        where = torch.nonzero(torch.triu(tensor, diagonal=1))[0].tolist()
        raise ValueError(
            f"{name} is not lower triangular (causal): entry {tuple(where)} above the diagonal is "
            f"{tensor[tuple(where)].item():.3g} (largest above-diagonal magnitude {worst:.3g}). "
            "ESS is defined for causal operators y_i = sum_{j<=i} T[i, j] u_j; pass T, not T^T."
        )
    return tensor


def cut_positions(length: int, positions, stride: int | None) -> torch.Tensor:
    """The cuts t (long, (P,)) that ``positions`` or ``stride`` name on a prompt of ``length``
    (default every t), checked: integers in [0, L - 1], a positive integer stride, not both."""
    if positions is not None:
        require(stride is None, "give either positions or stride, not both")
        if not isinstance(positions, torch.Tensor):
            positions = np.asarray(positions)
            require(
                positions.dtype.kind in "iub",
                f"positions must be integers, got {positions.dtype} (e.g. {positions.flatten()[:1].tolist()})",
            )
        given = torch.as_tensor(positions)
        require(given.numel() > 0, "positions is empty; give at least one position t")
        require(
            not given.is_floating_point() and not given.is_complex() and given.dtype != torch.bool,
            f"positions must be integers, got {given.dtype} (e.g. {given.flatten()[0].item()!r})",
        )
        pos = given.to(torch.long).flatten()
        require(
            bool(((pos >= 0) & (pos < length)).all()),
            f"positions must lie in [0, {length - 1}]; got min {pos.min().item()}, max {pos.max().item()}",
        )
        return pos
    require(
        stride is None or (isinstance(stride, (int, np.integer)) and not isinstance(stride, bool) and stride >= 1),
        f"stride must be a positive integer, got {stride!r}",
    )
    stride = 1 if stride is None else int(stride)
    return torch.arange(0, length, stride)


def choose_ssm_path(length: int, state_size: int, positions, device=None, units_per_owner: float = 1.0) -> dict:
    """The cheaper exact path for one DiagonalSSM unit: ``{"method", "reason"}``.

    "dense" (materialise T, then the dense path) where the state is large against L, else
    the factored path ("sweep" on CPU, "scan" elsewhere; see `factored_hankel_singular_values`).
    Both are exact; the choice only moves the cost. Rough flop counts per unit:

        factored  4 L N^3 (the two sweeps, QR of (N+1) x N per step)
                  + 12 N^3 per wanted cut (the N x N product and its SVD)
        dense     2 L^2 N (materialising) + per cut t, with g = min(t, L - t):
                  2 (L - t) t g (its Gram) + 6 g^3 (eigvalsh / SVD)

    Where N >= L / 2 no cut has rank above N, so the N x N factors are no smaller than the
    cuts themselves and dense always wins. ``units_per_owner`` > 1: the units are row-scaled
    copies of shared operators (a head's channels, core/row_scaled.py), whose dense path
    costs per unit (2 L^2 N + sum_t 6 (L - t) g^2) / units_per_owner (the owner's
    materialising and SVDs) + sum_t 4 (L - t) min(g, N)^2 (each channel's own SVD).
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    factored_method = "scan" if accelerator_routes(device) else "sweep"
    n, length = int(state_size), int(length)
    if 2 * n >= length:
        return {"method": "dense", "reason": f"N={n} >= L/2={length // 2}"}
    t = torch.as_tensor(positions, dtype=torch.float64).flatten()
    t = t[(t > 0) & (t < length)]
    g = torch.minimum(t, length - t)
    factored = 4.0 * length * n**3 + 12.0 * n**3 * len(t)
    if units_per_owner > 1:
        owner = 2.0 * length**2 * n + float((6 * (length - t) * g**2).sum())
        dense = owner / units_per_owner + float((4 * (length - t) * g.clamp(max=n) ** 2).sum())
        how = f"row-scaled dense ({units_per_owner:g} units per owner)"
    else:
        dense = 2.0 * length**2 * n + float((2 * (length - t) * t * g + 6 * g**3).sum())
        how = "dense"
    if dense < factored:
        return {
            "method": "dense",
            "reason": f"N={n}, L={length}: est. flops {how} {dense:.2g} < factored {factored:.2g}",
        }
    return {
        "method": factored_method,
        "reason": f"N={n}, L={length}: est. flops factored {factored:.2g} <= {how} {dense:.2g}",
    }


def hankel_singular_values(
    op,
    *,
    top_k: int | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    positions: Iterable[int] | None = None,
    stride: int | None = None,
    method: str = "auto",
    batched: bool | None = None,
    progress: bool = False,
    precision: str | Accuracy = "exact",
) -> torch.Tensor:
    """Singular values of every cut H_t = T[t:, :t].

    Parameters
    ----------
    op : array (*batch, L, L) lower triangular, or a DiagonalSSM / DPLRSSM.
    top_k : keep the K largest values per cut (default: all, K = L // 2 dense, N factored).
    dtype : computation and output dtype (float64 by default; float32 is ~1e-6 relative).
    device : torch device to compute on (default: the operator's own).
    positions / stride : compute only these cuts t (output rows follow ``positions``);
        default every t in 0..L-1. A stride is a quick preview.
    method : dense path: "auto" (Gram + eigvalsh with an SVD redo of ill-conditioned
        cuts; as accurate as "svd" and ~2x faster), "svd" (one svdvals per cut) or "gram"
        (no redo: fast, loses values below ~1e-8 * sigma_1).
        DiagonalSSM: "auto", "sweep" or "scan" (core/sweeps.py, core/scan.py; "auto" is the
        sweep on CPU and the scan elsewhere).
    batched : dense path only. True: many cuts per call, zero-padded to a common size
        within memory-bounded groups of similar size (a few dozen calls per head at L = 1024,
        the GPU path); False: one call per cut, in threads on CPU. None (default): batched
        on any device but the CPU.
    precision : "exact" (default: every value within 1e-6 sigma_k + 1e-10 sigma_1 of an SVD
        of the cut) or "ess" (core/precision.py: values good for ESS at tol = 1e-3, resolved
        down to about 1e-7 sigma_1, by Gram and Gramian eigenvalues); an `Accuracy` names
        the tolerance too.

    Returns
    -------
    tensor (*batch, P, K), descending and zero-padded; P = L unless positions/stride given.
    A cut whose sigma_1 lies below the dtype's normal range reads as zero
    (`precision.zero_subnormal_cuts`).

    Raises ValueError for a bad operator or option, for a dense input whose memory
    (`dense_bytes`) exceeds DENSE_BUDGET_BYTES (before allocating anything), and for
    spectra that overflow (e.g. decays |a| > 1 over a long sequence): never inf / NaN.
    """
    require(
        top_k is None or (isinstance(top_k, (int, np.integer)) and not isinstance(top_k, bool) and top_k >= 1),
        f"top_k must be a positive integer or None, got {top_k!r}",
    )
    require(
        isinstance(dtype, torch.dtype) and dtype.is_floating_point and not dtype.is_complex,
        f"dtype must be a real floating-point torch dtype such as torch.float64, got {dtype!r}",
    )
    accuracy = Accuracy(check_precision(precision)) if isinstance(precision, str) else precision
    try:
        sigma = _hankel_singular_values(
            op, top_k, dtype, device, positions, stride, method, batched, progress, accuracy
        )
    except torch.linalg.LinAlgError as error:
        raise overflow_error(op, error) from error
    if not finite_spectra(sigma):
        raise overflow_error(op)
    return zero_subnormal_cuts(sigma)


def _hankel_singular_values(
    op, top_k, dtype, device, positions, stride, method, batched, progress, accuracy
) -> torch.Tensor:
    if isinstance(op, FACTORED_OPERATORS):
        pos = cut_positions(op.length, positions, stride)
        if accuracy.fast and isinstance(op, DiagonalSSM) and method == "auto":
            return gramian_hankel_singular_values(
                op, positions=pos, accuracy=accuracy, top_k=top_k, dtype=dtype, device=device
            )
        return factored_hankel_singular_values(
            op, positions=pos, top_k=top_k, dtype=dtype, device=device, method=method
        )
    require(method in ("auto", "svd", "gram"), f"method must be 'auto', 'svd' or 'gram', got {method!r}")
    _check_dense_budget(as_tensor(op, "op"), top_k, dtype, device, positions, stride)  # before any allocation
    dense = validate_operator(op)
    length = dense.shape[-1]
    pos = cut_positions(length, positions, stride)
    dense = dense.to(device=device if device is not None else dense.device, dtype=dtype)
    batch_shape = dense.shape[:-2]
    flat = dense.reshape(-1, length, length)
    max_rank = length // 2
    k_out = max_rank if top_k is None else min(int(top_k), max_rank)
    out = torch.zeros(flat.shape[0], len(pos), k_out, dtype=dtype, device=dense.device)
    if batched if batched is not None else accelerator_routes(dense.device):
        groups = _size_groups(pos, length, flat.shape[0])
        for rows in tqdm(groups, disable=not progress, desc="cut groups", leave=False):
            sigma = _group_singular_values(flat, pos[rows], method, accuracy)  # (B, len(rows), g)
            width = min(k_out, sigma.shape[-1])
            out[:, rows, :width] = sigma[..., :width]
        return out.reshape(*batch_shape, len(pos), k_out)
    bar = tqdm(total=len(pos), disable=not progress, desc="cuts", leave=False)
    workers = worker_threads(dense.device)
    if method != "svd":
        _recursive_gram_fill(flat, pos, method, out, k_out, workers, bar, accuracy)
        bar.close()
        return out.reshape(*batch_shape, len(pos), k_out)

    def fill(rows: list[int]) -> None:
        with single_threaded_torch():
            fill_rows(rows)

    def fill_rows(rows: list[int]) -> None:
        for row in rows:
            t = int(pos[row])
            if t > 0:
                sigma = svdvals(flat[:, t:, :t])  # method "svd"
                width = min(k_out, sigma.shape[-1])
                out[:, row, :width] = sigma[:, :width]
            bar.update()

    # Cuts are independent LAPACK calls of different shapes that torch cannot batch, and
    # one call barely uses a second core; on CPU, interleaved halves run in two threads.
    rows = list(range(len(pos)))
    if workers > 1 and len(rows) > 1:
        in_threads(fill, [rows[i::workers] for i in range(workers)], workers)
    else:
        fill_rows(rows)
    bar.close()
    return out.reshape(*batch_shape, len(pos), k_out)


def _check_dense_budget(tensor: torch.Tensor, top_k, dtype, device, positions, stride) -> None:
    """ValueError (with the estimate and the ways out) when the dense path on ``tensor``
    would allocate more than DENSE_BUDGET_BYTES; shapes only, nothing is allocated."""
    if tensor.ndim < 2 or tensor.shape[-1] != tensor.shape[-2]:
        return  # validate_operator says what is wrong
    length = tensor.shape[-1]
    batch = int(np.prod(tensor.shape[:-2], dtype=np.int64))
    if positions is not None:
        n_positions = int(np.asarray(positions).size) if not isinstance(positions, torch.Tensor) else positions.numel()
    else:
        n_positions = -(-length // max(1, int(stride or 1)))
    k_out = length // 2 if top_k is None else min(int(top_k), length // 2)
    target = torch.device(device) if device is not None else tensor.device
    itemsize = torch.empty(0, dtype=dtype).element_size()
    need = dense_bytes(batch, length, n_positions, k_out, itemsize, tensor.dtype != dtype or tensor.device != target)
    if need > DENSE_BUDGET_BYTES:
        raise ValueError(
            f"the dense path would allocate about {_size(need)} for operators of shape {tuple(tensor.shape)} "
            f"(budget {_size(DENSE_BUDGET_BYTES)}, spectra.DENSE_BUDGET_BYTES); compute fewer cuts "
            "(stride= or positions=), keep fewer values (top_k=), or pass the operator factored (a DiagonalSSM)"
        )


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1024**3:.1f} GiB" if n_bytes >= 1024**3 else f"{n_bytes / 1024**2:.2f} MiB"


def _gram_sequence(flat: torch.Tensor, times: list[int]):
    """(t, Gram of cut t) for every t in ``times`` (each >= 1): H_t^T H_t (t x t) where
    t <= L - t, else H_t H_t^T ((L - t) x (L - t)); H_t = flat[:, t:, :t], flat (B, L, L).

    Each Gram is the previous one plus rank-one terms, not a new product:
        t <= L - t, t descending:  H_t^T H_t = (H_{t+1}^T H_{t+1})[:t, :t] + T[t, :t]^T T[t, :t]
        t >  L - t, t ascending:   H_{t+1} H_{t+1}^T = (H_t H_t^T)[1:, 1:] + T[t+1:, t] T[t+1:, t]^T
    Only sums of positive semidefinite terms (no cancellation, the rounding of one product), at
    O(g^2) per step instead of O((L - t) t g) per cut: all Grams of a head in O(L^3). Each step
    writes a new contiguous Gram (one fused pass over the previous one's block), which is
    yielded as it is: no copy, and the consumer may read it while the next one is built."""
    length = flat.shape[-1]
    tall = sorted((t for t in set(times) if t <= length - t), reverse=True)
    wide = sorted(t for t in set(times) if t > length - t)
    if tall:
        current = tall[0]
        cut = flat[:, current:, :current]
        gram = cut.mT @ cut
        for t in tall:
            while current > t:
                current -= 1
                row = flat[:, current, :current]  # the row that cut `current` gains
                gram = torch.addcmul(gram[:, :current, :current], row[:, :, None], row[:, None, :])
            yield t, gram
    if wide:
        current = wide[0]
        cut = flat[:, current:, :current]
        gram = cut @ cut.mT
        for t in wide:
            while current < t:
                column = flat[:, current + 1 :, current]  # the column that cut `current + 1` gains
                gram = torch.addcmul(gram[:, 1:, 1:], column[:, :, None], column[:, None, :])
                current += 1
            yield t, gram


def _recursive_gram_fill(
    flat, pos, method: str, out, k_out: int, workers: int, bar, accuracy: Accuracy = EXACT
) -> None:
    """The per-cut dense path for method "gram" / "auto": each cut's Gram, its eigenvalues, the
    guard of `_guarded`, into ``out[:, row, :width]`` for every row of ``pos``. A large job on
    a CPU in float64 by the compiled kernel (`dense_jobs.takes`, `dense_jobs.cut_spectra`; a
    (unit, cut) whose QL gave up gets an SVD); else Grams from `_gram_sequence`, their
    eigenvalues in threads."""
    rows_of: dict[int, list[int]] = {}
    for row, t in enumerate(pos.tolist()):
        if t > 0:
            rows_of.setdefault(int(t), []).append(row)
        else:
            bar.update()

    def write(t: int, sigma: torch.Tensor) -> None:
        width = min(k_out, sigma.shape[-1])
        out[:, rows_of[t], :width] = sigma[:, None, :width]  # every row that stands for cut t

    if dense_jobs.takes(flat, rows_of):

        def finish_group(times: list[int], sigma: torch.Tensor, failed: torch.Tensor) -> None:
            # (the kernel moved the bar) the guard on every cut at once, at its own Gram size
            sizes = torch.tensor([min(t, flat.shape[-1] - t) for t in times])
            unsafe = gram_unsafe(sigma, sizes, accuracy) if method != "gram" else torch.zeros_like(failed)
            dense_jobs.redo_by_svd(sigma, flat, times, failed | unsafe, workers)
            rows, cuts = zip(*[(row, k) for k, t in enumerate(times) for row in rows_of[t]])
            out[:, list(rows)] = sigma[:, list(cuts), :k_out]  # k_out <= (L + 1) // 2, sigma's width

        operators = np.ascontiguousarray(flat.detach().numpy())  # one compiled layout: C order
        dense_jobs.cut_spectra(operators, rows_of, workers, bar, finish_group)
        return

    def finish(t: int, gram: torch.Tensor) -> None:  # a job the kernel does not repay: torch's eigvalsh too
        with single_threaded_torch():
            write(t, gram_values(gram, flat[:, t:, :t], method, accuracy, allow_kernel=False))
        bar.update(len(rows_of[t]))

    if workers <= 1:
        for t, gram in _gram_sequence(flat, list(rows_of)):
            finish(t, gram)
        return
    # The workers have the cores; Grams in flight: one per worker and one queued (dense_bytes).
    with single_threaded_torch():
        in_threads(lambda job: finish(*job), _gram_sequence(flat, list(rows_of)), workers, in_flight=workers)


# Cells of padded cut matrices one batched call may hold (float64: 2 GiB).
BATCH_CELLS = 1 << 28
MAX_GROUP = 64  # cuts per batched call at most


def _size_groups(pos: torch.Tensor, length: int, units: int) -> list[torch.Tensor]:
    """Row indices into ``pos`` grouped for the batched path: cuts t >= 1 sorted by their
    Gram size g = min(t, L - t), consecutive runs of at most MAX_GROUP cuts whose padded
    (units, cuts, L, g_max) stack stays within BATCH_CELLS (at least one cut)."""
    size = torch.minimum(pos, length - pos)
    order = torch.argsort(size, descending=True, stable=True)
    order = order[size[order] > 0].tolist()
    groups, start = [], 0
    while start < len(order):
        g_max = int(size[order[start]])
        count = max(1, min(MAX_GROUP, BATCH_CELLS // max(1, units * length * g_max)))
        groups.append(torch.tensor(order[start : start + count], dtype=torch.long))
        start += count
    return groups


def _group_singular_values(
    flat: torch.Tensor, times: torch.Tensor, method: str, accuracy: Accuracy = EXACT
) -> torch.Tensor:
    """Descending singular values (B, C, g_max) of the cuts t in ``times`` of every operator
    in ``flat`` (B, L, L), padded with zeros (padding a matrix with zero rows or columns
    only adds zero singular values, so nothing is approximated).

    A cut with t <= L - t is taken as its first g_max columns Z = T[:, :g_max] with rows < t
    and columns >= t zeroed ((L, g_max), Gram Z^T Z); one with t > L - t as its last g_max
    rows with columns >= t and rows < t zeroed ((g_max, L), Gram Z Z^T) (`_masked_cuts`).
    The Grams come from running sums over the group's cuts (`_group_grams`), not one product
    per cut; same Gram/SVD choice and guard as `gram_values` (core/gram.py), the guard's SVDs on the
    masked cuts of the (unit, cut) pairs it names.
    """
    length = flat.shape[-1]
    times = times.to(flat.device)
    g_max = int(torch.minimum(times, length - times).max())
    tall = times <= length - times  # (C,)
    sigma = flat.new_zeros(flat.shape[0], len(times), g_max)
    for select, is_tall in ((tall, True), (~tall, False)):
        if not bool(select.any()):
            continue
        t = times[select]  # (c,)
        if method == "svd":
            values = svdvals(_masked_cuts(flat[:, None], t, g_max, is_tall))
        else:
            values = eigvalsh(_group_grams(flat, t, g_max, is_tall)).flip(-1).clamp_min(0).sqrt()
            if method == "auto":
                # guard as in gram_values, on each cut's own rank min(t, L - t):
                # padded zeros are not small values
                rank = torch.minimum(t, length - t).reshape(1, -1).expand(values.shape[0], -1)
                unsafe = gram_unsafe(values, rank, accuracy)
                if bool(unsafe.any()):
                    unit, cut = unsafe.nonzero(as_tuple=True)
                    values[unit, cut] = svdvals(_masked_cuts(flat[unit], t[cut], g_max, is_tall))
        sigma[:, select] = values
    return sigma


def _masked_cuts(flat: torch.Tensor, t: torch.Tensor, g_max: int, tall: bool) -> torch.Tensor:
    """The cuts t of ``flat`` (..., L, L) padded to g_max as `_group_singular_values` takes
    them: (..., L, g_max) where tall, else (..., g_max, L); t broadcasts against flat's
    leading dimensions."""
    length = flat.shape[-1]
    idx = torch.arange(length, device=flat.device)
    t = t[..., None, None]
    if tall:  # row i >= t, column j < t
        return flat[..., :g_max] * ((idx[:, None] >= t) & (idx[None, :g_max] < t))
    rows = idx[length - g_max :]  # rows L - g .. L - 1, row i >= t, column j < t
    return flat[..., length - g_max :, :] * ((rows[:, None] >= t) & (idx[None, :] < t))


def _group_grams(flat: torch.Tensor, t: torch.Tensor, g_max: int, tall: bool) -> torch.Tensor:
    """The padded Grams (B, c, g_max, g_max) of the cuts t (c,) of every operator in ``flat``,
    the Grams of `_masked_cuts`: a running sum of the rows (tall cuts, t descending) or
    columns (wide cuts, t ascending) each cut gains over the previous, then the block each
    cut's rank allows. All cuts of a group cost one product over the rows they span, instead
    of one (L x g_max) product per cut, and no masked copy of the cuts."""
    length = flat.shape[-1]
    grams = flat.new_zeros(flat.shape[0], len(t), g_max, g_max)
    idx = torch.arange(g_max, device=flat.device)
    running, previous = None, None
    times = t.tolist()  # one copy to the host, not one per cut
    for k in sorted(range(len(times)), key=times.__getitem__, reverse=tall):
        cut = times[k]
        if tall:  # rows cut .. previous - 1 of the first g_max columns; keep [:t, :t]
            part = flat[:, cut : length if previous is None else previous, :g_max]
            add, keep = part.mT @ part, idx < cut
        else:  # columns previous .. cut - 1 of the last g_max rows; keep rows >= t
            part = flat[:, length - g_max :, 0 if previous is None else previous : cut]
            add, keep = part @ part.mT, idx + length - g_max >= cut
        running = add if running is None else running + add
        grams[:, k] = running * (keep[:, None] & keep[None, :])
        previous = cut
    return grams
