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

from dataclasses import dataclass

import torch

from .checks import all_finite, as_tensor, require

__all__ = ["DiagonalSSM", "DPLRSSM", "FACTORED_OPERATORS", "overflow_error"]


class _Recurrence:
    """Sizes shared by the factored operators: ``a`` has shape (*batch, L, N)."""

    @classmethod
    def derived(cls, **fields):
        """An operator made from the fields of a checked one (a selection of units, a dtype
        or device change, a scaling by finite gates), without __post_init__'s checks: they
        read every value, which on a large layer costs more than the work that follows. A
        narrowing dtype change that overflows is still caught where the spectra are checked
        for inf / NaN (core/spectra.py)."""
        op = object.__new__(cls)
        op.__dict__.update({"d": None, **fields})
        return op

    @property
    def batch_shape(self) -> torch.Size:
        return self.a.shape[:-2]

    @property
    def length(self) -> int:
        return self.a.shape[-2]

    @property
    def state_size(self) -> int:
        return self.a.shape[-1]


@dataclass
class DiagonalSSM(_Recurrence):
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
        require(self.a.numel() > 0, f"DiagonalSSM is empty (shape {shapes['a']}); it needs L >= 1, N >= 1 and one unit")
        if self.d is not None:
            self.d = as_tensor(self.d, "d")
            require(
                tuple(self.d.shape) == shapes["a"][:-1],
                f"DiagonalSSM: d must have shape (*batch, L) = {shapes['a'][:-1]}, got {tuple(self.d.shape)}",
            )
        for name in ("a", "b", "c", "d"):
            value = getattr(self, name)
            if value is not None:
                require(
                    value.is_floating_point(),
                    f"DiagonalSSM: {name} must be a real floating-point tensor, got {value.dtype}; the factored "
                    "path is real (analyse a complex diagonal SSM densely, or as its real 2x2-block form)",
                )
                require(all_finite(value), f"DiagonalSSM: {name} contains NaN or infinite values")

    def to(self, *args, **kwargs) -> "DiagonalSSM":
        d = None if self.d is None else self.d.to(*args, **kwargs)
        return DiagonalSSM.derived(
            a=self.a.to(*args, **kwargs), b=self.b.to(*args, **kwargs), c=self.c.to(*args, **kwargs), d=d
        )

    def __getitem__(self, index) -> "DiagonalSSM":
        """Select units along the batch dimensions, e.g. ``ssm[3]`` or ``ssm[:, 0]``."""
        index = index if isinstance(index, tuple) else (index,)
        pick = lambda x: x[index + (Ellipsis,)]  # noqa: E731
        return DiagonalSSM.derived(
            a=pick(self.a), b=pick(self.b), c=pick(self.c), d=None if self.d is None else pick(self.d)
        )

    def materialize(self) -> torch.Tensor:
        """The dense operator T, shape ``(*batch, L, L)``, lower triangular.

        Computed by running the recurrence on the identity (column j is the response
        to an impulse at j), so no product of decays is formed and nothing
        underflows. Memory O(L^2 N) per unit: for tests and small units. A unit whose
        decay is one scalar per step for all modes (Mamba2) takes `_scalar_decay_operator`.
        """
        a, b, c = self.a, self.b, self.c
        scalar = a[..., :1]  # (a gradient through log a would be NaN at a reset: the loop then)
        if not a.requires_grad and bool((scalar >= 0).all()) and torch.equal(a, scalar.expand_as(a)):
            dense = _scalar_decay_operator(scalar[..., 0], b, c)
            return dense if self.d is None else dense + torch.diag_embed(self.d)
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


