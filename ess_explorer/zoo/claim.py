"""The paper's central MQAR claim, in miniature, on the zoo.

    python -m ess_explorer.zoo.claim            # from the model cards (seconds)
    python -m ess_explorer.zoo.claim --recompute   # re-measure accuracy and ESS first (minutes)

Claim (Parnichkun et al. 2025): across models and task settings, ESS normalised by the
number of key-value pairs (ESS/kv) predicts MQAR accuracy better than the theoretical
state size normalised the same way (TSS/kv). Here: the Pearson and Spearman correlation of
held-out accuracy with ESS/kv and with TSS/kv across the zoo (Pearson also with log TSS/kv,
since TSS spans orders of magnitude), and the ESS drop at the separators of the segmented
models. What the numbers show is printed as is: a small zoo gives a noisy estimate.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from scipy import stats

__all__ = ["claim_table", "correlations", "main"]


def claim_table(names=None, recompute: bool = False) -> list[dict]:
    """One row per zoo model: name, family, segments, kv, accuracy, ESS, TSS, ESS/kv, TSS/kv, utilisation, state."""
    from . import card, list_models, model_dir
    from .cards import write_card

    rows = []
    for name in names or list_models():
        info = write_card(name, model_dir(name)) if recompute else card(name)
        ess = info["ess"]
        rows.append(
            {
                "name": name,
                "family": info["family"],
                "segments": info["task"]["num_segments"],
                "kv": info["task"]["num_pairs"],
                "accuracy": info["heldout"]["accuracy"],
                "ess": ess["ess"],
                "tss": ess["tss"],
                "ess_per_kv": ess["ess_per_kv"],
                "entropy_ess_per_kv": ess["entropy_ess_per_kv"],
                "tss_per_kv": ess["tss_per_kv"],
                "utilisation": ess["utilisation"],
                "state": ess["state"],
                "separator_drop": info.get("separator_drop"),
                "separator_control": info.get("separator_control"),
            }
        )
    return rows


def correlations(rows: list[dict]) -> dict:
    """Pearson / Spearman of accuracy with ESS/kv (tolerance and entropy), TSS/kv, and their log10."""
    if len(rows) < 3:
        raise ValueError(f"need at least 3 models to correlate, got {len(rows)}")
    acc = np.array([r["accuracy"] for r in rows])
    ess = np.array([r["ess_per_kv"] for r in rows])
    ent = np.array([r["entropy_ess_per_kv"] for r in rows])
    tss = np.array([r["tss_per_kv"] for r in rows])

    def both(x):
        if np.ptp(x) == 0 or np.ptp(acc) == 0:
            return {"pearson": float("nan"), "spearman": float("nan")}
        return {"pearson": float(stats.pearsonr(x, acc)[0]), "spearman": float(stats.spearmanr(x, acc)[0])}

    return {
        "n_models": len(rows),
        "ess_per_kv": both(ess),
        "entropy_ess_per_kv": both(ent),
        "tss_per_kv": both(tss),
        "log_tss_per_kv": both(np.log10(tss)),
        "log_ess_per_kv": both(np.log10(np.maximum(ess, 1e-9))),
    }


def _format(rows: list[dict]) -> str:
    head = f"{'model':<16}{'family':<24}{'seg':>4}{'kv':>4}{'acc':>8}{'ESS':>8}{'TSS':>8}{'ESS/kv':>8}{'eESS/kv':>8}{'TSS/kv':>8}{'util':>7}  state"
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(
            f"{r['name']:<16}{r['family']:<24}{r['segments']:>4}{r['kv']:>4}{r['accuracy']:>8.3f}{r['ess']:>8.1f}{r['tss']:>8.0f}"
            f"{r['ess_per_kv']:>8.2f}{r['entropy_ess_per_kv']:>8.2f}{r['tss_per_kv']:>8.2f}{r['utilisation']:>7.3f}  {r['state']}"
        )
    return "\n".join(out)


def _format_corr(label: str, corr: dict) -> str:
    lines = [f"{label} (n = {corr['n_models']} models):"]
    for key, name in (("ess_per_kv", "ESS/kv"), ("entropy_ess_per_kv", "entropy-ESS/kv"), ("tss_per_kv", "TSS/kv"), ("log_tss_per_kv", "log10 TSS/kv"), ("log_ess_per_kv", "log10 ESS/kv")):
        lines.append(f"  accuracy vs {name:<15} Pearson {corr[key]['pearson']:+.3f}   Spearman {corr[key]['spearman']:+.3f}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m ess_explorer.zoo.claim", description=__doc__.split("\n")[0])
    parser.add_argument("--recompute", action="store_true", help="re-measure accuracy and ESS (rewrites the cards)")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON instead of tables")
    parser.add_argument("--write", action="store_true", help="also write the output into assets/zoo/README.md (the zoo index)")
    args = parser.parse_args(argv)
    rows = claim_table(recompute=args.recompute)
    single = [r for r in rows if r["segments"] == 1]
    summary = {"rows": [{k: v for k, v in r.items() if not k.startswith("separator")} for r in rows]}
    summary["main_task"] = correlations(single) if len(single) >= 3 else None
    summary["all_models"] = correlations(rows) if len(rows) >= 3 else None
    drops = {r["name"]: r["separator_drop"] for r in rows if r["separator_drop"]}
    trained_families = {r["family"] for r in rows if r["separator_drop"]}
    controls = {r["name"]: r["separator_control"] for r in rows if r["separator_control"] and r["family"] in trained_families}
    strip = lambda d: {i: {k: v for k, v in lay.items() if k != "ess_over_time"} for i, lay in d["layers"].items()}  # noqa: E731
    summary["separator_drop"] = {name: strip(d) for name, d in drops.items()}
    summary["separator_control"] = {name: strip(d) for name, d in controls.items()}
    if args.json:
        print(json.dumps(summary, indent=2))
        return summary
    text = [_format(rows), ""]
    if summary["main_task"]:
        kv = sorted({r["kv"] for r in single})
        text.append(_format_corr(f"Main task (one segment, K = {', '.join(map(str, kv))})", summary["main_task"]))
    if summary["all_models"]:
        text.append(_format_corr("All models (kv = pairs per segment)", summary["all_models"]))
    text.append("")
    labelled = [(name, d, "trained on segments") for name, d in drops.items()]
    labelled += [(name, d, "control: never saw '|'") for name, d in controls.items()]
    for name, d, label in labelled:
        text.append(f"ESS at the separators {d['separators']} of {name} ({label}; total over units, mean of {d['n_prompts']} prompts):")
        for i, lay in d["layers"].items():
            text.append(
                f"  layer {i} ({lay['family']}): {lay['ess_before']:.1f} before '|' (mean of {d['window']} cuts) -> {lay['ess_at']:.1f} at t = '|'"
                f" -> {lay['ess_after']:.1f} at t = '|' + 1   modulation {lay['modulation']:+.2f} / {lay['modulation_after']:+.2f}"
            )
    output = "\n".join(text)
    print(output)
    if args.write:
        from . import ZOO_DIR

        path = ZOO_DIR / "README.md"
        path.write_text(_index(output))
        print(f"\nwrote {path}")
    return summary


def _index(output: str) -> str:
    from .cards import __doc__ as conventions

    return "\n".join(
        [
            "# The ess-explorer zoo",
            "",
            "Tiny models (2 layers, 64 wide, float32) trained from scratch on multi-query associative recall (MQAR) with",
            "readable tokens (keys are syllables, values two-digit strings). Each folder is a standard Hugging Face model",
            "(config.json, model.safetensors, tokenizer.json) with a model card (README.md, card.json) and its training record",
            "(training.json). Load one with `ess_explorer.zoo.load(name)` or `load_model(\"zoo:NAME\")`; retrain with",
            "`python -m ess_explorer.zoo.train --only NAME`; recompute this page with `python -m ess_explorer.zoo.claim --write`.",
            "",
            "## The MQAR claim in miniature (`python -m ess_explorer.zoo.claim`)",
            "",
            "```",
            output,
            "```",
            "",
            "## How ESS, TSS and the states are measured",
            "",
            conventions.split("Conventions (also written into every card):\n", 1)[1].strip(),
            "",
        ]
    )


if __name__ == "__main__":
    main()
