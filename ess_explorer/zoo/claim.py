"""The paper's central MQAR claim, in miniature, with its uncertainty, on the zoo.

    python -m ess_explorer.zoo.claim              # from the model cards and the seed replicas (seconds)
    python -m ess_explorer.zoo.claim --write      # ... and write the zoo README (assets)
    python -m ess_explorer.zoo.claim --recompute  # re-measure every card first (minutes)

Claim (Parnichkun et al. 2025): across models and task settings, ESS normalised by the number
of key-value pairs (ESS/kv) predicts MQAR accuracy better than the theoretical state size
normalised the same way (TSS/kv). Every trained model's difficulty sweep gives points (model,
K). ESS is aggregated over time as in the paper, the layer total's mean and max over the cuts
t = 1..L-1 (the primary readings), with TSS aggregated the same way; the reading at the single
cut t* = 2K, where no unit can exceed rank 2K, is kept as a labelled variant ("cut").

Statistics (claim_stats.py): Spearman and Pearson (also on log10) of held-out accuracy with each
predictor; 95% bootstrap intervals resampling architectures, then the training seeds of each
(the shipped model is seed 0; the replicas of seeds.json add seeds where they were trained).
Tests: for each aggregation, Spearman(ESS/kv) - Spearman(TSS/kv) and the same for
entropy-ESS/kv, over all models and over the main task; and, on the main task and the mean over
t, the same with each family left out (what holds per family). Every test is reported with its
Holm-adjusted p-value and its Bonferroni-widened interval. Control: the untrained copies' ESS
as the predictor of the trained accuracy (descriptive, not a test). Also: the learned resets
(count and graded modulation at "|", each reset model against its matched control, seed by seed,
with a t interval over seeds: zoo/resets.py) and the utilisation over prompts.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from .claim_names import PRIMARY, QUANTITY_NAMES, comparison_name, test_name
from .claim_stats import bootstrap, corrected_tests, correlations
from .collapse import FAILURE_SHARE
from .failure_card import FAILURE_RECORD
from .readme import CLAIM_RECORD
from .resets import control_role, reset_line, reset_seed_pairs, reset_summary
from .specs import FAILURE_PAIR_MODELS

__all__ = [
    "CLAIM_RECORD",
    "AGGREGATIONS",
    "PREDICTORS",
    "COMPARISONS",
    "points",
    "claim",
    "format_claim",
    "verdict",
    "NOT_IN_CLAIM",
    "main",
]

# aggregation -> (label, {quantity: sweep-row key}); "cut" is the labelled single-cut variant
AGGREGATIONS = {
    "mean": (
        "mean over t",
        {"ess": "ess_mean_per_kv", "entropy_ess": "entropy_ess_mean_per_kv", "tss": "tss_mean_per_kv"},
    ),
    "max": ("max over t", {"ess": "ess_max_per_kv", "entropy_ess": "entropy_ess_max_per_kv", "tss": "tss_max_per_kv"}),
    "cut": (
        "single cut t* = 2K (variant)",
        {"ess": "ess_per_kv", "entropy_ess": "entropy_ess_per_kv", "tss": "tss_per_kv"},
    ),
}
PREDICTORS = {key: f"{QUANTITY_NAMES[q]} ({label})" for label, keys in AGGREGATIONS.values() for q, key in keys.items()}
# test name -> (predictor, reference): Spearman(predictor) - Spearman(reference)
COMPARISONS = {
    comparison_name(agg, q): (keys[q], keys["tss"])
    for agg, (_, keys) in AGGREGATIONS.items()
    for q in ("ess", "entropy_ess")
}
FAILURE_ACCURACY = 0.9  # one model's reading of the failure mode: at most FAILURE_SHARE of the cap, accuracy below this
# shipped models that are not points of the claim, each with the reason
NOT_IN_CLAIM = {
    name: "a deliberately collapsed model and its well-trained twin: the failure-mode pair, reported on its own "
    f"(zoo/collapse.py, {FAILURE_RECORD})"
    for name in FAILURE_PAIR_MODELS
}
N_BOOT = 2000
BOOT_SEED = 0


def points(cards: dict[str, dict], untrained: bool = False) -> list[dict]:
    """One dict per (model, K) of the cards' sweeps: model, architecture (the zoo model a seed
    replica is a replica of, its ``replica_of``; the model's own name otherwise), seed, family, pairs, accuracy (trained)
    and the predictors present in the row; ``untrained=True`` takes the predictors from the
    untrained copy."""
    out = []
    for name, info in cards.items():
        base = {r["pairs"]: r for r in info.get("untrained", {}).get("sweep", [])}
        for row in info.get("sweep", {}).get("rows", []):
            source = base.get(row["pairs"]) if untrained else row
            if source is None:
                continue
            out.append(
                {
                    "model": name,
                    "architecture": info.get("replica_of", name),
                    "seed": info.get("training", {}).get("seed"),
                    "family": info["family"],
                    "pairs": row["pairs"],
                    "accuracy": row["accuracy"],
                    "untrained_accuracy": base[row["pairs"]]["accuracy"] if row["pairs"] in base else None,
                    **{k: source[k] for k in PREDICTORS if k in source},
                }
            )
    return out


def _group(rows: list[dict], comparisons: dict, n_boot: int, predictors=PREDICTORS) -> dict:
    corr = correlations(rows, predictors)
    boot = bootstrap(rows, predictors, comparisons, n_boot=n_boot, seed=BOOT_SEED)
    observed = {n: corr[p]["spearman"] - corr[r]["spearman"] for n, (p, r) in comparisons.items()}
    return {
        "n_models": len({r["model"] for r in rows}),
        "n_architectures": len({r["architecture"] for r in rows}),
        "n_points": len(rows),
        "correlations": corr,
        "intervals": boot["correlations"],
        "design": boot["design"],
        "resampled": boot["resampled"],
        "n_boot": n_boot,
        "observed": observed,
        "_draws": boot["differences"],
    }


def claim(cards: dict[str, dict], n_boot: int = N_BOOT) -> dict:
    """The whole claim record: groups (all models, main task) x (trained, untrained-ESS control),
    the per-family tests, and every test with its correction (``tests``)."""
    main_task = {n: c for n, c in cards.items() if c["training"].get("train_pairs")}
    groups = {"all": cards, "main_task": main_task}
    out: dict = {"groups": {}}
    observed, draws = {}, {}
    for group, members in groups.items():
        rows = points(members)
        if len({r["architecture"] for r in rows}) >= 2:
            rec = _group(rows, COMPARISONS, n_boot)
            for name, value in rec["observed"].items():
                observed[test_name(group, name)], draws[test_name(group, name)] = value, rec["_draws"][name]
            out["groups"].setdefault(group, {})["trained"] = rec
        control = points({n: c for n, c in members.items() if "untrained" in c}, untrained=True)
        if len({r["architecture"] for r in control}) >= 2:
            out["groups"].setdefault(group, {})["untrained_control"] = _group(control, {}, n_boot)
    rows = points(main_task)
    primary = {n: c for n, c in COMPARISONS.items() if n.startswith(f"{PRIMARY}:")}
    keys = sorted({k for pair in primary.values() for k in pair})
    out["per_family"] = {}
    for family in sorted({r["family"] for r in rows}):
        kept = [r for r in rows if r["family"] != family]
        if len({r["architecture"] for r in kept}) < 2:
            continue
        rec = _group(kept, primary, n_boot, predictors=keys)
        out["per_family"][family] = {k: rec[k] for k in ("n_models", "n_architectures", "n_points", "correlations")}
        for name, value in rec["observed"].items():
            observed[test_name("main_task", name, family)] = value
            draws[test_name("main_task", name, family)] = rec["_draws"][name]
    out["tests"] = corrected_tests(observed, draws)
    for variants in out["groups"].values():
        for rec in variants.values():
            rec.pop("_draws")
    out["untrained_accuracy"] = [p["untrained_accuracy"] for p in points(cards) if p["untrained_accuracy"] is not None]
    pairs = [
        (c["ess"]["ess"], c["untrained"]["ess"]["ess"])
        for c in cards.values()
        if "untrained" in c and "ess" in c["untrained"]
    ]
    out["training_lowered_ess"] = [sum(u >= t for t, u in pairs), len(pairs)] if pairs else None
    out["resets"] = _resets(cards)
    out["reset_seeds"] = _reset_seeds(cards)
    out["collapse"] = _collapse(cards)
    return out


def _resets(cards: dict) -> list[dict]:
    rows = []
    for name, info in cards.items():
        for key in ("separator_drop", "separator_control"):
            if key in info:
                d = info[key]
                rows.append(
                    {
                        "model": name,
                        "role": "own prompts" if key == "separator_drop" else control_role(d).lower(),
                        "modulation": d["modulation"],
                        "layer": d["layer"],
                        "graded_modulation": d.get("graded_modulation"),
                        "per_layer": {i: lay["modulation"] for i, lay in d["layers"].items()},
                        "graded_per_layer": {i: lay.get("graded_modulation") for i, lay in d["layers"].items()},
                        "past_scale": min(lay.get("past_scale", 1.0) for lay in d["layers"].values()),
                        "accuracy": info["heldout"]["accuracy"],
                        "stale_accuracy": info["heldout"].get("stale_accuracy"),
                    }
                )
    return rows


def _reset_seeds(cards: dict) -> dict:
    """{reset model: {control, family, seeds (reset_seed_pairs), summary (reset_summary)}} for every
    pair of RESET_CONTROLS with at least one seed measured for both."""
    from .specs import RESET_CONTROLS

    out = {}
    for model, control in RESET_CONTROLS.items():
        rows = reset_seed_pairs(cards, model, control)
        if rows:
            family = next(c["family"] for n, c in cards.items() if c.get("replica_of", n) == model)
            out[model] = {"control": control, "family": family, "seeds": rows, "summary": reset_summary(rows)}
    return out


def _collapse(cards: dict) -> list[dict]:
    rows = []
    for name, info in cards.items():
        util = info.get("utilisation")
        if not util:
            continue
        base = info.get("untrained", {}).get("utilisation", {}).get("layers", {})
        for i, lay in util["layers"].items():
            rows.append(
                {
                    "model": name,
                    "layer": i,
                    "utilisation": lay["utilisation"],
                    "rank_cap_allows": lay["rank_cap_allows"],
                    "untrained": base.get(i, {}).get("utilisation"),
                    "length": util["length"],
                    "accuracy": info["heldout"]["accuracy"],
                }
            )
    return rows


def _fmt_ci(value: float, ci: list) -> str:
    return f"{value:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]"


def _ci(interval: list) -> str:
    return f"[{interval[0]:+.2f}, {interval[1]:+.2f}]"


def _design(rec: dict) -> str:
    seeds = sorted(set(rec["design"]["seeds_per_architecture"].values()))
    per = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
    return (
        f"{rec['n_architectures']} architectures, {per} seed(s) each, {rec['n_points']} (model, K) points; 95% bootstrap "
        f"over {rec['resampled']}, {rec['n_boot']} resamples"
    )


def format_claim(record: dict, cards: dict) -> str:
    """The claim as text tables (what --write puts into the zoo README)."""
    lines = [
        f"{'model':<24}{'family':<24}{'K':>4}{'acc':>7}{'ESS/kv mean':>12}{'max':>8}{'eESS mean':>10}{'TSS mean':>10}"
        f"{'ESS/kv t*':>10}{'TSS t*':>8}"
    ]
    lines.append("-" * len(lines[0]))
    nan = float("nan")
    for p in points(cards):
        lines.append(
            f"{p['model']:<24}{p['family']:<24}{p['pairs']:>4}{p['accuracy']:>7.3f}{p.get('ess_mean_per_kv', nan):>12.1f}"
            f"{p.get('ess_max_per_kv', nan):>8.1f}{p.get('entropy_ess_mean_per_kv', nan):>10.1f}"
            f"{p.get('tss_mean_per_kv', nan):>10.1f}{p['ess_per_kv']:>10.1f}{p['tss_per_kv']:>8.1f}"
        )
    for group, variants in record["groups"].items():
        for variant, rec in variants.items():
            title = {
                "trained": "accuracy vs the trained model's state",
                "untrained_control": "control: accuracy vs the UNTRAINED copy's state (shipped models only)",
            }[variant]
            lines += ["", f"[{group}] {title} ({_design(rec)})"]
            for key, label in PREDICTORS.items():
                c, b = rec["correlations"].get(key), rec["intervals"].get(key)
                if c is None or not np.isfinite(c["spearman"]):
                    continue
                lines.append(
                    f"  {label:<42} Spearman {_fmt_ci(c['spearman'], b['spearman'])}   "
                    f"Pearson(log10) {_fmt_ci(c['pearson_log10'], b['pearson_log10'])}"
                )
    tests = record["tests"]
    lines += [
        "",
        f"Every test run ({tests['m']}): Spearman difference, its 95% interval, the Bonferroni interval "
        f"(level 1 - {tests['alpha']}/{tests['m']}), bootstrap p and Holm-adjusted p",
    ]
    for name, t in tests["tests"].items():
        lines.append(
            f"  {name:<62} {t['difference']:+.2f} {_ci(t['interval'])}  Bonferroni {_ci(t['bonferroni_interval'])}  "
            f"p {t['p']:.3f}  Holm {t['p_holm']:.3f}{'  holds' if t['holds'] else ''}"
        )
    ua = record["untrained_accuracy"]
    if ua:
        lines += [
            "",
            f"Untrained copies answer at chance: accuracy {min(ua):.3f} to {max(ua):.3f} over all (model, K).",
        ]
    if record["resets"]:
        lines += [
            "",
            "Learned resets at '|' (the one modulation: strongest memory layer; count = tolerance-ESS at the reset-aware",
            "scope, graded = nuclear norm of the cuts; 1 = the past emptied) and the median factor by which '|' scales the",
            "past (sigma_1 of H_sep over sigma_1 before it; smallest over memory layers)",
        ]
        for r in record["resets"]:
            stale = f", stale-query accuracy {r['stale_accuracy']:.3f}" if r["stale_accuracy"] is not None else ""
            graded = r["graded_modulation"] if r["graded_modulation"] is not None else float("nan")
            lines.append(
                f"  {r['model']:<20} {r['role']:<42} count {r['modulation']:+.2f}, graded {graded:+.2f}; past scaled "
                f"by {r['past_scale']:.2f}; accuracy {r['accuracy']:.3f}{stale}"
            )
    if record["collapse"]:
        lines += [
            "",
            "Utilisation over whole prompts (ratio of peaks; what the rank cap min(t, L - t) allows; the untrained copy)",
        ]
        for r in record["collapse"]:
            u = f"{r['untrained']:.3f}" if r["untrained"] is not None else "-"
            lines.append(
                f"  {r['model']:<20} layer {r['layer']}  {r['utilisation']:.3f}   cap allows {r['rank_cap_allows']:.3f}"
                f"   untrained {u}   (L = {r['length']})"
            )
    return "\n".join(lines)


def verdict(record: dict) -> list[str]:
    """Plain sentences about what the numbers show (written into the README)."""
    out = []
    tests = record["tests"]
    for group, variants in record["groups"].items():
        rec = variants.get("trained")
        if not rec:
            continue
        out.append(f"- [{group}] {_design(rec)}.")
        for name in COMPARISONS:
            t = tests["tests"].get(test_name(group, name))
            if t is None:
                continue
            lo, hi = t["bonferroni_interval"]
            better = name.split(" - ")[0].split(": ")[1] if t["difference"] > 0 else "TSS/kv"
            out.append(
                f"  - {name}: difference {t['difference']:+.2f}, Bonferroni interval {_ci([lo, hi])}, Holm p "
                f"{t['p_holm']:.3f}: "
                + (
                    f"holds ({better} ranks accuracy better, after correcting for {tests['m']} tests)."
                    if t["holds"]
                    else "does not hold after correction."
                )
            )
        ctrl = variants.get("untrained_control")
        if ctrl:
            key = AGGREGATIONS[PRIMARY][1]["ess"]
            u, e = ctrl["correlations"][key]["spearman"], rec["correlations"][key]["spearman"]
            out.append(
                f"  - Control (descriptive): the untrained copies' {PREDICTORS[key]} gives Spearman {u:+.2f} "
                f"{_ci(ctrl['intervals'][key]['spearman'])} against the trained accuracy (trained: {e:+.2f}); "
                + (
                    "about as good, so that signal is the architecture and K, not what training did."
                    if abs(u - e) < 0.1
                    else "the trained state ranks accuracy better: training changed it."
                    if e > u
                    else "the untrained state ranks accuracy better."
                )
            )
    if record["per_family"]:
        out.append(f"- Per family (main task, {AGGREGATIONS[PRIMARY][0]}, each family left out in turn):")
        for family in record["per_family"]:
            parts = []
            for name in COMPARISONS:
                t = tests["tests"].get(test_name("main_task", name, family))
                if t is not None:
                    parts.append(f"{name.split(': ')[1]} {t['difference']:+.2f} (Holm p {t['p_holm']:.3f})")
            held = [n for n in COMPARISONS if tests["tests"].get(test_name("main_task", n, family), {}).get("holds")]
            out.append(
                f"  - without {family}: {'; '.join(parts)}: "
                + ("still holds." if held else "nothing holds after correction.")
            )
    lowered = record.get("training_lowered_ess")
    if lowered:
        out.append(
            f"- ESS at the memory cut is at or above the trained value in the untrained copy for {lowered[0]} of {lowered[1]} "
            "models: at this size a random initialisation already fills most of what the prompt allows, so ESS mostly "
            "reflects the architecture; training mostly prunes it."
        )
    for model, rec in record.get("reset_seeds", {}).items():
        out.append(reset_line(model, rec["control"], rec["family"], rec["seeds"], rec["summary"]))
    low = [c for c in record["collapse"] if c["rank_cap_allows"] >= 0.5 and c["untrained"] is not None]
    if low:
        best = min(low, key=lambda c: c["utilisation"])
        out.append(
            f"- Collapse: {best['model']} layer {best['layer']} uses {best['utilisation']:.3f} of its state over whole prompts "
            f"(L = {best['length']}, where the rank cap allows {best['rank_cap_allows']:.2f}); its untrained copy "
            f"{best['untrained']:.3f}. "
            + (
                "Collapsed by training (<= 0.1)"
                if best["utilisation"] <= 0.1
                else "Training lowered it, but not to the collapsed threshold 0.1"
            )
            + f", at held-out accuracy {best['accuracy']:.3f}: "
            + (
                "the paper's failure mode, a state left unused at a cost in accuracy."
                if best["utilisation"] <= FAILURE_SHARE * best["rank_cap_allows"]
                and best["accuracy"] < FAILURE_ACCURACY
                else f"not the paper's failure mode (at most {FAILURE_SHARE} of what the rank cap allows, with accuracy "
                f"below {FAILURE_ACCURACY}); that is read on a model trained to fail beside the same architecture trained "
                f"well, the failure-mode pair, over seeds and fresh prompts ({FAILURE_RECORD})."
            )
        )
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m ess_explorer.zoo.claim", description=__doc__.split("\n")[0])
    parser.add_argument("--recompute", action="store_true", help="re-measure every card first (rewrites them)")
    parser.add_argument("--json", action="store_true", help="print the record as JSON instead of tables")
    parser.add_argument(
        "--write", action="store_true", help="also write the zoo README (the zoo index) with these results"
    )
    parser.add_argument(
        "--only", nargs="*", help="models to include (default: every shipped model not in NOT_IN_CLAIM)"
    )
    parser.add_argument("--no-seeds", action="store_true", help="leave out the seed replicas (seeds.json)")
    parser.add_argument("--boot", type=int, default=N_BOOT, help=f"bootstrap resamples (default {N_BOOT})")
    args = parser.parse_args(argv)
    from ..sources import card, list_models, model_dir
    from .cards import write_card

    names = args.only or [n for n in list_models() if n not in NOT_IN_CLAIM]
    shipped = {n: (write_card(n, model_dir(n)) if args.recompute else card(n)) for n in names}
    cards = dict(shipped)
    if not args.no_seeds:
        from .seeds import replica_cards

        cards.update({k: v for k, v in replica_cards().items() if v["replica_of"] in names})
    record = claim(cards, n_boot=args.boot)
    if args.json:
        print(json.dumps(record, indent=2))
        return record
    text = format_claim(record, cards)
    print(text)
    print("\n".join(["", *verdict(record)]))
    if args.write:
        from ..sources import ZOO_DIR
        from .readme import ADVICE_CHECK, zoo_readme

        path = ZOO_DIR / "README.md"
        check = ZOO_DIR / ADVICE_CHECK
        advice_check = json.loads(check.read_text()) if check.is_file() else None
        path.write_text(zoo_readme(text, verdict(record), shipped, advice_check))
        # the record itself, for readers that show it without recomputing (notebook 03, the cards)
        (ZOO_DIR / CLAIM_RECORD).write_text(json.dumps({"models": sorted(cards), **record}, indent=1))
        from .cards import render_readme
        from .seeds import evidence_records

        evidence = evidence_records()  # read once (it holds the record just written), for every card
        for name, info in shipped.items():  # each card's seeds and the tests that concern it
            (model_dir(name) / "README.md").write_text(render_readme(info, *evidence))
        print(f"\nwrote {path}, {CLAIM_RECORD} and the cards' README.md")
    return record


if __name__ == "__main__":
    main()