def _scalar_decay_operator(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """T[i, j] = (prod_{m=j+1..i} a_m) c_i . b_j for j <= i, for decays a (..., L) >= 0 shared
    by the N modes (b, c (..., L, N)): the masked sums S[i, j] = sum_{m=j+1..i} log a_m of
    Mamba2's SSD ("segsum"), each summed from its own first term (no difference of cumulative
    sums, so nothing cancels), times the (L, L) matrix C B^T. A reset (a_m = 0) makes S = -inf
    and the entry 0, as the recurrence does. The error of an entry is about (i - j) eps
    |S[i, j]| exp(S[i, j]) |c_i . b_j|, below L eps |c_i . b_j|: that of the recurrence's products.
    O(L^2 (N + 1)) per unit as one matrix product, instead of L steps over (L, N) states."""
    length = a.shape[-1]
    below = torch.ones(length, length, dtype=torch.bool, device=a.device).tril(-1)
    logs = torch.log(a)[..., :, None].expand(*a.shape, length).masked_fill(~below, 0.0)  # [i, j] = log a_i, i > j
    decay = torch.cumsum(logs, dim=-2).exp().tril()  # above the diagonal the sums are 0: exp 1, dropped
    return (c @ b.mT) * decay


@dataclass
class DPLRSSM(_Recurrence):
    """A batch of state-space operators with diagonal-plus-low-rank transitions, per unit:

        h_t = A_t h_{t-1} + b_t u_t,    A_t = diag(a_t) + p_t q_t^T      h_{-1} = 0
        y_t = c_t . h_t + d_t u_t

    so that T[i, j] = c_i . A_i A_{i-1} ... A_{j+1} b_j (+ d_i when i == j).

    Shapes: a, b, c are ``(*batch, L, N)``; p, q are ``(*batch, L, N, r)`` (r = 1 for the
    delta rule); d is ``(*batch, L)`` or None (zero). r = 0 is a `DiagonalSSM`.

    The delta rule per value channel, key size N (docs/families.md): Gated DeltaNet has
    A_t = alpha_t (I - beta_t k_t k_t^T), i.e. a = alpha_t 1, p = -alpha_t beta_t k_t, q = k_t,
    b = beta_t k_t, c = q_t; KDA (per-key decay) has A_t = (I - beta_t k_t k_t^T) diag(alpha_t),
    i.e. a = alpha_t, p = -beta_t k_t, q = alpha_t * k_t.

    Spectra use the same square-root sweeps as `DiagonalSSM` (core/sweeps.py): the
    triangular factors are multiplied by A_t (a diagonal scaling plus a rank-r update,
    O(N^2 r)) before each QR, so no Gramian and no product of transitions is formed. The
    blocked scan (core/scan.py, the default on GPUs) also forms the products of the
    transitions within each block of about sqrt(L) steps, as N x N matrices.
    """

    a: torch.Tensor
    p: torch.Tensor
    q: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    d: torch.Tensor | None = None

    def __post_init__(self):
        for name in ("a", "p", "q", "b", "c") + (("d",) if self.d is not None else ()):
            value = as_tensor(getattr(self, name), name)
            require(
                value.is_floating_point() and not value.is_complex(),
                f"DPLRSSM: {name} must be a real floating-point tensor, got dtype {value.dtype}; "
                "convert it with .to(torch.float64)",
            )
            require(all_finite(value), f"DPLRSSM: {name} contains NaN or infinite values")
            setattr(self, name, value)
        vectors = {name: tuple(getattr(self, name).shape) for name in ("a", "b", "c")}
        require(self.a.ndim >= 2, f"DPLRSSM: a must have shape (*batch, L, N), got {vectors['a']}")
        require(
            len(set(vectors.values())) == 1,
            f"DPLRSSM: a, b and c must share one shape (*batch, L, N); got {vectors}",
        )
        factors = {"p": tuple(self.p.shape), "q": tuple(self.q.shape)}
        require(
            len(set(factors.values())) == 1 and factors["p"][:-1] == vectors["a"],
            f"DPLRSSM: p and q must both have shape (*batch, L, N, r) with (*batch, L, N) = {vectors['a']} "
            f"(the shape of a); got {factors}",
        )
        if self.d is not None:
            require(
                tuple(self.d.shape) == vectors["a"][:-1],
                f"DPLRSSM: d must have shape (*batch, L) = {vectors['a'][:-1]}, got {tuple(self.d.shape)}",
            )

    @property
    def rank(self) -> int:
        """r, the rank of the low-rank part of every transition."""
        return self.p.shape[-1]

    def to(self, *args, **kwargs) -> "DPLRSSM":
        move = lambda x: None if x is None else x.to(*args, **kwargs)  # noqa: E731
        return DPLRSSM.derived(**{name: move(getattr(self, name)) for name in ("a", "p", "q", "b", "c", "d")})

    def __getitem__(self, index) -> "DPLRSSM":
        """Select units along the batch dimensions, e.g. ``ssm[3]`` or ``ssm[:, 0]``."""
        index = index if isinstance(index, tuple) else (index,)
        pick = lambda x: None if x is None else x[index + (Ellipsis,)]  # noqa: E731
        return DPLRSSM.derived(**{name: pick(getattr(self, name)) for name in ("a", "p", "q", "b", "c", "d")})

    def _transition(self, t: int, h: torch.Tensor) -> torch.Tensor:
        """A_t h for states h of shape (*batch, m, N): diag(a_t) h + p_t (q_t^T h)."""
        coefficients = torch.einsum("...mn,...nr->...mr", h, self.q[..., t, :, :])
        return self.a[..., t, None, :] * h + torch.einsum("...mr,...nr->...mn", coefficients, self.p[..., t, :, :])

    def materialize(self) -> torch.Tensor:
        """The dense operator T, shape ``(*batch, L, L)``, lower triangular: the recurrence run
        on the identity (column j is the response to an impulse at j). Memory O(L^2 N) per
        unit: a reference for tests and small units."""
        length = self.length
        h = torch.zeros(*self.batch_shape, length, self.state_size, dtype=self.a.dtype, device=self.a.device)
        rows = []
        for i in range(length):
            h = self._transition(i, h)
            h[..., i, :] = h[..., i, :] + self.b[..., i, :]
            rows.append(torch.einsum("...n,...jn->...j", self.c[..., i, :], h))
        dense = torch.stack(rows, dim=-2)
        return dense if self.d is None else dense + torch.diag_embed(self.d)

    def apply(self, u: torch.Tensor) -> torch.Tensor:
        """y = T u by the recurrence, u of shape ``(*batch, L)``: a reference for tests."""
        h = torch.zeros(*self.batch_shape, 1, self.state_size, dtype=self.a.dtype, device=self.a.device)
        ys = []
        for i in range(self.length):
            h = self._transition(i, h) + (self.b[..., i, :] * u[..., i, None])[..., None, :]
            ys.append((self.c[..., i, :] * h[..., 0, :]).sum(-1))
        y = torch.stack(ys, dim=-1)
        return y if self.d is None else y + self.d * u


# Operators whose spectra come from the square-root sweeps (core/sweeps.py).
FACTORED_OPERATORS = (DiagonalSSM, DPLRSSM)


def overflow_error(op, cause: Exception | None = None) -> ValueError:
    """The error for spectra that left the floating-point range (growing decays). ``cause``: the
    solver's LinAlgError that revealed it; where the decays are stable (|a| <= 1) that is a
    solver that did not converge, not an overflow, and the error says so."""
    hint = ""
    decay = getattr(op, "a", None) if isinstance(op, FACTORED_OPERATORS) else None
    if isinstance(decay, torch.Tensor) and decay.numel():
        largest = decay.abs().max().item()
        if cause is not None and largest <= 1:
            return ValueError(
                f"a linear-algebra solver did not converge on this operator ({cause}); its decays are stable "
                f"(largest |a| = {largest:.6g}), so its spectra do not overflow the floating-point range: "
                "compute it with precision='exact' or on the CPU (device='cpu'), and please report it"
            )
        hint = f" (largest |a| = {largest:.3g}: decays above 1 grow like |a|^L)"
    return ValueError(
        f"the operator's singular values overflow the floating-point range{hint}; ESS is defined for "
        "operators whose entries stay finite: check the decays (|a| <= 1 for a stable model) or rescale the operator"
    )
