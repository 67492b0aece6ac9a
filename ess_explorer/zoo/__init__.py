"""The built-in zoo: tiny models trained on multi-query associative recall (MQAR).

    from ess_explorer import zoo
    zoo.list_models()                 # names of the shipped models
    zoo.model_dir("mamba2_n16")       # Path of its Hugging Face folder (config, safetensors, tokenizer)
    zoo.card("mamba2_n16")            # its card.json: task, training, held-out accuracy, TSS, ESS, ESS/kv
    zoo.evaluate("mamba2_n16", n_samples=256)   # recompute held-out accuracy

Weights ship inside the package, in ``ess_explorer/zoo/assets/NAME/`` (override with the
ESS_EXPLORER_ZOO_DIR environment variable); the catalogue functions live in sources.py
(the one place that resolves "zoo:NAME"). The project's own linear-attention family
(``model_type = "ess_linear_attention"``) is registered by architectures.py.
"""

from __future__ import annotations

import json

from ..sources import DEFAULT_MODEL, ZOO_DIR, card, list_models, load_model, model_dir

__all__ = ["ZOO_DIR", "DEFAULT_MODEL", "list_models", "model_dir", "card", "load", "task_of", "evaluate"]


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
    from .train import TEST_SEED

    model, _ = load(name)
    return evaluate_model(model, task_of(name), n_samples=n_samples, seed=TEST_SEED if seed is None else seed)
