"""The operator view's data: T of one unit cut into blocks of max |T| (view 3 of specs.py).

An operator of L x L positions is sent to the browser as at most MAX_OPERATOR_SIDE x
MAX_OPERATOR_SIDE blocks, each the largest |T| inside it (a thin band such as a short
convolution stays visible), never L^2 cells.
"""

from __future__ import annotations

import math

import numpy as np

from ..result import SAVED_OPERATOR_SIDE, ESSResult, LayerESS

__all__ = ["MAX_OPERATOR_SIDE", "focus_unit", "operator_block_size", "operator_data"]

# What a saved result keeps is what the view draws (result.py)
MAX_OPERATOR_SIDE = SAVED_OPERATOR_SIDE


def focus_unit(result: ESSResult, layer: int, unit="mean") -> int:
    """The single unit whose spectrum and operator are shown: ``unit`` itself when it is an
    index; for an aggregate, the first unit whose operator was kept (else unit 0)."""
    if not isinstance(unit, str):
        return int(unit)
    ops = result.layer(layer).operators
    return min(ops) if ops else 0


def operator_block_size(lay: LayerESS, length: int, max_side: int = MAX_OPERATOR_SIDE) -> int:
    """Positions per side of one drawn block of T: ceil(L / max_side), rounded up to a
    multiple of the blocks a saved file kept (``LayerESS.operator_block``)."""
    stored = lay.operator_block
    return stored * max(1, math.ceil(math.ceil(length / max_side) / stored))


def operator_data(
    result: ESSResult, *, layer: int, unit="mean", max_side: int = MAX_OPERATOR_SIDE
) -> tuple[list[dict], int]:
    """Rows of the "operator" dataset for the focus unit, and the block size b.

    T (L x L) is cut into b x b blocks, b = ceil(L / max_side); each lower-triangular block
    holds ``logabs`` = log10 of the largest |T| inside it (a thin band such as a short conv
    stays visible) and ``rel`` = logabs minus the largest (colour domain [-6, 0]). Blocks
    below 1e-8 of the peak are left out. Empty when the unit's T was not kept."""
    lay = result.layer(layer)
    focus = focus_unit(result, layer, unit)
    if focus not in lay.operators:
        return [], 1
    op = np.abs(np.asarray(lay.operators[focus], dtype=np.float64))
    length = result.length
    size = operator_block_size(lay, length, max_side)
    factor = size // lay.operator_block  # a loaded long operator is already cut into blocks
    n = math.ceil(op.shape[0] / factor)
    pad = np.zeros((n * factor, n * factor))
    pad[: op.shape[0], : op.shape[1]] = op
    blocks = pad.reshape(n, factor, n, factor).max(axis=(1, 3))
    peak = blocks.max()
    if peak <= 0:
        return [], size
    bi, bj = np.nonzero(np.tril(blocks > peak * 1e-8))
    logabs = np.log10(blocks[bi, bj])
    top = float(np.log10(peak))
    records = [
        {
            "i0": int(i) * size,
            "i1": min((int(i) + 1) * size, length),
            "j0": int(j) * size,
            "j1": min((int(j) + 1) * size, length),
            "logabs": round(float(v), 3),
            "rel": round(float(v) - top, 3),
        }
        for i, j, v in zip(bi.tolist(), bj.tolist(), logabs.tolist())
    ]
    return records, size
