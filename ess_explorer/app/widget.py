"""The explorer: ipywidgets controls around one alt.JupyterChart of the linked views.

    import ess_explorer
    ex = ess_explorer.explore()                              # default zoo model, example prompt
    ex = ess_explorer.explore("zoo:mamba2_n16", "ba 07 ko 31 | ...", layer=1)
    ex = ess_explorer.explore(result=ess_explorer.ESSResult.load("run.npz"))
    ex.layer = 1; ex.tol = 1e-2                               # traitlets: set and observe them

The widget shows and forwards; the analysis policy (one forward pass, the selected layer
exactly first, a strided overview, refinement, the cache) is app/session.py's. Analyses
run in a background thread, so `explore()` returns at once with its progress bar (and
ETA) visible, and the layer, tolerance or unit can change while the rest is computed.

What calls what
- Browser only: selecting t on ESS over time (the spectrum and H_t follow), hovering.
  The selected t is read through ``JupyterChart.selections`` into ``selected_t``.
- Python, from the kept singular values (no model): tol, relative, variant.
- Python, a rebuild of the spec: layer, unit, overview metric (cached per layer and unit).
- The session (background): a new model or prompt; a layer still strided is computed next.
A failure is said in the status line (``last_error``); the previous result stays on screen.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import altair as alt
import ipywidgets as W
import numpy as np
import traitlets as T

from ..core.diagnostics import COLLAPSED_AT, SATURATED_AT
from ..io import ResultCache
from ..options import AGGREGATES, DEFAULT_GATES, DEFAULT_SCOPE, GATES, METRICS, SCOPES, VARIANTS
from ..result import ESSResult
from ..views import charts
from .controls import (
    CUSTOM,
    ProgressBar,
    Tolerance,
    check_options,
    check_view,
    layout_rows,
    make_controls,
    status_html,
    with_selection,
    zoo_models,
)
from .session import Cancelled, ExplorerSession, opening_layer, torch_thread
from .static import (
    EXAMPLE_PROMPT,  # noqa: F401  (public name of this module since the first release)
    HIDE_STATIC_CSS,
    StaticCopy,
    enable_offline,
    example_prompt,
    random_mqar_prompt,
    sync_only,
)

__all__ = ["explore", "ESSExplorer", "EXAMPLE_PROMPT", "CUSTOM", "example_prompt", "random_mqar_prompt"]


class ESSExplorer(StaticCopy, W.VBox):
    """The explorer widget (module docstring). Construct it with `explore`.

    Traitlets (set them, observe them): model ("zoo:NAME", hub id or folder), prompt,
    layer, unit ("mean" | "max" | "sum" | int), variant ("tolerance" | "entropy" | "causal"),
    tol, relative, scope ("cut" | "unit" | "layer": the σ₁ a relative tolerance refers to;
    a recount, no model run), gates ("inside" | "outside": the gate policy; a change re-runs
    the analysis), overview_metric ("utilisation" | "ess"), selected_t (the t clicked in the
    browser; None before); busy and last_error are read-only reports.

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
        model: str | None = None,
        prompt: str | None = None,
        *,
        result: ESSResult | None = None,
        layer: int | None = None,
        unit="mean",
        variant: str = "tolerance",
        tol: float | None = None,
        relative: bool | None = None,
        saturated: float = SATURATED_AT,
        collapsed: float = COLLAPSED_AT,
        overview_metric: str = "utilisation",
        stride="auto",
        load_fn: Callable | None = None,
        capture_fn: Callable | None = None,
        layer_fn: Callable | None = None,
        cache=True,
        static: bool = True,
        background: bool = True,
        auto_analyze: bool = True,
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
        cache = ResultCache() if cache is True else (cache or None)
        self.session = ExplorerSession(
            load_fn=load_fn,
            capture_fn=capture_fn,
            layer_fn=layer_fn,
            cache=cache,
            stride=stride,
            progress=lambda **kw: ProgressBar(self.progress_w, self._say, **kw),
        )
        self.saturated, self.collapsed = float(saturated), float(collapsed)
        self._static, self._background = static, background
        self.names = charts.ViewNames.fresh()  # unique params: explorers in one notebook never interfere
        self.result: ESSResult | None = None
        self.chart: alt.JupyterChart | None = None
        self.last_update_s: float | None = None  # seconds of the last chart update (for measurement)
        self._spec_cache: dict[tuple, dict] = {}
        self._quiet = False  # True while the code itself fills the lists: no redraw per change
        self._lock = threading.RLock()  # view updates come from the worker and from the user
        self._thread: threading.Thread | None = None
        self._ok: bool | None = None
        self._static_handle = None

        names, default = zoo_models()
        options = [(f"{name} (built-in)", f"zoo:{name}") for name in names] + [("hub id or folder →", CUSTOM)]
        source = model if model is not None else (f"zoo:{default}" if names else None)
        for name, control in make_controls(options).items():
            setattr(self, name, control)
        self._chart_box = W.Box(layout=W.Layout(width="100%"))
        hide_static = W.HTML(HIDE_STATIC_CSS, layout=W.Layout(display="none"))  # live: hide the static copy
        rows = layout_rows(self)
        super().__init__(rows + [self._chart_box, hide_static], layout=W.Layout(width="100%"))
        self.add_class("ess-explorer")

        # ---- state <-> controls
        for name, control in (
            ("prompt", self.prompt_w),
            ("variant", self.variant_w),
            ("tol", self.tol_w),
            ("relative", self.relative_w),
            ("scope", self.scope_w),
            ("gates", self.gates_w),
            ("overview_metric", self.metric_w),
        ):
            W.link((self, name), (control, "value"))
        self.model_w.observe(self._on_model_controls, "value")
        self.source_w.observe(self._on_model_controls, "value")
        self.layer_w.observe(lambda c: self._quiet or c["new"] is None or setattr(self, "layer", c["new"]), "value")
        self.unit_w.observe(lambda c: self._quiet or c["new"] is None or setattr(self, "unit", c["new"]), "value")
        self.analyze_w.on_click(lambda _: self.run())
        self.refine_w.on_click(lambda _: self.refine())
        self.example_w.on_click(lambda _: setattr(self, "prompt", example_prompt(self.model)))
        self.mqar_w.on_click(lambda _: self._random_mqar())

        self.model = source
        self.prompt = prompt if prompt is not None else example_prompt(source)
        self.variant, self.overview_metric = variant, overview_metric
        saved = result.meta.get("tol", 1e-3) if result is not None else 1e-3
        if isinstance(saved, bool) or not isinstance(saved, (int, float)) or not np.isfinite(saved) or saved < 0:
            saved = 1e-3  # a damaged file's tol falls back to the default
        self.tol = float(tol if tol is not None else saved)
        self.relative = bool(
            relative if relative is not None else (result.meta.get("relative", True) if result is not None else True)
        )
        self._initial = {"layer": layer, "unit": unit}
        if result is not None:
            self.show_result(result, layer=layer, unit=unit)
        elif auto_analyze:
            if source is None:
                self._fallback("no built-in models are installed")
            else:
                self.run()

    @property
    def source(self) -> str | None:
        """The model source (the ``model`` traitlet; the name of earlier releases)."""
        return self.model

    # ------------------------------------------------------------------ trait observers
    @T.validate("layer")
    def _check_layer(self, proposal):
        value = proposal["value"]
        if value is not None and self.result is not None and value not in self.result.layers:
            raise T.TraitError(f"layer must be one of {sorted(self.result.layers)}, got {value}")
        return value

    @T.observe("model")
    def _on_model(self, change):
        source = change["new"]
        known = [v for _, v in self.model_w.options]
        self._quiet = True
        try:
            if source in known and source != CUSTOM:
                self.model_w.value = source
            else:
                self.model_w.value, self.source_w.value = CUSTOM, source or ""
        finally:
            self._quiet = False
        self.source_w.layout.display = None if self.model_w.value == CUSTOM else "none"
        self.mqar_w.disabled = not (source or "").startswith("zoo:")

    def _on_model_controls(self, _change):
        if not self._quiet:
            self.model = self.source_w.value.strip() or None if self.model_w.value == CUSTOM else self.model_w.value

    @T.observe("layer")
    def _on_layer(self, change):
        layer = change["new"]
        if self._quiet or self.result is None or layer is None:
            return
        with self._lock:
            self._quiet = True
            try:
                self.layer_w.value = layer
                self._fill_units(self.unit)
            finally:
                self._quiet = False
        if layer not in self.result.meta.get("exact_layers", sorted(self.result.layers)):
            self.session.prioritise(layer)  # computed next by the running (or resumed) analysis
            if not self.busy:
                self.refine()
        self._guarded(self.refresh)

    @T.observe("unit")
    def _on_unit(self, change):
        if self.result is not None and self.unit_w.options and change["new"] in [v for _, v in self.unit_w.options]:
            self._quiet = True
            try:
                self.unit_w.value = change["new"]
            finally:
                self._quiet = False
        self._guarded(self.refresh)

    @T.observe("variant", "tol", "relative", "scope", "overview_metric", "selected_t")
    def _on_view(self, _change):
        self._guarded(self.refresh)

    @T.observe("gates")
    def _on_gates(self, _change):
        """The gate policy changes T itself: analyse again (the view settings stay)."""
        if self.result is not None and not self._quiet:
            self.run()

    # ------------------------------------------------------------------ status
    def _say(self, message: str, kind: str = "info") -> None:
        self.status_w.value = status_html(message, kind)

    def _fallback(self, reason: str) -> None:
        """No model result: open on the synthetic reference so the tool is never blank."""
        from ..synthetic import reference_result

        self.show_result(reference_result(), layer=self._initial["layer"], unit=self._initial["unit"])
        self._say(
            f"{self.last_error or reason} — showing the synthetic reference result instead",
            "error" if self.last_error else "info",
        )

    def _guarded(self, fn) -> None:
        """Run a view update; an error goes to the status line, never to a traceback."""
        if self._quiet or self.result is None:
            return
        try:
            with self._lock:
                fn()
        except Exception as error:  # noqa: BLE001  (any failure must leave the widget usable)
            self._say(f"{type(error).__name__}: {error}", "error")

    def _random_mqar(self) -> None:
        try:
            self.prompt = random_mqar_prompt(self.model)
        except Exception as error:  # noqa: BLE001
            self._say(str(error), "error")

    # ------------------------------------------------------------------ analysis (the session's)
    def run(self, wait: bool = False) -> bool:
        """Analyse ``prompt`` on ``model`` (in the background unless background=False).
        False at once (status line says why) for an empty model or prompt; else True, or
        with ``wait`` (or background=False) whether the analysis succeeded."""
        source, prompt = self.model, self.prompt
        if not source:
            self._say("choose a built-in model or type a hub id / folder", "error")
            return False
        if not prompt.strip():
            self._say("the prompt is empty: type one or press “example”", "error")
            return False
        layer = self.layer if self.result is not None else self._initial["layer"]
        return self._start(
            lambda: self.session.run(
                source,
                prompt,
                layer=layer,
                tol=self.tol,
                relative=self.relative,
                gates=self.gates,
                on_result=self._on_result,
            ),
            wait,
        )

    def refine(self, wait: bool = False) -> bool:
        """Continue a run that stopped (failed or cancelled) with layers still strided."""
        if not self.session.pending:
            return True
        return self._start(lambda: self.session.resume(on_result=self._on_result), wait)

    def wait(self, timeout: float | None = None) -> bool | None:
        """Block until the background analysis ends; whether it succeeded (None: still running)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                return None
        return self._ok

    def _start(self, work: Callable, wait: bool) -> bool:
        previous = self._thread
        if previous is not None and previous.is_alive():
            self.session.cancel()
        self.set_trait("busy", True)
        self.analyze_w.disabled, self.refine_w.layout.display = True, "none"
        self.progress_w.value, self.progress_w.bar_style = 0.0, "info"
        self._say("starting …", "busy")

        def job():
            if previous is not None:
                previous.join()
            self._work(work)

        if not self._background:
            job()
            return bool(self._ok)
        self._thread = torch_thread(job, "ess-explorer")  # with the caller's torch threads, not one core
        self._thread.start()
        return bool(self.wait()) if wait else True

    def _work(self, work: Callable) -> None:
        started = time.perf_counter()
        try:
            result = work()
        except Cancelled:
            return  # a newer run took over; it reports
        except Exception as error:  # noqa: BLE001  (a failed load/analysis keeps the previous result)
            self._ok = False
            self.set_trait("last_error", f"{self.model}: {type(error).__name__}: {error}")
            self.progress_w.value, self.progress_w.bar_style = 1.0, "danger"
            self._say(self.last_error, "error")
            self.refine_w.layout.display = "" if self.session.pending else "none"
            if self.result is None:
                self._fallback("the model could not be analysed")
            return
        finally:
            self.analyze_w.disabled = False
            self.set_trait("busy", False)
        self._ok = True
        self.set_trait("last_error", None)
        self.progress_w.value, self.progress_w.bar_style = 1.0, "success"
        how = "from the cache" if self.session.cache_hit else f"in {time.perf_counter() - started:.1f} s"
        opened = self.session.opened
        why = f" · opened on layer {opened[0]}: {opened[1]}" if opened is not None else ""
        self._say(f"analysed {len(result.layers)} layers of {self.model} on {result.length} tokens {how}{why}", "ok")
        self._say_unmet_request(result)
        self._update_static()

    def _say_unmet_request(self, result: ESSResult) -> None:
        """The layer or unit asked for at the start, when the model has no such one: said on the
        status line (the explorer shows the first layer / the mean instead)."""
        asked, self._initial = self._initial, {"layer": None, "unit": "mean"}
        try:
            check_view(asked["layer"], asked["unit"], result)
        except ValueError as error:
            self._say(f"{error}; showing layer {self.layer}, {self.unit}", "error")

    def _on_result(self, result: ESSResult, info: dict) -> None:
        """The session's progress: show the first result, then update the views."""
        with self._lock:
            new_prompt = (
                self.result is None
                or self.result.input_ids != result.input_ids
                or self.result.meta.get("source") != result.meta.get("source")
            )
            if new_prompt or sorted(result.layers) != [v for _, v in self.layer_w.options]:
                wanted = self.layer if self.layer in result.layers else info.get("layer")
                self.show_result(result, layer=wanted, unit=self.unit, keep_t=not new_prompt)
            else:
                self.result = result  # same prompt: the cached structures stay valid (see _structure)
                self._guarded(self.refresh)

    # ------------------------------------------------------------------ views
    def show_result(self, result: ESSResult, *, layer=None, unit="mean", keep_t: bool = False) -> None:
        """Show ``result`` (no model run): fills the layer and unit lists and draws."""
        if not isinstance(result, ESSResult) or not result.layers:
            raise ValueError("show_result needs an ESSResult with at least one layer")
        with self._lock:
            self.result = result
            self._spec_cache.clear()
            layer = layer if layer in result.layers else opening_layer(result.layers, result)[0]
            self._quiet = True  # filling the lists must not trigger one redraw per change
            try:
                if not keep_t:
                    self.selected_t = None
                self.layer_w.options = [(f"{i} · {lay.family}", i) for i, lay in sorted(result.layers.items())]
                self.layer = layer
                self.layer_w.value = layer
                self._fill_units(unit)
            finally:
                self._quiet = False
            self.refresh()

    def _fill_units(self, unit) -> None:
        lay = self.result.layer(self.layer)
        options = [(f"{a} over {lay.unit_kind}s", a) for a in AGGREGATES]
        options += [(f"{lay.unit_kind} {u}", u) for u in range(lay.n_units)]
        self.unit_w.options = options
        self.unit = unit if unit in [v for _, v in options] else "mean"
        self.unit_w.value = self.unit

    def _options(self) -> dict:
        return dict(
            layer=self.layer,
            unit=self.unit,
            variant=self.variant,
            tol=self.tol,
            relative=self.relative,
            scope=self.scope if self.relative else "cut",
        )

    def _structure(self) -> dict:
        """The spec without data for the current (result, layer, unit, metric): cached. The
        key holds what of a progressing result the structure reads (its overview stride,
        how many layers, whether the shown layer is exact yet); the rest is the prompt's."""
        meta = self.result.meta
        key = (
            self.layer,
            self.unit,
            self.overview_metric,
            meta.get("overview_stride"),
            meta.get("stride"),
            len(self.result.layers),
            len(self.result.layer(self.layer).positions),
        )
        if key not in self._spec_cache:
            t0 = charts.default_position(self.result, **self._options())
            chart = charts.linked_structure(
                self.result,
                layer=self.layer,
                unit=self.unit,
                t=t0,
                names=self.names,
                overview_metric=self.overview_metric,
            )
            if self.chart is None:
                self._make_chart(chart)  # JupyterChart validates the spec once
                self._spec_cache[key] = self.chart.spec
            else:  # same builders, validated by the first spec and the chart tests: skip the schema walk
                self._spec_cache[key] = chart.to_dict(validate=False)
        return self._spec_cache[key]

    def _make_chart(self, chart) -> None:
        self.chart = alt.JupyterChart(
            chart,
            embed_options={
                "renderer": "svg",
                "actions": {"export": True, "source": False, "compiled": False, "editor": False},
            },
        )
        sync_only(self.chart, {self.names.t, self.names.layer})
        self.chart.selections.observe(self._on_selection, names=[self.names.t, self.names.layer])
        self._chart_box.children = [self.chart]

    def _spec(self, data: dict) -> dict:
        t = self.selected_t if self.selected_t is not None else charts.default_position(self.result, **self._options())
        positions = np.asarray(self.result.layer(self.layer).positions)
        t = int(positions[int(np.argmin(np.abs(positions - t)))])  # the nearest computed cut
        return with_selection(self._structure(), data, self.names, t=t, layer=int(self.layer))

    def refresh(self) -> None:
        """Redraw for the current state (spec structure from the cache when possible)."""
        if self.result is None:
            return
        started = time.perf_counter()
        data = charts.linked_data(
            self.result,
            saturated=self.saturated,
            collapsed=self.collapsed,
            overview_metric=self.overview_metric,
            **self._options(),
        )
        self.chart.spec = self._spec(data)
        self.last_update_s = time.perf_counter() - started

    refresh_data = refresh  # tolerance / variant: new data, the same cached structure

    def _on_selection(self, change) -> None:
        """A selection made in the browser (JupyterChart.selections, Altair's public API)."""
        value = change["new"].value if change["new"] is not None else None
        if not value:
            return
        row = value[0] if isinstance(value, list) else value
        if change["name"] == self.names.t and row.get("t") is not None:
            self._quiet = True  # the browser already shows it: no redraw
            try:
                self.selected_t = int(row["t"])
            finally:
                self._quiet = False
        elif change["name"] == self.names.layer and row.get("layer") is not None:
            chosen = int(row["layer"])
            if self.result is not None and chosen != self.layer and chosen in self.result.layers:
                self.layer = chosen  # the exact layer (session) and a redraw


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
