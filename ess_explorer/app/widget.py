"""The explorer: ipywidgets controls around one alt.JupyterChart of the linked views.

    import ess_explorer
    ess_explorer.explore()                                  # default zoo model, example prompt
    ess_explorer.explore("zoo:mamba2_n16", "ba 07 ko 31 | ...", layer=1)
    ess_explorer.explore(result=ess_explorer.ESSResult.load("run.npz"))

What calls what
- Browser only (no Python): selecting t on ESS over time (the spectrum and the H_t
  outline follow), hovering, highlighting. The selected t is *synced* to Python (a
  traitlet, no computation) so that it survives a tolerance change; hover is not synced.
- Python, from the kept singular values (no model): tolerance, absolute/relative, variant,
  thresholds. Only the named datasets of the spec are recomputed (charts.linked_data) and
  the cached spec structure is reused.
- Python, rebuild of the spec: layer, unit, overview metric (cached per layer and unit).
- Python, the model: a new model, prompt or a layer whose overview was strided calls
  ``analyze_fn`` (one call per layer, so the progress bar moves per layer).
A failed load or analysis writes its message into the status line and keeps the
previous result on screen.

Static copy: the widget's mimebundle carries an image/png of the current views next to
the widget view, so GitHub, nbconvert HTML (which drops a widget whose state was not
saved) and untrusted notebooks still show the figure.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import html
import math
import random
import time
from typing import Callable

import altair as alt
import ipywidgets as W
import numpy as np

from ..views import charts
from ..views.render import to_png
from ..core.diagnostics import COLLAPSED_AT, SATURATED_AT
from ..result import ESSResult

__all__ = ["explore", "ESSExplorer", "EXAMPLE_PROMPT", "CUSTOM"]

EXAMPLE_PROMPT = "The key to the red box is 42. The key to the blue box is 17. | What is the key to the red box? 42"
CUSTOM = "__custom__"  # dropdown value: use the text field (hub id or local folder)
# Auto stride for the overview: prompts longer than this get the other layers every
# ceil(L / OVERVIEW_POSITIONS)-th position first; the selected layer is always exact.
OVERVIEW_POSITIONS = 128


def _zoo():
    try:
        from .. import zoo

        return zoo
    except Exception:  # the zoo is optional: a broken install must not break the explorer
        return None


def _zoo_models() -> list[str]:
    zoo = _zoo()
    try:
        return list(zoo.list_models()) if zoo is not None else []
    except Exception:
        return []


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' weight-loading bar and kernel-fallback notices would land in the
    notebook cell above the widget; the status line reports instead."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    level, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


def _default_load(source: str):
    from ..sources import load_model

    with _quiet_transformers():
        return load_model(source)


def _default_analyze(model, **kwargs) -> ESSResult:
    from ..analysis import analyze

    with _quiet_transformers():
        return analyze(model, **kwargs)


def _zoo_name(source: str | None) -> str | None:
    return source[4:] if isinstance(source, str) and source.startswith("zoo:") else None


def example_prompt(source: str | None) -> str:
    """The example prompt of a model: one held-out MQAR sequence for a zoo model (from its
    task), else EXAMPLE_PROMPT."""
    name = _zoo_name(source)
    zoo = _zoo()
    if name and zoo is not None:
        try:
            return zoo.task_of(name).prompt(seed=0)
        except Exception:
            pass
    return EXAMPLE_PROMPT


def random_mqar_prompt(source: str | None, seed: int | None = None) -> str:
    """A fresh MQAR sequence of the zoo model's own task; ValueError for other models."""
    name = _zoo_name(source)
    zoo = _zoo()
    if not name or zoo is None:
        raise ValueError("random MQAR prompts exist for the built-in zoo models only; choose one in the model list")
    return zoo.task_of(name).prompt(seed=random.randrange(1_000_000) if seed is None else seed)


