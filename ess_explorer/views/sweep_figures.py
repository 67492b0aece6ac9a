"""Paper figures of sweep statistics: curves with bootstrap bands, modulation with error bars.

Each function takes a frame of ess_explorer.sweep's statistics (it needs only pandas, so the
views stay below the sweep layer) and returns an Altair chart in the paper theme
(theme.py: apply_paper_theme, Okabe-Ito colours; ``width`` "single" / "double" / points).

    sweep_ess_time(summarize(table))                          mean ESS over t, a band per series
    sweep_modulation(modulation(table, "|"))                  mean modulation per layer, error bars
    sweep_checkpoints(summarize(table, by=("model", "layer")))   ESS over training steps, bands
    sweep_utilisation(utilisation(table))                     per-layer utilisation distributions

A series is a model, and a layer when several are shown ("zoo:lfm2 · L1"); bands and bars
are the frame's ``low`` / ``high`` (95 % bootstrap intervals over prompts by default).
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from .theme import OKABE_ITO, apply_paper_theme

__all__ = ["SWEEP_KINDS", "sweep_ess_time", "sweep_modulation", "sweep_checkpoints", "sweep_utilisation"]


def _need(frame: pd.DataFrame, columns, what: str) -> pd.DataFrame:
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"{what} takes a DataFrame of ess_explorer.sweep statistics, got {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what} needs the columns {missing}; pass the frame that {_SOURCES[what]} returns")
    if frame.empty:
        raise ValueError(f"{what}: the frame is empty")
    return frame


def _select(frame: pd.DataFrame, layers, models) -> pd.DataFrame:
    if layers is not None:
        frame = frame[frame["layer"].isin([layers] if isinstance(layers, int) else list(layers))]
    if models is not None:
        frame = frame[frame["model"].astype(str).isin([models] if isinstance(models, str) else list(models))]
    if frame.empty:
        raise ValueError("no rows left after choosing layers / models")
    return frame


def _with_series(frame: pd.DataFrame, parts=("model", "layer")) -> pd.DataFrame:
    """A ``series`` column: the parts that vary, joined (a model, or "model · L1")."""
    frame = frame.copy()
    varying = [p for p in parts if p in frame.columns and frame[p].nunique(dropna=False) > 1] or [parts[0]]
    labels = []
    for row in frame[varying].itertuples(index=False):
        labels.append(" · ".join(f"L{v}" if p == "layer" else str(v) for p, v in zip(varying, row)))
    frame["series"] = labels
    return frame


def _colour(frame: pd.DataFrame, field: str = "series", title=None) -> alt.Color:
    names = list(dict.fromkeys(frame[field]))
    scale = alt.Scale(domain=names, range=[OKABE_ITO[k % len(OKABE_ITO)] for k in range(len(names))])
    return alt.Color(
        f"{field}:N",
        title=title,
        sort=names,
        scale=scale,
        legend=alt.Legend(orient="top", direction="horizontal", columns=2),
    )


def _y_title(variant: str, what: str) -> str:
    return f"{what} ({variant}-ESS)" if variant != "tolerance" else what


def _theme(chart, width, height, font):
    return apply_paper_theme(chart, width=width, height=height, font=font)


def sweep_ess_time(
    summary: pd.DataFrame,
    *,
    layers=None,
    models=None,
    variant: str = "tolerance",
    width="single",
    height=None,
    font: str = "serif",
):
    """Mean ESS over t, one line per series, its interval as a band (summarize's frame)."""
    frame = _need(summary, ["model", "layer", "t", "mean", "low", "high"], "sweep_ess_time")
    frame = _with_series(_select(frame, layers, models))
    colour = _colour(frame)
    base = alt.Chart(frame).encode(x=alt.X("t:Q", title="position t", scale=alt.Scale(nice=False, zero=True)))
    band = base.mark_area(opacity=0.25, line=False).encode(
        y=alt.Y("low:Q", title=_y_title(variant, "mean ESS")), y2="high:Q", color=colour
    )
    line = base.mark_line().encode(
        y="mean:Q",
        color=colour,
        tooltip=[
            "series:N",
            "t:Q",
            alt.Tooltip("mean:Q", format=".2f"),
            alt.Tooltip("low:Q", format=".2f"),
            alt.Tooltip("high:Q", format=".2f"),
            "n_prompts:Q",
        ],
    )
    return _theme(alt.layer(band, line), width, height, font)


def sweep_modulation(
    frame: pd.DataFrame,
    *,
    layers=None,
    models=None,
    token: str | None = None,
    width="single",
    height=None,
    font: str = "serif",
):
    """Mean modulation per layer (points) with its interval (error bars), models side by
    side within a layer (modulation's frame). ``token`` only labels the y axis."""
    frame = _need(frame, ["model", "layer", "mean", "low", "high"], "sweep_modulation")
    frame = _select(frame, layers, models).assign(model=lambda f: f["model"].astype(str))
    colour = _colour(frame, "model")
    y_title = f"modulation at {token!r}" if token else "modulation"
    base = alt.Chart(frame).encode(
        x=alt.X("layer:O", title="layer", axis=alt.Axis(labelAngle=0)), xOffset="model:N", color=colour
    )
    bars = base.mark_rule().encode(y=alt.Y("low:Q", title=y_title), y2="high:Q")
    points = base.mark_point(filled=True).encode(
        y="mean:Q",
        tooltip=[
            "model:N",
            "layer:O",
            alt.Tooltip("mean:Q", format=".3f"),
            alt.Tooltip("low:Q", format=".3f"),
            alt.Tooltip("high:Q", format=".3f"),
        ],
    )
    zero = alt.Chart(pd.DataFrame({"y": [0.0]})).mark_rule(color="#bbbbbb", strokeDash=[2, 2]).encode(y="y:Q")
    return _theme(alt.layer(zero, bars, points), width, height, font)


def sweep_checkpoints(
    summary: pd.DataFrame,
    *,
    layers=None,
    models=None,
    variant: str = "tolerance",
    width="single",
    height=None,
    font: str = "serif",
):
    """ESS over training steps: one line per series through its checkpoints, with bands
    (summarize(table, by=("model", "layer"))'s frame: the mean over t and prompts)."""
    frame = _need(summary, ["model", "checkpoint_step", "layer", "mean", "low", "high"], "sweep_checkpoints")
    frame = _select(frame, layers, models)
    frame = frame[frame["checkpoint_step"].notna()]
    if frame.empty:
        raise ValueError("sweep_checkpoints needs a table with checkpoint steps (a sweep over a training run)")
    frame = _with_series(frame.assign(checkpoint_step=frame["checkpoint_step"].astype(int)))
    colour = _colour(frame)
    base = alt.Chart(frame).encode(x=alt.X("checkpoint_step:Q", title="training step"))
    band = base.mark_area(opacity=0.25).encode(
        y=alt.Y("low:Q", title=_y_title(variant, "mean ESS")), y2="high:Q", color=colour
    )
    line = base.mark_line(point=True).encode(
        y="mean:Q", color=colour, tooltip=["series:N", "checkpoint_step:Q", alt.Tooltip("mean:Q", format=".2f")]
    )
    return _theme(alt.layer(band, line), width, height, font)


def sweep_utilisation(
    frame: pd.DataFrame, *, layers=None, models=None, width="single", height=None, font: str = "serif"
):
    """Distribution of per-unit utilisation (over prompts and units) per layer: a box per
    layer and model (utilisation's frame)."""
    frame = _need(frame, ["model", "layer", "utilisation"], "sweep_utilisation")
    frame = _select(frame, layers, models).assign(model=lambda f: f["model"].astype(str))
    chart = (
        alt.Chart(frame)
        .mark_boxplot(size=8, extent="min-max")
        .encode(
            x=alt.X("layer:O", title="layer", axis=alt.Axis(labelAngle=0)),
            xOffset="model:N",
            y=alt.Y("utilisation:Q", title="utilisation (ESS / TSS)", scale=alt.Scale(domain=[0, 1])),
            color=_colour(frame, "model"),
        )
    )
    return _theme(chart, width, height, font)


_SOURCES = {
    "sweep_ess_time": "ess_explorer.summarize(table)",
    "sweep_modulation": "ess_explorer.sweep.modulation(table, token)",
    "sweep_checkpoints": "ess_explorer.summarize(table, by=('model', 'layer'))",
    "sweep_utilisation": "ess_explorer.sweep.utilisation(table)",
}

# Figure kinds for the registry of figures.py (the lead registers them).
SWEEP_KINDS = {
    "sweep_ess_time": sweep_ess_time,
    "sweep_modulation": sweep_modulation,
    "sweep_checkpoints": sweep_checkpoints,
    "sweep_utilisation": sweep_utilisation,
}
