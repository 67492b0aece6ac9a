"""View data of an ESSResult: the records the Vega-Lite specs read, and the tables of figures.

Pure functions of (result, `ViewState`); nothing here imports Altair (the tables of figures
are in frames.py). The linked views read
named datasets (`DATASETS`), so a change of tolerance, variant or thresholds only replaces
data: the widget recomputes `linked_data` and keeps the spec.

Conventions: 0-based t, H_t = T[t:, :t] (result.CONVENTION, docs/math.md). A "unit" is an
int (one head or channel) or an aggregate over the layer's units: "mean", "max" or "sum"
(TSS is reduced the same way, so "sum" compares total ESS with total TSS).

Sizes sent to the browser are bounded: at most MAX_SPECTRUM_K singular values per cut, an
operator of at most MAX_OPERATOR_SIDE x MAX_OPERATOR_SIDE blocks (each the max |T| inside
it), an overview of at most MAX_OVERVIEW_CELLS cells (a stride over positions above that).
What no option changes (spectrum rows, operator blocks) is cached per result.
"""

from __future__ import annotations

import dataclasses
import math
import weakref

import numpy as np

from ..core.diagnostics import MODULATION_MEASURES, attainable_ceiling, layer_diagnostics, layer_modulation
from ..core.precision import ROUNDOFF
from ..result import SAVED_SPECTRUM_K, ESSResult, LayerESS
from .labels import (
    ceiling_label,
    curve_value_label,
    family_name,
    layer_axis_title,
    layer_label,
    spectrum_count,
    tol_label,
    variant_label,
)
from .operator_blocks import MAX_OPERATOR_SIDE, focus_unit, operator_block_size, operator_data
from .state import ViewState

__all__ = [
    "DATASETS",
    "MAX_SPECTRUM_K",
    "MAX_OPERATOR_SIDE",
    "MAX_OVERVIEW_CELLS",
    "layer_at_tolerance",
    "unit_series",
    "separator_positions",
    "focus_unit",
    "default_position",
    "start_position",
    "time_data",
    "operator_data",
    "operator_block_size",
    "overview_data",
    "diagnostics_data",
    "family_name",
    "layer_label",
    "layer_axis_title",
    "reduce_units",
    "ess_of",
    "thresholds_data",
    "linked_data",
]

# What a saved result keeps is what these views draw (result.py)
MAX_SPECTRUM_K = SAVED_SPECTRUM_K
MAX_OVERVIEW_CELLS = 4000


def drawn_floor(result: ESSResult) -> tuple[float, float]:
    """(relative, absolute): a kept singular value below max(relative * sigma_1, absolute) is
    not drawn (`Accuracy.drawn_floor` of the result's contract), so what a view draws is exact
    where drawn."""
    return result.accuracy().drawn_floor()


def floor_note(result: ESSResult) -> str:
    """The words for `drawn_floor` where it hides values: '' under the exact contract."""
    relative, absolute = drawn_floor(result)
    if relative <= ROUNDOFF and absolute == 0:
        return ""
    where = f"{relative:.1e} σ1" if absolute == 0 else f"{absolute:.1e}"
    return f"not drawn below {where} ('ess')"


# Token strings treated as separators / EOS when the result's meta does not list them.
SEPARATOR_TOKENS = frozenset({"|", "<eos>", "</s>", "<|endoftext|>", "<|im_end|>", "<sep>", "[SEP]", "\n", "Ċ"})

# dataset key -> the name the specs read it under
DATASETS = {
    "time": "ess_time",  # one row per t: ESS over time, the spectrum arrays and the H_t outline
    "operator": "ess_operator",  # blocks of log10|T|
    "overview": "ess_overview",
    "diagnostics": "ess_diagnostics",
    "thresholds": "ess_thresholds",
    "labels": "ess_labels",
}


# ---------------------------------------------------------------- helpers ---------------
def reduce_units(values: np.ndarray, unit, multiplicity=None) -> np.ndarray:
    """Over units (axis 0): "mean", "max", "sum" (the layer total in scalars, sum over units
    of weight x value: the multiplicity for ESS, the state weight for TSS,
    docs/conventions.md) or one unit's row."""
    values = np.asarray(values, dtype=np.float64)
    if unit == "sum" and multiplicity is not None:
        return (np.asarray(multiplicity, dtype=np.float64)[:, None] * values).sum(0)
    if isinstance(unit, str):
        return {"mean": values.mean, "max": values.max, "sum": values.sum}[unit](axis=0)
    return values[int(unit)]


