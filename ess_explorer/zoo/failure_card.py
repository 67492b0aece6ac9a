"""What a failure-mode pair's cards keep of the zoo's failure-mode record (zoo/collapse.py writes
it): the card field and the README section. Apart from collapse.py so that the cards can render it
without importing the measurement (which writes the cards)."""

from __future__ import annotations

from .resets import LEVEL

__all__ = ["FAILURE_RECORD", "card_field", "failure_lines", "interval_text"]

FAILURE_RECORD = "failure_mode.json"  # next to the model folders


def failure_lines(card: dict) -> list[str]:
    """The card README's section on its failure-mode pair (empty without a ``failure_mode`` field)."""
    rec = card.get("failure_mode")
    if not rec or not rec["verdict"]:
        return []
    collapsed, twin = rec["collapsed"], rec["twin"]
    runs = {n: {r["seed"]: r for r in rec["models"][n]["runs"]} for n in (collapsed, twin)}
    lines = [
        "",
        "### The collapse failure mode, over seeds and fresh prompts",
        "",
        f"`{collapsed}` (deliberately collapsed; see its spec) beside `{twin}` (the same architecture, task and budget, "
        f"trained well), each seed read on "
        f"{len(rec['fresh_seeds'])} fresh prompt sets (seeds {', '.join(map(str, rec['fresh_seeds']))}; utilisation over "
        f"whole prompts on {rec['n_prompts']} prompts per set, as a share of what the rank cap allows, in the layer "
        f"using the most of it; accuracy on {rec['n_samples']} sequences per set). Rule: {rec['rule']}.",
        "",
        f"| seed | {collapsed} share of cap | {collapsed} accuracy | {twin} share of cap | {twin} accuracy |",
        "|---|---|---|---|---|",
    ]
    for seed in sorted(set(runs[collapsed]) | set(runs[twin])):
        cells = []
        for n in (collapsed, twin):
            r = runs[n].get(seed)
            cells += [f"{r['share_of_cap']:.3f}", f"{r['accuracy']:.3f}"] if r else ["-", "-"]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    means = [rec["models"][n]["summary"] for n in (collapsed, twin)]
    lines.append(
        f"| mean, {LEVEL:.0%} t interval | "
        + " | ".join(f"{interval_text(s['share_of_cap'])} | {interval_text(s['accuracy'])}" for s in means)
        + " |"
    )
    lines += ["", f"**{rec['verdict']['line']}.**"]
    apart = rec.get("accuracy_apart")
    if apart:
        lines += [
            "",
            f"Beside the rule (descriptive): the collapsed model's best seed reaches {apart['collapsed_best']:.3f} "
            f"accuracy, the twin's worst {apart['twin_worst']:.3f}: "
            + (
                "every collapsed seed lies below every twin seed."
                if apart["every_seed_below"]
                else "the seeds overlap."
            ),
        ]
    return lines


def card_field(record: dict, name: str) -> dict | None:
    """What the card of ``name`` keeps of ``record``: its pair (collapsed, twin, both models' runs and
    summaries, the verdict), the rule and the prompt sets; None when ``name`` is in no pair."""
    for collapsed, pair in record.get("pairs", {}).items():
        if name in (collapsed, pair["twin"]):
            keep = ("rule", "share", "level", "fresh_seeds", "n_prompts", "n_samples")
            return {
                **{k: record[k] for k in keep},
                "role": "collapsed" if name == collapsed else "twin",
                "collapsed": collapsed,
                "twin": pair["twin"],
                "models": pair["models"],
                "verdict": pair["verdict"],
                "accuracy_apart": pair.get("accuracy_apart"),
            }
    return None


def interval_text(rec: dict) -> str:
    """A t_interval record as text: mean [low, high], or the mean and "one seed"."""
    if rec["interval"] is None:
        return f"{rec['mean']:.3f}, one seed"
    return f"{rec['mean']:.3f} [{rec['interval'][0]:.3f}, {rec['interval'][1]:.3f}]"
