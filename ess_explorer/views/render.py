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

__all__ = ["SUFFIXES", "figure_bytes", "save_figure", "to_png", "javascript_bundle", "vl_version"]

SUFFIXES = (".pdf", ".svg", ".png")


def vl_version() -> str:
    """The Vega-Lite version Altair writes, in vl-convert's spelling."""
    from altair.utils._importers import vl_version_for_vl_convert

    return vl_version_for_vl_convert()


def figure_bytes(chart, fmt: str, *, scale: float | None = None, ppi: float = 300) -> bytes:
    """The chart as PDF / SVG / PNG bytes via vl-convert; no network access is allowed
    (allowed_base_urls=[]), so a figure with remote data fails instead of fetching."""
    import vl_convert as vlc

    spec = chart if isinstance(chart, dict) else chart.to_dict()
    version = vl_version()
    if fmt == "pdf":
        return vlc.vegalite_to_pdf(spec, vl_version=version, scale=scale or 1.0, allowed_base_urls=[])
    if fmt == "svg":
        return vlc.vegalite_to_svg(spec, vl_version=version, allowed_base_urls=[]).encode("utf-8")
    if fmt == "png":
        # vl-convert draws W points as W * ppi / 72 * scale pixels and records ppi in the file,
        # so ppi alone gives print resolution at the figure's physical size.
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
