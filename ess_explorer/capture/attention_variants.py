"""Softmax attention variants: an output-gated head (Qwen3-Next, Qwen3.5, AFMoE, LFM3, Muse, Laguna,
Beam, Dory), Gemma 4's normalised and shared values, Kolibri 1.1's shared and rounded values,
DiffLlama's differential heads, and multi-head latent attention (Kimi Linear, DeepSeek).

T_h is the attention probability matrix of query head h, as in capture/attention.py.

Gated attention (Qwen3-Next / Qwen3.5 ``full_attention`` layers, MiniCPM5): ``q_proj``
(MiniCPM5's ``q_gate_proj``) makes [query | gate] per head, and the head output is
o_h = sigmoid(gate_h) * (T_h v_h), gate (L, head_dim) token-wise. The gate stays outside T as
``out_gate`` (core/units.py); q_norm / k_norm and RoPE are inside T's entries (they shape the
scores). AFMoE's and LFM3's attention layers make the gate with a projection of their own:
o_h = sigmoid(gate_proj(x)_h) * (T_h v_h) per channel (AFMoE), sigmoid(g_proj(x)_h) one number
per head and token (LFM3); Inkling 2's output projection holds its gate, ``o_proj.gate_proj``,
per channel. Muse Spark divides each head's output by its RMS over the head's
channels (``o_norm``, no weight) before that gate: o_h = sigmoid(gate_proj(x)_h) /
rms_t(T_h v_h) * (T_h v_h), and 1 / rms_t joins the gate, a per-token scale, as a head norm's
does elsewhere (core/gates.py). The AFMoE-like gates differ only in what the activation reads
and which it is (`_head_gate`): Laguna's softplus(g_proj(x)_h), one per head or per channel
(config.gating); Beam's sigmoid(gate_proj(x)_h + gate_bias_h), a bias per head; Dory's
sigmoid(gate_proj(x)_h * s_h^2), s = s_gate * s_gate_scale a learned scale per channel. Dory then
divides the gated outputs of all heads together by their L2 norm (``attn_sub_norm``, no weight)
before o_proj: one more per-token scale, the same for every head, which joins the gate as o_norm's
does. BitNet has that norm over all heads with a weight and no gate: its scale is the out_gate, its
weight, a constant per channel, stays outside T.

Gemma 4 attention (and Gemma 3n's, the same): V passes a per-head norm after ``v_proj`` (after
``k_proj`` on the layers whose keys are their values), so T's input is the output of
``v_norm``. The last layers (config.num_kv_shared_layers) make no K or V of their own: each
reads the cache of the last earlier layer of its layer type, handed to it in
``shared_kv_states``, so their input is that layer's V. Their state is that cache, which the layer reads but does not own; it is counted as
theirs too (``info["kv_shared"]``).

Kolibri 1.1 attention: its "sliding_attention" layers are plain windowed attention; its
"indexed_attention" layers attend to the keys a weightless indexer selects (folded into the mask,
so T holds the selection) and to keys and values rounded to NVFP4, v' = v + (q(v) - v) with the
model's own rounding q (``nvfp4_fake_quantize`` of its modeling module, applied here to the
captured V: T's input is v'). Some of them read the K and V of an earlier layer
(``config.kv_source_layers``, handed over in ``shared_kv_states``), counted as theirs too, as
Gemma 4's.

Differential attention (DiffLlama): query heads p and p + H/2 attend with their own softmaxes
A_p, A_{p+H/2} (one returned probability tensor: the layer's two attention calls differ only in
their values) to the same values, the pair [v_a | v_b] of 2 head_dim channels (KV heads a and
a + H_kv/2, a = p's group), and o_p = (1 - lambda_init) * rmsnorm(A_p V' - lambda A_{p+H/2} V')
with lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init. So the unit
is the head pair, T_p = A_p - lambda A_{p+H/2} (causal, not a probability matrix), its 2 head_dim
value channels share it, and the norm's weightless per-token scale times (1 - lambda_init) is
its out_gate.

Latent attention (Kimi Linear's MLA ``full_attention`` layers): keys and values come from
a compressed latent through ``kv_b_proj``, which yields [k_nope | v] per head; v (L,
v_head_dim) per head is T's input, and o_h = T_h v_h. Unit = query head, multiplicity =
the value head size. Its cache, the layer's state, is the latent and the shared rotary key:
kv_lora_rank + qk_rope_head_dim scalars per token. DeepSeek sparse attention (DeepSeek-V3.2,
GLM-5) adds an indexer that keeps the top-k keys of each query by folding its selection into
the attention mask, so the returned probabilities, T, hold the selection; its cache adds the
indexer's key (index_head_dim scalars per token). GLM-5.3-Flash's indexer selects pools of
index_kpool keys (a pool's key is the mean of its keys weighted by a softmax of per-key logits),
plus the incomplete last pool, and caches each key's logits too (2 index_head_dim scalars per
token). The "shared" layers of GLM-5.3-Flash, HY V4 and Mistral Large 4 (config.indexer_types)
have no indexer: they reuse the selection of an earlier layer that has one, folded into their own
mask, so their T holds it too; the indexer's key is counted once, for that layer. Mistral Large
4's KV-sharing layers read an earlier layer's latent through their own ``kv_b_proj``, so their
values are read there as anywhere; that cache is counted as theirs too (``info["kv_shared"]``),
as Gemma 4's is. A.X K2 adds an output gate: ``q_gate_proj`` makes [query | gate] per head, and
o_h = sigmoid(gate_h) * (T_h v_h), gate (L, v_head_dim), kept outside T as ``out_gate`` like the
other gated heads; HY V4's gate comes from a ``gate_proj`` of its own (per head and channel),
Dots 3 Note's and Ling 3's (``bailing_hybrid``) from ``g_proj`` (one per head and token).
"""

