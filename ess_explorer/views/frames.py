"""Tables for figures: pandas frames of one or several labelled ESSResults.

`series_of` names the results (labels given, or each model's short name), `ess_over_time_frame`
is the long table of ESS and TSS over t per (model, layer), `layer_summary_frame` the
utilisation per layer and per unit (core.diagnostics.layer_diagnostics).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..core.diagnostics import attainable_ceiling, layer_diagnostics
from ..result import ESSResult
from .data import ess_of, family_name, reduce_units
from .state import VARIANTS, ViewState, check_result

__all__ = [
    "series_of",
    "default_label",
    "analysed_layers",
    "ess_over_time_frame",
    "layer_summary_frame",
    "envelope",
    "spread",
    "FIGURE_ROWS",
]

# Rows one figure sends to Vega: below Altair's limit of 5,000, and more than a line drawn
# across a 504 pt column can show.
FIGURE_ROWS = 4500


def series_of(result_or_results) -> list[tuple[str, ESSResult]]:
    """[(label, result)] from one ESSResult, a list of them, or a {label: result} dict;
    repeated labels are numbered."""
    if isinstance(result_or_results, ESSResult):
        items = [(None, result_or_results)]
    elif isinstance(result_or_results, dict):
        items = list(result_or_results.items())
    elif isinstance(result_or_results, (list, tuple)):
        items = [(None, r) for r in result_or_results]
    else:
        raise ValueError(
            f"figure needs an ESSResult, a list of them or a {{label: ESSResult}} dict, got {type(result_or_results).__name__}"
        )
    if not items:
        raise ValueError("figure needs at least one ESSResult")
    out, seen = [], {}
    for label, res in items:
        if not isinstance(res, ESSResult):
            raise ValueError(f"every item must be an ESSResult, got {type(res).__name__}")
        check_result(res)
        label = str(label) if label is not None else default_label(res)
        seen[label] = seen.get(label, 0) + 1
        out.append((label if seen[label] == 1 else f"{label} ({seen[label]})", res))
    return out


def default_label(result: ESSResult) -> str:
    """A short series name: the CLI's source ("zoo:mamba2_n16") or the model id, a local
    folder by its name rather than its full path."""
    name = str(result.meta.get("source") or result.meta.get("model_id") or "model")
    return Path(name).name if name.startswith(("/", "./", "../", "~")) else name


def analysed_layers(result: ESSResult, layers) -> list[int]:
    """``layers`` (an int, a list, or None = all) checked against the analysed layers."""
    if layers is None:
        return sorted(result.layers)
    layers = [layers] if isinstance(layers, (int, np.integer)) else list(layers)
    missing = [i for i in layers if i not in result.layers]
    if missing:
        raise ValueError(f"layers {missing} were not analysed; analysed layers: {sorted(result.layers)}")
    return [int(i) for i in layers]


def ess_over_time_frame(result_or_results, *, layers=None, variant="tolerance", unit="mean") -> pd.DataFrame:
    """Long table for ESS-over-time plots: columns model, layer, family, series, t, token,
    ess, tss, ceiling (ESS, TSS and the attainable min(TSS, t, L - t) reduced over units by ``unit``: "mean", "sum" (the total in scalars,
    sum over units of multiplicity x ESS, of state weight x TSS: docs/conventions.md) or "max"). variant "causal"
    plots the causal ESS (core/causal.py)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {list(VARIANTS)}, got {variant!r}")
    if unit not in ("mean", "sum", "max"):
        raise ValueError(f"unit must be one of ['mean', 'sum', 'max'], got {unit!r}")
    rows = []
    for label, res in series_of(result_or_results):
        for i in analysed_layers(res, layers):
            lay = res.layer(i)
            t = np.asarray(lay.positions)
            rows.append(
                pd.DataFrame(
                    {
                        "model": label,
                        "layer": i,
                        "family": lay.family,
                        "t": t,
                        "token": [res.tokens[k] if k < len(res.tokens) else "" for k in t],
                        "ess": reduce_units(ess_of(lay, variant), unit, lay.multiplicity),
                        "tss": reduce_units(lay.tss, unit, lay.state_weight),
                        "ceiling": reduce_units(attainable_ceiling(lay), unit, lay.multiplicity),
                    }
                )
            )
    frame = pd.concat(rows, ignore_index=True)
    several_models = frame["model"].nunique() > 1
    several_layers = frame.groupby("model")["layer"].nunique().max() > 1
    if several_models and several_layers:
        frame["series"] = frame["model"] + " · layer " + frame["layer"].astype(str)
    elif several_models:
        frame["series"] = frame["model"]
    else:
        frame["series"] = "layer " + frame["layer"].astype(str) + " (" + frame["family"].map(family_name) + ")"
    return frame


