"""analyze: run a model once on one prompt and return its ESSResult.

Pipeline: validate everything first (so a bad argument never leaves anything half
done) -> one forward pass captures every analysed layer's operators (capture/) ->
per layer, the spectra of every cut H_t of every unit by the core (float64, on
``device``), tolerance- and entropy-ESS from the full spectra, TSS from
diagnostics.theoretical_state_size -> ESSResult.

Memory budgets: the spectra's are in core/layer.py (the one LayerESS builder);
LayerESS.spectra_complete says where the kept values are the whole spectrum.
- OPERATOR_BUDGET = 4M cells: ``keep_operators="auto"`` keeps the dense T of every
  attention head when H * L^2 fits (GPT-2 small: 12 x 512^2 = 3.1M), else as many heads
  as fit; for channel families (Mamba, short conv) the first OPERATOR_CHANNELS = 4
  channels when they fit. Kept operators are stored float32 (for the operator view).
"""

from __future__ import annotations

import datetime as _dt
import math
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .capture import capture, layer_slots, skipped_layers
from .core.accelerator import accelerator_routes
from .core.checks import check_device
from .core.ess import DEFAULT_RELATIVE, DEFAULT_SCOPE, DEFAULT_TOL, check_scope, check_tolerance
from .core.estimate import layer_seconds
from .core.gates import DEFAULT_GATES, check_gates, gates_inside
from .core.layer import SPECTRA_BUDGET
from .core.memory import reused_memory
from .core.precision import DEFAULT_PRECISION, Accuracy, check_precision
from .core.units import CapturedLayer
from .prompt_tokens import chat_tokens, check_separators, display_tokens, input_ids_of
from .result import ESSResult, LayerESS

__all__ = [
    "analyze",
    "capture_layers",
    "analyze_captured",
    "estimate_seconds",
    "chat_tokens",
    "CapturedPrompt",
    "OPERATOR_BUDGET",
    "OPERATOR_CHANNELS",
]

OPERATOR_BUDGET = 4_000_000
OPERATOR_CHANNELS = 4


