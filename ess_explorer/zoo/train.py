"""Train the zoo: tiny models on MQAR, one config per model, fixed seeds, CPU.

    python -m ess_explorer.zoo.train                 # every model, then their cards
    python -m ess_explorer.zoo.train --only la_k16   # one model
    python -m ess_explorer.zoo.train --steps 20 --out smoke-zoo  # a quick smoke run
    python -m ess_explorer.zoo.train --cards-only    # re-measure accuracy / ESS, rewrite cards
    python -m ess_explorer.zoo.train --main --seeds 1 2 --out build/zoo-seeds --no-cards
        # seed replicas of the main-task models (folders NAME_s1, NAME_s2; zoo/seeds.py measures them)

Each model is saved in the standard Hugging Face layout (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json) plus training.json (settings, curve, wall time);
``ess_explorer.zoo.cards`` writes card.json and README.md next to them.

Data: training batch ``step`` is ``task.sample(batch, seed=[seed, step])`` (a two-word
SeedSequence); validation and held-out test batches use single integer seeds
(VALIDATION_SEED, TEST_SEED), so they are never training batches.

Mamba trains with a step-by-step scan swapped in for transformers' reference scan
(``stepwise_mamba_scan``): same outputs, ~20x faster backward on CPU. The swap lasts only
for training; the saved model is a stock ``MambaForCausalLM``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .mqar import build_tokenizer, evaluate_model
from .specs import (  # noqa: F401  (re-exported: the specs used to live here)
    MAIN_TASK,
    RESET_CONTROLS,
    RESET_TASK,
    SEGMENTED_TASK,
    TEST_SEED,
    VALIDATION_SEED,
    ZOO,
    ZooSpec,
    build_model,
)

__all__ = [
    "ZooSpec",
    "ZOO",
    "RESET_CONTROLS",
    "build_model",
    "train_model",
    "plateau",
    "plateau_at_full_lr",
    "SCHEDULES",
    "seed_replica_name",
    "stepwise_mamba_scan",
    "main",
]


def seed_replica_name(name: str, seed: int) -> str:
    """Folder name of the replica of zoo model ``name`` trained with ``seed``: NAME_sSEED."""
    return f"{name}_s{seed}"


def stepwise_mamba_scan(
    hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, return_last_state=False, **kwargs
):
    """transformers' ``mamba_selective_scan`` (recurrent path), one time step at a time.

    hidden_states, dt: (batch, d_inner, L); A: (d_inner, N); B, C: (batch, N, L).
    h_t = exp(A dt_t) * h_{t-1} + dt_t B_t u_t, y_t = C_t . h_t (+ D u_t, * silu(z)).
    Each step's discretisation is built on the fly from tensors unbound once along time,
    so backward never zero-fills a full (batch, d_inner, L, N) gradient per step.
    """
    input_dtype = hidden_states.dtype
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    us, dts = hidden_states.float().unbind(-1), dt.float().unbind(-1)
    bs, cs = B.float().unbind(-1), C.float().unbind(-1)  # each (batch, N)
    state = hidden_states.new_zeros(hidden_states.shape[0], hidden_states.shape[1], A.shape[-1], dtype=torch.float32)
    outputs = []
    for u_t, dt_t, b_t, c_t in zip(us, dts, bs, cs):
        state = torch.exp(A * dt_t[..., None]) * state + (dt_t * u_t)[..., None] * b_t[:, None, :]
        outputs.append((state * c_t[:, None, :]).sum(-1))
    out = torch.stack(outputs, dim=-1).to(input_dtype)
    if D is not None:
        out = out + hidden_states * D[None, :, None]
    if z is not None:
        out = out * F.silu(z)
    return (out, state) if return_last_state else out


@contextlib.contextmanager
def fast_mamba_training():
    """Swap transformers' Mamba scan for ``stepwise_mamba_scan`` inside the block only."""
    from transformers.models.mamba import modeling_mamba

    original = modeling_mamba.mamba_selective_scan
    modeling_mamba.mamba_selective_scan = stepwise_mamba_scan
    try:
        yield
    finally:
        modeling_mamba.mamba_selective_scan = original


SCHEDULES = ("cosine", "plateau")
PLATEAU_WINDOW = 300  # steps at full learning rate over which the plateau check looks back
PLATEAU_POINTS = 0.01  # ... and the most validation accuracy may move there (1 point)


