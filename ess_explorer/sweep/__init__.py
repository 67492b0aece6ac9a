"""Sweeps: ESS over many prompts x models x checkpoints, locally or on a Ray cluster, with
statistics over prompts and a Trainer callback (docs/sweeps.md).

    sweep(models, prompts, out=DIR, backend="local" | "ray")   -> SweepResult (run.py)
    read_table(DIR)                                             the tidy table (table.py)
    summarize(table), modulation(table, token), utilisation(table)   statistics (stats.py)
    ESSCallback(prompts, every_n_steps=...)                     (callback.py; needs accelerate)
"""

from .inputs import Run, expand_models, load_prompts
from .run import SweepResult, sweep
from .stats import modulation, summarize, utilisation
from .table import read_metadata, read_table

__all__ = [
    "sweep",
    "SweepResult",
    "Run",
    "expand_models",
    "load_prompts",
    "read_table",
    "read_metadata",
    "summarize",
    "modulation",
    "utilisation",
]