def analyze(
    model,
    input_ids=None,
    *,
    prompt: str | None = None,
    chat: Sequence[dict] | None = None,
    separators: Sequence[int] | None = None,
    tokenizer=None,
    layers: Iterable[int] | int | None = None,
    tol: float = DEFAULT_TOL,
    relative: bool = DEFAULT_RELATIVE,
    scope: str = DEFAULT_SCOPE,
    gates: str = DEFAULT_GATES,
    device=None,
    progress: bool = True,
    stride: int | None = None,
    top_k: int | None = None,
    keep_operators="auto",
    units: int | Sequence[int] | None = None,
    causal: bool = True,
    precision: str = DEFAULT_PRECISION,
    max_seconds: float | None = None,
) -> ESSResult:
    """ESS of every unit of the chosen layers of ``model`` on one prompt.

    Parameters
    ----------
    model : a transformers causal LM of a supported model type (capture.REGISTRY).
    input_ids : token ids, a list, a 1-D tensor or a (1, L) tensor; or pass ``prompt``
        and ``tokenizer`` instead, or ``chat`` and ``tokenizer`` (exactly one of the three).
        Text here, with ``tokenizer``, is the prompt: ``analyze(model, "text", tokenizer=tok)``.
    chat : a conversation, [{"role": "user", "content": "..."}, ...], formatted by the
        tokenizer's chat template (`chat_tokens`); meta["chat"] keeps it, meta["prompt"] the
        formatted text.
    separators : positions t the diagnostics treat as separators (meta["separators"]); by
        default the end of each turn for a ``chat``, else the views' separator / EOS tokens.
    layers : layer indices to analyse (default all); one int for a single layer.
    tol, relative : tolerance-ESS threshold (relative to sigma_1 by default).
    scope : which sigma_1 a relative tolerance refers to (core/ess.py): "cut" (default, each
        cut on its own scale), "unit" (the largest over the unit's cuts: reset-aware) or
        "layer" (over the whole layer). Applies to tolerance-ESS and causal ESS.
    gates : "inside" (default) folds the input-dependent per-token, per-channel scalings
        around the sequence mixing (Mamba's silu(z), Mamba2's gated norm, the LA / GLA
        head norm's 1 / rms) into T; "outside" leaves T the mixing alone (core/gates.py).
        With gates inside, a Mamba2 head's channels become units of their own.
    device : torch device for the spectra (default: the model's); the forward pass runs
        where the model is.
    progress : tqdm bar over layers.
    stride : compute the cuts t = 0, stride, 2 stride, ... only (a quick preview).
    top_k : keep at most this many singular values per cut (see SPECTRA_BUDGET).
    keep_operators : "auto" (see module docstring), an int n (the first n units), a
        sequence of unit rows, or None / 0 (none). Keys of LayerESS.operators are rows.
    units : analyse only these units per layer: an int n (the first n) or a sequence of
        unit indices; rows of every LayerESS follow it, and meta["units"] records it.
    causal : compute causal ESS (core/causal.py; default True). False leaves it NaN and
        skips the reachability spectra: for a recurrence one N x N SVD per cut and unit,
        about a third of the time of a Mamba layer.
    precision : the accuracy contract (core/precision.py). "ess" (default): every ESS as an
        exact SVD of each cut would give it (tolerance-ESS identical but for singular values
        within 1e-6 of tau; entropy- and causal ESS within 1e-5), by guarded Gram and Gramian
        eigenvalues, which resolve the stored singular values down to about 1e-7 sigma_1.
        "exact": every singular value within 1e-6 sigma_k + 1e-10 sigma_1 (slower).
    max_seconds : refuse (ValueError, after the forward pass and before the spectra) a run
        whose `estimate_seconds` is above this; None (default): no limit. The estimate is a
        2-core CPU's, so on a GPU a run over the limit only warns (UserWarning) and goes on.

    Returns
    -------
    ESSResult with meta: model_id, revision, model_type, dtype, device, tol, relative,
    scope, gates, stride, top_k, units, causal, precision, transformers, created, spectra_budget.

    Raises ValueError (before any work) for an unsupported model type, no or empty
    prompt, a prompt longer than the model's context, token ids out of range, a layer
    index out of range, or bad options.
    """
    _check_options(
        tol, stride, top_k, keep_operators, scope=scope, relative=relative, causal=causal, precision=precision
    )
    _units(units)  # bad options fail before the forward pass
    if max_seconds is not None:
        _check_number("max_seconds", max_seconds, minimum=0.0)
    # One scope for the pass and the spectra: the forward's freed temporaries (a Mamba layer's
    # discretised (D, L, N) arrays) serve the spectra's arrays instead of being unmapped between.
    with reused_memory():
        captured = capture_layers(
            model,
            input_ids,
            prompt=prompt,
            chat=chat,
            separators=separators,
            tokenizer=tokenizer,
            layers=layers,
            device=device,
            gates=gates,
        )
        if max_seconds is not None:
            _check_estimate(captured, stride, max_seconds, precision, causal)
        return analyze_captured(
            captured,
            tol=tol,
            relative=relative,
            scope=scope,
            stride=stride,
            top_k=top_k,
            keep_operators=keep_operators,
            units=units,
            progress=progress,
            release=True,
            causal=causal,
            precision=precision,
        )


@dataclass
class CapturedPrompt:
    """What one forward pass captured: the unit operators of the chosen layers of one prompt.

    input_ids (L,), tokens (L display strings), layers: layer index -> CapturedLayer (the
    unit operators, core/units.py), meta: the model-level fields of ESSResult.meta
    (model_id, revision, model_type, n_layers, dtype, transformers), device: where the
    spectra are computed. `analyze_captured` turns any subset of the layers into an
    ESSResult, at any stride, without another forward pass.
    """

    input_ids: list[int]
    tokens: list[str]
    layers: dict[int, CapturedLayer]
    meta: dict = field(default_factory=dict)
    device: torch.device = torch.device("cpu")
    expected: list[int] | None = None  # every layer the pass captures (None: those in ``layers``)

    @property
    def length(self) -> int:
        return len(self.input_ids)


