"""Factored operators and their Hankel singular values by square-root sweeps.

A `DiagonalSSM` is one (or a batch of) causal operators given by a diagonal
recurrence with N modes, per unit:

    h_t = a_t * h_{t-1} + b_t u_t          h_{-1} = 0,  a_t, b_t, c_t in R^N
    y_t = c_t . h_t + d_t u_t

so that, for j <= i,

    T[i, j] = c_i . (prod_{k=j+1..i} a_k) * b_j  (+ d_i when i == j).

It covers linear attention (a = 1, b = key, c = query), gated linear attention
(a = per-key decay), Mamba channels, Mamba2 heads (a scalar decay broadcast over
N) and LTI diagonal SSMs (a, b, c constant in t).

Why the factored path: H_t = T[t:, :t] = O_t R_t, where the reachability matrix
R_t (N x t, columns (prod_{k=j+1..t-1} a_k) b_j) takes the past inputs to the state
h_{t-1}, and the observability matrix O_t ((L-t) x N, rows c_i * prod_{k=t..i} a_k)
takes that state to the present and future outputs. With triangular square roots

    R_t R_t^T = Lc_t Lc_t^T,   O_t^T O_t = Lo_t^T Lo_t   (Lc_t, Lo_t^T lower, N x N)

the singular values of H_t are those of the N x N product Lo_t Lc_t. Both roots obey
rank-one recursions that never form products of decays (which underflow) nor
Gramians (which square the condition number and lose every singular value below
sqrt(eps) * sigma_1):

    forward:   Lc_{t+1} Lc_{t+1}^T = diag(a_t) Lc_t Lc_t^T diag(a_t) + b_t b_t^T
    backward:  Lo_t^T Lo_t         = diag(a_t) (Lo_{t+1}^T Lo_{t+1} + c_t c_t^T) diag(a_t)

Each step is a rank-one update of a triangular factor, done with N Givens rotations
(O(N^2)) vectorised over every unit in the batch. Cost: O(L N^2) for the sweeps and
one N x N SVD per cut, O(L N^3) per unit, against O(L^4) for the dense path.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ._checks import as_tensor, require

__all__ = ["DiagonalSSM", "factored_hankel_singular_values", "batched_svdvals"]


@dataclass
class DiagonalSSM:
    """A batch of diagonal state-space operators (see the module docstring).

    Shapes: a, b, c are ``(*batch, L, N)``; d is ``(*batch, L)`` or None (zero).
    A Mamba2 head or another scalar-decay model passes ``a`` expanded to N modes
    (``a[..., None].expand(..., N)`` costs no memory).
    """

    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    d: torch.Tensor | None = None

    def __post_init__(self):
        self.a = as_tensor(self.a, "a")
        self.b = as_tensor(self.b, "b")
        self.c = as_tensor(self.c, "c")
        shapes = {"a": tuple(self.a.shape), "b": tuple(self.b.shape), "c": tuple(self.c.shape)}
        require(self.a.ndim >= 2, f"DiagonalSSM: a must have shape (*batch, L, N), got {shapes['a']}")
        require(
            len(set(shapes.values())) == 1,
            f"DiagonalSSM: a, b and c must share one shape (*batch, L, N); got {shapes}",
        )
        if self.d is not None:
            self.d = as_tensor(self.d, "d")
            require(
                tuple(self.d.shape) == shapes["a"][:-1],
                f"DiagonalSSM: d must have shape (*batch, L) = {shapes['a'][:-1]}, got {tuple(self.d.shape)}",
            )
        for name in ("a", "b", "c", "d"):
            value = getattr(self, name)
            if value is not None:
                require(bool(torch.isfinite(value).all()), f"DiagonalSSM: {name} contains NaN or infinite values")

    @property
    def batch_shape(self) -> torch.Size:
        return self.a.shape[:-2]

    @property
    def length(self) -> int:
        return self.a.shape[-2]

    @property
    def state_size(self) -> int:
        return self.a.shape[-1]

    def to(self, *args, **kwargs) -> "DiagonalSSM":
        d = None if self.d is None else self.d.to(*args, **kwargs)
        return DiagonalSSM(self.a.to(*args, **kwargs), self.b.to(*args, **kwargs), self.c.to(*args, **kwargs), d)

    def __getitem__(self, index) -> "DiagonalSSM":
        """Select units along the batch dimensions, e.g. ``ssm[3]`` or ``ssm[:, 0]``."""
        index = index if isinstance(index, tuple) else (index,)
        pick = lambda x: x[index + (Ellipsis,)]  # noqa: E731
        return DiagonalSSM(pick(self.a), pick(self.b), pick(self.c), None if self.d is None else pick(self.d))

    def materialize(self) -> torch.Tensor:
        """The dense operator T, shape ``(*batch, L, L)``, lower triangular.

        Computed by running the recurrence on the identity (column j is the response
        to an impulse at j), so no product of decays is formed and nothing
        underflows. Memory O(L^2 N) per unit: for tests and small units.
        """
        a, b, c = self.a, self.b, self.c
        length = self.length
        h = torch.zeros(*self.batch_shape, length, self.state_size, dtype=a.dtype, device=a.device)  # (..., j, N)
        rows = []
        for i in range(length):
            h = a[..., i : i + 1, :] * h  # decay every column's state
            h[..., i, :] = h[..., i, :] + b[..., i, :]  # impulse at column i enters
            rows.append(torch.einsum("...n,...jn->...j", c[..., i, :], h))
        dense = torch.stack(rows, dim=-2)
        if self.d is not None:
            dense = dense + torch.diag_embed(self.d)
        return dense

    def apply(self, u: torch.Tensor) -> torch.Tensor:
        """y = T u by the recurrence, u of shape ``(*batch, L)``: a reference for tests."""
        h = torch.zeros(*self.batch_shape, self.state_size, dtype=self.a.dtype, device=self.a.device)
        ys = []
        for i in range(self.length):
            h = self.a[..., i, :] * h + self.b[..., i, :] * u[..., i, None]
            ys.append((self.c[..., i, :] * h).sum(-1))
        y = torch.stack(ys, dim=-1)
        return y if self.d is None else y + self.d * u


def _rank_one_update_upper(r: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Upper-triangular R' with R'^T R' = R^T R + x x^T, batched over leading dims.

    The LINPACK ``dchud`` scheme: Givens rotations fold x into R row by row. No
    square of R is formed, so relative accuracy of R's small singular values is kept.
    r: (B, N, N) upper triangular (diagonal may be any sign), x: (B, N). Returns a new R.
    """
    r = r.clone()
    x = x.clone()
    n = r.shape[-1]
    for k in range(n):
        rkk = r[:, k, k]
        xk = x[:, k]
        radius = torch.hypot(rkk, xk)
        safe = torch.where(radius > 0, radius, torch.ones_like(radius))
        cos = torch.where(radius > 0, rkk / safe, torch.ones_like(radius))
        sin = torch.where(radius > 0, xk / safe, torch.zeros_like(radius))
        r[:, k, k] = radius
        if k + 1 < n:
            row = r[:, k, k + 1 :].clone()  # read before the rotation overwrites it
            tail = x[:, k + 1 :]
            r[:, k, k + 1 :] = cos[:, None] * row + sin[:, None] * tail
            x[:, k + 1 :] = cos[:, None] * tail - sin[:, None] * row
    return r


