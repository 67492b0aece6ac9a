"""A result shaped like a real trained LLM's: 30 softmax-attention layers of 9 heads on a
523-token prompt with separators, for the checks that only show at depth (layer order, labels,
row limits, file size).

The spectra are real (one layer of random softmax heads through the same builder as
`analyze`); each layer gets its own ESS level (tolerance-ESS scaled by a per-layer factor,
with the order scrambled) so that a panel that sorts its rows wrongly draws a different
picture. The ESS values are therefore made up; only their shapes and orders are checked.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ess_explorer.result import ESSResult, LayerESS
from ess_explorer.synthetic import reference_tokens, softmax_attention

N_LAYERS, LENGTH, HEADS, HEAD_DIM = 30, 523, 9, 64


def level(index: int) -> float:
    """The ESS level of layer ``index``: scrambled so that no two neighbours are alike."""
    return 0.15 + 0.85 * ((index * 11) % N_LAYERS) / (N_LAYERS - 1)


@functools.lru_cache(maxsize=None)
def deep_result(n_layers: int = N_LAYERS, length: int = LENGTH) -> ESSResult:
    tokens = reference_tokens(length)
    base = LayerESS.from_operator(
        0,
        "softmax_attention",
        softmax_attention(length, units=HEADS, head_dim=HEAD_DIM),
        tol=1e-3,
        relative=True,
        keep_operators=range(HEADS),
        multiplicity=HEAD_DIM,
    )
    layers = {}
    for index in range(n_layers):
        scale = level(index)
        layers[index] = dataclasses.replace(
            base,
            layer=index,
            tolerance_ess=np.rint(base.tolerance_ess * scale).astype(np.int64),
            entropy_ess=base.entropy_ess * scale,
            singular_values=base.singular_values.copy(),
            operators={unit: op.copy() for unit, op in base.operators.items()},
        )
    meta = {
        "model_id": "synthetic:deep",
        "tol": 1e-3,
        "relative": True,
        "scope": "cut",
        "separators": [t for t, tok in enumerate(tokens) if tok == "|"],
    }
    return ESSResult(tokens=tokens, input_ids=list(range(length)), layers=layers, meta=meta)


def shaped_result(n_layers: int, length: int, units: int = 2, kept: int = 8) -> ESSResult:
    """A result of any depth and length with made-up arrays of the right shapes and orders
    (ESS min(t, L - t) capped per layer, TSS = t, descending spectra): for the views' limits
    at 64 layers and 4,096 tokens, where real spectra would take minutes."""
    t = np.arange(length)
    bound = np.minimum(t, length - t)
    rng = np.random.default_rng(0)
    tokens = reference_tokens(length)
    layers = {}
    for index in range(n_layers):
        ess = np.minimum(bound, 5 + (index * 7) % 40)[None].repeat(units, 0)
        sigma = -np.sort(-rng.random((units, length, kept)), axis=-1) * (np.arange(kept) < bound[:, None])
        layers[index] = LayerESS(
            index,
            "softmax_attention",
            "head",
            t,
            ess,
            ess * 0.8,
            np.tile(t.astype(float), (units, 1)),
            sigma,
            np.tile(bound, (units, 1)),
        )
    meta = {"model_id": "synthetic:shaped", "tol": 1e-3, "relative": True}
    meta["separators"] = [k for k, tok in enumerate(tokens) if tok == "|"]
    return ESSResult(tokens=tokens, input_ids=list(range(length)), layers=layers, meta=meta)
