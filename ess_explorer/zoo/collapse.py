"""The paper's collapse failure mode on a zoo pair, over training seeds and fresh prompts.

    python -m ess_explorer.zoo.train --only mamba2_n64_collapse mamba2_n64 --seeds 1 2 --out build/zoo-collapse-seeds --no-cards
    python -m ess_explorer.zoo.collapse build/zoo-collapse-seeds   # measure, write failure_mode.json and the pair's cards

A failure-mode pair (``specs.FAILURE_PAIRS``) is one architecture trained twice on the same task,
budget and learning rate: once made to forget (the collapsed model: its spec says how), once well
(its twin). The accuracy compared is measured as the card's (exact match at the task's K), on fresh sequences.
Each run (the shipped model is seed 0; replicas NAME_sSEED add seeds) is read on
``len(FRESH_SEEDS)`` fresh prompt sets, drawn from seeds that no card, test, validation or
training batch uses. Per set: the utilisation over whole prompts (``measure.prompt_utilisation``,
the card's ratio of peaks, on ``FRESH_PROMPTS`` prompts), as a share of what the rank cap allows,
in the memory layer where that share is largest (the layer that uses the most of its room), and
the held-out accuracy on ``FRESH_SAMPLES`` sequences of the set. A run's value is its mean over
the sets; over seeds, the mean with a 95% Student-t interval (``resets.t_interval``: the seed is
the independent unit, the prompt sets only sharpen each seed's reading).

The rule (FAILURE_RULE): the failure mode is shown when the collapsed model's share of the rank
cap has its interval's upper end at or below FAILURE_SHARE *and* its accuracy interval lies wholly
below its twin's (upper end under the twin's lower end). Either half alone is not the failure mode:
low use at no accuracy cost is efficient compression, and low accuracy with the state in use is
another failure. One seed gives no interval, so it cannot show it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from .failure_card import FAILURE_RECORD, card_field, failure_lines, interval_text
from .resets import LEVEL, t_interval

__all__ = [
    "FAILURE_SHARE",
    "FAILURE_RULE",
    "FAILURE_RECORD",
    "FRESH_SEEDS",
    "FRESH_PROMPTS",
    "FRESH_SAMPLES",
    "fresh_readings",
    "run_reading",
    "seed_summary",
    "failure_verdict",
    "failure_record",
    "failure_lines",
    "card_field",
    "main",
]

FAILURE_SHARE = 0.05  # a state used at most this share of what the rank cap allows (with an accuracy cost: the rule)
FAILURE_RULE = (
    f"collapse failure mode shown when the collapsed model's utilisation, as a share of what the rank cap allows, has a "
    f"{LEVEL:.0%} t interval over seeds whose upper end is <= {FAILURE_SHARE} of the cap, and its accuracy interval lies "
    "wholly below its twin's"
)
# fresh prompt sets: clear of the cards' prompts (30000+), held-out tests (10000+), validation (20000+) and
# training batches (two-word seeds)
FRESH_SEEDS = (50_000, 51_000, 52_000, 53_000)
FRESH_PROMPTS = 4  # prompts per set for the utilisation (an SVD per unit and cut: the costly part)
FRESH_SAMPLES = 256  # sequences per set for the accuracy
READINGS = ("utilisation", "share_of_cap", "accuracy")  # what each prompt set, run and seed summary holds


@torch.no_grad()
def fresh_readings(model, task, seeds=FRESH_SEEDS, n_prompts: int = FRESH_PROMPTS, n_samples: int = FRESH_SAMPLES):
    """One dict per fresh prompt set (seed s): the utilisation over whole prompts of the memory layer
    with the largest share of what the rank cap allows (prompts s, s + 1, ...), that share, the cap,
    and the held-out accuracy on ``n_samples`` sequences drawn from s."""
    from .measure import prompt_utilisation
    from .mqar import evaluate_model

    out = []
    for seed in seeds:
        layers = prompt_utilisation(model, task, n_prompts=n_prompts, seed=seed)["layers"]
        shares = {i: lay["utilisation"] / lay["rank_cap_allows"] for i, lay in layers.items() if lay["rank_cap_allows"]}
        if not shares:
            raise ValueError("no memory layer has room under the rank cap: the share of the cap is undefined")
        layer = max(shares, key=shares.get)
        out.append(
            {
                "seed": int(seed),
                "layer": layer,
                "utilisation": layers[layer]["utilisation"],
                "rank_cap_allows": layers[layer]["rank_cap_allows"],
                "share_of_cap": shares[layer],
                "accuracy": evaluate_model(model, task, n_samples=n_samples, seed=seed)["accuracy"],
            }
        )
    return out


def run_reading(seed: int, sets: list[dict]) -> dict:
    """One training run: its prompt sets and their means (the value the seed contributes)."""
    if not sets:
        raise ValueError("a run needs at least one prompt set")
    return {"seed": int(seed), **{k: float(np.mean([s[k] for s in sets])) for k in READINGS}, "sets": sets}


def seed_summary(runs: list[dict]) -> dict:
    """Over training seeds: {n_seeds, utilisation, share_of_cap, accuracy}, each ``t_interval`` of
    the runs' means (mean, sd, interval; no interval for one seed)."""
    if not runs:
        raise ValueError("seed_summary needs at least one run")
    return {"n_seeds": len(runs), **{k: t_interval([r[k] for r in runs]) for k in READINGS}}


