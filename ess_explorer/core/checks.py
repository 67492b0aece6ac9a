"""Input validation shared by the core: every bad input becomes one clear ValueError."""

from __future__ import annotations

import numpy as np
import torch


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def as_tensor(value, name: str) -> torch.Tensor:
    """A torch tensor view of a numpy array, tensor or nested list; ValueError otherwise."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray) or isinstance(value, (list, tuple)):
        array = np.asarray(value)
        require(
            np.issubdtype(array.dtype, np.number) and not np.iscomplexobj(array),
            f"{name} must hold real numbers, got dtype {array.dtype}",
        )
        return torch.from_numpy(np.ascontiguousarray(array))
    raise ValueError(f"{name} must be a numpy array or a torch tensor, got {type(value).__name__}")
