"""Gated short convolution (LFM2 ``conv`` layers; Hyena of order 2 has the same form).

Math. LFM2's ``Lfm2ShortConv``: ``B, C, x = in_proj(h)`` (three chunks of the hidden
size), ``y = C * causal_depthwise_conv(B * x)`` with a kernel of length k
(``config.conv_L_cache``), then ``out_proj``. Per channel c, in torch's Conv1d layout
(w[k-1] multiplies the current token),

    T_c[i, j] = C_i w_c[k-1-(i-j)] B_j      for 0 <= i - j < k, 0 otherwise

acting on u = x[:, c]. A conv bias b adds C_i b (token-wise, outside T; kept as the
capture's ``out_offset``). Unit = channel, U = hidden_size. TSS per channel: k - 1.

Spectra: exact, from the (k-1) x (k-1) non-zero block of each cut (core/short_conv.py).

Capture (hooks on public modules): forward hook on ``in_proj`` (B, C, x) and a pre-hook
on ``out_proj`` (y, the mixer output before the projection); the kernel is
``conv.weight``.
"""

from __future__ import annotations

import torch

from ..core.units import ShortConvCapture
from .base import CaptureSession, LayerSlot

__all__ = ["ShortConvAdapter"]


class ShortConvAdapter:
    family = "short_conv"

    def install(self, session: CaptureSession, slot: LayerSlot) -> None:
        module = slot.module
        raw = session.store(slot.index)
        session.keep_output(module.in_proj, raw, "bcx")
        session.keep_input(module.out_proj, raw, "y")

    def build(self, slot: LayerSlot, raw: dict) -> ShortConvCapture:
        if "bcx" not in raw or "y" not in raw:
            raise RuntimeError(f"layer {slot.index}: the short conv's in_proj / out_proj did not run")
        gate_in, gate_out, x = raw["bcx"][0].to(torch.float64).chunk(3, dim=-1)  # each (L, D)
        conv = slot.module.conv
        weight = conv.weight.detach()[:, 0, :].to(torch.float64)  # (D, k)
        offset = None
        if conv.bias is not None:
            offset = (gate_out * conv.bias.detach().to(torch.float64)).T[..., None]
        return ShortConvCapture(
            layer=slot.index,
            family=self.family,
            inputs=x.T[..., None],  # (D, L, 1)
            outputs=raw["y"][0].to(torch.float64).T[..., None],
            out_offset=offset,
            kernel_size=int(weight.shape[-1]),
            multiplicity=1,  # one channel per unit
            info={"hidden_size": int(weight.shape[0]), "kernel_size": int(weight.shape[-1])},
            gate_in=gate_in.T.contiguous(),
            gate_out=gate_out.T.contiguous(),
            weight=weight,
        )
