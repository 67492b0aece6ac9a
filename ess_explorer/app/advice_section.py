"""The advice section of the HTML report: a layer's advice (ess_explorer.advise) next to its
diagnostics, as a table and the ``advice`` figure (inline SVG, no network).

Advice rests on many prompts (a sweep), a report on one result: the report shows the advice it is
given (``write_report(result, path, advice=ess.advise(sweep_dir))``) for the rows of its model.
"""

from __future__ import annotations

import html

__all__ = ["advice_rows", "advice_section_html"]


def _interval(estimate: dict | None, digits: int) -> str:
    if estimate is None:
        return ""
    return f"{estimate['value']:.{digits}f} [{estimate['low']:.{digits}f}, {estimate['high']:.{digits}f}]"


def advice_rows(advice: dict, model: str | None = None) -> list[dict]:
    """One row per layer of ``Advice.to_dict()`` (only ``model``'s when it has rows there)."""
    layers = advice["layers"]
    if model is not None and any(a["model"] == model for a in layers):
        layers = [a for a in layers if a["model"] == model]
    rows = []
    for a in layers:
        rows.append(
            {
                "model": a["model"],
                "layer": a["layer"],
                "family": a["family"],
                "state it has (per unit)": f"{a['state_per_unit']:.0f}",
                "state in scalars": f"{a['state_scalars']:.0f}",
                f"advised (q = {advice['quantile']:g})": _interval(a["advised_per_unit"], 0),
                "advised / has": _interval(a["ratio"], 2),
                "ceiling use": _interval(a.get("ceiling_use"), 2),
                "full attention advised": "" if a.get("full_attention_state") is None else a["full_attention_state"],
                "recurrent candidate": "" if a["candidate"] is None else ("yes" if a["candidate"] else "no"),
            }
        )
    return rows


def advice_section_html(advice, model: str | None = None) -> str:
    """The report's advice section: a table per layer and the advice figure as inline SVG."""
    from ..views.advice import advice_figure
    from ..views.render import figure_bytes

    data = advice.to_dict() if hasattr(advice, "to_dict") else advice
    if not isinstance(data, dict) or "layers" not in data:
        raise ValueError("advice must be an Advice (ess_explorer.advise) or its to_dict()")
    rows = advice_rows(data, model)
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row.values()) + "</tr>" for row in rows)
    shown = {**data, "layers": [a for a in data["layers"] if any(a["layer"] == r["layer"] for r in rows)]}
    svg = figure_bytes(advice_figure(shown, width="double"), "svg").decode("utf-8")
    facts = data.get("data", {})
    sub = (
        f"{data['variant']}-ESS over {facts.get('n_prompts')} prompts of {facts.get('length', {}).get('min')}-"
        f"{facts.get('length', {}).get('max')} tokens; {data['confidence']:.0%} bootstrap intervals over prompts"
    )
    return (
        f"<h2>Advice</h2><p class='sub'>{html.escape(sub)} (docs: advice.md)</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        f"<div class='advice-figure'>{svg}</div>"
    )