def _lr_at(step: int, spec: ZooSpec, steps: int, anneal_from: int | None = None) -> float:
    """Linear warmup, then cosine decay to 10% of the peak: over the whole budget
    (``schedule="cosine"``), or, with ``schedule="plateau"``, the full rate until ``anneal_from``
    (None: not decided yet) and the cosine over the ``spec.anneal`` x steps after it."""
    warm = max(1, int(spec.warmup * steps))
    if step < warm:
        return spec.lr * (step + 1) / warm
    if spec.schedule == "plateau":
        if anneal_from is None or step < anneal_from:
            return spec.lr
        start, length = anneal_from, max(1, int(spec.anneal * steps))
    else:
        start, length = warm, max(1, steps - warm)
    progress = (step - start) / length
    return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def plateau_at_full_lr(
    curve: list[dict], since: int, window: int = PLATEAU_WINDOW, points: float = PLATEAU_POINTS
) -> bool:
    """Whether validation accuracy moved less than ``points`` over the last ``window`` steps,
    all of them at the full learning rate (after step ``since``, the end of warmup): the check
    that decides when to anneal, so it measures the model at full rate, not a decayed one."""
    if not curve or curve[-1]["step"] - window < since:
        return False
    earlier = [p for p in curve if since <= p["step"] <= curve[-1]["step"] - window]
    return bool(earlier) and abs(curve[-1]["val_accuracy"] - earlier[-1]["val_accuracy"]) < points


