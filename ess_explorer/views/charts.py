"""ESSResult -> Altair charts: pure functions, no widgets, no model.

Every builder takes an `ESSResult` (see result.py) and returns an Altair chart; the widget,
the exporters and the CLI all draw the same specs. The five views:

    ess_over_time     ESS per position t (tokens on hover), TSS drawn with it, separators marked
    spectrum          sigma_k(H_t) at the selected t, log scale, tolerance as a rule, count stated
    operator_heatmap  log10 |T| of one unit, H_t = T[t:, :t] outlined (block-downsampled when large)
    overview          layer x position heatmap of ESS/TSS (or ESS); a click selects a layer
    diagnostics_chart per-layer utilisation with saturation/collapse thresholds, modulation at separators

`linked_views` puts them in ONE top-level spec whose Vega-Lite params link them in the
browser: selecting t on the ESS-over-time chart moves the spectrum and the H_t outline with
no call into Python. Param names carry a per-call prefix so several explorers in one
notebook never share a signal.

Conventions: 0-based t, H_t = T[t:, :t] (result.CONVENTION). A "unit" is an int (one head
or channel) or an aggregate over the layer's units: "mean", "max" or "sum" (TSS is reduced
the same way, so "sum" compares total ESS with total TSS).

Sizes sent to the browser are bounded: at most MAX_SPECTRUM_K singular values per cut,
an operator of at most MAX_OPERATOR_SIDE x MAX_OPERATOR_SIDE blocks, an overview of at most
MAX_OVERVIEW_CELLS cells (a stride over positions, stated in the title, above that).
"""

from __future__ import annotations

import dataclasses
import math
import uuid
import weakref
from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd

from ..core.diagnostics import COLLAPSED_AT, SATURATED_AT, layer_diagnostics, layer_modulation
from ..result import ESSResult, LayerESS

__all__ = [
    "AGGREGATES",
    "VARIANTS",
    "ViewNames",
    "ess_over_time",
    "spectrum",
    "operator_heatmap",
    "overview",
    "diagnostics_chart",
    "linked_views",
    "layer_at_tolerance",
    "unit_series",
    "separator_positions",
    "focus_unit",
    "default_position",
]

AGGREGATES = ("mean", "max", "sum")
VARIANTS = ("tolerance", "entropy")
MAX_SPECTRUM_K = 64
MAX_OPERATOR_SIDE = 64
MAX_OVERVIEW_CELLS = 4000
# Singular values below this fraction of sigma_1 are float64 round-off, not signal: not drawn.
ROUNDOFF = 1e-13
# Token strings treated as separators / EOS when the result's meta does not list them.
SEPARATOR_TOKENS = frozenset({"|", "<eos>", "</s>", "<|endoftext|>", "<|im_end|>", "<sep>", "[SEP]", "\n", "Ċ"})

ESS_COLOR = "#1f6fb4"
TSS_COLOR = "#8a8f98"
SEP_COLOR = "#e07b00"
SELECT_COLOR = "#d62728"
STATE_COLORS = {"saturated": "#d62728", "normal": "#4c9a5b", "collapsed": "#7b5ea7"}


# ---------------------------------------------------------------- names and checks ----
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


def _check_options(result: ESSResult, layer: int, unit, variant: str) -> LayerESS:
    if not isinstance(result, ESSResult):
        raise ValueError(f"expected an ESSResult (from ess_explorer.analyze), got {type(result).__name__}")
    if layer not in result.layers:
        raise ValueError(f"layer {layer} was not analysed; choose one of {sorted(result.layers)}")
    lay = result.layers[layer]
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if isinstance(unit, str):
        if unit not in AGGREGATES:
            raise ValueError(f"unit must be a unit index or one of {AGGREGATES}, got {unit!r}")
    elif isinstance(unit, (int, np.integer)) and not isinstance(unit, bool):
        if not 0 <= unit < lay.n_units:
            raise ValueError(f"unit {unit} is out of range: layer {layer} has {lay.n_units} {lay.unit_kind}s (0..{lay.n_units - 1})")
    else:
        raise ValueError(f"unit must be an int or one of {AGGREGATES}, got {unit!r}")
    return lay


def _tol_options(result: ESSResult, tol, relative) -> tuple[float, bool]:
    tol = float(result.meta.get("tol", 1e-3)) if tol is None else float(tol)
    relative = bool(result.meta.get("relative", True)) if relative is None else bool(relative)
    if not math.isfinite(tol) or tol < 0:
        raise ValueError(f"tol must be a finite non-negative number, got {tol}")
    return tol, relative


# ---------------------------------------------------------------- data helpers --------
def layer_at_tolerance(result: ESSResult, layer: int, tol: float | None = None, relative: bool | None = None) -> LayerESS:
    """The LayerESS with ``tolerance_ess`` recomputed at (tol, relative) from the kept
    singular values (LayerESS.tolerance_ess_at); the layer itself when they are the
    analysis settings (whose counts come from the full spectrum, so are always exact)."""
    tol, relative = _tol_options(result, tol, relative)
    lay = result.layer(layer)
    same = math.isclose(tol, float(result.meta.get("tol", math.nan)), rel_tol=1e-12) and relative == bool(
        result.meta.get("relative", True)
    )
    if same:
        return lay
    ess, _ = lay.tolerance_ess_at(tol, relative, _scope(result, relative))
    return dataclasses.replace(lay, tolerance_ess=ess)


