"""The delta rule: Gated DeltaNet (Qwen3-Next, Qwen3.5, OLMo hybrid) and KDA (Kimi Linear, and
GLM-5.3-Flash and Ling 3, whose linear layers are Kimi's KDA with a forget gate of their own).

Math. Per head, key size K (= N), value size V; after the model's projections, short
causal conv, activation, and the L2 normalisation of q and k done inside the kernel
(``use_qk_l2norm_in_kernel``), with q additionally scaled by K^-1/2, the head's state
S (K x V) follows, per token t,

    Gated DeltaNet   S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    KDA              S_t = (I - beta_t k_t k_t^T) diag(alpha_t) S_{t-1} + beta_t k_t v_t^T
    output           o_t = S_t^T q_t                                   (V,)

with alpha_t = exp(g_t) (a scalar per head for Gated DeltaNet, one value per key dimension
for KDA) and beta_t = sigmoid(b_t) (times 2 with OLMo hybrid's ``allow_neg_eigval``, so
that I - beta k k^T has an eigenvalue in [-1, 1]). Each value channel v of the head is one
column h = S[:, v] of the state, a recurrence in R^K with a diagonal-plus-rank-one
transition, i.e. a `DPLRSSM` (core/operators.py) with r = 1:

    Gated DeltaNet   a = alpha_t 1,  p = -alpha_t beta_t k_t,  q = k_t
    KDA              a = alpha_t,    p = -beta_t k_t,          q = alpha_t * k_t
    both             b = beta_t k_t, c = q_t (normalised and scaled), d = 0

    T_h[i, j] = c_i . A_i A_{i-1} ... A_{j+1} b_j,   A_t = diag(a_t) + p_t q_t^T

and o_t[v] = sum_j T_h[t, j] v_j[v]. Unit = head (the value head, H_v of them; with
grouped heads, H_v / H_k value heads read one query/key head); its V value channels share
T_h: ``info["multiplicity"] = V``. Inside T: alpha, beta, the normalised keys and the
scaled normalised queries. The gated RMSNorm after the kernel, weight * o_t / rms_t *
act(z_t) (RMS over the head's V channels; act = silu, or sigmoid for KDA's gate), is a
per-token, per-channel scale g_t = act(z_t) / rms_t of the kind Mamba2's gated norm is: the
capture keeps it as ``out_gate`` and o * g as ``outputs`` (the weight stays outside), so
gates="inside" (core/gates.py) makes each value channel a unit, diag(g_c) T_h, with spectra
of its own, and gates="outside" keeps the value head. Outside T: the input projections; the
short causal conv and its activation, which make q, k and v (a separate k-token mixer in
front: T's input is v after the conv, and T's coefficients are built from q and k after
it); the norm's weight; the output projection.
TSS per head: K (the key size: the state size per value channel).

Cost: factored core path, the square-root sweeps with the factor multiplied by A_t
(O(K^2) for the rank-one part) before each QR: O(L K^3) per head, never the L x L T. With
gates inside, the V channels of each head are row-scaled copies of the head's T
(core/row_scaled.py), about (4/3) r^3 each per cut, r <= min(t, L - t, K): a
Qwen3-Next-shaped layer of 4 value heads, 1.0 s outside -> 5.4 s inside at L = 256, 2.9 s ->
36 s at L = 512 (benchmarks/bench_delta.py, docs/families.md).

Capture: the mixer calls its modeling module's ``torch_chunk_gated_delta_rule(query, key,
value, g, beta, ..., use_qk_l2norm_in_kernel)`` (KDA: ``chunk_kimi_delta_attention``) with
q, k (1, L, H_k, K), v (1, L, H_v, V), g (1, L, H_v) (KDA: (1, L, H, K)), beta (1, L, H_v);
the function is wrapped for the one forward pass (restored in a ``finally``), as for
Mamba's scan (capture/mamba.py). Runs without a cache (``use_cache=False``).
"""

from __future__ import annotations

import torch
from transformers.activations import ACT2FN

from ..core.operators import DPLRSSM
from ..core.units import SSMCapture
from .base import CaptureSession, LayerSlot
from .mamba import ScanAdapter

__all__ = ["GatedDeltaNetAdapter", "KimiDeltaAdapter"]

L2NORM_EPS = 1e-6  # the eps of the l2norm inside the transformers (and FLA) kernels


