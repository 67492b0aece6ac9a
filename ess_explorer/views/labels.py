"""The words of the views: what a curve, a panel or a menu entry shows, in one place.

Every label a view draws that depends on the shown variant, unit or tolerance is built here
from plain values (no Altair), so the explorer, the report and the figures name one thing one
way, and a test can read the words without drawing anything.

Variants (docs/conventions.md): tolerance-ESS counts the singular values of the cut H_t above
tau; entropy-ESS is the exponential of the entropy of p = sigma / sum(sigma); causal ESS counts,
with the same tau, the singular values of the reachability factor R_t of H_t = O_t R_t.
"""

from __future__ import annotations

import math

from ..options import AGGREGATES
from ..result import ESSResult, LayerESS

__all__ = [
    "VARIANT_NAMES",
    "family_name",
    "single_family",
    "layer_label",
    "layer_axis_title",
    "tol_label",
    "variant_label",
    "ceiling_label",
    "unit_label",
    "unit_menu_options",
    "spectrum_count",
    "curve_value_label",
]

# The short name of each ESS variant, as every view writes it.
VARIANT_NAMES = {"tolerance": "tolerance-ESS", "entropy": "entropy-ESS", "causal": "causal ESS"}


def family_name(family: str) -> str:
    """A family's code name as words for labels and legends: "short_conv" -> "short conv"."""
    return family.replace("_", " ")


def single_family(result: ESSResult) -> str | None:
    """The family of every analysed layer when they share one (a plain LLM), else None."""
    families = {lay.family for lay in result.layers.values()}
    return family_name(families.pop()) if len(families) == 1 else None


def layer_label(result: ESSResult, index: int) -> str:
    """A layer's row label: its index alone when every layer has one family (the axis title
    names it: a 30-layer LLM's rows then stay short enough to read), else "index · family"."""
    if single_family(result) is not None:
        return str(index)
    return f"{index} · {family_name(result.layer(index).family)}"


def layer_axis_title(result: ESSResult) -> str | None:
    """The title of a layer axis: "layer (family)" when the labels leave the family out."""
    family = single_family(result)
    return f"layer ({family})" if family else None


def tol_label(tol: float, relative: bool) -> str:
    return f"τ = {tol:g}·σ₁" if relative else f"τ = {tol:g}"


def variant_label(variant: str, tol: float, relative: bool) -> str:
    """The name of the shown ESS with what defines it: the tolerance for the two counts
    (tolerance-ESS counts sigma of H_t above tau; causal ESS counts those of R_t), the
    normalisation for entropy-ESS."""
    if variant == "entropy":
        return f"{VARIANT_NAMES['entropy']} (exp of the entropy of σ/Σσ)"
    if variant == "causal":
        return f"{VARIANT_NAMES['causal']} (rank of Rₜ, {tol_label(tol, relative)})"
    return f"{VARIANT_NAMES['tolerance']} ({tol_label(tol, relative)})"


def ceiling_label(variant: str) -> str:
    """The attainable ceiling the shown variant is judged against
    (core.diagnostics.attainable_ceiling): H_t is L - t by t, so min(TSS, t, L - t) bounds the
    two counts of H_t; causal ESS counts R_t (state x t), bounded by min(TSS, t)."""
    return "ceiling min(TSS, t)" if variant == "causal" else "ceiling min(TSS, t, L−t)"


def unit_label(lay: LayerESS, unit) -> str:
    """What a curve of ``unit`` stands for: "mean over 128 channels", "head 3"."""
    return f"{unit} over {lay.n_units} {lay.unit_kind}s" if isinstance(unit, str) else f"{lay.unit_kind} {unit}"


# The widest entry the explorer's unit menu shows whole (its dropdown is about 170 px wide).
UNIT_MENU_CHARS = 14


def unit_menu_options(lay: LayerESS) -> list[tuple[str, int | str]]:
    """(label, value) entries of a unit menu: the three aggregates, then every unit.

    Labels stay within UNIT_MENU_CHARS characters so a narrow dropdown never cuts them ("mean
    over channe"): the aggregates are named by what they do, the unit kind is said once per
    unit entry. The sum is the layer total in scalars (docs/conventions.md, multiplicity)."""
    aggregates = [(AGGREGATE_MENU_LABELS[how], how) for how in AGGREGATES]
    return aggregates + [(f"{lay.unit_kind} {u}", u) for u in range(lay.n_units)]


AGGREGATE_MENU_LABELS = {"mean": "mean of units", "max": "max of units", "sum": "sum (total)"}


def spectrum_count(
    variant: str,
    *,
    tolerance_count: int,
    exact: bool,
    kept: int,
    drawn: int,
    complete: bool,
    entropy: float,
    causal: float,
) -> str:
    """The count the spectrum panel states for the unit it draws, in the shown variant.

    The panel draws sigma_k(H_t) of one unit; the statement leads with that unit's ESS of the
    variant the curve shows, so panel and curve (for a single unit) give one number:
    tolerance-ESS counts the drawn values above tau; entropy-ESS is computed from all of them;
    causal ESS counts the values of R_t (not drawn), and the count of H_t is given beside it.
    ``exact`` False: the tolerance count was recounted from the ``kept`` values and is a lower
    bound. ``complete`` False: more values exist than the ``drawn`` ones. tau itself is the
    panel's dashed rule, its value in the rule's tooltip and beside the curve's name."""
    if exact:
        above = f"{tolerance_count} σ above τ"
        if not complete:
            above += f" (top {drawn} drawn)"
    else:
        above = f"at least {tolerance_count} σ above τ (recounted from the {kept} kept)"
    if variant == "entropy":
        return f"{VARIANT_NAMES['entropy']} {_number(entropy)} · {above}"
    if variant == "causal":
        return f"{VARIANT_NAMES['causal']} {_number(causal)} (rank of Rₜ) · Hₜ: {above}"
    return f"{VARIANT_NAMES['tolerance']} {above} · {VARIANT_NAMES['entropy']} {_number(entropy)}"


def curve_value_label(variant: str, lay: LayerESS, unit, value: float) -> str:
    """For an aggregate curve: its value at the selected t beside the one unit the panel
    draws, so the two numbers for one t are explained ("" for a single unit: then the panel's
    count is the curve's value)."""
    if not isinstance(unit, str):
        return ""
    scalars = " (in scalars)" if unit == "sum" else ""
    return f"the curve at this t: {VARIANT_NAMES[variant]} {unit_label(lay, unit)}{scalars} = {_number(value)}"


def _number(value: float) -> str:
    """A count as an integer, a fractional ESS with 3 significant digits (never in exponent
    form: 1330 stays "1,330"), NaN as "n/a"."""
    if value is None or not math.isfinite(value):
        return "n/a"
    value = float(value)
    if value.is_integer() or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"
