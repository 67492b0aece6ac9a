"""Learned resets against matched controls, with intervals over training seeds.

A reset model and its control (``specs.RESET_CONTROLS``) share the architecture, the budget and,
for the reset task, the prompts: the control's task draws the same keys, values and queries, but
a query for a key of an earlier segment is answered with that key's earlier value, so "|"
carries no reset. Both are measured at "|" on the same prompts (the reset model's card
``separator_drop``, the control's ``separator_control``: ``measure.separator_drop``, the one
modulation of ``core.diagnostics.separator_modulation``, strongest memory layer).

Per training seed s present for both (the shipped model is seed 0, ``seeds.json`` adds replicas):
the graded modulation (nuclear norm of the cuts) of the reset model minus its control's, the same
for the count modulation, and for the past scale (sigma_1 at "|" over sigma_1 before, smallest
over memory layers; below 0 = the reset model scales the past down more). Over seeds: the mean
with a 95% Student-t interval, mean +- t(0.975, n - 1) sd / sqrt(n) (n >= 2; one seed: no
interval). Verdict: a learned reset is seen when the graded difference's interval lies above 0
and its mean is at least ``GRADED_MARGIN`` (a difference large enough to read, the margin the
single-seed reading used).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

__all__ = [
    "GRADED_MARGIN",
    "LEVEL",
    "ACCURACY_GAP",
    "control_role",
    "t_interval",
    "reset_seed_pairs",
    "reset_summary",
    "reset_line",
]

GRADED_MARGIN = 0.2  # a graded modulation this far above the control's reads as a learned (partial) reset
LEVEL = 0.95
ACCURACY_GAP = 0.1  # a control this far below its reset model in held-out accuracy learned its task much less well


def t_interval(values, level: float = LEVEL) -> dict:
    """{n, mean, sd, interval}: the mean of ``values`` with its Student-t interval at ``level``
    (mean +- t((1 + level) / 2, n - 1) sd / sqrt(n), sd with n - 1); interval None when n < 2."""
    x = np.asarray(list(values), dtype=np.float64)
    if x.size == 0:
        raise ValueError("t_interval needs at least one value")
    if not np.isfinite(x).all():
        raise ValueError(f"t_interval needs finite values, got {x.tolist()}")
    mean = float(x.mean())
    if x.size < 2:
        return {"n": 1, "mean": mean, "sd": None, "interval": None}
    sd = float(x.std(ddof=1))
    half = float(stats.t.ppf((1 + level) / 2, x.size - 1)) * sd / math.sqrt(x.size)
    return {"n": int(x.size), "mean": mean, "sd": sd, "interval": [mean - half, mean + half]}


def control_role(control: dict) -> str:
    """What a card's ``separator_control`` record is a control of: a model trained with '|' where it
    carries no reset (matched: same prompts and budget), or one that never saw '|' in training."""
    if control.get("trained_on_separators"):
        return "Matched control: '|' in training, no reset"
    return "Control: no '|' in training"


def _past_scale(drop: dict) -> float:
    return min(lay.get("past_scale", 1.0) for lay in drop["layers"].values())


def _by_seed(cards: dict[str, dict], model: str) -> dict[int, dict]:
    """{training seed: card or replica record} of zoo model ``model`` (replicas: ``replica_of``)."""
    return {info["training"]["seed"]: info for name, info in cards.items() if info.get("replica_of", name) == model}


def reset_seed_pairs(cards: dict[str, dict], model: str, control: str) -> list[dict]:
    """One row per training seed that both ``model`` and ``control`` have (with their separator
    records), in seed order: graded and count modulation, past scale, held-out and stale-query
    accuracy of each, and the reset-minus-control differences ``graded_difference``,
    ``count_difference``, ``past_scale_difference``. ``control_graded_own``: the control's graded
    modulation on its own prompts (None when it has none)."""
    resets, controls = _by_seed(cards, model), _by_seed(cards, control)
    rows = []
    for seed in sorted(set(resets) & set(controls)):
        r, c = resets[seed], controls[seed]
        if "separator_drop" not in r or "separator_control" not in c:
            continue
        drop, ctrl = r["separator_drop"], c["separator_control"]
        row = {
            "seed": seed,
            "graded_reset": drop["graded_modulation"],
            "graded_control": ctrl["graded_modulation"],
            "count_reset": drop["modulation"],
            "count_control": ctrl["modulation"],
            "past_scale_reset": _past_scale(drop),
            "past_scale_control": _past_scale(ctrl),
            "accuracy_reset": r["heldout"]["accuracy"],
            "accuracy_control": c["heldout"]["accuracy"],
            "stale_accuracy_reset": r["heldout"].get("stale_accuracy"),
            "stale_accuracy_control": c["heldout"].get("stale_accuracy"),
            "control_graded_own": c.get("separator_drop", {}).get("graded_modulation"),
        }
        for key in ("graded", "count", "past_scale"):
            row[f"{key}_difference"] = row[f"{key}_reset"] - row[f"{key}_control"]
        rows.append(row)
    return rows


def reset_summary(rows: list[dict], margin: float = GRADED_MARGIN, level: float = LEVEL) -> dict:
    """Over the seeds of ``reset_seed_pairs``: ``t_interval`` of each difference (graded, count,
    past scale) and of the accuracies, and ``seen``: whether the graded difference's interval lies
    above 0 with a mean of at least ``margin`` (False with one seed: no interval)."""
    if not rows:
        raise ValueError("reset_summary needs at least one seed measured for both the model and its control")
    keys = ("graded_difference", "count_difference", "past_scale_difference", "accuracy_reset", "accuracy_control")
    out = {key: t_interval([r[key] for r in rows], level) for key in keys}
    for key in ("stale_accuracy_reset", "stale_accuracy_control"):
        values = [r[key] for r in rows if r[key] is not None]
        out[key] = t_interval(values, level) if values else None
    graded = out["graded_difference"]
    out["seen"] = bool(graded["interval"] is not None and graded["interval"][0] > 0 and graded["mean"] >= margin)
    out.update(seeds=[r["seed"] for r in rows], margin=margin, level=level)
    return out


def _mean(rec: dict | None, fmt: str = "+.2f") -> str:
    if rec is None:
        return "-"
    if rec["interval"] is None:
        return f"{rec['mean']:{fmt}}"
    lo, hi = rec["interval"]
    return f"{rec['mean']:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def _seed_range(rows: list[dict], key: str) -> str:
    """Mean of an accuracy over seeds with its range (a t interval is no use for a bounded value
    over two or three seeds)."""
    values = [r[key] for r in rows if r[key] is not None]
    mean = sum(values) / len(values)
    return f"{mean:.3f}" if len(values) < 2 else f"{mean:.3f} (seeds {min(values):.3f}-{max(values):.3f})"


def _verdict(label: str, summary: dict) -> str:
    graded, margin, level = summary["graded_difference"], summary["margin"], summary["level"]
    if summary["seen"]:
        return (
            f"A learned reset is seen in {label}: the graded difference's {level:.0%} interval lies above 0 and its "
            f"mean is at least {margin}."
        )
    if graded["interval"] is None:
        side = "at least" if graded["mean"] >= margin else "below"
        return (
            f"No learned reset is established in {label}: one seed, so no interval over seeds (that seed's graded "
            f"difference is {side} the margin {margin})."
        )
    return (
        f"No learned reset is established in {label}: the graded difference's {level:.0%} interval does not lie above 0 "
        f"with a mean of at least {margin}."
    )


def reset_line(model: str, control: str, family: str, rows: list[dict], summary: dict) -> str:
    """The README line of one reset model against its control: per seed, then the means over seeds
    (differences with their t intervals when n >= 2, accuracies with their range), the verdict, and a caveat when the control learned its
    task much less well than the reset model (``ACCURACY_GAP``)."""
    seeds = "; ".join(
        f"seed {r['seed']}: graded {r['graded_reset']:+.2f} vs {r['graded_control']:+.2f}, count "
        f"{r['count_reset']:+.2f} vs {r['count_control']:+.2f}, past scaled by {r['past_scale_reset']:.2f} vs "
        f"{r['past_scale_control']:.2f}, accuracy {r['accuracy_reset']:.3f} vs {r['accuracy_control']:.3f}"
        + (
            f" (control's stale queries {r['stale_accuracy_control']:.3f})"
            if r["stale_accuracy_control"] is not None
            else ""
        )
        for r in rows
    )
    n = len(rows)
    spread = f"mean [{summary['level']:.0%} t interval]" if n > 1 else "one seed, no interval"
    acc_reset, acc_control = summary["accuracy_reset"], summary["accuracy_control"]
    caveat = (
        f" Caveat: the control learned its task much less well (held-out accuracy {acc_control['mean']:.3f} against "
        f"{acc_reset['mean']:.3f}), so the difference at '|' may reflect that as much as a reset."
        if acc_control["mean"] < acc_reset["mean"] - ACCURACY_GAP
        else ""
    )
    return (
        f"- Reset, {model} against {control} (same prompts, n = {n} seed{'s' if n > 1 else ''}; {seeds}). "
        f"Reset minus control, {spread}: graded {_mean(summary['graded_difference'])}, "
        f"count {_mean(summary['count_difference'])}, past scale {_mean(summary['past_scale_difference'])}; "
        f"held-out accuracy {_seed_range(rows, 'accuracy_reset')} vs {_seed_range(rows, 'accuracy_control')}"
        + (
            f", the control's stale-query accuracy {_seed_range(rows, 'stale_accuracy_control')}"
            if summary["stale_accuracy_control"] is not None
            else ""
        )
        + f". {_verdict(f'{family} ({model})', summary)}{caveat}"
    )