from __future__ import annotations

import sys

import torch

from ..core.units import DenseCapture
from .attention import AttentionAdapter, heads_last
from .base import CaptureSession, LayerSlot

__all__ = [
    "DiffAttentionAdapter",
    "GatedAttentionAdapter",
    "GatedLatentAttentionAdapter",
    "Gemma4AttentionAdapter",
    "Kolibri11AttentionAdapter",
    "LatentAttentionAdapter",
    "Zamba2AttentionAdapter",
]


class GatedAttentionAdapter(AttentionAdapter):
    """Attention whose head outputs are multiplied by a gate: ``activation`` (sigmoid, or Laguna's
    softplus) of a gate from ``q_proj`` ([query | gate] per head; MiniCPM5's ``q_gate_proj``), or,
    given ``gate_projections``, from the first of those projections the layer has (none: plain
    attention), per channel or one gate per head (`_head_gate`)."""

    def __init__(self, gate_projections: tuple[str, ...] = (), activation: str = "sigmoid"):
        self.gate_projections = gate_projections
        self.activation = activation

    def _gate_source(self, module) -> str | None:
        if not self.gate_projections:
            return "q_proj" if hasattr(module, "q_proj") else "q_gate_proj"  # MiniCPM5 names it q_gate_proj
        return next((name for name in self.gate_projections if _submodule(module, name) is not None), None)

    def install(self, session: CaptureSession, slot: LayerSlot) -> None:
        super().install(session, slot)
        store = session.store(slot.index)
        if (source := self._gate_source(slot.module)) is not None:
            session.keep_output(_submodule(slot.module, source), store, "gate")
        if (norm := _output_norm(slot)) is not None:
            session.keep_input(norm, store, "norm_in")
            session.keep_output(norm, store, "norm_out")

    def build(self, slot: LayerSlot, raw: dict) -> DenseCapture:
        layer = super().build(slot, raw)
        source, norm = self._gate_source(slot.module), _output_norm(slot)
        if source is None and norm is None:
            return layer
        head_dim = layer.info["head_dim"]
        gate = torch.ones(layer.length, layer.n_units, head_dim, dtype=torch.float64)
        words = []
        if source is not None:
            gate = _head_gate(slot.module, raw["gate"], layer.n_units, head_dim, self.activation)  # (L, H, head_dim)
            words.append(f"{self.activation}(gate) per head and channel, from {source}")
        if norm is not None:  # one scale per token and row of the norm (each head's, or every head's)
            weight = _norm_weight(norm, head_dim)  # (H or 1, 1, head_dim): outside T
            scale = _norm_scale(raw, (layer.length, -1, head_dim), weight.transpose(0, 1))
            gate = gate * scale.reshape(layer.length, -1, 1)  # (L, H or 1: every head's, 1)
            layer.outputs = layer.outputs / weight.to(layer.outputs.dtype)  # read after the norm's weight
            words.append("the scale its output norm gave each token")
        layer.info["out_gate"] = ", times ".join(words)
        layer.out_gate = gate.transpose(0, 1)  # (H, L, head_dim)
        layer.info["multiplicity"] = head_dim
        return layer


