"""The explorer's analysis policy, with no UI: one prompt, analysed progressively.

    session = ExplorerSession(progress=tqdm.auto.tqdm)
    result = session.run("zoo:mamba2_n16", "ba 07 ko 31 | ...", layer=1,
                         on_result=lambda result, info: print(info["phase"], sorted(result.layers)))

A run, in order (each step moves the progress bar; its ETA is tqdm's):
1. the cache (runs.open_run, the look-up the CLI and the sweep share): a result stored for
   the same run (runs.AnalysisRun: model identity, token ids, settings) answers at once. The
   identity (a zoo model's or folder's file hashes, a hub id's commit) and the token ids
   (its tokenizer) need no weights (sources.identity_without_weights), so a hit never loads
   the model; a hub id whose commit cannot be told is looked up after loading.
2. the model is loaded (and kept while the source stays the same).
3. ONE forward pass captures the unit operators of every layer (analysis.capture_layers),
   in a background thread: the next step starts as soon as the selected layer is captured,
   while the pass goes on through the later layers.
4. the first chart: the selected layer at a stride (`first_chart_stride`) when computing
   it exactly would take long, then (or at once) exactly, every cut t.
5. the other layers for the overview: at a stride (every ceil(L / OVERVIEW_POSITIONS)-th
   cut) when the prompt is longer than OVERVIEW_POSITIONS tokens, else exactly.
6. refinement: each strided layer exactly, one by one; a layer asked for meanwhile
   (`prioritise`) is computed next.
7. the whole exact result goes into the cache and the captured operators are released.
Each (layer, stride) is computed once from the one capture. ``on_result(result, info)`` is
called after each step of 4 and after 5, during refinement for a layer asked for, at the end
and at most every REFRESH_EVERY_S seconds otherwise, with info = {"phase": "selected" |
"overview" | "refined", "layer", "stride", "exact_layers", "final"}; `cancel` stops a run
between steps (or between chunks of a layer's units); `resume` continues a stopped one.

Nothing here imports ipywidgets or the zoo's training code (a local folder is read with
transformers alone).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from typing import Callable

import torch

from ..result import ESSResult, LayerESS
from ..runs import OpenedRun, RunRequest, RunSettings, RunSteps, open_run, quiet_transformers
from .plan import (
    FIRST_CHART_FLOPS,
    OVERVIEW_POSITIONS,
    TaskClock,
    first_chart_stride,
    opening_layer,
    overview_stride,
    plan,
    tell_eta,
)

__all__ = [
    "ExplorerSession",
    "opening_layer",
    "Cancelled",
    "plan",
    "overview_stride",
    "first_chart_stride",
    "OVERVIEW_POSITIONS",
    "FIRST_CHART_FLOPS",
    "torch_thread",
]

# During refinement the views are updated at most this often (each update recomputes the
# overview's data), and at once for a layer asked for and at the end.
REFRESH_EVERY_S = 2.0


def default_load(source: str):
    """(model, tokenizer) through sources.load_model, quietly."""
    from ..sources import load_model

    with quiet_transformers():
        return load_model(source)


def default_capture(model, tokenizer, prompt: str, *, gates: str = "inside", on_layer=None):
    """The one forward pass: analysis.capture_layers over every layer (gates: the gate
    policy, docs/conventions.md; on_layer(captured, index) as each layer arrives)."""
    from ..analysis import capture_layers

    with quiet_transformers():
        return capture_layers(model, prompt=prompt, tokenizer=tokenizer, gates=gates, on_layer=on_layer)


def default_layer(captured, layer: int, *, stride, tol: float, relative: bool, on_chunk=None) -> LayerESS:
    """One layer of a capture at ``stride`` (analysis.analyze_captured; LayerESS.from_units)."""
    from ..analysis import analyze_captured

    return analyze_captured(captured, [layer], stride=stride, tol=tol, relative=relative, on_chunk=on_chunk).layers[
        layer
    ]


class _NoBar:
    """The progress interface the session uses (a subset of tqdm's), doing nothing."""

    def __init__(self, *args, **kwargs):
        self.n = 0

    def update(self, n=1):
        self.n += n

    def set_description(self, desc=None, refresh=True):
        pass

    def close(self):
        pass


class ExplorerSession:
    """The progressive-analysis policy of the explorer (module docstring), without UI.

    Parameters
    load_fn(source) -> (model, tokenizer); capture_fn(model, tokenizer, prompt, *, gates,
        on_layer) -> analysis.CapturedPrompt (one forward pass; it may call
        on_layer(captured, index) as layers arrive, or not); layer_fn(captured, layer, *, stride,
        tol, relative, on_chunk) -> LayerESS, calling on_chunk(done, units) as it goes through
        the layer's units, or not: the pipeline (defaults: sources.load_model,
        analysis.capture_layers, analysis.analyze_captured); injection points for tests.
    cache : an io.ResultCache, or None (no cache).
    stride : "auto" (see overview_stride), None (everything exact at once) or an int.
    progress : a tqdm-compatible class (called as progress(total=, desc=, unit=), then
        .update(n), .set_description(text), .close()), e.g. tqdm.auto.tqdm; default none.

    Thread use: `run` and `resume` run in one thread at a time (the widget's worker);
    `prioritise` and `cancel` may be called from any thread.
    """

    def __init__(
        self,
        *,
        load_fn: Callable | None = None,
        capture_fn: Callable | None = None,
        layer_fn: Callable | None = None,
        cache=None,
        stride="auto",
        progress: Callable | None = None,
    ):
        overview_stride(OVERVIEW_POSITIONS + 1, stride)  # validates stride
        self.load_fn = load_fn or default_load
        self.capture_fn = capture_fn or default_capture
        self.layer_fn = layer_fn or default_layer
        self.cache = cache
        self.stride = stride
        self.progress = progress or _NoBar
        self.result: ESSResult | None = None  # the latest (possibly partial) result
        self.source: str | None = None
        self.prompt: str | None = None
        self.cache_hit: bool | None = None  # whether the last run was answered by the cache
        self.opened: tuple | None = None  # (layer, why) when the last run chose the layer it opens on
        self.forward_passes = 0  # forward passes made by this session (one per run that misses)
        self._loaded: tuple | None = None  # (source, model, tokenizer): one model in memory
        self._captured = None
        self._tasks: deque = deque()
        self._opened: OpenedRun | None = None  # the run being computed (its cache entry is written at the end)
        self._settings: dict = {}
        self._lock = threading.Lock()
        self._wanted: int | None = None
        self._cancel = threading.Event()
        self._overview_stride: int | None = None
        self._selected: int | None = None
        self._forward: tuple[threading.Thread, dict] | None = None  # the pass in progress and its outcome

    # ---------------------------------------------------------------- control
    def prioritise(self, layer: int) -> None:
        """Compute ``layer`` exactly next (when it is still pending)."""
        with self._lock:
            self._wanted = int(layer)

    def cancel(self) -> None:
        """Stop the current run after the step in progress (its partial result stays)."""
        self._cancel.set()

    @property
    def pending(self) -> list[tuple[int, int | None]]:
        """The (layer, stride) tasks not yet computed."""
        with self._lock:
            return list(self._tasks)

    def exact_layers(self) -> list[int]:
        return sorted(self.result.meta.get("exact_layers", [])) if self.result is not None else []

    # ---------------------------------------------------------------- run
    def run(
        self,
        source: str,
        prompt: str,
        *,
        layer: int | None = None,
        tol: float = 1e-3,
        relative: bool = True,
        gates: str = "inside",
        on_result: Callable | None = None,
    ) -> ESSResult:
        """Analyse ``prompt`` on ``source`` progressively (module docstring); returns the
        whole exact result. Raises what the pipeline raises (ValueError in words for bad
        input); ``self.result`` then holds the last partial result."""
        if not isinstance(source, str) or not source.strip():
            raise ValueError("choose a built-in model or type a hub id / folder")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("the prompt is empty: type one or press “example”")
        settings = RunSettings(tol=tol, relative=relative, gates=gates)  # checked before anything changes
        self._cancel.clear()
        with self._lock:
            self._tasks.clear()
            self._wanted = None
        self._captured, self._opened, self.cache_hit, self.opened = None, None, None, None
        self._settings = {
            "tol": settings.tol,
            "relative": settings.relative,
            "gates": settings.gates,
            "source": source,
            "prompt": prompt,
        }
        bar = self.progress(total=2, desc=f"looking up {source}", unit="step")  # load, forward pass

        def load(source: str, _revision):
            bar.set_description(f"loading {source}")
            loaded = self._model(source)
            bar.update(1)
            return loaded

        try:
            # the cache only for the default pipeline (an injected one computes something else)
            cache = self.cache if self.load_fn is default_load else None
            opened = open_run(RunRequest(source, prompt, settings=settings), cache=cache, steps=RunSteps(load=load))
            hit = opened.hit
            if hit is not None:
                self.cache_hit = True
                self.source, self.prompt = source, prompt
                self.result = self._finish_meta(hit)
                if layer not in hit.layers:
                    self.opened = opening_layer(hit.layers, hit, source=source)
                    layer = self.opened[0]
                bar.update(max(0, (getattr(bar, "total", None) or 1) - bar.n))
                if on_result is not None:
                    on_result(
                        self.result,
                        {"phase": "cached", "layer": layer, "exact_layers": sorted(hit.layers), "final": True},
                    )
                return self.result
            self.cache_hit = False if opened.run is not None else None
            self._opened = opened
            model, tokenizer = opened.model, opened.tokenizer
            self._check_cancel()
            bar.set_description("forward pass")
            captured = self._start_forward(model, tokenizer, prompt, gates, layer, source)
            bar.update(1)
        finally:
            bar.close()
        try:
            self._captured = captured
            layers = list(captured.expected) if captured.expected else sorted(captured.layers)
            selected = layer
            if layer not in layers:
                self.opened = opening_layer(layers, source=source)
                selected = self.opened[0]
            length = len(captured.input_ids)
            stride = overview_stride(length, self.stride)
            first = first_chart_stride(captured.layers[selected], length) if self.stride is not None else None
            self.source, self.prompt = source, prompt
            self.result = None
            with self._lock:
                self._tasks.extend(plan(layers, selected, stride, first))
            self._overview_stride, self._selected = stride, selected
            return self.resume(on_result)
        finally:
            self._finish_forward(raise_error=False)  # never leave a pass (and its hooks) running

    def resume(self, on_result: Callable | None = None) -> ESSResult | None:
        """Compute the pending tasks (after `run` was cancelled or failed); the result."""
        if not self._tasks or self._captured is None:
            return self.result
        self._cancel.clear()
        captured, settings = self._captured, self._settings
        length = len(captured.input_ids)
        with self._lock:
            total = sum(len(range(0, len(captured.input_ids), s or 1)) for _, s in self._tasks)
        bar = self.progress(total=total, desc="analysing", unit="cut")
        last_report = time.perf_counter()
        clock = TaskClock()
        try:
            while True:
                with self._lock:
                    if not self._tasks:
                        break
                    asked = self._wanted is not None and (self._wanted, None) in self._tasks
                    if asked:  # exact next; its strided overview is then not needed
                        self._tasks.remove((self._wanted, None))
                        self._tasks = deque(t for t in self._tasks if t[0] != self._wanted)
                        self._tasks.appendleft((self._wanted, None))
                    self._wanted = None
                    index, stride = self._tasks[0]
                self._check_cancel()
                if index not in captured.layers:  # captured later in the pass: wait for the rest of it
                    bar.set_description("forward pass (the remaining layers)")
                    captured = self._captured = self._finish_forward()
                bar.set_description(f"layer {index} " + ("exactly" if stride is None else f"at stride {stride}"))
                cuts = len(range(0, len(captured.input_ids), stride or 1))
                reported = [0]

                def on_chunk(done: int, units: int) -> None:
                    """Within a long layer: the bar moves and a cancel takes effect."""
                    self._check_cancel()
                    step = cuts * done // max(units, 1) - reported[0]
                    if step > 0:
                        bar.update(step)
                        reported[0] += step

                started = time.perf_counter()
                lay = self.layer_fn(
                    captured,
                    index,
                    stride=stride,
                    tol=settings["tol"],
                    relative=settings["relative"],
                    on_chunk=on_chunk,
                )
                clock.record(getattr(lay, "family", None), stride, cuts, time.perf_counter() - started)
                missing_before = [i for i in captured.layers if self.result is None or i not in self.result.layers]
                first = self.result is None
                self.result = self._merge(captured, index, lay, exact=stride is None)
                with self._lock:
                    self._tasks.popleft()
                    final = not self._tasks
                bar.update(len(lay.positions) - reported[0])
                with self._lock:
                    left = [(self._family(captured, i), s, len(range(0, length, s or 1))) for i, s in self._tasks]
                tell_eta(bar, clock.remaining(left))
                missing = [i for i in captured.layers if i not in self.result.layers]
                if first or (index == self._selected and stride is None and missing):
                    phase = "selected"  # the first chart, and the selected layer made exact
                elif missing_before and not missing:
                    phase = "overview"
                elif asked or (not missing and (final or time.perf_counter() - last_report >= REFRESH_EVERY_S)):
                    phase = "refined"
                else:
                    continue  # the overview is filling (one update when complete) or refining (throttled)
                last_report = time.perf_counter()
                if on_result is not None:
                    on_result(
                        self.result,
                        {
                            "phase": phase,
                            "layer": index,
                            "stride": stride,
                            "exact_layers": self.exact_layers(),
                            "final": final,
                        },
                    )
        finally:
            bar.close()
        self._captured = None  # every layer is exact: free the operators
        if self._opened is not None:
            self._opened.store(self.result)
        return self.result

    # ---------------------------------------------------------------- helpers
    def _family(self, captured, index: int) -> str | None:
        """The family of layer ``index`` for the ETA: from its capture, else (not captured yet)
        from the result's layers, else None (any family's timing is used)."""
        layer = captured.layers.get(index)
        if layer is not None and hasattr(layer, "family"):
            return layer.family
        if self.result is not None and index in self.result.layers:
            return self.result.layers[index].family
        return None

    def _start_forward(self, model, tokenizer, prompt: str, gates: str, layer: int | None, source: str):
        """Start the one forward pass in a thread; return its CapturedPrompt as soon as the
        wanted layer (``layer``, else the one `opening_layer` opens on for ``source``) is in it, or when the
        pass has ended. Raises the pass's error."""
        ready = threading.Event()
        outcome: dict = {}

        def on_layer(captured, index):
            expected = captured.expected or sorted(captured.layers)
            if index == (layer if layer in expected else opening_layer(expected, source=source)[0]):
                outcome["captured"] = captured
                ready.set()

        def forward():
            _yield_cpu_to_the_analysis()
            try:
                outcome["captured"] = self.capture_fn(model, tokenizer, prompt, gates=gates, on_layer=on_layer)
            except BaseException as error:  # noqa: BLE001  (raised in the session's thread)
                outcome["error"] = error
            finally:
                ready.set()

        thread = torch_thread(forward, "ess-explorer forward pass")  # computes as it would in the caller
        self._forward = (thread, outcome)
        self.forward_passes += 1
        thread.start()
        ready.wait()
        if "error" in outcome:
            self._finish_forward()
        return outcome["captured"]

    def _finish_forward(self, raise_error: bool = True):
        """Wait for the forward pass; its whole CapturedPrompt (raises its error)."""
        if self._forward is None:
            return self._captured
        thread, outcome = self._forward
        thread.join()
        if "error" in outcome:
            if raise_error:
                raise outcome["error"]
            return self._captured
        self._forward = None
        return outcome["captured"]

    def _check_cancel(self) -> None:
        if self._cancel.is_set():
            raise Cancelled()

    def _model(self, source: str):
        if self._loaded is None or self._loaded[0] != source:
            self._loaded = None  # free the previous model before loading the next
            model, tokenizer = self.load_fn(source)
            self._loaded = (source, model, tokenizer)
        return self._loaded[1], self._loaded[2]

    def _merge(self, captured, index: int, lay: LayerESS, *, exact: bool) -> ESSResult:
        """The current result with ``lay`` as layer ``index`` (an exact layer replaces its
        strided overview, never the other way round)."""
        base = self.result
        layers = dict(base.layers) if base is not None else {}
        exact_layers = set(base.meta.get("exact_layers", [])) if base is not None else set()
        if index in exact_layers and not exact:
            return base
        layers[index] = lay
        if exact:
            exact_layers.add(index)
        meta = dict(base.meta) if base is not None else {}
        if base is None:
            meta.update(captured.meta)
            meta.update(tol=self._settings["tol"], relative=self._settings["relative"], gates=self._settings["gates"])
        strided = sorted(i for i in layers if i not in exact_layers)
        meta["exact_layers"] = sorted(exact_layers)
        meta["overview_stride"] = self._overview_stride if strided else None
        result = ESSResult(tokens=list(captured.tokens), input_ids=list(captured.input_ids), layers=layers, meta=meta)
        return self._finish_meta(result)

    def _finish_meta(self, result: ESSResult) -> ESSResult:
        result.meta["source"] = self._settings.get("source", result.meta.get("source"))
        result.meta["prompt"] = self._settings.get("prompt", result.meta.get("prompt"))
        result.meta["stride"] = None
        result.meta.setdefault("exact_layers", sorted(result.layers))
        result.meta.setdefault("overview_stride", None)
        return result


def torch_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread (not started) running ``target`` with the calling thread's torch
    thread count: a new thread does not reliably start with it (it can start with 1), and
    the work would then run on one core."""
    threads = torch.get_num_threads()

    def run() -> None:
        torch.set_num_threads(threads)
        target()

    return threading.Thread(target=run, name=name, daemon=True)


def _yield_cpu_to_the_analysis() -> None:
    """Lower the calling thread's scheduling priority (Linux, where a thread's nice value is
    its own and the threads it starts inherit it): the forward pass then runs on the cores
    the first chart leaves idle instead of halving them. It changes when work runs, never
    what it computes."""
    if not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + 10))
    except (AttributeError, OSError):
        pass


class Cancelled(Exception):
    """A run stopped by `ExplorerSession.cancel` (the caller that cancelled catches it)."""
