"""The operators of one layer for one prompt, per unit: what capture produces and the core consumes.

A layer's units (query heads or channels) each own one causal operator T (L x L, lower
triangular, T[i, j] = weight of input j in output i), held in one of three forms chosen per
family:

    DenseCapture      T stored as a stack (U, L, L)            softmax attention
    SSMCapture        T as a DiagonalSSM built on demand       Mamba, Mamba2, LA, GLA
                      for any subset of units ((u, L, N) each)
    ShortConvCapture  T[i, j] = C_i w[k-1-(i-j)] B_j           LFM2 gated short conv
                      stored as B, C (U, L) and w (U, k)

A capture from a model also keeps what the reconstruction test needs, per unit:

    inputs    (U, L, Cu)  the mixer input the unit's T acts on (Cu channels share one T:
                          the head's value channels for attention / LA / Mamba2, 1 for a
                          Mamba or short-conv channel)
    outputs   (U, L, Cu)  the mixer output the model itself computed
    out_gate  (U, L, Cu)  token-wise multiplier applied after T (Mamba's silu(z)), or None
    out_offset(U, L, Cu)  token-wise additive term (a conv bias times C), or None

so that ``outputs == out_gate * (T @ inputs) + out_offset`` per unit (see `reconstruct`).

Multiplicity: the number of scalar channels that share one unit's T (``multiplicity``,
docs/conventions.md): the value channels of a head (head_dim of V for softmax attention,
Mamba2, LA, GLA), 1 for a Mamba or short-conv channel. Layer totals count scalars:
sum over units of multiplicity x (ESS or TSS). An adapter sets it; otherwise it is Cu, the
last dimension of the captured inputs, and 1 for operators with no captured input.

State weight: the scalars of state each unit stands for per unit of its TSS
(`unit_state_weight`), which layer totals of TSS use. It is the multiplicity, unless the
adapter records the layer's state per unit of TSS in ``info["state_scalars_per_tss"]``:
softmax attention keeps a KV cache of 2 x KV heads x head_dim scalars per past token, shared
by the query heads (GQA), so its per-head weight is that divided by the heads.
Operators that did not come from a model (synthetic ones, `LayerESS.from_operator`) leave
them None. Token-wise maps (projections, norms) stay outside T (docs/families.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable, NamedTuple

import numpy as np
import torch

from . import costs
from .accelerator import accelerator_routes
from .causal import (
    reachability_gramian_singular_values,
    reachability_singular_values,
    shift_register_singular_values,
)
from .checks import all_finite, finite_spectra
from .diagnostics import theoretical_state_size, unit_kind
from .gramian import gramian_hankel_singular_values, layer_uses_kernel, route_seconds, wanted_cuts
from .operators import DiagonalSSM
from .precision import EXACT, Accuracy
from .row_scaled import row_scaled_hankel_singular_values
from .short_conv import short_conv_hankel_singular_values, short_conv_operator
from .spectra import choose_ssm_path, hankel_singular_values, overflow_error
from .sturm import TridiagonalSpectra
from .sweeps import factored_hankel_singular_values

__all__ = ["CapturedLayer", "DenseCapture", "OwnerRows", "SSMCapture", "ShortConvCapture"]


def _index(units) -> torch.Tensor:
    return torch.as_tensor(list(units) if not isinstance(units, torch.Tensor) else units, dtype=torch.long)


class OwnerRows(NamedTuple):
    """Spectra that units share through their owner: unit u's are values[inverse[u]] (a head's
    reachability, the same for each of its channels: counted once per head, not copied to
    each channel)."""

    values: torch.Tensor  # (owners, P, K)
    inverse: torch.Tensor  # (units,) rows into values

    def per_unit(self) -> torch.Tensor:
        """(units, P, K): each unit's own copy."""
        return self.values[self.inverse]