def _submodule(module, name: str):
    """The submodule at the dotted ``name`` (Inkling 2's ``o_proj.gate_proj``), or None."""
    try:
        return module.get_submodule(name)
    except AttributeError:
        return None


_ACTIVATIONS = {"sigmoid": torch.sigmoid, "softplus": torch.nn.functional.softplus}


def _head_gate(module, output: torch.Tensor, heads: int, width: int, activation: str = "sigmoid") -> torch.Tensor:
    """The gate of each head, (L, H, width) float64, from a gate projection's output (1, L, H x per
    head): the last ``width`` columns of each head's part, which is [query | gate] (q_proj,
    q_gate_proj), the gate per channel (gate_proj), or one gate for every channel (g_proj: per
    head). Before ``activation``, the module's own terms of the gate: Dory multiplies it by a
    learned scale per channel, (s_gate * s_gate_scale)^2, and Beam adds a bias per head (gate_bias)."""
    length = output.shape[1]
    gate = output[0].reshape(length, heads, -1)[..., -width:].to(torch.float64)
    if (scale := getattr(module, "s_gate", None)) is not None:
        gate = gate * (scale.detach().to(torch.float64) * module.s_gate_scale).square().reshape(heads, -1)
    if (bias := getattr(module, "gate_bias", None)) is not None:
        gate = gate + bias.detach().to(torch.float64).reshape(heads, -1)
    return _ACTIVATIONS[activation](gate).expand(-1, -1, width)


def _output_norm(slot: LayerSlot):
    """The norm a layer applies to its head outputs, or None: Muse Spark's ``o_norm`` (each
    head's RMS, before the gate), Dory's and BitNet's ``attn_sub_norm`` (over all heads, before
    o_proj). It multiplies each of its rows by a number per token, a gate of the head
    (core/gates.py), which `build` reads from the norm's input and output, whatever the norm
    computes; then by its weight (BitNet's), a constant per channel that stays outside T, as every
    norm's weight does: the head outputs are read before it."""
    return next(
        (getattr(slot.module, name) for name in ("o_norm", "attn_sub_norm") if hasattr(slot.module, name)), None
    )


def _norm_scale(raw: dict, heads=None, weight: torch.Tensor | None = None) -> torch.Tensor:
    """The number a norm multiplied each of its rows by (rows: the last dimension), per token and
    row, float64, read from its input and output (``raw["norm_in"]``, ``raw["norm_out"]``): the
    output, divided by ``weight`` (its channels viewed as ``heads``) where the norm has one, is
    that number times the input."""
    before, after = (raw[key][0].to(torch.float64) for key in ("norm_in", "norm_out"))
    if weight is not None:
        after = (after.reshape(heads) / weight).reshape(after.shape)
    return (after * before).sum(-1) / before.pow(2).sum(-1).clamp_min(torch.finfo(torch.float64).tiny)


def _norm_weight(norm, head_dim: int) -> torch.Tensor:
    """The output norm's weight per head and channel, (H or 1, 1, head_dim) float64 (ones without one)."""
    weight = getattr(norm, "weight", None)
    if weight is None:
        return torch.ones(1, 1, head_dim, dtype=torch.float64)
    weight = weight.detach().to(torch.float64).reshape(-1, 1, head_dim)
    if bool((weight == 0).any()):
        raise NotImplementedError("an output norm with a zero weight: its channel's head output is lost")
    return weight


class Gemma4AttentionAdapter(AttentionAdapter):
    """Attention whose V is normalised per head, or read from an earlier layer's cache."""

    def install(self, session: CaptureSession, slot: LayerSlot) -> None:
        if not slot.module.is_causal:  # refused before the forward pass, not after it
            raise ValueError(
                f"layer {slot.index} attends in both directions (config.use_bidirectional_attention): "
                "its T is not causal, so it has no state to measure"
            )
        super().install(session, slot)

    def install_values(self, session: CaptureSession, module, raw: dict) -> None:
        if not module.is_kv_shared_layer:
            session.keep_output(module.v_norm, raw, "v")  # (B, L, H_kv, hd)
            return
        _keep_shared_values(session, module, raw, module.layer_type)

    def build(self, slot: LayerSlot, raw: dict) -> DenseCapture:
        layer = super().build(slot, raw)
        layer.info["kv_shared"] = bool(slot.module.is_kv_shared_layer)
        return layer


