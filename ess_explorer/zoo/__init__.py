"""The built-in zoo: tiny models trained on multi-query associative recall (MQAR).

    from ess_explorer import zoo
    zoo.list_models()                 # names of the shipped models
    zoo.model_dir("mamba2_n16")       # Path of its Hugging Face folder (config, safetensors, tokenizer)
    zoo.card("mamba2_n16")            # its card.json: task, training, held-out accuracy, TSS, ESS, ESS/kv
    zoo.read_card("mamba2_n16")       # the same as a typed record (ModelCard): the stable way to read it
    zoo.evaluate("mamba2_n16", n_samples=256)   # recompute held-out accuracy
    zoo.sweep_difficulty("mamba2_n16")          # accuracy and ESS/kv at K = 2..32 (the card's rows)

Weights ship inside the package, in ``ess_explorer/zoo/assets/NAME/`` (override with the
ESS_EXPLORER_ZOO_DIR environment variable); the catalogue functions live in sources.py
(the one place that resolves "zoo:NAME"). The project's own linear-attention family
(``model_type = "ess_linear_attention"``) is registered by architectures.py.
"""

from __future__ import annotations

import json

from ..sources import DEFAULT_MODEL, ZOO_DIR, card, list_models, load_model, model_dir
from .card_record import CardLayer, ModelCard, read_card

__all__ = [
    "ZOO_DIR",
    "DEFAULT_MODEL",
    "list_models",
    "model_dir",
    "card",
    "read_card",
    "ModelCard",
    "CardLayer",
    "load",
    "task_of",
    "evaluate",
    "sweep_difficulty",
]


def task_of(name: str):
    """The MQARTask the model was trained on (from training.json)."""
    from .mqar import MQARTask

    record = json.loads((model_dir(name) / "training.json").read_text())
    return MQARTask.from_dict(record["task"])


def load(name: str):
    """(model, tokenizer) of a zoo model, in eval mode, float32, offline; through
    `load_model` (safetensors only, like every other source)."""
    return load_model(f"zoo:{name}")


def evaluate(name: str, n_samples: int = 1024, seed: int | None = None) -> dict:
    """Recompute held-out exact-match accuracy of a zoo model on its own task.

    Default seed: the held-out test seed of the cards (10_000). With n_samples equal to the
    card's (1024) the number is the card's exactly; a smaller n_samples draws a different
    (smaller) held-out sample, so it agrees within sampling error.
    """
    from .mqar import evaluate_model
    from .specs import TEST_SEED

    model, _ = load(name)
    return evaluate_model(model, task_of(name), n_samples=n_samples, seed=TEST_SEED if seed is None else seed)


def sweep_difficulty(
    name: str,
    ks=None,
    *,
    n_samples: int | None = None,
    n_prompts: int | None = None,
    untrained: bool = False,
    cached: bool = True,
) -> list[dict]:
    """Accuracy and state at the memory cut of zoo model ``name`` as the number of pairs K grows.

    Each K runs ``task_of(name).with_pairs(K)`` (same length, queries fill the rest) on held-out
    prompts: one dict per K with pairs, accuracy, ess, entropy_ess, tss (totals in scalars at the
    memory cut t* = 2K), ess_per_kv, entropy_ess_per_kv, tss_per_kv, utilisation, cut, length, and
    the same over time (the claim's reading): ess_mean, ess_max, entropy_ess_mean, ..., tss_max and
    their _per_kv (largest layer total in scalars, mean / max over the cuts t = 1..L-1).
    ks: default the card's (cards.sweep_pairs: 2..32 at 128 tokens). ``untrained=True`` measures the
    untrained copy (same architecture and seed). With ``cached`` and the card's settings, the
    card's rows come back at once; otherwise they are measured (seconds per K).
    Draw them with ``ess_explorer.views.difficulty.difficulty_figure({name: rows})``.
    """
    from .cards import SWEEP_SAMPLES, sweep_pairs, untrained_copy
    from .measure import ESS_PROMPTS, sweep

    task = task_of(name)
    ks = tuple(int(k) for k in (ks if ks is not None else sweep_pairs(task)))
    n_samples = SWEEP_SAMPLES if n_samples is None else int(n_samples)
    n_prompts = ESS_PROMPTS if n_prompts is None else int(n_prompts)
    info = card(name) if (model_dir(name) / "card.json").is_file() else {}
    stored = (info.get("untrained", {}).get("sweep") if untrained else info.get("sweep", {}).get("rows")) or []
    by_k = {r["pairs"]: r for r in stored}
    if cached and n_samples == SWEEP_SAMPLES and n_prompts == ESS_PROMPTS and all(k in by_k for k in ks):
        return [dict(by_k[k]) for k in ks]
    model = untrained_copy(name) if untrained else load(name)[0]
    if model is None:
        raise ValueError(f"{name!r} has no zoo spec to rebuild an untrained copy from")
    return sweep(model, task, ks, n_samples=n_samples, n_prompts=n_prompts)
