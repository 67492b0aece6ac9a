"""Softmax attention (GPT-2, Pythia, Llama, Qwen, Gemma, Mistral, ...: every softmax-attention
model type of capture/registry.py, and the attention layers of hybrids).

Math. For query head h of a layer, with the model's own scores and mask,

    T_h[i, j] = softmax_j(q_i . k_j * scaling + mask[i, j])      j <= i, 0 above the diagonal

i.e. the attention probabilities the model used for this prompt; the head's output is
o_h = T_h v_{g(h)}, where g(h) = h // (H / H_kv) is the key-value head it reads (GQA:
several query heads share one V but each has its own T). W_Q, W_K, W_V, W_O stay outside.

Shapes and unit: unit = query head, U = H (num_attention_heads); T stored dense, (H, L, L),
float32 as the model computed it (batch 1, one prompt).
Sliding window w (Mistral, Qwen2, Gemma 2/3 "sliding_attention" layers): the mask already
zeroes i - j >= w, so T is exactly what the model applied; the window comes from the config.
Chunked attention C (Llama 4 "chunked_attention" layers): token i sees j <= i in its own
chunk, floor(j / C) == floor(i / C); T is block lower triangular and the family is
"chunked_attention" (``window`` holds C).
Logit soft-capping (Gemma 2) and any score scaling are inside the probabilities.
TSS per head: t (the KV cache grows; docs/math.md), min(t, w - 1) with a window,
t mod C with chunks (at cut t only the tokens of t's own chunk stay readable).
The layer's state in scalars is its KV cache: 2 x H_kv x head_dim per cached token
(H_kv x (head_dim + v_head_dim) where values are narrower than keys, MiMo-V2-Flash's)
(``info["state_scalars_per_tss"]``), whatever the number of query heads reading it, so
layer totals of TSS count 2 x H_kv x head_dim x TSS(t) (docs/conventions.md).
Cost: spectra by the dense core path, O(L^4 / 19) per head; all heads of a layer go to
the core in one (H, L, L) call.

Capture (hooks on public modules only, nothing patched):
- forward hook on the attention module: its output is ``(attn_output, attn_weights)``;
  attn_weights (1, H, L, L) are the probabilities with the eager implementation. With sdpa
  or flash they are None: analysis switches the model to "eager" for the pass
  (`model.set_attn_implementation`), and `build` raises if they are still missing, so
  empty attentions are never taken silently. An attention module whose forward takes
  ``output_attentions`` (GPT-1's, XLM's) gets it set by a pre-hook: it returns its
  probabilities only when asked.
- forward hook on ``v_proj`` (CTRL's ``Wv``, GIT's ``value``, XLM's ``v_lin``, Inkling's ``v_sconv`` after it,
  Inkling 2's ``v_proj`` module of linear, short conv and norm, which returns its heads first; or
  the fused projection, by its model's column layout: `_fused_values`) for V, and a pre-hook on the
  output projection (``o_proj`` / ``out_proj`` / GPT-2 ``c_proj`` / ``dense`` / ModernBERT
  decoder's ``Wo`` / XLM's ``out_lin``; the ``linear`` of Inkling 2's, after the gate it applies) for the concatenated
  head outputs: the reconstruction test checks o_h = T_h v_{g(h)}. GIT's self-attention (BERT's
  layout) has no output projection of its own: its output is the concatenated head outputs.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ..core.units import DenseCapture
from .base import CaptureSession, LayerSlot

__all__ = ["AttentionAdapter", "heads_last"]

_OUTPUT_PROJECTIONS = ("o_proj", "out_proj", "c_proj", "dense", "Wo", "out_lin")  # Wo: ModernBERT decoder; out_lin: XLM
# Wv: CTRL; v_sconv: Inkling (a short conv after v_proj); value: GIT (BERT's layout); v_lin: XLM
_VALUE_PROJECTIONS = ("v_sconv", "v_proj", "Wv", "value", "v_lin")


def _head_dim(module) -> int:
    """The size of one head: ``head_dim``, GPT-NeoX's ``head_size``, GIT's (BERT's)
    ``attention_head_size``, or GPT-1's width per head."""
    size = getattr(module, "head_dim", None) or getattr(module, "head_size", None)
    size = size or getattr(module, "attention_head_size", None)
    if size is None and hasattr(module, "split_size") and hasattr(module, "n_head"):
        size = module.split_size // module.n_head  # GPT-1 (openai-gpt)
    if size is None:
        raise AttributeError(f"{type(module).__name__} has neither head_dim nor head_size")
    return int(size)


def _fused_values(module):
    """(projection, out -> V (B, L, H_kv hd)) for an attention module that makes Q, K and V
    in one projection, whose column layout depends on the model:

    - [q | k | v] by blocks: GPT-2's ``c_attn`` (thirds), MPT's and DBRX's ``Wqkv`` (after
      their clamp; k and v H_kv heads each); GPT-BigCode's multi-query ``c_attn``
      (k and v one head each, ``kv_dim``); Phi-3's and Ergo's ``qkv_proj`` (k and v H_kv heads each);
      Falcon's multi-query ``query_key_value``;
    - per head [q | k | v], hd columns each: GPT-NeoX, Persimmon and BLOOM's
      ``query_key_value``, Falcon's default, GPT-BigCode's multi-head ``c_attn``;
    - per KV group [its queries | k | v]: Falcon's ``new_decoder_architecture``;
    - per model-parallel shard [q | v | k], ``embed_dim / mp_num`` columns each: CodeGen's
      ``qkv_proj`` (trained on ``mp_num`` = 4 shards);
    - a module that returns the (query, key, value) states: ZAYA's ``qkv_proj`` (compressed
      convolutional attention: half of each value head is the previous token's projection, a
      shift before the attention, like Mamba's convolution before its scan, so outside T).

    A wrong split gives V of the wrong heads, which the reconstruction tests catch."""
    head_dim = _head_dim(module)

    def last(width):
        return lambda out: out[..., out.shape[-1] - width :]

    def per_head(out):
        return out.unflatten(-1, (-1, 3, head_dim))[..., 2, :].flatten(-2)

    if hasattr(module, "Wqkv"):  # MPT, DBRX: clamped to +-clip_qkv first where the config sets it
        clip = module.clip_qkv
        width = (getattr(module, "num_key_value_heads", None) or module.n_heads) * head_dim  # DBRX: GQA
        return module.Wqkv, lambda out: (out.clamp(-clip, clip) if clip else out)[..., out.shape[-1] - width :]
    if hasattr(module, "c_attn"):
        if not hasattr(module, "kv_dim"):  # GPT-2
            return module.c_attn, lambda out: out[..., 2 * (out.shape[-1] // 3) :]
        return module.c_attn, last(module.kv_dim) if module.multi_query else per_head
    if hasattr(module, "mp_num"):  # CodeGen: each shard's [q | v | k]

        def per_shard(out):
            return out.unflatten(-1, (module.mp_num, 3, -1))[..., 1, :].flatten(-2)

        return module.qkv_proj, per_shard
    if hasattr(module, "qkv_proj") and not isinstance(module.qkv_proj, nn.Linear):
        return module.qkv_proj, lambda out: out[2].flatten(-2)  # ZAYA's CCA: (query, key, value) states
    if hasattr(module, "qkv_proj"):  # Phi-3 keeps its number of KV heads, Ergo its config
        kv_heads = getattr(module, "num_key_value_heads", None) or module.config.num_key_value_heads
        return module.qkv_proj, last(kv_heads * head_dim)
    if not hasattr(module, "query_key_value"):
        raise AttributeError(
            f"{type(module).__name__} has no v_proj and no fused Q, K, V projection this adapter knows"
        )
    if getattr(module, "new_decoder_architecture", False):

        def per_group(out):
            fused = out.unflatten(-1, (module.num_kv_heads, -1, head_dim))  # (B, L, H_kv, group + 2, hd)
            return fused[..., -1, :].flatten(-2)

        return module.query_key_value, per_group
    if getattr(module, "multi_query", False):
        return module.query_key_value, last(head_dim)
    return module.query_key_value, per_head


def heads_last(values: torch.Tensor) -> torch.Tensor:
    """Values (B, H_kv, L, hd), heads first, as ``raw["v"]`` keeps them: (B, L, H_kv hd), detached."""
    return values.detach().transpose(1, 2).flatten(-2)


class AttentionAdapter:
    family = "softmax_attention"

    def install(self, session: CaptureSession, slot: LayerSlot) -> None:
        module = slot.module
        raw = session.store(slot.index)

        projection = next((getattr(module, name) for name in _OUTPUT_PROJECTIONS if hasattr(module, name)), None)

        def on_attention(_module, _args, output):
            weights = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
            raw["probs"] = None if weights is None else weights.detach()
            if projection is None:  # GIT's (BERT's) self-attention returns the head outputs, projected after it
                raw["o"] = output[0].detach()

        if "output_attentions" in inspect.signature(module.forward).parameters:
            # GPT-1's attention returns its probabilities only when the call asks for them.
            def ask_for_weights(_module, args, kwargs):
                return args, {**kwargs, "output_attentions": True}

            session.hook(module.register_forward_pre_hook(ask_for_weights, with_kwargs=True))
        session.hook(module.register_forward_hook(on_attention))
        self.install_values(session, module, raw)
        if projection is not None:
            if hasattr(projection, "gate_proj"):  # Inkling 2's gates the head outputs, then its linear mixes them
                projection = projection.linear
            session.keep_input(projection, raw, "o")

    def install_values(self, session: CaptureSession, module, raw: dict) -> None:
        """Keep V, (B, L, H_kv hd), as ``raw["v"]``: the output of ``v_proj`` (CTRL's ``Wv``) or
        of the fused projection."""
        for name in _VALUE_PROJECTIONS:
            if hasattr(module, name):
                projection = getattr(module, name)
                if hasattr(projection, "sconv"):  # Inkling 2's: linear, short conv, norm; (B, H_kv, L, hd)

                    def heads_first(_module, _args, out):
                        raw["v"] = heads_last(out)

                    session.hook(projection.register_forward_hook(heads_first))
                    return
                session.keep_output(projection, raw, "v")
                return
        projection, values = _fused_values(module)

        def on_fused(_m, _a, out):
            raw["v"] = values(out).detach()

        session.hook(projection.register_forward_hook(on_fused))

    def build(self, slot: LayerSlot, raw: dict) -> DenseCapture:
        probs = raw.get("probs")
        if probs is None:
            impl = getattr(getattr(slot.module, "config", None), "_attn_implementation", "unknown")
            raise RuntimeError(
                f"layer {slot.index} ({type(slot.module).__name__}) returned no attention probabilities "
                f"(attention implementation {impl!r}); load the model with attn_implementation='eager'"
            )
        if probs.shape[0] != 1:
            raise RuntimeError(f"expected batch 1, got attention probabilities of shape {tuple(probs.shape)}")
        probs = probs[0]  # (H, L, L)
        heads, length, _ = probs.shape
        key_dim = _head_dim(slot.module)
        head_dim = int(getattr(slot.module, "v_head_dim", None) or key_dim)  # MiMo: values narrower than keys
        v = raw["v"][0].reshape(length, -1, head_dim).transpose(0, 1)  # (H_kv, L, hd)
        v = v * getattr(slot.module, "v_scale", 1.0)  # MiMo scales V after v_proj
        o = raw["o"][0].reshape(length, heads, head_dim).transpose(0, 1)  # (H, L, hd)
        group = heads // v.shape[0]
        inputs = v.repeat_interleave(group, dim=0)  # query head h reads kv head h // group
        return DenseCapture(
            layer=slot.index,
            family="chunked_attention" if slot.chunk else self.family,
            inputs=inputs,
            outputs=o,
            window=slot.chunk or slot.window,
            multiplicity=head_dim,  # the head's value channels share its T
            info={
                "num_heads": heads,
                "num_key_value_heads": int(v.shape[0]),
                "head_dim": head_dim,
                "state_scalars_per_tss": int(v.shape[0]) * (key_dim + head_dim),  # K and V of each KV head
            },
            operator=probs,
        )
