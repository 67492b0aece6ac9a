"""The explorer's charts under one name: view data (data.py) and Vega-Lite specs (specs.py,
linked.py).

A thin module kept so that callers (the widget, the report, notebooks) reach every view
builder and its data as ``charts.<name>``; the code lives in state.py (options, validated
once), data.py (records), params.py (param names and colours), specs.py
(the five views) and linked.py (the five in one linked spec).
"""

from __future__ import annotations

from .data import (
    DATASETS,
    MAX_OPERATOR_SIDE,
    MAX_OVERVIEW_CELLS,
    MAX_SPECTRUM_K,
    ROUNDOFF,
    SEPARATOR_TOKENS,
    default_position,
    diagnostics_data,
    focus_unit,
    layer_at_tolerance,
    linked_data,
    operator_data,
    overview_data,
    separator_positions,
    time_data,
    unit_series,
)
from .linked import linked_structure, linked_views
from .params import CONVENTION_SHORT, ESS_COLOR, SELECT_COLOR, SEP_COLOR, STATE_COLORS, TSS_COLOR, ViewNames
from .specs import diagnostics_chart, ess_over_time, operator_heatmap, overview, spectrum
from .state import AGGREGATES, VARIANTS, ViewState

__all__ = [
    "AGGREGATES",
    "VARIANTS",
    "DATASETS",
    "MAX_SPECTRUM_K",
    "MAX_OPERATOR_SIDE",
    "MAX_OVERVIEW_CELLS",
    "ROUNDOFF",
    "SEPARATOR_TOKENS",
    "CONVENTION_SHORT",
    "ESS_COLOR",
    "TSS_COLOR",
    "SEP_COLOR",
    "SELECT_COLOR",
    "STATE_COLORS",
    "ViewNames",
    "ViewState",
    "ess_over_time",
    "spectrum",
    "operator_heatmap",
    "overview",
    "diagnostics_chart",
    "linked_structure",
    "linked_views",
    "linked_data",
    "time_data",
    "operator_data",
    "overview_data",
    "diagnostics_data",
    "layer_at_tolerance",
    "unit_series",
    "separator_positions",
    "focus_unit",
    "default_position",
]
