"""Where each layer's sequence mixer lives in a model: functions model -> [LayerSlot], one per
layout, that the registry's entries (capture/registry.py) name.

    uniform(path, attribute, adapter)   every layer's mixer at path[i].attribute
    hybrid(path, table)                 the config's layer types pick each layer's attribute and adapter
    mixers(path, attribute, table, skip)  one block per layer whose kind the layer types say (Nemotron-H)
    shared_attention(shared, attention, mamba)   Zamba's and Zamba2's shared attention blocks and Mamba
    looped(adapter, loop)               layers a pass runs in a loop, a slot per call (Dory, Inkling 2 Loop)
    cycles(adapter)                     HRM-text's two stacks in nested cycles, a slot per call
    falcon_h1, gpt_neo, recurrent_gemma, longcat_flash   the layouts of one model type each
    ModelType                           a registry entry: a layout, its families and its words

Attention slots carry their sliding window and chunk length, read from the config here (the
one place that maps a config to a layer's mask).
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import Callable

from torch import nn

from .base import LayerSlot

__all__ = [
    "ATTENTION_KINDS",
    "ATTENTION_LAYERS",
    "BLT_GLOBAL",
    "NEMOTRON_SKIP",
    "MLLAMA_CROSS",
    "ModelType",
    "blt",
    "blt_skipped",
    "mllama",
    "falcon_h1",
    "find_layers",
    "gpt_neo",
    "hybrid",
    "language_model_config",
    "layer_types",
    "longcat_flash",
    "looped",
    "cycles",
    "mixers",
    "recurrent_gemma",
    "shared_attention",
    "uniform",
]


@dataclass(frozen=True)
class ModelType:
    """One supported model type. slots(model) -> [LayerSlot]: where each analysed mixer is;
    families: the families (core/diagnostics.py FAMILIES) its layers can have; layers: where
    its layers are (for the support table); kinds: how its layers' kinds map to mixers and
    families (for the support table); skipped(model) -> {layer index: reason} for layers
    deliberately not analysed (None: none); refuses(config) -> why a model of this type is
    refused for what its config makes it (BERT's family: an encoder unless config.is_decoder),
    None where it is analysed (no ``refuses``: every config is)."""

    slots: Callable[[nn.Module], list[LayerSlot]]
    families: tuple[str, ...]
    layers: str
    kinds: str = ""
    skipped: Callable[[nn.Module], dict[int, str]] | None = None
    refuses: Callable[[object], str | None] | None = None


def find_layers(model: nn.Module, path: str) -> nn.ModuleList:
    """The layer list at ``path`` on a *ForCausalLM, or one level down on a base model."""
    for candidate in (path, path.split(".", 1)[-1]):
        node = model
        try:
            for name in candidate.split("."):
                node = getattr(node, name)
        except AttributeError:
            continue
        if isinstance(node, nn.ModuleList):
            return node
    raise ValueError(f"{type(model).__name__} has no layer list at {path!r}; is it the model type its config says?")


def language_model_config(config):
    """The config of the language model: ``config`` itself for a causal LM, its ``text_config``
    for the multimodal classes (Gemma 3 / 4, Qwen3.5), whose language model is what gets
    analysed (its layers, windows, context length)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _text_config(model):
    return language_model_config(model.config)


def layer_types(model) -> list[str]:
    config = _text_config(model)
    kinds = getattr(config, "layers_block_type", None) or getattr(config, "layer_types", None)
    if kinds is None:
        raise ValueError(f"{config.model_type} config has no layer types (layers_block_type / layer_types)")
    return list(kinds)


# Model types whose modeling masks every layer with config.sliding_window whenever it is set
# (the others read it only for their "sliding_attention" layer types).
_WINDOW_ON_EVERY_LAYER = ("mistral", "mixtral", "starcoder2", "phi3", "phimoe", "ministral3")


# Layer types of windowed and of full attention layers (ZAYA names them "hybrid_sliding" / "hybrid").
_SLIDING_KINDS, _FULL_KINDS = ("sliding_attention", "hybrid_sliding"), ("full_attention", "hybrid")


def _sliding_window(config, index: int) -> int | None:
    """Window of attention layer ``index``: layer_types "sliding_attention" (Qwen2, ...), or
    config.sliding_window on every layer of the _WINDOW_ON_EVERY_LAYER types."""
    kinds = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if kinds is not None and index < len(kinds) and kinds[index] in _SLIDING_KINDS + _FULL_KINDS:
        return window if kinds[index] in _SLIDING_KINDS else None
    return window if config.model_type in _WINDOW_ON_EVERY_LAYER else None


def _chunk(config, index: int) -> int | None:
    """Chunk length of attention layer ``index``: layer_types "chunked_attention" (Llama 4)."""
    kinds = getattr(config, "layer_types", None)
    if kinds is not None and index < len(kinds) and kinds[index] == "chunked_attention":
        return int(config.attention_chunk_size)
    return None


# Adapters of softmax attention whose layers may have a sliding window or chunks.
_WINDOWED_ADAPTERS = (
    *("attention", "gemma4_attention", "projected_gate_attention", "softplus_gate_attention"),
    *("gated_latent_attention", "kolibri_attention"),
)


def _slot(config, index: int, adapter: str, module: nn.Module) -> LayerSlot:
    if adapter not in _WINDOWED_ADAPTERS:
        return LayerSlot(index, adapter, module)
    return LayerSlot(index, adapter, module, _sliding_window(config, index), _chunk(config, index))


def uniform(path: str, attribute: str, adapter: str):
    """Every layer's mixer at ``path[i].attribute`` (a dotted attribute: DBRX's ``norm_attn_norm.attn``;
    "": the list at ``path`` holds the mixers themselves, XLM's ``transformer.attentions``)."""
    mixer = operator.attrgetter(attribute) if attribute else (lambda layer: layer)

    def slots(model):
        layers = find_layers(model, path)
        return [_slot(_text_config(model), i, adapter, mixer(layer)) for i, layer in enumerate(layers)]

    return slots


ATTENTION_KINDS = ("attention", "full_attention", "sliding_attention", "chunked_attention")


def hybrid(path: str, table: dict[str, tuple[str, str]]):
    """Layers whose family comes from the config's layer types: kind -> (attribute, adapter)."""

    def slots(model):
        layers = find_layers(model, path)
        kinds = layer_types(model)
        out = []
        for i, (layer, kind) in enumerate(zip(layers, kinds)):
            if kind not in table:
                raise ValueError(
                    f"{model.config.model_type} layer {i} has layer type {kind!r}, which no adapter handles"
                )
            attribute, adapter = table[kind]
            out.append(_slot(_text_config(model), i, adapter, operator.attrgetter(attribute)(layer)))
        return out

    return slots


ATTENTION_LAYERS = {kind: ("self_attn", "attention") for kind in ATTENTION_KINDS}


def falcon_h1(model):
    """Falcon-H1: every layer runs Mamba2 (``.mamba``) and attention (``.self_attn``) in
    parallel on the same input. Both are analysed as two slots per layer: key 2 i is layer
    i's Mamba2 mixer, key 2 i + 1 its attention (the order they run in); each slot's label
    says which (ESSResult.meta["slots"])."""
    out = []
    for i, layer in enumerate(find_layers(model, "model.layers")):
        out.append(LayerSlot(2 * i, "mamba2", layer.mamba, label=f"layer {i} mamba2"))
        attention = _slot(_text_config(model), i, "attention", layer.self_attn)
        out.append(
            LayerSlot(
                2 * i + 1, "attention", layer.self_attn, attention.window, attention.chunk, f"layer {i} attention"
            )
        )
    return out


def longcat_flash(model):
    """LongCat-Flash: every layer runs two latent-attention (MLA) blocks in turn, ``self_attn[0]``
    and ``self_attn[1]``, each followed by its own MLP: key 2 i is layer i's first, 2 i + 1 its
    second, labelled."""
    out = []
    for i, layer in enumerate(find_layers(model, "model.layers")):
        for j, attention in enumerate(layer.self_attn):
            out.append(LayerSlot(2 * i + j, "latent_attention", attention, label=f"layer {i} attention {j}"))
    return out


def _calls(config, adapter: str, order) -> list[LayerSlot]:
    """A slot per call of a layer the pass runs several times, keyed in the order of ``order``:
    (layer index i, its attention module, the module's call, label), each slot with layer i's
    window and chunk (`_slot`)."""
    return [
        dataclasses.replace(_slot(config, i, adapter, module), index=key, label=label, call=call)
        for key, (i, module, call, label) in enumerate(order)
    ]


def looped(adapter: str, loop: Callable[[object], tuple[int, int, int]]):
    """Layers a forward pass runs in a loop: ``loop(config)`` gives (start, stop, passes), and
    layers start to stop - 1 run ``passes`` times in turn, the same modules each time on that
    pass's input, the others once (Dory: its recurrent layers; Inkling 2 Loop: its loop's layers).
    Each call applies its own operator, so each is a slot (`LayerSlot.call`: the pass), keyed in
    the order the pass runs them and labelled "layer i" / "layer i pass p" when there are several
    passes; one pass leaves the keys the layer indices."""

    def slots(model):
        config = _text_config(model)
        layers = find_layers(model, "model.layers")
        start, stop, passes = loop(config)
        order = [(i, 0) for i in range(start)]
        order += [(i, p) for p in range(passes) for i in range(start, stop)]
        order += [(i, 0) for i in range(stop, len(layers))]

        def label(i: int, p: int) -> str | None:
            if passes == 1:
                return None
            return f"layer {i} pass {p}" if start <= i < stop else f"layer {i}"

        return _calls(config, adapter, [(i, layers[i].self_attn, p, label(i, p)) for i, p in order])

    return slots


def cycles(adapter: str):
    """HRM-text: two stacks of layers, L and H, in nested cycles. In each of config.H_cycles
    cycles the L stack runs config.L_cycles times, then the H stack once, the same modules each
    time on that step's input. Each call applies its own operator, so each is a slot
    (`LayerSlot.call`: the module's call h * L_cycles + l for the L stack, h for the H stack),
    keyed in the order the pass runs them and labelled "L layer i cycle h.l" / "H layer i cycle h"."""

    def slots(model):
        config = _text_config(model)
        low, high = (find_layers(model, f"model.{stack}.layers") for stack in ("L_module", "H_module"))
        order = []
        for h in range(config.H_cycles):
            for step in range(config.L_cycles):
                call = h * config.L_cycles + step
                order += [(i, low[i].self_attn, call, f"L layer {i} cycle {h}.{step}") for i in range(len(low))]
            order += [(i, high[i].self_attn, h, f"H layer {i} cycle {h}") for i in range(len(high))]
        return _calls(config, adapter, order)

    return slots


def shared_attention(shared: str, attention: str, mamba: str):
    """Zamba and Zamba2: a "hybrid" layer runs a shared attention block (at ``shared``: one set of
    weights, tied across the hybrid layers, called at each of their depths on that depth's input)
    and then its own Mamba mixer; a "mamba" layer runs the Mamba mixer alone. Each call of the
    shared block applies its own operator, so each is a slot of its own: key 2 i is hybrid layer
    i's shared attention (adapter ``attention``), 2 i + 1 layer i's Mamba mixer (adapter
    ``mamba``), the order they run in, labelled."""
    block = operator.attrgetter(f"{shared}.self_attn")

    def slots(model):
        out = []
        for i, (layer, kind) in enumerate(zip(find_layers(model, "model.layers"), layer_types(model))):
            if kind == "hybrid":
                out.append(LayerSlot(2 * i, attention, block(layer), label=f"layer {i} shared attention"))
                out.append(LayerSlot(2 * i + 1, mamba, layer.mamba_decoder.mamba, label=f"layer {i} mamba"))
            elif kind in ("mamba", "linear_attention"):
                out.append(LayerSlot(2 * i + 1, mamba, layer.mamba, label=f"layer {i} mamba"))
            else:
                raise ValueError(
                    f"{model.config.model_type} layer {i} has layer type {kind!r}, which no adapter handles"
                )
        return out

    return slots


def mixers(path: str, attribute: str, table: dict[str, str], skip: dict[str, str]):
    """Layers that each hold one block at ``attribute`` whose kind comes from the config's
    layer types (Nemotron-H): kind -> adapter; kinds in ``skip`` hold no sequence mixer
    (MLP / MoE blocks) and get no slot (their reason is in `skipped_layers`)."""

    def slots(model):
        out = []
        for i, (layer, kind) in enumerate(zip(find_layers(model, path), layer_types(model))):
            if kind in skip:
                continue
            if kind not in table:
                raise ValueError(
                    f"{model.config.model_type} layer {i} has layer type {kind!r}, which no adapter handles"
                )
            out.append(_slot(_text_config(model), i, table[kind], getattr(layer, attribute)))
        return out

    return slots


def gpt_neo(model):
    """GPT-Neo: ``attn.attention`` of each block; config.attention_layers says which layers
    are "local" (window config.window_size: token i sees i - window < j <= i) or "global"."""
    config = _text_config(model)
    out = []
    for i, (layer, kind) in enumerate(zip(find_layers(model, "transformer.h"), config.attention_layers)):
        window = int(config.window_size) if kind == "local" else None
        out.append(LayerSlot(i, "attention", layer.attn.attention, window=window))
    return out


def recurrent_gemma(model):
    """RecurrentGemma: ``temporal_block`` is an RG-LRU block ("recurrent") or local
    attention with window config.attention_window_size (every layer's block type from
    config.block_types, repeated)."""
    config = _text_config(model)
    out = []
    for i, (layer, kind) in enumerate(zip(find_layers(model, "model.layers"), config.layers_block_type)):
        if kind == "linear_attention":
            out.append(LayerSlot(i, "rg_lru", layer.temporal_block))
        else:
            out.append(LayerSlot(i, "attention", layer.temporal_block, window=int(config.attention_window_size)))
    return out


MLLAMA_CROSS = "a cross-attention layer: it attends to the image, and a text prompt skips it"


def mllama(model):
    """Llama 3.2 Vision (Mllama): the self-attention layers of its language model; the layers in
    config.cross_attention_layers attend to the image instead, and a text prompt skips them
    (listed in `skipped_layers` with MLLAMA_CROSS)."""
    config = _text_config(model)
    cross = set(config.cross_attention_layers)
    layers = find_layers(model, "model.language_model.layers")
    return [_slot(config, i, "attention", layer.self_attn) for i, layer in enumerate(layers) if i not in cross]


BLT_GLOBAL = (
    "a layer of the global transformer: it runs over patches of bytes (their boundaries set by the entropy "
    "model), not over the prompt's bytes, so its T has a time axis of its own"
)


def _blt_stacks(model) -> list[tuple[str, nn.ModuleList]]:
    """BLT's three stacks in the order its forward pass runs them: (name, layers)."""
    return [
        (name, find_layers(model, f"model.{name}.layers"))
        for name in ("local_encoder", "global_transformer", "local_decoder")
    ]


def blt(model):
    """BLT (Byte Latent Transformer): a local encoder over the prompt's bytes, a global transformer
    over patches of them, a local decoder over the bytes again. The two local stacks' self-attention
    layers are analysed, keyed in the order the pass runs them (encoder layers, then the global
    layers' keys, which `blt_skipped` lists with BLT_GLOBAL, then decoder layers) and labelled
    "encoder layer i" / "decoder layer i", each windowed by config.local_attention_window_len.
    Their cross-attention to and from the patches is mixing outside T, as an MLP is; the entropy
    model (``model.patcher``), a small LM of its own that only sets the patch boundaries, is not
    analysed."""
    window = model.config.local_attention_window_len
    out, key = [], 0
    for name, layers in _blt_stacks(model):
        for i, layer in enumerate(layers):
            if name != "global_transformer":
                label = f"{name.split('_')[1]} layer {i}"
                out.append(LayerSlot(key, "attention", layer.self_attn, window=window, label=label))
            key += 1
    return out


def blt_skipped(model) -> dict[int, str]:
    """The keys `blt` gives the global transformer's layers, each with BLT_GLOBAL."""
    encoder, global_layers, _ = (len(layers) for _, layers in _blt_stacks(model))
    return dict.fromkeys(range(encoder, encoder + global_layers), BLT_GLOBAL)


NEMOTRON_SKIP = {"mlp": "an MLP block: no sequence mixer", "moe": "a mixture-of-experts MLP block: no sequence mixer"}
