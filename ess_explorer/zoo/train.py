"""Train the zoo: tiny models on MQAR, one config per model, fixed seeds, CPU.

    python -m ess_explorer.zoo.train                 # every model, then their cards
    python -m ess_explorer.zoo.train --only la_k16   # one model
    python -m ess_explorer.zoo.train --steps 20 --out /tmp/zoo   # a quick smoke run
    python -m ess_explorer.zoo.train --cards-only    # re-measure accuracy / ESS, rewrite cards

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
import copy
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .mqar import MQARTask, build_tokenizer, evaluate_model
from ..architectures import EssLinearAttentionConfig, EssLinearAttentionForCausalLM

__all__ = ["ZooSpec", "ZOO", "RESET_CONTROLS", "build_model", "train_model", "plateau", "stepwise_mamba_scan", "main"]

VALIDATION_SEED = 20_000
TEST_SEED = 10_000

# L = 128: K pairs, then 64 - K queries. The card's K is 16; training draws K from TRAIN_PAIRS
# (one K per batch, in turn), so every K of the difficulty sweep is in the training distribution.
MAIN_TASK = MQARTask(num_pairs=16, num_queries=48)
TRAIN_PAIRS = (2, 4, 8, 16, 32)
# L = 131: four segments of 8 pairs + 8 queries, "|" between; in segments 2-4, 3 of the 8 queries ask a
# key of an earlier segment that is absent from the current one (answer "--"): old bindings give wrong answers.
RESET_TASK = MQARTask(num_pairs=8, num_segments=4, stale_queries=3)
# L = 130: 13 short recalls (3 pairs, then 2 queries) back to back with no separator, over only 6 keys, so a
# key comes back every few tokens with a new value: the answer is its latest binding, and older bindings only
# interfere. An easy task that needs the last ~10 tokens, for a model with a large state (learned collapse).
RECENT_TASK = MQARTask(num_pairs=3, num_queries=2, num_segments=13, num_keys=6, separators=False)
SEGMENTED_TASK = RESET_TASK  # the prompts on which separator drops are measured (trained models and controls)


@dataclass(frozen=True)
class ZooSpec:
    """One zoo model: architecture, task and training settings."""

    name: str
    family: str  # softmax_attention | hybrid | mamba | mamba2 | linear_attention | gated_linear_attention
    arch: str  # llama | lfm2 | mamba | mamba2 | ess_linear_attention
    arch_kwargs: dict
    task: MQARTask = MAIN_TASK
    steps: int = 1500
    lr: float = 3e-3
    batch_size: int = 32
    warmup: float = 0.1
    weight_decay: float = 0.1
    seed: int = 0
    target_accuracy: float = 0.99  # stop early once validation accuracy reaches this
    train_pairs: tuple[int, ...] | None = None  # K per batch, in turn (task.with_pairs); None: the task's K
    description: str = ""

    def task_at(self, step: int) -> MQARTask:
        """The task of training batch ``step`` (the K mixture cycles through train_pairs)."""
        if not self.train_pairs:
            return self.task
        return self.task.with_pairs(self.train_pairs[step % len(self.train_pairs)])

    def validation_tasks(self) -> list[MQARTask]:
        """Validation runs on every K the model trains on (the mean is the curve's accuracy)."""
        return [self.task.with_pairs(k) for k in self.train_pairs] if self.train_pairs else [self.task]


def _la(head_dim: int, gated: bool) -> dict:
    return dict(num_heads=4, head_dim=head_dim, value_dim=16, conv_size=4, gated=gated)


MAIN_STEPS = 1200  # the equal budget of every main-task model (batch 32, L = 128)
RESET_STEPS = 3000  # the equal budget of the reset-task models (batch 32, L = 131)


def _main(name, family, arch, arch_kwargs, description, **kw) -> ZooSpec:
    return ZooSpec(name, family, arch, arch_kwargs, task=MAIN_TASK, train_pairs=TRAIN_PAIRS, steps=MAIN_STEPS,
                   description=description, **kw)


ZOO: dict[str, ZooSpec] = {
    spec.name: spec
    for spec in [
        _main("llama", "softmax_attention", "llama", dict(num_attention_heads=4), lr=1e-3,
              description="Softmax attention (Llama class, 4 heads, RoPE): its KV cache grows with t."),
        _main("lfm2", "hybrid", "lfm2", dict(layer_types=["conv", "full_attention"]),
              description="LFM2-style hybrid: a gated short-conv layer (kernel 3), then a softmax-attention layer."),
        _main("mamba2_n16", "mamba2", "mamba2", dict(state_size=16),
              description="Mamba2 (SSD), 8 heads x 16 channels, state 16 per head (2,048 scalars per layer)."),
        _main("mamba2_n4", "mamba2", "mamba2", dict(state_size=4),
              description="Mamba2 with a small state: 4 per head (512 scalars per layer); it saturates as K grows."),
        _main("la_k16", "linear_attention", "ess_linear_attention", _la(16, False),
              description="Linear attention with a short conv, 4 heads, key size 16 (1,024 scalars per layer)."),
        _main("gla_k16", "gated_linear_attention", "ess_linear_attention", _la(16, True),
              description="Gated linear attention (per-key decay), 4 heads, key size 16 (1,024 scalars per layer)."),
        _main("gla_k4", "gated_linear_attention", "ess_linear_attention", _la(4, True),
              description="Gated linear attention with key size 4 per head (256 scalars per layer)."),
        ZooSpec("mamba2_n64_recent", "mamba2", "mamba2", dict(state_size=64), task=RECENT_TASK, steps=1500,
                description="Mamba2 with a large state (64 per head, 8,192 scalars per layer) trained on recent recall: 13 short "
                "recalls (3 pairs, 2 queries) back to back over 6 keys, so only the latest binding of a key is right and only "
                "the last ~10 tokens matter. The learned-collapse example."),
        ZooSpec("mamba2_n16_reset", "mamba2", "mamba2", dict(state_size=16), task=RESET_TASK, steps=RESET_STEPS,
                description="Mamba2 (as mamba2_n16) trained on the reset task: 4 segments separated by '|'; queries after '|' "
                "may ask a key of an earlier segment, whose answer is '--'. Keeping old bindings gives wrong answers."),
        ZooSpec("gla_k16_reset", "gated_linear_attention", "ess_linear_attention", _la(16, True), task=RESET_TASK,
                steps=RESET_STEPS, description="Gated linear attention (as gla_k16) trained on the reset task."),
    ]
}

# The control of each reset model: the same architecture trained without separators.
RESET_CONTROLS = {"mamba2_n16_reset": "mamba2_n16", "gla_k16_reset": "gla_k16"}


def build_model(spec: ZooSpec, seed: int | None = None):
    """A freshly initialised model for ``spec`` (~64 wide, 2 layers, float32)."""
    from transformers import Lfm2Config, Lfm2ForCausalLM, LlamaConfig, LlamaForCausalLM
    from transformers import Mamba2Config, Mamba2ForCausalLM, MambaConfig, MambaForCausalLM

    torch.manual_seed(spec.seed if seed is None else seed)
    vocab = spec.task.vocab.size
    common = dict(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    kw = dict(spec.arch_kwargs)
    if spec.arch == "llama":
        cfg = LlamaConfig(**common, intermediate_size=128, num_key_value_heads=kw["num_attention_heads"],
                          max_position_embeddings=256, tie_word_embeddings=False, **kw)
        return LlamaForCausalLM(cfg)
    if spec.arch == "lfm2":
        cfg = Lfm2Config(**common, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=256, block_auto_adjust_ff_dim=False, conv_L_cache=3, **kw)
        return Lfm2ForCausalLM(cfg)
    if spec.arch == "mamba2":
        # d_inner = expand * hidden = 128 = num_heads * head_dim; n_groups=1 for tiny head counts.
        cfg = Mamba2Config(**common, num_heads=8, head_dim=16, expand=2, n_groups=1, conv_kernel=4, chunk_size=64, **kw)
        return Mamba2ForCausalLM(cfg)
    if spec.arch == "mamba":
        cfg = MambaConfig(**common, expand=2, conv_kernel=4, tie_word_embeddings=False, **kw)
        return MambaForCausalLM(cfg)
    if spec.arch == "ess_linear_attention":
        cfg = EssLinearAttentionConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                                       max_position_embeddings=256, pad_token_id=0, **kw)
        return EssLinearAttentionForCausalLM(cfg)
    raise ValueError(f"unknown arch {spec.arch!r}; known: llama, lfm2, mamba, mamba2, ess_linear_attention")


def stepwise_mamba_scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                        return_last_state=False, **kwargs):
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


