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

from typing import Callable

import ipywidgets as W
import traitlets as T

from ..options import DEFAULT_GATES, DEFAULT_SCOPE, GATES, METRICS, SCOPES, VARIANTS
from ..result import ESSResult
from .controls import (
    CUSTOM,
    StatusBar,
    Tolerance,
    check_view,
    explorer_arguments,
    initial_tolerance,
    layout_rows,
    link_controls,
    make_controls,
    model_choices,
)
from .live_chart import LiveChart
from .save_control import SaveControl
from .session import ExplorerSession, opening_layer
from .shown_once import ShownOnce, show_in_cell
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


class ESSExplorer(ShownOnce, StaticCopy, W.VBox):
    """The explorer widget (module docstring). Construct it with `explore`.

    Traitlets (set them, observe them): model ("zoo:NAME", hub id or folder), prompt,
    layer, unit (an aggregate of options.AGGREGATES or an int), variant (options.VARIANTS),
    tol, relative, scope (options.SCOPES: the σ₁ a relative tolerance refers to; a recount,
    no model run), gates (options.GATES: the gate policy; a change re-runs the analysis),
    overview_metric (options.METRICS), selected_t (the t clicked in the browser; None
    before); busy and last_error are read-only reports.

    ``options``: controls.ExplorerOptions (result, layer, unit, variant, tol, relative,
    saturated, collapsed, overview_metric, stride, load_fn, capture_fn, layer_fn, cache,
    static, background, auto_analyze), checked before anything changes.
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

    def __init__(self, model: str | None = None, prompt: str | None = None, **options):
        model, o = explorer_arguments(model, options)  # every option checked before anything changes
        enable_offline()  # the widget's JS from vl-convert, never a CDN (kept on disk: app/static.py)
        choices, default = model_choices()
        for name, control in make_controls(choices).items():
            setattr(self, name, control)
        self.status = StatusBar(self.analyze_w, self.refine_w, self.progress_w, self.status_w)
        self.session = ExplorerSession(**o.session_options(), progress=self.status.progress)
        self.worker = Worker(self.session, self.status, background=o.background, on_state=self._on_state)
        self.saturated, self.collapsed = float(o.saturated), float(o.collapsed)
        self.result: ESSResult | None = None
        self._static, self._static_handle = o.static, None
        box = W.Box(layout=W.Layout(width="100%", overflow="auto"))  # a scroll bar while the chart narrows (fit.py)
        self.views = LiveChart(
            box, on_t=self._on_browser_t, on_layer=self._on_browser_layer, on_resize=lambda: self._guarded(self.refresh)
        )
        hide_static = W.HTML(HIDE_STATIC_CSS, layout=W.Layout(display="none"))  # live: hide the static copy
        self.saver = SaveControl(self)  # "save figure": the view on screen as a paper figure
        super().__init__(layout_rows(self) + [box, self.saver.box, hide_static], layout=W.Layout(width="100%"))
        self.add_class("ess-explorer")
        link_controls(self, self.worker)
        source = model if model is not None else default
        self.model, self.variant, self.overview_metric = source, o.variant, o.overview_metric
        self.prompt = prompt if prompt is not None else example_prompt(source)
        self.tol, self.relative = initial_tolerance(o.result, o.tol, o.relative)
        self._initial = {"layer": o.layer, "unit": o.unit}
        if o.result is not None:
            self.show_result(o.result, layer=o.layer, unit=o.unit)
        elif o.auto_analyze:
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

    @T.observe("layer")
    def _on_layer(self, change):
        if self.worker.is_quiet or self.result is None or change["new"] is None:
            return
        with self.worker.quiet():
            self.layer_w.value = change["new"]
            self.unit = self.lists.units(self.result.layer(change["new"]), self.unit)
        if change["new"] not in self.result.meta.get("exact_layers", sorted(self.result.layers)):
            self.session.prioritise(change["new"])  # computed next by the running (or resumed) analysis
            if not self.busy:
                self.refine()
        self._guarded(self.refresh)

    @T.observe("unit", "variant", "tol", "relative", "scope", "overview_metric", "selected_t")
    def _on_view(self, change):
        if change["name"] == "unit" and change["new"] in [v for _, v in self.unit_w.options]:
            with self.worker.quiet():  # a unit set in Python: the list follows
                self.unit_w.value = change["new"]
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

    def _fallback(self, reason: str) -> None:
        """No model result: open on the synthetic reference so the tool is never blank."""
        from ..synthetic import reference_result

        self.show_result(reference_result(), layer=self._initial["layer"], unit=self._initial["unit"])
        kind = "error" if self.last_error else "info"
        self.status.say(f"{self.last_error or reason} — showing the synthetic reference result instead", kind)

    def _guarded(self, fn) -> None:
        """Run a view update under the worker's lock; an error goes to the status line."""
        if not self.worker.is_quiet and self.result is not None:
            with self.worker.lock:
                self.status.attempt(fn)

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
        return self.worker.start(job, label=str(self.model), after=self._after, wait=wait)

    def _on_state(self, busy: bool, *error) -> None:
        """The worker's report: busy, and at the end the failure in words (None: none)."""
        self.set_trait("busy", busy)
        if error:
            self.set_trait("last_error", error[0])

    def _after(self, result: ESSResult | None) -> None:
        """A run ended (None: it failed; the previous result stays, or the fallback shows)."""
        if result is None:
            if self.result is None:
                self._fallback("the model could not be analysed")
            return
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
            same = old is not None and old.input_ids == result.input_ids
            new_prompt = not same or old.meta.get("source") != result.meta.get("source")
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
            self.layer = layer
            self.unit = self.lists.fill(result, layer, unit)
        with self.worker.lock:
            self.refresh()

    def refresh(self) -> None:
        """Redraw for the current state (the spec's structure from the cache when possible)."""
        if self.result is not None:
            self.views.draw(self)


def explore(model: str | None = None, prompt: str | None = None, **options) -> ESSExplorer:
    """Open the ESS explorer (a Jupyter widget); returns at once, the analysis runs in the
    background (``ex.wait()`` blocks until it ends). In a notebook it shows itself where it
    is called, once, assigned or not (app/shown_once.py).

    With no arguments it opens on the built-in default model (zoo.DEFAULT_MODEL) and its
    example prompt. ``model``: "zoo:NAME", a hub id or a local folder, or an ESSResult to open
    on (as ``result=``); ``prompt``: text.
    ``options`` are controls.ExplorerOptions: result, layer, unit, variant, tol, relative,
    saturated, collapsed, overview_metric, stride, load_fn, capture_fn, layer_fn, cache,
    static, background, auto_analyze.
    """
    explorer = ESSExplorer(model, prompt, **options)
    show_in_cell(explorer)
    return explorer
