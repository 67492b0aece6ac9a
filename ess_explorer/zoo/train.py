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

__all__ = ["ZooSpec", "ZOO", "build_model", "train_model", "stepwise_mamba_scan", "main"]

VALIDATION_SEED = 20_000
TEST_SEED = 10_000

MAIN_TASK = MQARTask(num_pairs=8)  # L = 32: 8 pairs, then 8 queries
SEGMENTED_TASK = MQARTask(num_pairs=4, num_segments=3)  # L = 50: three segments of 4 pairs + 4 queries, "|" between


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
    description: str = ""


def _la(head_dim: int, gated: bool) -> dict:
    return dict(num_heads=4, head_dim=head_dim, value_dim=16, conv_size=4, gated=gated)


ZOO: dict[str, ZooSpec] = {
    spec.name: spec
    for spec in [
        ZooSpec("llama", "softmax_attention", "llama", dict(num_attention_heads=4), lr=1e-3, steps=1500,
                description="Softmax attention (Llama class, 4 heads, RoPE): its KV cache grows with t."),
        ZooSpec("lfm2", "hybrid", "lfm2", dict(layer_types=["conv", "full_attention"]), lr=3e-3, steps=800,
                description="LFM2-style hybrid: a gated short-conv layer (kernel 3), then a softmax-attention layer."),
        ZooSpec("mamba2_n16", "mamba2", "mamba2", dict(state_size=16), steps=1000,
                description="Mamba2 (SSD), 8 heads x 16 channels, state 16 per head."),
        ZooSpec("mamba2_n2", "mamba2", "mamba2", dict(state_size=2), steps=800,
                description="Mamba2 with a tiny state: 2 per head, 16 per layer for 8 pairs."),
        ZooSpec("mamba2_n128", "mamba2", "mamba2", dict(state_size=128), steps=600,
                description="Mamba2 with an over-provisioned state: 128 per head, while no cut of a 32-token prompt "
                "can have rank above 16 (the 'collapsed' example: capacity left unused)."),
        ZooSpec("mamba_n16", "mamba", "mamba", dict(state_size=16), steps=1000,
                description="Mamba (S6), 128 channels, state 16 per channel."),
        ZooSpec("mamba_n2", "mamba", "mamba", dict(state_size=2), steps=600,
                description="Mamba with a tiny state: 2 per channel (128 channels)."),
        ZooSpec("la_k16", "linear_attention", "ess_linear_attention", _la(16, False), steps=1000,
                description="Linear attention with a short conv, 4 heads, key size 16."),
        ZooSpec("la_k2", "linear_attention", "ess_linear_attention", _la(2, False), steps=800,
                description="Linear attention with key size 2 per head: 8 state dimensions per layer for 8 pairs."),
        ZooSpec("gla_k16", "gated_linear_attention", "ess_linear_attention", _la(16, True), steps=1000,
                description="Gated linear attention (per-key decay), 4 heads, key size 16."),
        ZooSpec("gla_k2", "gated_linear_attention", "ess_linear_attention", _la(2, True), steps=800,
                description="Gated linear attention with key size 2 per head."),
        ZooSpec("gla_k16_seg", "gated_linear_attention", "ess_linear_attention", _la(16, True), task=SEGMENTED_TASK,
                steps=1000, description="GLA trained on 3 segments separated by '|': keys reset after it."),
        ZooSpec("mamba2_n16_seg", "mamba2", "mamba2", dict(state_size=16), task=SEGMENTED_TASK, steps=1000,
                description="Mamba2 trained on 3 segments separated by '|': keys reset after it."),
    ]
}


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
            batch = spec.task.sample(spec.batch_size, seed=[spec.seed, step])
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
                val = evaluate_model(model, spec.task, n_samples=val_samples, seed=VALIDATION_SEED)
                point = {"step": done, "loss": sum(losses[-50:]) / len(losses[-50:]), "val_accuracy": val["accuracy"],
                         "seconds": round(time.time() - start, 1)}
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
            "mamba_stepwise_scan": spec.arch == "mamba",
        },
        "description": spec.description,
    }
    (out_dir / "training.json").write_text(json.dumps(record, indent=2))
    return record, model


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
