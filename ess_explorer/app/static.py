"""What the explorer needs beyond its controls: prompts of a model, the static copy of the
views, and the one place that touches Altair's private selection state.

Static copy: next to the live widget the explorer displays a second output, an HTML
``<div class="ess-explorer-static">`` holding a PNG of the views, stored once (an image/png
copy beside it would double every saved notebook, and could not be hidden). A live widget
carries a ``<style>`` that hides it, so a running notebook shows the widget alone; where no
widget can be drawn (nbconvert HTML viewed offline, which leaves a saved widget's view empty;
an untrusted notebook) the style is absent and the figure shows, at its CSS size. The PNG is
rendered at twice its size for sharpness and displayed at half, unless that is above
STATIC_MAX_BYTES (a deep model's views): then at its size.
"""

from __future__ import annotations

import base64
import copy
import random
import struct

import altair as alt

from ..views.render import to_png

__all__ = [
    "StaticCopy",
    "EXAMPLE_PROMPT",
    "STATIC_CLASS",
    "HIDE_STATIC_CSS",
    "example_prompt",
    "random_mqar_prompt",
    "static_bundle",
    "png_size",
    "sync_only",
    "enable_offline",
]

EXAMPLE_PROMPT = "The key to the red box is 42. The key to the blue box is 17. | What is the key to the red box? 42"
STATIC_CLASS = "ess-explorer-static"
HIDE_STATIC_CSS = f"<style>.{STATIC_CLASS} {{ display: none; }}</style>"
STATIC_SCALE = 2  # PNG pixels per CSS pixel
STATIC_MAX_BYTES = 1_500_000  # above this a static copy is drawn at 1 pixel per CSS pixel


def _zoo_name(source: str | None) -> str | None:
    return source[4:] if isinstance(source, str) and source.startswith("zoo:") else None


def _task(source: str | None):
    """The MQAR task of a zoo model, or None (only a zoo source imports the zoo's task code)."""
    name = _zoo_name(source)
    if not name:
        return None
    try:
        from .. import zoo

        return zoo.task_of(name)
    except Exception:  # noqa: BLE001  (a broken zoo install must not break the explorer)
        return None


def example_prompt(source: str | None) -> str:
    """The example prompt of a model: one held-out MQAR sequence for a zoo model (from its
    task), else EXAMPLE_PROMPT."""
    task = _task(source)
    return task.prompt(seed=0) if task is not None else EXAMPLE_PROMPT


def random_mqar_prompt(source: str | None, seed: int | None = None) -> str:
    """A fresh MQAR sequence of the zoo model's own task; ValueError for other models."""
    task = _task(source)
    if task is None:
        raise ValueError("random MQAR prompts exist for the built-in zoo models only; choose one in the model list")
    return task.prompt(seed=random.randrange(1_000_000) if seed is None else seed)


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return struct.unpack(">II", png[16:24])


def static_bundle(spec: dict | None) -> dict:
    """The display data of the static copy of ``spec`` (module docstring); a note in words
    when there is nothing to draw yet."""
    if spec is None:
        note = "the ESS explorer: no figure yet (analysis running)"
        return {"text/plain": note, "text/html": f'<div class="{STATIC_CLASS}"><em>{note}</em></div>'}
    scale = STATIC_SCALE
    png = to_png(copy.deepcopy(spec), scale=scale)
    if len(png) > STATIC_MAX_BYTES:
        scale, png = 1, to_png(copy.deepcopy(spec), scale=1)
    width, height = png_size(png)
    data = base64.b64encode(png).decode("ascii")
    img = (
        f'<img src="data:image/png;base64,{data}" width="{width // scale}" '
        f'height="{height // scale}" alt="ESS explorer views (static copy)">'
    )
    return {"text/plain": "ESS explorer views (static copy)", "text/html": f'<div class="{STATIC_CLASS}">{img}</div>'}


def _altair_major() -> int:
    try:
        return int(alt.__version__.split(".")[0])
    except ValueError:
        return 0


def enable_offline() -> None:
    """``alt.JupyterChart.enable_offline()`` (the widget's JavaScript from vl-convert, never
    a CDN), with the bundle kept on disk: building it holds the interpreter for ~5 s on
    this CPU (vl-convert keeps the GIL), which would hold back the explorer's first
    appearance in every new kernel. The file is keyed by the Altair, vl-convert and
    Vega-Lite versions; setting it uses Altair's private ``_is_offline`` flag, for the
    Altair majors where it is known (else the plain call)."""
    chart = alt.JupyterChart
    if getattr(chart, "_is_offline", False):
        return
    if _altair_major() not in (5, 6) or not hasattr(chart, "_is_offline"):
        chart.enable_offline()
        return
    import vl_convert as vlc

    from ..atomic import atomic_write
    from ..io import default_cache_dir
    from ..views.render import vl_version

    path = default_cache_dir() / "js" / f"jupyterchart-{alt.__version__}-{vlc.__version__}-{vl_version()}.js"
    try:
        bundle = path.read_text(encoding="utf-8")
    except OSError:
        bundle = None
    if bundle:
        chart._esm, chart._is_offline = bundle, True
        return
    chart.enable_offline()
    try:
        atomic_write(path, chart._esm)
    except OSError:  # a read-only home: the next kernel builds it again
        pass


def sync_only(chart: alt.JupyterChart, names: set[str]) -> bool:
    """Sync only the selections ``names`` back to Python (hover stays in the browser, so
    moving the mouse sends nothing to the kernel). Altair has no public switch for this:
    it edits JupyterChart's private ``_selection_types`` / ``_vl_selections``, for the
    Altair majors where they are known (5 and 6; pyproject bounds altair below 7).
    Elsewhere it does nothing (every selection syncs: slower, still correct); True when
    applied."""
    if _altair_major() not in (5, 6) or not hasattr(chart, "_selection_types"):
        return False
    with chart.hold_sync():
        chart._selection_types = {k: v for k, v in chart._selection_types.items() if k in names}
        chart._vl_selections = {k: v for k, v in chart._vl_selections.items() if k in names}
    return True


class StaticCopy:
    """The explorer's static copy (a mixin of the widget): a PNG of its views as they are
    now, displayed next to the live widget (``_static``) and updated when a run ends.
    Expects ``chart`` (an alt.JupyterChart or None), ``_static`` and ``_static_handle``."""

    def static_png(self, scale: float = 1.0) -> bytes:
        """PNG of the views as they are now (vl-convert, no browser)."""
        if self.chart is None or self.chart.spec is None:
            raise ValueError("nothing to draw yet: analyse a prompt first")
        return to_png(dict(self.chart.spec), scale=scale)

    def static_bundle(self) -> dict:
        """The display data of the static copy (app/static.py)."""
        return static_bundle(self.chart.spec if self.chart is not None else None)

    def _update_static(self) -> None:
        if self._static_handle is not None:
            try:
                self._static_handle.update(self.static_bundle(), raw=True)
            except Exception:  # noqa: BLE001  (the live widget works without its static copy)
                pass

    def _ipython_display_(self) -> None:
        """The live widget, then (static=True) its static copy (app/static.py)."""
        from IPython.display import display

        display(self._repr_mimebundle_(), raw=True)
        if self._static:
            try:
                bundle = self.static_bundle()
            except Exception:  # noqa: BLE001
                return
            self._static_handle = display(bundle, raw=True, display_id=True)