def capture_layers(
    model,
    input_ids=None,
    *,
    prompt: str | None = None,
    chat: Sequence[dict] | None = None,
    separators: Sequence[int] | None = None,
    tokenizer=None,
    layers: Iterable[int] | int | None = None,
    device=None,
    gates: str = DEFAULT_GATES,
    on_layer: Callable[[CapturedPrompt, int], None] | None = None,
) -> CapturedPrompt:
    """One forward pass of ``model`` capturing the unit operators of ``layers`` (default all).

    Same inputs and the same ValueErrors as `analyze` (exactly one of input_ids, prompt= or
    chat= with tokenizer=; separators; layer indices in range). ``device``: where the spectra will be
    computed (default: the model's). ``gates``: as in `analyze` (core/gates.py).
    ``on_layer(captured, index)``: called during the pass as each layer is captured, with
    the CapturedPrompt being filled (``captured.expected`` lists every layer to come), so
    an early layer can be analysed while the pass goes on.
    """
    import transformers

    conversation = {}
    if chat is not None:
        if input_ids is not None or prompt is not None:
            raise ValueError("pass exactly one of input_ids, prompt= or chat= (with tokenizer=)")
        text, input_ids, ends = chat_tokens(tokenizer, chat)
        conversation = {"chat": [dict(m) for m in chat], "prompt": text}
        separators = ends if separators is None else separators
    ids = input_ids_of(model, input_ids, prompt, tokenizer)
    separators = check_separators(separators, len(ids))
    check_gates(gates)
    spectra_device = check_device(device) if device is not None else None
    slots = {slot.index: slot for slot in layer_slots(model)}  # key -> slot (keys need not be 0..n-1)
    chosen = _layers(layers, sorted(slots))
    model_device = _model_device(model)
    config = model.config
    meta = {
        "model_id": getattr(config, "_name_or_path", None)
        or getattr(model, "name_or_path", None)
        or type(model).__name__,
        "revision": getattr(config, "_commit_hash", None),
        "model_type": config.model_type,
        "n_layers": len(slots),
        **_slot_meta(slots, model),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "gates": gates,
        "transformers": transformers.__version__,
        # a model loaded from a GGUF file: the file and its quantisation (sources.gguf_info)
        **({"gguf": config.gguf_source} if getattr(config, "gguf_source", None) else {}),
        **conversation,
        **({"separators": separators} if separators is not None else {}),
    }
    captured = CapturedPrompt(
        input_ids=list(ids),
        tokens=display_tokens(ids, tokenizer),
        layers={},
        meta=meta,
        device=spectra_device if spectra_device is not None else model_device,
        expected=list(chosen),
    )

    def arrived(index: int, layer: CapturedLayer) -> None:
        layer = gates_inside(layer) if gates == "inside" else layer
        layer.check_finite(meta["dtype"])
        captured.layers[index] = layer
        if on_layer is not None:
            on_layer(captured, index)

    with reused_memory():  # the pass's large temporaries reused, not mapped afresh each (core/memory.py)
        capture(model, torch.tensor([ids], dtype=torch.long, device=model_device), [slots[i] for i in chosen], arrived)
    captured.layers = {index: captured.layers[index] for index in chosen}
    return captured


