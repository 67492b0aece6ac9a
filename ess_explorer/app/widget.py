"""The explorer: ipywidgets controls around one alt.JupyterChart of the linked views.

    import ess_explorer
    ex = ess_explorer.explore()                              # default zoo model, example prompt
    ex = ess_explorer.explore("zoo:mamba2_n16", "ba 07 ko 31 | ...", layer=1)
    ex = ess_explorer.explore(result=ess_explorer.ESSResult.load("run.npz"))
    ex.layer = 1; ex.tol = 1e-2                               # traitlets: set and observe them

The widget is a thin view: traitlets in, a chart out. The analysis policy (one forward pass,
the selected layer exactly first, a strided overview, refinement, the cache) is
app/session.py's; app/worker.py runs it in a background thread, so `explore()` returns at
once with its progress bar (and ETA) visible, and the layer, tolerance or unit can change
while the rest is computed; every view update happens under the worker's lock;
app/live_chart.py draws.

What calls what
- Browser only: selecting t on ESS over time (the spectrum and H_t follow), hovering.
  The selected t is read through ``JupyterChart.selections`` into ``selected_t``.
- Python, from the kept singular values (no model): tol, relative, variant.
- Python, a rebuild of the spec: layer, unit, overview metric (cached per layer and unit).
- The session (background): a new model or prompt; a layer still strided is computed next.
A failure is said in the status line (``last_error``); the previous result stays on screen.
"""

from __future__ import annotations

import time
from typing import Callable

import ipywidgets as W
import traitlets as T

from ..core.diagnostics import COLLAPSED_AT, SATURATED_AT
from ..io import ResultCache
from ..options import DEFAULT_GATES, DEFAULT_SCOPE, GATES, METRICS, SCOPES, VARIANTS
from ..result import ESSResult
from .controls import (
    CUSTOM,
    ModelPicker,
    StatusBar,
    Tolerance,
    check_options,
    check_view,
    initial_tolerance,
    layout_rows,
    make_controls,
    unit_options,
    zoo_models,
)
from .live_chart import LiveChart
from .session import ExplorerSession, opening_layer
from .static import (
    EXAMPLE_PROMPT,  # noqa: F401  (public name of this module since the first release)
    HIDE_STATIC_CSS,
    StaticCopy,
    enable_offline,
    example_prompt,
    random_mqar_prompt,
)
from .worker import Worker

__all__ = ["explore", "ESSExplorer", "EXAMPLE_PROMPT", "CUSTOM", "example_prompt", "random_mqar_prompt"]