def _scope(result: ESSResult, relative: bool) -> str:
    """The analysis' tolerance scope for a recount (an absolute tolerance has none)."""
    return str(result.meta.get("scope", "cut")) if relative else "cut"


def _exact_mask(result: ESSResult, lay: LayerESS, tol: float, relative: bool) -> np.ndarray:
    """(U, P) bool: False where the tolerance count is only a lower bound (K values kept)."""
    if math.isclose(tol, float(result.meta.get("tol", math.nan)), rel_tol=1e-12) and relative == bool(result.meta.get("relative", True)):
        return np.ones(lay.tolerance_ess.shape, dtype=bool)
    return lay.tolerance_ess_at(tol, relative, _scope(result, relative))[1]


def _reduce(values: np.ndarray, unit) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    if isinstance(unit, str):
        return {"mean": values.mean, "max": values.max, "sum": values.sum}[unit](axis=0)
    return values[int(unit)]


def unit_series(result: ESSResult, layer: int, unit="mean", variant: str = "tolerance", tol=None, relative=None) -> dict:
    """ESS, TSS and exactness of one unit (or an aggregate over units) along t.

    Returns a dict of (P,) arrays: ``t`` (positions), ``ess``, ``tss``, ``exact`` (False
    where a recomputed tolerance count may be a lower bound; for an aggregate, False if any
    unit is)."""
    lay = _check_options(result, layer, unit, variant)
    tol, relative = _tol_options(result, tol, relative)
    at = layer_at_tolerance(result, layer, tol, relative)
    ess = at.tolerance_ess if variant == "tolerance" else at.entropy_ess
    exact = _exact_mask(result, lay, tol, relative) if variant == "tolerance" else np.ones(ess.shape, bool)
    return {
        "t": np.asarray(lay.positions, dtype=int),
        "ess": _reduce(ess, unit),
        "tss": _reduce(lay.tss, unit),
        "exact": exact.all(0) if isinstance(unit, str) else exact[int(unit)],
    }


def separator_positions(result: ESSResult) -> list[int]:
    """Positions of separator / EOS tokens: meta["separators"] when the analysis recorded
    them, else tokens in SEPARATOR_TOKENS."""
    if result.meta.get("separators") is not None:
        return [int(t) for t in result.meta["separators"]]
    return [t for t, tok in enumerate(result.tokens) if tok.strip() in SEPARATOR_TOKENS or tok in SEPARATOR_TOKENS]


def focus_unit(result: ESSResult, layer: int, unit="mean") -> int:
    """The single unit whose spectrum and operator are shown: ``unit`` itself when it is an
    index; for an aggregate, the first unit whose operator was kept (else unit 0)."""
    if not isinstance(unit, str):
        return int(unit)
    ops = result.layer(layer).operators
    return min(ops) if ops else 0


def default_position(result: ESSResult, layer: int, unit="mean", variant="tolerance", tol=None, relative=None) -> int:
    """The t a view opens on: where the shown ESS peaks (first such t)."""
    series = unit_series(result, layer, unit, variant, tol, relative)
    return int(series["t"][int(np.argmax(series["ess"]))]) if len(series["t"]) else 0


def _token(result: ESSResult, t: int) -> str:
    return result.tokens[t] if 0 <= t < len(result.tokens) else ""


def _sig(value: float, digits: int = 4) -> float | None:
    """A float with ``digits`` significant digits (smaller JSON, same picture)."""
    return float(f"{value:.{digits}g}") if np.isfinite(value) else None


def _unit_label(lay: LayerESS, unit) -> str:
    return f"{unit} over {lay.n_units} {lay.unit_kind}s" if isinstance(unit, str) else f"{lay.unit_kind} {unit}"


def _tol_label(tol: float, relative: bool) -> str:
    return f"τ = {tol:g}·σ₁" if relative else f"τ = {tol:g}"


def _variant_label(variant: str, tol: float, relative: bool) -> str:
    return f"tolerance-ESS ({_tol_label(tol, relative)})" if variant == "tolerance" else "entropy-ESS"


# ---------------------------------------------------------------- datasets --------------
# The views read named datasets, so a change of tolerance / variant / thresholds only
# replaces the data of a spec whose structure (and param names) stay the same.
DATASETS = {
    "time": "ess_time",  # one row per t: views 1, 2 (spectrum arrays) and 3 (the outline)
    "operator": "ess_operator",  # blocks of log10|T|
    "overview": "ess_overview",
    "diagnostics": "ess_diagnostics",
    "thresholds": "ess_thresholds",
    "labels": "ess_labels",
}


def _named(key: str) -> alt.NamedData:
    return alt.NamedData(name=DATASETS[key])


def time_data(result: ESSResult, *, layer: int, unit="mean", variant="tolerance", tol=None, relative=None) -> list[dict]:
    """Rows of the "time" dataset, one per computed t: ``t``, ``token``, the shown
    ``ess``/``tss`` (unit or aggregate), ``exact``, ``sep`` (separator flag) and the focus
    unit's kept spectrum: ``sigma`` (descending, at most MAX_SPECTRUM_K, round-off
    dropped; flattened in the browser), its threshold ``thr``, ``unit_tol_ess``,
    ``unit_entropy_ess`` and ``complete`` (False when more values exist than were kept,
    so counts are lower bounds)."""
    _check_options(result, layer, unit, variant)
    tol, relative = _tol_options(result, tol, relative)
    series = unit_series(result, layer, unit, variant, tol, relative)
    at = layer_at_tolerance(result, layer, tol, relative)
    focus = focus_unit(result, layer, unit)
    static = _cached(result, ("time", layer, focus), lambda: _static_time_rows(result, layer, focus))
    sigma1 = np.asarray(result.layer(layer).singular_values[focus, :, 0], dtype=np.float64)
    thr = tol * sigma1 if relative else np.full(sigma1.shape, tol)
    tol_text = _tol_label(tol, relative)
    ess, tss, exact = series["ess"].tolist(), series["tss"].tolist(), series["exact"].tolist()
    unit_ess = at.tolerance_ess[focus].tolist()
    return [
        {
            **row,
            "ess": _sig(ess[i]),
            "tss": _sig(tss[i]),
            "exact": bool(exact[i]),
            "thr": _sig(thr[i]) if thr[i] > 0 else None,
            "tol_label": tol_text,
            "unit_tol_ess": int(unit_ess[i]),
        }
        for i, row in enumerate(static)
    ]