def _token(result: ESSResult, t: int) -> str:
    return result.tokens[t] if 0 <= t < len(result.tokens) else ""


def _sig(value: float, digits: int = 4) -> float | None:
    """A float with ``digits`` significant digits (smaller JSON, same picture)."""
    return float(f"{value:.{digits}g}") if np.isfinite(value) else None


# Per-result caches of what a tolerance change cannot alter (spectra rows, operator blocks),
# keyed by the result's id and checked through a weak reference (ids are reused).
_CACHE: dict = {}


def _cached(result: ESSResult, key: tuple, compute):
    full = (id(result),) + key
    hit = _CACHE.get(full)
    if hit is not None and hit[0]() is result:
        return hit[1]
    value = compute()
    if len(_CACHE) > 64:
        _CACHE.clear()
    _CACHE[full] = (weakref.ref(result), value)
    return value


# ---------------------------------------------------------------- per layer --------------
def layer_at_tolerance(
    result: ESSResult, layer: int, tol: float | None = None, relative: bool | None = None
) -> LayerESS:
    """The LayerESS with ``tolerance_ess`` recomputed at (tol, relative) from the kept
    singular values (LayerESS.tolerance_ess_at); the layer itself when they are the
    analysis settings (whose counts come from the full spectrum, so are always exact)."""
    return _at(result, ViewState.of(result, layer=layer, tol=tol, relative=relative))


def _at(result: ESSResult, state: ViewState, layer: int | None = None) -> LayerESS:
    lay = result.layer(state.layer if layer is None else layer)
    if state.same_tolerance(result):
        return lay
    ess, _ = lay.tolerance_ess_at(state.tol, state.relative, state.scope)
    return dataclasses.replace(lay, tolerance_ess=ess)


def ess_of(lay: LayerESS, variant: str) -> np.ndarray:
    return lay.ess(variant)


def _tolerance_exact(result: ESSResult, state: ViewState) -> np.ndarray:
    """(U, P) False where the tolerance-ESS shown is only a lower bound (recounted from the K
    kept values at a tolerance other than the analysis's)."""
    lay = result.layer(state.layer)
    if state.same_tolerance(result):
        return np.ones(lay.tolerance_ess.shape, bool)
    return lay.tolerance_ess_at(state.tol, state.relative, state.scope)[1]


def _series(result: ESSResult, state: ViewState) -> dict:
    lay = result.layer(state.layer)
    at = _at(result, state)
    ess = ess_of(at, state.variant)
    exact = _tolerance_exact(result, state) if state.variant == "tolerance" else np.ones(ess.shape, bool)
    return {
        "t": np.asarray(lay.positions, dtype=int),
        "ess": reduce_units(ess, state.unit, lay.multiplicity),
        "tss": reduce_units(lay.tss, state.unit, lay.state_weight),
        "ceiling": reduce_units(attainable_ceiling(lay, state.variant), state.unit, lay.multiplicity),
        "exact": exact.all(0) if isinstance(state.unit, str) else exact[int(state.unit)],
    }


def unit_series(
    result: ESSResult, layer: int, unit="mean", variant: str = "tolerance", tol=None, relative=None
) -> dict:
    """ESS, TSS and exactness of one unit (or an aggregate over units) along t.

    Returns a dict of (P,) arrays: ``t`` (positions), ``ess``, ``tss``, ``ceiling`` (the
    attainable min(TSS, t, L - t), core/diagnostics.py), ``exact`` (False
    where a recomputed tolerance count may be a lower bound; for an aggregate, False if any
    unit is)."""
    return _series(result, ViewState.of(result, layer=layer, unit=unit, variant=variant, tol=tol, relative=relative))


