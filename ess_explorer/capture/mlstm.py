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
All d_v value channels of a head share T_h. Unit = head; TSS per head: d_k. The output gate,
the per-head norm and the projections are token-wise: outside T.

T follows the recurrent form above (the model's sequence kernel, used for prompts
shorter than config.chunk_size and for the remainder after whole chunks). For whole chunks
the model's chunkwise kernel computes the same numerator with a chunk-level stabiliser,
whose floor exp(-m) in den can differ where |q~ . n| is below it; the reconstruction test
runs the sequence kernel. sLSTM blocks (scalar memory with a nonlinear recurrence
through tanh / exponential gating of h_{t-1}) are not input-varying linear operators; the
installed transformers' xLSTM holds mLSTM blocks only.

Capture: forward hook (with kwargs) on the layer's ``mlstm_backend`` module: q, k, v,
igate, fgate in, h out.
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

        return SSMCapture(
            layer=slot.index,
            family=self.family,
            inputs=v,
            outputs=raw["h"][0].to(torch.float64),
            state_size=dk,
            info={"num_heads": heads, "head_dim": dk, "value_dim": int(v.shape[-1])},
            realize=realize,
        )
