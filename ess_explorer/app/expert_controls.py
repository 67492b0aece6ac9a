"""The explorer's expert controls, grouped under "advanced settings", each with what it does.

The tolerance reference (× σ₁ or absolute), the scope of a relative tolerance and the gate
policy change what is counted (docs/conventions.md), but a first look needs none of them: they
sit in a closed accordion below the everyday controls (layer, unit, variant, τ) and the status
line, each with a one-line hint beside it and the same words as its tooltip. The unit menu is
as wide as its longest entry ("mean over channels"), so no label is cut.
"""

from __future__ import annotations

import html

import ipywidgets as W

__all__ = ["EXPERT_HINTS", "ADVANCED_TITLE", "advanced_settings", "explain_controls", "dropdown_width"]

ADVANCED_TITLE = "advanced settings: tolerance reference, scope, gates"

# What each expert control does, by the explorer's trait it sets.
EXPERT_HINTS = {
    "relative": "τ × σ₁: a singular value of H_t counts when above τ times a largest σ₁ (see scope); "
    "absolute: when above τ itself, in the operator's own units.",
    "scope": "which σ₁ a relative τ multiplies: each cut's own (cut, scale-free), the largest over the "
    "unit's cuts (unit: a reset that scales the state down counts fewer directions) or over the "
    "layer's (layer). A recount, no model run.",
    "gates": "inside: the per-token gates around the mixing are part of the operator T (the default); "
    "outside: T without them, for comparison. A change runs the analysis again.",
}

DROPDOWN_CHROME_PX = 40  # the select's arrow and padding beside its text


def dropdown_width(labels, description: str = "") -> str:
    """A CSS width that shows the longest of ``labels`` whole after ``description``
    (character widths in ``ch``, the arrow and padding in px)."""
    longest = max((len(label) for label in labels), default=0)
    text = longest + (len(description) + 1 if description else 0)
    return f"calc({text + 1}ch + {DROPDOWN_CHROME_PX}px)"


def explain_controls(e) -> None:
    """Give explorer ``e``'s expert controls their hints as tooltips."""
    e.relative_w.tooltips = [EXPERT_HINTS["relative"]] * len(e.relative_w.options)
    e.scope_w.tooltip = EXPERT_HINTS["scope"]
    e.gates_w.tooltip = EXPERT_HINTS["gates"]


def _hinted(control: W.Widget, hint: str) -> W.HBox:
    text = W.HTML(
        f'<span style="color:#555; font-size:90%">{html.escape(hint)}</span>', layout=W.Layout(flex="1 1 260px")
    )
    return W.HBox([control, text], layout=W.Layout(align_items="center", flex_flow="row wrap"))


def advanced_settings(e) -> W.Accordion:
    """The expert controls of explorer ``e`` in a closed accordion, one row each with its hint."""
    explain_controls(e)
    rows = [_hinted(getattr(e, f"{name}_w"), hint) for name, hint in EXPERT_HINTS.items()]
    box = W.Accordion(children=[W.VBox(rows)], selected_index=None)
    box.set_title(0, ADVANCED_TITLE)
    return box