def _l2normalise(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last dimension, as the kernels normalise q and k."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


class GatedDeltaNetAdapter(ScanAdapter):
    """Gated DeltaNet (scalar decay per head and token)."""

    family = "gated_deltanet"
    function = "torch_chunk_gated_delta_rule"
    per_key_decay = False

    def install(self, session: CaptureSession, slot: LayerSlot) -> None:
        super().install(session, slot)
        norm = gated_norm(slot.module)
        if norm is not None:
            raw = session.store(slot.index)

            def on_norm(_module, args, kwargs, _output):
                gate = args[1] if len(args) > 1 else kwargs.get("gate")
                if gate is not None:
                    raw["norm"] = (args[0].detach(), gate.detach())

            session.hook(norm.register_forward_hook(on_norm, with_kwargs=True))

    def build(self, slot: LayerSlot, raw: dict) -> SSMCapture:
        args, result = self.scan_call(slot, raw)
        if args.get("initial_state") is not None:
            raise RuntimeError(f"layer {slot.index}: the delta rule started from a cached state; run without a cache")
        value = args["value"][0].to(torch.float64)  # (L, H_v, V)
        length, heads, value_dim = value.shape
        query, key = (args[name][0].to(torch.float64) for name in ("query", "key"))  # (L, H_k, K)
        group = heads // key.shape[1]
        query, key = (x.repeat_interleave(group, dim=1) for x in (query, key))  # value head h reads h // group
        if args.get("use_qk_l2norm_in_kernel"):
            query, key = _l2normalise(query), _l2normalise(key)
        key_dim = key.shape[-1]
        query = query * key_dim**-0.5
        query, key = (x.transpose(0, 1) for x in (query, key))  # (H, L, K)
        decay = torch.exp(args["g"][0].to(torch.float64)).transpose(0, 1)  # (H, L) or (H, L, K)
        beta = args["beta"][0].to(torch.float64).T  # (H, L)

        def realize(index: torch.Tensor) -> DPLRSSM:
            k, alpha, step = key[index], decay[index], beta[index][..., None]  # step: (u, L, 1)
            if self.per_key_decay:  # A_t = (I - beta k k^T) diag(alpha)
                a, p, q = alpha, -step * k, alpha * k
            else:  # A_t = alpha (I - beta k k^T)
                alpha = alpha[..., None]
                a, p, q = alpha.expand_as(k), -alpha * step * k, k
            return DPLRSSM(a=a, p=p[..., None], q=q[..., None], b=step * k, c=query[index])

        outputs = result[0].to(torch.float64).transpose(0, 1)  # (H, L, V)
        gate = None
        if "norm" in raw:  # g = act(z) / rms_t over the norm's last dimension, as the norm computes it
            norm = gated_norm(slot.module)
            y, z = (x.to(torch.float64) for x in raw["norm"])  # (..., the head's V channels)
            rms = y.pow(2).mean(-1, keepdim=True).add(float(norm.variance_epsilon)).sqrt()
            gate = ACT2FN[norm.activation](z) / rms
            gate = gate.reshape(length, heads, value_dim).transpose(0, 1)  # (H, L, V)
            outputs = outputs * gate
        return SSMCapture(
            layer=slot.index,
            family=self.family,
            inputs=value.transpose(0, 1),  # (H, L, V)
            outputs=outputs,
            out_gate=gate,
            state_size=key_dim,
            info={
                "num_heads": heads,
                "num_key_heads": heads // group,
                "key_dim": key_dim,
                "head_dim": value_dim,
                "multiplicity": value_dim,
            },
            realize=realize,
        )


def gated_norm(mixer: torch.nn.Module) -> torch.nn.Module | None:
    """The mixer's gated RMSNorm after the kernel (``norm`` or ``o_norm``: weight * y / rms_t *
    act(gate), rms over the head's V channels), or None."""
    for name in ("norm", "o_norm"):
        norm = getattr(mixer, name, None)
        if norm is not None and hasattr(norm, "variance_epsilon") and hasattr(norm, "activation"):
            return norm
    return None


class KimiDeltaAdapter(GatedDeltaNetAdapter):
    """KDA: the delta rule with one decay per key dimension (Kimi Linear, GLM-5.3-Flash, Ling 3)."""

    family = "kda"
    function = "chunk_kimi_delta_attention"
    per_key_decay = True
