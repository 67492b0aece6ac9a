"""What an adapter produces: the operators one layer applied to one prompt.

An adapter turns a layer's captured tensors (one forward pass, batch 1) into a
`CapturedLayer`: the layer's units (query heads or channels), each owning one causal
operator T (L x L, lower triangular, T[i, j] = weight of input j in output i), in one of
three forms chosen per family:

    DenseCapture      T stored as a stack (U, L, L)            softmax attention
    SSMCapture        T as a DiagonalSSM built on demand       Mamba, Mamba2, LA, GLA
                      for any subset of units ((u, L, N) each)
    ShortConvCapture  T[i, j] = C_i w[k-1-(i-j)] B_j           LFM2 gated short conv
                      stored as B, C (U, L) and w (U, k)

Every capture also keeps what the reconstruction test needs, per unit:

    inputs    (U, L, Cu)  the mixer input the unit's T acts on (Cu channels share one T:
                          the head's value channels for attention / LA / Mamba2, 1 for a
                          Mamba or short-conv channel)
    outputs   (U, L, Cu)  the mixer output the model itself computed
    out_gate  (U, L, Cu)  token-wise multiplier applied after T (Mamba's silu(z)), or None
    out_offset(U, L, Cu)  token-wise additive term (a conv bias times C), or None

so that ``outputs == out_gate * (T @ inputs) + out_offset`` per unit (see `reconstruct`).
Token-wise maps (projections, gates, norms) stay outside T, as in ESS.md section 1.

The adapter protocol itself (how a family attaches to a model for one forward pass) is
`Adapter` below; `CaptureSession` is the bookkeeping shared by all adapters of one pass
(hooks to remove, module functions to restore, the layer now running).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np
import torch
from torch import nn

from ..diagnostics import theoretical_state_size
from ..ess import hankel_singular_values
from ..realizations import DiagonalSSM

__all__ = [
    "LayerSlot",
    "Adapter",
    "CaptureSession",
    "CapturedLayer",
    "DenseCapture",
    "SSMCapture",
    "ShortConvCapture",
]


@dataclass(frozen=True)
class LayerSlot:
    """Where one analysed layer's sequence mixer lives.

    index: 0-based layer index (the key of ESSResult.layers); adapter: the family key of
    `ADAPTERS` (adapters/__init__.py); module: the mixer module hooks attach to;
    window: sliding-window length for attention layers (None = full causal).
    """

    index: int
    adapter: str
    module: nn.Module
    window: int | None = None


class Adapter(Protocol):
    """One family of sequence mixers.

    install(session, slot): attach whatever captures the layer's tensors during the one
        forward pass (forward hooks, or a wrapped module-level function); everything must
        be registered through `session` so that it is undone in a ``finally``.
    build(slot, raw): turn the captured tensors (the dict `session.raw[slot.index]`) into
        a CapturedLayer; raise RuntimeError when something expected was not captured.
    """

    def install(self, session: "CaptureSession", slot: LayerSlot) -> None: ...

    def build(self, slot: LayerSlot, raw: dict) -> "CapturedLayer": ...


class CaptureSession:
    """Hooks, patches and captured tensors of one forward pass.

    raw[layer] is a dict each adapter fills; `current` is the index of the layer whose
    mixer is running (set by `track`), so that a wrapped module-level function shared by
    all layers knows whose call it sees.
    """

    def __init__(self) -> None:
        self.raw: dict[int, dict[str, Any]] = {}
        self.current: int | None = None
        self._handles: list = []
        self._patches: dict[tuple[str, str], Callable] = {}
        self._instance_patches: list[tuple[object, str]] = []

    def store(self, layer: int) -> dict:
        return self.raw.setdefault(layer, {})

    def hook(self, handle) -> None:
        self._handles.append(handle)

    def track(self, layer: int, module: nn.Module) -> None:
        """Mark `layer` as current while `module` runs (pre and post forward hooks)."""

        def enter(_module, _args):
            self.current = layer

        def leave(_module, _args, _output):
            self.current = None

        self.hook(module.register_forward_pre_hook(enter))
        self.hook(module.register_forward_hook(leave))

    def patch_function(self, module_name: str, name: str, make_wrapper: Callable[[Callable], Callable]) -> None:
        """Replace ``module_name.name`` by ``make_wrapper(original)`` once per session."""
        key = (module_name, name)
        if key in self._patches:
            return
        module = sys.modules[module_name]
        original = getattr(module, name)
        self._patches[key] = original
        setattr(module, name, make_wrapper(original))

    def patch_method(self, instance: object, name: str, make_wrapper: Callable[[Callable], Callable]) -> None:
        """Shadow a bound method on one instance (removed again by `close`)."""
        if name in vars(instance):
            raise RuntimeError(f"{type(instance).__name__}.{name} is already patched on this instance")
        setattr(instance, name, make_wrapper(getattr(instance, name)))
        self._instance_patches.append((instance, name))

    def close(self) -> None:
        """Remove every hook and restore every patched function (call in a finally)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for (module_name, name), original in self._patches.items():
            setattr(sys.modules[module_name], name, original)
        self._patches.clear()
        for instance, name in self._instance_patches:
            vars(instance).pop(name, None)
        self._instance_patches.clear()
        self.current = None