def failure_verdict(collapsed: dict, twin: dict, share: float = FAILURE_SHARE) -> dict:
    """FAILURE_RULE on two ``seed_summary`` records: low_use (the collapsed share's upper end <=
    ``share``), accuracy_cost (its accuracy interval wholly below the twin's), shown (both), and
    the sentence that says so. Without intervals (one seed) neither half can hold."""
    use, acc, twin_acc = collapsed["share_of_cap"], collapsed["accuracy"], twin["accuracy"]
    low_use = use["interval"] is not None and use["interval"][1] <= share
    cost = acc["interval"] is not None and twin_acc["interval"] is not None
    cost = cost and acc["interval"][1] < twin_acc["interval"][0]
    shown = bool(low_use and cost)
    halves = [
        (
            "uses at most"
            if low_use
            else "is not bounded under"
            if use["interval"]
            else "from one seed, cannot be bounded under"
        )
        + f" {share} of what the rank cap allows (share {interval_text(use)})",
        ("at" if cost else "without")
        + f" an accuracy cost its interval separates from the twin's ({interval_text(acc)} against {interval_text(twin_acc)})",
    ]
    line = f"collapse failure mode: {'shown' if shown else 'not shown'}: the collapsed model " + ", ".join(halves)
    return {"low_use": bool(low_use), "accuracy_cost": bool(cost), "shown": shown, "line": line}


def failure_record(runs: dict[str, list[dict]], pairs: dict[str, str] | None = None) -> dict:
    """The record of every failure-mode pair with runs: {rule, share, level, fresh prompt sets,
    pairs: {collapsed: {twin, models: {name: {runs, summary}}, verdict}}}; ``runs`` maps a model
    name to its ``run_reading`` records. A pair measured on one side only (a run in progress) keeps
    that side's runs, with verdict None."""
    from .specs import FAILURE_PAIRS

    out = {
        "rule": FAILURE_RULE,
        "share": FAILURE_SHARE,
        "level": LEVEL,
        "fresh_seeds": list(FRESH_SEEDS),
        "n_prompts": FRESH_PROMPTS,
        "n_samples": FRESH_SAMPLES,
        "pairs": {},
    }
    for collapsed, twin in (pairs or FAILURE_PAIRS).items():
        models = {
            n: {"runs": sorted(runs[n], key=lambda r: r["seed"]), "summary": seed_summary(runs[n])}
            for n in (collapsed, twin)
            if runs.get(n)
        }
        if not models:
            continue
        both = len(models) == 2
        verdict = failure_verdict(models[collapsed]["summary"], models[twin]["summary"]) if both else None
        out["pairs"][collapsed] = {"twin": twin, "models": models, "verdict": verdict}
        if both:  # descriptive, beside the rule: whether the two sets of seeds overlap in accuracy at all
            worst, best = (min(r["accuracy"] for r in runs[twin]), max(r["accuracy"] for r in runs[collapsed]))
            out["pairs"][collapsed]["accuracy_apart"] = {
                "collapsed_best": best,
                "twin_worst": worst,
                "every_seed_below": bool(best < worst),
            }
    return out


def _runs_of(name: str, replica_folder: Path | None) -> list[Path]:
    from ..sources import list_models, model_dir

    folders = [model_dir(name)] if name in list_models() else []  # the shipped seed, once it is in the zoo
    if replica_folder is not None:
        folders += sorted(p for p in replica_folder.glob(f"{name}_s*") if (p / "training.json").is_file())
    return folders


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m ess_explorer.zoo.collapse", description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, nargs="?", help="the --out folder of zoo.train --seeds (NAME_sSEED)")
    parser.add_argument("--out", type=Path, default=None, help=f"record path (default: the zoo's {FAILURE_RECORD})")
    parser.add_argument("--no-cards", action="store_true", help="do not update the pair's card.json and README.md")
    parser.add_argument("--redo", action="store_true", help="re-measure runs the record already holds")
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from ..sources import ZOO_DIR, model_dir
    from .mqar import MQARTask
    from .specs import FAILURE_PAIR_MODELS

    torch.set_num_threads(1)
    out = args.out or ZOO_DIR / FAILURE_RECORD
    runs = {} if args.redo or not out.is_file() else _recorded_runs(json.loads(out.read_text()))
    names = FAILURE_PAIR_MODELS
    for name in names:
        measured = {r["seed"] for r in runs.get(name, [])}  # measured before: kept (the seed fixes them)
        for folder in _runs_of(name, args.folder):
            record = json.loads((folder / "training.json").read_text())
            if record["training"]["seed"] in measured:
                continue
            model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
            sets = fresh_readings(model, MQARTask.from_dict(record["task"]))
            runs.setdefault(name, []).append(run_reading(record["training"]["seed"], sets))
            last = runs[name][-1]
            print(
                f"{folder.name}: share of cap {last['share_of_cap']:.3f}, accuracy {last['accuracy']:.3f}", flush=True
            )
            out.write_text(json.dumps(failure_record(runs), indent=1))  # after each run: resumable
    record = failure_record(runs)
    out.write_text(json.dumps(record, indent=1))
    for collapsed, pair in record["pairs"].items():
        print(pair["verdict"]["line"] if pair["verdict"] else f"{collapsed}: one side of the pair is not measured yet")
    if not args.no_cards:
        from .cards import render_readme
        from .seeds import evidence_records

        evidence = evidence_records()
        for name in names:
            path = model_dir(name) / "card.json"
            card = json.loads(path.read_text())
            card["failure_mode"] = card_field(record, name)
            path.write_text(json.dumps(card, indent=2))
            (path.parent / "README.md").write_text(render_readme(card, *evidence))
    return record


def _recorded_runs(record: dict) -> dict[str, list[dict]]:
    """{model: its run_reading records} of a failure_record (every pair's models)."""
    return {n: rec["runs"] for pair in record.get("pairs", {}).values() for n, rec in pair["models"].items()}


if __name__ == "__main__":
    main()
