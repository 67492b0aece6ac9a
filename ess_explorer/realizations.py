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

Each step is a rank-one update of a triangular factor: a batched (N+1) x N QR on CPU,
N Givens rotations vectorised over the units on a GPU. Cost: O(L N^3) per unit for the
sweeps and one N x N SVD per cut, against O(L^4) for the dense path.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ._checks import as_tensor, require

__all__ = ["DiagonalSSM", "factored_hankel_singular_values", "single_threaded_torch"]


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
    if not (r.device.type != "cpu" if rotations is None else rotations):
        # On CPU one batched LAPACK QR of the stacked [R; x^T] is as fast as N vectorised
        # rotations for a large batch, much faster for a small one (the rotations cost
        # torch-op overhead, not flops), and one call releases the GIL, so chunks of
        # units run in parallel threads. On a GPU the rotations avoid per-matrix solvers.
        r.copy_(torch.linalg.qr(torch.cat([r, x[:, None, :]], dim=1), mode="r").R)
        return r
    for k in range(n):
        z = torch.complex(r[:, k, k:], x[:, k:])  # (B, N - k)
        pivot = z[:, :1]
        size = pivot.abs()
        # A zero pivot (row k and x both vanish at k) needs no rotation.
        phase = torch.where(size > 0, pivot.conj() / torch.where(size > 0, size, 1), 1)
        z = z * phase
        r[:, k, k:] = z.real
        x[:, k:] = z.imag
    return r


def factored_hankel_singular_values(
    ssm: DiagonalSSM,
    *,
    positions: torch.Tensor,
    top_k: int | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    chunk_bytes: int = 512 << 20,
) -> torch.Tensor:
    """Singular values of H_t for every unit of ``ssm`` at the given positions.

    Returns ``(*batch, P, K)`` with K = min(top_k, N, L // 2), descending, row 0 (t = 0)
    all zeros. Units are processed in chunks whose stored square roots take about
    ``chunk_bytes``; on CPU the chunks run in parallel threads (one per torch thread),
    each with single-threaded torch ops, since the work is many small ops and small
    LAPACK calls that torch would not spread over cores by itself.
    """
    device = torch.device(device) if device is not None else ssm.a.device
    batch_shape, length, n = ssm.batch_shape, ssm.length, ssm.state_size
    k_out = min(n, length // 2) if top_k is None else min(top_k, n, length // 2)  # rank(H_t) <= L // 2
    positions = positions.to(torch.long).cpu()
    a, b, c = (x.reshape(-1, length, n) for x in (ssm.a, ssm.b, ssm.c))
    units = a.shape[0]
    out = torch.zeros(units, len(positions), k_out, dtype=dtype, device=device)
    inside = (positions >= 1) & (positions < length)  # t = 0 has no past: stays zero
    wanted = torch.unique(positions[inside])
    if units == 0 or len(wanted) == 0:
        return out.reshape(*batch_shape, len(positions), k_out)
    bytes_per_unit = len(wanted) * n * n * torch.finfo(dtype).bits // 8
    workers = torch.get_num_threads() if device.type == "cpu" else 1
    chunk = max(1, min(-(-units // workers), chunk_bytes // max(1, bytes_per_unit)))  # >= one chunk per worker
    chunks = [slice(start, min(units, start + chunk)) for start in range(0, units, chunk)]
    row_of_wanted = torch.searchsorted(wanted, positions[inside])

    def run(sl: slice) -> None:
        ac, bc, cc = (x[sl].to(device=device, dtype=dtype) for x in (a, b, c))
        sigma = _sweep_chunk(ac, bc, cc, wanted)  # (chunk, W, N)
        out[sl, inside] = sigma[:, row_of_wanted, :k_out]

    def run_single_threaded(sl: slice) -> None:
        with single_threaded_torch():
            run(sl)

    if workers > 1 and len(chunks) > 1:
        with ThreadPoolExecutor(min(workers, len(chunks))) as pool:
            list(pool.map(run_single_threaded, chunks))
    else:
        for sl in chunks:
            run(sl)
    return out.reshape(*batch_shape, len(positions), k_out)


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


def _sweep_chunk(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, wanted: torch.Tensor, rotations: bool | None = None
) -> torch.Tensor:
    """Square-root sweeps for a chunk of units. a, b, c: (B, L, N); wanted: sorted t's.
    Returns (B, len(wanted), N).

    Both sweeps have the form S <- rank_one(S diag(scale), vector):
        forward   U_c(t+1) = rank_one(U_c(t) diag(a_t), b_t)          U_c^T U_c = R_t R_t^T
        backward  W_t      = rank_one(W_{t+1} diag(a_{t+1}), c_t)     U_o(t) = W_t diag(a_t)
    They are independent, so one loop runs them together on a stacked batch of 2B (the
    cost is the number of small torch ops, not flops): at step s the forward half makes
    U_c(s + 1) and the backward half W_{L-1-s}. Whichever root of a cut t comes first
    waits in ``buffer``; when its partner arrives the slot is replaced by the product
    U_o(t) U_c(t)^T, since H_t = (Q_o U_o(t)) (U_c(t)^T Q_c^T) gives
    sigma(H_t) = sigma(U_o(t) U_c(t)^T). Memory: one (B, W, N, N) buffer.
    """
    units, length, n = a.shape
    slot = {int(t): i for i, t in enumerate(wanted.tolist())}
    buffer = torch.zeros(units, len(slot), n, n, dtype=a.dtype, device=a.device)

    def product(observe: torch.Tensor, t: int, reach: torch.Tensor) -> torch.Tensor:
        return (observe * a[:, t, None, :]) @ reach.transpose(-1, -2)

    # Time-major copies so that each step reads contiguous rows; the backward half runs
    # in reversed time and its scale is a_{t+1} (zero past the end, where W is still 0).
    shifted = torch.cat([a[:, 1:], torch.zeros_like(a[:, :1])], 1)
    scales = torch.cat([a, shifted.flip(1)]).transpose(0, 1).contiguous()  # (L, 2B, N)
    vectors = torch.cat([b, c.flip(1)]).transpose(0, 1).contiguous()  # (L, 2B, N)
    state = torch.zeros(2 * units, n, n, dtype=a.dtype, device=a.device)  # [U_c ; W]
    vector = torch.empty(2 * units, n, dtype=a.dtype, device=a.device)
    last_step = max(int(wanted.max()) - 1, length - 1 - int(wanted.min()))
    for step in range(last_step + 1):
        state.mul_(scales[step][:, None, :])
        vector.copy_(vectors[step])
        _rank_one_update_upper(state, vector, rotations)
        reach, observe = state[:units], state[units:]
        forward_t, backward_t = step + 1, length - 1 - step
        if forward_t == backward_t and forward_t in slot:
            buffer[:, slot[forward_t]] = product(observe, forward_t, reach)
            continue
        if forward_t in slot:  # W_t was stored earlier iff the backward half passed t already
            i = slot[forward_t]
            buffer[:, i] = product(buffer[:, i], forward_t, reach) if forward_t > backward_t else reach
        if backward_t in slot:
            i = slot[backward_t]
            buffer[:, i] = product(observe, backward_t, buffer[:, i]) if backward_t < forward_t else observe
    return torch.linalg.svdvals(buffer)