def analyze_captured(
    captured: CapturedPrompt,
    layers: Iterable[int] | int | None = None,
    *,
    tol: float = DEFAULT_TOL,
    relative: bool = DEFAULT_RELATIVE,
    scope: str = DEFAULT_SCOPE,
    stride: int | None = None,
    top_k: int | None = None,
    keep_operators="auto",
    units: int | Sequence[int] | None = None,
    progress: bool = False,
    release: bool = False,
    on_chunk: Callable[[int, int], None] | None = None,
    causal: bool = True,
    precision: str = DEFAULT_PRECISION,
) -> ESSResult:
    """The ESSResult of ``layers`` (default: every captured layer) of a `capture_layers`
    capture; options as in `analyze`. No forward pass: call it once per layer (or stride)
    as the work is wanted. ``release``: drop each layer's operators from ``captured`` once
    computed (frees memory; that layer cannot be computed again). ``on_chunk(done, units)``
    after each chunk of a layer's units (core/layer.py): progress within a layer, and a
    place to stop it by raising."""
    _check_options(
        tol, stride, top_k, keep_operators, scope=scope, relative=relative, causal=causal, precision=precision
    )
    available = sorted(captured.layers)
    if layers is None:
        chosen = available
    else:
        chosen = _layers(layers, available)  # only what was captured
    unit_rows = _units(units)
    for index in chosen:  # validate the unit selection against every layer before computing
        _select(unit_rows, captured.layers[index])
        _operator_rows(keep_operators, captured.layers[index], len(_select(unit_rows, captured.layers[index])))
    positions = np.arange(0, captured.length, stride or 1)
    if len(positions) == 1 and captured.length > 1:
        raise ValueError(
            f"stride {stride} leaves only the cut t = 0 (where ESS is 0) of a {captured.length}-token prompt; "
            f"give a stride below {captured.length}"
        )

    result_layers: dict[int, LayerESS] = {}
    with reused_memory():  # one layer's freed arrays serve the next (core/memory.py)
        for index in tqdm(chosen, desc="layers", disable=not progress):
            layer = captured.layers.pop(index) if release else captured.layers[index]
            unit_ids = _select(unit_rows, layer)
            result_layers[index] = LayerESS.from_units(
                layer,
                positions,
                tol=tol,
                relative=relative,
                scope=scope,
                unit_ids=unit_ids,
                top_k=top_k,
                device=captured.device,
                operator_rows=_operator_rows(keep_operators, layer, len(unit_ids)),
                on_chunk=on_chunk,
                causal=causal,
                precision=precision,
            )
    meta = {
        **captured.meta,
        "device": str(captured.device),
        "tol": float(tol),
        "relative": bool(relative),
        "scope": scope,
        "stride": stride,
        "top_k": top_k,
        "units": None
        if unit_rows is None
        else list(unit_rows)
        if not isinstance(unit_rows, int)
        else list(range(unit_rows)),
        "causal": bool(causal),
        "precision": precision,
        "spectra_budget": SPECTRA_BUDGET,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    return ESSResult(tokens=list(captured.tokens), input_ids=list(captured.input_ids), layers=result_layers, meta=meta)


def estimate_seconds(
    captured: CapturedPrompt, stride: int | None = None, precision: str = DEFAULT_PRECISION, causal: bool = True
) -> float:
    """An estimate of the seconds `analyze_captured` takes on ``captured`` at ``stride`` under
    ``precision``, with causal ESS where ``causal``: each layer's route priced by what it was
    measured to cost on a 2-core CPU (core/estimate.py), within about 2x of docs/benchmarks.md."""
    check_precision(precision)
    accuracy = Accuracy(precision)
    total = 0.0
    for layer in captured.layers.values():
        positions = np.arange(0, layer.length, stride or 1)
        total += layer_seconds(layer, positions, accuracy, causal, captured.device)
    return total


def _check_estimate(captured: CapturedPrompt, stride, max_seconds: float, precision: str, causal: bool) -> None:
    seconds = estimate_seconds(captured, stride, precision, causal)
    if seconds <= max_seconds:
        return
    what = f"{captured.length} tokens x {len(captured.layers)} layer(s)"
    limit = f"limit {_duration(max_seconds)}"
    if accelerator_routes(captured.device):
        # The estimate's figures are a 2-core CPU's (core/estimate.py): no GPU has been
        # measured for them, so they cannot tell a GPU run that it would take too long.
        warnings.warn(
            f"this analysis of {what} would take about {_duration(seconds)} on 2 CPU cores ({limit}); "
            f"no time estimate exists for {captured.device}, so the limit is not applied there",
            UserWarning,
            stacklevel=3,
        )
        return
    raise ValueError(
        f"this analysis of {what} would take about {_duration(seconds)} ({limit}); analyse fewer tokens or "
        "layers, a preview at a stride, or raise the limit (max_seconds=, --max-seconds; 0 for none)"
    )


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


# ---- validation ---------------------------------------------------------------------------


def _check_options(
    tol,
    stride,
    top_k,
    keep_operators,
    *,
    scope=DEFAULT_SCOPE,
    relative=DEFAULT_RELATIVE,
    causal=True,
    precision=DEFAULT_PRECISION,
) -> None:
    check_tolerance(tol, relative)
    check_precision(precision)
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    check_scope(scope, relative)
    if stride is not None and (not isinstance(stride, int) or isinstance(stride, bool) or stride < 1):
        raise ValueError(f"stride must be a positive integer or None, got {stride!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    if isinstance(keep_operators, str) and keep_operators != "auto":
        raise ValueError(
            f"keep_operators must be 'auto', an int, a sequence of unit rows or None; got {keep_operators!r}"
        )


def _check_number(name, value, minimum):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name} must be a finite number >= {minimum}, got {value!r}")


def _model_device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def _slot_meta(slots: dict, model) -> dict:
    """meta entries for models whose analysed slots are not one per layer: "slots" (key ->
    label, e.g. Falcon-H1's two mixers per layer) and "skipped_layers" (index -> reason)."""
    meta = {}
    labels = {str(key): slot.label for key, slot in slots.items() if slot.label}
    if labels:
        meta["slots"] = labels
    skipped = skipped_layers(model)
    if skipped:
        meta["skipped_layers"] = {str(key): reason for key, reason in skipped.items()}
    return meta


def _layers(layers, keys: list[int]) -> list[int]:
    """The chosen slot keys (``keys``: every analysable key, sorted; 0..n-1 for most models)."""
    if layers is None:
        return list(keys)
    if isinstance(layers, (str, bytes)):
        raise ValueError(f"layers must be an int or a sequence of ints, got {layers!r}")
    given = [layers] if isinstance(layers, (int, np.integer)) else layers
    try:
        items = iter(given)
    except TypeError:
        raise ValueError(f"layers must be an int or a sequence of ints, got {type(layers).__name__}") from None
    valid = set(keys)
    chosen = []
    # Checked one by one while iterating, so range(10**9) fails at its first bad index
    # instead of being expanded into memory.
    for index in items:
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool) or int(index) not in valid:
            span = f"0..{keys[-1]}" if keys == list(range(len(keys))) else ", ".join(map(str, keys))
            raise ValueError(f"layer index {index!r} is out of range: the model has layers {span}")
        chosen.append(int(index))
        if len(chosen) > 2 * len(keys) and len(set(chosen)) < len(chosen) // 2:
            raise ValueError(f"layers repeats indices without end; give each of {sorted(valid)} at most once")
    if not chosen:
        raise ValueError("layers is empty; pass None for all layers")
    return sorted(set(chosen))