def separator_positions(result: ESSResult) -> list[int]:
    """Positions of separator / EOS tokens: meta["separators"] when the analysis recorded
    them, else tokens in SEPARATOR_TOKENS."""
    if result.meta.get("separators") is not None:
        return [int(t) for t in result.meta["separators"]]
    return [t for t, tok in enumerate(result.tokens) if tok.strip() in SEPARATOR_TOKENS or tok in SEPARATOR_TOKENS]


def start_position(result: ESSResult, state: ViewState) -> int:
    """The t a view opens on: ``state.t`` snapped to the nearest computed position, or the
    first t where the shown ESS peaks."""
    positions = np.asarray(result.layer(state.layer).positions)
    if not positions.size:
        return 0
    if state.t is None:
        series = _series(result, state)
        return int(series["t"][int(np.argmax(series["ess"]))])
    return int(positions[int(np.argmin(np.abs(positions - int(state.t))))])


def default_position(
    result: ESSResult, layer: int, unit="mean", variant="tolerance", tol=None, relative=None, scope=None
) -> int:
    """The t a view opens on: where the shown ESS peaks (first such t)."""
    return start_position(
        result, ViewState.of(result, layer=layer, unit=unit, variant=variant, tol=tol, relative=relative, scope=scope)
    )


# ---------------------------------------------------------------- datasets --------------
def time_data(
    result: ESSResult, *, layer: int, unit="mean", variant="tolerance", tol=None, relative=None
) -> list[dict]:
    """Rows of the "time" dataset, one per computed t: ``t``, ``token``, the shown
    ``ess``/``tss``/``ceiling`` (unit or aggregate), ``exact``, ``sep`` (separator flag) and the focus
    unit's kept spectrum: ``sigma`` (descending, at most MAX_SPECTRUM_K, round-off
    dropped; flattened in the browser), its threshold ``thr``, ``unit_tol_ess`` (with
    ``unit_exact``: False where it is a lower bound),
    ``unit_entropy_ess`` and ``complete`` (False when more values exist than were kept,
    so counts are lower bounds)."""
    return _time_rows(result, ViewState.of(result, layer=layer, unit=unit, variant=variant, tol=tol, relative=relative))


def _time_rows(result: ESSResult, state: ViewState) -> list[dict]:
    series = _series(result, state)
    at = _at(result, state)
    focus = focus_unit(result, state.layer, state.unit)
    static = _cached(result, ("time", state.layer, focus), lambda: _static_time_rows(result, state.layer, focus))
    first = np.asarray(result.layer(state.layer).singular_values[..., 0], dtype=np.float64)  # (U, P): sigma_1
    # the sigma_1 a relative tolerance refers to (core/ess.py scopes): the cut's, the unit's largest, the layer's
    sigma1 = {
        "cut": first[focus],
        "unit": np.full(first.shape[1], first[focus].max(initial=0.0)),
        "layer": np.full(first.shape[1], first.max(initial=0.0)),
    }[state.scope]
    thr = state.tol * sigma1 if state.relative else np.full(sigma1.shape, state.tol)
    tol_text = tol_label(state.tol, state.relative)
    ess, tss, exact = series["ess"].tolist(), series["tss"].tolist(), series["exact"].tolist()
    ceiling = series["ceiling"].tolist()
    unit_ess = at.tolerance_ess[focus].tolist()
    unit_exact = _tolerance_exact(result, state)[focus].tolist()
    unit_causal = at.causal_ess[focus].tolist()
    lay = result.layer(state.layer)
    return [
        {
            **row,
            "ess": _sig(ess[i]),
            "tss": _sig(tss[i]),
            "ceiling": _sig(ceiling[i]),
            "exact": bool(exact[i]),
            "thr": _sig(thr[i]) if thr[i] > 0 else None,
            "tol_label": tol_text,
            "unit_tol_ess": int(unit_ess[i]),
            "unit_exact": bool(unit_exact[i]),
            # the spectrum panel's statement: the drawn unit's count in the shown variant, and
            # for an aggregate curve the curve's own value at t (labels.py)
            "count_label": spectrum_count(
                state.variant,
                tolerance_count=int(unit_ess[i]),
                exact=bool(unit_exact[i]),
                kept=int(lay.singular_values.shape[-1]),
                drawn=len(row["sigma"]),
                complete=row["complete"],
                entropy=row["unit_entropy_ess"],
                causal=unit_causal[i],
            ),
            "curve_label": curve_value_label(state.variant, lay, state.unit, ess[i]),
        }
        for i, row in enumerate(static)
    ]


