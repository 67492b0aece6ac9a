"""Sweeps: ESS over many prompts x models x checkpoints, locally or on a Ray cluster, with
statistics over prompts and a Trainer callback (docs/sweeps.md).

    sweep(models, prompts, out=DIR, backend="local" | "ray")   -> SweepResult (run.py)
    read_table(DIR)                                             the tidy table (table.py)
    summarize(table), modulation(table, token), utilisation(table)   statistics (stats.py)
    advise(table, quantile=0.99)                                the state each layer needs (advice.py)
    ESSCallback(prompts, every_n_steps=...)                     (callback.py; needs accelerate)

``ess_explorer.sweep`` is this package and is also callable: ``ess_explorer.sweep(models,
prompts, out=...)`` is ``sweep.sweep(...)``. Binding the function over the package name
instead would break ``ess_explorer.sweep.read_table`` and ``import ess_explorer.sweep.stats``.
"""

import inspect as _inspect
import sys as _sys
import types as _types

from .advice import Advice, LayerAdvice, advise
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
    "advise",
    "Advice",
    "LayerAdvice",
]


class _CallableModule(_types.ModuleType):
    def __call__(self, *args, **kwargs) -> SweepResult:
        return sweep(*args, **kwargs)


__signature__ = _inspect.signature(sweep)  # what inspect / Jupyter show for ess_explorer.sweep(...)
_sys.modules[__name__].__class__ = _CallableModule
