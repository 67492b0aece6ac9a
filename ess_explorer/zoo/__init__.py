"""The built-in zoo: tiny models trained on multi-query associative recall (MQAR).

    from ess_explorer import zoo
    zoo.list_models()                 # names of the shipped models
    zoo.model_dir("mamba2_n16")       # Path of its Hugging Face folder (config, safetensors, tokenizer)
    zoo.card("mamba2_n16")            # its card.json: task, training, held-out accuracy, TSS, ESS, ESS/kv
    zoo.evaluate("mamba2_n16", n_samples=256)   # recompute held-out accuracy

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

__all__ = ["ZOO_DIR", "DEFAULT_MODEL", "list_models", "model_dir", "card", "load", "task_of", "evaluate"]

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