def _static_time_rows(result: ESSResult, layer: int, focus: int) -> list[dict]:
    """The parts of the time rows that no tolerance, variant or unit aggregate changes."""
    lay = result.layer(layer)
    sigma = np.asarray(lay.singular_values[focus], dtype=np.float64)[:, :MAX_SPECTRUM_K]  # (P, K')
    complete = (np.asarray(lay.rank_bound[focus]) <= sigma.shape[-1]).tolist()
    seps = set(separator_positions(result))
    rows = []
    for row, t in enumerate(np.asarray(lay.positions).tolist()):
        s = sigma[row]
        nonzero = int((s > ROUNDOFF * s[0]).sum()) if s[0] > 0 else 0
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


def operator_data(result: ESSResult, *, layer: int, unit="mean", max_side: int = MAX_OPERATOR_SIDE) -> tuple[list[dict], int]:
    """Rows of the "operator" dataset for the focus unit, and the block size b.

    T (L x L) is cut into b x b blocks, b = ceil(L / max_side); each lower-triangular block
    holds ``logabs`` = log10 of the largest |T| inside it (a thin band such as a short conv
    stays visible) and ``rel`` = logabs minus the largest (colour domain [-6, 0]). Blocks
    below 1e-8 of the peak are left out. Empty when the unit's T was not kept."""
    lay = result.layer(layer)
    focus = focus_unit(result, layer, unit)
    if focus not in lay.operators:
        return [], 1
    op = np.abs(np.asarray(lay.operators[focus], dtype=np.float64))
    length = op.shape[0]
    size = max(1, math.ceil(length / max_side))
    n = math.ceil(length / size)
    pad = np.zeros((n * size, n * size))
    pad[:length, :length] = op
    blocks = pad.reshape(n, size, n, size).max(axis=(1, 3))
    peak = blocks.max()
    if peak <= 0:
        return [], size
    bi, bj = np.nonzero(np.tril(blocks > peak * 1e-8))
    logabs = np.log10(blocks[bi, bj])
    top = float(np.log10(peak))
    records = [
        {"i0": int(i) * size, "i1": min((int(i) + 1) * size, length), "j0": int(j) * size, "j1": min((int(j) + 1) * size, length),
         "logabs": round(float(v), 3), "rel": round(float(v) - top, 3)}
        for i, j, v in zip(bi.tolist(), bj.tolist(), logabs.tolist())
    ]
    return records, size


def _overview_stride(result: ESSResult, max_cells: int) -> int:
    n_layers = max(1, len(result.layers))
    longest = max((len(lay.positions) for lay in result.layers.values()), default=1)
    return max(1, math.ceil(n_layers * longest / max_cells))


def overview_data(result: ESSResult, *, unit="mean", variant="tolerance", tol=None, relative=None, metric="utilisation",
                  max_cells: int | None = None) -> list[dict]:
    """Rows of the "overview" dataset: one per (layer, shown position), with ``layer``,
    ``label``, the cell span ``t0``..``t1``, ``value`` (aggregate ESS/TSS or ESS; an int
    unit means "mean" here, a single head means nothing across layers) and ``token``."""
    if metric not in ("utilisation", "ess"):
        raise ValueError(f"metric must be 'utilisation' or 'ess', got {metric!r}")
    tol, relative = _tol_options(result, tol, relative)
    agg = unit if isinstance(unit, str) else "mean"
    stride = _overview_stride(result, MAX_OVERVIEW_CELLS if max_cells is None else max_cells)
    records = []
    for index in sorted(result.layers):
        lay = layer_at_tolerance(result, index, tol, relative)
        ess = lay.tolerance_ess if variant == "tolerance" else lay.entropy_ess
        ess_u, tss_u = _reduce(ess, agg), _reduce(lay.tss, agg)
        value = np.divide(ess_u, tss_u, out=np.zeros_like(ess_u), where=tss_u > 0) if metric == "utilisation" else ess_u
        pos = np.asarray(lay.positions)
        keep = np.arange(0, len(pos), stride)
        ends = np.append(pos[keep[1:]], result.length)
        label = f"{index} · {lay.family}"
        for col, end in zip(keep.tolist(), ends.tolist()):
            t0 = int(pos[col])
            records.append({"layer": int(index), "label": label, "t0": t0, "t1": int(end), "value": _sig(value[col]),
                            "token": _token(result, t0)})
    return records


