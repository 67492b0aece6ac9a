"""The one render path: a Vega-Lite spec -> PDF / SVG / PNG bytes, or the inline JS bundle.

Everything goes through vl-convert with no network access (``allowed_base_urls=[]``): a
chart that refers to remote data fails instead of fetching, and the HTML bundle is the
vega-embed + Vega + Vega-Lite JavaScript that vl-convert ships (no CDN).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from ..atomic import atomic_write

__all__ = [
    "SUFFIXES",
    "MAX_POINTS",
    "MAX_PPI",
    "MIN_PPI",
    "PIXEL_BUDGET",
    "check_figure_size",
    "figure_bytes",
    "save_figure",
    "to_png",
    "javascript_bundle",
    "vl_version",
]

SUFFIXES = (".pdf", ".svg", ".png")

# Sizes are checked before vl-convert sees them: its renderer aborts the whole process on
# a canvas it cannot allocate (a huge width or resolution) and panics on a zero resolution.
MAX_POINTS = 20_000  # the largest width / height of a figure or a panel, in points (~7 m)
MAX_PPI = 2_400  # the highest PNG resolution
MIN_PPI = 10  # below this a figure is a few pixels, and the renderer fails without a reason
PIXEL_BUDGET = 100_000_000  # the most pixels of a PNG (10000 x 10000, ~400 MB of RGBA)


def _sizes(spec) -> list[float]:
    """Every numeric width / height anywhere in a Vega-Lite spec (panels included)."""
    found = []
    if isinstance(spec, dict):
        for key, value in spec.items():
            if key in ("width", "height") and isinstance(value, (int, float)) and not isinstance(value, bool):
                found.append(float(value))
            elif isinstance(value, (dict, list)):
                found.extend(_sizes(value))
    elif isinstance(spec, list):
        for value in spec:
            found.extend(_sizes(value))
    return found


def check_figure_size(spec: dict, *, scale: float | None = None, ppi: float = 300) -> None:
    """ValueError unless every width / height in ``spec`` is a finite number in
    (0, MAX_POINTS] points, ``ppi`` is in [MIN_PPI, MAX_PPI] and ``scale`` positive."""
    if (
        isinstance(ppi, bool)
        or not isinstance(ppi, (int, float, np.integer, np.floating))
        or not (MIN_PPI <= ppi <= MAX_PPI)
    ):
        raise ValueError(f"ppi must be a number in [{MIN_PPI}, {MAX_PPI}], got {ppi!r}; 300 is print resolution")
    if scale is not None and (isinstance(scale, bool) or not np.isfinite(scale) or not 0 < scale <= MAX_PPI / 72):
        raise ValueError(f"scale must be a positive number up to {MAX_PPI / 72:g}, got {scale!r}")
    for size in _sizes(spec):
        if not (np.isfinite(size) and 0 <= size <= MAX_POINTS):
            raise ValueError(
                f"a figure width / height of {size:g} points is out of range; "
                f"give sizes between 1 and {MAX_POINTS} points (single, double, or e.g. 400)"
            )


def _check_pixels(svg: str, scale: float, ppi: float) -> None:
    """ValueError when the PNG of a chart whose SVG is ``svg`` would exceed PIXEL_BUDGET."""
    import re

    head = svg[: svg.find(">") + 1]
    width, height = (re.search(rf'\b{name}="([0-9.eE+]+)"', head) for name in ("width", "height"))
    if width is None or height is None:
        return
    factor = ppi / 72 * scale
    pixels = float(width.group(1)) * factor * float(height.group(1)) * factor
    if pixels > PIXEL_BUDGET:
        raise ValueError(
            f"this PNG would have {pixels:.3g} pixels (figure {float(width.group(1)):.0f} x "
            f"{float(height.group(1)):.0f} pt at {ppi:g} ppi), more than the budget of {PIXEL_BUDGET:.0e}; "
            "lower --ppi or the figure size, or write a vector .pdf / .svg"
        )


def vl_version() -> str:
    """The Vega-Lite version Altair writes, in vl-convert's spelling."""
    from altair.utils._importers import vl_version_for_vl_convert

    return vl_version_for_vl_convert()


def figure_bytes(chart, fmt: str, *, scale: float | None = None, ppi: float = 300) -> bytes:
    """The chart as PDF / SVG / PNG bytes via vl-convert; no network access is allowed
    (allowed_base_urls=[]), so a figure with remote data fails instead of fetching."""
    import vl_convert as vlc

    spec = chart if isinstance(chart, dict) else chart.to_dict()
    check_figure_size(spec, scale=scale, ppi=ppi)
    version = vl_version()
    if fmt == "pdf":
        return vlc.vegalite_to_pdf(spec, vl_version=version, scale=scale or 1.0, allowed_base_urls=[])
    if fmt == "svg":
        return vlc.vegalite_to_svg(spec, vl_version=version, allowed_base_urls=[]).encode("utf-8")
    if fmt == "png":
        # vl-convert draws W points as W * ppi / 72 * scale pixels and records ppi in the file,
        # so ppi alone gives print resolution at the figure's physical size.
        _check_pixels(vlc.vegalite_to_svg(spec, vl_version=version, allowed_base_urls=[]), scale or 1.0, ppi)
        return vlc.vegalite_to_png(spec, vl_version=version, scale=scale or 1.0, ppi=ppi, allowed_base_urls=[])
    raise ValueError(f"unknown figure format {fmt!r}; use one of pdf, svg, png")


def save_figure(chart, path, *, scale: float | None = None, ppi: float = 300) -> Path:
    """Write ``chart`` to ``path`` by suffix (.pdf, .svg, .png), atomically.

    PDF and SVG are vector, 1 pt per Vega-Lite pixel; ``scale`` multiplies the PDF size
    (rarely wanted: size the figure with ``width`` instead). A PNG is W * ppi / 72 * scale
    pixels wide for a W-point figure (default 300 ppi, scale 1: print resolution at the
    figure's physical size). Returns the path.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"cannot tell the figure format from {path.name!r}; use a name ending in .pdf, .svg or .png")
    if scale is not None and (not np.isfinite(scale) or scale <= 0):
        raise ValueError(f"scale must be a positive number, got {scale}")
    data = figure_bytes(chart, suffix[1:], scale=scale, ppi=ppi)
    return atomic_write(path, data)


def to_png(chart_or_spec, scale: float = 1.0, ppi: float = 72) -> bytes:
    """A PNG of a chart or spec at screen resolution (the static copy of a widget)."""
    return figure_bytes(chart_or_spec, "png", scale=scale, ppi=ppi)


@functools.lru_cache(maxsize=1)
def javascript_bundle() -> str:
    """The vega-embed + Vega + Vega-Lite bundle (~1 MB, built once per process), no CDN."""
    import vl_convert as vlc

    return vlc.javascript_bundle(vl_version=vl_version())