def _merge(base: ESSResult | None, extra: ESSResult) -> ESSResult:
    """``extra``'s layers on top of ``base`` (same prompt): the exact layer replaces its
    strided overview version."""
    if base is None:
        return extra
    layers = {**base.layers, **extra.layers}
    return ESSResult(tokens=base.tokens, input_ids=base.input_ids, layers=layers, meta=dict(base.meta))


class ESSExplorer(W.VBox):
    """The explorer widget (see the module docstring). Construct it with `explore`.

    Parameters (all optional)
    model : "zoo:NAME", a hub id or a local folder (default: the zoo's DEFAULT_MODEL).
    prompt : text to analyse (default: the model's example prompt).
    result : an ESSResult to open on instead of running a model.
    layer, unit ("mean" | "max" | "sum" | int), variant ("tolerance" | "entropy"),
    tol, relative, saturated, collapsed, overview_metric ("utilisation" | "ess"):
        initial view settings.
    stride : positions stride of the overview pass ("auto": exact up to
        OVERVIEW_POSITIONS tokens, else ceil(L / OVERVIEW_POSITIONS); None: always exact).
    load_fn(source) -> (model, tokenizer); analyze_fn(model, *, prompt, tokenizer, layers,
        tol, relative, stride, progress) -> ESSResult: injection points (tests, custom
        pipelines); default ess_explorer.models.load_model and ess_explorer.analysis.analyze.
    static : attach a PNG of the views to the notebook output (default True).
    """

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
        analyze_fn: Callable | None = None,
        static: bool = True,
        auto_analyze: bool = True,
    ):
        if variant not in charts.VARIANTS:
            raise ValueError(f"variant must be one of {charts.VARIANTS}, got {variant!r}")
        if overview_metric not in ("utilisation", "ess"):
            raise ValueError(f"overview_metric must be 'utilisation' or 'ess', got {overview_metric!r}")
        if not 0 <= collapsed < saturated:
            raise ValueError(f"need 0 <= collapsed < saturated, got collapsed={collapsed}, saturated={saturated}")
        if not (stride in ("auto", None) or (isinstance(stride, int) and stride >= 1)):
            raise ValueError(f"stride must be 'auto', None or a positive int, got {stride!r}")
        if result is not None and not isinstance(result, ESSResult):
            raise ValueError(f"result must be an ESSResult, got {type(result).__name__}")
        if tol is not None and (isinstance(tol, bool) or not isinstance(tol, (int, float, np.integer, np.floating))
                                or not np.isfinite(tol) or tol < 0):
            raise ValueError(f"tol must be a finite number >= 0 (e.g. 1e-3), got {tol!r}")
        if relative is not None and not isinstance(relative, (bool, np.bool_)):
            raise ValueError(f"relative must be True or False, got {relative!r}")
        alt.JupyterChart.enable_offline()  # the widget's JS from vl-convert, never a CDN
        self._load_fn = load_fn or _default_load
        self._analyze_fn = analyze_fn or _default_analyze
        self._static = static
        self._stride = stride
        self.saturated, self.collapsed = float(saturated), float(collapsed)
        self.names = charts.ViewNames.fresh()  # unique params: explorers in one notebook never interfere
        self.result: ESSResult | None = None
        self._loaded: dict[str, tuple] = {}  # source -> (model, tokenizer), the last one only
        self._spec_cache: dict[tuple, dict] = {}
        self._t: int | None = None
        self._busy = False
        self.last_error: str | None = None  # the message of the last failed load / analysis
        self.last_update_s: float | None = None  # seconds of the last chart update (for measurement)

        zoo_models = _zoo_models()
        zoo = _zoo()
        default = f"zoo:{getattr(zoo, 'DEFAULT_MODEL', '')}" if zoo is not None and zoo_models else None
        source = model if model is not None else default
        options = [(f"{name} (built-in)", f"zoo:{name}") for name in zoo_models] + [("hub id or folder →", CUSTOM)]
        # ---- controls
        style = {"description_width": "initial"}
        self.model_w = W.Dropdown(options=options, description="model", style=style, layout=W.Layout(width="260px"))
        self.source_w = W.Text(placeholder="hub id (gpt2) or /path/to/folder", layout=W.Layout(width="300px"))
        if source is not None and source in dict((v, k) for k, v in options):
            self.model_w.value = source
        else:
            self.model_w.value = CUSTOM
            self.source_w.value = source or ""
        self.analyze_w = W.Button(description="Analyze", button_style="primary", icon="play", tooltip="run the model on the prompt")
        self.prompt_w = W.Textarea(value=prompt if prompt is not None else example_prompt(source),
                                   placeholder="prompt text", layout=W.Layout(width="100%", height="64px"))
        self.example_w = W.Button(description="example", tooltip="the model's example prompt", layout=W.Layout(width="120px"))
        self.mqar_w = W.Button(description="random MQAR", tooltip="a fresh sequence of the built-in model's task",
                               layout=W.Layout(width="120px"))
        self.layer_w = W.Dropdown(description="layer", options=[], style=style, layout=W.Layout(width="210px"))
        self.unit_w = W.Dropdown(description="unit", options=[], style=style, layout=W.Layout(width="170px"))
        self.variant_w = W.ToggleButtons(options=[("tolerance", "tolerance"), ("entropy", "entropy")], value=variant,
                                         description="ESS", style={"button_width": "86px", "description_width": "initial"})
        self.tol_w = W.FloatLogSlider(value=1e-3 if tol is None else tol, base=10, min=-12, max=0, step=0.1,
                                      description="τ", readout_format=".1e", continuous_update=False, style=style,
                                      layout=W.Layout(width="260px"))
        self.relative_w = W.ToggleButtons(options=[("× σ₁", True), ("absolute", False)],
                                          value=True if relative is None else bool(relative),
                                          style={"button_width": "78px"})
        self.metric_w = W.Dropdown(options=[("ESS/TSS", "utilisation"), ("ESS", "ess")], value=overview_metric,
                                   description="overview", style=style, layout=W.Layout(width="160px"))
        self.progress_w = W.FloatProgress(value=0.0, min=0.0, max=1.0, bar_style="info", layout=W.Layout(width="180px"))
        self.status_w = W.HTML(value="")
        self._initial = {"layer": layer, "unit": unit}
        # ---- the chart: one JupyterChart, created once; later updates replace its spec
        self.chart: alt.JupyterChart | None = None
        self._chart_box = W.Box(layout=W.Layout(width="100%"))

        self.refine_w = W.Button(description="refine overview", icon="th", tooltip="compute every strided layer exactly",
                                 layout=W.Layout(display="none"))  # shown while the overview is strided
        row1 = W.HBox([self.model_w, self.source_w, self.analyze_w, self.refine_w], layout=W.Layout(align_items="center"))
        row2 = W.HBox([self.prompt_w, W.VBox([self.example_w, self.mqar_w])], layout=W.Layout(align_items="flex-start"))
        row3 = W.HBox([self.layer_w, self.unit_w, self.variant_w, self.tol_w, self.relative_w, self.metric_w],
                      layout=W.Layout(align_items="center", flex_flow="row wrap"))
        row4 = W.HBox([self.progress_w, self.status_w], layout=W.Layout(align_items="center"))
        super().__init__([row1, row2, row3, row4, self._chart_box], layout=W.Layout(width="100%"))
        self.add_class("ess-explorer")
        self._sync_source_widgets()

        # ---- events
        self.analyze_w.on_click(lambda _: self.run())
        self.refine_w.on_click(lambda _: self.refine())
        self.example_w.on_click(lambda _: self._set_prompt(example_prompt(self.source)))
        self.mqar_w.on_click(lambda _: self._random_mqar())
        self.model_w.observe(lambda _: self._sync_source_widgets(), "value")
        self.source_w.observe(lambda _: self._sync_source_widgets(), "value")
        self.layer_w.observe(self._on_layer, "value")
        self.unit_w.observe(lambda _: self._guarded(self.refresh), "value")
        self.metric_w.observe(lambda _: self._guarded(self.refresh), "value")
        for w in (self.variant_w, self.tol_w, self.relative_w):
            w.observe(lambda _: self._guarded(self.refresh_data), "value")

        if result is not None:
            self.show_result(result, layer=layer, unit=unit)
            if tol is None:
                saved = result.meta.get("tol", 1e-3)  # a damaged file's tol falls back to the default
                ok = isinstance(saved, (int, float)) and not isinstance(saved, bool) and math.isfinite(saved) and saved >= 0
                self.tol_w.value = float(saved) if ok else 1e-3
            if relative is None:
                self.relative_w.value = bool(result.meta.get("relative", True))
        elif auto_analyze:
            if source is None:
                self._fallback("no built-in models are installed")
            else:
                self.run()
                if self.result is None:
                    self._fallback("the model could not be analysed")

    # ------------------------------------------------------------------ properties
    @property
    def source(self) -> str | None:
        """What the controls point at: "zoo:NAME", a hub id or a folder (None if empty)."""
        if self.model_w.value == CUSTOM:
            return self.source_w.value.strip() or None
        return self.model_w.value

    @property
    def layer(self) -> int | None:
        return self.layer_w.value

    @property
    def unit(self):
        return self.unit_w.value

    @property
    def variant(self) -> str:
        return self.variant_w.value

    @property
    def tol(self) -> float:
        return float(self.tol_w.value)

    @property
    def relative(self) -> bool:
        return bool(self.relative_w.value)

    @property
    def selected_t(self) -> int | None:
        """The t selected in the browser (synced back, never recomputed from)."""
        return self._t

    # ------------------------------------------------------------------ status
    def _say(self, message: str, kind: str = "info") -> None:
        colors = {"info": "#444", "ok": "#2e7d32", "error": "#c62828", "busy": "#1565c0"}
        icon = {"error": "⚠ ", "ok": "✓ ", "busy": "⏳ "}.get(kind, "")
        self.status_w.value = f'<span style="color:{colors[kind]}">{icon}{html.escape(message)}</span>'

    def _fallback(self, reason: str) -> None:
        """No model result: open on the synthetic reference so the tool is never blank;
        the reason (e.g. the load error) stays in the status line."""
        from ..synthetic import reference_result

        self.show_result(reference_result(), layer=self._initial["layer"], unit=self._initial["unit"])
        self._say(f"{self.last_error or reason} — showing the synthetic reference result instead",
                  "error" if self.last_error else "info")

    def _guarded(self, fn) -> None:
        """Run a view update; an error goes to the status line, never to a traceback."""
        if self._busy or self.result is None:
            return
        try:
            fn()
        except Exception as error:  # noqa: BLE001  (any failure must leave the widget usable)
            self._say(f"{type(error).__name__}: {error}", "error")

    # ------------------------------------------------------------------ prompt helpers
    def _set_prompt(self, text: str) -> None:
        self.prompt_w.value = text

    def _random_mqar(self) -> None:
        try:
            self._set_prompt(random_mqar_prompt(self.source))
        except Exception as error:  # noqa: BLE001
            self._say(str(error), "error")

    def _sync_source_widgets(self) -> None:
        custom = self.model_w.value == CUSTOM
        self.source_w.layout.display = None if custom else "none"
        self.mqar_w.disabled = _zoo_name(self.source) is None

    # ------------------------------------------------------------------ analysis
    def _stride_for(self, length: int) -> int | None:
        if self._stride == "auto":
            return None if length <= OVERVIEW_POSITIONS else math.ceil(length / OVERVIEW_POSITIONS)
        return self._stride

    def run(self) -> bool:
        """Load the model (if it changed) and analyse the prompt: every layer (strided
        when long), then the selected layer exactly. True on success; on failure the
        status line says why and the previous result stays."""
        source, prompt = self.source, self.prompt_w.value
        if not source:
            self._say("choose a built-in model or type a hub id / folder", "error")
            return False
        if not prompt.strip():
            self._say("the prompt is empty: type one or press “example”", "error")
            return False
        self._busy = True
        self.analyze_w.disabled = True
        self.progress_w.value, self.progress_w.bar_style = 0.0, "info"
        try:
            started = time.perf_counter()
            if source not in self._loaded:
                self._say(f"loading {source} …", "busy")
                loaded = self._load_fn(source)
                self._loaded = {source: loaded}  # keep one model in memory
            model, tokenizer = self._loaded[source]
            self.progress_w.value = 0.05
            wanted = self.layer_w.value if self.result is not None else self._initial["layer"]
            result = self._analyze_all(model, tokenizer, prompt, wanted)
            self.progress_w.value, self.progress_w.bar_style = 1.0, "success"
        except Exception as error:  # noqa: BLE001  (a failed load/analysis keeps the previous result)
            self.progress_w.value, self.progress_w.bar_style = 1.0, "danger"
            self.last_error = f"{source}: {type(error).__name__}: {error}"
            self._say(self.last_error, "error")
            return False
        finally:
            self._busy = False
            self.analyze_w.disabled = False
        self.last_error = None
        self.show_result(result, layer=wanted, unit=self.unit_w.value if self.unit_w.options else self._initial["unit"])
        self._say(f"analysed {len(result.layers)} layers of {source} on {result.length} tokens in "
                  f"{time.perf_counter() - started:.1f} s", "ok")
        return True

    def _call_analyze(self, model, tokenizer, prompt, layers, stride) -> ESSResult:
        return self._analyze_fn(model, prompt=prompt, tokenizer=tokenizer, layers=layers, tol=self.tol,
                                relative=self.relative, stride=stride, progress=False)

    def _analyze_all(self, model, tokenizer, prompt, wanted) -> ESSResult:
        """Layer by layer (one analyze call each, so the bar moves); a long prompt gets a
        strided pass for the overview, then the wanted layer exactly."""
        self._say("analysing layer 0 …", "busy")
        first = self._call_analyze(model, tokenizer, prompt, [0], None)
        stride = self._stride_for(first.length)
        n_layers = int(first.meta.get("n_layers", len(first.layers)))
        if stride is not None and stride > 1:
            first = self._call_analyze(model, tokenizer, prompt, [0], stride)
        result = first
        for index in range(1, n_layers):
            self._say(f"analysing layer {index} of {n_layers} …", "busy")
            self.progress_w.value = 0.05 + 0.85 * index / n_layers
            result = _merge(result, self._call_analyze(model, tokenizer, prompt, [index], stride))
        meta = dict(result.meta)
        meta["source"] = self.source  # "zoo:NAME" reads better than the folder it resolved to
        meta["stride"] = None
        meta["overview_stride"] = stride if stride and stride > 1 else None
        result = ESSResult(result.tokens, result.input_ids, result.layers, meta)
        target = wanted if wanted in result.layers else min(result.layers)
        return self._exact(result, target, model, tokenizer, prompt)

    def refine(self) -> bool:
        """Compute every layer the overview holds at a stride exactly, one by one (the bar
        moves), so the overview stops being a preview. True on success; on failure the
        status line says why and the strided result stays."""
        if self.result is None or not self.result.meta.get("overview_stride"):
            return True
        result = self.result
        pending = [i for i in sorted(result.layers) if i not in result.meta.get("exact_layers", [])]
        self._busy = True
        self.refine_w.disabled = True
        try:
            for done, index in enumerate(pending):
                self.progress_w.value = done / len(pending)
                result = self._exact(result, index)
        except Exception as error:  # noqa: BLE001  (the strided result stays on screen)
            self.progress_w.bar_style = "danger"
            self._say(f"refining layer {index}: {type(error).__name__}: {error}", "error")
            return False
        finally:
            self._busy = False
            self.refine_w.disabled = False
        meta = {**result.meta, "overview_stride": None}
        refined = ESSResult(result.tokens, result.input_ids, result.layers, meta)
        self.progress_w.value, self.progress_w.bar_style = 1.0, "success"
        self.show_result(refined, layer=self.layer_w.value, unit=self.unit_w.value)
        self._say(f"every layer computed exactly ({len(pending)} refined)", "ok")
        return True

    def _exact(self, result: ESSResult, layer: int, model=None, tokenizer=None, prompt=None) -> ESSResult:
        """The result with ``layer`` at every position (re-analysed if it was strided)."""
        if not result.meta.get("overview_stride") or layer in result.meta.get("exact_layers", []):
            return result
        if model is None:
            model, tokenizer = self._loaded[self.source]
            prompt = self.prompt_w.value
        self._say(f"computing layer {layer} exactly …", "busy")
        exact = self._call_analyze(model, tokenizer, prompt, [layer], None)
        merged = _merge(result, exact)
        merged.meta["exact_layers"] = sorted(set(result.meta.get("exact_layers", [])) | {layer})
        return merged

    # ------------------------------------------------------------------ views
    def show_result(self, result: ESSResult, *, layer=None, unit="mean") -> None:
        """Show ``result`` (no model run): fills the layer and unit lists and draws."""
        if not isinstance(result, ESSResult) or not result.layers:
            raise ValueError("show_result needs an ESSResult with at least one layer")
        self.result = result
        self.refine_w.layout.display = "" if result.meta.get("overview_stride") else "none"
        self._spec_cache.clear()
        self._t = None
        layer = layer if layer in result.layers else min(result.layers)
        self._busy = True  # filling the lists must not trigger one redraw per change
        try:
            self.layer_w.options = [(f"{i} · {lay.family}", i) for i, lay in sorted(result.layers.items())]
            self.layer_w.value = layer
            self._fill_units(unit)
        finally:
            self._busy = False
        self.refresh()

    def _fill_units(self, unit) -> None:
        lay = self.result.layer(self.layer_w.value)
        options = [(f"{a} over {lay.unit_kind}s", a) for a in charts.AGGREGATES]
        options += [(f"{lay.unit_kind} {u}", u) for u in range(lay.n_units)]
        self.unit_w.options = options
        self.unit_w.value = unit if unit in [v for _, v in options] else "mean"

    def _on_layer(self, change) -> None:
        if self._busy or self.result is None or change["new"] is None:
            return
        layer = change["new"]
        previous = self.result
        try:
            if self.result.meta.get("overview_stride") and layer not in self.result.meta.get("exact_layers", []):
                self._busy = True
                try:
                    self.result = self._exact(self.result, layer)
                finally:
                    self._busy = False
                self._spec_cache.clear()
            self._busy = True
            try:
                self._fill_units(self.unit_w.value)
            finally:
                self._busy = False
            self.refresh()
            self._say(f"layer {layer}", "info")
        except Exception as error:  # noqa: BLE001
            self.result = previous
            self._say(f"layer {layer}: {type(error).__name__}: {error}", "error")

    def _options(self) -> dict:
        return dict(layer=self.layer, unit=self.unit, variant=self.variant, tol=self.tol, relative=self.relative)

    def _structure(self) -> dict:
        """The spec without data for the current (result, layer, unit, metric): cached."""
        key = (self.layer, self.unit, self.metric_w.value)
        if key not in self._spec_cache:
            t0 = charts.default_position(self.result, **self._options())
            chart = charts.linked_structure(self.result, layer=self.layer, unit=self.unit, t=t0, names=self.names,
                                            overview_metric=self.metric_w.value)
            if self.chart is None:
                self._make_chart(chart)  # JupyterChart validates the spec once
                self._spec_cache[key] = self.chart.spec
            else:
                # same builders, already validated by the first spec and the chart tests: skip
                # the schema walk (about a second) on every new layer or unit
                self._spec_cache[key] = chart.to_dict(validate=False)
        return self._spec_cache[key]

    def _make_chart(self, chart) -> None:
        self.chart = alt.JupyterChart(chart, embed_options={"renderer": "svg", "actions": {"export": True, "source": False,
                                                                                            "compiled": False, "editor": False}})
        # Sync back only t (kept across redraws) and the layer (a click on the overview
        # selects it); hover stays in the browser, so moving the mouse sends nothing.
        keep = {self.names.t, self.names.layer}
        with self.chart.hold_sync():
            self.chart._selection_types = {k: v for k, v in self.chart._selection_types.items() if k in keep}
            self.chart._vl_selections = {k: v for k, v in self.chart._vl_selections.items() if k in keep}
        self.chart.observe(self._on_selection, "_vl_selections")
        self._chart_box.children = [self.chart]

    def _spec(self, data: dict) -> dict:
        spec = dict(self._structure())  # shallow: only the top-level keys below are replaced
        t = self._t if self._t is not None else charts.default_position(self.result, **self._options())
        positions = np.asarray(self.result.layer(self.layer).positions)
        t = int(positions[int(np.argmin(np.abs(positions - t)))])
        params = []
        for param in spec.get("params", []):
            param = dict(param)
            if param.get("name") == self.names.t:
                param["value"] = [{"t": t}]
            elif param.get("name") == self.names.layer:
                param["value"] = [{"layer": int(self.layer)}]
            params.append(param)
        spec["params"] = params
        spec["datasets"] = data
        return spec

    def refresh(self) -> None:
        """Redraw for the current controls (spec structure from the cache when possible)."""
        if self.result is None:
            return
        started = time.perf_counter()
        data = charts.linked_data(self.result, saturated=self.saturated, collapsed=self.collapsed,
                                  overview_metric=self.metric_w.value, **self._options())
        spec = self._spec(data)
        self.chart.spec = spec
        self.last_update_s = time.perf_counter() - started

    def refresh_data(self) -> None:
        """Tolerance / variant / thresholds: new data from the kept singular values, same
        spec structure. Same as `refresh` (whose structure is cached); named for intent."""
        self.refresh()

    def _on_selection(self, change) -> None:
        value = change["new"] or {}
        t_sel = (value.get(self.names.t) or {}).get("value") or {}
        layer_sel = (value.get(self.names.layer) or {}).get("value") or {}
        if t_sel.get("t"):
            self._t = int(t_sel["t"][0])
        chosen = layer_sel.get("layer")
        if chosen and self.result is not None and int(chosen[0]) != self.layer and int(chosen[0]) in self.result.layers:
            self.layer_w.value = int(chosen[0])  # runs _on_layer: the exact layer and a redraw

    # ------------------------------------------------------------------ static copy
    def static_png(self, scale: float = 1.0) -> bytes:
        """PNG of the views as they are now (vl-convert, no browser)."""
        if self.chart is None or self.chart.spec is None:
            raise ValueError("nothing to draw yet: analyse a prompt first")
        return to_png(copy.deepcopy(self.chart.spec), scale=scale)

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        if self._static and self.chart is not None:
            try:
                data["image/png"] = base64.b64encode(self.static_png()).decode("ascii")
            except Exception:  # noqa: BLE001  (the live widget still works without its static copy)
                pass
        return bundle


def explore(model: str | None = None, prompt: str | None = None, **options) -> ESSExplorer:
    """Open the ESS explorer (a Jupyter widget).

    With no arguments it opens on the built-in default model (zoo.DEFAULT_MODEL) and its
    example prompt. ``model``: "zoo:NAME", a hub id or a local folder; ``prompt``: text.
    ``options`` are those of ESSExplorer: result, layer, unit, variant, tol, relative,
    saturated, collapsed, overview_metric, stride, load_fn, analyze_fn, static.
    """
    return ESSExplorer(model, prompt, **options)