def _keep_shared_values(session: CaptureSession, module, raw: dict, key: str) -> None:
    """Keep, as ``raw["v"]`` (B, L, H_kv hd), the V an earlier layer handed to ``module`` in
    ``shared_kv_states[key]`` ((K, V), each (B, H_kv, L, hd))."""

    def on_call(_module, _args, kwargs):
        values = kwargs["shared_kv_states"][key][1]
        raw["v"] = heads_last(values)

    session.hook(module.register_forward_pre_hook(on_call, with_kwargs=True))


class DiffAttentionAdapter(AttentionAdapter):
    """DiffLlama's differential heads: a unit per head pair, T = A_p - lambda A_{p+H/2} (module
    docstring)."""

    def install(self, session: CaptureSession, slot: LayerSlot) -> None:
        super().install(session, slot)
        store = session.store(slot.index)
        session.keep_input(slot.module.groupnorm, store, "norm_in")
        session.keep_output(slot.module.groupnorm, store, "norm_out")

    def build(self, slot: LayerSlot, raw: dict) -> DenseCapture:
        layer = super().build(slot, raw)  # its checks, and each query head's A and KV head
        module = slot.module
        probs = layer.operator.to(torch.float64)  # (H, L, L)
        pairs, length, head_dim = layer.n_units // 2, layer.length, layer.info["head_dim"]
        lam = float(_lambda_term(module.lambda_q1, module.lambda_k1) - _lambda_term(module.lambda_q2, module.lambda_k2))
        lam += module.lambda_init
        values = raw["v"][0].reshape(length, 2, -1, head_dim)  # (L, 2, H_kv / 2, hd): the two halves
        group = pairs // values.shape[2]  # head p reads pair p // group
        inputs = values.permute(2, 0, 1, 3).reshape(-1, length, 2 * head_dim).repeat_interleave(group, dim=0)
        gate = (1.0 - module.lambda_init) * _norm_scale(raw).transpose(0, 1)[..., None]  # (H/2, L, 1)
        return DenseCapture(
            layer=slot.index,
            family=self.family,
            inputs=inputs,
            outputs=raw["o"][0].reshape(length, pairs, 2 * head_dim).transpose(0, 1),
            window=layer.window,
            multiplicity=2 * head_dim,
            info={
                **layer.info,
                "num_heads": pairs,
                "head_dim": 2 * head_dim,
                "attention": f"differential: A_p - {lam:.4g} A_(p+H/2) per head pair",
                "out_gate": "(1 - lambda_init) / rms_t of the pair's output (its weightless norm)",
            },
            operator=probs[:pairs] - lam * probs[pairs:],
            out_gate=gate.expand(-1, -1, 2 * head_dim),
        )


