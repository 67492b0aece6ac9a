"""RG-LRU (RecurrentGemma / Griffin "recurrent" layers): a diagonal recurrence per channel.

Math. ``RecurrentGemmaRglru`` on its input x (the conv branch, (L, D) with D = lru_width),
per channel c, with block-diagonal gate projections per head:

    i_t = sigmoid(W_i x_t + b_i)[c],  r_t = sigmoid(W_r x_t + b_r)[c]
    a_t = exp(-8 r_t softplus(lambda_c))                        in (0, 1)
    h_t = a_t h_{t-1} + sqrt(1 - a_t^2) i_t x_t[c]              (sqrt(...) = 1 at t = 0: reset)
    y_t = h_t
    T_c[i, j] = prod_{t=j+1..i} a_t * sqrt(1 - a_j^2) i_j       (j <= i)

As a DiagonalSSM per channel with one mode: a = a_t, b = sqrt(1 - a_t^2) i_t, c = 1, d = 0.
Unit = channel, U = lru_width. TSS per channel: 1 (one scalar state). The gates depend on
x (input-varying), so T is the operator of this prompt. The block then multiplies channel c
of token t by its y-branch g[t, c] = gelu(W_y h_t)[c] (h the block's input), an
input-dependent output gate kept as ``out_gate`` (folded into T with gates="inside",
core/gates.py); the conv and the projections are token-wise or come before x: outside T.

Capture: forward pre-hook on the ``rg_lru`` module (x and position ids); a forward hook on
``linear_y`` (the gate before its activation) and a forward pre-hook on ``linear_out`` (what
the block projects, y * g: the outputs that T with its gate must reproduce); a, i are
recomputed in float64 from the module's parameters, and the reconstruction test checks them
against the model's own scan.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.operators import DiagonalSSM
from ..core.units import SSMCapture
from .base import CaptureSession, LayerSlot

__all__ = ["RGLRUAdapter"]


class RGLRUAdapter:
    family = "rg_lru"

    def install(self, session: CaptureSession, slot: LayerSlot) -> None:
        raw = session.store(slot.index)
        lru = slot.module.rg_lru

        def before(_module, args, kwargs):
            raw["x"] = (args[0] if args else kwargs["activations"]).detach()
            raw["position_ids"] = (args[1] if len(args) > 1 else kwargs["position_ids"]).detach()

        session.hook(lru.register_forward_pre_hook(before, with_kwargs=True))
        session.keep_output(slot.module.linear_y, raw, "y_branch")
        session.keep_input(slot.module.linear_out, raw, "gated")

    def build(self, slot: LayerSlot, raw: dict) -> SSMCapture:
        if not {"x", "y_branch", "gated"} <= raw.keys():
            raise RuntimeError(f"layer {slot.index}: the recurrent block's RG-LRU, linear_y or linear_out did not run")
        lru = slot.module.rg_lru
        x = raw["x"][0].to(torch.float64)  # (L, D)
        length, width = x.shape
        heads, block = lru.num_attention_heads, lru.block_width
        xh = x.reshape(length, heads, block)

        def gate(weight, bias):
            pre = torch.einsum("lhi,hij->lhj", xh, weight.detach().to(torch.float64)) + bias.detach().to(torch.float64)
            return torch.sigmoid(pre.reshape(length, width))

        input_gate = gate(lru.input_gate_weight, lru.input_gate_bias)
        recurrent_gate = gate(lru.recurrent_gate_weight, lru.recurrent_gate_bias)
        log_a = -8.0 * recurrent_gate * F.softplus(lru.recurrent_param.detach().to(torch.float64))
        a = torch.exp(log_a)  # (L, D)
        reset = (raw["position_ids"][0] == 0).to(torch.float64)[:, None]  # (L, 1)
        multiplier = reset + (1 - reset) * torch.sqrt(1 - torch.exp(2 * log_a))
        b = (multiplier * input_gate).T  # (D, L)
        a = (a * (1 - reset)).T  # the model zeroes a at a reset (the state restarts)

        def realize(index: torch.Tensor) -> DiagonalSSM:
            return DiagonalSSM(
                a=a[index][..., None], b=b[index][..., None], c=torch.ones(len(index), length, 1, dtype=torch.float64)
            )

        return SSMCapture(
            layer=slot.index,
            family=self.family,
            inputs=x.T[..., None],  # (D, L, 1)
            outputs=raw["gated"][0].to(torch.float64).T[..., None],  # y * g, as the model computed it
            out_gate=slot.module.act_fn(raw["y_branch"][0].to(torch.float64)).T[..., None],  # (D, L, 1)
            state_size=1,
            info={"lru_width": width, "num_heads": heads},
            realize=realize,
        )
