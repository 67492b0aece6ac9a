"""Which routes a job takes: those written for the CPU or those written for an accelerator.

The CPU routes use the compiled kernels (numba), worker threads over chunks of units or cuts,
and factors carried from cut to cut; an accelerator's routes batch units and cuts into a few
large calls and keep the results on the device until the layer's ESS are reduced
(docs/spectra.md). Every such choice in the core asks `accelerator_routes` (and
`worker_threads` for its threads), so it is made from the device in one place.

Inside `accelerator_routes_on_cpu()` CPU tensors take the accelerator's routes too: the tests
run that logic (batching, padding, dispatch, reductions, the "ess" contract's guards) and
compare it with the CPU routes on a machine without a GPU. What needs CUDA itself (cuSOLVER's
batched solver, free-memory queries, streams) still asks for a CUDA device.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

__all__ = ["accelerator_routes", "worker_threads", "accelerator_routes_on_cpu"]

_on_cpu = False  # set by `accelerator_routes_on_cpu`; global, so a pool's threads see it too


def accelerator_routes(device) -> bool:
    """Whether work on ``device`` (None: the CPU) takes the accelerator's routes."""
    return _on_cpu or (device is not None and torch.device(device).type != "cpu")


def worker_threads(device) -> int:
    """Threads a route runs its chunks in: one per torch thread on the CPU routes (small
    LAPACK calls loop over a batch on one core: core/sweeps.py `over_chunks`); one on an
    accelerator, whose calls are batched already."""
    return 1 if accelerator_routes(device) else torch.get_num_threads()


@contextmanager
def accelerator_routes_on_cpu():
    """Run the accelerator's routes on CPU tensors while inside (module docstring)."""
    global _on_cpu
    saved, _on_cpu = _on_cpu, True
    try:
        yield
    finally:
        _on_cpu = saved
