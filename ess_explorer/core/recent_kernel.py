"""The reachability Gramian of a head with one decay per step, from the few rows of R_t that matter.

Where every step decays all N modes of a head by one number a_m (Mamba2), row j of R_t (the
input u_j as the state holds it at t) is b_j d_j with d_j = a_{j+1} ... a_{t-1} one number, so

    P_t = R_t^T R_t = sum_{j < t} d_j^2 b_j b_j^T

has the nonzero eigenvalues of the Gram of R_t's rows, diag(d) (B B^T)[:t, :t] diag(d). The
rows j < s whose weights d_j^2 ||b_j||^2 add up to at most ``mass`` times the largest row's (a
lower bound on ||P_t||) are left out: what remains is the trailing (t - s) x (t - s) block,
whose eigenvalues are P_t's less a positive semidefinite term whose trace, ``left_out``, bounds
how far each one moved (Weyl). A fast-forgetting head's cut is then a problem of a few dozen
rows where P_t is N x N (Mamba2-130m at L = 256: 13-21% of the N x N eigenvalue work); a head
whose window would need N rows or more takes P_t itself (core/causal.py sets ``mass`` and adds
``left_out`` to each cut's error bound).

`RecentRows.grams` fills a cut's matrices for every head: per head a few hundred operations on
a window of a few dozen rows, which torch spends mostly in per-call overhead (2.8 ms a cut for
Mamba2's 24 heads, more than the eigenvalues it saves). So a compiled kernel (numba) fills them;
`reference` is the same arithmetic in torch, in the same order, which the tests compare it with
and which runs where numba is missing.
"""

from __future__ import annotations

import numpy as np
import torch

from . import compiled
from .compiled import available, jit

__all__ = ["RecentRows", "reference"]


class RecentRows:
    """The window Grams of the cuts of U heads: a (U, L) one decay per step, b (U, L, N)."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor):
        self.a, self.b = a.contiguous(), b
        units, length, self.n = b.shape
        self.weights = (b * b).sum(-1)  # (U, L): ||b_j||^2
        self.trace = a.new_zeros(units, length + 1)  # trace(P_t), t = 0..L: the weight of the rows j < t
        for t in range(length):
            self.trace[:, t + 1] = a[:, t] ** 2 * self.trace[:, t] + self.weights[:, t]
        self.span, self.first, self.rows = -1, 0, a.new_zeros(units, 0, 0)

    def grams(self, t: int, p: torch.Tensor, out: torch.Tensor, mass: float):
        """Into out (U, N, N): each head's Gram of its recent rows at cut t in its leading w x w
        block (the rest unset: the eigensolver reads that block only), or P_t (``p``) where it
        would need N rows or more. Returns sizes (U,) (w, or N), left_out (U,) (the trace of what
        its window leaves out of P_t, 0 for P_t itself) and each matrix's Frobenius norm (U,)."""
        self._span_rows(t)
        if available():
            units = out.shape[0]
            sizes = np.empty(units, dtype=np.int64)
            left_out, norms = np.empty(units), np.empty(units)
            arrays = [x.numpy() for x in (self.a, self.weights, self.trace, self.rows, p, out)]
            compiled.first_call(_grams, _warm_up)
            _grams(t, *arrays[:4], self.first, mass, *arrays[4:], sizes, left_out, norms)
            return torch.from_numpy(sizes), torch.from_numpy(left_out), torch.from_numpy(norms)
        return reference(t, self.a, self.weights, self.trace, self.rows, self.first, mass, p, out)

    def _span_rows(self, t: int) -> None:
        """B B^T of the rows the cuts (span N, span N + N] read, [span N + 1 - N, span N + N), from
        row ``first``, with N zero rows and columns past them (a window's block never runs off)."""
        n = self.n
        span = (t - 1) // n
        if span != self.span:
            first, last = max(0, (span - 1) * n + 1), min(self.b.shape[1], (span + 1) * n)
            rows = self.b.new_zeros(self.b.shape[0], last - first + n, last - first + n)
            block = self.b[:, first:last]
            torch.matmul(block, block.mT, out=rows[:, : last - first, : last - first])
            self.span, self.first, self.rows = span, first, rows


