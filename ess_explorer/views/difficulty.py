"""The difficulty-sweep figure: accuracy and state per pair as the number of pairs K grows.

    from ess_explorer import zoo
    from ess_explorer.views.difficulty import difficulty_figure
    sweeps = {name: zoo.sweep_difficulty(name) for name in ("mamba2_n4", "mamba2_n16", "llama")}
    difficulty_figure(sweeps, untrained={n: zoo.sweep_difficulty(n, untrained=True) for n in sweeps})

Input: {series name: rows}, each row a dict with ``pairs``, ``accuracy``, ``ess_per_kv`` and
``tss_per_kv`` (what ``zoo.sweep_difficulty`` returns). Two panels share the K axis (log2):
held-out accuracy, and ESS/kv (solid, points) against TSS/kv (the same series' thin line, no
points) on a log axis; optionally the untrained copies' ESS/kv (hollow points, dotted).
Saturation reads as the solid line meeting its TSS/kv line while accuracy falls.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from .theme import DASHES, OKABE_ITO, apply_paper_theme

__all__ = ["difficulty_frame", "difficulty_chart", "difficulty_figure"]

_NEEDED = ("pairs", "accuracy", "ess_per_kv", "tss_per_kv")


def difficulty_frame(sweeps: dict, untrained: dict | None = None) -> pd.DataFrame:
    """Long table: series, pairs, accuracy, quantity ("ESS/kv", "TSS/kv", "untrained ESS/kv"), value."""
    if not sweeps:
        raise ValueError("difficulty_frame needs at least one series: {name: rows of zoo.sweep_difficulty}")
    records = []
    for source, label in ((sweeps, None), (untrained or {}, "untrained ESS/kv")):
        for name, rows in source.items():
            for row in rows:
                missing = [k for k in _NEEDED if k not in row]
                if missing:
                    raise ValueError(f"sweep row of {name!r} lacks {missing}; pass rows of zoo.sweep_difficulty")
                if label:
                    records.append(
                        {
                            "series": name,
                            "pairs": row["pairs"],
                            "accuracy": None,
                            "quantity": label,
                            "value": row["ess_per_kv"],
                        }
                    )
                    continue
                for quantity, key in (("ESS/kv", "ess_per_kv"), ("TSS/kv", "tss_per_kv")):
                    records.append(
                        {
                            "series": name,
                            "pairs": row["pairs"],
                            "accuracy": row["accuracy"],
                            "quantity": quantity,
                            "value": row[key],
                        }
                    )
    return pd.DataFrame.from_records(records)


def difficulty_chart(sweeps: dict, untrained: dict | None = None):
    """The two-panel Altair chart (no theme); see the module docstring."""
    frame = difficulty_frame(sweeps, untrained)
    names = list(dict.fromkeys(frame["series"]))
    legend = alt.Legend(orient="right", title=None, symbolType="stroke")
    colour = alt.Color(
        "series:N",
        title=None,
        sort=names,
        legend=legend,
        scale=alt.Scale(domain=names, range=[OKABE_ITO[k % len(OKABE_ITO)] for k in range(len(names))]),
    )
    dash = alt.StrokeDash(
        "series:N",
        title=None,
        sort=names,
        legend=legend,
        scale=alt.Scale(domain=names, range=[DASHES[k % len(DASHES)] for k in range(len(names))]),
    )
    x = alt.X(
        "pairs:Q",
        title="key-value pairs K",
        scale=alt.Scale(type="log", base=2),
        axis=alt.Axis(values=sorted(set(frame["pairs"]))),
    )
    base = alt.Chart(frame)
    ess = base.transform_filter(alt.datum.quantity == "ESS/kv")
    accuracy = ess.mark_line(point=True).encode(
        x=x,
        y=alt.Y("accuracy:Q", title="held-out accuracy", scale=alt.Scale(domain=[0, 1])),
        color=colour,
        strokeDash=dash,
        tooltip=["series:N", "pairs:Q", "accuracy:Q"],
    )
    y = alt.Y("value:Q", title="state per pair (scalars / K)", scale=alt.Scale(type="log"))
    layers = [
        base.transform_filter(alt.datum.quantity == "TSS/kv")
        .mark_line(strokeWidth=0.8, opacity=0.6)
        .encode(x=x, y=y, color=colour),
        ess.mark_line(point=True).encode(
            x=x, y=y, color=colour, strokeDash=dash, tooltip=["series:N", "pairs:Q", "value:Q"]
        ),
    ]
    if untrained:
        layers.append(
            base.transform_filter(alt.datum.quantity == "untrained ESS/kv")
            .mark_line(point=alt.OverlayMarkDef(filled=False), strokeDash=[1, 2], strokeWidth=0.8)
            .encode(x=x, y=y, color=colour, tooltip=["series:N", "pairs:Q", "value:Q"])
        )
    return alt.hconcat(accuracy, alt.layer(*layers)).resolve_scale(color="shared", strokeDash="shared")


def difficulty_figure(
    sweeps: dict, untrained: dict | None = None, *, width="double", height=None, font: str = "serif", size: float = 8.0
):
    """The difficulty sweep as a paper figure (theme of ``figures``): save with figures.save_figure."""
    return apply_paper_theme(difficulty_chart(sweeps, untrained), width=width, height=height, font=font, size=size)