def factored_hankel_singular_values(
    ssm: DiagonalSSM,
    *,
    positions: torch.Tensor,
    top_k: int | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    unit_chunk: int | None = None,
) -> torch.Tensor:
    """Singular values of H_t for every unit of ``ssm`` at the given positions.

    Returns ``(*batch, P, K)`` with K = min(top_k, N, L // 2), descending, row 0 (t = 0)
    all zeros. Units are processed in chunks so that the stored square roots
    (chunk x L x N x N) stay within about 256 MB.
    """
    device = torch.device(device) if device is not None else ssm.a.device
    batch_shape, length, n = ssm.batch_shape, ssm.length, ssm.state_size
    k_out = min(n, length // 2) if top_k is None else min(top_k, n, length // 2)  # rank(H_t) <= L // 2
    positions = positions.to(torch.long).cpu()
    a = ssm.a.reshape(-1, length, n)
    b = ssm.b.reshape(-1, length, n)
    c = ssm.c.reshape(-1, length, n)
    units = a.shape[0]
    out = torch.zeros(units, len(positions), k_out, dtype=dtype, device=device)
    if units == 0 or length == 0:
        return out.reshape(*batch_shape, len(positions), k_out)
    if unit_chunk is None:
        bytes_per_unit = length * n * n * torch.finfo(dtype).bits // 8
        unit_chunk = max(1, min(units, (256 << 20) // max(1, bytes_per_unit)))
    wanted = positions[(positions >= 1) & (positions < length)]
    rows_of = {int(t): i for i, t in enumerate(positions.tolist()) if 1 <= t < length}
    for start in range(0, units, unit_chunk):
        sl = slice(start, min(units, start + unit_chunk))
        ac, bc, cc = (x[sl].to(device=device, dtype=dtype) for x in (a, b, c))
        sigma = _sweep_chunk(ac, bc, cc, wanted)  # (chunk, len(wanted), n)
        for col, t in enumerate(wanted.tolist()):
            out[sl, rows_of[t]] = sigma[:, col, :k_out]
    return out.reshape(*batch_shape, len(positions), k_out)


def _sweep_chunk(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
    """Square-root sweeps for a chunk of units. a, b, c: (B, L, N). Returns (B, len(wanted), N).

    One buffer of shape (B, P, N, N) holds first the reachability roots, then
    (overwritten in place) the products whose singular values we want, so that the
    chunk's memory is one such buffer.
    """
    units, length, n = a.shape
    slot = {int(t): i for i, t in enumerate(wanted.tolist())}
    buffer = torch.zeros(units, len(slot), n, n, dtype=a.dtype, device=a.device)
    if not slot:
        return buffer[..., 0]
    # Forward: U_c(t) upper with U_c^T U_c = R_t R_t^T; R_{t+1} = [diag(a_t) R_t, b_t].
    upper_c = torch.zeros(units, n, n, dtype=a.dtype, device=a.device)  # no past at t = 0
    for t in range(max(slot)):
        upper_c = _rank_one_update_upper(upper_c * a[:, t, None, :], b[:, t])
        if t + 1 in slot:
            buffer[:, slot[t + 1]] = upper_c
    # Backward: U_o(t) upper with U_o^T U_o = O_t^T O_t; O_t = [c_t; O_{t+1}] diag(a_t).
    upper_o = torch.zeros(units, n, n, dtype=a.dtype, device=a.device)  # no future after L - 1
    for t in range(length - 1, min(slot) - 1, -1):
        upper_o = _rank_one_update_upper(upper_o, c[:, t]) * a[:, t, None, :]
        if t in slot:
            # H_t = (Q_o U_o)(U_c^T Q_c^T), so sigma(H_t) = sigma(U_o U_c^T).
            buffer[:, slot[t]] = upper_o @ buffer[:, slot[t]].transpose(-1, -2)
    return batched_svdvals(buffer)


def batched_svdvals(matrices: torch.Tensor) -> torch.Tensor:
    """torch.linalg.svdvals over a large batch of small matrices, split across CPU threads.

    LAPACK runs one small SVD per call and torch does not spread a batch across
    cores, so on CPU two halves in two threads take about half the time.
    """
    workers = torch.get_num_threads() if matrices.device.type == "cpu" else 1
    flat = matrices.reshape(-1, *matrices.shape[-2:])
    if workers <= 1 or flat.shape[0] < 2 * workers:
        return torch.linalg.svdvals(matrices)
    parts = torch.chunk(flat, workers)
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(torch.linalg.svdvals, parts))
    return torch.cat(results).reshape(*matrices.shape[:-2], -1)


