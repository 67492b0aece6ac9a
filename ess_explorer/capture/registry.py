"""The model types this package supports: config.model_type -> where each layer's sequence
mixer lives and which adapter (capture/__init__.py ADAPTERS) reads it.

    REGISTRY      config.model_type -> ModelType: ``slots(model)`` -> [LayerSlot per layer]
                  (hybrids map layers through the config's layer types), the families its
                  layers can have, the layers it deliberately skips, and the words of the
                  support table

MODEL_TYPES (model type -> slots) and MODEL_FAMILIES (model type -> families) are views of
REGISTRY; `ess-explorer models --families` prints it and docs/families.md shows
`support_table()`, its rendering (scripts/docs_hooks.py), so neither can fall behind it. To
support a new model type, add one entry to REGISTRY with a reconstruction test from a tiny
config (tests/test_families.py).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable

from torch import nn

from .base import LayerSlot

__all__ = [
    "REGISTRY",
    "ModelType",
    "language_model_config",
    "MODEL_TYPES",
    "MODEL_FAMILIES",
    "layer_slots",
    "skipped_layers",
    "support_table",
    "supported_families",
    "supported_model_types",
]


def _find(model: nn.Module, path: str) -> nn.ModuleList:
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


def _layer_types(model) -> list[str]:
    config = _text_config(model)
    kinds = getattr(config, "layers_block_type", None) or getattr(config, "layer_types", None)
    if kinds is None:
        raise ValueError(f"{config.model_type} config has no layer types (layers_block_type / layer_types)")
    return list(kinds)


# Model types whose modeling masks every layer with config.sliding_window whenever it is set
# (the others read it only for their "sliding_attention" layer types).
_WINDOW_ON_EVERY_LAYER = ("mistral", "mixtral", "starcoder2", "phi3", "phimoe")


def _sliding_window(config, index: int) -> int | None:
    """Window of attention layer ``index``: layer_types "sliding_attention" (Qwen2, ...), or
    config.sliding_window on every layer of the _WINDOW_ON_EVERY_LAYER types."""
    kinds = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if kinds is not None and index < len(kinds) and kinds[index] in ("sliding_attention", "full_attention"):
        return window if kinds[index] == "sliding_attention" else None
    return window if config.model_type in _WINDOW_ON_EVERY_LAYER else None


def _chunk(config, index: int) -> int | None:
    """Chunk length of attention layer ``index``: layer_types "chunked_attention" (Llama 4)."""
    kinds = getattr(config, "layer_types", None)
    if kinds is not None and index < len(kinds) and kinds[index] == "chunked_attention":
        return int(config.attention_chunk_size)
    return None


# Adapters of softmax attention whose layers may have a sliding window or chunks.
_WINDOWED_ADAPTERS = ("attention", "gemma4_attention")


def _slot(config, index: int, adapter: str, module: nn.Module) -> LayerSlot:
    if adapter not in _WINDOWED_ADAPTERS:
        return LayerSlot(index, adapter, module)
    return LayerSlot(index, adapter, module, _sliding_window(config, index), _chunk(config, index))


def _uniform(path: str, attribute: str, adapter: str):
    def slots(model):
        layers = _find(model, path)
        return [_slot(_text_config(model), i, adapter, getattr(layer, attribute)) for i, layer in enumerate(layers)]

    return slots


_ATTENTION_KINDS = ("attention", "full_attention", "sliding_attention", "chunked_attention")


def _hybrid(path: str, table: dict[str, tuple[str, str]]):
    """Layers whose family comes from the config's layer types: kind -> (attribute, adapter)."""

    def slots(model):
        layers = _find(model, path)
        kinds = _layer_types(model)
        out = []
        for i, (layer, kind) in enumerate(zip(layers, kinds)):
            if kind not in table:
                raise ValueError(
                    f"{model.config.model_type} layer {i} has layer type {kind!r}, which no adapter handles"
                )
            attribute, adapter = table[kind]
            module = layer
            for name in attribute.split("."):
                module = getattr(module, name)
            out.append(_slot(_text_config(model), i, adapter, module))
        return out

    return slots


_ATTN = {kind: ("self_attn", "attention") for kind in _ATTENTION_KINDS}


