"""Capture: a model and a prompt -> the operators T each analysed layer applied.

Two tables know model architectures:

    REGISTRY      config.model_type -> ModelType (capture/registry.py): where each layer's
                  sequence mixer lives, the families its layers can have, the layers it
                  deliberately skips
    ADAPTERS      family key -> adapter (capture/<family>.py): install hooks, build T

To support a new model type, add one entry to REGISTRY (and, for a new kind of mixer, an
adapter module with a reconstruction test in tests/test_adapters.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from typing import Callable

import torch
from torch import nn

from ..core.units import CapturedLayer, DenseCapture, ShortConvCapture, SSMCapture
from .attention import AttentionAdapter
from .attention_variants import (
    DiffAttentionAdapter,
    GatedAttentionAdapter,
    GatedLatentAttentionAdapter,
    Gemma4AttentionAdapter,
    Kolibri11AttentionAdapter,
    LatentAttentionAdapter,
    Zamba2AttentionAdapter,
)
from .base import Adapter, CaptureSession, LayerSlot, quiet_kernel_fallback, transformers_outside_tested_range
from .gated_delta import GatedDeltaNetAdapter, KimiDeltaAdapter
from .layouts import language_model_config
from .lightning import LightningAttentionAdapter
from .linear_attention import LinearAttentionAdapter
from .mamba import MambaAdapter
from .mamba2 import Mamba2Adapter
from .mlstm import MLSTMAdapter
from .registry import (
    MODEL_FAMILIES,
    MODEL_TYPES,
    REGISTRY,
    ModelType,
    layer_slots,
    skipped_layers,
    support_table,
    supported_families,
    supported_model_types,
)
from .rg_lru import RGLRUAdapter
from .rwkv import RWKVAdapter
from .short_conv import ShortConvAdapter

__all__ = [
    "ADAPTERS",
    "REGISTRY",
    "ModelType",
    "support_table",
    "MODEL_TYPES",
    "supported_model_types",
    "supported_families",
    "MODEL_FAMILIES",
    "skipped_layers",
    "layer_slots",
    "capture",
    "eager_attention",
    "LayerSlot",
    "Adapter",
    "CapturedLayer",
    "DenseCapture",
    "SSMCapture",
    "ShortConvCapture",
    "CaptureSession",
]

ADAPTERS: dict[str, Adapter] = {
    "attention": AttentionAdapter(),
    "mamba": MambaAdapter(),
    "mamba2": Mamba2Adapter(),
    "short_conv": ShortConvAdapter(),
    "linear_attention": LinearAttentionAdapter(),
    "gated_deltanet": GatedDeltaNetAdapter(),
    "kda": KimiDeltaAdapter(),
    "gated_attention": GatedAttentionAdapter(),
    "projected_gate_attention": GatedAttentionAdapter(gate_projections=("gate_proj", "g_proj", "o_proj.gate_proj")),
    "softplus_gate_attention": GatedAttentionAdapter(gate_projections=("g_proj",), activation="softplus"),  # Laguna
    "latent_attention": LatentAttentionAdapter(),
    "gated_latent_attention": GatedLatentAttentionAdapter(),
    "gemma4_attention": Gemma4AttentionAdapter(),
    "kolibri_attention": Kolibri11AttentionAdapter(),
    "zamba2_attention": Zamba2AttentionAdapter(),
    "diff_attention": DiffAttentionAdapter(),
    "rg_lru": RGLRUAdapter(),
    "lightning_attention": LightningAttentionAdapter(),
    "rwkv": RWKVAdapter(),
    "mlstm": MLSTMAdapter(),
}


@contextlib.contextmanager
def eager_attention(model: nn.Module, needed: bool = True):
    """Run the block with the eager attention implementation (attention probabilities are
    only returned by it), restoring the model's previous implementation afterwards."""
    config = getattr(model, "config", None)
    previous = getattr(config, "_attn_implementation", None)
    # A multimodal class can run eager itself (GOT-OCR 2: its vision tower has nothing else)
    # while its language model, whose attention is analysed, runs sdpa.
    text = language_model_config(config) if config is not None else None
    previous_text = getattr(text, "_attn_implementation", None)
    parts = _sub_implementations(config, previous)  # before the switch
    switch = needed and (previous != "eager" or previous_text != "eager") and hasattr(model, "set_attn_implementation")
    forced = False
    if switch:
        _set_attention(model, "eager")
        if config._attn_implementation != "eager":
            # Falcon refuses the dynamic switch (it reads the config at each call, not an
            # attention interface): set the config's implementation for the pass instead.
            config._attn_implementation = "eager"
            forced = True
    try:
        yield
    finally:
        if forced:
            config._attn_implementation = previous
        elif switch and isinstance(previous, str):
            _set_attention(model, _previous_implementation(previous, parts))