def layer_summary_frame(
    result_or_results,
    *,
    layers=None,
    variant="tolerance",
    reduce="max",
    against="ceiling",
    saturated=None,
    collapsed=None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per_layer, per_unit) utilisation tables from diagnostics.layer_diagnostics.

    per_layer: model, layer, family, label, utilisation (mean over units), state, mean_ess.
    per_unit: model, layer, label, unit, utilisation, state. ``reduce`` over time: "max"
    (peak, the diagnostics default) or "mean"; ``against`` "ceiling" (the attainable
    min(TSS, t, L - t), default) or "tss" (the paper's ESS/TSS).
    """
    per_layer, per_unit = [], []
    for label, res in series_of(result_or_results):
        state = ViewState.of(
            res,
            variant=variant,
            **{k: v for k, v in (("saturated", saturated), ("collapsed", collapsed)) if v is not None},
        )
        for i in analysed_layers(res, layers):
            lay = res.layer(i)
            diag = layer_diagnostics(
                lay,
                variant=variant,
                reduce=reduce,
                saturated=state.saturated,
                collapsed=state.collapsed,
                against=against,
            )
            name = f"{i} {family_name(lay.family)}"
            per_layer.append(
                {
                    "model": label,
                    "layer": i,
                    "family": lay.family,
                    "label": name,
                    "utilisation": diag["utilisation"],
                    "state": str(diag["state"]),
                    "mean_ess": diag["mean_ess"],
                    "units": lay.n_units,
                }
            )
            for u, (value, st) in enumerate(zip(diag["unit_utilisation"], diag["unit_state"])):
                per_unit.append(
                    {
                        "model": label,
                        "layer": i,
                        "label": name,
                        "unit": u,
                        "utilisation": float(value),
                        "state": str(st),
                    }
                )
    return pd.DataFrame(per_layer), pd.DataFrame(per_unit)


def envelope(frame: pd.DataFrame, by: list[str], budget: int = FIGURE_ROWS, value: str = "ess") -> pd.DataFrame:
    """``frame`` with each series (rows grouped by ``by``, in t order) cut to about
    budget / series rows: its positions fall into equal bins and each bin keeps the rows of
    its lowest and highest ``value`` (a min/max envelope: a one-token dip at a separator
    stays drawn, as it would at full resolution). A frame that fits is returned as it is."""
    groups = frame.groupby(by, sort=False)
    per = max(8, budget // max(1, groups.ngroups))
    if len(frame) <= budget or groups.size().max() <= per:
        return frame
    rank, size = groups.cumcount(), groups[value].transform("size")
    bins = (rank * (per // 2) // size).rename("_bin")
    keys = [frame[k] for k in by] + [bins]
    lowest = frame[value].groupby(keys, sort=False).idxmin()
    highest = frame[value].groupby(keys, sort=False).idxmax()
    return frame.loc[np.unique(np.concatenate([lowest.to_numpy(), highest.to_numpy()]))]


def spread(frame: pd.DataFrame, by: list[str], value: str, budget: int = FIGURE_ROWS) -> pd.DataFrame:
    """``frame`` with each group (rows grouped by ``by``) cut to about budget / groups rows
    that span its distribution of ``value``: the rows at evenly spaced ranks, lowest and
    highest included (the units of a 1,536-channel layer drawn as its quantiles). A frame
    that fits is returned as it is."""
    if len(frame) <= budget:
        return frame
    groups = frame.groupby(by, sort=False)
    per = max(5, budget // max(1, groups.ngroups))
    keep = []
    for _, group in groups:
        ranked = group.sort_values(value, kind="stable").index.to_numpy()
        keep.append(ranked[np.unique(np.linspace(0, len(ranked) - 1, min(per, len(ranked))).round().astype(int))])
    return frame.loc[np.sort(np.concatenate(keep))]
