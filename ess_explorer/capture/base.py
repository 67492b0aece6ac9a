"""How a family attaches to a model for one forward pass.

`Adapter` is the protocol of one family (capture/<family>.py): install hooks for one
forward pass, then build the layer's unit operators (core/units.py) from what they saw.
`CaptureSession` is the bookkeeping shared by all adapters of one pass (hooks to remove,
module functions to restore, the layer now running). `LayerSlot` says where one analysed
layer's mixer lives.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, Protocol

from torch import nn

from ..core.units import CapturedLayer

__all__ = ["LayerSlot", "Adapter", "CaptureSession", "quiet_kernel_fallback", "transformers_outside_tested_range"]


@dataclass(frozen=True)
class LayerSlot:
    """Where one analysed layer's sequence mixer lives.

    index: 0-based layer index (the key of ESSResult.layers); adapter: the family key of
    `ADAPTERS` (capture/__init__.py); module: the mixer module hooks attach to;
    window: sliding-window length for attention layers (None = full causal);
    chunk: chunk length of chunked attention layers (Llama 4), else None;
    label: what the slot is when a layer holds several analysed mixers (Falcon-H1:
    "layer 3 mamba2") or runs several times (Dory, Inkling 2 Loop: "layer 5 pass 1"); None
    when the key is the layer index;
    call: which call of ``module`` in the forward pass the slot reads (0: the first): a layer the
    pass runs several times applies an operator at each call, a slot each (capture/__init__.py).
    """

    index: int
    adapter: str
    module: nn.Module
    window: int | None = None
    chunk: int | None = None
    label: str | None = None
    call: int = 0


class Adapter(Protocol):
    """One family of sequence mixers.

    install(session, slot): attach whatever captures the layer's tensors during the one
        forward pass (forward hooks, or a wrapped module-level function); everything must
        be registered through `session` so that it is undone in a ``finally``.
    build(slot, raw): turn the captured tensors (the dict `session.raw[slot.index]`) into
        a CapturedLayer; raise RuntimeError when something expected was not captured.
    """

    def install(self, session: "CaptureSession", slot: LayerSlot) -> None: ...

    def build(self, slot: LayerSlot, raw: dict) -> "CapturedLayer": ...


class CaptureSession:
    """Hooks, patches and captured tensors of one forward pass.

    raw[layer] is a dict each adapter fills; `current` is the index of the layer whose
    mixer is running (set by `track`), so that a wrapped module-level function shared by
    all layers knows whose call it sees.
    """

    def __init__(self) -> None:
        self.raw: dict[int, dict[str, Any]] = {}
        self.current: int | None = None
        self._handles: list = []
        self._patches: dict[tuple[str, str], Callable] = {}
        self._instance_patches: list[tuple[object, str]] = []

    def store(self, layer: int) -> dict:
        return self.raw.setdefault(layer, {})

    def hook(self, handle) -> None:
        self._handles.append(handle)

    def keep_output(self, module: nn.Module, store: dict, key: str) -> None:
        """During the pass, ``store[key]`` is what ``module`` returns (detached)."""
        self.hook(module.register_forward_hook(lambda _m, _a, out: store.__setitem__(key, out.detach())))

    def keep_input(self, module: nn.Module, store: dict, key: str) -> None:
        """During the pass, ``store[key]`` is ``module``'s first positional input (detached)."""
        self.hook(module.register_forward_pre_hook(lambda _m, args: store.__setitem__(key, args[0].detach())))

    def track(self, layer: int, module: nn.Module) -> None:
        """Mark `layer` as current while `module` runs (pre and post forward hooks)."""

        def enter(_module, _args):
            self.current = layer

        def leave(_module, _args, _output):
            self.current = None

        self.hook(module.register_forward_pre_hook(enter))
        self.hook(module.register_forward_hook(leave))

    def patch_function(self, module_name: str, name: str, make_wrapper: Callable[[Callable], Callable]) -> None:
        """Replace ``module_name.name`` by ``make_wrapper(original)`` once per session."""
        key = (module_name, name)
        if key in self._patches:
            return
        module = sys.modules[module_name]
        original = getattr(module, name)
        self._patches[key] = original
        setattr(module, name, make_wrapper(original))

    def patch_method(self, instance: object, name: str, make_wrapper: Callable[[Callable], Callable]) -> None:
        """Shadow a bound method on one instance (removed again by `close`)."""
        if name in vars(instance):
            raise RuntimeError(f"{type(instance).__name__}.{name} is already patched on this instance")
        setattr(instance, name, make_wrapper(getattr(instance, name)))
        self._instance_patches.append((instance, name))

    def close(self) -> None:
        """Remove every hook and restore every patched function (call in a finally)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for (module_name, name), original in self._patches.items():
            setattr(sys.modules[module_name], name, original)
        self._patches.clear()
        for instance, name in self._instance_patches:
            vars(instance).pop(name, None)
        self._instance_patches.clear()
        self.current = None


def transformers_outside_tested_range() -> str | None:
    """A sentence saying that the installed transformers is outside the range this package
    asks for (its own metadata, from pyproject.toml), or None when it is inside.

    The adapters read transformers' modeling code (the functions a mixer calls, the names of
    its projections), which a release may change: an adapter that finds nothing where it
    looks is then a version mismatch, and the error should say so and what to install."""
    import transformers
    from packaging.requirements import Requirement

    try:
        wanted = next(
            r for r in map(Requirement, metadata.requires("ess-explorer") or []) if r.name == "transformers"
        ).specifier
    except (metadata.PackageNotFoundError, StopIteration):
        return None
    if wanted.contains(transformers.__version__, prereleases=True):
        return None
    return (
        f"transformers {transformers.__version__} is installed, and this package is tested with "
        f"transformers{wanted}: pip install 'transformers{wanted}'"
    )


_FALLBACK_NOTICE = "falling back to its reference PyTorch implementation"


@contextlib.contextmanager
def quiet_kernel_fallback():
    """transformers (5.25) says, once per function, that a scan or a convolution "is falling
    back to its reference PyTorch implementation ... much slower" where its CUDA package is
    missing or the input is on the CPU. For the capture that reference is the path it reads,
    and the forward pass is a small part of an analysis, so the notice is dropped for the pass
    (its other messages pass)."""
    logger = logging.getLogger("transformers.integrations.hub_kernels")

    def keep(record: logging.LogRecord) -> bool:
        return _FALLBACK_NOTICE not in record.getMessage()

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)
