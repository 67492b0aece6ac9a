"""The paper's central MQAR claim, in miniature, with its uncertainty, on the zoo.

    python -m ess_explorer.zoo.claim              # from the model cards (seconds)
    python -m ess_explorer.zoo.claim --write      # ... and write the zoo README (assets)
    python -m ess_explorer.zoo.claim --recompute  # re-measure every card first (minutes)

Claim (Parnichkun et al. 2025): across models and task settings, ESS normalised by the number
of key-value pairs (ESS/kv) predicts MQAR accuracy better than the theoretical state size
normalised the same way (TSS/kv). Here every model's difficulty sweep gives points
(model, K); over all points: Spearman and Pearson of held-out accuracy with ESS/kv,
entropy-ESS/kv and TSS/kv (Pearson also on log10, since TSS/kv spans decades), each with a
95% bootstrap interval that resamples *models* (a model's points move together), and the
bootstrap interval of Spearman(ESS/kv) - Spearman(TSS/kv) (likewise for entropy-ESS/kv). Control: the same statistics with
the ESS/kv of each architecture's *untrained* copy as the predictor of the trained accuracy
(if it does as well, ESS/kv is reading the architecture, not what training did).
Also printed: the learned resets (modulation at "|", trained vs controls) and the utilisation
of the learned-collapse model against its untrained copy.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from scipy import stats

__all__ = ["PREDICTORS", "points", "correlations", "bootstrap", "claim", "main"]

PREDICTORS = {"ess_per_kv": "ESS/kv", "entropy_ess_per_kv": "entropy-ESS/kv", "tss_per_kv": "TSS/kv"}
N_BOOT = 2000
BOOT_SEED = 0


def points(cards: dict[str, dict], untrained: bool = False) -> list[dict]:
    """One dict per (model, K) of the cards' sweeps: model, family, pairs, accuracy (trained)
    and the predictors; ``untrained=True`` takes the predictors from the untrained copy."""
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
                    "family": info["family"],
                    "pairs": row["pairs"],
                    "accuracy": row["accuracy"],
                    "untrained_accuracy": base[row["pairs"]]["accuracy"] if row["pairs"] in base else None,
                    **{k: source[k] for k in PREDICTORS},
                }
            )
    return out


def _stats(acc: np.ndarray, x: np.ndarray) -> dict:
    if len(acc) < 3 or np.ptp(x) == 0 or np.ptp(acc) == 0:
        return {"spearman": float("nan"), "pearson": float("nan"), "pearson_log10": float("nan")}
    return {
        "spearman": float(stats.spearmanr(x, acc)[0]),
        "pearson": float(stats.pearsonr(x, acc)[0]),
        "pearson_log10": float(stats.pearsonr(np.log10(np.maximum(x, 1e-12)), acc)[0]),
    }


def correlations(rows: list[dict]) -> dict:
    """{predictor: {spearman, pearson, pearson_log10}} over the given points."""
    acc = np.array([r["accuracy"] for r in rows], dtype=np.float64)
    return {key: _stats(acc, np.array([r[key] for r in rows], dtype=np.float64)) for key in PREDICTORS}


def bootstrap(rows: list[dict], n_boot: int = N_BOOT, seed: int = BOOT_SEED, level: float = 0.95) -> dict:
    """Percentile intervals of ``correlations`` resampling models with replacement.

    Returns {predictor: {stat: [lo, hi]}, "spearman_ess_minus_tss": [lo, hi], "n_boot": ...};
    resamples whose statistic is undefined (a constant column) are left out and counted.
    """
    models = sorted({r["model"] for r in rows})
    by_model = {m: [r for r in rows if r["model"] == m] for m in models}
    rng = np.random.default_rng(seed)
    draws: dict[str, dict[str, list]] = {k: {"spearman": [], "pearson": [], "pearson_log10": []} for k in PREDICTORS}
    diff, diff_entropy = [], []
    for _ in range(n_boot):
        pick = rng.integers(0, len(models), size=len(models))
        sample = [r for i in pick for r in by_model[models[i]]]
        corr = correlations(sample)
        for key, values in corr.items():
            for stat, v in values.items():
                if np.isfinite(v):
                    draws[key][stat].append(v)
        d = corr["ess_per_kv"]["spearman"] - corr["tss_per_kv"]["spearman"]
        if np.isfinite(d):
            diff.append(d)
        d = corr["entropy_ess_per_kv"]["spearman"] - corr["tss_per_kv"]["spearman"]
        if np.isfinite(d):
            diff_entropy.append(d)
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    interval = lambda v: [float(x) for x in np.percentile(v, q)] if v else [float("nan")] * 2  # noqa: E731
    out = {key: {stat: interval(v) for stat, v in d.items()} for key, d in draws.items()}
    out["spearman_ess_minus_tss"] = interval(diff)
    out["spearman_entropy_ess_minus_tss"] = interval(diff_entropy)
    out.update(n_boot=n_boot, seed=seed, level=level, resampled="models", n_defined=len(diff))
    return out


def claim(cards: dict[str, dict], n_boot: int = N_BOOT) -> dict:
    """The whole claim record: groups (all models, main task) x (trained, untrained-ESS control)."""
    groups = {"all": cards, "main_task": {n: c for n, c in cards.items() if c["training"].get("train_pairs")}}
    out = {"groups": {}}
    for group, members in groups.items():
        for variant, untrained in (("trained", False), ("untrained_control", True)):
            rows = points(members, untrained=untrained)
            if len({r["model"] for r in rows}) < 2:
                continue
            out["groups"].setdefault(group, {})[variant] = {
                "n_models": len({r["model"] for r in rows}),
                "n_points": len(rows),
                "correlations": correlations(rows),
                "bootstrap": bootstrap(rows, n_boot=n_boot),
            }
    out["untrained_accuracy"] = [p["untrained_accuracy"] for p in points(cards) if p["untrained_accuracy"] is not None]
    pairs = [
        (c["ess"]["ess"], c["untrained"]["ess"]["ess"])
        for c in cards.values()
        if "untrained" in c and "ess" in c["untrained"]
    ]
    out["training_lowered_ess"] = [sum(u >= t for t, u in pairs), len(pairs)] if pairs else None
    out["resets"] = _resets(cards)
    out["collapse"] = _collapse(cards)
    return out


def _resets(cards: dict) -> list[dict]:
    rows = []
    for name, info in cards.items():
        for key, role in (("separator_drop", "trained on '|'"), ("separator_control", "control: no '|' in training")):
            if key in info:
                d = info[key]
                rows.append(
                    {
                        "model": name,
                        "role": role,
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
                }
            )
    return rows


def _fmt_ci(value: float, ci: list) -> str:
    return f"{value:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]"


def format_claim(record: dict, cards: dict) -> str:
    """The claim as text tables (what --write puts into the zoo README)."""
    lines = [
        f"{'model':<20}{'family':<24}{'K':>4}{'acc':>7}{'ESS/kv':>9}{'eESS/kv':>9}{'TSS/kv':>9}{'untr. ESS/kv':>13}"
    ]
    lines.append("-" * len(lines[0]))
    base = {(p["model"], p["pairs"]): p for p in points(cards, untrained=True)}
    for p in points(cards):
        u = base.get((p["model"], p["pairs"]))
        lines.append(
            f"{p['model']:<20}{p['family']:<24}{p['pairs']:>4}{p['accuracy']:>7.3f}{p['ess_per_kv']:>9.1f}"
            f"{p['entropy_ess_per_kv']:>9.1f}{p['tss_per_kv']:>9.1f}{(u['ess_per_kv'] if u else float('nan')):>13.1f}"
        )
    for group, variants in record["groups"].items():
        for variant, rec in variants.items():
            title = {
                "trained": "accuracy vs the trained model's state",
                "untrained_control": "control: accuracy vs the UNTRAINED copy's state",
            }[variant]
            lines += [
                "",
                f"[{group}] {title} ({rec['n_models']} models, {rec['n_points']} (model, K) points; "
                f"95% bootstrap over models, {rec['bootstrap']['n_boot']} resamples)",
            ]
            for key, label in PREDICTORS.items():
                c, b = rec["correlations"][key], rec["bootstrap"][key]
                lines.append(
                    f"  {label:<15} Spearman {_fmt_ci(c['spearman'], b['spearman'])}   Pearson {_fmt_ci(c['pearson'], b['pearson'])}"
                    f"   Pearson(log10) {_fmt_ci(c['pearson_log10'], b['pearson_log10'])}"
                )
            for key, label, dkey in (
                ("ess_per_kv", "ESS/kv", "spearman_ess_minus_tss"),
                ("entropy_ess_per_kv", "entropy-ESS/kv", "spearman_entropy_ess_minus_tss"),
            ):
                d = rec["correlations"][key]["spearman"] - rec["correlations"]["tss_per_kv"]["spearman"]
                lines.append(f"  Spearman({label}) - Spearman(TSS/kv) = {_fmt_ci(d, rec['bootstrap'][dkey])}")
    ua = record["untrained_accuracy"]
    if ua:
        lines += [
            "",
            f"Untrained copies answer at chance: accuracy {min(ua):.3f} to {max(ua):.3f} over all (model, K).",
        ]
    if record["resets"]:
        lines += [
            "",
            "Learned resets: modulation at '|' (unit-scope tolerance; best memory layer; 1 = state emptied) and the",
            "median factor by which '|' scales the past (sigma_1 of H_sep over sigma_1 before it; smallest over memory layers)",
        ]
        for r in record["resets"]:
            per = ", ".join(f"layer {i} {v:+.2f}" for i, v in r["per_layer"].items())
            stale = f", stale-query accuracy {r['stale_accuracy']:.3f}" if r["stale_accuracy"] is not None else ""
            lines.append(
                f"  {r['model']:<20} {r['role']:<30} modulation {r['modulation']:+.2f} ({per}); past scaled by "
                f"{r['past_scale']:.2f}; accuracy {r['accuracy']:.3f}{stale}"
            )
    if record["collapse"]:
        lines += [
            "",
            "Utilisation over whole prompts (ratio of peaks; what the rank cap min(t, L - t) allows; the untrained copy)",
        ]
        for r in record["collapse"]:
            u = f"{r['untrained']:.3f}" if r["untrained"] is not None else "-"
            lines.append(
                f"  {r['model']:<20} layer {r['layer']}  {r['utilisation']:.3f}   cap allows {r['rank_cap_allows']:.3f}   untrained {u}   (L = {r['length']})"
            )
    return "\n".join(lines)


def _ci(interval: list) -> str:
    return f"[{interval[0]:+.2f}, {interval[1]:+.2f}]"


def verdict(record: dict) -> list[str]:
    """Plain sentences about what the numbers show (written into the README)."""
    out = []
    for group, variants in record["groups"].items():
        rec = variants.get("trained")
        if not rec:
            continue
        c, b = rec["correlations"], rec["bootstrap"]
        t = c["tss_per_kv"]["spearman"]
        for key, label, dkey in (
            ("ess_per_kv", "ESS/kv", "spearman_ess_minus_tss"),
            ("entropy_ess_per_kv", "entropy-ESS/kv", "spearman_entropy_ess_minus_tss"),
        ):
            e = c[key]["spearman"]
            lo, hi = b[dkey]
            if lo > 0:
                comp = f"{label} ranks accuracy better than TSS/kv, and the bootstrap interval of the difference excludes 0"
            elif hi < 0:
                comp = f"TSS/kv ranks accuracy better than {label}, and the bootstrap interval of the difference excludes 0"
            else:
                comp = f"the interval of the difference includes 0: on these models {label} does not demonstrably beat TSS/kv"
            out.append(
                f"- [{group}] Spearman with accuracy: {label} {e:+.2f} {_ci(b[key]['spearman'])}, TSS/kv {t:+.2f} "
                f"{_ci(b['tss_per_kv']['spearman'])} ({rec['n_models']} models, {rec['n_points']} points); {comp} "
                f"(difference {e - t:+.2f}, 95% interval [{lo:+.2f}, {hi:+.2f}])."
            )
        e = c["ess_per_kv"]["spearman"]
        ctrl = variants.get("untrained_control")
        if ctrl:
            for key, label in (("ess_per_kv", "ESS/kv"), ("entropy_ess_per_kv", "entropy-ESS/kv")):
                u, e = ctrl["correlations"][key]["spearman"], c[key]["spearman"]
                out.append(
                    f"- [{group}] Control: the untrained copies' {label} gives Spearman {u:+.2f} "
                    f"{_ci(ctrl['bootstrap'][key]['spearman'])} against the trained accuracy (trained {label}: {e:+.2f}); "
                    + (
                        "about as good, so that signal is the architecture and K, not what training did."
                        if abs(u - e) < 0.1
                        else "the trained state ranks accuracy better: training changed it."
                        if e > u
                        else "the untrained state ranks accuracy better."
                    )
                )
    lowered = record.get("training_lowered_ess")
    if lowered:
        out.append(
            f"- ESS at the memory cut is at or above the trained value in the untrained copy for {lowered[0]} of {lowered[1]} "
            "models: at this size a random initialisation already fills most of what the prompt allows, so ESS mostly "
            "reflects the architecture; training mostly prunes it."
        )
    from .specs import RESET_CONTROLS

    resets = {r["model"]: r for r in record["resets"]}
    for model, control in RESET_CONTROLS.items():
        r, c = resets.get(model), resets.get(control)
        if r is None or c is None or r["role"] == c["role"]:
            continue
        strong = r["modulation"] >= 0.5 and c["modulation"] <= 0.2
        out.append(
            f"- Reset, {model} (control {control}): modulation at '|' {r['modulation']:+.2f} vs {c['modulation']:+.2f}; "
            f"'|' scales the past by {r['past_scale']:.2f} vs {c['past_scale']:.2f}. "
            + (
                "A learned reset that empties the state."
                if strong
                else "The rank count does not drop by half (modulation < 0.5): "
                + (
                    "the separator scales the old state down instead of emptying it (a partial reset, seen in sigma_1)."
                    if r["past_scale"] < 0.5 * c["past_scale"]
                    else "the separator scales the old state down a little (a weak partial reset, seen in sigma_1)."
                    if r["past_scale"] < 0.9 * c["past_scale"]
                    else "no learned reset is visible."
                )
            )
        )
    low = [c for c in record["collapse"] if c["rank_cap_allows"] >= 0.5 and c["untrained"] is not None]
    if low:
        best = min(low, key=lambda c: c["utilisation"])
        out.append(
            f"- Collapse: {best['model']} layer {best['layer']} uses {best['utilisation']:.3f} of its state over whole prompts "
            f"(L = {best['length']}, where the rank cap allows {best['rank_cap_allows']:.2f}); its untrained copy "
            f"{best['untrained']:.3f}. "
            + (
                "Collapsed by training (<= 0.1)."
                if best["utilisation"] <= 0.1
                else "Training lowered it, but not to the collapsed threshold 0.1."
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
    parser.add_argument("--only", nargs="*", help="models to include (default: every shipped model)")
    parser.add_argument("--boot", type=int, default=N_BOOT, help=f"bootstrap resamples (default {N_BOOT})")
    args = parser.parse_args(argv)
    from ..sources import card, list_models, model_dir
    from .cards import write_card

    names = args.only or list_models()
    cards = {n: (write_card(n, model_dir(n)) if args.recompute else card(n)) for n in names}
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
        path.write_text(zoo_readme(text, verdict(record), cards, advice_check))
        print(f"\nwrote {path}")
    return record


if __name__ == "__main__":
    main()