def _falcon_h1(model):
    """Falcon-H1: every layer runs Mamba2 (``.mamba``) and attention (``.self_attn``) in
    parallel on the same input. Both are analysed as two slots per layer: key 2 i is layer
    i's Mamba2 mixer, key 2 i + 1 its attention (the order they run in); each slot's label
    says which (ESSResult.meta["slots"])."""
    out = []
    for i, layer in enumerate(_find(model, "model.layers")):
        out.append(LayerSlot(2 * i, "mamba2", layer.mamba, label=f"layer {i} mamba2"))
        attention = _slot(_text_config(model), i, "attention", layer.self_attn)
        out.append(
            LayerSlot(
                2 * i + 1, "attention", layer.self_attn, attention.window, attention.chunk, f"layer {i} attention"
            )
        )
    return out


def _zamba(model):
    """Zamba: a "hybrid" layer runs the shared attention block (one set of weights, tied
    across the hybrid layers, called at each of their depths on that depth's input) and then
    its own Mamba mixer; a "mamba" layer runs the Mamba mixer alone. Each call of the shared
    block applies its own operator, so each is a slot of its own: key 2 i is hybrid layer i's
    shared attention, 2 i + 1 layer i's Mamba mixer (the order they run in), labelled."""
    out = []
    for i, (layer, kind) in enumerate(zip(_find(model, "model.layers"), _layer_types(model))):
        if kind == "hybrid":
            out.append(
                LayerSlot(2 * i, "attention", layer.shared_transf.self_attn, label=f"layer {i} shared attention")
            )
            out.append(LayerSlot(2 * i + 1, "mamba", layer.mamba_decoder.mamba, label=f"layer {i} mamba"))
        elif kind in ("mamba", "linear_attention"):
            out.append(LayerSlot(2 * i + 1, "mamba", layer.mamba, label=f"layer {i} mamba"))
        else:
            raise ValueError(f"zamba layer {i} has layer type {kind!r}, which no adapter handles")
    return out


def _mixers(path: str, attribute: str, table: dict[str, str], skip: dict[str, str]):
    """Layers that each hold one block at ``attribute`` whose kind comes from the config's
    layer types (Nemotron-H): kind -> adapter; kinds in ``skip`` hold no sequence mixer
    (MLP / MoE blocks) and get no slot (their reason is in `skipped_layers`)."""

    def slots(model):
        out = []
        for i, (layer, kind) in enumerate(zip(_find(model, path), _layer_types(model))):
            if kind in skip:
                continue
            if kind not in table:
                raise ValueError(
                    f"{model.config.model_type} layer {i} has layer type {kind!r}, which no adapter handles"
                )
            out.append(_slot(_text_config(model), i, table[kind], getattr(layer, attribute)))
        return out

    return slots


def _gpt_neo(model):
    """GPT-Neo: ``attn.attention`` of each block; config.attention_layers says which layers
    are "local" (window config.window_size: token i sees i - window < j <= i) or "global"."""
    config = _text_config(model)
    out = []
    for i, (layer, kind) in enumerate(zip(_find(model, "transformer.h"), config.attention_layers)):
        window = int(config.window_size) if kind == "local" else None
        out.append(LayerSlot(i, "attention", layer.attn.attention, window=window))
    return out


def _recurrent_gemma(model):
    """RecurrentGemma: ``temporal_block`` is an RG-LRU block ("recurrent") or local
    attention with window config.attention_window_size (every layer's block type from
    config.block_types, repeated)."""
    config = _text_config(model)
    out = []
    for i, (layer, kind) in enumerate(zip(_find(model, "model.layers"), config.layers_block_type)):
        if kind == "linear_attention":
            out.append(LayerSlot(i, "rg_lru", layer.temporal_block))
        else:
            out.append(LayerSlot(i, "attention", layer.temporal_block, window=int(config.attention_window_size)))
    return out


_NEMOTRON_SKIP = {"mlp": "an MLP block: no sequence mixer", "moe": "a mixture-of-experts MLP block: no sequence mixer"}


