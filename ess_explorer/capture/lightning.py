"""Lightning attention (MiniMax "linear_attention" layers): linear attention with a fixed
per-head decay.

Math. ``MiniMaxLightningAttention``: q, k, v = split(silu(qkv_proj(x))) per head h (head
size d), slope s_h > 0 fixed per head and layer (ALiBi-like), lambda_h = exp(-s_h):

    o_i = sum_{j <= i} lambda_h^(i - j) (q_i . k_j) v_j
    T_h[i, j] = lambda_h^(i - j) q_i . k_j                      (j <= i)

computed by the model block-wise (intra-block decay matrix plus an inter-block state);
the result is the same operator. All d value channels of a head share T_h.
As a DiagonalSSM per head: a = lambda_h (expanded over the d key modes), b = k, c = q, d = 0.
Unit = head; TSS per head: d (the key size). The layer then multiplies channel c of head h
at token t by g[t, h, c] = sigmoid(output_gate(x_t))[h, c] / rms_t, rms_t that of the
RMSNorm over all heads' outputs: an input-dependent gate kept as ``out_gate`` (folded into T
with gates="inside", core/gates.py: a gate per channel splits each head into its d channels,
as Mamba2's). The norm's constant weight and out_proj stay outside T.

Capture: forward hook on ``qkv_proj`` (q, k, v after the model's activation), a forward
pre-hook on ``norm`` (the attention output o before the norm) and a forward hook on
``output_gate``; the slopes are the module's ``slope_rate`` buffer. The outputs are o * g,
which times the norm's weight is what the model projects.
"""

from __future__ import annotations

import torch

from ..core.operators import DiagonalSSM
from ..core.units import SSMCapture
from .base import CaptureSession, LayerSlot

__all__ = ["LightningAttentionAdapter"]


class LightningAttentionAdapter:
    family = "lightning_attention"

    def install(self, session: CaptureSession, slot: LayerSlot) -> None:
        module = slot.module
        raw = session.store(slot.index)
        session.keep_output(module.qkv_proj, raw, "qkv")
        session.keep_input(module.norm, raw, "o")
        session.keep_output(module.output_gate, raw, "gate")

    def build(self, slot: LayerSlot, raw: dict) -> SSMCapture:
        if not {"qkv", "o", "gate"} <= raw.keys():
            raise RuntimeError(
                f"layer {slot.index}: the lightning attention's qkv_proj, norm or output_gate did not run"
            )
        module = slot.module
        heads, d = module.num_attention_heads, module.head_dim
        qkv = module.act_fn(raw["qkv"][0]).to(torch.float64)  # (L, 3 H d), activation as the model applies it
        length = qkv.shape[0]
        q, k, v = qkv.reshape(length, heads, 3 * d).split(d, dim=-1)  # each (L, H, d)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # (H, L, d)
        decay = torch.exp(-module.slope_rate.detach().to(torch.float64).reshape(heads))  # (H,)

        def realize(index: torch.Tensor) -> DiagonalSSM:
            return DiagonalSSM(a=decay[index][:, None, None].expand(len(index), length, d), b=k[index], c=q[index])

        o = raw["o"][0].to(torch.float64)  # (L, H d)
        rms = o.pow(2).mean(-1, keepdim=True).add(module.norm.variance_epsilon).sqrt()  # (L, 1), as the norm's
        gate = (torch.sigmoid(raw["gate"][0].to(torch.float64)) / rms).reshape(length, heads, d).transpose(0, 1)
        return SSMCapture(
            layer=slot.index,
            family=self.family,
            inputs=v,
            outputs=o.reshape(length, heads, d).transpose(0, 1) * gate,  # (H, L, d)
            out_gate=gate,
            state_size=d,
            info={"num_heads": heads, "head_dim": d, "decay": decay.tolist()},
            realize=realize,
        )