def diagnostics_data(result: ESSResult, *, variant="tolerance", tol=None, relative=None, saturated: float = SATURATED_AT,
                     collapsed: float = COLLAPSED_AT) -> list[dict]:
    """Rows of the "diagnostics" dataset, one per layer: ``utilisation`` and ``state`` from
    diagnostics.layer_diagnostics (ratio of peaks per unit, mean over units), unit counts, and
    ``modulation``: mean over separators of diagnostics.layer_modulation (tolerance-ESS at
    the reset-aware scope "unit", layer total in scalars; None when the prompt has no
    computed separator)."""
    tol, relative = _tol_options(result, tol, relative)
    seps = separator_positions(result)
    records = []
    for index in sorted(result.layers):
        lay = layer_at_tolerance(result, index, tol, relative)
        diag = layer_diagnostics(lay, variant=variant, saturated=saturated, collapsed=collapsed)
        computed = sorted(set(seps) & set(np.asarray(lay.positions).tolist()))
        mod = (layer_modulation(result.layer(index), computed, tol=tol, relative=relative, variant=variant)
               if computed else np.zeros(0))
        finite = mod[np.isfinite(mod)]
        records.append(
            {
                "layer": int(index),
                "label": f"{index} · {lay.family}",
                "utilisation": round(float(diag["utilisation"]), 4),
                "state": str(diag["state"]),
                "n_saturated": int(diag["n_saturated"]),
                "n_collapsed": int(diag["n_collapsed"]),
                "n_units": lay.n_units,
                "modulation": round(float(finite.mean()), 4) if finite.size else None,
                "n_separators": len(computed),
            }
        )
    return records


def linked_data(result: ESSResult, *, layer: int, unit="mean", variant="tolerance", tol=None, relative=None,
                saturated: float = SATURATED_AT, collapsed: float = COLLAPSED_AT, overview_metric: str = "utilisation") -> dict:
    """Every named dataset of `linked_views`: {dataset name: list of records}. Cheap (no
    Altair): the widget recomputes only this when the tolerance, variant or thresholds change."""
    _check_options(result, layer, unit, variant)
    tol, relative = _tol_options(result, tol, relative)
    classify_check = 0 <= collapsed < saturated
    if not classify_check:
        raise ValueError(f"need 0 <= collapsed < saturated, got collapsed={collapsed}, saturated={saturated}")
    return {
        DATASETS["time"]: time_data(result, layer=layer, unit=unit, variant=variant, tol=tol, relative=relative),
        DATASETS["operator"]: _cached(result, ("operator", layer, focus_unit(result, layer, unit)),
                                      lambda: operator_data(result, layer=layer, unit=unit)[0]),
        DATASETS["overview"]: overview_data(result, unit=unit, variant=variant, tol=tol, relative=relative, metric=overview_metric),
        DATASETS["diagnostics"]: diagnostics_data(result, variant=variant, tol=tol, relative=relative, saturated=saturated,
                                                  collapsed=collapsed),
        DATASETS["thresholds"]: [{"x": saturated, "name": f"saturated ≥ {saturated:g}"},
                                 {"x": collapsed, "name": f"collapsed ≤ {collapsed:g}"}],
        DATASETS["labels"]: [{"variant": _variant_label(variant, tol, relative)}],
    }


# ---------------------------------------------------------------- params ---------------
def _t_selection(names: ViewNames, t0: int):
    # clear=False: the spectrum always has a t to show; nearest: a click anywhere picks the closest t.
    return alt.selection_point(name=names.t, fields=["t"], on="click", nearest=True, clear=False, value=[{"t": int(t0)}])


def _hover_selection(names: ViewNames):
    return alt.selection_point(name=names.hover, fields=["t"], on="pointerover", nearest=True, clear="pointerout", empty=False)


def _layer_selection(names: ViewNames, layer: int):
    return alt.selection_point(name=names.layer, fields=["layer"], on="click", clear=False, value=[{"layer": int(layer)}])


def _standalone(chart, data: dict, keys):
    """Attach the datasets a view reads, so a single view is a complete spec."""
    return chart.properties(datasets={DATASETS[k]: data[DATASETS[k]] for k in keys})


def _data_for(result, layer, unit, variant, tol, relative, **kw) -> dict:
    return linked_data(result, layer=layer, unit=unit, variant=variant, tol=tol, relative=relative, **kw)


def _start_t(result, layer, unit, variant, tol, relative, t) -> int:
    """The t a view opens on: ``t`` snapped to the nearest computed position, or the ESS peak."""
    positions = np.asarray(result.layer(layer).positions)
    if t is None:
        return default_position(result, layer, unit, variant, tol, relative)
    return int(positions[int(np.argmin(np.abs(positions - int(t))))]) if positions.size else 0