def _index(units) -> torch.Tensor:
    return torch.as_tensor(list(units) if not isinstance(units, torch.Tensor) else units, dtype=torch.long)


@dataclass
class CapturedLayer:
    """Operators of one layer for one prompt (see the module docstring). Float64 math.

    Subclasses implement `dense`, `spectra` and `max_rank`. Sizes: ``state_size`` (N or d_k,
    for the TSS of recurrent families), ``window`` (sliding-window attention), ``kernel_size``
    (short conv).
    """

    layer: int
    family: str
    inputs: torch.Tensor
    outputs: torch.Tensor
    out_gate: torch.Tensor | None = None
    out_offset: torch.Tensor | None = None
    state_size: int | None = None
    window: int | None = None
    kernel_size: int | None = None
    info: dict = field(default_factory=dict)

    @property
    def n_units(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def length(self) -> int:
        return int(self.inputs.shape[1])

    def dense(self, units) -> torch.Tensor:
        """T of the given units, (len(units), L, L) float64, lower triangular."""
        raise NotImplementedError

    def spectra(self, units, positions, *, device=None, dtype=torch.float64) -> torch.Tensor:
        """Full spectra of the cuts: (len(units), P, K) with K >= max_rank, descending."""
        raise NotImplementedError

    @property
    def max_rank(self) -> int | None:
        """An upper bound on rank(H_t) from the structure (N, d_k, k - 1, w - 1), or None."""
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
    """T stored whole: ``operator`` (U, L, L). Spectra by the dense core path."""

    operator: torch.Tensor | None = None

    def dense(self, units) -> torch.Tensor:
        return self.operator[_index(units)].to(torch.float64)

    @property
    def max_rank(self) -> int | None:
        return None if self.window is None else max(self.window - 1, 0)

    def spectra(self, units, positions, *, device=None, dtype=torch.float64) -> torch.Tensor:
        return hankel_singular_values(
            self.operator[_index(units)], positions=torch.as_tensor(positions), dtype=dtype, device=device
        )


@dataclass
class SSMCapture(CapturedLayer):
    """T as a DiagonalSSM per unit, built on demand by ``realize(index) -> DiagonalSSM``
    with batch shape (len(index),), so a whole layer never needs (U, L, L)."""

    realize: Callable[[torch.Tensor], DiagonalSSM] | None = None

    def ssm(self, units) -> DiagonalSSM:
        return self.realize(_index(units))

    def dense(self, units) -> torch.Tensor:
        return self.ssm(units).to(torch.float64).materialize()

    @property
    def max_rank(self) -> int | None:
        return self.state_size

    def spectra(self, units, positions, *, device=None, dtype=torch.float64) -> torch.Tensor:
        return hankel_singular_values(self.ssm(units), positions=torch.as_tensor(positions), dtype=dtype, device=device)


@dataclass
class ShortConvCapture(CapturedLayer):
    """Gated short convolution per channel: T[i, j] = C_i w[k-1-(i-j)] B_j, 0 <= i - j < k.

    gate_in (U, L) is B, gate_out (U, L) is C, weight (U, k) the depthwise kernel in
    torch's Conv1d layout (w[k-1] multiplies the current token). Spectra: see
    adapters/short_conv.py (exact, from the (k-1) x (k-1) block of each cut).
    """

    gate_in: torch.Tensor | None = None
    gate_out: torch.Tensor | None = None
    weight: torch.Tensor | None = None

    @property
    def max_rank(self) -> int | None:
        return self.kernel_size - 1

    def dense(self, units) -> torch.Tensor:
        from .short_conv import short_conv_operator

        index = _index(units)
        return short_conv_operator(self.gate_in[index], self.gate_out[index], self.weight[index])

    def spectra(self, units, positions, *, device=None, dtype=torch.float64) -> torch.Tensor:
        from .short_conv import short_conv_hankel_singular_values

        index = _index(units)
        return short_conv_hankel_singular_values(
            self.gate_in[index], self.gate_out[index], self.weight[index], positions, device=device, dtype=dtype
        )
