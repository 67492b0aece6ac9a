"""RWKV-4 time mixing (``rwkv``): the WKV operator per channel, normaliser included.

Math. Per channel c (attention_hidden_size of them), with decay w_c = exp(time_decay_c) > 0,
bonus u_c = time_first_c and the token-shifted key k_t, value v_t:

    num_i = sum_{j < i} e^{-(i-1-j) w} e^{k_j} v_j + e^{u + k_i} v_i
    den_i = sum_{j < i} e^{-(i-1-j) w} e^{k_j}     + e^{u + k_i}
    wkv_i = num_i / den_i

The numerator is a linear operator N on v (weights depend on the prompt's keys); the
normaliser den_i is the same N applied to ones: a per-token, per-channel scale of the
output. So, exactly for one prompt,

    T_c = diag(1 / den) N_c,     T_c[i, j] = e^{-(i-1-j) w} e^{k_j} / den_i (j < i),
                                 T_c[i, i] = e^{u + k_i} / den_i

(each row sums to 1: a causal weighted average). As a DiagonalSSM per channel with one
mode: a = e^{-w}, b_j = e^{k_j + w}, c_i = 1 / den_i, d_i = (e^{u + k_i} - e^{k_i + w}) / den_i
(the diagonal of the recurrence corrected to the bonus term). Keys are shifted by their
per-channel maximum first (N and den scale alike: T does not change).
Unit = channel; TSS per channel: 1 (the numerator state; the denominator is in T's row
scale). The mixer then multiplies channel c of token t by its receptance gate
g[t, c] = sigmoid(r_t)[c], an input-dependent output gate kept as ``out_gate`` (folded into T
with gates="inside", core/gates.py); the output projection is token-wise: outside T.

Capture: the mixer calls its modeling module's ``rwkv_linear_attention(time_decay,
time_first, key, value, ...)`` (the CPU path on CPU); it is wrapped for the one forward
pass as the Mamba scan is (capture/mamba.py). A forward hook on ``receptance`` keeps r, and a
forward pre-hook on ``output`` keeps what the model projects, g * wkv: the outputs that T with
its gate must reproduce.
"""

from __future__ import annotations

import torch

from ..core.operators import DiagonalSSM
from ..core.units import SSMCapture
from .base import CaptureSession, LayerSlot
from .mamba import ScanAdapter

__all__ = ["RWKVAdapter", "wkv_denominator"]


def wkv_denominator(decay: torch.Tensor, bonus: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """den (D, L) of the WKV average: decay (D,) = e^{-w}, bonus (D,) = u, key (D, L)."""
    channels, length = key.shape
    den = torch.empty_like(key)
    state = torch.zeros(channels, dtype=key.dtype)
    for i in range(length):  # state_i = sum_{j < i} e^{-(i-1-j) w} e^{k_j}
        den[:, i] = state + torch.exp(bonus + key[:, i])
        state = decay * state + torch.exp(key[:, i])
    return den


class RWKVAdapter(ScanAdapter):
    family = "rwkv"
    function = "rwkv_linear_attention"

    def install(self, session: CaptureSession, slot: LayerSlot) -> None:
        super().install(session, slot)
        raw = session.store(slot.index)
        session.keep_output(slot.module.receptance, raw, "receptance")
        session.keep_input(slot.module.output, raw, "gated")

    def build(self, slot: LayerSlot, raw: dict) -> SSMCapture:
        args, _wkv = self.scan_call(slot, raw)
        if "receptance" not in raw or "gated" not in raw:
            raise RuntimeError(f"layer {slot.index}: the time mixing's receptance / output projection did not run")
        if args.get("state") is not None:
            raise RuntimeError(f"layer {slot.index}: the WKV started from a cached state; run without a cache")
        key = args["key"][0].to(torch.float64).T  # (D, L)
        value = args["value"][0].to(torch.float64).T  # (D, L)
        key = key - key.max(dim=1, keepdim=True).values  # N and den scale alike
        w = torch.exp(args["time_decay"].to(torch.float64))  # (D,) > 0
        bonus = args["time_first"].to(torch.float64)  # (D,)
        decay = torch.exp(-w)
        den = wkv_denominator(decay, bonus, key)
        channels, length = key.shape
        b = torch.exp(key + w[:, None])
        d = (torch.exp(bonus[:, None] + key) - b) / den

        def realize(index: torch.Tensor) -> DiagonalSSM:
            return DiagonalSSM(
                a=decay[index][:, None, None].expand(len(index), length, 1),
                b=b[index][..., None],
                c=(1.0 / den[index])[..., None],
                d=d[index],
            )

        return SSMCapture(
            layer=slot.index,
            family=self.family,
            inputs=value[..., None],  # (D, L, 1)
            outputs=raw["gated"][0].to(torch.float64).T[..., None],  # g * wkv, as the model computed it
            out_gate=torch.sigmoid(raw["receptance"][0].to(torch.float64)).T[..., None],  # (D, L, 1)
            state_size=1,
            info={"channels": channels},
            realize=realize,
        )