def _static_time_rows(result: ESSResult, layer: int, focus: int) -> list[dict]:
    """The parts of the time rows that no tolerance, variant or unit aggregate changes."""
    lay = result.layer(layer)
    sigma = np.asarray(lay.singular_values[focus], dtype=np.float64)[:, :MAX_SPECTRUM_K]  # (P, K')
    relative, absolute = drawn_floor(result)
    complete = (np.asarray(lay.rank_bound[focus]) <= sigma.shape[-1]).tolist()
    seps = set(separator_positions(result))
    rows = []
    for row, t in enumerate(np.asarray(lay.positions).tolist()):
        s = sigma[row]
        nonzero = int((s > max(relative * s[0], absolute)).sum()) if s[0] > 0 else 0
        rows.append(
            {
                "t": t,
                "token": _token(result, t),
                "sep": t in seps,
                # flattened in the browser; k = its position, numbered there (row_number)
                "sigma": [float(f"{v:.4g}") for v in s[:nonzero].tolist()],
                "unit_entropy_ess": _sig(lay.entropy_ess[focus, row], 3),
                "complete": bool(complete[row]),
            }
        )
    return rows


def overview_cell_stride(result: ESSResult, max_cells: int | None = None) -> int:
    """Every s-th position is drawn in the overview so that it has at most ``max_cells`` cells
    (default MAX_OVERVIEW_CELLS); not meta["overview_stride"], the analysis pass's stride."""
    max_cells = MAX_OVERVIEW_CELLS if max_cells is None else max_cells
    n_layers = max(1, len(result.layers))
    longest = max((len(lay.positions) for lay in result.layers.values()), default=1)
    return max(1, math.ceil(n_layers * longest / max_cells))


def overview_data(
    result: ESSResult,
    *,
    unit="mean",
    variant="tolerance",
    tol=None,
    relative=None,
    metric="utilisation",
    max_cells: int | None = None,
) -> list[dict]:
    """Rows of the "overview" dataset: one per (layer, shown position), with ``layer``,
    ``label``, the cell span ``t0``..``t1``, ``value`` (aggregate ESS/TSS or ESS; an int
    unit means "mean" here, a single head means nothing across layers) and ``token``."""
    unit = unit if isinstance(unit, str) else "mean"
    state = ViewState.of(result, unit=unit, variant=variant, tol=tol, relative=relative, metric=metric)
    return overview_rows(result, state, max_cells)


def overview_rows(result: ESSResult, state: ViewState, max_cells: int | None = None) -> list[dict]:
    agg = state.aggregate
    stride = overview_cell_stride(result, max_cells)
    records = []
    for index in sorted(result.layers):
        lay = _at(result, state, index)
        ess_u, tss_u = (
            reduce_units(ess_of(lay, state.variant), agg, lay.multiplicity),
            reduce_units(lay.tss, agg, lay.state_weight),
        )
        value = (
            np.divide(ess_u, tss_u, out=np.zeros_like(ess_u), where=tss_u > 0)
            if state.metric == "utilisation"
            else ess_u
        )
        pos = np.asarray(lay.positions)
        keep = np.arange(0, len(pos), stride)
        ends = np.append(pos[keep[1:]], result.length)
        label = layer_label(result, index)
        for col, end in zip(keep.tolist(), ends.tolist()):
            t0 = int(pos[col])
            records.append(
                {
                    "layer": int(index),
                    "label": label,
                    "t0": t0,
                    "t1": int(end),
                    "value": _sig(value[col]),
                    "token": _token(result, t0),
                }
            )
    return records


def diagnostics_data(
    result: ESSResult,
    *,
    variant="tolerance",
    tol=None,
    relative=None,
    saturated: float | None = None,
    collapsed: float | None = None,
) -> list[dict]:
    """Rows of the "diagnostics" dataset, one per layer: ``utilisation`` (against the
    attainable ceiling) and ``state`` from diagnostics.layer_diagnostics (ratio of peaks per
    unit, mean over units), ``tss_utilisation`` (the paper's ESS/TSS), unit counts, and
    ``modulation``: mean over separators of diagnostics.layer_modulation (tolerance-ESS at
    the reset-aware scope "unit", layer total in scalars; None when the prompt has no
    computed separator) and ``graded_modulation``, the same of the nuclear norm of the cuts."""
    extra = {k: v for k, v in (("saturated", saturated), ("collapsed", collapsed)) if v is not None}
    return diagnostics_rows(result, ViewState.of(result, variant=variant, tol=tol, relative=relative, **extra))


