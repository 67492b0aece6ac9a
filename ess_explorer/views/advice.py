"""Figures of the advice (ess_explorer.advise) and of its check by training.

    advice_figure(advise(table))          per layer: the ESS distribution, the state it has, the advised state
    advice_check_figure(record)           student accuracy against the teacher's (scripts/advice_check.py)

Both take plain data (an Advice, or its ``to_dict()``; the check's JSON record), so the views
stay below the sweep layer. The advice figure has one row per layer (model and layer): a thick
bar from the median to the 0.9 quantile of the per-unit ESS, a thin rule out to the chosen
quantile, a tick at the mean, a cross at the state the layer has (attention: its KV tokens at
the longest cut) and a dot with its bootstrap interval at the advised state. The x axis is
symlog: states from 0 to hundreds share one axis.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from .data import family_name
from .theme import OKABE_ITO, PAPER_WIDTHS, apply_paper_theme

__all__ = ["advice_frame", "advice_figure", "advice_check_frame", "advice_check_figure"]

_WHAT = ("ESS, median to q = 0.9", "ESS, to q = {q:g}", "mean ESS", "state it has", "advised, 95% interval")


def _as_dict(advice) -> dict:
    data = advice.to_dict() if hasattr(advice, "to_dict") else advice
    if not isinstance(data, dict) or not isinstance(data.get("layers"), list) or "quantile" not in data:
        raise ValueError("advice_figure takes an Advice (ess_explorer.advise) or its to_dict()")
    if not data["layers"]:
        raise ValueError("the advice has no layers to draw")
    return data


def advice_frame(advice) -> pd.DataFrame:
    """One row per layer: row label, q50, q90, q (the chosen quantile), mean, state, advised, low, high."""
    data = _as_dict(advice)
    variant, q = data["variant"], data["quantile"]
    models = list(dict.fromkeys(a["model"] for a in data["layers"]))
    rows = []
    for a in data["layers"]:
        dist = a["distributions"][variant]
        by_level = {entry["q"]: entry["per_unit"]["value"] for entry in dist["quantiles"]}
        label = f"L{a['layer']} {family_name(a['family'])}"
        if len(models) > 1:
            label = f"{a['model']} · {label}"
        if a.get("checkpoint_step") is not None:
            label += f" (step {a['checkpoint_step']})"
        rows.append(
            {
                "row": label,
                "q50": by_level.get(0.5),
                "q90": by_level.get(0.9),
                "q": by_level.get(q),
                "mean": dist["mean_per_unit"]["value"],
                "state": a["state_per_unit"],
                "advised": a["advised_per_unit"]["value"],
                "low": a["advised_per_unit"]["low"],
                "high": a["advised_per_unit"]["high"],
            }
        )
    return pd.DataFrame(rows)


def advice_figure(advice, *, width="single", height=None, font: str = "serif", size: float = 8.0):
    """The advice as a paper figure (see the module docstring)."""
    data = _as_dict(advice)
    frame = advice_frame(data)
    # As many rows as fit a page about as tall as it is wide (22 pt each under a 110 pt legend
    # and axis); more layers are thinned to every k-th row, and the axis title says so.
    fit = max(3, int((1.1 * PAPER_WIDTHS.get(width, 240) - 110) // 22)) if height is None else len(frame)
    every = -(-len(frame) // fit)
    frame = frame.iloc[::every].reset_index(drop=True)
    rows = list(frame["row"])
    what = [w.format(q=data["quantile"]) for w in _WHAT]
    colour = alt.Scale(domain=what, range=["#c9c9c9", "#7f7f7f", "#000000", OKABE_ITO[5], OKABE_ITO[1]])
    legend = alt.Legend(orient="bottom", title=None, columns=1, symbolSize=40, labelLimit=0)
    top = max(float(frame[["state", "q", "high"]].max().max()), 1.0)
    variant = {"tolerance": "tolerance", "entropy": "entropy", "causal": "causal"}[data["variant"]]
    ticks = [0] + [2**k for k in range(0, 20) if 2**k <= top * 1.4]
    step = 2 if len(ticks) > 7 else 1  # powers of four on a long axis: the labels keep apart
    x = alt.X(
        "lo:Q",
        title=f"state per unit ({variant}-ESS)" + (f"; every {every}th layer row shown" if every > 1 else ""),
        scale=alt.Scale(type="symlog", domain=[0, top * 1.4], nice=False),
        axis=alt.Axis(values=ticks[:1] + ticks[1::step], format="d"),
    )
    y = alt.Y("row:N", title=None, sort=rows)

    def part(what, lo, hi=None):
        out = frame.assign(what=what, lo=frame[lo])
        return out.assign(hi=frame[hi]) if hi else out

    base = alt.Chart(
        pd.concat(
            [
                part(what[0], "q50", "q90"),
                part(what[1], "q90", "q"),
                part(what[2], "mean"),
                part(what[3], "state"),
                part(what[4], "advised"),
                part("interval", "low", "high"),
            ],
            ignore_index=True,
        )
    )
    colours = alt.Color("what:N", scale=colour, legend=legend)
    marks = [
        base.transform_filter(alt.datum.what == what[1])
        .mark_rule(strokeWidth=1.2)
        .encode(x=x, x2="hi:Q", y=y, color=colours),
        base.transform_filter(alt.datum.what == what[0]).mark_bar(height=7).encode(x=x, x2="hi:Q", y=y, color=colours),
        base.transform_filter(alt.datum.what == what[2])
        .mark_tick(thickness=1.2, size=9)
        .encode(x=x, y=y, color=colours),
        base.transform_filter(alt.datum.what == what[3])
        .mark_point(shape="cross", size=40, filled=True)
        .encode(x=x, y=y, color=colours),
        base.transform_filter(alt.datum.what == "interval")
        .mark_rule(strokeWidth=1.0, color=OKABE_ITO[1], yOffset=5)
        .encode(x=x, x2="hi:Q", y=y),
        base.transform_filter(alt.datum.what == what[4])
        .mark_point(size=30, filled=True, yOffset=5)
        .encode(x=x, y=y, color=colours),
    ]
    if height is None:
        height = 110 + 22 * len(rows)
    return apply_paper_theme(alt.layer(*marks), width=width, height=height, font=font, size=size)


# ------------------------------------------------------------------------- the training check

_SIZES = ("quarter", "half", "advised")


def advice_check_frame(record: dict) -> pd.DataFrame:
    """Long table of a check record: teacher, size (quarter / half / advised), state, seed,
    accuracy (per seed), mean, low, high (over seeds), teacher accuracy and its interval."""
    teachers = record.get("teachers") if isinstance(record, dict) else None
    if not teachers:
        raise ValueError("advice_check_frame takes the record of scripts/advice_check.py (its 'teachers')")
    rows = []
    for name, teacher in teachers.items():
        if "students" not in teacher:
            raise ValueError(f"teacher {name!r} has no students in the record")
        for label in _SIZES:
            student = teacher["students"][label]
            for seed, accuracy in zip(student.get("seeds", range(len(student["per_seed"]))), student["per_seed"]):
                rows.append(
                    {
                        "teacher": f"{name} (advised n = {teacher['sizes']['advised']})",
                        "size": f"{label}: {student['state_size']}",
                        "order": _SIZES.index(label),
                        "seed": seed,
                        "accuracy": accuracy,
                        "mean": student["mean"],
                        "low": student["low"],
                        "high": student["high"],
                        "teacher_accuracy": teacher["accuracy"],
                        "teacher_low": teacher["low"],
                        "teacher_high": teacher["high"],
                    }
                )
    return pd.DataFrame(rows)


def advice_check_figure(record: dict, *, width="double", height=None, font: str = "serif", size: float = 8.0):
    """Student accuracy (dots: seeds; bar: mean with its 95% interval over seeds) at the
    advised state, half and a quarter of it, against the teacher (line and band), one panel per
    teacher."""
    frame = advice_check_frame(record)
    low = max(0.0, min(frame["accuracy"].min(), frame["low"].min(), frame["teacher_low"].min()) - 0.02)
    # One scale for every layer: intervals over 3 seeds may reach past 1, which the figure clips.
    scale = alt.Scale(domain=[low, 1.0], nice=False, clamp=True)
    title = "held-out accuracy"
    panels = []
    for teacher, part in frame.groupby("teacher", sort=False):
        sizes = list(part.sort_values("order")["size"].drop_duplicates())
        x = alt.X("size:N", title="student state per head", sort=sizes, axis=alt.Axis(labelAngle=0))
        base = alt.Chart(part)
        summary = alt.Chart(part.drop_duplicates("size"))  # one row per size: the summary marks
        layers = [
            summary.mark_rect(opacity=0.15, color=OKABE_ITO[5]).encode(
                y=alt.Y("teacher_low:Q", scale=scale, title=title), y2="teacher_high:Q"
            ),
            summary.mark_rule(color=OKABE_ITO[5], strokeDash=[4, 2]).encode(
                y=alt.Y("teacher_accuracy:Q", scale=scale, title=title)
            ),
            summary.mark_rule(color=OKABE_ITO[1], strokeWidth=1.2).encode(
                x=x, y=alt.Y("low:Q", scale=scale, title=title), y2="high:Q"
            ),
            summary.mark_tick(color=OKABE_ITO[1], thickness=1.5, size=12).encode(
                x=x, y=alt.Y("mean:Q", scale=scale, title=title)
            ),
            base.mark_point(color="#555555", size=14, filled=True, opacity=0.8, xOffset=5).encode(
                x=x, y=alt.Y("accuracy:Q", scale=scale, title=title)
            ),
        ]
        panels.append(alt.layer(*layers).properties(title=f"teacher {teacher}"))
    chart = alt.hconcat(*panels).resolve_scale(y="shared")
    return apply_paper_theme(chart, width=width, height=height, font=font, size=size)
