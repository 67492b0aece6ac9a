"""ess-explorer: the Effective State-Size of sequence-model layers, exact and explorable.

Data flow: model -> adapters (operators per unit) -> spectra of H_t -> ESSResult ->
charts, widget, export, CLI. This module re-exports the public API; the Jupyter side
(explore, the %ess magic) is imported on first use so that the core loads without it.
"""

__version__ = "0.1.0"

from .analysis import analyze
from .diagnostics import layer_diagnostics, modulation_at, theoretical_state_size
from .ess import DEFAULT_RELATIVE, DEFAULT_TOL, aggregate_units, entropy_ess, hankel_singular_values, tolerance_ess
from .models import load_model
from .realizations import DiagonalSSM
from .result import ESSResult, LayerESS

__all__ = [
    "__version__",
    "DEFAULT_TOL",
    "DEFAULT_RELATIVE",
    "DiagonalSSM",
    "hankel_singular_values",
    "tolerance_ess",
    "entropy_ess",
    "aggregate_units",
    "theoretical_state_size",
    "layer_diagnostics",
    "modulation_at",
    "ESSResult",
    "LayerESS",
    "load_model",
    "analyze",
    "explore",
    "load_ipython_extension",
    "figure",
    "save_figure",
    "write_report",
    "export_table",
    "write_result_dir",
    "read_result",
    "ResultCache",
]

# name -> module, imported on first use: these pull in Altair / ipywidgets.
_LAZY = {
    "explore": "widget",
    "load_ipython_extension": "magic",
    "figure": "figures",
    "save_figure": "figures",
    "write_report": "export",
    "export_table": "export",
    "write_result_dir": "export",
    "read_result": "export",
    "ResultCache": "cache",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'ess_explorer' has no attribute {name!r}")
