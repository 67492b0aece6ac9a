"""ess-explorer: the Effective State-Size of sequence-model layers, exact and explorable.

Data flow: model (sources) -> capture (operators per unit) -> core (spectra of H_t, ESS)
-> ESSResult -> io / views -> app (explorer, magic, CLI, report). This module only
re-exports the public API (docs/architecture.md). The Jupyter and chart parts are
imported on first use, so that the numerical API loads without Altair or ipywidgets.
"""

from . import zoo
from ._version import __version__
from .analysis import analyze
from .core.diagnostics import layer_diagnostics, modulation_at, theoretical_state_size
from .core.ess import DEFAULT_RELATIVE, DEFAULT_TOL, aggregate_units, causal_ess, entropy_ess, tolerance_ess
from .core.operators import DPLRSSM, DiagonalSSM
from .core.spectra import hankel_singular_values
from .io import ResultCache, export_table, read_result, write_result_dir
from .result import ESSResult, LayerESS
from .sources import load_model
from .verification import Verification, verify

__all__ = [
    "__version__",
    "DEFAULT_TOL",
    "DEFAULT_RELATIVE",
    "DiagonalSSM",
    "DPLRSSM",
    "hankel_singular_values",
    "tolerance_ess",
    "entropy_ess",
    "causal_ess",
    "aggregate_units",
    "theoretical_state_size",
    "layer_diagnostics",
    "modulation_at",
    "ESSResult",
    "LayerESS",
    "load_model",
    "analyze",
    "verify",
    "Verification",
    "zoo",
    "explore",
    "load_ipython_extension",
    "figure",
    "save_figure",
    "write_report",
    "export_table",
    "write_result_dir",
    "read_result",
    "ResultCache",
    "sweep",
    "run_sweep",
    "SweepResult",
    "summarize",
    "advise",
    "Advice",
    "ESSCallback",
]

# Public names whose modules pull in Altair / ipywidgets, or pandas / pyarrow (the sweep):
# imported when first used, so `import ess_explorer` stays quick (docs/benchmarks.md). These
# modules sit above this package's other layers and import nothing from here.
_LAZY = {
    "run_sweep": "sweep.run",
    "SweepResult": "sweep.run",
    "summarize": "sweep.stats",
    "advise": "sweep.advice",
    "Advice": "sweep.advice_result",
    "explore": "app.widget",
    "load_ipython_extension": "app.magic",
    "figure": "views.figures",
    "save_figure": "views.render",
    "write_report": "app.report",
    "ESSCallback": "sweep.callback",  # imports transformers' Trainer machinery
}


def __getattr__(name):
    import importlib

    if name == "sweep":  # the package (pandas, pyarrow): on first use
        return importlib.import_module(".sweep", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'ess_explorer' has no attribute {name!r}")
