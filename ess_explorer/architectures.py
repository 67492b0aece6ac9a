"""The project's own linear attention (LA) and gated linear attention (GLA) models.

A small transformers model family (``model_type = "ess_linear_attention"``), registered with
``AutoConfig`` / ``AutoModel`` / ``AutoModelForCausalLM`` when this module is imported, so
``save_pretrained`` / ``from_pretrained`` work with safetensors and without
``trust_remote_code``.

Architecture (nanoGPT-sized, pre-norm):

    x = embed(input_ids)                                          (B, L, D)
    for each layer:  x = x + mixer(rmsnorm(x));  x = x + mlp(rmsnorm(x))
    logits = lm_head(rmsnorm(x))

The sequence mixer (``model.model.layers[i].mixer``, a ``LinearAttentionMixer``):

    u = silu(causal_depthwise_conv(hidden))      # short conv: lets a value bind to the key before it
    q, k, v, log_decay = project(hidden)         # per head: q, k (dk), v (dv), log_decay (dk) or None
    o = mix(q, k, v, log_decay)                  # the sequence-mixing operator T, below
    out = out_proj(merge_heads(rmsnorm_per_head(o)))

with, per head, for i >= j (0-based positions, no normalisation)

    o_i = sum_{j<=i} ( q_i . (prod_{t=j+1..i} exp(log_decay_t)) * k_j ) v_j

i.e. T[i, j] = q_i^T diag(prod_{t=j+1..i} alpha_t) k_j with alpha = exp(log_decay) (GLA) or
alpha = 1 (LA). As a recurrence with state S (dk x dv): S_i = diag(alpha_i) S_{i-1} + k_i v_i^T,
o_i = S_i^T q_i, so per value channel it is exactly a ``DiagonalSSM`` with a = alpha, b = k,
c = q, d = 0 and input u = v[..., channel]. The theoretical state size (TSS) per head is dk.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PreTrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

__all__ = [
    "EssLinearAttentionConfig",
    "LinearAttentionMixer",
    "EssLinearAttentionModel",
    "EssLinearAttentionForCausalLM",
    "linear_attention_reference",
]

MODEL_TYPE = "ess_linear_attention"


class EssLinearAttentionConfig(PreTrainedConfig):
    """Configuration of an LA / GLA language model.

    Fields: vocab_size, hidden_size (D), num_hidden_layers, num_heads (H), head_dim (dk, the
    key/query size per head = TSS per head), value_dim (dv per head), conv_size (length of the
    short causal depthwise conv before the projections; 1 disables it), gated (GLA when True),
    gate_logit_normalizer (log_decay = logsigmoid(W x + b) / this, as in the GLA paper: keeps
    decays near 1 at initialisation), intermediate_size (MLP width), max_position_embeddings
    (the longest sequence the model was trained for; informational, no position embedding).
    """

    model_type = MODEL_TYPE

    vocab_size: int = 128
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_heads: int = 4
    head_dim: int = 16
    value_dim: int = 16
    conv_size: int = 4
    gated: bool = False
    gate_logit_normalizer: float = 16.0
    intermediate_size: int = 128
    max_position_embeddings: int = 256
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.validate_architecture()

    def validate_architecture(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_heads",
            "head_dim",
            "value_dim",
            "conv_size",
        ):
            if int(getattr(self, name)) < 1:
                raise ValueError(
                    f"EssLinearAttentionConfig.{name} must be a positive integer, got {getattr(self, name)}"
                )

    @property
    def state_size(self) -> int:
        """TSS per head (the rank bound of every cut of T): the key size dk."""
        return int(self.head_dim)


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dimension."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def linear_attention_reference(q, k, v, log_decay=None) -> torch.Tensor:
    """The recurrence S_i = diag(alpha_i) S_{i-1} + k_i v_i^T, o_i = S_i^T q_i, step by step.

    Shapes as in ``LinearAttentionMixer.mix``. Slow (a Python loop over L); for tests.
    """
    batch, heads, length, dk = q.shape
    state = q.new_zeros(batch, heads, dk, v.shape[-1])
    outputs = []
    for i in range(length):
        if log_decay is not None:
            state = state * log_decay[:, :, i, :, None].exp()
        state = state + k[:, :, i, :, None] * v[:, :, i, None, :]
        outputs.append(torch.einsum("bhd,bhde->bhe", q[:, :, i], state))
    return torch.stack(outputs, dim=2)


class LinearAttentionMixer(nn.Module):
    """Short conv + (gated) linear attention. See the module docstring for the math.

    Interface used by the ESS adapters:
        project(hidden (B, L, D)) -> dict(q=(B,H,L,dk), k=(B,H,L,dk), v=(B,H,L,dv),
                                          log_decay=(B,H,L,dk) <= 0, or None when ungated)
        mix(q, k, v, log_decay)   -> (B, H, L, dv)   the sequence mixing, o = T v per channel
        forward(hidden)           =  out_proj(merge_heads(norm(mix(**project(hidden)))))
    """

    def __init__(self, config: EssLinearAttentionConfig, layer_idx: int = 0):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.value_dim = config.value_dim
        self.gated = bool(config.gated)
        self.gate_logit_normalizer = float(config.gate_logit_normalizer)
        self.chunk_size = 16  # GLA: length of the blocks of the chunked form (see mix)
        d = config.hidden_size
        # Depthwise causal conv over the hidden channels (left padding conv_size - 1, trimmed).
        self.conv = nn.Conv1d(d, d, config.conv_size, groups=d, padding=config.conv_size - 1, bias=True)
        self.conv._ess_short_conv = True  # marks it for _init_weights
        self.q_proj = nn.Linear(d, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.num_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.num_heads * self.value_dim, bias=False)
        self.gate_proj = nn.Linear(d, self.num_heads * self.head_dim, bias=True) if self.gated else None
        if self.gate_proj is not None:
            self.gate_proj._ess_decay_gate = True  # marks it for _init_weights
        self.out_norm = RMSNorm(self.value_dim, eps=config.rms_norm_eps)
        self.out_proj = nn.Linear(self.num_heads * self.value_dim, d, bias=False)

    def _split_heads(self, x: torch.Tensor, size: int) -> torch.Tensor:
        """(B, L, H * size) -> (B, H, L, size)."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, size).transpose(1, 2)

    def project(self, hidden: torch.Tensor) -> dict:
        """Token-wise part of the layer. hidden: (B, L, D). Returns q, k, v, log_decay (see class)."""
        length = hidden.shape[1]
        u = self.conv(hidden.transpose(1, 2))[..., :length].transpose(1, 2)  # causal: keep the first L outputs
        u = F.silu(u)
        q = self._split_heads(self.q_proj(u), self.head_dim) * self.head_dim**-0.5
        k = self._split_heads(self.k_proj(u), self.head_dim)
        v = self._split_heads(self.v_proj(u), self.value_dim)
        log_decay = None
        if self.gated:
            # logsigmoid <= 0, so every decay alpha = exp(log_decay) lies in (0, 1].
            log_decay = self._split_heads(F.logsigmoid(self.gate_proj(u)) / self.gate_logit_normalizer, self.head_dim)
        return {"q": q, "k": k, "v": v, "log_decay": log_decay}

    def mix(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor | None = None
    ) -> torch.Tensor:
        """o_i = sum_{j<=i} (q_i . prod_{t=j+1..i} exp(log_decay_t) * k_j) v_j, shape (B, H, L, dv).

        Ungated: the quadratic masked form (tril(q k^T)) v, cheapest at L <= a few hundred.
        Gated: a chunked form in which every exponent is <= 0, so nothing overflows: with
        C = cumsum(log_decay) inside a chunk (inclusive),
          within a chunk   T[i, j] = sum_d q_id k_jd exp(C_id - C_jd)   (masked to j <= i)
          across chunks    the state S (dk x dv) at the chunk start carries the past:
                           o_i += (q_i * exp(C_i)) S,
                           S <- exp(C_last) * S + sum_j (k_j * exp(C_last - C_j)) v_j^T.
        Requires log_decay <= 0 (project guarantees it).
        """
        length = q.shape[2]
        if log_decay is None:
            causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
            scores = (q @ k.transpose(-1, -2)).masked_fill(~causal, 0.0)
            return scores @ v
        return self._chunked_gated(q, k, v, log_decay)

    def _chunked_gated(self, q, k, v, log_decay) -> torch.Tensor:
        batch, heads, length, dk = q.shape
        dv = v.shape[-1]
        c = min(self.chunk_size, length)
        n_chunks = math.ceil(length / c)
        pad = n_chunks * c - length
        if pad:  # padding at the end cannot change earlier outputs (causal)
            q, k, v, log_decay = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, log_decay))
        split = lambda x: x.reshape(batch, heads, n_chunks, c, x.shape[-1])  # noqa: E731
        q, k, v, log_decay = split(q), split(k), split(v), split(log_decay)
        cum = log_decay.cumsum(dim=-2)  # (B, H, n, c, dk) inclusive within each chunk
        # Within chunks: exponents C_i - C_j <= 0 for j <= i; -inf above the diagonal gives exp = 0.
        diff = cum[..., :, None, :] - cum[..., None, :, :]  # (B, H, n, c_i, c_j, dk)
        causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        diff = diff.masked_fill(~causal[:, :, None], float("-inf"))
        scores = torch.einsum("bhnid,bhnjd,bhnijd->bhnij", q, k, diff.exp())
        out = scores @ v  # (B, H, n, c, dv)
        # Across chunks: a short loop over n_chunks, carrying the state S.
        last = cum[..., -1:, :]  # (B, H, n, 1, dk)
        q_in = q * cum.exp()  # decay from the chunk start to i
        k_out = k * (last - cum).exp()  # decay from j to the chunk end
        state = q.new_zeros(batch, heads, dk, dv)
        inter = []
        for n in range(n_chunks):
            inter.append(q_in[:, :, n] @ state)
            state = last[:, :, n, 0, :, None].exp() * state + k_out[:, :, n].transpose(-1, -2) @ v[:, :, n]
        out = out + torch.stack(inter, dim=2)
        return out.reshape(batch, heads, n_chunks * c, dv)[:, :, :length]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (B, L, D) -> (B, L, D)."""
        o = self.mix(**self.project(hidden))  # (B, H, L, dv)
        o = self.out_norm(o)
        batch, _, length, _ = o.shape
        return self.out_proj(o.transpose(1, 2).reshape(batch, length, self.num_heads * self.value_dim))


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: EssLinearAttentionConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class EssLinearAttentionBlock(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: EssLinearAttentionConfig, layer_idx: int):
        super().__init__()
        self.mixer_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mixer = LinearAttentionMixer(config, layer_idx)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mixer(self.mixer_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class EssLinearAttentionPreTrainedModel(PreTrainedModel):
    config_class = EssLinearAttentionConfig
    base_model_prefix = "model"
    _no_split_modules = ["EssLinearAttentionBlock"]

    def _init_weights(self, module):
        # transformers.initialization functions skip parameters already loaded from a checkpoint.
        super()._init_weights(module)
        if isinstance(module, RMSNorm):
            init.ones_(module.weight)
        elif isinstance(module, nn.Conv1d) and getattr(module, "_ess_short_conv", False):
            # Near-identity start (weight on the current token) plus noise on the past taps.
            weight = torch.randn_like(module.weight) * 0.1
            weight[..., -1] += 1.0
            init.copy_(module.weight, weight)
            init.zeros_(module.bias)
        elif isinstance(module, nn.Linear) and getattr(module, "_ess_decay_gate", False):
            # Slow decays at the start: logsigmoid(4) / 16 ~ -0.001 per step.
            init.constant_(module.bias, 4.0)


class EssLinearAttentionModel(EssLinearAttentionPreTrainedModel):
    """Embeddings + blocks + final norm; returns the last hidden state (B, L, D)."""

    def __init__(self, config: EssLinearAttentionConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([EssLinearAttentionBlock(config, i) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, output_hidden_states=None, **kwargs):
        # attention_mask is accepted for API compatibility; padding is not supported (right
        # padding is harmless for causal outputs before it).
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        hidden_states = [x] if output_hidden_states else None
        for block in self.layers:
            x = block(x)
            if output_hidden_states:
                hidden_states.append(x)
        x = self.norm(x)
        return BaseModelOutput(last_hidden_state=x, hidden_states=tuple(hidden_states) if hidden_states else None)


class EssLinearAttentionForCausalLM(EssLinearAttentionPreTrainedModel):
    """LA / GLA language model. forward(input_ids, labels=None) -> CausalLMOutput(loss, logits).

    ``labels`` follow the transformers convention (same positions as input_ids, shifted
    inside the loss, -100 ignored).
    """

    def __init__(self, config: EssLinearAttentionConfig):
        super().__init__(config)
        self.model = EssLinearAttentionModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(
        self, input_ids=None, attention_mask=None, inputs_embeds=None, labels=None, output_hidden_states=None, **kwargs
    ):
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        return CausalLMOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


def _register() -> None:
    """Make AutoConfig / AutoModel / AutoModelForCausalLM know the family (idempotent)."""
    try:
        AutoConfig.register(MODEL_TYPE, EssLinearAttentionConfig)
    except ValueError:  # already registered (module re-imported)
        pass
    for auto, cls in ((AutoModel, EssLinearAttentionModel), (AutoModelForCausalLM, EssLinearAttentionForCausalLM)):
        try:
            auto.register(EssLinearAttentionConfig, cls)
        except ValueError:
            pass


_register()
