"""Names, colours and Vega-Lite params shared by the explorer's views (specs.py, linked.py).

Param names carry a per-instance prefix (`ViewNames`) so several explorers in one notebook
never share a signal; the selections here are the only params the views declare.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import altair as alt

from .data import DATASETS
from .labels import unit_label

__all__ = ["ViewNames", "t_selection", "hover_selection", "layer_selection", "standalone", "named", "unit_label"]

ESS_COLOR = "#1f6fb4"
TSS_COLOR = "#8a8f98"
SEP_COLOR = "#e07b00"
SELECT_COLOR = "#d62728"
STATE_COLORS = {"saturated": "#d62728", "normal": "#4c9a5b", "collapsed": "#7b5ea7"}
CONVENTION_SHORT = "0-based t, Hₜ = T[t:, :t]"


@dataclass(frozen=True)
class ViewNames:
    """Vega-Lite param names of one linked view; unique per instance via ``prefix``."""

    prefix: str

    @classmethod
    def fresh(cls) -> "ViewNames":
        return cls("ess" + uuid.uuid4().hex[:8])

    @property
    def t(self) -> str:  # the selected position (click on ESS over time)
        return f"{self.prefix}_t"

    @property
    def hover(self) -> str:  # the hovered position (browser only)
        return f"{self.prefix}_hover"

    @property
    def layer(self) -> str:  # the selected layer (click on the overview)
        return f"{self.prefix}_layer"


def named(key: str) -> alt.NamedData:
    return alt.NamedData(name=DATASETS[key])


# ---------------------------------------------------------------- params ---------------
def t_selection(names: ViewNames, t0: int):
    # clear=False: the spectrum always has a t to show; nearest: a click anywhere picks the closest t.
    return alt.selection_point(
        name=names.t, fields=["t"], on="click", nearest=True, clear=False, value=[{"t": int(t0)}]
    )


def hover_selection(names: ViewNames):
    return alt.selection_point(
        name=names.hover, fields=["t"], on="pointerover", nearest=True, clear="pointerout", empty=False
    )


def layer_selection(names: ViewNames, layer: int):
    return alt.selection_point(
        name=names.layer, fields=["layer"], on="click", clear=False, value=[{"layer": int(layer)}]
    )


def standalone(chart, data: dict, keys):
    """Attach the datasets a view reads, so a single view is a complete spec."""
    return chart.properties(datasets={DATASETS[k]: data[DATASETS[k]] for k in keys})