def _units(units):
    if units is None:
        return None
    if isinstance(units, (int, np.integer)) and not isinstance(units, bool):
        if units < 1:
            raise ValueError(f"units must be a positive count or a sequence of unit indices, got {units}")
        return int(units)
    rows = list(units)
    if not rows or not all(isinstance(u, (int, np.integer)) and not isinstance(u, bool) for u in rows):
        raise ValueError(f"units must be a positive count or a non-empty sequence of ints, got {units!r}")
    if len(set(rows)) != len(rows):
        raise ValueError("units contains duplicates")
    return [int(u) for u in rows]


def _select(unit_rows, layer: CapturedLayer) -> list[int]:
    n = layer.n_units
    if unit_rows is None:
        return list(range(n))
    if isinstance(unit_rows, int):
        return list(range(min(unit_rows, n)))
    bad = [u for u in unit_rows if not 0 <= u < n]
    if bad:
        raise ValueError(f"unit indices {bad} are out of range for layer {layer.layer} ({n} units, 0..{n - 1})")
    return list(unit_rows)


def _operator_rows(keep, layer: CapturedLayer, n_units: int) -> list[int]:
    """Rows (into the analysed units) whose dense T is kept."""
    if keep is None or keep is False or (isinstance(keep, int) and not isinstance(keep, bool) and keep == 0):
        return []
    cells = layer.length**2
    if isinstance(keep, str):
        if keep != "auto":
            raise ValueError(f"keep_operators must be 'auto', an int, a sequence of unit rows or None; got {keep!r}")
        fit = OPERATOR_BUDGET // max(1, cells)
        wanted = n_units if layer.unit_kind == "head" else OPERATOR_CHANNELS
        return list(range(min(n_units, wanted, fit)))
    if isinstance(keep, (int, np.integer)) and not isinstance(keep, bool):
        if keep < 0:
            raise ValueError(f"keep_operators must be >= 0, got {keep}")
        return list(range(min(int(keep), n_units)))
    rows = list(keep)
    bad = [r for r in rows if not isinstance(r, (int, np.integer)) or not 0 <= r < n_units]
    if bad:
        raise ValueError(f"keep_operators rows {bad} are out of range (0..{n_units - 1})")
    return [int(r) for r in rows]
