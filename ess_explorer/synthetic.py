"""Reference operators with known ESS, and a small ESSResult built from them.

Used by the teaching notebook and the view tests: everything here is
made from seeded random parameters with the closed forms of docs/math.md ("Closed forms"), no model.

    convolution(k)            ESS(t) = k - 1 once min(t, L - t) >= k - 1
    linear_attention(d_k)     ESS(t) <= min(d_k, t, L - t), = for generic keys
    diagonal_ssm(n)           ESS(t) <= n
    softmax_attention()       ESS(t) = min(t, L - t) generically
    trained_like_attention()  the head kinds of trained models: attention sinks (98-100% of
                              the weight on token 0), sharp (near one-hot) and near-uniform heads
    collapsed_ssm(n)          ESS(t) = 1 of a state of n: every input written along one direction
"""

from __future__ import annotations

import math

import torch

from .core.ess import DEFAULT_RELATIVE, DEFAULT_TOL
from .core.operators import DiagonalSSM
from .core.precision import DEFAULT_PRECISION
from .result import ESSResult, LayerESS

__all__ = [
    "convolution",
    "linear_attention",
    "diagonal_ssm",
    "softmax_attention",
    "trained_like_attention",
    "HEAD_KINDS",
    "reference_result",
    "reference_tokens",
    "collapsed_ssm",
    "collapsed_result",
]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def convolution(length: int, kernel_size: int, *, units: int = 1, seed: int = 0) -> torch.Tensor:
    """Causal depthwise convolutions: T[i, j] = w[i - j] for 0 <= i - j < k. (units, L, L)."""
    weights = torch.randn(units, kernel_size, generator=_generator(seed), dtype=torch.float64)
    lag = torch.arange(length)[:, None] - torch.arange(length)[None, :]
    inside = (lag >= 0) & (lag < kernel_size)
    return torch.where(inside, weights[:, lag.clamp(0, kernel_size - 1)], torch.zeros(()))


def linear_attention(length: int, key_size: int, *, units: int = 1, seed: int = 0) -> DiagonalSSM:
    """Unnormalised linear attention, T[i, j] = q_i . k_j, as a DiagonalSSM (a = 1)."""
    g = _generator(seed)
    q = torch.randn(units, length, key_size, generator=g, dtype=torch.float64)
    k = torch.randn(units, length, key_size, generator=g, dtype=torch.float64)
    return DiagonalSSM(torch.ones_like(q), k, q)


def diagonal_ssm(length: int, state_size: int, *, units: int = 1, seed: int = 0, resets=()) -> DiagonalSSM:
    """A selective (Mamba-like) diagonal SSM with decays in (0.5, 1); at every t in
    ``resets`` the decay is 0, so the state is emptied there (a separator)."""
    g = _generator(seed)
    a = 0.5 + 0.5 * torch.rand(units, length, state_size, generator=g, dtype=torch.float64)
    for t in resets:
        a[:, t, :] = 0.0
    b = torch.randn(units, length, state_size, generator=g, dtype=torch.float64)
    c = torch.randn(units, length, state_size, generator=g, dtype=torch.float64)
    d = torch.randn(units, length, generator=g, dtype=torch.float64)
    return DiagonalSSM(a, b, c, d)


def collapsed_ssm(length: int, state_size: int, *, units: int = 1, seed: int = 0, decay: float = 0.95) -> DiagonalSSM:
    """A diagonal SSM with a state of ``state_size`` that uses one direction of it: one decay
    for every state entry and every input written along one fixed direction v of the state
    (b_t = beta_t v). Then T[i, j] = decay^(i - j) beta_j (c_i . v) has rank 1, so every cut
    has ESS 1 of TSS = state_size: a collapsed state, built so on purpose."""
    g = _generator(seed)
    a = torch.full((units, length, state_size), float(decay), dtype=torch.float64)
    direction = torch.randn(units, 1, state_size, generator=g, dtype=torch.float64)
    b = torch.randn(units, length, 1, generator=g, dtype=torch.float64) * direction
    c = torch.randn(units, length, state_size, generator=g, dtype=torch.float64)
    return DiagonalSSM(a, b, c)


def collapsed_result(length: int = 64, state_size: int = 32, *, units: int = 4, seed: int = 0) -> ESSResult:
    """An ESSResult of one Mamba-like layer whose units are `collapsed_ssm`s: ESS 1 at every
    cut of a state of ``state_size``, utilisation 1 / min(state_size, length // 2)."""
    layer = _layer(0, "mamba", collapsed_ssm(length, state_size, units=units, seed=seed), state_size=state_size)
    tokens = reference_tokens(length)
    return ESSResult(tokens=tokens, input_ids=list(range(length)), layers={0: layer}, meta=_meta("synthetic:collapsed"))


