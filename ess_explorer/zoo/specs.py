"""The zoo's models: one spec per model (architecture, task, training settings), the tasks, and
``build_model``, which builds a spec's freshly initialised model (the untrained copy of every card).

Seeds: training batches use two-word seeds [spec.seed, step]; validation and held-out test
batches use the integer seeds VALIDATION_SEED and TEST_SEED, so they are never training batches.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..architectures import EssLinearAttentionConfig, EssLinearAttentionForCausalLM
from .mqar import MQARTask

__all__ = [
    "VALIDATION_SEED",
    "TEST_SEED",
    "MAIN_TASK",
    "TRAIN_PAIRS",
    "RESET_TASK",
    "RESET_KEEP_TASK",
    "RECENT_TASK",
    "REBIND_TASK",
    "SEPARATED_TASK",
    "SEGMENTED_TASK",
    "MAIN_STEPS",
    "RESET_STEPS",
    "ZooSpec",
    "ZOO",
    "RESET_CONTROLS",
    "FAILURE_PAIRS",
    "FAILURE_PAIR_MODELS",
    "COLLAPSING_INIT",
    "build_model",
]

VALIDATION_SEED = 20_000
TEST_SEED = 10_000

# L = 128: K pairs, then 64 - K queries. The card's K is 16; training draws K from TRAIN_PAIRS
# (one K per batch, in turn), so every K of the difficulty sweep is in the training distribution.
MAIN_TASK = MQARTask(num_pairs=16, num_queries=48)
TRAIN_PAIRS = (2, 4, 8, 16, 32)
# L = 131: four segments of 8 pairs + 8 queries, "|" between; in segments 2-4, 3 of the 8 queries ask a
# key of an earlier segment that is absent from the current one (answer "--"): old bindings give wrong answers.
RESET_TASK = MQARTask(num_pairs=8, num_segments=4, stale_queries=3)
# Its matched control: the same prompts (same draws for the same seed), but a stale query is answered with the
# key's latest value in an earlier segment, so the separator carries no reset and keeping the past is right.
RESET_KEEP_TASK = replace(RESET_TASK, stale_answer="earlier")
# L = 130: 13 short recalls (3 pairs, then 2 queries) back to back with no separator, over only 6 keys, so a
# key comes back every few tokens with a new value: the answer is its latest binding, and older bindings only
# interfere. An easy task that needs the last ~10 tokens, for a model with a large state (learned collapse).
RECENT_TASK = MQARTask(num_pairs=3, num_queries=2, num_segments=13, num_keys=6, separators=False)
# The same with only 4 keys: 3 of the 4 are rebound in every segment, so old bindings interfere at once and
# the model gains by forgetting fast. For the model with the largest state (128 per head).
REBIND_TASK = MQARTask(num_pairs=3, num_queries=2, num_segments=13, num_keys=4, separators=False)
# The recent-recall task with "|" between the short recalls (L = 142): everything before the last "|" is
# noise, so the natural solution is to empty the state at "|" (a learned reset on an easy task).
SEPARATED_TASK = MQARTask(num_pairs=3, num_queries=2, num_segments=13, num_keys=6)
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
    # "cosine": warmup, then cosine decay to 10% over the whole budget (every shipped model);
    # "plateau": warmup, then the full learning rate until validation accuracy plateaus (train.py:
    # plateau_at_full_lr) or the budget less the anneal is spent, then a cosine anneal of ``anneal`` x steps
    schedule: str = "cosine"
    anneal: float = 0.2

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


# Mamba2Config's step size for the deliberately collapsed model: dt_bias = softplus^-1(dt), dt log-uniform in
# [time_step_min, time_step_max], and time_step_limit clamps every token's dt = softplus(dt_raw + dt_bias) from below,
# so no input can lower it: with A = -1..-num_heads, exp(dt A) <= exp(-8 |A|) per token, the past is gone after one.
# (The initialisation alone, dt starting at 1-10 with no clamp, did not hold: one seed's in_proj learned input-driven
# dt near 0 in layer 0, back to 0.052 of the rank cap.)
COLLAPSING_INIT = dict(time_step_min=8.0, time_step_max=16.0, time_step_floor=8.0, time_step_limit=(8.0, float("inf")))
MAIN_STEPS = 1200  # the equal budget of every main-task model (batch 32, L = 128)
RESET_STEPS = 3000  # the equal budget of the reset-task models (batch 32, L = 131)


def _main(name, family, arch, arch_kwargs, description, **kw) -> ZooSpec:
    return ZooSpec(
        name,
        family,
        arch,
        arch_kwargs,
        task=MAIN_TASK,
        train_pairs=TRAIN_PAIRS,
        steps=MAIN_STEPS,
        description=description,
        **kw,
    )


ZOO: dict[str, ZooSpec] = {
    spec.name: spec
    for spec in [
        _main(
            "llama",
            "softmax_attention",
            "llama",
            dict(num_attention_heads=4),
            lr=1e-3,
            description="Softmax attention (Llama class, 4 heads, RoPE): its KV cache grows with t.",
        ),
        _main(
            "lfm2",
            "hybrid",
            "lfm2",
            dict(layer_types=["conv", "full_attention"]),
            description="LFM2-style hybrid: a gated short-conv layer (kernel 3), then a softmax-attention layer.",
        ),
        _main(
            "mamba2_n16",
            "mamba2",
            "mamba2",
            dict(state_size=16),
            description="Mamba2 (SSD), 8 heads x 16 channels, state 16 per head (2,048 scalars per layer).",
        ),
        _main(
            "mamba_n16",
            "mamba",
            "mamba",
            dict(state_size=16),
            description="Mamba (S6), 128 channels, state 16 per channel (2,048 scalars per layer, as mamba2_n16).",
        ),
        _main(
            "mamba2_n4",
            "mamba2",
            "mamba2",
            dict(state_size=4),
            description="Mamba2 with a small state: 4 per head (512 scalars per layer); it saturates as K grows.",
        ),
        _main(
            "la_k16",
            "linear_attention",
            "ess_linear_attention",
            _la(16, False),
            description="Linear attention with a short conv, 4 heads, key size 16 (1,024 scalars per layer).",
        ),
        _main(
            "gla_k16",
            "gated_linear_attention",
            "ess_linear_attention",
            _la(16, True),
            description="Gated linear attention (per-key decay), 4 heads, key size 16 (1,024 scalars per layer).",
        ),
        _main(
            "mamba2_n64",
            "mamba2",
            "mamba2",
            dict(state_size=64),
            description="Mamba2 with a large state, 64 per head (8,192 scalars per layer), trained well (default "
            "initialisation): the twin of mamba2_n64_collapse, the failure-mode pair.",
        ),
        _main(
            "mamba2_n64_collapse",
            "mamba2",
            "mamba2",
            dict(state_size=64, **COLLAPSING_INIT),
            description="Mamba2 as mamba2_n64 (64 per head, 8,192 scalars per layer, same task, budget and learning "
            "rate), initialised and held to forget: every head's step dt starts between 8 and 16 (default 0.001 to "
            "0.1) and the config's time_step_limit keeps it at 8 or more for every token, so exp(dt A) empties the "
            "state within a token or two unless training shrinks A a hundredfold. The paper's collapse failure mode, beside its twin.",
        ),
        ZooSpec(
            "mamba2_n64_recent",
            "mamba2",
            "mamba2",
            dict(state_size=64),
            task=RECENT_TASK,
            steps=800,
            description="Mamba2 with a large state (64 per head, 8,192 scalars per layer) trained on recent recall: 13 short "
            "recalls (3 pairs, 2 queries) back to back over 6 keys, so only the latest binding of a key is right and only "
            "the last ~10 tokens matter. The learned-collapse example.",
        ),
        ZooSpec(
            "mamba2_n128_rebind",
            "mamba2",
            "mamba2",
            dict(state_size=128),
            task=REBIND_TASK,
            steps=800,
            description="Mamba2 with a state of 128 per head (16,384 scalars per layer) trained on fast rebinding: 13 "
            "short recalls (3 pairs, 2 queries) back to back over only 4 keys, so every key is rebound every few tokens "
            "and only the last ~10 tokens matter. The learned-collapse example.",
        ),
        ZooSpec(
            "mamba2_n16_sep",
            "mamba2",
            "mamba2",
            dict(state_size=16),
            task=SEPARATED_TASK,
            steps=800,
            description="Mamba2 (as mamba2_n16) trained on recent recall with '|' between the short recalls (13 recalls "
            "of 3 pairs + 2 queries over 6 keys): everything before the last '|' is noise, so the state can be emptied there.",
        ),
        ZooSpec(
            "mamba2_n16_recent",
            "mamba2",
            "mamba2",
            dict(state_size=16),
            task=RECENT_TASK,
            steps=800,
            description="Mamba2 (as mamba2_n16) trained on the same recent recall with no separator: the control of "
            "mamba2_n16_sep.",
        ),
        ZooSpec(
            "mamba2_n16_reset",
            "mamba2",
            "mamba2",
            dict(state_size=16),
            task=RESET_TASK,
            steps=RESET_STEPS,
            description="Mamba2 (as mamba2_n16) trained on the reset task: 4 segments separated by '|'; queries after '|' "
            "may ask a key of an earlier segment, whose answer is '--'. Keeping old bindings gives wrong answers.",
        ),
        ZooSpec(
            "gla_k16_reset",
            "gated_linear_attention",
            "ess_linear_attention",
            _la(16, True),
            task=RESET_TASK,
            steps=RESET_STEPS,
            description="Gated linear attention (as gla_k16) trained on the reset task.",
        ),
    ]
}


def _keep_control(name: str) -> ZooSpec:
    """The matched control of reset model ``name``: its spec (architecture, budget, learning rate, seed)
    on RESET_KEEP_TASK, the same prompts where the separator carries no reset."""
    spec = ZOO[name]
    return replace(
        spec,
        name=name.removesuffix("_reset") + "_keep",
        task=RESET_KEEP_TASK,
        description=f"The matched control of {name}: the same prompts and budget, but the separator carries no reset "
        "(an earlier binding stays valid: a query for a key of an earlier segment is answered with its latest value).",
    )


ZOO.update({spec.name: spec for spec in (_keep_control("mamba2_n16_reset"), _keep_control("gla_k16_reset"))})

# The control of each reset model: the same architecture, trained on the same prompts and budget where the
# separator carries no reset (mamba2_n16_sep: the same recent recall with no separator).
RESET_CONTROLS = {
    "mamba2_n16_reset": "mamba2_n16_keep",
    "gla_k16_reset": "gla_k16_keep",
    "mamba2_n16_sep": "mamba2_n16_recent",
}


# The failure-mode pairs: a model deliberately collapsed by its initialisation -> the same architecture, task,
# budget and learning rate trained well (zoo/collapse.py measures both over seeds and fresh prompts).
FAILURE_PAIRS = {"mamba2_n64_collapse": "mamba2_n64"}
FAILURE_PAIR_MODELS = tuple(name for pair in FAILURE_PAIRS.items() for name in pair)  # both sides of every pair


def build_model(spec: ZooSpec, seed: int | None = None):
    """A freshly initialised model for ``spec`` (~64 wide, 2 layers, float32)."""
    from transformers import (
        Lfm2Config,
        Lfm2ForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        Mamba2Config,
        Mamba2ForCausalLM,
        MambaConfig,
        MambaForCausalLM,
    )

    torch.manual_seed(spec.seed if seed is None else seed)
    vocab = spec.task.vocab.size
    common = dict(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, pad_token_id=0, bos_token_id=None, eos_token_id=None
    )
    kw = dict(spec.arch_kwargs)
    if spec.arch == "llama":
        cfg = LlamaConfig(
            **common,
            intermediate_size=128,
            num_key_value_heads=kw["num_attention_heads"],
            max_position_embeddings=256,
            tie_word_embeddings=False,
            **kw,
        )
        return LlamaForCausalLM(cfg)
    if spec.arch == "lfm2":
        cfg = Lfm2Config(
            **common,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=256,
            block_auto_adjust_ff_dim=False,
            conv_L_cache=3,
            **kw,
        )
        return Lfm2ForCausalLM(cfg)
    if spec.arch == "mamba2":
        # d_inner = expand * hidden = 128 = num_heads * head_dim; n_groups=1 for tiny head counts.
        cfg = Mamba2Config(**common, num_heads=8, head_dim=16, expand=2, n_groups=1, conv_kernel=4, chunk_size=64, **kw)
        return Mamba2ForCausalLM(cfg)
    if spec.arch == "mamba":
        cfg = MambaConfig(**common, expand=2, conv_kernel=4, tie_word_embeddings=False, **kw)
        return MambaForCausalLM(cfg)
    if spec.arch == "ess_linear_attention":
        cfg = EssLinearAttentionConfig(
            vocab_size=vocab,
            hidden_size=64,
            num_hidden_layers=2,
            intermediate_size=128,
            max_position_embeddings=256,
            pad_token_id=0,
            **kw,
        )
        return EssLinearAttentionForCausalLM(cfg)
    raise ValueError(f"unknown arch {spec.arch!r}; known: llama, lfm2, mamba, mamba2, ess_linear_attention")
