"""Randomly initialised models with the shapes of real ones, built from transformers configs
(nothing downloaded), shared by the benchmarks."""

from __future__ import annotations

import torch

KINDS = {
    "gpt2": "GPT-2-small (12 layers x 12 heads)",
    "mamba": "Mamba-130m (24 layers, 1,536 channels, N = 16)",
    "mamba2": "Mamba2-130m (24 layers, 24 heads of 64 channels, N = 128)",
    "lfm2": "LFM2-350M (16 layers: 10 short convs, 6 GQA attention)",
    "qwen3_next": "Qwen3-Next-shaped (2 layers: Gated DeltaNet with 4 value heads of 128, K = 128; gated attention)",
}


def random_model(kind: str):
    """An eval-mode causal LM of ``kind`` (see KINDS) with seeded random weights."""
    import transformers as tf

    tf.logging.set_verbosity_error()
    if kind == "qwen3_next":
        model = qwen3_next(value_heads=4)
        model.config._name_or_path = f"random {kind}"
        return model
    torch.manual_seed(0)
    if kind == "gpt2":
        config = tf.GPT2Config(n_positions=2048)
    elif kind == "mamba":
        config = tf.MambaConfig(hidden_size=768, num_hidden_layers=24, state_size=16, expand=2, vocab_size=50280)
    elif kind == "mamba2":
        config = tf.Mamba2Config(
            hidden_size=768,
            num_hidden_layers=24,
            state_size=128,
            expand=2,
            head_dim=64,
            num_heads=24,
            n_groups=1,
            vocab_size=50280,
        )
    elif kind == "lfm2":
        attention = {2, 5, 8, 10, 12, 14}
        config = tf.Lfm2Config(
            hidden_size=1024,
            num_hidden_layers=16,
            num_attention_heads=16,
            num_key_value_heads=8,
            intermediate_size=6656,
            vocab_size=65536,
            layer_types=["full_attention" if i in attention else "conv" for i in range(16)],
        )
    else:
        raise ValueError(f"unknown model kind {kind!r}; one of {sorted(KINDS)}")
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    model.config._name_or_path = f"random {kind}"
    return model


def qwen3_next(value_heads: int, **config):
    """An eval-mode Qwen3-Next-shaped model with seeded random weights: the released Gated
    DeltaNet heads (key and value heads of 128, two value heads per key head), ``value_heads`` of
    its 32, a gated attention layer after it; ``config`` overrides these Qwen3NextConfig fields.
    Its decays are a trained model's (alpha close to 1), not the random init's, which may set
    A = exp(A_log) up to 16 and empty the state every step."""
    import transformers as tf

    torch.manual_seed(0)
    fields = dict(
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        hidden_size=512,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=4096,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        linear_num_key_heads=value_heads // 2,
        linear_num_value_heads=value_heads,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
    )
    model = tf.AutoModelForCausalLM.from_config(tf.Qwen3NextConfig(**{**fields, **config}), attn_implementation="eager")
    with torch.no_grad():
        A_log = model.model.layers[0].linear_attn.A_log
        A_log.copy_(torch.log(torch.empty_like(A_log).uniform_(0.01, 0.1)))
    return model.eval()


def mamba_like(channels: int, length: int, state: int, seed: int = 0):
    """One Mamba layer's operator with Mamba's parameter ranges (a = exp(dt * A), b = dt * B,
    c = C; B and C shared by the channels of the layer, dt and A per channel), float64."""
    from ess_explorer import DiagonalSSM

    g = torch.Generator().manual_seed(seed)
    dt = torch.nn.functional.softplus(torch.randn(channels, length, 1, generator=g, dtype=torch.float64) - 4)
    A = -torch.arange(1, state + 1, dtype=torch.float64).expand(channels, 1, state)
    B = torch.randn(1, length, state, generator=g, dtype=torch.float64)
    C = torch.randn(1, length, state, generator=g, dtype=torch.float64)
    shape = (channels, length, state)
    return DiagonalSSM(torch.exp(dt * A), (dt * B).expand(shape), C.expand(shape))


def token_ids(model, length: int) -> list[int]:
    """A fixed prompt of ``length`` ids within the model's vocabulary."""
    vocab = model.get_input_embeddings().num_embeddings
    return [(17 * i + 3) % vocab for i in range(length)]