def diagnostics_rows(result: ESSResult, state: ViewState) -> list[dict]:
    seps = separator_positions(result)
    records = []
    for index in sorted(result.layers):
        lay = _at(result, state, index)
        diag = layer_diagnostics(lay, variant=state.variant, saturated=state.saturated, collapsed=state.collapsed)
        computed = sorted(set(seps) & set(np.asarray(lay.positions).tolist()))
        variant = state.variant if state.variant != "causal" else "tolerance"
        mods = {m: layer_modulation(result.layer(index), computed, measure=m, tol=state.tol, relative=state.relative,
                                    variant=variant) for m in MODULATION_MEASURES} if computed else {}  # fmt: skip
        means = {m: round(float(np.nanmean(v)), 4) if np.isfinite(v).any() else None for m, v in mods.items()}
        records.append(
            {
                "layer": int(index),
                "label": layer_label(result, index),
                # None (no bar, a note instead) where the variant is undefined: causal ESS of a
                # unit with no realisation is NaN (docs/conventions.md)
                "utilisation": _sig(diag["utilisation"]),
                "tss_utilisation": _sig(diag["tss_utilisation"]),
                "state": str(diag["state"]) if np.isfinite(diag["utilisation"]) else "n/a",
                "n_saturated": int(diag["n_saturated"]),
                "n_collapsed": int(diag["n_collapsed"]),
                "n_units": lay.n_units,
                "modulation": means.get("count"),
                "graded_modulation": means.get("graded"),
                "n_separators": len(computed),
            }
        )
    return records


def thresholds_data(state: ViewState) -> list[dict]:
    """Rows of the "thresholds" dataset: the two utilisation thresholds, named."""
    return [
        {"x": state.saturated, "name": f"saturated ≥ {state.saturated:g}"},
        {"x": state.collapsed, "name": f"collapsed ≤ {state.collapsed:g}"},
    ]


def linked_data(
    result: ESSResult,
    *,
    layer: int,
    unit="mean",
    variant="tolerance",
    tol=None,
    relative=None,
    saturated: float | None = None,
    collapsed: float | None = None,
    overview_metric: str = "utilisation",
    scope=None,
) -> dict:
    """Every named dataset of the linked views: {dataset name: list of records}. Cheap (no
    Altair): the widget recomputes only this when the tolerance, scope, variant or thresholds
    change."""
    extra = {k: v for k, v in (("saturated", saturated), ("collapsed", collapsed)) if v is not None}
    state = ViewState.of(
        result,
        layer=layer,
        unit=unit,
        variant=variant,
        tol=tol,
        relative=relative,
        metric=overview_metric,
        scope=scope,
        **extra,
    )
    return state_data(result, state)


def layer_datasets(result: ESSResult, state: ViewState) -> dict:
    """The datasets of `state_data` that depend on the layer: ESS over time with the spectra,
    and the operator's blocks (the others are the same for every layer of one result)."""
    focus = focus_unit(result, state.layer, state.unit)
    return {
        DATASETS["time"]: _time_rows(result, state),
        DATASETS["operator"]: _cached(
            result, ("operator", state.layer, focus), lambda: operator_data(result, layer=state.layer, unit=focus)[0]
        ),
    }


def state_data(result: ESSResult, state: ViewState) -> dict:
    """`linked_data` of an already validated state."""
    return {
        **layer_datasets(result, state),
        DATASETS["overview"]: overview_rows(result, state),
        DATASETS["diagnostics"]: diagnostics_rows(result, state),
        DATASETS["thresholds"]: thresholds_data(state),
        DATASETS["labels"]: [
            {
                "variant": variant_label(state.variant, state.tol, state.relative),
                "ceiling": ceiling_label(state.variant),
            }
        ],
    }
