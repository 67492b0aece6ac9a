"""The entropy a route's unresolved values carry, as one compiled CPU kernel (numba).

Same result as `precision.unresolved_entropy_reference` (the tests compare them): per cut,
-sum p log p over its values sigma with 0 < sigma^2 <= the route's error, p = sigma / sum(sigma).
The reference gathers the cuts that can hold any (their smallest square within the error) and
computes on them in whole-array steps: five temporaries of up to a (U, P, K) array each, about
0.4 s of a Mamba-130m-shaped layer's 4 s at L = 512 on one core, mostly memory traffic. Here each
cut is one pass over its K values, nothing stored but the result; only the few values below
the error take a logarithm. Where numba is missing, or for a small job, the reference runs.
"""

from __future__ import annotations

import numpy as np
import torch

from . import compiled
from .accelerator import worker_threads
from .compiled import available, jit
from .sweeps import over_chunks

__all__ = ["available", "applies", "unresolved_entropy", "KERNEL_MIN_VALUES"]

# Below this many values the reference's few whole-array steps cost less than a call here;
# it also keeps a small job's first analysis from waiting for this kernel's compile.
KERNEL_MIN_VALUES = 1 << 16
ROWS_PER_CHUNK = 1 << 16  # cuts per task of the worker threads


def applies(squares: torch.Tensor) -> bool:
    """Whether the kernel computes `unresolved_entropy` of ``squares``: float64 on a CPU,
    numba installed, at least KERNEL_MIN_VALUES values."""
    return (
        available()
        and squares.device.type == "cpu"
        and squares.dtype == torch.float64
        and squares.numel() >= KERNEL_MIN_VALUES
    )


def unresolved_entropy(squares: torch.Tensor, error: torch.Tensor) -> torch.Tensor:
    """`precision.unresolved_entropy_reference` of squares (..., K) and error (...), float64
    on a CPU: (...), over the worker threads."""
    k = squares.shape[-1]
    values = np.ascontiguousarray(squares.detach().reshape(-1, k).numpy())
    limits = np.ascontiguousarray(error.detach().to(squares.dtype).expand(squares.shape[:-1]).reshape(-1).numpy())
    out = np.empty(len(limits))
    compiled.first_call(_unresolved_entropy, _warm_up)

    def run(rows: slice) -> None:
        _unresolved_entropy(values[rows], limits[rows], out[rows])

    over_chunks(run, len(out), ROWS_PER_CHUNK, worker_threads(squares.device))
    return torch.from_numpy(out).reshape(squares.shape[:-1])


@jit
def _unresolved_entropy(squares, error, out):  # pragma: no cover - compiled
    """out[r] <- the entropy of row r of squares (R, K) (descending) that its values within
    error[r] of zero carry (module docstring); NaN where the row holds a NaN and can hold any,
    as the reference gives."""
    rows, k = squares.shape
    for r in range(rows):
        limit = error[r]
        out[r] = 0.0
        if not squares[r, k - 1] <= limit:  # descending: no value is within the error
            continue
        total = 0.0
        unordered = False  # a NaN among the values: the reference's sum is NaN
        for j in range(k):
            s = squares[r, j]
            total += np.sqrt(s) if s > 0.0 else 0.0
            unordered = unordered or s != s
        if unordered:
            out[r] = np.nan
            continue
        total = max(total, 1e-300)
        carried = 0.0
        for j in range(k):
            s = squares[r, j]
            if 0.0 < s <= limit:
                p = np.sqrt(s) / total
                carried -= p * np.log(p)
        out[r] = carried


def _warm_up() -> None:
    """The kernel's first call in a process, on a tiny problem (`compiled.first_call`)."""
    _unresolved_entropy(np.array([[1.0, 1e-20]]), np.array([1e-16]), np.empty(1))
