"""mLSTM (xLSTM): matrix memory with scalar gates per head, normaliser included.

Math. Per head h (key size d_k, value size d_v), with input / forget gate pre-activations
i_t, f_t (scalars, after the model's soft cap), q~ = q / sqrt(d_k), and the model's
stabiliser m_t = max(log sigmoid(f_t) + m_{t-1}, i_t) (m_{-1} = 0):

    C_t = F_t C_{t-1} + I_t k_t v_t^T,   n_t = F_t n_{t-1} + I_t k_t
    F_t = exp(log sigmoid(f_t) + m_{t-1} - m_t),  I_t = exp(i_t - m_t)
    h_t = C_t^T q~_t / den_t,            den_t = max(|q~_t . n_t|, exp(-m_t)) + eps

The numerator is a gated linear attention with a scalar decay F_t and key scale I_t;
den_t is a per-token, per-head scale of the output. So, exactly for one prompt,

    T_h = diag(1 / den) N_h,   T_h[i, j] = (q~_i . k_j / den_i) I_j prod_{t=j+1..i} F_t

As a DiagonalSSM per head: a = F_t (expanded over d_k), b = I_t k_t, c = q~_t / den_t, d = 0.
All d_v value channels of a head share T_h. Unit = head; TSS per head: d_k.

After the cell, the layer computes sigmoid(o_t) * LayerNorm_head(h_t) (the norm over the head's
d_v channels: centre, divide by the standard deviation sigma_t, times a weight). The centring
is a token-wise mix of the head's channels, and it commutes with T_h, which all of them share:
h_t - mean(h_t) = (T_h (v - mean_c v))_t. So the capture takes the centred values as T's input
and keeps g_t = sigmoid(o_t) / sigma_t (per token and channel) as ``out_gate``, with
outputs = g * (h - mean h), the norm's output before its weight: gates="inside" (core/gates.py)
makes each value channel a unit, diag(g_c) T_h, as Mamba2's gated norm does. The norm's
weight (and bias) and the projections are token-wise: outside T.

T follows the recurrent form above (the model's sequence kernel, used for prompts
shorter than config.chunk_size and for the remainder after whole chunks). For whole chunks
the model's chunkwise kernel computes the same numerator with a chunk-level stabiliser,
whose floor exp(-m) in den can differ where |q~ . n| is below it; the reconstruction test
runs the sequence kernel. sLSTM blocks (scalar memory with a nonlinear recurrence
through tanh / exponential gating of h_{t-1}) are not input-varying linear operators; the
installed transformers' xLSTM holds mLSTM blocks only.

Capture: forward hook (with kwargs) on the layer's ``mlstm_backend`` module: q, k, v,
igate, fgate in, h out; and on its ``ogate_act_fn`` (sigmoid(o) out).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.operators import DiagonalSSM
from ..core.units import SSMCapture
from .base import CaptureSession, LayerSlot

__all__ = ["MLSTMAdapter"]


class MLSTMAdapter:
    family = "mlstm"

    def install(self, session: CaptureSession, slot: LayerSlot) -> None:
        raw = session.store(slot.index)

        def after(_module, _args, kwargs, output):
            raw["call"] = {name: kwargs.get(name) for name in ("query", "key", "value", "igate", "fgate", "c_initial")}
            raw["h"] = (output[0] if isinstance(output, tuple) else output).detach()

        session.hook(slot.module.mlstm_backend.register_forward_hook(after, with_kwargs=True))
        if _has_gated_norm(slot.module):
            session.keep_output(slot.module.ogate_act_fn, raw, "ogate")

    def build(self, slot: LayerSlot, raw: dict) -> SSMCapture:
        if "call" not in raw:
            raise RuntimeError(f"layer {slot.index}: the mLSTM backend did not run")
        call = raw["call"]
        if call["c_initial"] is not None:
            raise RuntimeError(f"layer {slot.index}: the mLSTM started from a cached state; run without a cache")
        q, k, v = (call[name][0].to(torch.float64) for name in ("query", "key", "value"))  # (H, L, d)
        igate = call["igate"][0].to(torch.float64)  # (H, L)
        fgate = call["fgate"][0].to(torch.float64)
        heads, length, dk = q.shape
        eps = float(getattr(slot.module.mlstm_backend.config, "eps", 1e-6))
        q = q * dk**-0.5
        log_f = F.logsigmoid(fgate)
        forget = torch.empty_like(igate)
        scale = torch.empty_like(igate)
        den = torch.empty_like(igate)
        m = torch.zeros(heads, dtype=torch.float64)
        n = torch.zeros(heads, dk, dtype=torch.float64)
        for t in range(length):
            m_new = torch.maximum(log_f[:, t] + m, igate[:, t])
            forget[:, t] = torch.exp(log_f[:, t] + m - m_new)
            scale[:, t] = torch.exp(igate[:, t] - m_new)
            n = forget[:, t, None] * n + scale[:, t, None] * k[:, t]
            den[:, t] = torch.maximum((q[:, t] * n).sum(-1).abs(), torch.exp(-m_new)) + eps
            m = m_new

        def realize(index: torch.Tensor) -> DiagonalSSM:
            return DiagonalSSM(
                a=forget[index][..., None].expand(len(index), length, dk),
                b=scale[index][..., None] * k[index],
                c=q[index] / den[index][..., None],
            )

        h = raw["h"][0].to(torch.float64)  # (H, L, d_v)
        gate = None
        if "ogate" in raw:  # g = sigmoid(o) / sigma_t over the head's channels (module docstring)
            h = h - h.mean(-1, keepdim=True)
            v = v - v.mean(-1, keepdim=True)
            sigma = h.pow(2).mean(-1, keepdim=True).add(float(slot.module.multihead_norm.eps)).sqrt()
            ogate = raw["ogate"][0].to(torch.float64).reshape(length, heads, -1).transpose(0, 1)  # (H, L, d_v)
            gate = ogate / sigma
            h = h * gate
        return SSMCapture(
            layer=slot.index,
            family=self.family,
            inputs=v,
            outputs=h,
            out_gate=gate,
            state_size=dk,
            info={"num_heads": heads, "head_dim": dk, "value_dim": int(v.shape[-1])},
            realize=realize,
        )


def _has_gated_norm(layer: torch.nn.Module) -> bool:
    """The layer multiplies its head-normed output by sigmoid(o) (transformers' xLSTM layer)."""
    return hasattr(layer, "ogate_act_fn") and hasattr(getattr(layer, "multihead_norm", None), "eps")