def _lambda_term(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """exp(query . key), in float32 as DiffLlama's forward computes it."""
    return torch.exp(torch.sum(query.detach() * key.detach(), dim=-1, dtype=torch.float32))


class Zamba2AttentionAdapter(AttentionAdapter):
    """Zamba2's shared attention block: V = v_proj(x) + A_d(x), A_d the low-rank adapter of the
    depth d the block runs at (``linear_v_adapter_list``, where config.use_shared_attention_adapter;
    the keys and queries get adapters of their own, inside T). Only the depth's adapter runs at
    a call, so the one that ran gives its output."""

    def install_values(self, session: CaptureSession, module, raw: dict) -> None:
        super().install_values(session, module, raw)
        for adapter in getattr(module, "linear_v_adapter_list", ()):
            session.keep_output(adapter, raw, "v_adapter")

    def build(self, slot: LayerSlot, raw: dict) -> DenseCapture:
        if "v_adapter" in raw:
            raw = {**raw, "v": raw["v"] + raw["v_adapter"]}
        return super().build(slot, raw)


class Kolibri11AttentionAdapter(AttentionAdapter):
    """Kolibri 1.1's attention: V from ``v_proj`` or an earlier layer's, rounded to NVFP4 on the
    indexed layers (module docstring)."""

    def install_values(self, session: CaptureSession, module, raw: dict) -> None:
        if module.is_kv_shared_layer:
            _keep_shared_values(session, module, raw, str(module.kv_source_layer))
        else:
            super().install_values(session, module, raw)

    def build(self, slot: LayerSlot, raw: dict) -> DenseCapture:
        module = slot.module
        if module.indexer is not None:  # the values it attends to, as its forward rounds them
            rounding = sys.modules[type(module).__module__].nvfp4_fake_quantize
            values = raw["v"]
            raw = {**raw, "v": values + (rounding(values) - values)}
        layer = super().build(slot, raw)
        layer.info["kv_shared"] = bool(module.is_kv_shared_layer)
        return layer


class LatentAttentionAdapter(AttentionAdapter):
    """Multi-head latent attention: values from ``kv_b_proj`` ([k_nope | v] per head)."""

    def install(self, session: CaptureSession, slot: LayerSlot) -> None:
        module = slot.module
        raw = session.store(slot.index)

        def on_attention(_module, _args, output):
            raw["probs"] = output[1].detach() if isinstance(output, tuple) and output[1] is not None else None

        session.hook(module.register_forward_hook(on_attention))
        session.keep_output(module.kv_b_proj, raw, "kv")
        session.keep_input(module.o_proj, raw, "o")

    def build(self, slot: LayerSlot, raw: dict) -> DenseCapture:
        module = slot.module
        if raw.get("probs") is None:
            return super().build(slot, raw)  # raises the missing-probabilities error
        probs = raw["probs"][0]  # (H, L, L)
        heads, length, _ = probs.shape
        nope, value_dim = int(module.qk_nope_head_dim), int(module.v_head_dim)
        kv = raw["kv"][0].reshape(length, heads, nope + value_dim)
        return DenseCapture(
            layer=slot.index,
            family=self.family,
            inputs=kv[..., nope:].transpose(0, 1),  # (H, L, v_head_dim)
            outputs=raw["o"][0].reshape(length, heads, value_dim).transpose(0, 1),
            window=slot.window,
            info={
                "num_heads": heads,
                "head_dim": value_dim,
                "multiplicity": value_dim,
                "attention": "latent (MLA)",
                # the cache holds the compressed latent and the shared rotary key per token, and
                # what the layer's indexer keeps of each token
                "state_scalars_per_tss": int(module.kv_lora_rank)
                + int(module.qk_rope_head_dim)
                + _indexer_scalars(module),
                **({"kv_shared": True} if getattr(module, "is_kv_shared_layer", False) else {}),
            },
            operator=probs,
        )


def _indexer_scalars(module) -> int:
    """Scalars per token a latent-attention layer's indexer caches: none without an indexer (the
    "shared" layers of GLM-5.3-Flash and Mistral Large 4 reuse an earlier layer's selection), its
    key where it selects keys (DeepSeek sparse attention), and where it selects pools of keys
    (GLM-5.3-Flash) also each key's logits for its pool's weighted mean
    (``index_kpool_compress_gate``)."""
    indexer = getattr(module, "indexer", None)
    if indexer is None:
        return 0
    pool_gate = getattr(indexer, "index_kpool_compress_gate", None)
    return int(indexer.head_dim) + (0 if pool_gate is None else int(pool_gate.shape[0]))


class GatedLatentAttentionAdapter(LatentAttentionAdapter):
    """Latent attention whose head outputs are multiplied by sigmoid(gate): the last v_head_dim
    columns of each head's [query | gate] in ``q_gate_proj`` (A.X K2), a gate per head and channel
    from ``gate_proj`` (HY V4), or one gate per head and token from ``g_proj`` (Dots 3 Note)."""

    @staticmethod
    def _gate_source(module) -> str:
        return next(name for name in ("q_gate_proj", "gate_proj", "g_proj") if hasattr(module, name))

    def install(self, session: CaptureSession, slot: LayerSlot) -> None:
        super().install(session, slot)
        session.keep_output(getattr(slot.module, self._gate_source(slot.module)), session.store(slot.index), "gate")

    def build(self, slot: LayerSlot, raw: dict) -> DenseCapture:
        layer = super().build(slot, raw)
        gate = _head_gate(slot.module, raw["gate"], layer.n_units, layer.info["head_dim"])
        layer.out_gate = gate.transpose(0, 1)  # (H, L, v_head_dim)
        layer.info["out_gate"] = f"sigmoid(gate) per head and channel, from {self._gate_source(slot.module)}"
        return layer