def train_model(
    spec: ZooSpec, out_dir: Path, steps: int | None = None, eval_every: int = 100, log=print, val_samples: int = 256
):
    """Train ``spec`` and save it to ``out_dir``. Returns (record, model): the training record
    (also written to training.json) and the trained model in eval mode.

    ``steps`` overrides spec.steps (a smoke run). Validation every ``eval_every`` steps on
    ``val_samples`` sequences; stops early at spec.target_accuracy.
    """
    steps = spec.steps if steps is None else steps
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    out_dir = Path(out_dir)
    model = build_model(spec)
    model.train()
    decay, no_decay = [], []
    for name, p in model.named_parameters():  # no weight decay on norms, biases, A_log, D
        (decay if p.ndim >= 2 and "embed" not in name else no_decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec.lr,
        betas=(0.9, 0.98),
    )
    if spec.schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {spec.schedule!r}")
    curve, losses = [], []
    anneal_from = None  # plateau schedule: the step the anneal starts at, once decided
    anneal_steps = max(1, int(spec.anneal * steps))
    ended_by = "budget"
    start = time.time()
    patch = fast_mamba_training() if spec.arch == "mamba" else contextlib.nullcontext()
    done = 0
    with patch:
        for step in tqdm(range(steps), desc=spec.name, mininterval=10, disable=None):
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, spec, steps, anneal_from)
            batch = spec.task_at(step).sample(spec.batch_size, seed=[spec.seed, step])
            out = model(input_ids=batch.input_ids, labels=batch.labels)
            loss = out.loss
            if not torch.isfinite(loss):
                raise RuntimeError(f"{spec.name}: loss became {loss.item()} at step {step}; lower the learning rate")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            done = step + 1
            annealed = anneal_from is not None and done >= anneal_from + anneal_steps
            if done % eval_every == 0 or done == steps or annealed:
                tasks = spec.validation_tasks()
                per_k = [
                    evaluate_model(model, t, n_samples=max(1, val_samples // len(tasks)), seed=VALIDATION_SEED)[
                        "accuracy"
                    ]
                    for t in tasks
                ]
                val = {"accuracy": float(sum(per_k) / len(per_k))}
                point = {
                    "step": done,
                    "loss": sum(losses[-50:]) / len(losses[-50:]),
                    "val_accuracy": val["accuracy"],
                    "seconds": round(time.time() - start, 1),
                }
                if spec.train_pairs:
                    point["val_accuracy_per_k"] = {str(t.num_pairs): a for t, a in zip(tasks, per_k)}
                curve.append(point)
                log(f"{spec.name}: {json.dumps(point)}")
                if val["accuracy"] >= spec.target_accuracy:
                    ended_by = "target"
                    break
                if spec.schedule == "plateau" and anneal_from is None:
                    warm = max(1, int(spec.warmup * steps))
                    if plateau_at_full_lr(curve, since=warm):
                        anneal_from, ended_by = done, "plateau"
                    elif done >= steps - anneal_steps:
                        anneal_from = done  # the budget left is the anneal's: stated as "budget"
            if anneal_from is not None and done >= anneal_from + anneal_steps:
                break
    seconds = time.time() - start
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    build_tokenizer(spec.task.vocab, max_length=max(256, spec.task.length)).save_pretrained(out_dir)
    record = {
        "name": spec.name,
        "family": spec.family,
        "arch": spec.arch,
        "task": spec.task.to_dict(),
        "training": {
            "steps_planned": steps,
            "steps_run": done,
            "target_accuracy": spec.target_accuracy,
            "lr": spec.lr,
            "batch_size": spec.batch_size,
            "optimizer": "AdamW(betas=(0.9, 0.98)), linear warmup then cosine to 10%"
            + (" after a plateau at full rate (or the budget)" if spec.schedule == "plateau" else ""),
            "schedule": spec.schedule,
            "ended_by": ended_by,
            "anneal_from": anneal_from,
            "warmup": spec.warmup,
            "weight_decay": spec.weight_decay,
            "grad_clip": 1.0,
            "seed": spec.seed,
            "data_seeds": "batch at step s: task.sample(batch_size, seed=[seed, s])",
            "wall_seconds": round(seconds, 1),
            "threads": torch.get_num_threads(),
            "final_loss": curve[-1]["loss"] if curve else None,
            "curve": curve,
            "train_pairs": list(spec.train_pairs) if spec.train_pairs else None,
            "plateau": plateau(curve),
            "mamba_stepwise_scan": spec.arch == "mamba",
        },
        "description": spec.description,
    }
    (out_dir / "training.json").write_text(json.dumps(record, indent=2))
    return record, model


def plateau(curve: list[dict], fraction: float = 0.2, points: float = 0.01) -> dict:
    """Whether validation accuracy moved less than ``points`` over the last ``fraction`` of training.

    Compares the last curve point with the latest point at or before (1 - fraction) of the steps
    run; ``reached_target`` marks a run stopped early at its target accuracy (also converged).
    """
    if len(curve) < 2:
        return {"plateau": False, "change": None, "from_step": None, "to_step": None}
    last = curve[-1]
    cutoff = (1 - fraction) * last["step"]
    earlier = [p for p in curve if p["step"] <= cutoff] or curve[:1]
    change = last["val_accuracy"] - earlier[-1]["val_accuracy"]
    return {
        "plateau": bool(abs(change) < points),
        "change": round(float(change), 4),
        "from_step": earlier[-1]["step"],
        "to_step": last["step"],
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ess_explorer.zoo.train", description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help=f"models to train (default all): {', '.join(ZOO)}")
    parser.add_argument("--steps", type=int, default=None, help="override every model's step count (smoke runs)")
    parser.add_argument(
        "--out", type=Path, default=None, help="zoo folder (default: the shipped ess_explorer/zoo/assets)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the cores are shared)")
    parser.add_argument("--no-cards", action="store_true", help="skip measuring accuracy / ESS and writing the cards")
    parser.add_argument("--cards-only", action="store_true", help="do not train; rewrite the cards of saved models")
    parser.add_argument("--main", action="store_true", help="only the main-task models (with --only: added to them)")
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="*",
        default=None,
        help="train replicas with these seeds (initialisation and data stream) into --out as NAME_sSEED, no cards",
    )
    args = parser.parse_args(argv)
    from ..sources import ZOO_DIR

    torch.set_num_threads(args.threads)
    names = list(args.only or [])
    if args.main:
        names += [n for n, spec in ZOO.items() if spec.train_pairs and n not in names]
    names = names or list(ZOO)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        raise SystemExit(f"unknown zoo model(s) {unknown}; known: {', '.join(ZOO)}")
    root = args.out or ZOO_DIR
    if args.seeds:
        if args.out is None or args.cards_only:
            raise SystemExit("--seeds trains replicas outside the shipped zoo: give --out (and not --cards-only)")
        for seed in args.seeds:
            for name in names:
                spec = replace(ZOO[name], seed=seed)
                record, _ = train_model(spec, root / seed_replica_name(name, seed), steps=args.steps)
                print(
                    f"{name} seed {seed}: {record['training']['steps_run']} steps, {record['training']['wall_seconds']} s"
                )
        return
    for name in names:
        if not args.cards_only:
            record, _ = train_model(ZOO[name], root / name, steps=args.steps)
            print(
                f"{name}: trained {record['training']['steps_run']} steps in {record['training']['wall_seconds']} s",
                flush=True,
            )
        if not args.no_cards:
            from .cards import write_card
            from .seeds import evidence_records

            card = write_card(name, root / name, evidence=evidence_records())
            print(f"{name}: held-out accuracy {card['heldout']['accuracy']:.3f}", flush=True)


if __name__ == "__main__":
    main()