# ---------------------------------------------------------------- view 1 --------------
def _ess_over_time_view(result, layer, unit, names, t0, width=720, height=190):
    lay = result.layer(layer)
    sel_t, hover = _t_selection(names, t0), _hover_selection(names)
    x = alt.X("t:Q", title="position t", scale=alt.Scale(domain=[0, max(result.length - 1, 1)], nice=False))
    base = alt.Chart(_named("time"))
    series = base.transform_fold(["ess", "tss"], as_=["series", "value"]).transform_calculate(
        series="datum.series === 'ess' ? 'ESS' : 'TSS (capacity)'"
    )
    domain = ["ESS", "TSS (capacity)"]
    lines = series.mark_line(strokeWidth=2).encode(
        x=x,
        y=alt.Y("value:Q", title="state size"),
        color=alt.Color("series:N", scale=alt.Scale(domain=domain, range=[ESS_COLOR, TSS_COLOR]),
                        legend=alt.Legend(orient="none", legendX=0, legendY=-20, title=None, direction="horizontal")),
        strokeDash=alt.StrokeDash("series:N", scale=alt.Scale(domain=domain, range=[[1, 0], [5, 3]]), legend=None),
    )
    points = (
        base.mark_point(filled=True)
        .encode(
            x=x,
            y="ess:Q",
            color=alt.condition(sel_t, alt.value(SELECT_COLOR), alt.value(ESS_COLOR)),
            opacity=alt.condition("datum.exact", alt.value(0.9), alt.value(0.35)),  # faint: a lower bound
            size=alt.condition(sel_t, alt.value(110), alt.value(22)),
            # numbers only: Vega-Lite's nearest (voronoi) layer drops nominal tooltip fields; the
            # hovered token is drawn as text at the top of the plot instead
            tooltip=[alt.Tooltip("t:Q", title="t"), alt.Tooltip("ess:Q", title="ESS", format=".3~f"),
                     alt.Tooltip("tss:Q", title="TSS", format=".3~f")],
        )
        .add_params(sel_t, hover)
    )
    seps = base.transform_filter("datum.sep").mark_rule(color=SEP_COLOR, strokeDash=[3, 2], strokeWidth=1.5).encode(
        x=x, tooltip=[alt.Tooltip("t:Q"), alt.Tooltip("token:N", title="separator")]
    )
    hover_rule = base.transform_filter(hover).mark_rule(color="#555", strokeWidth=1).encode(x=x)
    hover_text = base.transform_filter(hover).mark_text(
        align="left", dx=6, fontSize=13, fontWeight="bold", color="#333").encode(x=x, y=alt.value(10), text="token:N")
    selected_rule = base.transform_filter(sel_t).mark_rule(color=SELECT_COLOR, strokeWidth=2).encode(x=x)
    selected_text = base.transform_filter(sel_t).transform_calculate(
        label="'t = ' + datum.t + ' \u201c' + datum.token + '\u201d'").mark_text(
        align="left", dx=6, dy=14, fontSize=11, color=SELECT_COLOR).encode(x=x, y=alt.value(10), text="label:N")
    variant = alt.Chart(_named("labels")).mark_text(align="right", fontSize=12, color=ESS_COLOR, fontWeight="bold").encode(
        x=alt.value(width), y=alt.value(-8), text="variant:N")
    stride = result.meta.get("stride")
    subtitle = (f"layer {layer} ({lay.family}), {_unit_label(lay, unit)} · click to select t · hover for the token · "
                "orange: separators" + (f" · computed at stride {stride}" if stride and stride > 1 else ""))
    return alt.layer(lines, seps, hover_rule, selected_rule, points, hover_text, selected_text, variant).properties(
        width=width, height=height, title=alt.Title("ESS over time", subtitle=subtitle, anchor="start", offset=28)
    )


def ess_over_time(result: ESSResult, *, layer: int, unit="mean", variant: str = "tolerance", tol=None, relative=None,
                  t: int | None = None, names: ViewNames | None = None) -> alt.LayerChart:
    """ESS(t) of the chosen unit or aggregate with TSS(t) dashed and separators as orange
    rules. Hover shows the token; a click selects t (param ``names.t``, a point selection
    on field "t", initially ``t`` or the ESS peak). Faint points are lower bounds (a
    recomputed tolerance count that reached the number of kept values)."""
    _check_options(result, layer, unit, variant)
    tol, relative = _tol_options(result, tol, relative)
    names = names or ViewNames.fresh()
    t0 = _start_t(result, layer, unit, variant, tol, relative, t)
    data = _data_for(result, layer, unit, variant, tol, relative)
    return _standalone(_ess_over_time_view(result, layer, unit, names, t0), data, ("time", "labels"))


# ---------------------------------------------------------------- view 2 --------------
def _spectrum_view(result, layer, unit, names, t0, width=360, height=230):
    lay = result.layer(layer)
    sel_t = _t_selection(names, t0)
    base = alt.Chart(_named("time")).transform_filter(sel_t)
    flat = base.transform_flatten(["sigma"]).transform_window(k="row_number()").transform_filter(
        "datum.sigma > 0").transform_calculate(
        above="datum.thr != null && datum.sigma > datum.thr ? 'above τ' : 'below τ'"
    )
    kmax = max(1, min(MAX_SPECTRUM_K, int(lay.singular_values.shape[-1])))
    x = alt.X("k:Q", title="k (σ in descending order)", scale=alt.Scale(domain=[0.5, kmax + 0.5], nice=False),
              axis=alt.Axis(tickMinStep=1, format="d"))
    y = alt.Y("sigma:Q", title="σₖ(Hₜ)", scale=alt.Scale(type="log"))
    line = flat.mark_line(strokeWidth=1.2, color="#9aa3ad").encode(x=x, y=y, order="k:Q")
    dots = flat.mark_circle(size=48, opacity=1).encode(
        x=x, y=y,
        color=alt.Color("above:N", scale=alt.Scale(domain=["above τ", "below τ"], range=[ESS_COLOR, "#b8bec7"]),
                        legend=alt.Legend(orient="top-right", title=None)),
        tooltip=[alt.Tooltip("k:Q"), alt.Tooltip("sigma:Q", title="σ", format=".4~e"), alt.Tooltip("above:N")],
    )
    rule = base.transform_filter("datum.thr != null").mark_rule(color=SELECT_COLOR, strokeDash=[6, 3], strokeWidth=1.5).encode(
        y="thr:Q", tooltip=[alt.Tooltip("thr:Q", title="τ", format=".3~e"), alt.Tooltip("tol_label:N", title="tolerance")])
    # The count above the rule, stated: it comes from the data, so a new tolerance needs no new spec.
    label = base.transform_calculate(
        label=("'t = ' + datum.t + ' \u201c' + datum.token + '\u201d:  ' + datum.unit_tol_ess + ' of ' + "
               "(datum.complete ? '' : '\u2265') + length(datum.sigma) + ' σ above ' + datum.tol_label + "
               "'  ·  entropy-ESS ' + format(datum.unit_entropy_ess, '.3~f')")
    ).mark_text(align="left", baseline="bottom", fontSize=12, fontWeight="bold", color="#222").encode(
        x=alt.value(0), y=alt.value(-6), text="label:N")
    focus = focus_unit(result, layer, unit)
    sub = f"{lay.unit_kind} {focus}" + (" (shown for the aggregate)" if isinstance(unit, str) else "") + " · red dashed: τ"
    if lay.singular_values.shape[-1] > kmax or (lay.rank_bound[focus] > kmax).any():
        sub += f" · top {kmax} kept"
    return alt.layer(line, dots, rule, label).properties(
        width=width, height=height,
        title=alt.Title("Singular values of Hₜ = T[t:, :t]", subtitle=sub, anchor="start", offset=24),
    )


