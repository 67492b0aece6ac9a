"""The zoo's index page (README.md next to the model folders), written by
``python -m ess_explorer.zoo.claim --write`` from the cards and the claim's numbers."""

from __future__ import annotations

__all__ = ["zoo_readme", "model_table", "advice_check_lines", "advice_check_verdicts", "ADVICE_CHECK", "CLOSE_POINTS"]

ADVICE_CHECK = "advice_check.json"  # scripts/advice_check.py's record, next to this README
CLAIM_RECORD = "claim.json"  # zoo.claim --write's record, next to this README (models: every card and replica in it)
# The paper's prediction, made testable: the advised student is "within a few points" of its teacher when the
# mean gap is at most this, and the quarter-size one "clearly below" when the whole interval of its gap is above it.
CLOSE_POINTS = 0.03


def model_table(cards: dict[str, dict]) -> list[str]:
    """One Markdown row per model: task, training, plateau, accuracy, ESS and TSS in scalars."""
    from ..sources import DEFAULT_MODEL

    lines = [
        "| model | family | task (L) | steps | plateau | held-out accuracy | ESS(t*) / TSS (scalars) | state at t* (rank cap allows) "
        "| utilisation over prompts per layer (untrained copy) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in cards.items():
        task, tr, ess = c["task"], c["training"], c["ess"]
        kind = "K mix " + "/".join(map(str, tr["train_pairs"])) if tr.get("train_pairs") else f"K = {task['num_pairs']}"
        if task.get("stale_queries"):
            kind += f", {task['num_segments']} segments with stale queries" + (
                " (answer: the earlier value)" if task.get("stale_answer") == "earlier" else ""
            )
        elif task["num_segments"] > 1:
            kind += f", {task['num_segments']} segments" + ("" if task.get("separators", True) else " without '|'")
        if task.get("num_keys", 60) != 60:
            kind += f", {task['num_keys']} keys"
        plateau = tr.get("plateau") or {}
        curve = c["training_curve"]
        at_target = bool(curve) and curve[-1]["val_accuracy"] >= tr.get("target_accuracy", 0.99)
        pl = (
            "yes"
            if plateau.get("plateau")
            else "target reached"
            if at_target
            else f"no ({100 * plateau['change']:+.1f} pts)"
            if plateau.get("change") is not None
            else "-"
        )
        util = " / ".join(f"{v['utilisation']:.3f}" for v in c["utilisation"]["layers"].values())
        base = c.get("untrained", {}).get("utilisation", {}).get("layers", {})
        ub = " / ".join(f"{v['utilisation']:.3f}" for v in base.values()) or "-"
        mark = " (default)" if name == DEFAULT_MODEL else ""
        lines.append(
            f"| `{name}`{mark} | {c['family']} | {kind} ({task['length']}) | {tr['steps_run']} | {pl} | "
            f"{c['heldout']['accuracy']:.3f} | {ess['ess']:.0f} / {ess['tss']:.0f} | {ess['state']} "
            f"({ess.get('rank_cap_allows', float('nan')):.2f}) | {util} ({ub}) |"
        )
    return lines


def _num(value: float) -> str:
    return f"{round(value, 3) + 0.0:.3f}"  # + 0.0: no "-0.000"


def _pm(summary: dict) -> str:
    if summary.get("low") is None:
        return _num(summary["mean"])
    return f"{_num(summary['mean'])} [{_num(summary['low'])}, {_num(summary['high'])}]"


def _below(gap: float) -> str:
    return f"{100 * abs(gap):.1f} points " + ("below" if gap >= 0 else "above")


def advice_check_verdicts(record: dict) -> list[str]:
    """One sentence per teacher: does the advised student stay within CLOSE_POINTS of the teacher, and does
    the quarter-size one fall clearly below (the whole interval of its gap above CLOSE_POINTS)?"""
    out = []
    for name, teacher in record["teachers"].items():
        students = teacher.get("students", {})
        if "advised" not in students or "quarter" not in students:
            out.append(f"- {name}: not every student size was trained; no verdict.")
            continue
        advised, quarter = students["advised"]["gap_to_teacher"], students["quarter"]["gap_to_teacher"]
        close = abs(advised["mean"]) <= CLOSE_POINTS
        below = quarter.get("low") is not None and quarter["low"] > CLOSE_POINTS
        out.append(
            f"- {name}: the advised student (n = {students['advised']['state_size']}) is "
            f"{_below(advised['mean'])} the teacher ("
            + ("within" if close else "not within")
            + f" {100 * CLOSE_POINTS:.0f}); the quarter-size one (n = {students['quarter']['state_size']}) is "
            f"{_below(quarter['mean'])} it, "
            + (
                "clearly below (the whole interval of its gap is above "
                if below
                else "not clearly below (the interval of its gap reaches "
            )
            + f"{100 * CLOSE_POINTS:.0f} points"
            + ("" if below else " or less")
            + "). The prediction "
            + ("holds" if close and below else "does not hold")
            + " for this teacher."
        )
    return out


def advice_check_lines(record: dict) -> list[str]:
    """The README section of the advice checked by training (scripts/advice_check.py)."""
    lines = [
        "## The advice checked by training (`python scripts/advice_check.py`)",
        "",
        f"For each teacher: a sweep of ESS over {record['prompts']} task prompts, `ess_explorer.advise` at q = "
        f"{record['quantile']:g} of {record['variant']}-ESS per unit, the advised state n = the largest over the "
        f"teacher's layers; students: {record['student']['architecture']}, trained {record['student']['training']}; "
        f"{record['student']['evaluation']}; seeds trained: "
        f"{', '.join(str(s) for s in sorted({st['seed'] for st in record['students']})) or 'none'}; "
        f"{record['student']['interval']}. Teacher accuracy with a Wilson 95% interval over its queries.",
        "",
        "| teacher | family | teacher accuracy | advised n per unit (layer, 95% interval) | student | n | student accuracy "
        "(per seed) | gap to the teacher |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, teacher in record["teachers"].items():
        layer = next(a for a in teacher["advice"]["layers"] if a["layer"] == teacher["advised_from_layer"])
        advised = layer["advised_per_unit"]
        for label in ("advised", "half", "quarter"):
            student = teacher.get("students", {}).get(label)
            if student is None:
                continue
            seeds = ", ".join(f"{a:.3f}" for a in student["per_seed"])
            lines.append(
                f"| `{name}` | {teacher['family']} | {teacher['accuracy']:.3f} [{teacher['low']:.3f}, "
                f"{teacher['high']:.3f}] | {advised['value']:.0f} (layer {layer['layer']}, [{advised['low']:.0f}, "
                f"{advised['high']:.0f}]; has {layer['state_per_unit']:.0f}) | {label} | {student['state_size']} | "
                f"{_pm(student)} ({seeds}) | {_pm(student['gap_to_teacher'])} |"
            )
    lines.append("")
    for name, teacher in record["teachers"].items():
        layer = next(a for a in teacher["advice"]["layers"] if a["layer"] == teacher["advised_from_layer"])
        others = []
        for variant in ("entropy", "causal"):
            dist = layer["distributions"].get(variant)
            at_q = dist and next((q for q in dist["quantiles"] if q["q"] == record["quantile"]), None)
            if at_q:
                others.append(f"{variant}-ESS {at_q['per_unit']['value']:.0f}")
        mean = layer["distributions"][record["variant"]]["mean_per_unit"]["value"]
        lines.append(
            f"- {name}, layer {layer['layer']}: mean {record['variant']}-ESS per unit {mean:.1f}; at the same quantile "
            + (", ".join(others) or "no other variant")
            + f" (the advice follows {record['variant']}-ESS)."
        )
    lines += [
        "",
        *advice_check_verdicts(record),
        "",
        f"CPU time of the whole command: {record['cpu_seconds'] / 60:.1f} min on {record['threads']} thread(s). "
        "Figure: `advice_check.png` next to this page.",
        "",
    ]
    return lines


def zoo_readme(claim_text: str, verdicts: list[str], cards: dict[str, dict], advice_check: dict | None = None) -> str:
    from .measure import __doc__ as conventions

    return "\n".join(
        [
            "# The ess-explorer zoo",
            "",
            "Tiny models (2 layers, 64 wide, float32) trained from scratch on multi-query associative recall (MQAR) with",
            "readable tokens (keys are syllables, values two-digit strings). Each folder is a standard Hugging Face model",
            "(config.json, model.safetensors, tokenizer.json) with a model card (README.md, card.json) and its training record",
            '(training.json, with the learning curve). Load one with `ess_explorer.zoo.load(name)` or `load_model("zoo:NAME")`.',
            "",
            "Commands (CPU, one thread, fixed seeds):",
            "",
            "- retrain a model: `python -m ess_explorer.zoo.train --only NAME` (then its card is measured and written)",
            "- rewrite the cards without training: `python -m ess_explorer.zoo.train --cards-only`",
            "- recompute this page: `python -m ess_explorer.zoo.claim --write` (from the cards and `seeds.json`; it also saves the "
            "record as `claim.json` and adds each card's seeds and claim tests to its README; `--recompute` re-measures the cards first)",
            "- one model's difficulty curve: `ess_explorer.zoo.sweep_difficulty(NAME)`; its untrained copy: `untrained=True`",
            "- check the advice of `ess_explorer.advise` by training students: `python scripts/advice_check.py` (below)",
            "",
            "## Models",
            "",
            *model_table(cards),
            "",
            "Tasks: the main task is MQAR at L = 128 (K pairs, then 64 - K queries that ask the stored keys again); training draws",
            "K from 2, 4, 8, 16, 32 in turn, so every K of the difficulty sweep is in distribution. The reset task has 4 segments",
            "of 8 pairs + 8 queries separated by `|` (L = 131); in segments 2-4, 3 queries ask a key of an earlier segment that is",
            "absent from the current one, answer `--`; its matched control (the `_keep` models) draws the same prompts but",
            "answers such a query with the key's latest earlier value, so `|` carries no reset. The recent-recall task has 13",
            "short recalls (3 pairs, 2 queries) back to back over only 6 keys (L = 130): a key comes back every few tokens with a",
            "new value; the rebinding task is the",
            "same over 4 keys; the separated task puts `|` between the recalls (L = 142). The state at t* is capped by the",
            "cut's rank min(t*, L - t*) (shown in brackets): at t* = 6 a large state reads as collapsed by construction, so",
            "read collapse in the last column (utilisation over whole prompts, the ratio of peaks over all cuts).",
            "",
            "## What the data show",
            "",
            *verdicts,
            "",
            *(advice_check_lines(advice_check) if advice_check else []),
            "## The claim with its uncertainty (`python -m ess_explorer.zoo.claim`)",
            "",
            "```",
            claim_text,
            "```",
            "",
            "## How ESS, TSS and the states are measured",
            "",
            conventions.split("Conventions (written into every card):\n", 1)[1].strip(),
            "",
        ]
    )
