"""The built-in zoo: tiny models trained on multi-query associative recall (MQAR).

    from ess_explorer import zoo
    zoo.list_models()                 # names of the shipped models
    zoo.model_dir("mamba2_n16")       # Path of its Hugging Face folder (config, safetensors, tokenizer)
    zoo.card("mamba2_n16")            # its card.json: task, training, held-out accuracy, TSS, ESS, ESS/kv
    zoo.evaluate("mamba2_n16", n_samples=256)   # recompute held-out accuracy
    zoo.sweep_difficulty("mamba2_n16")          # accuracy and ESS/kv at K = 2..32 (the card's rows)

Weights live in ``assets/zoo/NAME/`` at the repository root (override with the
ESS_EXPLORER_ZOO_DIR environment variable). Importing this package registers the
project's own linear-attention family (``model_type = "ess_linear_attention"``) with
transformers' Auto classes, so every folder loads with ``AutoModelForCausalLM``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import modeling  # noqa: F401  (registers model_type "ess_linear_attention")

__all__ = ["ZOO_DIR", "DEFAULT_MODEL", "list_models", "model_dir", "card", "load", "task_of", "evaluate", "sweep_difficulty"]

ZOO_DIR = Path(os.environ.get("ESS_EXPLORER_ZOO_DIR", Path(__file__).resolve().parents[2] / "assets" / "zoo"))

# The explorer's default: Mamba2 (2 layers x 8 heads, state 16 per head) loads in ~0.4 s and
# analyses a 32-token prompt in ~0.1 s; its heads use their state differently (ESS at the
# memory cut ranges from 2 to 12 of 16), rising through the pairs and falling in the queries.
# Held-out accuracy 0.65: it answers most typed queries, not all. lfm2 (0.99) is the accurate one.
DEFAULT_MODEL = "mamba2_n16"


def list_models() -> list[str]:
    """Names of the zoo models present on disk (folders with a config.json), sorted."""
    if not ZOO_DIR.is_dir():
        return []
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "config.json").is_file())


def model_dir(name: str) -> Path:
    """The folder of zoo model ``name`` (loadable with from_pretrained, offline)."""
    folder = ZOO_DIR / str(name)
    if not (folder / "config.json").is_file():
        raise ValueError(f"no zoo model named {name!r} in {ZOO_DIR}; available: {', '.join(list_models()) or 'none'}")
    return folder


def card(name: str) -> dict:
    """The model card (card.json) of a zoo model."""
    path = model_dir(name) / "card.json"
    if not path.is_file():
        raise ValueError(f"zoo model {name!r} has no card.json yet; write it with `python -m ess_explorer.zoo.train --cards-only --only {name}`")
    return json.loads(path.read_text())


def task_of(name: str):
    """The MQARTask the model was trained on (from training.json)."""
    from .mqar import MQARTask

    record = json.loads((model_dir(name) / "training.json").read_text())
    return MQARTask.from_dict(record["task"])


def load(name: str):
    """(model, tokenizer) of a zoo model, in eval mode, float32, loaded offline."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = model_dir(name)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return model, tokenizer


def evaluate(name: str, n_samples: int = 1024, seed: int | None = None) -> dict:
    """Recompute held-out exact-match accuracy of a zoo model on its own task.

    Default seed: the held-out test seed of the cards (10_000). With n_samples equal to the
    card's (1024) the number is the card's exactly; a smaller n_samples draws a different
    (smaller) held-out sample, so it agrees within sampling error.
    """
    from .mqar import evaluate_model
    from .train import TEST_SEED

    model, _ = load(name)
    return evaluate_model(model, task_of(name), n_samples=n_samples, seed=TEST_SEED if seed is None else seed)


def sweep_difficulty(name: str, ks=None, *, n_samples: int | None = None, n_prompts: int | None = None,
                     untrained: bool = False, cached: bool = True) -> list[dict]:
    """Accuracy and state at the memory cut of zoo model ``name`` as the number of pairs K grows.

    Each K runs ``task_of(name).with_pairs(K)`` (same length, queries fill the rest) on held-out
    prompts: one dict per K with pairs, accuracy, ess, entropy_ess, tss (totals in scalars at the
    memory cut t* = 2K), ess_per_kv, entropy_ess_per_kv, tss_per_kv, utilisation, cut, length.
    ks: default the card's (cards.sweep_pairs: 2..32 at 128 tokens). ``untrained=True`` measures the
    untrained copy (same architecture and seed). With ``cached`` and the card's settings, the
    card's rows come back at once; otherwise they are measured (seconds per K).
    Draw them with ``ess_explorer.views.difficulty_figure({name: rows})``.
    """
    from .cards import SWEEP_SAMPLES, _untrained, sweep_pairs
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
    model = _untrained(name) if untrained else load(name)[0]
    if model is None:
        raise ValueError(f"{name!r} has no zoo spec to rebuild an untrained copy from")
    return sweep(model, task, ks, n_samples=n_samples, n_prompts=n_prompts)