def spectrum(result: ESSResult, *, layer: int, unit="mean", variant: str = "tolerance", tol=None, relative=None,
             t: int | None = None, names: ViewNames | None = None) -> alt.LayerChart:
    """Kept singular values sigma_k(H_t) of the focus unit (see `focus_unit`) at the
    selected t on a log scale, the tolerance as a dashed rule, and the count above it
    stated. Standalone it carries its own t param (initially ``t``); inside
    `linked_views` it follows the click on ESS over time."""
    _check_options(result, layer, unit, variant)
    tol, relative = _tol_options(result, tol, relative)
    names = names or ViewNames.fresh()
    t0 = _start_t(result, layer, unit, variant, tol, relative, t)
    chart = _spectrum_view(result, layer, unit, names, t0).add_params(_t_selection(names, t0))
    return _standalone(chart, _data_for(result, layer, unit, variant, tol, relative), ("time",))


# ---------------------------------------------------------------- view 3 --------------
def _operator_view(result, layer, unit, names, t0, size=270):
    lay = result.layer(layer)
    focus = focus_unit(result, layer, unit)
    sel_t = _t_selection(names, t0)
    length = result.length
    if focus not in lay.operators:
        msg = f"T of {lay.unit_kind} {focus} was not kept by the analysis"
        note = alt.Chart(alt.InlineData(values=[{"msg": msg}])).mark_text(fontSize=12, color="#666").encode(text="msg:N")
        return note.properties(width=size, height=size, title=alt.Title("Operator T", anchor="start"))
    block = max(1, math.ceil(length / MAX_OPERATOR_SIDE))
    scale_x = alt.Scale(domain=[0, length], nice=False, zero=True)
    scale_y = alt.Scale(domain=[0, length], nice=False, zero=True, reverse=True)  # row 0 on top, as a matrix
    heat = alt.Chart(_named("operator")).mark_rect().encode(
        x=alt.X("j0:Q", title="input position j", scale=scale_x), x2="j1:Q",
        y=alt.Y("i0:Q", title="output position i", scale=scale_y), y2="i1:Q",
        color=alt.Color("rel:Q", title=["log₁₀|T|", "rel. to max"], scale=alt.Scale(scheme="viridis", domain=[-6, 0], clamp=True),
                        legend=alt.Legend(orient="right", gradientLength=110)),
        tooltip=[alt.Tooltip("i0:Q", title="row i"), alt.Tooltip("j0:Q", title="column j"),
                 alt.Tooltip("logabs:Q", title="log₁₀ max|T|")],
    )
    outline = (
        alt.Chart(_named("time"))
        .transform_filter(sel_t)
        .transform_calculate(zero="0", end=str(length))
        .mark_rect(fill=None, stroke=SELECT_COLOR, strokeWidth=2.5)
        .encode(x=alt.X("zero:Q", scale=scale_x), x2="t:Q", y=alt.Y("t:Q", scale=scale_y), y2="end:Q")
    )
    sub = f"{lay.unit_kind} {focus} · red box: Hₜ = T[t:, :t]"
    if block > 1:
        sub += f" · {block}×{block} blocks (max |T|)"
    return alt.layer(heat, outline).properties(
        width=size, height=size, title=alt.Title("Operator T", subtitle=sub, anchor="start"))


def operator_heatmap(result: ESSResult, *, layer: int, unit="mean", variant: str = "tolerance", tol=None, relative=None,
                     t: int | None = None, names: ViewNames | None = None) -> alt.LayerChart:
    """log10 |T| of the focus unit (rows i = outputs, columns j = inputs, row 0 on top)
    with H_t = T[t:, :t] outlined at the selected t. An operator longer than
    MAX_OPERATOR_SIDE is sent as max-|T| blocks (stated in the subtitle), never L^2 cells.
    A unit whose T was not kept shows a note instead."""
    _check_options(result, layer, unit, variant)
    tol, relative = _tol_options(result, tol, relative)
    names = names or ViewNames.fresh()
    t0 = _start_t(result, layer, unit, variant, tol, relative, t)
    chart = _operator_view(result, layer, unit, names, t0).add_params(_t_selection(names, t0))
    return _standalone(chart, _data_for(result, layer, unit, variant, tol, relative), ("time", "operator"))