def _layer(
    index, family, operator, *, tol=DEFAULT_TOL, relative=DEFAULT_RELATIVE, precision=DEFAULT_PRECISION, **sizes
):
    """The LayerESS of a synthetic operator, every unit's T kept for the views."""
    units = operator.batch_shape[0] if isinstance(operator, DiagonalSSM) else operator.shape[0]
    return LayerESS.from_operator(
        index, family, operator, tol=tol, relative=relative, keep_operators=range(units), precision=precision, **sizes
    )


def _meta(model_id: str, *, tol=DEFAULT_TOL, relative=DEFAULT_RELATIVE, precision=DEFAULT_PRECISION, separators=()):
    """The analysis settings of a synthetic result (its meta)."""
    return {
        "model_id": model_id,
        "revision": None,
        "dtype": "float64",
        "device": "cpu",
        "tol": tol,
        "relative": relative,
        "stride": None,
        "precision": precision,
        "separators": list(separators),
    }


def softmax_attention(
    length: int, *, head_dim: int = 16, units: int = 1, seed: int = 0, sink: float = 0.0, sharpness: float = 1.0
) -> torch.Tensor:
    """Causal softmax attention maps softmax(sharpness q k^T / sqrt(d) + mask), (units, L, L).
    ``sink`` is added to every score of token 0 (an attention sink: with sink = log(200 L) every
    row puts more than 98% of its weight there); ``sharpness`` > 1 makes rows near one-hot,
    < 1 near uniform."""
    g = _generator(seed)
    q = torch.randn(units, length, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(units, length, head_dim, generator=g, dtype=torch.float64)
    scores = sharpness * (q @ k.transpose(-1, -2)) / head_dim**0.5
    scores[..., 0] += sink
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)


# The head kinds of trained softmax attention, as softmax_attention options. Random weights give
# only "random" heads; a trained LLM's layers mix all four, and the sink heads (whose cut spectra
# fall steeply below sigma_1) are the ones a spectrum route finds hardest.
HEAD_KINDS = {
    "sink": lambda length: {"sink": math.log(200 * length)},
    "sharp": lambda length: {"sharpness": 6.0},
    "uniform": lambda length: {"sharpness": 0.1},
    "random": lambda length: {},
}


def trained_like_attention(
    length: int, *, units: int = 12, head_dim: int = 64, seed: int = 0, mix=("sink", "sink", "sharp", "uniform")
) -> torch.Tensor:
    """(units, L, L) softmax heads whose kinds cycle through ``mix`` (HEAD_KINDS): by default
    half attention sinks, a quarter sharp and a quarter near-uniform heads, the mix of a
    trained small LLM's layers (where 9-90% of the cuts per layer defeat a Gram guard)."""
    heads = [
        softmax_attention(length, head_dim=head_dim, seed=seed + u, **HEAD_KINDS[mix[u % len(mix)]](length))[0]
        for u in range(units)
    ]
    return torch.stack(heads)


def reference_tokens(length: int, segment: int = 16) -> list[str]:
    """Readable MQAR-like tokens ("k3 v7 ...") with a separator "|" every ``segment`` positions."""
    tokens = []
    for t in range(length):
        if t % segment == segment - 1:
            tokens.append("|")
        else:
            tokens.append(f"k{(t * 7) % 10}" if t % 2 == 0 else f"v{(t * 3) % 10}")
    return tokens


def reference_result(
    length: int = 48,
    *,
    seed: int = 0,
    tol: float = DEFAULT_TOL,
    relative: bool = DEFAULT_RELATIVE,
    precision: str = DEFAULT_PRECISION,
) -> ESSResult:
    """An ESSResult with four layers of different families and known behaviour.

    layer 0 softmax attention (2 heads), 1 short convolution (4 channels, k = 4),
    2 diagonal SSM (4 channels, N = 4, state emptied at every separator),
    3 linear attention (2 heads, d_k = 4). Operators of every unit are kept. precision: the
    accuracy contract of the spectra (core/precision.py).
    """
    tokens = reference_tokens(length)
    separators = [t for t, tok in enumerate(tokens) if tok == "|"]
    specs = [
        ("softmax_attention", softmax_attention(length, units=2, seed=seed), {}),
        ("short_conv", convolution(length, 4, units=4, seed=seed + 1), {"kernel_size": 4}),
        ("mamba", diagonal_ssm(length, 4, units=4, seed=seed + 2, resets=separators), {"state_size": 4}),
        ("linear_attention", linear_attention(length, 4, units=2, seed=seed + 3), {"state_size": 4}),
    ]
    layers = {
        index: _layer(index, family, operator, tol=tol, relative=relative, precision=precision, **sizes)
        for index, (family, operator, sizes) in enumerate(specs)
    }
    meta = _meta("synthetic:reference", tol=tol, relative=relative, precision=precision, separators=separators)
    return ESSResult(tokens=tokens, input_ids=list(range(length)), layers=layers, meta=meta)