def reference(t, a, weights, trace, rows, first, mass, p, out):
    """`RecentRows.grams` in torch (the kernel's reference): a, weights (U, L), trace (U, L + 1),
    rows (U, S, S) B B^T from row ``first``; returns (sizes, left_out, norms)."""
    n, units = out.shape[-1], out.shape[0]
    lo = max(0, t - n)  # a window's rows lie in [lo, t): N at most
    decay = a.new_ones(units, t - lo)
    decay[:, :-1] = a[:, lo + 1 : t].flip(1).cumprod(1).flip(1)  # d_j, j = lo..t-1
    weight = weights[:, lo:t] * (decay * decay)
    older = trace[:, lo] * (a[:, lo] * decay[:, 0]) ** 2 if lo else torch.zeros_like(decay[:, 0])
    left_out = torch.cat([older[:, None], older[:, None] + weight.cumsum(1)], 1)  # [:, s]: rows before lo + s
    top = weight.amax(1)
    start = (left_out[:, :-1] <= mass * top[:, None]).sum(1) - 1  # nondecreasing: a count; -1: too many rows
    whole = (start < 0) | ~torch.isfinite(weight).all(1)  # these take P_t
    start = start.clamp(min=0)
    width = t - lo - start
    norms = torch.zeros_like(top)
    if not bool(whole.all()):
        most = int(width[~whole].max())
        size = rows.shape[-1]
        # every most x most block on the diagonal of each head's Gram, as a view: [u, s] = rows s..s+most-1
        diagonal = rows.as_strided((units, size - most + 1, most, most), (size * size, size + 1, size, 1))
        blocks = diagonal[torch.arange(units), lo + start - first]
        offset = torch.arange(most)
        scale = decay.gather(1, (start[:, None] + offset).clamp(max=t - lo - 1)) * (offset < width[:, None])
        window = out[:, :most, :most]
        torch.mul(blocks, scale[:, :, None] * scale[:, None, :], out=window)
        norms = torch.linalg.matrix_norm(window)
    if bool(whole.any()):
        out[whole] = p[whole]
        norms = torch.where(whole, torch.linalg.matrix_norm(p), norms)
    sizes = torch.where(whole, n, width)
    return sizes, torch.where(whole, 0.0, left_out.gather(1, start[:, None])[:, 0]), norms


@jit
def _grams(t, a, weights, trace, rows, first, mass, p, out, sizes, left_out, norms):  # pragma: no cover - compiled
    """`reference`, one head after another, in the same order of operations (the norms apart:
    they only scale the error bound)."""
    units, n = out.shape[0], out.shape[-1]
    lo = max(0, t - n)
    m = t - lo
    decay = np.empty(m)
    weight = np.empty(m)
    for u in range(units):
        decay[m - 1] = 1.0
        for j in range(m - 2, -1, -1):
            decay[j] = decay[j + 1] * a[u, lo + j + 1]
        top = 0.0
        finite = True
        for j in range(m):
            weight[j] = weights[u, lo + j] * (decay[j] * decay[j])
            finite = finite and np.isfinite(weight[j])
            top = max(top, weight[j])
        older = trace[u, lo] * (a[u, lo] * decay[0]) ** 2 if lo > 0 else 0.0
        limit = mass * top
        count, total, kept = 0, 0.0, older
        for s in range(m):  # left_out(s) = older + the first s weights, summed in order
            if s > 0:
                total += weight[s - 1]
            left = older + total
            if left <= limit:
                count += 1
                kept = left
        start = count - 1
        if start < 0 or not finite:
            squares = 0.0
            for i in range(n):
                for k in range(n):
                    out[u, i, k] = p[u, i, k]
                    squares += p[u, i, k] * p[u, i, k]
            sizes[u], left_out[u], norms[u] = n, 0.0, np.sqrt(squares)
            continue
        width = m - start
        row = lo + start - first
        squares = 0.0
        for i in range(width):
            for k in range(width):
                value = rows[u, row + i, row + k] * (decay[start + i] * decay[start + k])
                out[u, i, k] = value
                squares += value * value
        sizes[u], left_out[u], norms[u] = width, kept, np.sqrt(squares)


def _warm_up() -> None:
    """A tiny problem through `_grams` (compiled.first_call)."""
    a, b = torch.full((1, 3), 0.5, dtype=torch.float64), torch.ones(1, 3, 2, dtype=torch.float64)
    recent = RecentRows(a, b)
    recent._span_rows(2)
    out = torch.zeros(1, 2, 2, dtype=torch.float64)
    sizes, left_out, norms = np.empty(1, dtype=np.int64), np.empty(1), np.empty(1)
    arrays = [x.numpy() for x in (recent.a, recent.weights, recent.trace, recent.rows)]
    _grams(2, *arrays, recent.first, 1e-18, out.numpy(), out.numpy(), sizes, left_out, norms)