# ---------------------------------------------------------------- view 4 --------------
def _overview_view(result, layer, unit, metric, names, width=360):
    sel_layer = _layer_selection(names, layer)
    agg = unit if isinstance(unit, str) else "mean"
    what = "ESS/TSS" if metric == "utilisation" else "ESS"
    scale = alt.Scale(scheme="blues", domain=[0, 1], clamp=True) if metric == "utilisation" else alt.Scale(scheme="blues")
    stride = _overview_stride(result, MAX_OVERVIEW_CELLS)
    notes = ["click a row to select a layer"]
    if stride > 1:
        notes.append(f"shown at stride {stride}")
    overview_stride = result.meta.get("overview_stride")
    analysis_stride = result.meta.get("stride")
    if overview_stride and overview_stride > 1:
        notes.append(f"layers computed at stride {overview_stride}, the selected layer exactly")
    elif analysis_stride and analysis_stride > 1:
        notes.append(f"computed at stride {analysis_stride}")
    return (
        alt.Chart(_named("overview"))
        .mark_rect()
        .encode(
            x=alt.X("t0:Q", title="position t", scale=alt.Scale(domain=[0, result.length], nice=False)),
            x2="t1:Q",
            y=alt.Y("label:N", title=None, sort=alt.EncodingSortField("layer", order="ascending")),
            color=alt.Color("value:Q", title=what, scale=scale, legend=alt.Legend(gradientLength=80)),
            stroke=alt.condition(sel_layer, alt.value(SELECT_COLOR), alt.value(None)),
            strokeWidth=alt.condition(sel_layer, alt.value(0.8), alt.value(0)),
            tooltip=[alt.Tooltip("label:N", title="layer"), alt.Tooltip("t0:Q", title="t"), alt.Tooltip("token:N"),
                     alt.Tooltip("value:Q", title=what, format=".3~f")],
        )
        .add_params(sel_layer)
        .properties(width=width, height=alt.Step(22),
                    title=alt.Title(f"Overview: {what} per layer ({agg} over units)", subtitle=" · ".join(notes), anchor="start"))
    )


def overview(result: ESSResult, *, layer: int | None = None, unit="mean", variant: str = "tolerance", tol=None,
             relative=None, metric: str = "utilisation", names: ViewNames | None = None) -> alt.Chart:
    """Layer x position heatmap of the aggregate ESS/TSS (metric="utilisation") or ESS
    (metric="ess"). A click on a row selects the layer (param ``names.layer``, a point
    selection on field "layer"); the selected row is outlined. Above MAX_OVERVIEW_CELLS
    cells every s-th position is shown and the subtitle says so."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if metric not in ("utilisation", "ess"):
        raise ValueError(f"metric must be 'utilisation' or 'ess', got {metric!r}")
    tol, relative = _tol_options(result, tol, relative)
    names = names or ViewNames.fresh()
    layer = min(result.layers) if layer is None else layer
    data = {DATASETS["overview"]: overview_data(result, unit=unit, variant=variant, tol=tol, relative=relative, metric=metric)}
    return _standalone(_overview_view(result, layer, unit, metric, names), data, ("overview",))


# ---------------------------------------------------------------- view 5 --------------
def _diagnostics_view(layer, names):
    highlight = _layer_selection(names, layer)  # the overview's selection, referenced by name
    data = alt.Chart(_named("diagnostics"))
    y = alt.Y("label:N", title=None, sort=alt.EncodingSortField("layer", order="ascending"))
    bars = data.mark_bar(height={"band": 0.72}).encode(
        x=alt.X("utilisation:Q", title="utilisation (max ESS / max TSS)", scale=alt.Scale(domain=[0, 1])),
        y=y,
        color=alt.Color("state:N", scale=alt.Scale(domain=list(STATE_COLORS), range=list(STATE_COLORS.values())),
                        legend=alt.Legend(orient="bottom", title=None)),
        opacity=alt.condition(highlight, alt.value(1.0), alt.value(0.45)),
        tooltip=[alt.Tooltip("label:N", title="layer"), alt.Tooltip("utilisation:Q", format=".3f"), alt.Tooltip("state:N"),
                 alt.Tooltip("n_saturated:Q", title="saturated units"), alt.Tooltip("n_collapsed:Q", title="collapsed units"),
                 alt.Tooltip("n_units:Q", title="units")],
    )
    thresholds = alt.Chart(_named("thresholds"))
    rules = thresholds.mark_rule(strokeDash=[4, 3], color="#444").encode(x="x:Q")
    # the upper threshold's name to its left, the lower one's to its right: both stay inside
    upper = thresholds.transform_filter("datum.x >= 0.5").mark_text(
        align="right", dx=-3, dy=-4, fontSize=10, color="#444", baseline="bottom").encode(x="x:Q", y=alt.value(0), text="name:N")
    lower = thresholds.transform_filter("datum.x < 0.5").mark_text(
        align="left", dx=3, dy=-4, fontSize=10, color="#444", baseline="bottom").encode(x="x:Q", y=alt.value(0), text="name:N")
    util = alt.layer(bars, rules, upper, lower).properties(
        width=220, height=alt.Step(22),
        title=alt.Title("Utilisation per layer", subtitle="peak ESS / peak TSS per unit, mean over units", anchor="start",
                        offset=16))
    y_mod = alt.Y("label:N", title=None, sort=alt.EncodingSortField("layer", order="ascending"), axis=alt.Axis(labels=False))
    mod = data.transform_filter("datum.modulation != null").mark_bar(height={"band": 0.72}, color=SEP_COLOR).encode(
        x=alt.X("modulation:Q", title="modulation at separators", scale=alt.Scale(domain=[-0.5, 1], clamp=True)),
        y=y_mod,
        opacity=alt.condition(highlight, alt.value(1.0), alt.value(0.45)),
        tooltip=[alt.Tooltip("label:N", title="layer"), alt.Tooltip("modulation:Q", format=".3f"),
                 alt.Tooltip("n_separators:Q", title="separators")],
    )
    none = data.transform_filter("datum.n_separators == 0").mark_text(align="left", fontSize=10, color="#777").encode(
        x=alt.value(4), y=y_mod, text=alt.value("no separator in the prompt"))
    mod = alt.layer(mod, none).properties(
        width=130, height=alt.Step(22),
        title=alt.Title("Modulation", subtitle="1 − ESS(sep) / ESS before", anchor="start", offset=16))
    return alt.hconcat(util, mod, spacing=8)


def diagnostics_chart(result: ESSResult, *, layer: int | None = None, variant: str = "tolerance", tol=None, relative=None,
                      saturated: float = SATURATED_AT, collapsed: float = COLLAPSED_AT,
                      names: ViewNames | None = None) -> alt.HConcatChart:
    """Per layer: utilisation (diagnostics.layer_diagnostics: per unit the ratio of the
    peaks over t, max ESS / max TSS; mean over units) coloured saturated / normal / collapsed with both thresholds drawn and named, and
    the mean modulation at separators (diagnostics.layer_modulation, reset-aware). Standalone, the layer
    ``layer`` is highlighted with a fixed selection of the same name as the overview's."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    tol, relative = _tol_options(result, tol, relative)
    names = names or ViewNames.fresh()
    layer = min(result.layers) if layer is None else layer
    data = {
        DATASETS["diagnostics"]: diagnostics_data(result, variant=variant, tol=tol, relative=relative, saturated=saturated,
                                                  collapsed=collapsed),
        DATASETS["thresholds"]: [{"x": saturated, "name": f"saturated ≥ {saturated:g}"},
                                 {"x": collapsed, "name": f"collapsed ≤ {collapsed:g}"}],
    }
    chart = _diagnostics_view(layer, names)
    # the highlight references names.layer: define it here (no overview to define it)
    chart = alt.hconcat(*[c.add_params(_layer_selection(names, layer)) if i == 0 else c for i, c in enumerate(chart.hconcat)],
                        spacing=8)
    return _standalone(chart, data, ("diagnostics", "thresholds"))


