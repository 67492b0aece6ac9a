"""Spectra kept as symmetric tridiagonal matrices, counted by Sturm sequences.

Causal ESS (core/causal.py) is a count only: how many eigenvalues of the reachability
Gramian P_t = R_t R_t^T lie above tau^2. The Gramian route (core/gramian_kernel.py) therefore
stops at P_t's Householder tridiagonal form T (same eigenvalues) and its largest eigenvalue,
instead of solving for every eigenvalue: the count at any tau, known only once a scope's
sigma_1 is known, is then one Sturm sequence (Sylvester's law of inertia applied to
T - x I = L D L^T):

    q_0 = d_0 - x,   q_i = d_i - x - e_{i-1}^2 / q_{i-1},   #{lambda < x} = #{i : q_i < 0}

which is backward stable for a tridiagonal matrix, so the count is exact for a matrix within
a few eps ||T|| of T. An exact spectrum sigma is the diagonal T = diag(sigma^2).

The largest eigenvalue (`_largest_eigenvalues`, for the Gramian kernel) comes from Laguerre's
iteration on p(x) = det(T - x I), whose roots are all real: from an upper bound it falls
monotonically onto lambda_max (in exact arithmetic), cubically where lambda_max is simple, in 3-5 steps on the
reachability Gramians of Mamba layers, where bisection to the same accuracy takes 28. The
same pass of the recurrence above gives the step's sums (its derivatives in x):

    G = p'/p = sum_i q_i' / q_i,   H = -(log |p|)'' = sum_i (q_i' / q_i)^2 - q_i'' / q_i,
    x <- x - n / (G + sqrt((n - 1) (n H - G^2))).

Two Sturm counts certify the result (an eigenvalue above x (1 - TOP_ACCURACY), none above
x (1 + TOP_ACCURACY)); where any lane fails them, bisection on Sturm counts decides instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import compiled
from .accelerator import accelerator_routes
from .sweeps import over_chunks

__all__ = ["TridiagonalSpectra", "sturm_counts"]


@dataclass
class TridiagonalSpectra:
    """Spectra sigma_k = scale sqrt(lambda_k(T)) of cuts (*batch, P), each given by a symmetric
    tridiagonal T: ``diag`` (*batch, P, N), ``off`` (*batch, P, N) (off[..., k] couples k and
    k + 1; the last is unused) and ``top`` (*batch, P), its largest eigenvalue; ``scale``
    (*batch, P), or None for 1: an exact spectrum is kept as diag((sigma / sigma_1)^2) times
    sigma_1, so that one near 1e-200, whose squares underflow, is counted as it is."""

    diag: torch.Tensor
    off: torch.Tensor
    top: torch.Tensor
    scale: torch.Tensor | None = None

    @classmethod
    def from_values(cls, sigma: torch.Tensor) -> "TridiagonalSpectra":
        """Exact spectra (*batch, P, K) descending, as diagonal matrices scaled by sigma_1."""
        first = sigma[..., 0] if sigma.shape[-1] else sigma.new_zeros(sigma.shape[:-1])
        scale = torch.where(first > 0, first, torch.ones_like(first))
        squares = (sigma / scale[..., None]) ** 2
        return cls(squares, torch.zeros_like(squares), squares[..., 0] if sigma.shape[-1] else first, scale)

    @property
    def shape(self) -> torch.Size:
        return self.top.shape

    def __getitem__(self, index) -> "TridiagonalSpectra":
        scale = None if self.scale is None else self.scale[index]
        return TridiagonalSpectra(self.diag[index], self.off[index], self.top[index], scale)

    def reshape(self, *shape) -> "TridiagonalSpectra":
        n = self.diag.shape[-1]
        scale = None if self.scale is None else self.scale.reshape(*shape)
        return TridiagonalSpectra(
            self.diag.reshape(*shape, n), self.off.reshape(*shape, n), self.top.reshape(*shape), scale
        )

    def sigma_1(self) -> torch.Tensor:
        """(*batch, P) the largest singular value of each cut."""
        top = self.top.clamp_min(0).sqrt()
        return top if self.scale is None else top * self.scale

    def count_above(self, tau: torch.Tensor, compiled: bool | None = None) -> torch.Tensor:
        """(*batch, P) #{k : sigma_k > tau}, tau >= 0 broadcastable to (*batch, P).
        compiled: the compiled count (`sturm_counts`) or the torch sequence below,
        its reference; default: compiled where it runs (CPU float64, numba)."""
        tau = torch.as_tensor(tau, dtype=self.diag.dtype, device=self.diag.device)
        x = ((tau if self.scale is None else tau / self.scale) ** 2).expand(self.top.shape)
        n = self.diag.shape[-1]
        if _compiled(self.diag) if compiled is None else compiled:
            flat = lambda v: v.reshape(-1, n).numpy()  # noqa: E731
            counts = sturm_counts(flat(self.diag), flat(self.off), x.reshape(-1).numpy())
            return torch.from_numpy(counts).reshape(self.top.shape)
        tiny = torch.finfo(self.diag.dtype).tiny
        below = torch.zeros(self.top.shape, dtype=torch.long, device=self.diag.device)
        q = torch.ones_like(x)
        for i in range(n):
            q = self.diag[..., i] - x - (self.off[..., i - 1] ** 2 / q if i else 0.0)
            q = torch.where(q == 0, torch.full_like(q, -tiny), q)  # a zero pivot: x is an eigenvalue
            below += q < 0
        return n - below

    def values(self) -> torch.Tensor:
        """(*batch, P, N) the singular values, descending (tests and checks: eigvalsh of T)."""
        n = self.diag.shape[-1]
        matrix = torch.diag_embed(self.diag)
        if n > 1:
            matrix = matrix + torch.diag_embed(self.off[..., :-1], 1) + torch.diag_embed(self.off[..., :-1], -1)
        values = torch.linalg.eigvalsh(matrix).flip(-1).clamp_min(0).sqrt()
        return values if self.scale is None else values * self.scale[..., None]


def _compiled(values: torch.Tensor) -> bool:
    """Whether the compiled Sturm count (`sturm_counts`) runs on these values."""
    return (
        compiled.available()
        and not accelerator_routes(values.device)
        and values.dtype == torch.float64
        and not values.requires_grad
        and values.shape[-1] > 0
    )


_TINY = float(np.finfo(np.float64).tiny)
# lambda_max to this relative accuracy: a count at tau = tol sigma_1 then moves only for a
# singular value within 1e-9 of tau, far inside the "ess" contract's 1e-6 (core/precision.py)
TOP_ACCURACY = 1e-9
LAGUERRE_STEPS = 10  # then certified, or bisection from the first bracket to TOP_ACCURACY
BISECTIONS = 64  # at most (from a width of 2 to 1e-9 of 1 / n takes 31 + log2(n))


@compiled.jit
def _largest_eigenvalues(diag, off, n, top, e2, state):  # pragma: no cover - compiled
    """top (LANES,): the largest eigenvalue of each of the LANES tridiagonals (diag, off)
    (n, LANES) (off[i] couples i and i + 1), their entries of order one (scaled by the trace:
    core/gramian_kernel.py). Laguerre's iteration, certified by Sturm counts (module
    docstring). e2 (n, LANES), state (10, LANES): work arrays."""
    lanes = compiled.LANES
    lo, hi, x, step = state[0], state[1], state[2], state[3]  # bracket, iterate, certificate's width
    q, dq, ddq, r, g, h = state[4], state[5], state[6], state[7], state[8], state[9]  # the sequence's
    for w in range(lanes):  # lambda_max in [max d_i, min(Gershgorin, ||T||_F)]
        e2[0, w] = 0.0
        lo[w] = diag[0, w]
        hi[w] = diag[0, w] + abs(off[0, w]) if n > 1 else diag[0, w]
        g[w] = diag[0, w] * diag[0, w]
    for i in range(1, n):
        for w in range(lanes):
            e2[i, w] = off[i - 1, w] * off[i - 1, w]
            coupling = abs(off[i - 1, w]) + (abs(off[i, w]) if i < n - 1 else 0.0)
            lo[w] = max(lo[w], diag[i, w])
            hi[w] = max(hi[w], diag[i, w] + coupling)
            g[w] += diag[i, w] * diag[i, w] + 2.0 * e2[i, w]
    for w in range(lanes):
        hi[w] = min(hi[w], np.sqrt(g[w]))
        x[w] = hi[w]
    for _ in range(LAGUERRE_STEPS):
        for w in range(lanes):
            r[w] = 0.0
            dq[w] = 0.0
            ddq[w] = 0.0
            g[w] = 0.0
            h[w] = 0.0
        for i in range(n):  # q_i and its derivatives, from those of q_{i-1} (r = 1 / q_{i-1})
            for w in range(lanes):
                r2 = r[w] * r[w]
                ddq[w] = e2[i, w] * (ddq[w] * r2 - 2.0 * dq[w] * dq[w] * r2 * r[w])
                dq[w] = e2[i, w] * dq[w] * r2 - 1.0
                value = diag[i, w] - x[w] - e2[i, w] * r[w]
                r[w] = 1.0 / (-_TINY if value == 0 else value)
                ratio = dq[w] * r[w]
                g[w] += ratio
                h[w] += ratio * ratio - ddq[w] * r[w]
        moving = False
        for w in range(lanes):
            root = np.sqrt(max((n - 1) * (n * h[w] - g[w] * g[w]), 0.0))
            size = n / (g[w] + root)
            size = size if (size > 0 and size < np.inf) else 0.0  # x is an eigenvalue: inf or NaN
            x[w] -= size
            moving = moving or size > 0.1 * TOP_ACCURACY * x[w]
        if not moving:
            break
    for w in range(lanes):  # the certificate: lambda_max within TOP_ACCURACY of x
        exact = lo[w] >= hi[w]  # a closed bracket: the bound is the eigenvalue
        x[w] = hi[w] if exact else x[w]
        step[w] = 0.0 if exact else TOP_ACCURACY * x[w]
    certified = _certified(diag, e2, n, x, step, 1.0, q, r, g) and _certified(diag, e2, n, x, step, -1.0, q, r, g)
    for _ in range(0 if certified else BISECTIONS):  # bisection from the first bracket, every lane
        narrow = True
        for w in range(lanes):
            narrow = narrow and hi[w] - lo[w] <= TOP_ACCURACY * lo[w]
        if narrow:
            break
        for w in range(lanes):
            step[w] = 0.5 * (lo[w] + hi[w])
        _counts_below(diag, e2, n, step, q, r)
        for w in range(lanes):
            above = r[w] < n  # some eigenvalue lies above the midpoint
            lo[w] = step[w] if above else lo[w]
            hi[w] = hi[w] if above else step[w]
            x[w] = hi[w]
    for w in range(lanes):
        top[w] = x[w]


@compiled.jit(inline=True)
def _certified(diag, e2, n, x, step, sign, q, below, point):  # pragma: no cover - compiled
    """Whether, in every lane, the tridiagonal has an eigenvalue above x - step (sign 1) or
    none above x + step (sign -1); a lane whose step is 0 passes."""
    for w in range(compiled.LANES):
        point[w] = x[w] - sign * step[w]
    _counts_below(diag, e2, n, point, q, below)
    good = True
    for w in range(compiled.LANES):
        ok = (below[w] < n) if sign > 0 else (below[w] == n)
        good = good and (ok or step[w] == 0)
    return good


@compiled.jit(inline=True)
def _counts_below(diag, e2, n, x, q, below):  # pragma: no cover - compiled
    """below (LANES,): #{eigenvalues below x} of each lane's tridiagonal, diag and e2 (n, LANES),
    e2[i] the square of the off-diagonal coupling i - 1 and i (e2[0] = 0): the Sturm sequence
    of the module docstring, the lanes side by side so that the loop vectorises."""
    for w in range(compiled.LANES):
        q[w] = 1.0
        below[w] = 0.0
    for i in range(n):
        for w in range(compiled.LANES):
            value = diag[i, w] - x[w] - e2[i, w] / q[w]
            value = -_TINY if value == 0 else value
            q[w] = value
            below[w] += value < 0


@compiled.jit
def _sturm_counts(diag, off, x, out):  # pragma: no cover - compiled
    """out[k] = #{eigenvalues of the tridiagonal (diag[k], off[k]) above x[k]}: LANES
    matrices at a time, copied lane-major (so that `_counts_below` reads each row's values
    contiguously, not 8 N bytes apart: 38 -> 23 ms on one core for a Mamba layer's 785,000 cuts), the
    last block padded with 1 x 1 blocks of 1 above x = 0."""
    lanes = compiled.LANES
    batch, n = diag.shape
    d, e2 = np.empty((n, lanes)), np.empty((n, lanes))
    points, q, below = np.empty(lanes), np.empty(lanes), np.empty(lanes)
    for first in range(0, batch, lanes):
        width = min(lanes, batch - first)
        for w in range(lanes):
            k = min(first + w, batch - 1)
            live = w < width
            points[w] = x[k] if live else 0.0
            d[0, w] = diag[k, 0] if live else 1.0
            e2[0, w] = 0.0
            for i in range(1, n):
                d[i, w] = diag[k, i] if live else 1.0
                e2[i, w] = off[k, i - 1] * off[k, i - 1] if live else 0.0
        _counts_below(d, e2, n, points, q, below)
        for w in range(width):
            out[first + w] = n - int(below[w])


def sturm_counts(diag: np.ndarray, off: np.ndarray, x: np.ndarray, workers: int | None = None) -> np.ndarray:
    """The compiled `TridiagonalSpectra.count_above` (the torch sequence there is its reference): diag,
    off (B, N) and thresholds x (B,) on the eigenvalues, float64; (B,) int64 counts. In
    ``workers`` threads (default torch's thread count), each a share of the batch."""
    out = np.empty(len(x), dtype=np.int64)
    diag, off, x = (np.ascontiguousarray(a) for a in (diag, off, x))
    workers = max(1, min(workers or torch.get_num_threads(), len(x) // compiled.LANES))

    def count(share: slice) -> None:
        _sturm_counts(diag[share], off[share], x[share], out[share])

    over_chunks(count, len(x), -(-len(x) // workers), workers)
    return out
