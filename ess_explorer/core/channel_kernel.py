"""The Grams of row-scaled channels and their eigenvalues, as one compiled CPU kernel (numba).

core/row_scaled.py needs, at every cut, the eigenvalues of u small Grams that share one
factor: G_u = F^T diag(w_u) F, F the owner's factor (m, r), w_u the channel's gate squared on
the cut's rows (a Mamba2 head: 64 channels, r mostly 1-60). In torch that is one matrix
product (u, m) x (m, r^2) and a batched `eigvalsh`, whose per-matrix overhead dominates at
these sizes (about 4 us per 16 x 16 matrix, against some 6,000 multiply-adds). Here LANES
channels run side by side, every loop innermost over them: each Gram's lower triangle is
summed over the m rows in cache, then reduced and solved by the lane eigensolver of
core/gramian_kernel.py (Householder across the lanes, trace-scaled, then the QL iteration of
core/tridiagonal_kernel.py). One call takes every owner of a cut, each block of lanes with its
own owner's factor (`ChannelLanes`); given a trim, each factor's decayed last rows are left out
of its Grams (`decayed_rows`; the caller charges them to its guard: core/row_scaled.py).
Measured on one core, 64 channels, m = 128, eigenvalues alone:
r = 8: 0.2 us per matrix (torch 1.3), r = 16: 1.1 (3.9), r = 24: 2.5 (7.5), r = 32: 6.0
(13.0, and core/dense_kernel.py's 7.0). From r = 32 on the lanes' working set (r^2 x 64
values) leaves the cache and core/dense_kernel.py solves faster, but the reference must first
form the Grams as a torch product, which this kernel fuses: Grams and eigenvalues together,
64 channels, this kernel against `reference` (torch's product, the dense kernel's
eigenvalues), one core: m = 64: 1.4-2.0x at r = 32-64; m = 128: 1.45x at r = 32, 1.1x at
r = 48-56, even at 64, 0.9x at 80; m = 220: 1.6x at r = 32, 1.3x at 64, even at 80. The kernel
takes r up to MAX_SIZE.

Accuracy: the Gram's entries are the same sums of m products as torch's (in another order),
and the eigensolver is backward stable with the trace as its scale, so every eigenvalue is
within a small multiple of r eps lambda_1, the bound the caller's guard assumes of any
eigensolver (core/gram.py GRAM_ERROR; tests/test_channel_kernel.py). A lane whose Gram
overflowed or whose QL does not converge is recomputed by the reference.

The reference is `reference` below, the torch route the kernel replaces (the tests compare
them); where numba is missing, or the factor is wider than MAX_SIZE, it runs instead.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from . import compiled
from .accelerator import accelerator_routes
from .compiled import LANES, available, jit
from .eigen import eigvalsh
from .gramian_kernel import _symmetric_eigenvalues

__all__ = ["ChannelLanes", "decayed_lines", "decayed_rows", "gram_eigenvalues", "reference", "MAX_SIZE"]

MAX_SIZE = 64  # the widest factor the kernel takes (module docstring: measured crossover 64-80)


def gram_eigenvalues(base: torch.Tensor, gate: torch.Tensor, allow_kernel: bool = True) -> torch.Tensor:
    """Eigenvalues of base^T diag(gate[u]^2) base for each unit u: (u, min(m, r)), descending,
    clamped at 0. base (m, r), gate (u, m), float64. ``allow_kernel`` False (a job too small to
    repay a compile: core/dense_jobs.py) takes the reference."""
    lanes = ChannelLanes(torch.zeros(gate.shape[0], dtype=torch.long), gate)
    return lanes.eigenvalues({0: base}, 0, allow_kernel)[0][:, : min(base.shape)]


class ChannelLanes:
    """The kernel's lanes for units that share their owners' factors (U units, ``owner_of``
    (U,), each with its row scales ``gates`` (U, L)): each owner's units fill whole blocks of
    LANES lanes (Mamba2's 64 channels of a head: one block), so that one call of the kernel
    takes every owner of a cut, each block with its own owner's factor, instead of one call
    (and its conversions) per owner."""

    def __init__(self, owner_of: torch.Tensor, gates: torch.Tensor):
        self.gates = gates
        self._squares: np.ndarray | None = None  # gates^2 transposed, (L, U): made at the first kernel call
        owner_of = torch.as_tensor(owner_of).cpu()
        self.lane_of_unit = np.empty(len(owner_of), dtype=np.int64)
        self.units_of: dict[int, torch.Tensor] = {}
        self.blocks_of: dict[int, list[int]] = {}
        lane = 0
        for owner in torch.unique(owner_of).tolist():
            units = (owner_of == owner).nonzero().flatten()
            self.units_of[owner] = units
            self.lane_of_unit[units.numpy()] = lane + np.arange(len(units))
            blocks = -(-len(units) // LANES)
            self.blocks_of[owner] = list(range(lane // LANES, lane // LANES + blocks))
            lane += blocks * LANES
        self.lanes = lane
        # each owner's units in order and in whole blocks (Mamba2's heads): unit u is lane u
        self.in_order = lane == len(owner_of) and bool((self.lane_of_unit == np.arange(lane)).all())

    def eigenvalues(
        self, bases: dict, start: int, allow_kernel: bool = True, trim: float = 0.0
    ) -> tuple[torch.Tensor, dict]:
        """(U, R): row u the eigenvalues of base^T diag(g_u^2) base, g_u = gates[u, start:],
        base = bases[o][:kept_o] and o = u's owner (each bases[o] (L - start, r_o)), for the
        units of the owners in ``bases``, descending, clamped at 0, zero past min(kept_o,
        r_o); other rows zero; R the largest min(m, r_o). With each, ``left_out``: owner ->
        (rows, norm), the trailing rows of its factor left out and their Frobenius norm
        (`decayed_rows` with ``trim``; none where ``trim`` is 0)."""
        gate = self.gates[:, start:]
        m = gate.shape[-1]
        width = max(min(m, base.shape[-1]) for base in bases.values())
        runs = allow_kernel and m > 0 and takes(next(iter(bases.values())), gate)  # one device and dtype
        kernel = [o for o, base in bases.items() if runs and base.shape[-1] <= MAX_SIZE]
        left_out = {}
        if not kernel:
            values = gate.new_zeros(gate.shape[0], width)
        else:
            factors = [np.ascontiguousarray(bases[o].numpy()).ravel() for o in kernel]
            offsets = np.array([0, *itertools.accumulate(f.size for f in factors[:-1])], dtype=np.int64)
            widths = np.array([bases[o].shape[-1] for o in kernel], dtype=np.int64)
            blocks = np.array([b for o in kernel for b in self.blocks_of[o]], dtype=np.int64)
            block_group = np.array([k for k, o in enumerate(kernel) for _ in self.blocks_of[o]], dtype=np.int64)
            flat = np.concatenate(factors)
            rows = np.full(len(kernel), m, dtype=np.int64)
            norms = np.zeros(len(kernel))
            if trim > 0:
                compiled.first_call(_decayed_rows, _warm_up)
                _decayed_rows(flat, offsets, widths, trim, rows, norms)
            left_out = {o: (m - int(rows[k]), float(norms[k])) for k, o in enumerate(kernel)}
            if self._squares is None:  # one transposing copy for every cut: (rows, units)
                self._squares = torch.square(self.gates).T.contiguous().numpy()
            squares = self._squares[start:]
            if self.in_order:  # (rows, lanes): a row's weights contiguous
                weights = squares
            else:
                weights = np.zeros((m, self.lanes))
                weights[:, self.lane_of_unit] = squares
            out = np.zeros((self.lanes, width))
            failed = np.zeros(self.lanes, dtype=np.bool_)
            compiled.first_call(_grams_and_eigenvalues, _warm_up)
            _grams_and_eigenvalues(flat, offsets, widths, rows, blocks, block_group, weights, out, failed)
            values = torch.from_numpy(out if self.in_order else out[self.lane_of_unit])
            stuck = torch.from_numpy(failed if self.in_order else failed[self.lane_of_unit])
            if bool(stuck.any()):  # the reference answers these (and raises where torch would)
                for k, owner in enumerate(kernel):
                    redo = self.units_of[owner][stuck[self.units_of[owner]]]
                    if len(redo):
                        kept = int(rows[k])
                        values[redo] = 0.0
                        own = reference(bases[owner][:kept], gate[redo, :kept], allow_kernel)
                        values[redo, : own.shape[-1]] = own
        for owner in (o for o in bases if o not in kernel):
            units = self.units_of[owner]
            kept, norm = decayed_rows(bases[owner], trim) if trim > 0 else (m, 0.0)
            left_out[owner] = (m - kept, norm)
            own = reference(bases[owner][:kept], gate[units, :kept], allow_kernel)
            values[units, : own.shape[-1]] = own
        return values, left_out


def decayed_rows(base: torch.Tensor, trim: float) -> tuple[int, float]:
    """How many leading rows of ``base`` (m, r) to keep, and the Frobenius norm of the rest:
    the trailing rows whose Frobenius norm together is within ``trim`` times the largest
    column's norm (<= ||base||_2) are left out (`decayed_lines`). A head's factor at a cut
    holds its future outputs' rows, which decay with the head's forgetting: a fast head's last
    rows are far below its truncation. The kernel's `_decayed_rows` is this in numba."""
    squares = base * base
    left, norm = decayed_lines(squares.sum(-1).flip(0), trim**2 * float(squares.sum(0).max()))
    return base.shape[0] - left, norm


def decayed_lines(squares: torch.Tensor, limit: float) -> tuple[int, float]:
    """How many lines (rows or columns of a factor), whose norms squared are ``squares`` in
    the order they may be left out, to leave out, and their Frobenius norm: the longest run
    from the first whose norm squared together is within ``limit``, at most all but one line;
    none where a norm is not finite (an overflowed factor: the solver must see it and refuse
    it). A factor's decayed last rows (`decayed_rows`) and a cut's decayed first columns
    (core/row_scaled.py) are both left out by this rule."""
    total = squares.cumsum(0)  # total[j - 1]: the first j lines' norm squared
    if not math.isfinite(float(total[-1])):
        return 0, 0.0
    left = min(int((total <= limit).sum()), len(squares) - 1)
    return left, math.sqrt(float(total[left - 1])) if left else 0.0


def takes(base: torch.Tensor, gate: torch.Tensor) -> bool:
    """Whether the kernel may take this factor's channels: CPU float64 without gradients,
    numba (`ChannelLanes` gives it those no wider than MAX_SIZE)."""
    return (
        available()
        and not accelerator_routes(base.device)
        and base.dtype == gate.dtype == torch.float64
        and not (base.requires_grad or gate.requires_grad)
        and base.shape[-1] > 0
        and base.shape[0] > 0
    )


def reference(base: torch.Tensor, gate: torch.Tensor, allow_kernel: bool = True) -> torch.Tensor:
    """`gram_eigenvalues` in torch. The u Grams in one matrix product, not u small ones:
    base^T diag(g^2) base is g^2 (a row of gate^2) times the m outer products of base's rows,
    (m, r^2); where r > m the Gram diag(g) base base^T diag(g) (m x m) has the same nonzero
    eigenvalues and is the smaller."""
    m, r = base.shape
    if r <= m:
        outer = (base[:, :, None] * base[:, None, :]).reshape(m, r * r)
        gram = ((gate * gate) @ outer).reshape(-1, r, r)
    else:
        gram = (base @ base.T) * gate[:, :, None] * gate[:, None, :]
    return eigvalsh(gram, allow_kernel).flip(-1).clamp_min(0)


@jit
def _grams_and_eigenvalues(bases, offsets, widths, rows, blocks, block_group, weights, out, failed):  # pragma: no cover
    """For each lane block b of ``blocks``, its factor base = bases[offsets[g]:][: m * r]
    as (m, r), m = weights.shape[0], g = block_group[b], r = widths[g]: out[lane] <- the
    eigenvalues of base[:rows[g]]^T diag(weights[:rows[g], lane]) base[:rows[g]] for the block's lanes
    (`decayed_rows` gives rows[g]), descending, clamped at 0, its first min(rows[g], r) (the
    rest stay as they were, zero: rank <= rows[g]); failed[lane] where the lane's Gram
    overflowed or its QL did not converge. weights (m, lanes); out (lanes, R)."""
    m_all = weights.shape[0]
    size = 1
    for g in range(widths.shape[0]):
        size = max(size, widths[g])
    gram = np.empty((size, size, LANES))
    values = np.empty((size, LANES))
    diag = np.empty((size, LANES))
    off = np.empty((size, LANES))
    v = np.empty((size, LANES))
    pv = np.empty((size, LANES))
    lane_failed = np.empty(LANES, dtype=np.bool_)
    for index in range(blocks.shape[0]):
        g = block_group[index]
        r = widths[g]
        m = rows[g]
        rank = min(m, r)
        base = bases[offsets[g] : offsets[g] + m_all * r].reshape((m_all, r))
        start = blocks[index] * LANES
        for i in range(r):  # the lower triangle: all the eigensolver reads
            for j in range(i + 1):
                for w in range(LANES):
                    gram[i, j, w] = 0.0
        k = 0
        while k + 4 <= m:  # four rows a pass: a quarter of the Gram's loads and stores (they bound it)
            w0 = weights[k, start : start + LANES]
            w1 = weights[k + 1, start : start + LANES]
            w2 = weights[k + 2, start : start + LANES]
            w3 = weights[k + 3, start : start + LANES]
            for i in range(r):
                for j in range(i + 1):
                    b0 = base[k, i] * base[k, j]
                    b1 = base[k + 1, i] * base[k + 1, j]
                    b2 = base[k + 2, i] * base[k + 2, j]
                    b3 = base[k + 3, i] * base[k + 3, j]
                    for w in range(LANES):
                        gram[i, j, w] += ((w0[w] * b0 + w1[w] * b1) + w2[w] * b2) + w3[w] * b3
            k += 4
        while k < m:
            row = weights[k, start : start + LANES]
            for i in range(r):
                for j in range(i + 1):
                    b = base[k, i] * base[k, j]
                    for w in range(LANES):
                        gram[i, j, w] += row[w] * b
            k += 1
        for w in range(LANES):
            lane_failed[w] = False  # set by the solver for an overflowed Gram or a QL that did not converge
        _symmetric_eigenvalues(gram, r, rank, values, lane_failed, diag, off, v, pv)
        for w in range(LANES):
            failed[start + w] = lane_failed[w]
            for i in range(rank):
                out[start + w, i] = values[i, w]


@jit
def _decayed_rows(bases, offsets, widths, trim, rows, norms):  # pragma: no cover
    """`decayed_rows` of each factor g (bases[offsets[g]:] as (m, widths[g]), m = rows[g] on
    entry): rows[g] <- the rows kept, norms[g] <- the Frobenius norm of those left out."""
    for g in range(widths.shape[0]):
        r = widths[g]
        m = rows[g]
        base = bases[offsets[g] : offsets[g] + m * r].reshape((m, r))
        largest = 0.0
        total = 0.0
        for i in range(r):
            column = 0.0
            for k in range(m):
                column += base[k, i] * base[k, i]
            largest = max(largest, column)
            total += column
        limit = trim * trim * largest
        tail = 0.0
        kept = m
        while kept > 1 and np.isfinite(total):  # an overflowed factor keeps every row (`decayed_lines`)
            row = 0.0
            for i in range(r):
                row += base[kept - 1, i] * base[kept - 1, i]
            if tail + row > limit:
                break
            tail += row
            kept -= 1
        rows[g] = kept
        norms[g] = np.sqrt(tail)


def _warm_up() -> None:
    """The kernels' first call in a process, on a tiny problem (`compiled.first_call`)."""
    lanes = ChannelLanes(torch.zeros(1, dtype=torch.long), torch.ones(1, 3, dtype=torch.float64))
    lanes.eigenvalues({0: torch.eye(3, 2, dtype=torch.float64)}, 0, trim=1e-12)
