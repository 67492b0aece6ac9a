"""Charts and display of the teaching notebook (notebooks/01_what_is_ess.ipynb).

* ``show(chart)``: the chart as a PNG (vl-convert, offline), drawn at its own size. A
  plain image reads the same live, on GitHub, in nbconvert HTML and in a headless run;
* ``operator_chart``, ``spectra_chart``, ``mixers_over_time``, ``whole_spectra_chart``,
  ``tolerance_sweep_chart``: the notebook's figures, from tensors;
* ``small_multiples``: one chart per parameter value, side by side (the static copy of
  what a slider does);
* ``slider_panel``: sliders over a chart function, drawn into an image widget (live kernel only).

The numbers come from ess_explorer.teaching and the core; nothing here computes ESS
except through ``tolerance_ess`` / ``hankel_singular_values``.
"""

from __future__ import annotations

import re
from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd
import torch

from ..core.ess import DEFAULT_TOL, tolerance_ess
from ..core.spectra import hankel_singular_values
from .render import save_figure, to_png

PNG_SCALE = 2.0  # rendered at twice the size, shown at 1x: sharp on high-density screens


def png_width(png: bytes) -> int:
    """Pixel width from a PNG header (bytes 16..19 of the IHDR chunk)."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return int.from_bytes(png[16:20], "big")


def show(chart, scale: float = PNG_SCALE):
    """Display ``chart`` as a PNG at its own size (rendered at ``scale`` for sharpness)."""
    from IPython.display import Image, display

    png = to_png(chart, scale=scale)
    display(Image(png, width=int(png_width(png) / scale)))


def operator_frame(T) -> pd.DataFrame:
    """One row per non-zero lower-triangle entry of T (L, L): i, j, value, log10|T|."""
    T = np.asarray(T)
    i, j = np.tril_indices(T.shape[0])
    keep = T[i, j] != 0  # exact zeros: no path from u_j to y_i, drawn blank
    i, j, v = i[keep], j[keep], T[i, j][keep]
    return pd.DataFrame({"i": i, "i1": i + 1, "j": j, "j1": j + 1, "value": v, "log10|T|": np.log10(np.abs(v))})


def operator_chart(T, t: int, title: str, size: int = 170):
    """log10|T| heatmap (row i = output, column j = input) with the cut H_t = T[t:, :t] in red."""
    n = int(np.asarray(T).shape[0])
    x = alt.X("j:Q", title="input j", scale=alt.Scale(domain=[0, n], nice=False))
    y = alt.Y("i:Q", title="output i", scale=alt.Scale(domain=[0, n], nice=False, reverse=True))
    cells = (
        alt.Chart(operator_frame(T))
        .mark_rect()
        .encode(
            x=x,
            x2="j1:Q",
            y=y,
            y2="i1:Q",
            color=alt.Color("log10|T|:Q", scale=alt.Scale(scheme="viridis", domain=[-4, 0.5], clamp=True)),
            tooltip=["i:Q", "j:Q", alt.Tooltip("value:Q", format=".3g")],
        )
    )
    box = (
        alt.Chart(pd.DataFrame({"j": [0], "j1": [t], "i": [t], "i1": [n]}))
        .mark_rect(fill=None, stroke="red", strokeWidth=2)
        .encode(x=x, x2="j1:Q", y=y, y2="i1:Q")
    )
    return alt.layer(cells, box).properties(width=size, height=size, title=title)


def spectra_chart(spectra: dict, t: int, tol: float = DEFAULT_TOL, width: int = 420, height: int = 220):
    """sigma_k(H_t) / sigma_1 of several operators at one cut, log scale, tolerance dashed.

    spectra: {name: (L, K) singular values of every cut (hankel_singular_values)}.
    Values below 1e-12 sigma_1 are round-off of exact zeros and are left out.
    """
    rows = []
    for name, sigma in spectra.items():
        s = np.asarray(sigma[t])
        s = s[s > 1e-12 * s[0]] / s[0] if len(s) and s[0] > 0 else s[:0]
        rows.append(pd.DataFrame({"operator": name, "k": np.arange(1, len(s) + 1), "ratio": s}))
    lines = (
        alt.Chart(pd.concat(rows))
        .mark_line(point=True)
        .encode(
            x=alt.X("k:Q", title="index k", scale=alt.Scale(domainMin=1, nice=False), axis=alt.Axis(format="d")),
            y=alt.Y("ratio:Q", scale=alt.Scale(type="log"), title="σₖ(Hₜ) / σ₁"),
            color=alt.Color("operator:N", sort=list(spectra)),
            strokeDash=alt.StrokeDash("operator:N", sort=list(spectra)),
            tooltip=["operator:N", "k:Q", alt.Tooltip("ratio:Q", format=".2e")],
        )
    )
    rule = alt.Chart(pd.DataFrame({"tol": [tol]})).mark_rule(strokeDash=[4, 3], color="gray").encode(y="tol:Q")
    return alt.layer(lines, rule).properties(
        width=width, height=height, title=f"Spectra of Hₜ at t = {t}; dashed: the tolerance {tol:g} · σ₁"
    )


def mixers_over_time(
    mixers: dict, title: str = "ESS over time", width: int = 420, height: int = 200, legend: bool = True
):
    """Tolerance-ESS(t) of several operators (DiagonalSSM or (1, L, L) tensors), with the
    bound min(t, L - t) dashed in grey."""
    rows, length = [], None
    for name, op in mixers.items():
        ess = tolerance_ess(op)[0].numpy()
        length = len(ess)
        rows.append(pd.DataFrame({"t": np.arange(length), "ESS": ess, "mixer": name}))
    t = np.arange(length)
    legend_spec = alt.Legend(orient="bottom", columns=2, title=None) if legend else None
    lines = (
        alt.Chart(pd.concat(rows))
        .mark_line(point=alt.OverlayMarkDef(size=12))
        .encode(
            x=alt.X("t:Q", title="cut t", scale=alt.Scale(domain=[0, length - 1], nice=False)),
            y=alt.Y("ESS:Q", title="tolerance-ESS(t)"),
            color=alt.Color("mixer:N", sort=list(mixers), legend=legend_spec),
            strokeDash=alt.StrokeDash("mixer:N", sort=list(mixers), legend=None),
            tooltip=["mixer:N", "t:Q", "ESS:Q"],
        )
    )
    bound = (
        alt.Chart(pd.DataFrame({"t": t, "bound": np.minimum(t, length - t)}))
        .mark_line(color="gray", strokeDash=[3, 3])
        .encode(x="t:Q", y="bound:Q")
    )
    return alt.layer(bound, lines).properties(width=width, height=height, title=title)


def small_multiples(draw, name: str, values, columns: int | None = None, **fixed):
    """``draw(**fixed, name=value)`` for each value, side by side with a shared y scale:
    the static copy of a slider. Each panel is titled ``name = value``."""
    charts = [draw(**{**fixed, name: value}).properties(title=f"{name} = {value}") for value in values]
    return alt.concat(*charts, columns=columns or len(charts)).resolve_scale(y="shared")


def slider_panel(draw, **sliders):
    """Sliders over ``draw(**values) -> chart``, redrawn as a PNG image widget on every move.

    ``sliders``: ipywidgets controls (their ``value`` is passed) or ``ipywidgets.fixed``
    values. The picture is an ``ipywidgets.Image`` set from Python (no Output widget
    capturing displays), so a headless run records one plain widget state. Needs a live
    kernel to move: a static render shows no figure for it, so pair it with
    ``small_multiples`` of the same ``draw``.
    """
    import ipywidgets as W

    controls = {name: w for name, w in sliders.items() if isinstance(w, W.ValueWidget)}
    fixed = {name: getattr(w, "value", w) for name, w in sliders.items() if name not in controls}
    image = W.Image(format="png")

    def redraw(_change=None):
        png = to_png(draw(**fixed, **{name: w.value for name, w in controls.items()}), scale=PNG_SCALE)
        image.width = str(int(png_width(png) / PNG_SCALE))
        image.value = png

    for w in controls.values():
        w.observe(redraw, names="value")
    redraw()
    return W.VBox([*controls.values(), image])


def cut_and_spectrum(T, t: int, name: str, tol: float = DEFAULT_TOL):
    """The operator with the cut H_t outlined, next to the singular values of H_t (counted
    ones in blue, those at or under tol * sigma_1 in grey)."""
    T = torch.as_tensor(T)
    sigma = hankel_singular_values(T[None], positions=[t])[0, 0].numpy()
    sigma = sigma[sigma > 1e-12 * sigma[0]] if len(sigma) and sigma[0] > 0 else sigma[:0]
    n_ess = int(tolerance_ess(T[None], positions=[t])[0, 0])
    frame = pd.DataFrame({"k": np.arange(1, len(sigma) + 1), "sigma": sigma, "counted": np.arange(len(sigma)) < n_ess})
    dots = (
        alt.Chart(frame)
        .mark_point(filled=True, size=40)
        .encode(
            x=alt.X("k:Q", scale=alt.Scale(domainMin=1, nice=False), axis=alt.Axis(tickMinStep=1, format="d")),
            y=alt.Y("sigma:Q", scale=alt.Scale(type="log"), title="σₖ(Hₜ)"),
            color=alt.Color(
                "counted:N", scale=alt.Scale(domain=[True, False], range=["#1f6fb4", "#bbbbbb"]), title="> tol"
            ),
            tooltip=["k:Q", alt.Tooltip("sigma:Q", format=".2e")],
        )
    )
    rule = (
        alt.Chart(pd.DataFrame({"tau": [tol * float(sigma[0]) if len(sigma) else tol]}))
        .mark_rule(strokeDash=[4, 3], color="gray")
        .encode(y="tau:Q")
    )
    spectrum = alt.layer(dots, rule).properties(width=200, height=170, title=f"tolerance-ESS({t}) = {n_ess}")
    return alt.hconcat(operator_chart(T, t, f"{name}: Hₜ at t = {t}", size=170), spectrum)


def whole_spectra_chart(operators: dict, title: str, width: int = 420, height: int = 200):
    """Singular values of each whole matrix T (not of a cut), log scale."""
    frame = pd.concat(
        [
            pd.DataFrame(
                {
                    "operator": name,
                    "k": np.arange(1, T.shape[0] + 1),
                    "sigma": torch.linalg.svdvals(torch.as_tensor(T)).numpy(),
                }
            )
            for name, T in operators.items()
        ]
    )
    length = int(frame["k"].max())
    return (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=alt.X("k:Q", scale=alt.Scale(domain=[1, length], nice=False)),
            y=alt.Y("sigma:Q", scale=alt.Scale(type="log"), title="σₖ(T), the whole matrix"),
            color=alt.Color("operator:N", sort=list(operators)),
            strokeDash=alt.StrokeDash("operator:N", sort=list(operators)),
        )
        .properties(width=width, height=height, title=title)
    )


def tolerance_sweep_chart(frame: pd.DataFrame, t: int, title: str, width: int = 420, height: int = 200):
    """ESS at one cut against a relative tolerance (columns tol, ESS, variant)."""
    return (
        alt.Chart(frame)
        .mark_line(point=True, interpolate="step-after")
        .encode(
            x=alt.X("tol:Q", title="relative tolerance", scale=alt.Scale(type="log", reverse=True)),
            y=alt.Y("ESS:Q", title=f"ESS at t = {t}"),
            color=alt.Color("variant:N", title=None),
            strokeDash=alt.StrokeDash("variant:N", title=None),
            tooltip=["variant:N", alt.Tooltip("tol:Q", format=".0e"), alt.Tooltip("ESS:Q", format=".2f")],
        )
        .properties(width=width, height=height, title=title)
    )


def pdf_page_points(path) -> tuple[float, float]:
    """(width, height) in points of the first MediaBox of a PDF file."""
    match = re.search(rb"/MediaBox\s*\[\s*([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s*\]", Path(path).read_bytes())
    if match is None:
        raise ValueError(f"{path}: no /MediaBox found (not a PDF page?)")
    x0, y0, x1, y1 = (float(v) for v in match.groups())
    return x1 - x0, y1 - y0


def export_figure(chart, stem: str, folder="figures") -> None:
    """Write ``folder/stem.pdf`` and ``.svg`` (vector, vl-convert, offline), show a PNG of
    the figure and print the files with the PDF's page size in points."""
    folder = Path(folder)
    paths = [save_figure(chart, folder / f"{stem}{suffix}") for suffix in (".pdf", ".svg")]
    show(chart)  # a sharp PNG at the figure's own size
    width, height = pdf_page_points(paths[0])
    print(f"wrote {paths[0].as_posix()} ({width:.0f} x {height:.0f} pt) and {paths[1].as_posix()}")
