"""Seed replicas of zoo models: the independent units the claim resamples.

    python -m ess_explorer.zoo.train --main --seeds 1 2 --out build/zoo-seeds --no-cards   # train (CPU, hours)
    python -m ess_explorer.zoo.seeds build/zoo-seeds                                      # measure, write seeds.json
    python -m ess_explorer.zoo.train --only gla_k16_reset gla_k16_keep --seeds 1 2 --out build/zoo-reset-seeds --no-cards
    python -m ess_explorer.zoo.seeds build/zoo-reset-seeds   # reset models and matched controls, added to seeds.json

A replica is a shipped main-task model's spec with another seed, which changes both the
initialisation and the training data stream (batch s is drawn from [seed, s]); everything else
(architecture, task, budget, schedule) is the shipped model's. Its weights are not shipped (the
seed reproduces them); ``seeds.json`` in the zoo folder keeps what the claim needs: the
training summary (steps, plateau check, final validation accuracy), held-out accuracy and the
difficulty sweep rows, measured exactly as the cards measure the shipped model; a replica of a
reset model or of its control also keeps the card's separator measurements, which the claim
compares seed by seed (zoo.claim: reset_seed_pairs).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

__all__ = ["SEEDS_FILE", "measure_replica", "replica_cards", "evidence_records", "main"]

SEEDS_FILE = "seeds.json"


def measure_replica(folder: Path) -> dict:
    """The record of one trained replica folder (training.json + weights): replica_of (the
    shipped model's name), seed, family, training summary, held-out accuracy (with the stale-query
    split on a task that has stale queries), sweep rows, and the separator measurements of its
    card (``cards.separator_records``: separator_drop, and separator_control for a control)."""
    from transformers import AutoModelForCausalLM

    from .cards import SWEEP_SAMPLES, TEST_SAMPLES, separator_records, sweep_pairs
    from .measure import sweep
    from .mqar import MQARTask, evaluate_model
    from .specs import TEST_SEED

    folder = Path(folder)
    record = json.loads((folder / "training.json").read_text())
    task = MQARTask.from_dict(record["task"])
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    training = {k: v for k, v in record["training"].items() if k != "curve"}
    training["final_val_accuracy"] = record["training"]["curve"][-1]["val_accuracy"]
    ks = sweep_pairs(task)
    torch.manual_seed(0)
    with torch.no_grad():
        heldout = evaluate_model(model, task, n_samples=TEST_SAMPLES, seed=TEST_SEED)
        rows = sweep(model, task, ks, n_samples=SWEEP_SAMPLES)
        separators = separator_records(model, record["name"], task)
    kept = ("accuracy", "n_samples", "seed", "stale_accuracy", "recall_accuracy", "n_stale")
    return {
        "replica_of": record["name"],
        "family": record["family"],
        "task": record["task"],
        "training": training,
        "heldout": {k: heldout[k] for k in kept if k in heldout},
        "sweep": {"pairs": list(ks), "n_samples": SWEEP_SAMPLES, "rows": rows},
        **separators,
    }


def evidence_records() -> tuple[dict, dict]:
    """(the seed replicas of seeds.json, the claim record of claim.json) of the shipped zoo, as the
    cards' README show them (`cards.render_readme`); empty where a file is absent."""
    from ..sources import ZOO_DIR
    from .readme import CLAIM_RECORD

    path = ZOO_DIR / CLAIM_RECORD
    return replica_cards(), (json.loads(path.read_text()) if path.is_file() else {})


def replica_cards(path: Path | None = None) -> dict[str, dict]:
    """{"NAME_sSEED": record} from seeds.json (empty when the file is absent)."""
    from ..sources import ZOO_DIR

    path = Path(path) if path is not None else ZOO_DIR / SEEDS_FILE
    return json.loads(path.read_text())["replicas"] if path.is_file() else {}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m ess_explorer.zoo.seeds", description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, help="the --out folder of zoo.train --seeds (NAME_sSEED subfolders)")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: the zoo's seeds.json)")
    parser.add_argument("--redo", action="store_true", help="re-measure replicas the file already holds")
    args = parser.parse_args(argv)
    from ..sources import ZOO_DIR

    torch.set_num_threads(1)
    out = args.out or ZOO_DIR / SEEDS_FILE
    replicas = {} if args.redo else replica_cards(out)  # measured before: kept (the seed fixes them)
    folders = sorted(p for p in args.folder.iterdir() if (p / "training.json").is_file())
    if not folders and not replicas:
        raise SystemExit(f"no trained replica (a folder with training.json) in {args.folder}")
    for sub in folders:
        if sub.name in replicas:
            continue
        replicas[sub.name] = measure_replica(sub)
        out.write_text(json.dumps({"replicas": dict(sorted(replicas.items()))}, indent=1))  # after each: resumable
        print(f"{sub.name}: held-out accuracy {replicas[sub.name]['heldout']['accuracy']:.3f}", flush=True)
    print(f"{out}: {len(replicas)} replicas")
    return replicas


if __name__ == "__main__":
    main()