@dataclass(frozen=True)
class ModelType:
    """One supported model type. slots(model) -> [LayerSlot]: where each analysed mixer is;
    families: the families (core/diagnostics.py FAMILIES) its layers can have; layers: where
    its layers are (for the support table); kinds: how its layers' kinds map to mixers and
    families (for the support table); skipped(model) -> {layer index: reason} for layers
    deliberately not analysed (None: none)."""

    slots: Callable[[nn.Module], list[LayerSlot]]
    families: tuple[str, ...]
    layers: str
    kinds: str = ""
    skipped: Callable[[nn.Module], dict[int, str]] | None = None


_ATT = "softmax_attention"
# Softmax attention at model.layers[i].self_attn, each with a reconstruction test.
_ATTENTION_TYPES = (
    *("llama", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "mistral", "ministral", "mixtral"),
    *("gemma", "gemma2", "gemma3_text", "vaultgemma", "phi", "phi3", "phimoe", "persimmon"),
    *("olmo", "olmo2", "olmo3", "olmoe", "granite", "granitemoe", "cohere", "cohere2"),
    *("smollm3", "helium", "glm", "glm4", "stablelm", "starcoder2", "exaone4", "seed_oss"),
    *("arcee", "apertus", "hunyuan_v1_dense", "hunyuan_v1_moe", "gpt_oss", "nemotron", "ernie4_5"),
    *("ernie4_5_moe", "glm4_moe", "granitemoeshared", "cwm", "nanochat"),
)
_ATTENTION_NOTE = "softmax attention (GQA: one T per query head; windows, chunks and soft-capping from the config)"
_MAMBA2_HYBRID = {"mamba": ("mamba", "mamba2"), "linear_attention": ("mamba", "mamba2"), **_ATTN}
_DELTA = {"linear_attention": ("linear_attn", "gated_deltanet")}
_GATED_DELTA = {**_DELTA, "full_attention": ("self_attn", "gated_attention")}  # Qwen3-Next, Qwen3.5

