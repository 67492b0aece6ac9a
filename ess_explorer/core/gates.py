"""The gate policy: which per-token scalings around the sequence mixing belong to T.

A capture (core/units.py) keeps T and, separately, ``out_gate`` (U, L, Cu): the
input-dependent per-token, per-channel multiplier the model applies to T's output before
its output projection (Mamba's silu(z); Mamba2's gated norm, silu(z) / rms_t; the
per-token scale 1 / rms_t of a head's output norm in the project's LA / GLA). LFM2's
gates sit between projections inside its short conv and are in T already. Constant
per-channel weights (a norm's weight) and projections stay outside T in both settings.

gates = "outside": T is the sequence mixing alone; the gate stays in ``out_gate``.
gates = "inside" (the default of `analyze`): T' = diag(g) T, per channel. This is exact:

- a unit whose channels share one gate (Cu = 1, or the same g for every channel of the
  unit, e.g. a head norm's 1 / rms_t) keeps its unit and multiplicity; its T is scaled
  row-wise;
- a unit whose value channels have different gates (Mamba2: silu(z) per channel) no
  longer has one T: the channels' operators diag(g_c) T differ, so each (unit, channel)
  pair becomes a unit of its own, with multiplicity 1 (U' = U x Cu, unit kind
  "channel", unit u' = u * Cu + c). Its TSS stays the unit's (each channel reads the
  unit's N states), so layer totals in scalars are the same in both settings.

Rank (and so TSS) is unchanged by nonzero gates; tolerance- and entropy-ESS are not.
Causal ESS is unchanged by an output gate (the reachability factor does not see it).
"""

from __future__ import annotations

import dataclasses

import torch

from ..options import DEFAULT_GATES, GATES, check_choice
from .units import CapturedLayer, DenseCapture, ShortConvCapture, SSMCapture

__all__ = ["GATES", "DEFAULT_GATES", "check_gates", "gates_inside"]


def check_gates(gates: str) -> str:
    """The one place that accepts a gate policy."""
    return check_choice("gates", gates, GATES)


def _split_channels(x: torch.Tensor | None) -> torch.Tensor | None:
    """(U, L, Cu) -> (U * Cu, L, 1), unit u' = u * Cu + c."""
    if x is None:
        return None
    units, length, channels = x.shape
    return x.permute(0, 2, 1).reshape(units * channels, length, 1)


def gates_inside(layer: CapturedLayer) -> CapturedLayer:
    """The capture with its ``out_gate`` folded into T (module docstring); the layer itself
    when it has no gate. Reconstruction still holds: T' @ inputs + out_offset == outputs."""
    if layer.out_gate is None:
        return layer
    gate = layer.out_gate.to(torch.float64)  # (U, L, Cu)
    units, length, channels = gate.shape
    shared = channels == 1 or bool((gate == gate[..., :1]).all())
    if shared:
        owner = torch.arange(units)
        g = gate[..., 0]  # (U', L)
        reshape = lambda x: x  # noqa: E731
        multiplicity, info = layer.multiplicity, dict(layer.info, gates="inside")
    else:
        owner = torch.arange(units).repeat_interleave(channels)
        g = gate.permute(0, 2, 1).reshape(units * channels, length)
        reshape = _split_channels
        multiplicity = 1
        info = dict(layer.info, gates="inside", unit_kind="channel", channels_per_unit=channels)
    common = dict(
        inputs=reshape(layer.inputs),
        outputs=reshape(layer.outputs),
        out_offset=reshape(layer.out_offset),
        out_gate=None,
        multiplicity=multiplicity,
        info=info,
    )

    if isinstance(layer, (SSMCapture, DenseCapture)):  # unit u' = diag(g_u') T of its unit's owner
        row_scale = g if layer.row_scale is None else layer.row_scale[owner].to(torch.float64) * g
        owner = owner if layer.owner is None else layer.owner[owner]
        if isinstance(layer, SSMCapture):
            common["shape"] = (len(row_scale), layer.length)
        return dataclasses.replace(layer, owner=owner, row_scale=row_scale, **common)
    if isinstance(layer, ShortConvCapture):
        return dataclasses.replace(
            layer,
            gate_in=layer.gate_in[owner],
            gate_out=layer.gate_out[owner].to(torch.float64) * g,
            weight=layer.weight[owner],
            **common,
        )
    raise TypeError(f"no gate folding for {type(layer).__name__}; fold its out_gate into its T here")
