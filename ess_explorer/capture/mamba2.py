"""Mamba2 / SSD (Mamba2, Bamba's and Zamba2's mamba layers).

Math. Per head h (num_heads of them, head_dim P value channels each, N state modes,
G groups of B and C; head h reads group g(h) = h // (H / G)):

    dt_t   = clamp(softplus(dt_raw[t, h] + dt_bias[h]), dt_limit)  (scalar per head, time)
    h_t    = exp(dt_t A[h]) h_{t-1} + dt_t B_t[g(h)] x_t            A[h] < 0 a scalar
    y_t    = C_t[g(h)] . h_t + D[h] x_t
    T_h[i, j] = C_i . B_j dt_j prod_{t=j+1..i} exp(dt_t A[h])     (+ D[h] on the diagonal)

All P channels of a head share T_h (o = T_h x per channel). The gated RMSNorm that
follows multiplies channel c of token t by g[t, c] = silu(z[t, c]) / rms_t (rms over the
norm's group of y * silu(z)), then by its constant weight; the capture keeps g as
``out_gate`` and y * g as ``outputs`` (core/gates.py folds g into T with gates="inside";
the weight and the output projection stay outside). Falcon-H1's norm groups its channels
by ``n_groups`` and may normalise before the gate (``norm_before_gate``: rms over the
group of y); without its norm (``mamba_rms_norm`` False, the default) the gate is silu(z)
alone, z the first d_ssm columns of in_proj(x) * mup_vector.

As a DiagonalSSM per head: a = exp(dt A[h]) expanded over the N modes (L, N), b = dt B
(L, N), c = C (L, N), d = D[h]. Unit = head, U = num_heads; factored core path, one
batched call per layer, O(L N^3) per head; only kept heads are materialised.
TSS per head: N (d_state).

Capture: the mixer calls its modeling module's ``mamba2_chunk_scan(x, dt, A, B, C,
chunk_size, D, dt_bias, initial_states, dt_softplus, dt_limit, ...)``; it is wrapped for
the one forward pass exactly as in capture/mamba.py (restored in a ``finally``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.operators import DiagonalSSM
from ..core.units import SSMCapture
from .base import CaptureSession, LayerSlot
from .mamba import ScanAdapter

__all__ = ["Mamba2Adapter"]


class Mamba2Adapter(ScanAdapter):
    family = "mamba2"
    function = "mamba2_chunk_scan"

    def install(self, session: CaptureSession, slot: LayerSlot) -> None:
        super().install(session, slot)
        raw = session.store(slot.index)
        norm = getattr(slot.module, "norm", None)
        if hasattr(norm, "group_size") or hasattr(norm, "n_groups"):  # the gated RMSNorm after the scan

            def on_norm(_module, args, kwargs, _output):
                gate = args[1] if len(args) > 1 else kwargs.get("gate")
                if gate is not None:
                    y = args[0].detach()
                    group = int(norm.group_size) if hasattr(norm, "group_size") else y.shape[-1] // int(norm.n_groups)
                    before = bool(getattr(norm, "norm_before_gate", False))
                    raw["norm"] = (y, gate.detach(), group, float(norm.variance_epsilon), before)

            session.hook(norm.register_forward_hook(on_norm, with_kwargs=True))
        elif hasattr(slot.module, "mup_vector") and getattr(slot.module, "mamba_rms_norm", True) is False:
            session.keep_output(slot.module.in_proj, raw, "projected")  # Falcon-H1's gate without its norm

    def build(self, slot: LayerSlot, raw: dict) -> SSMCapture:
        args, result = self.scan_call(slot, raw)
        if args.get("initial_states") is not None:
            raise RuntimeError(f"layer {slot.index}: the scan started from a cached state; run without a cache")
        x = args["hidden_states"][0].to(torch.float64)  # (L, H, P)
        length, heads, head_dim = x.shape
        dt = args["dt"][0].to(torch.float64)  # (L, H)
        if args.get("dt_bias") is not None:
            dt = dt + args["dt_bias"].to(torch.float64)
        if args.get("dt_softplus"):
            dt = F.softplus(dt)
        low, high = args.get("dt_limit", (0.0, float("inf")))
        dt = torch.clamp(dt, min=low, max=high).T  # (H, L)
        A = args["A"].to(torch.float64)  # (H,)
        groups = args["B"].shape[2]
        B = args["B"][0].to(torch.float64).repeat_interleave(heads // groups, dim=1).transpose(0, 1)  # (H, L, N)
        C = args["C"][0].to(torch.float64).repeat_interleave(heads // groups, dim=1).transpose(0, 1)  # (H, L, N)
        n = B.shape[-1]
        D = args.get("D")
        D = torch.zeros(heads, dtype=torch.float64) if D is None else D.to(torch.float64)
        if D.ndim == 2:  # D per channel ("D_has_hdim"): not one T per head
            raise RuntimeError(f"layer {slot.index}: D has a value per channel; per-head operators do not apply")

        def realize(index: torch.Tensor) -> DiagonalSSM:
            step = dt[index][..., None]  # (u, L, 1)
            decay = torch.exp(step * A[index][:, None, None])  # (u, L, 1): one scalar per head and step
            return DiagonalSSM(
                a=decay.expand(len(index), length, n),
                b=step * B[index],
                c=C[index],
                d=D[index][:, None].expand(len(index), length),
            )

        outputs = result[0].reshape(length, heads, head_dim).to(torch.float64).transpose(0, 1)  # (H, L, P)
        gate = None
        if "norm" in raw:  # g = silu(z) / rms over the norm's groups, computed as the model does
            y, z, group, eps, before_gate = raw["norm"]
            silu = F.silu(z[0].to(torch.float64))  # (L, H * P)
            normed = y[0].to(torch.float64) * (1.0 if before_gate else silu)
            rms = normed.reshape(length, -1, group).pow(2).mean(-1, keepdim=True).add(eps).sqrt()
            gate = (silu.reshape(length, -1, group) / rms).reshape(length, heads, head_dim).transpose(0, 1)  # (H, L, P)
            outputs = outputs * gate
        elif "projected" in raw:  # Falcon-H1 without its norm: g = silu(z)
            mup = slot.module.mup_vector.detach().to(torch.float64).reshape(-1)
            z = (raw["projected"][0].to(torch.float64) * mup)[:, : heads * head_dim]  # (L, H * P)
            gate = F.silu(z).reshape(length, heads, head_dim).transpose(0, 1)  # (H, L, P)
            outputs = outputs * gate

        return SSMCapture(
            layer=slot.index,
            family=self.family,
            inputs=x.transpose(0, 1),  # (H, L, P)
            outputs=outputs,
            out_gate=gate,
            state_size=n,
            multiplicity=head_dim,  # the head's P value channels share T_h
            info={"num_heads": heads, "head_dim": head_dim, "d_state": n, "n_groups": groups},
            realize=realize,
        )
