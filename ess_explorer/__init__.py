"""ess-explorer: the Effective State-Size of sequence-model layers, exact and explorable.

Data flow: model -> adapters (operators per unit) -> spectra of H_t -> ESS result ->
charts, widget, export, CLI. This module re-exports the public API.
"""

__version__ = "0.1.0"

from .ess import DEFAULT_RELATIVE, DEFAULT_TOL, aggregate_units, entropy_ess, hankel_singular_values, tolerance_ess
from .realizations import DiagonalSSM

__all__ = [
    "__version__",
    "DEFAULT_TOL",
    "DEFAULT_RELATIVE",
    "DiagonalSSM",
    "hankel_singular_values",
    "tolerance_ess",
    "entropy_ess",
    "aggregate_units",
]