REGISTRY: dict[str, ModelType] = {
    "gpt2": ModelType(
        _uniform("transformer.h", "attn", "attention"), (_ATT,), "transformer.h[i].attn", _ATTENTION_NOTE
    ),
    **{
        name: ModelType(
            _uniform("model.layers", "self_attn", "attention"), (_ATT,), "model.layers[i].self_attn", _ATTENTION_NOTE
        )
        for name in _ATTENTION_TYPES
    },
    **{
        name: ModelType(_uniform(path, attribute, "attention"), (_ATT,), f"{path}[i].{attribute}", _ATTENTION_NOTE)
        for name, path, attribute in (
            ("opt", "model.decoder.layers", "self_attn"),
            ("gpt_neox", "gpt_neox.layers", "attention"),
            ("bloom", "transformer.h", "self_attention"),
            ("gptj", "transformer.h", "attn"),
            ("gpt_bigcode", "transformer.h", "attn"),
        )
    },
    "gpt_neo": ModelType(
        _gpt_neo, (_ATT,), "transformer.h[i].attn.attention", '"local" layers: a window of config.window_size'
    ),
    **{
        name: ModelType(
            _uniform("model.layers", "self_attn", "latent_attention"),
            (_ATT,),
            "model.layers[i].self_attn",
            "latent attention (MLA: values from kv_b_proj)",
        )
        for name in ("deepseek_v2", "deepseek_v3")
    },
    "falcon": ModelType(
        _uniform("transformer.h", "self_attention", "attention"),
        (_ATT,),
        "transformer.h[i].self_attention",
        _ATTENTION_NOTE,
    ),
    "llama4_text": ModelType(
        _uniform("model.layers", "self_attn", "attention"),
        (_ATT, "chunked_attention"),
        "model.layers[i].self_attn",
        '"chunked_attention" layers: chunked attention (TSS t mod C); the others softmax attention',
    ),
    **{
        name: ModelType(
            _uniform("backbone.layers", "mixer", "mamba"),
            ("mamba",),
            "backbone.layers[i].mixer",
            "mamba (one T per channel)",
        )
        for name in ("mamba", "falcon_mamba")
    },
    "mamba2": ModelType(
        _uniform("backbone.layers", "mixer", "mamba2"), ("mamba2",), "backbone.layers[i].mixer", "mamba2 (SSD)"
    ),
    **{
        name: ModelType(
            _hybrid("model.layers", {"conv": ("conv", "short_conv"), **_ATTN}),
            ("short_conv", _ATT),
            "model.layers[i]",
            '"conv" -> .conv, short conv; "full_attention" -> .self_attn, attention',
        )
        for name in ("lfm2", "lfm2_moe")
    },
    "jamba": ModelType(
        _hybrid("model.layers", {"mamba": ("mamba", "mamba"), "linear_attention": ("mamba", "mamba"), **_ATTN}),
        ("mamba", _ATT),
        "model.layers[i]",
        'layers_block_type "mamba" -> .mamba, mamba; "attention" -> .self_attn, attention',
    ),
    "bamba": ModelType(
        _hybrid("model.layers", _MAMBA2_HYBRID),
        ("mamba2", _ATT),
        "model.layers[i]",
        '"linear_attention" -> .mamba, mamba2; "full_attention" -> .self_attn, attention',
    ),
    "granitemoehybrid": ModelType(
        _hybrid("model.layers", _MAMBA2_HYBRID),
        ("mamba2", _ATT),
        "model.layers[i]",
        '"mamba" -> .mamba, mamba2; "attention" -> .self_attn, attention',
    ),
    "zamba2": ModelType(
        _hybrid(
            "model.layers",
            {
                "mamba": ("mamba", "mamba2"),
                "linear_attention": ("mamba", "mamba2"),
                "hybrid": ("mamba_decoder.mamba", "mamba2"),
            },
        ),
        ("mamba2",),
        "model.layers[i]",
        '"mamba" -> .mamba, mamba2; "hybrid" -> .mamba_decoder.mamba, mamba2 (the shared attention block '
        "of a hybrid layer is not analysed)",
    ),
    "zamba": ModelType(
        _zamba,
        ("mamba", _ATT),
        "model.layers[i]",
        '"mamba" -> .mamba, mamba; "hybrid" -> the shared attention block .shared_transf.self_attn (attention) '
        "and .mamba_decoder.mamba: keys 2i and 2i + 1, labelled",
    ),
    "falcon_h1": ModelType(
        _falcon_h1,
        ("mamba2", _ATT),
        "model.layers[i]",
        ".mamba (mamba2) and .self_attn (attention) in parallel: two slots per layer, keys 2i and 2i + 1, labelled",
    ),
    "nemotron_h": ModelType(
        _mixers(
            "model.layers",
            "mixer",
            {"mamba": "mamba2", "linear_attention": "mamba2", **{k: "attention" for k in _ATTENTION_KINDS}},
            _NEMOTRON_SKIP,
        ),
        ("mamba2", _ATT),
        "model.layers[i].mixer",
        '"mamba" -> mamba2; "attention" -> attention; "mlp" / "moe": no slot, listed as skipped with the reason',
        skipped=lambda model: {
            i: _NEMOTRON_SKIP[kind] for i, kind in enumerate(_layer_types(model)) if kind in _NEMOTRON_SKIP
        },
    ),
    "recurrent_gemma": ModelType(
        _recurrent_gemma,
        ("rg_lru", _ATT),
        "model.layers[i].temporal_block",
        '"recurrent" -> RG-LRU; "attention" -> local attention',
    ),
    "minimax": ModelType(
        _hybrid("model.layers", {"linear_attention": ("self_attn", "lightning_attention"), **_ATTN}),
        ("lightning_attention", _ATT),
        "model.layers[i].self_attn",
        '"linear_attention" -> lightning attention; "full_attention" -> attention',
    ),
    "rwkv": ModelType(
        _uniform("rwkv.blocks", "attention", "rwkv"), ("rwkv",), "rwkv.blocks[i].attention", "RWKV-4 time mixing"
    ),
    "xlstm": ModelType(
        _uniform("backbone.blocks", "mlstm_layer", "mlstm"), ("mlstm",), "backbone.blocks[i].mlstm_layer", "mLSTM"
    ),
    "ess_linear_attention": ModelType(
        _uniform("model.layers", "mixer", "linear_attention"),
        ("linear_attention", "gated_linear_attention"),
        "model.layers[i].mixer",
        "the zoo's own linear attention, gated or not",
    ),
    **{
        name: ModelType(
            _hybrid("model.layers", _GATED_DELTA),
            ("gated_deltanet", _ATT),
            "model.layers[i]",
            '"linear_attention" -> .linear_attn, Gated DeltaNet (DPLR); "full_attention" -> .self_attn, '
            "gated attention",
        )
        for name in ("qwen3_next", "qwen3_5_text")
    },
    **{
        name: ModelType(
            _uniform(f"{path}.layers", "self_attn", "gemma4_attention"),
            (_ATT,),
            f"{path}.layers[i].self_attn",
            "softmax attention; V after v_norm; the KV-sharing last layers read an earlier layer's V"
            + (" (the language model of the multimodal class, text prompts)" if name == "gemma4" else ""),
        )
        for name, path in (("gemma4_text", "model"), ("gemma4", "model.language_model"))
    },
    # The multimodal classes: their language model, on a text prompt (images are not analysed).
    "gemma3": ModelType(
        _uniform("model.language_model.layers", "self_attn", "attention"),
        (_ATT,),
        "model.language_model.layers[i].self_attn",
        "the language model of the multimodal class, as gemma3_text (text prompts)",
    ),
    "qwen3_5": ModelType(
        _hybrid("model.language_model.layers", _GATED_DELTA),
        ("gated_deltanet", _ATT),
        "model.language_model.layers[i]",
        "the language model of the multimodal class, as qwen3_5_text (text prompts)",
    ),
    "olmo_hybrid": ModelType(
        _hybrid("model.layers", {**_DELTA, **_ATTN}),
        ("gated_deltanet", _ATT),
        "model.layers[i]",
        '"linear_attention" -> .linear_attn, Gated DeltaNet; "full_attention" -> .self_attn, attention',
    ),
    "kimi_linear": ModelType(
        _hybrid(
            "model.layers",
            {"linear_attention": ("self_attn", "kda"), "full_attention": ("self_attn", "latent_attention")},
        ),
        ("kda", _ATT),
        "model.layers[i].self_attn",
        '"linear_attention" -> KDA (per-key decay); "full_attention" -> latent attention (MLA)',
    ),
}

