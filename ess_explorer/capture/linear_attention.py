"""The project's own linear attention (LA) and gated linear attention (GLA) layers.

Model: ``model_type = "ess_linear_attention"`` (ess_explorer/zoo/modeling.py), mixer at
``model.model.layers[i].mixer`` (a ``LinearAttentionMixer``) with
``project(hidden) -> dict(q, k, v, log_decay)`` (q, k: (B, H, L, dk), v: (B, H, L, dv),
log_decay: (B, H, L, dk) <= 0 or None) and ``mix(q, k, v, log_decay) -> (B, H, L, dv)``.

Math. Per head h, no normalisation,

    T_h[i, j] = q_i^T diag(prod_{t=j+1..i} alpha_t) k_j         j <= i
    alpha_t = exp(log_decay_t) in (0, 1]^dk (GLA), alpha = 1 (LA)

and every value channel of the head sees the same T_h (o = T_h v per channel). The per-head
output norm then multiplies token t of head h by 1 / rms(o_{h,t}) (one scale for all the
head's channels; its weight is constant): the capture keeps that scale as ``out_gate``
and the scaled output as ``outputs`` (core/gates.py folds it into T with
gates="inside", keeping the head as the unit). The short conv, projections, the norm's
weight and the output projection are token-wise or come before project(): outside T.

As a DiagonalSSM per head: a = alpha (L, dk), b = k, c = q, d = 0 (the j = i term is in
c_i . h_i). Unit = head; factored core path, one batched call per layer, O(L dk^3) per
head. TSS per head: dk. Family "gated_linear_attention" when log_decay is given, else
"linear_attention".

Capture: ``mix`` is a method, not a module, so it has no hooks; for the one forward pass
each analysed mixer's ``mix`` is shadowed on the instance by a recording wrapper that
calls the original (removed in a ``finally``).
"""

from __future__ import annotations

import torch

from ..core.operators import DiagonalSSM
from ..core.units import SSMCapture
from .base import CaptureSession, LayerSlot

__all__ = ["LinearAttentionAdapter"]


class LinearAttentionAdapter:
    family = "linear_attention"

    def install(self, session: CaptureSession, slot: LayerSlot) -> None:
        raw = session.store(slot.index)

        def make_wrapper(original):
            def mix(q, k, v, log_decay=None):
                out = original(q, k, v, log_decay)
                raw["mix"] = (
                    q.detach(),
                    k.detach(),
                    v.detach(),
                    None if log_decay is None else log_decay.detach(),
                    out.detach(),
                )
                return out

            return mix

        session.patch_method(slot.module, "mix", make_wrapper)

    def build(self, slot: LayerSlot, raw: dict) -> SSMCapture:
        if "mix" not in raw:
            raise RuntimeError(f"layer {slot.index}: {type(slot.module).__name__}.mix was not called")
        q, k, v, log_decay, out = (None if x is None else x[0].to(torch.float64) for x in raw["mix"])
        heads, length, dk = q.shape
        gated = log_decay is not None
        decay = torch.exp(log_decay) if gated else torch.ones_like(q)

        def realize(index: torch.Tensor) -> DiagonalSSM:
            return DiagonalSSM(a=decay[index], b=k[index], c=q[index])

        gate = None
        norm = getattr(slot.module, "out_norm", None)
        if norm is not None and hasattr(norm, "eps"):  # RMSNorm over dv: x * rsqrt(mean(x^2) + eps) * weight
            gate = torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + float(norm.eps)).expand_as(out)
            out = out * gate

        return SSMCapture(
            layer=slot.index,
            family="gated_linear_attention" if gated else "linear_attention",
            inputs=v,  # (H, L, dv)
            outputs=out,
            out_gate=gate,
            state_size=dk,
            multiplicity=int(v.shape[-1]),  # dv value channels share T_h
            info={"num_heads": heads, "head_dim": dk, "value_dim": int(v.shape[-1])},
            realize=realize,
        )