class ESSExplorer(StaticCopy, W.VBox):
    """The explorer widget (module docstring). Construct it with `explore`.

    Traitlets (set them, observe them): model ("zoo:NAME", hub id or folder), prompt,
    layer, unit (an aggregate of options.AGGREGATES or an int), variant (options.VARIANTS),
    tol, relative, scope (options.SCOPES: the σ₁ a relative tolerance refers to; a recount,
    no model run), gates (options.GATES: the gate policy; a change re-runs the analysis),
    overview_metric (options.METRICS), selected_t (the t clicked in the browser; None
    before); busy and last_error are read-only reports.

    Other parameters: result (an ESSResult to open on instead of running a model);
    saturated, collapsed (thresholds); stride ("auto" | None | int, app/session.py);
    load_fn / capture_fn / layer_fn (the session's injection points); cache (True: the
    default on-disk ResultCache, False, or a ResultCache); static (display the static
    copy, app/static.py); background (False: analyse in the calling thread).
    """

    model = T.Unicode(None, allow_none=True)
    prompt = T.Unicode("")
    layer = T.Int(None, allow_none=True)
    unit = T.Union([T.Int(), T.Unicode()], default_value="mean")
    variant = T.Enum(VARIANTS, default_value="tolerance")
    tol = Tolerance(1e-3)
    relative = T.Bool(True)
    scope = T.Enum(SCOPES, default_value=DEFAULT_SCOPE)
    gates = T.Enum(GATES, default_value=DEFAULT_GATES)
    overview_metric = T.Enum(METRICS, default_value="utilisation")
    selected_t = T.Int(None, allow_none=True)
    busy = T.Bool(False, read_only=True)
    last_error = T.Unicode(None, allow_none=True, read_only=True)

    def __init__(
        self,
        model=None,
        prompt=None,
        *,
        result=None,
        layer=None,
        unit="mean",
        variant="tolerance",
        tol=None,
        relative=None,
        saturated=SATURATED_AT,
        collapsed=COLLAPSED_AT,
        overview_metric="utilisation",
        stride="auto",
        load_fn=None,
        capture_fn=None,
        layer_fn=None,
        cache=True,
        static=True,
        background=True,
        auto_analyze=True,
    ):
        check_options(
            variant=variant,
            overview_metric=overview_metric,
            saturated=saturated,
            collapsed=collapsed,
            result=result,
            tol=tol,
            relative=relative,
            layer=layer,
            unit=unit,
            cache=cache,
        )
        enable_offline()  # the widget's JS from vl-convert, never a CDN (kept on disk: app/static.py)
        names, default = zoo_models()
        options = [(f"{name} (built-in)", f"zoo:{name}") for name in names] + [("hub id or folder →", CUSTOM)]
        for name, control in make_controls(options).items():
            setattr(self, name, control)
        self.status = StatusBar(self.analyze_w, self.refine_w, self.progress_w, self.status_w)
        cache = ResultCache() if cache is True else (cache or None)
        steps = dict(load_fn=load_fn, capture_fn=capture_fn, layer_fn=layer_fn)
        self.session = ExplorerSession(**steps, cache=cache, stride=stride, progress=self.status.progress)
        self.worker = Worker(self.session, background=background)
        self.saturated, self.collapsed = float(saturated), float(collapsed)
        self.result: ESSResult | None = None
        self._static, self._static_handle = static, None
        box = W.Box(layout=W.Layout(width="100%"))
        self.views = LiveChart(box, on_t=self._on_browser_t, on_layer=self._on_browser_layer)
        hide_static = W.HTML(HIDE_STATIC_CSS, layout=W.Layout(display="none"))  # live: hide the static copy
        super().__init__(layout_rows(self) + [box, hide_static], layout=W.Layout(width="100%"))
        self.add_class("ess-explorer")
        for name in ("prompt", "variant", "tol", "relative", "scope", "gates"):
            W.link((self, name), (getattr(self, f"{name}_w"), "value"))
        W.link((self, "overview_metric"), (self.metric_w, "value"))
        ModelPicker(self, self.model_w, self.source_w, self.mqar_w, self.worker.quiet, lambda: self.worker.is_quiet)
        for name in ("layer", "unit"):
            getattr(self, f"{name}_w").observe(lambda c, n=name: self._from_control(n, c["new"]), "value")
        self.analyze_w.on_click(lambda _: self.run())
        self.refine_w.on_click(lambda _: self.refine())
        self.example_w.on_click(lambda _: setattr(self, "prompt", example_prompt(self.model)))
        self.mqar_w.on_click(lambda _: self._random_mqar())
        source = model if model is not None else (f"zoo:{default}" if names else None)
        self.model, self.variant, self.overview_metric = source, variant, overview_metric
        self.prompt = prompt if prompt is not None else example_prompt(source)
        self.tol, self.relative = initial_tolerance(result, tol, relative)
        self._initial = {"layer": layer, "unit": unit}
        if result is not None:
            self.show_result(result, layer=layer, unit=unit)
        elif auto_analyze:
            self.run() if source is not None else self._fallback("no built-in models are installed")

    chart = property(lambda self: self.views.chart, doc="The alt.JupyterChart of the views (None before the first).")
    names = property(lambda self: self.views.names, doc="The chart's param names (charts.ViewNames).")

    # ------------------------------------------------------------------ traits and controls
    @T.validate("layer")
    def _check_layer(self, proposal):
        value = proposal["value"]
        if value is not None and self.result is not None and value not in self.result.layers:
            raise T.TraitError(f"layer must be one of {sorted(self.result.layers)}, got {value}")
        return value

    def _from_control(self, name: str, value) -> None:
        if not self.worker.is_quiet and value is not None:
            setattr(self, name, value)

    @T.observe("layer")
    def _on_layer(self, change):
        if self.worker.is_quiet or self.result is None or change["new"] is None:
            return
        with self.worker.quiet():
            self.layer_w.value = change["new"]
            self._fill_units(self.unit)
        if change["new"] not in self.result.meta.get("exact_layers", sorted(self.result.layers)):
            self.session.prioritise(change["new"])  # computed next by the running (or resumed) analysis
            if not self.busy:
                self.refine()
        self._guarded(self.refresh)

    @T.observe("unit")
    def _on_unit(self, change):
        if self.result is not None and change["new"] in [v for _, v in self.unit_w.options]:
            with self.worker.quiet():
                self.unit_w.value = change["new"]
        self._guarded(self.refresh)

    @T.observe("variant", "tol", "relative", "scope", "overview_metric", "selected_t")
    def _on_view(self, _change):
        self._guarded(self.refresh)

    @T.observe("gates")
    def _on_gates(self, _change):
        """The gate policy changes T itself: analyse again (the view settings stay)."""
        if self.result is not None and not self.worker.is_quiet:
            self.run()

    def _on_browser_t(self, t: int) -> None:
        with self.worker.quiet():  # the browser already shows it: no redraw
            self.selected_t = t

    def _on_browser_layer(self, layer: int) -> None:
        if self.result is not None and layer != self.layer and layer in self.result.layers:
            self.layer = layer  # the exact layer (session) and a redraw

    # ------------------------------------------------------------------ status
    def _fallback(self, reason: str) -> None:
        """No model result: open on the synthetic reference so the tool is never blank."""
        from ..synthetic import reference_result

        self.show_result(reference_result(), layer=self._initial["layer"], unit=self._initial["unit"])
        kind = "error" if self.last_error else "info"
        self.status.say(f"{self.last_error or reason} — showing the synthetic reference result instead", kind)

    def _guarded(self, fn) -> None:
        """Run a view update under the worker's lock; an error goes to the status line."""
        if self.worker.is_quiet or self.result is None:
            return
        try:
            with self.worker.lock:
                fn()
        except Exception as error:  # noqa: BLE001  (any failure must leave the widget usable)
            self.status.say(f"{type(error).__name__}: {error}", "error")

    def _random_mqar(self) -> None:
        try:
            self.prompt = random_mqar_prompt(self.model)
        except Exception as error:  # noqa: BLE001
            self.status.say(str(error), "error")

    # ------------------------------------------------------------------ analysis (the session's)
    def run(self, wait: bool = False) -> bool:
        """Analyse ``prompt`` on ``model`` (in the background unless background=False).
        False at once (status line says why) for an empty model or prompt; else True, or
        with ``wait`` (or background=False) whether the analysis succeeded."""
        source, prompt = self.model, self.prompt
        problem = "choose a built-in model or type a hub id / folder" if not source else None
        problem = problem or (None if prompt.strip() else "the prompt is empty: type one or press “example”")
        if problem:
            self.status.say(problem, "error")
            return False
        layer = self.layer if self.result is not None else self._initial["layer"]
        options = dict(layer=layer, tol=self.tol, relative=self.relative, gates=self.gates, on_result=self._on_result)
        return self._start(lambda: self.session.run(source, prompt, **options), wait)

    def refine(self, wait: bool = False) -> bool:
        """Continue a run that stopped (failed or cancelled) with layers still strided."""
        if not self.session.pending:
            return True
        return self._start(lambda: self.session.resume(on_result=self._on_result), wait)

    def wait(self, timeout: float | None = None) -> bool | None:
        """Block until the background analysis ends; whether it succeeded (None: still running)."""
        return self.worker.wait(timeout)

    def _start(self, job: Callable, wait: bool) -> bool:
        self.set_trait("busy", True)
        self.status.starting()
        started = time.perf_counter()
        return self.worker.start(job, done=lambda r: self._done(r, started), failed=self._failed, wait=wait)

    def _failed(self, error: Exception) -> None:
        """A failed load or analysis: said on the status line; the previous result stays."""
        self.set_trait("busy", False)
        self.set_trait("last_error", f"{self.model}: {type(error).__name__}: {error}")
        self.status.ended(self.last_error, ok=False, resumable=bool(self.session.pending))
        if self.result is None:
            self._fallback("the model could not be analysed")

    def _done(self, result: ESSResult, started: float) -> None:
        self.set_trait("busy", False)
        self.set_trait("last_error", None)
        how = "from the cache" if self.session.cache_hit else f"in {time.perf_counter() - started:.1f} s"
        opened = self.session.opened
        why = f" · opened on layer {opened[0]}: {opened[1]}" if opened is not None else ""
        self.status.ended(
            f"analysed {len(result.layers)} layers of {self.model} on {result.length} tokens {how}{why}", ok=True
        )
        asked, self._initial = self._initial, {"layer": None, "unit": "mean"}
        try:  # the layer or unit asked for at the start, when the model has no such one
            check_view(asked["layer"], asked["unit"], result)
        except ValueError as error:
            self.status.say(f"{error}; showing layer {self.layer}, {self.unit}", "error")
        self._update_static()

    def _on_result(self, result: ESSResult, info: dict) -> None:
        """The session's progress: show the first result, then update the views."""
        with self.worker.lock:
            old = self.result
            new_prompt = old is None or (old.input_ids, old.meta.get("source")) != (
                result.input_ids,
                result.meta.get("source"),
            )
            if new_prompt or sorted(result.layers) != [v for _, v in self.layer_w.options]:
                wanted = self.layer if self.layer in result.layers else info.get("layer")
                self.show_result(result, layer=wanted, unit=self.unit, keep_t=not new_prompt)
            else:
                self.result = result  # same prompt: the cached structures stay valid (live_chart.py)
                self._guarded(self.refresh)

    # ------------------------------------------------------------------ views
    def show_result(self, result: ESSResult, *, layer=None, unit="mean", keep_t: bool = False) -> None:
        """Show ``result`` (no model run): fills the layer and unit lists and draws."""
        if not isinstance(result, ESSResult) or not result.layers:
            raise ValueError("show_result needs an ESSResult with at least one layer")
        with self.worker.quiet():  # filling the lists must not trigger one redraw per change
            self.result = result
            self.views.forget()
            layer = layer if layer in result.layers else opening_layer(result.layers, result)[0]
            if not keep_t:
                self.selected_t = None
            self.layer_w.options = [(f"{i} · {lay.family}", i) for i, lay in sorted(result.layers.items())]
            self.layer = self.layer_w.value = layer
            self._fill_units(unit)
        with self.worker.lock:
            self.refresh()

    def _fill_units(self, unit) -> None:
        self.unit_w.options = unit_options(self.result.layer(self.layer))
        self.unit = unit if unit in [v for _, v in self.unit_w.options] else "mean"
        self.unit_w.value = self.unit

    def refresh(self) -> None:
        """Redraw for the current state (the spec's structure from the cache when possible)."""
        if self.result is None:
            return
        scope = self.scope if self.relative else "cut"
        view = dict(
            layer=self.layer, unit=self.unit, variant=self.variant, tol=self.tol, relative=self.relative, scope=scope
        )
        self.views.draw(
            self.result,
            view,
            metric=self.overview_metric,
            selected_t=self.selected_t,
            saturated=self.saturated,
            collapsed=self.collapsed,
        )


def explore(model: str | None = None, prompt: str | None = None, **options) -> ESSExplorer:
    """Open the ESS explorer (a Jupyter widget); returns at once, the analysis runs in the
    background (``ex.wait()`` blocks until it ends).

    With no arguments it opens on the built-in default model (zoo.DEFAULT_MODEL) and its
    example prompt. ``model``: "zoo:NAME", a hub id or a local folder; ``prompt``: text.
    ``options`` are those of ESSExplorer: result, layer, unit, variant, tol, relative,
    saturated, collapsed, overview_metric, stride, load_fn, capture_fn, layer_fn, cache,
    static, background.
    """
    return ESSExplorer(model, prompt, **options)