# Views of the registry (one table): model type -> slots, and model type -> its families.
MODEL_TYPES = {name: entry.slots for name, entry in REGISTRY.items()}
MODEL_FAMILIES = {name: entry.families for name, entry in REGISTRY.items()}


def skipped_layers(model: nn.Module) -> dict[int, str]:
    """Layers of ``model`` that get no LayerSlot, with the reason (recorded in
    ESSResult.meta["skipped_layers"]; never skipped silently)."""
    entry = REGISTRY.get(getattr(getattr(model, "config", None), "model_type", None))
    return entry.skipped(model) if entry is not None and entry.skipped is not None else {}


def support_table() -> str:
    """The registry as a Markdown table (docs/families.md shows it): every model type, where
    its layers are, the families they can have and how its layer kinds map to them."""
    rows = ["| model_type | layers | families | layer kinds |", "|---|---|---|---|"]
    for name in supported_model_types():
        entry = REGISTRY[name]
        rows.append(f"| {name} | `{entry.layers}` | {', '.join(entry.families)} | {entry.kinds} |")
    return "\n".join(rows) + "\n"


def supported_model_types() -> list[str]:
    return sorted(REGISTRY)


def supported_families() -> dict[str, tuple[str, ...]]:
    """Every supported model type -> the families its analysed layers can have (sorted by type)."""
    return {name: REGISTRY[name].families for name in supported_model_types()}


def layer_slots(model: nn.Module) -> list[LayerSlot]:
    """Every layer of ``model`` as a LayerSlot; ValueError for an unsupported model type."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in MODEL_TYPES:
        close = difflib.get_close_matches(str(model_type), supported_model_types(), n=3, cutoff=0.5)
        hint = f" Closest supported: {', '.join(close)}." if close else ""
        raise ValueError(
            f"model type {model_type!r} ({type(model).__name__}) is not supported.{hint} Supported model types: "
            f"{', '.join(supported_model_types())} (`ess-explorer models --families` lists their families). "
            "Model types are registered in one place, ess_explorer/capture/registry.py (REGISTRY): add the "
            "model type there."
        )
    return REGISTRY[model_type].slots(model)
