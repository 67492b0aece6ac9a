"""The zoo's index page (README.md next to the model folders), written by
``python -m ess_explorer.zoo.claim --write`` from the cards and the claim's numbers."""

from __future__ import annotations

__all__ = ["zoo_readme", "model_table"]


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
            kind += f", {task['num_segments']} segments with stale queries"
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


def zoo_readme(claim_text: str, verdicts: list[str], cards: dict[str, dict]) -> str:
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
            "- recompute this page: `python -m ess_explorer.zoo.claim --write` (from the cards; `--recompute` re-measures them first)",
            "- one model's difficulty curve: `ess_explorer.zoo.sweep_difficulty(NAME)`; its untrained copy: `untrained=True`",
            "",
            "## Models",
            "",
            *model_table(cards),
            "",
            "Tasks: the main task is MQAR at L = 128 (K pairs, then 64 - K queries that ask the stored keys again); training draws",
            "K from 2, 4, 8, 16, 32 in turn, so every K of the difficulty sweep is in distribution. The reset task has 4 segments",
            "of 8 pairs + 8 queries separated by `|` (L = 131); in segments 2-4, 3 queries ask a key of an earlier segment that is",
            "absent from the current one, answer `--`. The recent-recall task has 13 short recalls (3 pairs, 2 queries) back to",
            "back over only 6 keys (L = 130): a key comes back every few tokens with a new value; the rebinding task is the",
            "same over 4 keys; the separated task puts `|` between the recalls (L = 142). The state at t* is capped by the",
            "cut's rank min(t*, L - t*) (shown in brackets): at t* = 6 a large state reads as collapsed by construction, so",
            "read collapse in the last column (utilisation over whole prompts, the ratio of peaks over all cuts).",
            "",
            "## What the data show",
            "",
            *verdicts,
            "",
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
