"""The explorer's controls (ipywidgets) and its tqdm-compatible progress bar; widget.py
wires them to its traitlets and to the session."""

from __future__ import annotations

import html
import os
import time
from dataclasses import dataclass
from typing import Callable

import ipywidgets as W
import numpy as np
import traitlets as T

from ..core.diagnostics import COLLAPSED_AT, SATURATED_AT
from ..core.ess import DEFAULT_RELATIVE, DEFAULT_TOL, check_tolerance, check_variant
from ..io import ResultCache
from ..options import AGGREGATES, GATES, METRICS, SCOPES, VARIANTS, check_choice
from ..result import ESSResult
from ..views.labels import unit_menu_options
from .expert_controls import advanced_settings, dropdown_width
from .static import example_prompt, random_mqar_prompt

__all__ = [
    "ExplorerOptions",
    "explorer_arguments",
    "CUSTOM",
    "ModelPicker",
    "LayerUnitLists",
    "link_controls",
    "StatusBar",
    "ProgressBar",
    "initial_tolerance",
    "Tolerance",
    "check_options",
    "check_view",
    "make_controls",
    "layout_rows",
    "status_html",
    "with_selection",
    "zoo_models",
    "model_choices",
]


class Tolerance(T.Float):
    """A tolerance trait: True, NaN or a negative number is refused in words (T.Float would
    take True as 1.0, and a NaN would break the link to the control)."""

    def validate(self, obj, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise T.TraitError(f"tol must be a finite number >= 0 (e.g. 1e-3), got {value!r}")
        try:
            check_tolerance(value, bool(getattr(obj, "relative", True)))
        except ValueError as error:
            raise T.TraitError(str(error)) from None
        return super().validate(obj, value)


@dataclass(frozen=True)
class ExplorerOptions:
    """The explorer's options besides its model and prompt (``explore(model, prompt, **options)``),
    checked when made: a ValueError in words before the explorer changes any state.

    result: an ESSResult to open on instead of running a model. layer, unit: the view it
    opens on (an index; a unit index or an aggregate of options.AGGREGATES). variant
    (options.VARIANTS), tol, relative (None: the result's analysis settings, else the
    defaults), overview_metric (options.METRICS): the view settings. saturated, collapsed:
    the utilisation thresholds. stride: "auto" | None | int (app/session.py). load_fn,
    capture_fn, layer_fn: the session's injection points. cache: True (the default on-disk
    ResultCache), False or a ResultCache. static: display the static copy (app/static.py).
    background: False analyses in the calling thread. auto_analyze: start analysing at once.
    """

    result: ESSResult | None = None
    layer: int | None = None
    unit: int | str = "mean"
    variant: str = "tolerance"
    tol: float | None = None
    relative: bool | None = None
    saturated: float = SATURATED_AT
    collapsed: float = COLLAPSED_AT
    overview_metric: str = "utilisation"
    stride: int | str | None = "auto"
    load_fn: Callable | None = None
    capture_fn: Callable | None = None
    layer_fn: Callable | None = None
    cache: bool | ResultCache | None = True
    static: bool = True
    background: bool = True
    auto_analyze: bool = True

    def __post_init__(self):
        check_options(
            variant=self.variant,
            overview_metric=self.overview_metric,
            saturated=self.saturated,
            collapsed=self.collapsed,
            result=self.result,
            tol=self.tol,
            relative=self.relative,
            layer=self.layer,
            unit=self.unit,
            cache=self.cache,
        )

    def session_options(self) -> dict:
        """The keyword arguments of app/session.ExplorerSession these options hold."""
        cache = ResultCache() if self.cache is True else (self.cache or None)
        steps = {"load_fn": self.load_fn, "capture_fn": self.capture_fn, "layer_fn": self.layer_fn}
        return {**steps, "cache": cache, "stride": self.stride}


def explorer_arguments(model, options: dict) -> tuple[str | None, ExplorerOptions]:
    """The explorer's ``model`` and its checked options: an ESSResult given as the model is the
    result to open on (``result=``); a path is its name; any other object (a model already in
    memory) is an error that says to pass its result."""
    if isinstance(model, ESSResult):
        if options.get("result") is not None:
            raise TypeError("the explorer got two results: one in place of the model and one as result=")
        model, options = None, {**options, "result": model}
    elif isinstance(model, os.PathLike):
        model = os.fspath(model)
    elif model is not None and not isinstance(model, str):
        raise TypeError(
            f"the explorer takes a model's name (zoo:NAME, a hub id or a local folder) or an ESSResult, not a "
            f"{type(model).__name__}: for a model in memory, pass its result, explore(analyze(model, input_ids))"
        )
    return model, ExplorerOptions(**options)


def check_options(
    *, variant, overview_metric, saturated, collapsed, result, tol, relative, layer=None, unit="mean", cache=True
) -> None:
    """The explorer's options, checked before any state changes: a ValueError in words."""
    check_variant(variant)
    check_choice("overview_metric", overview_metric, METRICS)
    if not 0 <= collapsed < saturated:
        raise ValueError(f"need 0 <= collapsed < saturated, got collapsed={collapsed}, saturated={saturated}")
    if result is not None and not isinstance(result, ESSResult):
        raise ValueError(f"result must be an ESSResult, got {type(result).__name__}")
    if relative is not None and not isinstance(relative, (bool, np.bool_)):
        raise ValueError(f"relative must be True or False, got {relative!r}")
    if tol is not None:
        check_tolerance(tol, True if relative is None else relative)
    if not (isinstance(cache, (bool, ResultCache)) or cache is None):
        raise ValueError(f"cache must be True, False or a ResultCache, got {cache!r}")
    check_view(layer, unit, result)


def _is_index(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value >= 0


def check_view(layer, unit, result) -> None:
    """``layer`` (None or an index) and ``unit`` (an aggregate or an index) as asked for, and,
    given a ``result``, present in it: never replaced by layer 0 or the mean without a word."""
    if layer is not None and not _is_index(layer):
        raise ValueError(f"layer must be a layer index (an int >= 0) or None, got {layer!r}")
    if unit not in AGGREGATES and not _is_index(unit):
        raise ValueError(f"unit must be one of {', '.join(AGGREGATES)} or a unit index, got {unit!r}")
    if result is None or not result.layers:
        return
    if layer is not None and layer not in result.layers:
        raise ValueError(f"layer {layer} is not in the result; it has layers {sorted(result.layers)}")
    shown = result.layers[layer if layer is not None else min(result.layers)]
    if _is_index(unit) and unit >= shown.n_units:
        raise ValueError(
            f"unit {unit} is not in layer {shown.layer}: it has {shown.n_units} {shown.unit_kind}s (0..{shown.n_units - 1})"
        )


def initial_tolerance(result: ESSResult | None, tol, relative) -> tuple[float, bool]:
    """(tol, relative) the explorer opens with: those given, else the result's analysis
    settings, else the defaults (a damaged file's tol falls back to the default)."""
    saved = result.meta.get("tol", DEFAULT_TOL) if result is not None else DEFAULT_TOL
    if isinstance(saved, bool) or not isinstance(saved, (int, float)) or not np.isfinite(saved) or saved < 0:
        saved = DEFAULT_TOL
    saved_relative = result.meta.get("relative", DEFAULT_RELATIVE) if result is not None else DEFAULT_RELATIVE
    return float(tol if tol is not None else saved), bool(relative if relative is not None else saved_relative)


def status_html(message: str, kind: str = "info") -> str:
    """The status line's HTML: the message escaped, coloured and marked by kind."""
    colors = {"info": "#444", "ok": "#2e7d32", "error": "#c62828", "busy": "#1565c0"}
    icon = {"error": "⚠ ", "ok": "✓ ", "busy": "↻ "}.get(kind, "")
    return f'<span style="color:{colors[kind]}">{icon}{html.escape(message)}</span>'


# How the overview's metrics read on the control (utilisation: ESS over the attainable ceiling).
METRIC_LABELS = {"utilisation": "ESS/TSS", "ess": "ESS"}

CUSTOM = "__custom__"  # model dropdown value: use the text field (hub id or local folder)


def zoo_models() -> tuple[list[str], str | None]:
    try:
        from .. import sources

        return list(sources.list_models()), sources.DEFAULT_MODEL
    except Exception:  # noqa: BLE001  (no zoo: the explorer still opens hub ids and folders)
        return [], None


def model_choices() -> tuple[list[tuple[str, str]], str | None]:
    """The model dropdown's (label, value) pairs (the built-in models, then CUSTOM) and the
    source the explorer opens on when given none ("zoo:" + the default model; None without a zoo)."""
    names, default = zoo_models()
    choices = [(f"{name} (built-in)", f"zoo:{name}") for name in names] + [("hub id or folder →", CUSTOM)]
    return choices, (f"zoo:{default}" if names and default else None)


class ProgressBar:
    """A tqdm-compatible progress bar drawn in a FloatProgress, the step and ETA told by ``say``."""

    def __init__(self, bar: W.FloatProgress, say: Callable, total=None, desc="", unit="it", **_):
        self.bar, self.say = bar, say
        self.total, self.n, self.desc, self.unit = total or 0, 0, desc, unit
        self.started = time.perf_counter()
        self._eta: tuple[float, float] | None = None  # (seconds left, when told)
        self._draw()

    def set_eta(self, seconds: float) -> None:
        """The seconds left as the caller estimates them (session.TaskClock): the ETA shown
        counts down from it instead of extrapolating the count linearly."""
        self._eta = (float(seconds), time.perf_counter())
        self._draw()

    def update(self, n=1):
        self.n += n
        self._draw()

    def set_description(self, desc=None, refresh=True):
        self.desc = desc or ""
        self._draw()

    def close(self):
        pass

    def eta_s(self) -> float | None:
        if self._eta is not None:
            seconds, told = self._eta
            return max(0.0, seconds - (time.perf_counter() - told))
        elapsed = time.perf_counter() - self.started
        return elapsed / self.n * (self.total - self.n) if self.n and self.total else None

    def _draw(self):
        fraction = self.n / self.total if self.total else 0.0
        eta = self.eta_s()
        self.bar.value = min(1.0, fraction)
        self.say(
            f"{self.desc} · {self.n}/{self.total} {self.unit}s" + (f" · ETA {eta:.0f} s" if eta is not None else ""),
            "busy",
        )


class ModelPicker:
    """The model controls bound to the ``model`` trait of ``owner``: the dropdown of built-in
    models, or its last entry (CUSTOM) with the text field for a hub id or folder. ``quiet``:
    the context under which the code's own updates of the controls are made
    (worker.Worker.quiet), ``is_quiet`` tells them apart from the user's."""

    def __init__(self, owner, dropdown: W.Dropdown, text: W.Text, mqar: W.Button, quiet, is_quiet: Callable[[], bool]):
        self.owner, self.dropdown, self.text, self.mqar = owner, dropdown, text, mqar
        self.quiet, self.is_quiet = quiet, is_quiet
        owner.observe(self._show, "model")
        dropdown.observe(self._pick, "value")
        text.observe(self._pick, "value")

    def _show(self, change) -> None:
        source = change["new"]
        with self.quiet():
            if source in [v for _, v in self.dropdown.options] and source != CUSTOM:
                self.dropdown.value = source
            else:
                self.dropdown.value, self.text.value = CUSTOM, source or ""
        self.text.layout.display = None if self.dropdown.value == CUSTOM else "none"
        self.mqar.disabled = not (source or "").startswith("zoo:")

    def _pick(self, _change) -> None:
        if not self.is_quiet():
            custom = self.dropdown.value == CUSTOM
            self.owner.model = (self.text.value.strip() or None) if custom else self.dropdown.value


class LayerUnitLists:
    """The layer and unit dropdowns bound to the ``layer`` and ``unit`` traits of ``owner``: a
    choice in a list sets the trait; `fill` and `units` set the lists (the caller holds the
    ``quiet`` context, so the lists' own changes set nothing back)."""

    def __init__(self, owner, layer_w: W.Dropdown, unit_w: W.Dropdown, is_quiet: Callable[[], bool]):
        self.layer_w, self.unit_w = layer_w, unit_w
        for name, control in (("layer", layer_w), ("unit", unit_w)):
            control.observe(lambda c, n=name: is_quiet() or c["new"] is None or setattr(owner, n, c["new"]), "value")

    def fill(self, result: ESSResult, layer: int, unit) -> int | str:
        """Both lists for ``result``, ``layer`` selected; returns the unit selected (``unit``,
        or the mean when the layer has no such unit)."""
        self.layer_w.options = [(f"{i} · {lay.family}", i) for i, lay in sorted(result.layers.items())]
        self.layer_w.value = layer
        return self.units(result.layer(layer), unit)

    def units(self, lay, unit) -> int | str:
        """The unit list of layer ``lay``, ``unit`` selected where it has one (else the mean)."""
        self.unit_w.options = unit_menu_options(lay)
        self.unit_w.layout.width = dropdown_width([label for label, _ in self.unit_w.options], "unit")
        self.unit_w.value = unit if unit in [v for _, v in self.unit_w.options] else "mean"
        return self.unit_w.value


class StatusBar:
    """The run's feedback: the Analyze and continue buttons, the progress bar and the status line."""

    def __init__(self, analyze: W.Button, refine: W.Button, progress: W.FloatProgress, status: W.HTML):
        self.analyze, self.refine, self.bar, self.status = analyze, refine, progress, status
        self._done: tuple[str, tuple] | None = None  # the last good run's line and (layer, why) it opened on

    def say(self, message: str, kind: str = "info") -> None:
        self.status.value = status_html(message, kind)

    def progress(self, **kwargs) -> "ProgressBar":
        """A tqdm-compatible bar drawn here (the session's ``progress``)."""
        return ProgressBar(self.bar, self.say, **kwargs)

    def attempt(self, fn: Callable[[], None]) -> None:
        """Run ``fn``; an error goes to the status line, never to a traceback (any failure of a
        view update must leave the widget usable)."""
        try:
            fn()
        except Exception as error:  # noqa: BLE001
            self.say(f"{type(error).__name__}: {error}", "error")

    def starting(self) -> None:
        self.analyze.disabled, self.refine.layout.display = True, "none"
        self.bar.value, self.bar.bar_style = 0.0, "info"
        self._done = None
        self.say("starting …", "busy")

    def ended(self, message: str, *, ok: bool, resumable: bool = False, opened: tuple | None = None) -> None:
        """A run ended: ``message`` on the status line; ``resumable`` shows "continue";
        ``opened``: (layer, why) where the run chose the layer the explorer opens on."""
        self.analyze.disabled = False
        self.bar.value, self.bar.bar_style = 1.0, "success" if ok else "danger"
        self._done = (message, opened) if ok and opened is not None else None
        if self._done is not None:
            self.showing(opened[0])
        else:
            self.say(message, "ok" if ok else "error")
        self.refine.layout.display = "" if resumable else "none"

    def showing(self, layer) -> None:
        """The status line for ``layer`` on screen (the opened one, or one the user picked): the
        run's summary, and the opened layer named as what it was, never as another view."""
        if self._done is not None:
            message, (opened, why) = self._done
            now = (
                f" · opened on layer {opened}: {why}"
                if layer == opened
                else f" · layer {layer} (opened on {opened}: {why})"
            )
            self.say(message + now, "ok")


def make_controls(options: list[tuple[str, str]]) -> dict[str, W.Widget]:
    """The control widgets by attribute name (model_w, source_w, analyze_w, ...);
    ``options``: the model dropdown's (label, value) pairs."""
    c = {}
    style = {"description_width": "initial"}
    c["model_w"] = W.Dropdown(
        options=options, value=CUSTOM, description="model", style=style, layout=W.Layout(width="260px")
    )
    c["source_w"] = W.Text(placeholder="hub id (gpt2), /path/to/folder or model.gguf", layout=W.Layout(width="300px"))
    c["analyze_w"] = W.Button(
        description="Analyze", button_style="primary", icon="play", tooltip="run the model on the prompt"
    )
    c["prompt_w"] = W.Textarea(placeholder="prompt text", layout=W.Layout(flex="1 1 auto", width="auto", height="64px"))
    c["example_w"] = W.Button(
        description="example", tooltip="the model's example prompt", layout=W.Layout(width="120px")
    )
    c["mqar_w"] = W.Button(
        description="random MQAR",
        tooltip="a fresh sequence of the built-in model's task",
        layout=W.Layout(width="120px"),
    )
    c["layer_w"] = W.Dropdown(description="layer", options=[], style=style, layout=W.Layout(width="210px"))
    c["unit_w"] = W.Dropdown(description="unit", options=[], style=style, layout=W.Layout(width="170px"))
    c["variant_w"] = W.ToggleButtons(
        options=[(variant, variant) for variant in VARIANTS],
        description="ESS",
        style={"button_width": "86px", "description_width": "initial"},
    )
    c["tol_w"] = W.FloatLogSlider(
        base=10,
        min=-12,
        max=0,
        step=0.1,
        description="τ",
        readout_format=".1e",
        continuous_update=False,
        style=style,
        layout=W.Layout(width="260px"),
    )
    c["relative_w"] = W.ToggleButtons(options=[("× σ₁", True), ("absolute", False)], style={"button_width": "78px"})
    c["scope_w"] = W.Dropdown(
        options=[(f"σ₁ of the {scope}", scope) for scope in SCOPES],
        description="scope",
        style=style,
        layout=W.Layout(width="200px"),
    )
    c["gates_w"] = W.Dropdown(
        options=[(f"gates {policy} T", policy) for policy in GATES],
        description="",
        layout=W.Layout(width="150px"),
    )
    c["metric_w"] = W.Dropdown(
        options=[(METRIC_LABELS[metric], metric) for metric in METRICS],
        description="overview",
        style=style,
        layout=W.Layout(width="160px"),
    )
    c["progress_w"] = W.FloatProgress(value=0.0, min=0.0, max=1.0, bar_style="info", layout=W.Layout(width="180px"))
    c["status_w"] = W.HTML(value="").add_class("ess-explorer-status")
    c["refine_w"] = W.Button(
        description="continue",
        icon="th",
        tooltip="compute the layers still strided",
        layout=W.Layout(display="none"),
    )  # shown when a run stopped half way
    return c


def link_controls(e, worker) -> None:
    """Tie the controls of explorer ``e`` (make_controls') to its traitlets and methods: the
    view settings linked both ways, the model picker, the layer and unit lists (``e.lists``)
    and the buttons; ``worker`` (worker.Worker) tells the code's own updates apart."""
    for name in ("prompt", "variant", "tol", "relative", "scope", "gates"):
        W.link((e, name), (getattr(e, f"{name}_w"), "value"))
    W.link((e, "overview_metric"), (e.metric_w, "value"))
    ModelPicker(e, e.model_w, e.source_w, e.mqar_w, worker.quiet, lambda: worker.is_quiet)
    e.lists = LayerUnitLists(e, e.layer_w, e.unit_w, lambda: worker.is_quiet)
    e.observe(lambda change: e.status.showing(change["new"]), "layer")
    e.analyze_w.on_click(lambda _: e.run())
    e.refine_w.on_click(lambda _: e.refine())
    e.example_w.on_click(lambda _: setattr(e, "prompt", example_prompt(e.model)))
    e.mqar_w.on_click(lambda _: e.status.attempt(lambda: setattr(e, "prompt", random_mqar_prompt(e.model))))


def layout_rows(e) -> list[W.Widget]:
    """The rows of controls of explorer ``e`` (whose attributes are make_controls')."""
    return [
        W.HBox([e.model_w, e.source_w, e.analyze_w, e.refine_w], layout=W.Layout(align_items="center")),
        W.HBox([e.prompt_w, W.VBox([e.example_w, e.mqar_w])], layout=W.Layout(align_items="flex-start")),
        W.HBox(
            [e.layer_w, e.unit_w, e.variant_w, e.tol_w, e.metric_w],
            layout=W.Layout(align_items="center", flex_flow="row wrap"),
        ),
        W.HBox([e.progress_w, e.status_w], layout=W.Layout(align_items="center")),
        advanced_settings(e),
    ]


def with_selection(structure: dict, data: dict, names, *, t: int, layer: int) -> dict:
    """A copy of the spec ``structure`` with its datasets and the selected t / layer set as
    the values of the params ``names.t`` / ``names.layer`` (shallow: the cached structure
    is never modified)."""
    spec = dict(structure)
    params = []
    for param in spec.get("params", []):
        param = dict(param)
        if param.get("name") == names.t:
            param["value"] = [{"t": int(t)}]
        elif param.get("name") == names.layer:
            param["value"] = [{"layer": int(layer)}]
        params.append(param)
    spec["params"] = params
    spec["datasets"] = data
    return spec