@dataclass
class CapturedLayer:
    """Operators of one layer for one prompt (see the module docstring). Float64 math.

    Subclasses implement `dense`, `spectra` and `max_rank`. Sizes: ``state_size`` (N or d_k,
    for the TSS of recurrent families), ``window`` (sliding-window attention), ``kernel_size``
    (short conv).

    A unit may be a row-scaled copy of a stored operator (SSMCapture, DenseCapture): unit u
    is T_u = diag(row_scale[u]) T_owner[u], the stored operator ``owner[u]`` with its rows
    scaled (an output gate folded into T, core/gates.py). Units with one owner share its
    materialisation, its reachability factor (causal ESS) and, on the dense path, one SVD
    per cut (core/row_scaled.py). None: unit u is stored operator u, unscaled.
    """

    layer: int
    family: str
    inputs: torch.Tensor | None = None
    outputs: torch.Tensor | None = None
    out_gate: torch.Tensor | None = None
    out_offset: torch.Tensor | None = None
    state_size: int | None = None
    window: int | None = None
    kernel_size: int | None = None
    multiplicity: int | None = None
    info: dict = field(default_factory=dict)
    owner: torch.Tensor | None = None  # (U,) the stored operator of each unit
    row_scale: torch.Tensor | None = None  # (U, L) the scale of each unit's rows

    def _owners(self, units) -> tuple[torch.Tensor, torch.Tensor]:
        """(distinct owners of ``units``, for each unit the row of its owner among them)."""
        index = _index(units)
        return torch.unique(index if self.owner is None else self.owner[index], return_inverse=True)

    def _shares_owners(self, units) -> bool:
        owners, inverse = self._owners(units)
        return len(owners) < len(inverse)

    def units_per_owner(self) -> int:
        """The fewest units any owner has where every owner's units are row-scaled copies of
        it, at least two each (their spectra then take core/row_scaled.py, which materialises
        the owners, not the units); else 1."""
        if self.row_scale is None or self.owner is None:
            return 1
        fewest = int(torch.unique(self.owner, return_counts=True)[1].min())
        return fewest if fewest >= 2 else 1

    def _stored_owners(self, owners: torch.Tensor) -> torch.Tensor:
        """The stored operators ``owners`` as dense T (o, L, L), unscaled (subclasses)."""
        raise NotImplementedError

    def dense(self, units) -> torch.Tensor:
        """T of the given units, (len(units), L, L) float64, lower triangular: each owner
        materialised once, its rows scaled per unit."""
        owners, inverse = self._owners(units)
        stored = self._stored_owners(owners)[inverse].to(torch.float64)
        return stored if self.row_scale is None else stored * self.row_scale[_index(units), :, None].to(torch.float64)

    def _row_scaled_spectra(self, units, positions, dtype, device, accuracy: Accuracy = EXACT) -> torch.Tensor | None:
        """Spectra of units that share owners (core/row_scaled.py: one SVD of each owner's cut
        serves them all, or the dense route where that costs less), or None where no two of
        ``units`` share one."""
        owners, inverse = self._owners(units)
        if self.row_scale is None or len(owners) == len(inverse):
            return None
        scales = self.row_scale[_index(units)]
        return row_scaled_hankel_singular_values(
            self._stored_owners(owners),
            inverse,
            scales,
            positions,
            max_rank=self.max_rank,
            dtype=dtype,
            device=device,
            accuracy=accuracy,
        )

    @property
    def unit_kind(self) -> str:
        """ "head" or "channel": the family's, unless the gate policy split a head into its
        channels (core/gates.py records that in ``info``)."""
        return self.info.get("unit_kind", unit_kind(self.family))

    @property
    def n_units(self) -> int:
        return int(self._shape()[0])

    @property
    def length(self) -> int:
        return int(self._shape()[1])

    def unit_multiplicity(self) -> int:
        """Scalar channels per unit that share its T (see the module docstring)."""
        if self.multiplicity is not None:
            if int(self.multiplicity) < 1:
                raise ValueError(f"multiplicity must be a positive channel count, got {self.multiplicity!r}")
            return int(self.multiplicity)
        return 1 if self.inputs is None else int(self.inputs.shape[-1])

    def unit_state_weight(self) -> float:
        """Scalars of state per unit per unit of TSS (see the module docstring): the layer's
        ``info["state_scalars_per_tss"]`` spread over its units, else the multiplicity."""
        per_tss = self.info.get("state_scalars_per_tss")
        if per_tss is None:
            return float(self.unit_multiplicity())
        if not float(per_tss) > 0:
            raise ValueError(f"state_scalars_per_tss must be a positive count, got {per_tss!r}")
        return float(per_tss) / self.n_units

    def check_finite(self, dtype: str = "") -> None:
        """ValueError where a captured tensor holds NaN or infinite values: the model's forward
        pass left the floating-point range on this prompt (its own output is NaN there, and
        no operator, so no ESS, is defined). ``dtype``: the model's; a half-precision one is
        advised to load in float32."""
        bad = [
            f.name
            for f in fields(self)
            if isinstance(value := getattr(self, f.name), torch.Tensor)
            and value.is_floating_point()
            and not all_finite(value)
        ]
        if bad:
            half = dtype in ("float16", "bfloat16")
            raise ValueError(
                f"layer {self.layer}: the model's forward pass on this prompt produced NaN or infinite values "
                f"(in the captured {', '.join(bad)}), so this layer has no finite operator to measure: "
                + (f"its activations overflow {dtype}; load it in float32" if half else "check its weights")
            )

    def _shape(self) -> tuple[int, int]:
        """(units, L), from the captured inputs when there are some."""
        if self.inputs is None:
            raise NotImplementedError
        return tuple(self.inputs.shape[:2])

    def spectra(
        self, units, positions, *, device=None, dtype=torch.float64, accuracy: Accuracy = EXACT
    ) -> torch.Tensor:
        """Full spectra of the cuts: (len(units), P, K) with K >= max_rank, descending, within
        ``accuracy`` (core/precision.py)."""
        raise NotImplementedError

    def spectra_path(self, positions, device=None, accuracy: Accuracy = EXACT) -> dict:
        """How `spectra` computes these cuts within ``accuracy``: ``{"method", "reason"}``
        (recorded per layer)."""
        return {"method": self.family, "reason": "the family's own path"}

    @property
    def max_rank(self) -> int | None:
        """An upper bound on rank(H_t) from the structure (N, d_k, k - 1, w - 1), or None."""
        return None

    def causal_spectra(
        self, units, positions, *, device=None, dtype=torch.float64, accuracy: Accuracy = EXACT
    ) -> torch.Tensor | None:
        """sigma(R_t), the reachability factor of each cut, (len(units), P, K) descending, for a
        family with a known realisation; None otherwise (core/causal.py)."""
        return None

    def spectra_and_causal(self, units, positions, *, device=None, dtype=torch.float64, accuracy: Accuracy = EXACT):
        """(`spectra`, `causal_spectra`) of the same units and cuts; a family that computes
        both in one pass overrides it."""
        return (
            self.spectra(units, positions, device=device, dtype=dtype, accuracy=accuracy),
            self.causal_spectra(units, positions, device=device, dtype=dtype, accuracy=accuracy),
        )

    def causal_count(self, positions) -> np.ndarray | None:
        """(P,) causal ESS fixed by the structure (softmax attention: its KV cache), or None."""
        return None

    def rank_bound(self, positions) -> np.ndarray:
        """(P,) how many singular values the full spectrum of H_t has at most."""
        t = np.asarray(positions, dtype=np.int64)
        bound = np.minimum(t, self.length - t)
        return bound if self.max_rank is None else np.minimum(bound, self.max_rank)

    def tss(self, positions) -> np.ndarray:
        """(P,) theoretical state size of one unit (diagnostics.theoretical_state_size)."""
        return theoretical_state_size(
            self.family, positions, state_size=self.state_size, window=self.window, kernel_size=self.kernel_size
        )

    def reconstruct(self, units=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(predicted, observed), each (u, L, Cu) float64: out_gate * (T @ inputs) + out_offset
        from the materialised T, against the mixer output the model computed."""
        if self.inputs is None or self.outputs is None:
            raise ValueError("this operator was not captured from a model: there is no input/output to reconstruct")
        index = _index(range(self.n_units) if units is None else units)
        op = self.dense(index)
        predicted = op @ self.inputs[index].to(torch.float64)
        if self.out_gate is not None:
            predicted = predicted * self.out_gate[index].to(torch.float64)
        if self.out_offset is not None:
            predicted = predicted + self.out_offset[index].to(torch.float64)
        return predicted, self.outputs[index].to(torch.float64)


@dataclass
class DenseCapture(CapturedLayer):
    """T stored whole: ``operator`` (O, L, L), one per unit or per owner (see CapturedLayer).
    Spectra by the dense core path."""

    operator: torch.Tensor | None = None

    def _shape(self) -> tuple[int, int]:
        units = self.operator.shape[0] if self.owner is None else len(self.owner)
        return (units, self.operator.shape[-1])

    def _stored_owners(self, owners: torch.Tensor) -> torch.Tensor:
        return self.operator[owners]

    @property
    def max_rank(self) -> int | None:
        return None if self.window is None else max(self.window - 1, 0)

    def spectra_path(self, positions, device=None, accuracy: Accuracy = EXACT) -> dict:
        batched = accelerator_routes(device if device is not None else self.operator.device)
        return {
            "method": "dense",
            "reason": "the operator is stored dense" + ("; cuts batched by size" if batched else "; one call per cut"),
        }

    def spectra(
        self, units, positions, *, device=None, dtype=torch.float64, accuracy: Accuracy = EXACT
    ) -> torch.Tensor:
        positions = torch.as_tensor(positions)
        sigma = self._row_scaled_spectra(units, positions, dtype, device, accuracy)
        if sigma is not None:
            return sigma
        owners, inverse = self._owners(units)
        operator = self.operator[owners][inverse] if self.row_scale is None else self.dense(units)
        return hankel_singular_values(operator, positions=positions, dtype=dtype, device=device, precision=accuracy)

    def causal_count(self, positions) -> np.ndarray | None:
        # Softmax attention keeps every past token (t, or w - 1 with a window; chunked: the
        # tokens of the current chunk); any other dense operator has no known realisation,
        # so no causal ESS (NaN).
        return self.tss(positions) if self.family in ("softmax_attention", "chunked_attention") else None


@dataclass
class SSMCapture(CapturedLayer):
    """T as a DiagonalSSM per unit, built on demand by ``realize(index) -> DiagonalSSM``
    with batch shape (len(index),), so a whole layer never needs (U, L, L). With ``owner``,
    ``realize`` builds the owners' operators (see CapturedLayer); a row scale changes c and
    d only, so units of one owner share its a and b."""

    realize: Callable[[torch.Tensor], DiagonalSSM] | None = None
    shape: tuple[int, int] | None = None  # (units, L) when there are no captured inputs

    def _shape(self) -> tuple[int, int]:
        return self.shape if self.inputs is None else tuple(self.inputs.shape[:2])

    def ssm(self, units) -> DiagonalSSM:
        index = _index(units)
        base = self.realize(index if self.owner is None else self.owner[index])
        if self.row_scale is None:
            return base
        base = base.to(torch.float64)
        scale = self.row_scale[index].to(torch.float64)  # (u, L): row i of T is scaled by g_i
        d = None if base.d is None else base.d * scale
        return type(base).derived(**dict(base.__dict__, c=base.c * scale[..., None], d=d))

    def _stored_owners(self, owners: torch.Tensor) -> torch.Tensor:
        return self.realize(owners).to(torch.float64).materialize()

    @property
    def max_rank(self) -> int | None:
        return self.state_size

    def spectra_path(self, positions, device=None, accuracy: Accuracy = EXACT) -> dict:
        """Dense on the materialised T where N is large against L, else factored
        (core/spectra.py `choose_ssm_path`, whose costs are the exact routes'). Under "ess", where
        the whole layer takes the Gramian route and that job is large enough for its compiled
        kernel (`gramian.uses_kernel`), factored at any L: the kernel's one pass gives every cut
        and its causal spectrum, where the dense path's many small Grams, a per-unit job each,
        are overhead-bound (a Mamba-130m layer, N = 16, 2 cores: L = 32 0.52 s dense against
        0.09 s, L = 48 0.74 s against 0.17 s)."""
        if self.state_size is None or device is None:  # both from the operator itself
            probe = self.ssm([0])
            state_size = self.state_size if self.state_size is not None else probe.state_size
            device = device if device is not None else probe.a.device
        else:
            state_size = self.state_size
        shared = 1.0  # units per owner: row-scaled copies take the dense path's shared SVDs
        if self.row_scale is not None and self.owner is not None:
            shared = len(self.owner) / max(1, len(torch.unique(self.owner)))
        path = choose_ssm_path(self.length, state_size, positions, device, units_per_owner=shared)
        if path["method"] == "dense" and self._takes_gramian_kernel(positions, device, accuracy, state_size):
            path = {"method": "sweep", "reason": f"N={state_size}, L={self.length}: the Gramian route's kernel"}
        return self._cheaper_under_ess(path, positions, device, accuracy, state_size)

    def _cheaper_under_ess(self, path: dict, positions, device, accuracy: Accuracy, state_size: int) -> dict:
        """``path``, or the other route where, under "ess" on a CPU, a layer of diagonal units
        (each its own owner) costs clearly less there (core/costs.py `cheaper_route`): the
        exact routes' flops of `choose_ssm_path` miss what the "ess" routes cost. 24 heads of
        N = 128 at L = 512: the Gramian route 8.3 s a layer, dense 2.4 s; 64 heads of N = 128
        at L = 256: the kernel 15 s, dense 1.0 s; same ESS either way."""
        if not accuracy.fast or accelerator_routes(device) or not self._diagonal_own_owners(range(self.n_units)):
            return path
        cuts = wanted_cuts(positions, self.length)
        dense = costs.dense_seconds(self.n_units, self.length, cuts, state_size)
        dense += costs.causal_seconds(self.n_units, self.length, cuts, state_size)
        # a small job keeps its route (`cheaper_route`), priced first at the blocked Gramian
        # route: the kernel runs only where core/costs.py prices it lower (`uses_kernel`)
        if max(dense, costs.gramian_seconds(self.n_units, len(cuts), state_size, kernel=False)) < costs.SWITCH_SECONDS:
            return path
        gramian = route_seconds(device, self.n_units, len(cuts), state_size, self.length)
        where = f"N={state_size}, L={self.length}: est. {{}} {{:.2g}} s < {{}} {{:.2g}} s"
        if path["method"] == "dense" and costs.cheaper_route(dense, gramian):
            return {"method": "sweep", "reason": where.format("Gramian route", gramian, "dense", dense)}
        if path["method"] != "dense" and costs.cheaper_route(gramian, dense):
            return {"method": "dense", "reason": where.format("dense", dense, "Gramian route", gramian)}
        return path

    def _takes_gramian_kernel(self, positions, device, accuracy: Accuracy, state_size: int) -> bool:
        """Whether the whole layer would take the Gramian route (`gramian_route`) on a factored
        path, as a job for its compiled kernel (`spectra_path`)."""
        if not (accuracy.fast and self._diagonal_own_owners(range(self.n_units))):
            return False
        cuts = len(wanted_cuts(positions, self.length))
        return layer_uses_kernel(device, self.n_units, cuts, state_size, self.length)

    def spectra(
        self, units, positions, *, device=None, dtype=torch.float64, accuracy: Accuracy = EXACT
    ) -> torch.Tensor:
        positions = torch.as_tensor(positions)
        if self.spectra_path(positions, device, accuracy)["method"] == "dense":
            # the dense path returns L // 2 values per cut; rank(H_t) <= N keeps the first N
            sigma = self._row_scaled_spectra(units, positions, dtype, device, accuracy)
            if sigma is None:
                # exact: "svd", since a recurrence's cut spectra decay far below the Gram guard and
                # "auto" would redo most cuts by SVD after its eigvalsh (measured: 92% of a Mamba2
                # head's); "ess": the Gram's eigenvalues, whose guard reads tau (core/precision.py)
                dense = self.dense(units)
                method = "auto" if accuracy.fast else "svd"
                sigma = hankel_singular_values(
                    dense, positions=positions, dtype=dtype, device=device, method=method, precision=accuracy
                )
            n = self.state_size if self.state_size is not None else self.ssm([0]).state_size
            return sigma[..., : min(sigma.shape[-1], n)]
        return hankel_singular_values(
            self.ssm(units), positions=positions, dtype=dtype, device=device, precision=accuracy
        )

    def causal_spectra(
        self, units, positions, *, device=None, dtype=torch.float64, accuracy: Accuracy = EXACT, by_owner=False
    ) -> "torch.Tensor | OwnerRows":
        """One pass per distinct owner among ``units``: a row scale leaves a and b. Under
        "ess" a diagonal owner's Gramian eigenvalues (core/causal.py), else the exact sweep
        (Mamba2's N = 128 heads: a QR and an SVD of 128 x 128 per step, a quarter of the layer).
        ``by_owner``: as `OwnerRows`, one row per owner, not copied out to each of its units."""
        owners, inverse = self._owners(units)
        ssm, positions = self.realize(owners), torch.as_tensor(positions)
        if accuracy.fast and isinstance(ssm, DiagonalSSM):
            reach = reachability_gramian_singular_values(ssm, positions, accuracy, dtype=dtype, device=device)
        # a GPU: the scan's roots, no per-step launches
        elif self.spectra_path(positions, device, accuracy)["method"] == "scan":
            _, reach = factored_hankel_singular_values(
                ssm, positions=positions, dtype=dtype, device=device, causal=True
            )
        else:
            reach = reachability_singular_values(ssm, positions, dtype=dtype, device=device)
        shared = OwnerRows(reach, inverse)
        return shared if by_owner else shared.per_unit()

    def gramian_route(self, units, path: dict, accuracy: Accuracy) -> bool:
        """Whether ``units`` take the Gramian route (core/gramian.py) on ``path``: diagonal
        recurrences on the factored path, each its own owner (channels that share a head go
        dense), under the "ess" contract. `spectra_and_causal` and the chunk size of
        core/layer.py both ask here."""
        return bool(accuracy.fast and path.get("method") != "dense" and self._diagonal_own_owners(units))

    def _diagonal_own_owners(self, units) -> bool:
        """Whether ``units`` are diagonal recurrences, each its own owner."""
        index = _index(units)
        return bool(len(index) and not self._shares_owners(index) and isinstance(self.ssm(index[:1]), DiagonalSSM))

    def spectra_and_causal(self, units, positions, *, device=None, dtype=torch.float64, accuracy: Accuracy = EXACT):
        """Both in one pass where the factored path runs (the forward half of the sweep or
        the scan is the reachability factor: core/sweeps.py), else one after the other. Units
        that share an owner take its reachability from one sweep (`causal_spectra`)."""
        positions = torch.as_tensor(positions)
        path = self.spectra_path(positions, device, accuracy)
        if self._shares_owners(units):  # a head's channels: its reachability once, counted once (core/layer.py)
            kwargs = dict(device=device, dtype=dtype, accuracy=accuracy)
            return self.spectra(units, positions, **kwargs), self.causal_spectra(
                units, positions, **kwargs, by_owner=True
            )
        if path["method"] == "dense":
            return super().spectra_and_causal(units, positions, device=device, dtype=dtype, accuracy=accuracy)
        ssm = self.ssm(units)  # realised only here: the dense route realises its own
        try:
            if self.gramian_route(units, path, accuracy):
                sigma, reach = gramian_hankel_singular_values(
                    ssm, positions=positions, accuracy=accuracy, dtype=dtype, device=device, causal=True
                )
            else:
                sigma, reach = factored_hankel_singular_values(
                    ssm, positions=positions, dtype=dtype, device=device, causal=True
                )
        except torch.linalg.LinAlgError as error:
            raise overflow_error(ssm, error) from error
        top = reach.top if isinstance(reach, TridiagonalSpectra) else reach
        if not (finite_spectra(sigma) and finite_spectra(top)):
            raise overflow_error(ssm)  # as hankel_singular_values does: never inf / NaN
        return sigma, reach


@dataclass
class ShortConvCapture(CapturedLayer):
    """Gated short convolution per channel: T[i, j] = C_i w[k-1-(i-j)] B_j, 0 <= i - j < k.

    gate_in (U, L) is B, gate_out (U, L) is C, weight (U, k) the depthwise kernel in
    torch's Conv1d layout (w[k-1] multiplies the current token). Spectra: see
    capture/short_conv.py (exact, from the (k-1) x (k-1) block of each cut).
    """

    gate_in: torch.Tensor | None = None
    gate_out: torch.Tensor | None = None
    weight: torch.Tensor | None = None

    def _shape(self) -> tuple[int, int]:
        return tuple(self.gate_in.shape)

    @property
    def max_rank(self) -> int | None:
        return self.kernel_size - 1

    def dense(self, units) -> torch.Tensor:
        index = _index(units)
        return short_conv_operator(self.gate_in[index], self.gate_out[index], self.weight[index])

    def spectra_path(self, positions, device=None, accuracy: Accuracy = EXACT) -> dict:
        size = self.kernel_size - 1
        return {"method": "short_conv", "reason": f"exact from the {size} x {size} block of each cut"}

    def spectra(
        self, units, positions, *, device=None, dtype=torch.float64, accuracy: Accuracy = EXACT
    ) -> torch.Tensor:
        index = _index(units)  # exact under either contract: (k - 1) x (k - 1) blocks
        return short_conv_hankel_singular_values(
            self.gate_in[index], self.gate_out[index], self.weight[index], positions, device=device, dtype=dtype
        )

    def causal_spectra(
        self, units, positions, *, device=None, dtype=torch.float64, accuracy: Accuracy = EXACT
    ) -> torch.Tensor:
        gate_in = self.gate_in[_index(units)].to(device=device, dtype=dtype)
        return shift_register_singular_values(gate_in, self.kernel_size, positions)