def _lr_at(step: int, spec: ZooSpec, steps: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    warm = max(1, int(spec.warmup * steps))
    if step < warm:
        return spec.lr * (step + 1) / warm
    progress = (step - warm) / max(1, steps - warm)
    return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train_model(spec: ZooSpec, out_dir: Path, steps: int | None = None, eval_every: int = 100, log=print, val_samples: int = 256):
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
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=spec.lr, betas=(0.9, 0.98))
    curve, losses = [], []
    start = time.time()
    patch = fast_mamba_training() if spec.arch == "mamba" else contextlib.nullcontext()
    done = 0
    with patch:
        for step in tqdm(range(steps), desc=spec.name, mininterval=10, disable=None):
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, spec, steps)
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
            if done % eval_every == 0 or done == steps:
                tasks = spec.validation_tasks()
                per_k = [evaluate_model(model, t, n_samples=max(1, val_samples // len(tasks)), seed=VALIDATION_SEED)["accuracy"] for t in tasks]
                val = {"accuracy": float(sum(per_k) / len(per_k))}
                point = {"step": done, "loss": sum(losses[-50:]) / len(losses[-50:]), "val_accuracy": val["accuracy"],
                         "seconds": round(time.time() - start, 1)}
                if spec.train_pairs:
                    point["val_accuracy_per_k"] = {str(t.num_pairs): a for t, a in zip(tasks, per_k)}
                curve.append(point)
                log(f"{spec.name}: {json.dumps(point)}")
                if val["accuracy"] >= spec.target_accuracy:
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
            "steps_planned": steps, "steps_run": done, "target_accuracy": spec.target_accuracy, "lr": spec.lr,
            "batch_size": spec.batch_size,
            "optimizer": "AdamW(betas=(0.9, 0.98)), linear warmup then cosine to 10%", "warmup": spec.warmup,
            "weight_decay": spec.weight_decay, "grad_clip": 1.0, "seed": spec.seed,
            "data_seeds": "batch at step s: task.sample(batch_size, seed=[seed, s])",
            "wall_seconds": round(seconds, 1), "threads": torch.get_num_threads(),
            "final_loss": curve[-1]["loss"] if curve else None, "curve": curve,
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
    return {"plateau": bool(abs(change) < points), "change": round(float(change), 4), "from_step": earlier[-1]["step"],
            "to_step": last["step"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ess_explorer.zoo.train", description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help=f"models to train (default all): {', '.join(ZOO)}")
    parser.add_argument("--steps", type=int, default=None, help="override every model's step count (smoke runs)")
    parser.add_argument("--out", type=Path, default=None, help="zoo folder (default: the shipped assets/zoo)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the cores are shared)")
    parser.add_argument("--no-cards", action="store_true", help="skip measuring accuracy / ESS and writing the cards")
    parser.add_argument("--cards-only", action="store_true", help="do not train; rewrite the cards of saved models")
    args = parser.parse_args(argv)
    from . import ZOO_DIR

    torch.set_num_threads(args.threads)
    names = args.only or list(ZOO)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        raise SystemExit(f"unknown zoo model(s) {unknown}; known: {', '.join(ZOO)}")
    root = args.out or ZOO_DIR
    for name in names:
        if not args.cards_only:
            record, _ = train_model(ZOO[name], root / name, steps=args.steps)
            print(f"{name}: trained {record['training']['steps_run']} steps in {record['training']['wall_seconds']} s", flush=True)
        if not args.no_cards:
            from .cards import write_card

            card = write_card(name, root / name)
            print(f"{name}: held-out accuracy {card['heldout']['accuracy']:.3f}", flush=True)


if __name__ == "__main__":
    main()
