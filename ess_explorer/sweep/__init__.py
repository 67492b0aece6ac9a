"""Sweeps: ESS over many prompts x models x checkpoints, locally or on a Ray cluster, with
statistics over prompts and a Trainer callback (docs/sweeps.md).

    run_sweep(models, prompts, out=DIR, backend="local" | "ray")  -> SweepResult (run.py)
    read_table(DIR)                                               the tidy table (table.py)
    summarize(table), modulation(table, token), utilisation(table)   statistics (stats.py)
    advise(table, quantile=0.99)                                  the state each layer needs (advice.py)
    ESSCallback(prompts, every_n_steps=...)                       (callback.py; needs accelerate)

The package is ``ess_explorer.sweep``; the function that runs a sweep is ``run_sweep`` (also
``ess_explorer.run_sweep``). Importing the package imports pandas and pyarrow, which
``import ess_explorer`` alone does not.
"""

from .advice import Advice, LayerAdvice, advise
from .inputs import Run, expand_models, load_prompts
from .run import SweepResult, run_sweep
from .stats import modulation, summarize, utilisation
from .table import read_metadata, read_table

__all__ = [
    "run_sweep",
    "SweepResult",
    "Run",
    "expand_models",
    "load_prompts",
    "read_table",
    "read_metadata",
    "summarize",
    "modulation",
    "utilisation",
    "advise",
    "Advice",
    "LayerAdvice",
]
