"""The options of a view, validated once: `ViewState`.

Every view of an ESSResult is drawn for one choice of layer, unit (an index or an aggregate
over the layer's units), ESS variant, tolerance (``tol`` with ``relative``), selected
position ``t`` and the two utilisation thresholds. `ViewState.of` checks all of them
against the result in one place and fills the defaults from the analysis settings
(``result.meta["tol"]``, ``result.meta["relative"]``); the data and spec builders then take a
`ViewState` and check nothing again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..core.diagnostics import COLLAPSED_AT, SATURATED_AT
from ..core.ess import DEFAULT_SCOPE, check_scope, check_variant
from ..options import AGGREGATES, METRICS, VARIANTS, check_choice
from ..result import ESSResult, LayerESS

__all__ = ["AGGREGATES", "VARIANTS", "METRICS", "ViewState", "check_result", "tol_options"]


def check_result(result) -> ESSResult:
    """``result`` itself when it is an ESSResult with at least one analysed layer."""
    if not isinstance(result, ESSResult):
        raise ValueError(f"expected an ESSResult (from ess_explorer.analyze), got {type(result).__name__}")
    if not result.layers:
        raise ValueError("the result has no analysed layers; analyse at least one layer")
    return result


def tol_options(result: ESSResult, tol=None, relative=None) -> tuple[float, bool]:
    """(tol, relative) with the analysis settings as defaults; tol finite and >= 0."""
    tol = float(result.meta.get("tol", 1e-3)) if tol is None else float(tol)
    relative = bool(result.meta.get("relative", True)) if relative is None else bool(relative)
    if not math.isfinite(tol) or tol < 0:
        raise ValueError(f"tol must be a finite non-negative number, got {tol}")
    return tol, relative


def _check_unit(lay: LayerESS, layer: int, unit):
    if isinstance(unit, str):
        if unit not in AGGREGATES:
            raise ValueError(f"unit must be a unit index or one of {AGGREGATES}, got {unit!r}")
        return unit
    if isinstance(unit, (int, np.integer)) and not isinstance(unit, bool):
        if not 0 <= unit < lay.n_units:
            raise ValueError(
                f"unit {unit} is out of range: layer {layer} has {lay.n_units} {lay.unit_kind}s (0..{lay.n_units - 1})"
            )
        return int(unit)
    raise ValueError(f"unit must be an int or one of {AGGREGATES}, got {unit!r}")


@dataclass(frozen=True)
class ViewState:
    """The validated options of one view of one result.

    layer: an analysed layer index. unit: a unit index of that layer or "mean" | "max" |
    "sum" (TSS is reduced the same way). variant: "tolerance" | "entropy". tol, relative:
    the tolerance of tolerance-ESS (relative: tol * sigma_1). t: the requested position or
    None (the view opens where the shown ESS peaks). saturated, collapsed: utilisation
    thresholds, 0 <= collapsed < saturated. metric: what the overview shows, ESS/TSS
    ("utilisation") or ESS. scope: which sigma_1 a relative tolerance refers to ("cut",
    "unit" or "layer", core/ess.py; "cut" for an absolute tolerance).
    """

    layer: int
    unit: int | str = "mean"
    variant: str = "tolerance"
    tol: float = 1e-3
    relative: bool = True
    t: int | None = None
    saturated: float = SATURATED_AT
    collapsed: float = COLLAPSED_AT
    metric: str = "utilisation"
    scope: str = "cut"

    @classmethod
    def of(
        cls,
        result: ESSResult,
        *,
        layer: int | None = None,
        unit="mean",
        variant: str = "tolerance",
        tol=None,
        relative=None,
        t: int | None = None,
        saturated: float = SATURATED_AT,
        collapsed: float = COLLAPSED_AT,
        metric: str = "utilisation",
        scope: str | None = None,
    ) -> "ViewState":
        """Check every option against ``result`` (the one place that does) and fill defaults:
        layer None is the first analysed layer, tol/relative/scope None the analysis settings."""
        check_result(result)
        layer = min(result.layers) if layer is None else layer
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or int(layer) not in result.layers:
            raise ValueError(f"layer {layer} was not analysed; choose one of {sorted(result.layers)}")
        layer = int(layer)
        unit = _check_unit(result.layers[layer], layer, unit)
        check_variant(variant)
        tol, relative = tol_options(result, tol, relative)
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, np.integer))):
            raise ValueError(f"t must be an integer position or None, got {t!r}")
        saturated, collapsed = float(saturated), float(collapsed)
        if not 0 <= collapsed < saturated:
            raise ValueError(f"need 0 <= collapsed < saturated, got collapsed={collapsed}, saturated={saturated}")
        check_choice("metric", metric, METRICS)
        scope = str(result.meta.get("scope", DEFAULT_SCOPE)) if scope is None else scope
        scope = scope if relative else "cut"  # an absolute tolerance has no reference sigma_1
        check_scope(scope, relative)
        return cls(
            layer, unit, variant, tol, relative, None if t is None else int(t), saturated, collapsed, metric, scope
        )

    def with_(self, **changes) -> "ViewState":
        """A copy with some fields changed (the caller has checked them: e.g. a layer of the
        same result taken from a click)."""
        return replace(self, **changes)

    @property
    def aggregate(self) -> str:
        """The unit as an aggregate over units: an index means "mean" where a single unit
        means nothing (across layers)."""
        return self.unit if isinstance(self.unit, str) else "mean"

    def same_tolerance(self, result: ESSResult) -> bool:
        """True when (tol, relative, scope) are the analysis settings (counts from the full spectrum)."""
        analysed_scope = str(result.meta.get("scope", DEFAULT_SCOPE)) if self.relative else "cut"
        return (
            math.isclose(self.tol, float(result.meta.get("tol", math.nan)), rel_tol=1e-12)
            and self.relative == bool(result.meta.get("relative", True))
            and self.scope == analysed_scope
        )