# ---------------------------------------------------------------- all linked ----------
def linked_structure(result: ESSResult, *, layer: int, unit="mean", t: int, names: ViewNames,
                     overview_metric: str = "utilisation"):
    """The five views in one top-level chart that reads the named datasets of
    `linked_data` but carries none: the widget pairs it with data it can replace."""
    lay = _check_options(result, layer, unit, "tolerance")
    del lay
    top = _ess_over_time_view(result, layer, unit, names, t)
    spec = _spectrum_view(result, layer, unit, names, t)
    op = _operator_view(result, layer, unit, names, t)
    ov = _overview_view(result, layer, unit, overview_metric, names)
    diag = _diagnostics_view(layer, names)
    model = result.meta.get("source") or result.meta.get("model_id") or ""
    return alt.vconcat(
        top,
        alt.hconcat(spec, op, spacing=50),
        alt.hconcat(ov, diag, spacing=24),
        spacing=26,
    ).properties(
        title=alt.Title(f"Effective state size · {model}" if model else "Effective state size",
                        subtitle=f"{result.length} tokens · {len(result.layers)} layers analysed · {CONVENTION_SHORT}",
                        anchor="start", fontSize=15)
    ).configure_view(stroke=None).configure_axis(gridOpacity=0.35, labelFontSize=11, titleFontSize=11).configure_title(
        subtitleColor="#555", subtitleFontSize=11)


CONVENTION_SHORT = "0-based t, Hₜ = T[t:, :t]"


def linked_views(
    result: ESSResult,
    *,
    layer: int,
    unit="mean",
    variant: str = "tolerance",
    tol=None,
    relative=None,
    saturated: float = SATURATED_AT,
    collapsed: float = COLLAPSED_AT,
    t: int | None = None,
    names: ViewNames | None = None,
    overview_metric: str = "utilisation",
):
    """The five views in one top-level spec with its data (for alt.JupyterChart or a
    standalone HTML).

    Params (names from ``names``; fresh unique ones by default, so several charts in one
    notebook never share a signal): ``names.t`` (point on "t", set by a click on ESS over
    time; the spectrum and the H_t outline follow it in the browser), ``names.hover``
    (hover, browser only) and ``names.layer`` (point on "layer", set by a click on the
    overview; the widget answers by showing that layer)."""
    _check_options(result, layer, unit, variant)
    tol, relative = _tol_options(result, tol, relative)
    names = names or ViewNames.fresh()
    t0 = _start_t(result, layer, unit, variant, tol, relative, t)
    data = linked_data(result, layer=layer, unit=unit, variant=variant, tol=tol, relative=relative, saturated=saturated,
                       collapsed=collapsed, overview_metric=overview_metric)
    return linked_structure(result, layer=layer, unit=unit, t=t0, names=names, overview_metric=overview_metric).properties(
        datasets=data)