def _sub_implementations(config, previous) -> dict:
    """The attention implementation of each sub-model (by its key in ``config.sub_configs``)."""
    subs = {key: getattr(config, key, None) for key in getattr(config, "sub_configs", {})}
    return {key: getattr(sub, "_attn_implementation", None) or previous for key, sub in subs.items() if sub is not None}


def _previous_implementation(previous: str, parts: dict) -> str | dict:
    """What restores the model's attention implementation: ``previous`` for all of it, or, where a
    sub-model ran another one, a dict that names each: GOT-OCR 2's language model runs sdpa inside
    its eager class, Apertus 1.5's image and audio tokenizers eager (they have nothing else, and
    refuse sdpa) inside its sdpa class."""
    if all(implementation == previous for implementation in parts.values()):
        return previous
    return {"": previous, **parts}


def _set_attention(model: nn.Module, implementation: str | dict) -> None:
    """``model.set_attn_implementation`` without transformers' warnings about the sub-configs of
    a multimodal model it cannot match to a sub-model (Gemma 4 unified's vision config, at every
    switch): the analysis never runs those, and the switch itself is checked above."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model.set_attn_implementation(implementation)
    finally:
        hf_logging.set_verbosity(verbosity)


class _StopForward(Exception):
    """Raised by a hook once the last analysed mixer has run (caught in `capture`)."""


def _install(session: CaptureSession, slots: list[LayerSlot], after: Callable[[LayerSlot], None]) -> None:
    """Every slot's adapter, and ``after(slot)`` once its call of its module has run. A module the
    pass runs several times (Dory's looped layers: a slot per call, `LayerSlot.call`) is hooked
    once: its adapter fills a store of its own at each call, copied to the slot of that call."""
    modules: dict[int, dict[int, LayerSlot]] = {}
    for slot in slots:
        modules.setdefault(id(slot.module), {})[slot.call] = slot
    hooked = []
    for calls in modules.values():
        first = next(iter(calls.values()))
        # a store no slot has (keys are >= 0) where a module is called more than once
        filled = first if set(calls) == {0} else dataclasses.replace(first, index=-1 - first.index)
        ADAPTERS[first.adapter].install(session, filled)
        hooked.append((calls, filled))
    for calls, filled in hooked:  # after every adapter's hooks, which fill session.raw

        def on_call(_module, _args, _output, calls=calls, filled=filled, count=itertools.count()):
            slot = calls.get(next(count))
            if slot is not None:
                if slot is not filled:
                    session.raw[slot.index] = dict(session.raw.get(filled.index, {}))
                after(slot)

        session.hook(filled.module.register_forward_hook(on_call))


def capture(
    model: nn.Module,
    input_ids: torch.Tensor,
    slots: list[LayerSlot],
    on_layer: Callable[[int, CapturedLayer], None] | None = None,
) -> dict[int, CapturedLayer]:
    """One forward pass of ``model`` on ``input_ids`` (1, L); the CapturedLayer of every slot.

    ``on_layer(index, layer)``: called during the pass, as soon as each slot's mixer
    module has run (every adapter captures inside its mixer module), so a caller can
    start on an early layer while the later ones are still being computed.
    Hooks and patched functions are removed, the attention implementation and the
    training flag restored, in a ``finally``, whatever happens.
    """
    session = CaptureSession()
    built: dict[int, CapturedLayer] = {}

    def build(slot: LayerSlot) -> None:
        if slot.index not in built:
            try:
                built[slot.index] = ADAPTERS[slot.adapter].build(slot, session.raw.get(slot.index, {}))
            except (KeyError, AttributeError, IndexError, TypeError) as error:  # what a modeling change gives
                mismatch = transformers_outside_tested_range()
                if mismatch is None:
                    raise
                raise RuntimeError(
                    f"layer {slot.index}: the {slot.adapter} adapter failed ({error!r}); {mismatch}"
                ) from error
            if on_layer is not None:
                on_layer(slot.index, built[slot.index])

    was_training = model.training
    try:
        attention = any(ADAPTERS[slot.adapter].family == "softmax_attention" for slot in slots)
        with eager_attention(model, attention), quiet_kernel_fallback():
            model.eval()
            last = max(slots, key=lambda slot: slot.index)

            def after(slot: LayerSlot) -> None:
                if on_layer is not None:
                    build(slot)
                if slot is last:  # nothing after the last analysed mixer matters: stop the pass there
                    raise _StopForward  # (saves the later layers and the LM head)

            _install(session, slots, after)
            with torch.no_grad():
                try:
                    model(input_ids=input_ids, use_cache=False)
                except _StopForward:
                    pass
    finally:
        session.close()
        model.train(was_training)
    for slot in slots:
        build(slot)
    return {slot.index: built[slot.index] for slot in slots}
