"""Exported figures are print-ready: measured in the PDF itself (pdfium), every kind at single
and double width fits its width, uses one font family, has no text below 7 pt and no two
labels drawn over each other; legends use words, not code names."""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import re

import numpy as np
import pytest
from _deep import deep_result, shaped_result

from ess_explorer.sweep import advise
from ess_explorer.synthetic import reference_result
from ess_explorer.views.figures import PAPER_WIDTHS, figure
from ess_explorer.views.render import figure_bytes

pdfium = pytest.importorskip("pypdfium2")
raw = pytest.importorskip("pypdfium2.raw")

CASES = {
    "ess_time": dict(),
    "spectrum": dict(layer=0, positions=[12, 24, 36]),
    "spectrum_one_t": dict(layer=0, t=20),
    "operator": dict(layer=2, t=20),
    "overview": dict(),
    "utilisation": dict(),
    "diagnostics": dict(),
    "compare": dict(),
    "advice": dict(),
}
# The same kinds on a result as deep and long as a real LLM's (30 layers, 523 tokens).
DEEP_CASES = {
    **CASES,
    "spectrum": dict(layer=12, positions=[100, 260, 400]),
    "spectrum_one_t": dict(layer=12, t=200),
    "operator": dict(layer=25, t=200),
}


@pytest.fixture(scope="module")
def results():
    ref = reference_result()
    other = reference_result(seed=3)
    other.meta["model_id"] = "synthetic:other"
    return ref, other


def pdf_text(data: bytes) -> tuple[tuple[float, float], list[dict]]:
    """(page size in pt, one dict per drawn character: char, font (base name without the
    subset tag), size (pt), box (left, bottom, right, top))."""
    page = pdfium.PdfDocument(data)[0]
    text = page.get_textpage()
    buf, flags = ctypes.create_string_buffer(256), ctypes.c_int()
    chars = []
    for i in range(raw.FPDFText_CountChars(text)):
        char = chr(raw.FPDFText_GetUnicode(text, i))
        if char.isspace():
            continue
        n = raw.FPDFText_GetFontInfo(text, i, buf, 256, ctypes.byref(flags))
        name = buf.raw[: max(n - 1, 0)].decode()
        chars.append(
            {
                "char": char,
                "font": name.split("+", 1)[-1],
                "size": raw.FPDFText_GetFontSize(text, i),
                "box": text.get_charbox(i),
            }
        )
    return page.get_size(), chars


def collisions(data: bytes, pad: float = 0.5) -> list[tuple[str, str]]:
    """Pairs of text runs whose boxes overlap by more than ``pad`` pt both ways."""
    text = pdfium.PdfDocument(data)[0].get_textpage()
    runs = [(text.get_text_bounded(*text.get_rect(i)), text.get_rect(i)) for i in range(text.count_rects())]
    out = []
    for i, (a, (l1, b1, r1, t1)) in enumerate(runs):
        for b, (l2, b2, r2, t2) in runs[i + 1 :]:
            if min(r1, r2) - max(l1, l2) > pad and min(t1, t2) - max(b1, b2) > pad:
                out.append((a, b))
    return out


def build(kind: str, width: str, results, cases=CASES):
    ref, other = results
    if kind == "compare":
        return figure({"model A": ref, "model B": other}, "compare", width=width)
    if kind == "advice":  # two runs of four layers of every kind: eight rows
        return figure(advise([ref, other], n_boot=20), "advice", width=width)
    return figure(ref, kind.replace("_one_t", ""), width=width, **cases[kind])


@pytest.mark.parametrize("width", ["single", "double"])
@pytest.mark.parametrize("kind", list(CASES))
def test_pdf_fits_width_one_font_no_small_text_no_collisions(kind, width, results):
    check_print(kind, width, figure_bytes(build(kind, width, results), "pdf"))


@pytest.mark.parametrize("width", ["single", "double"])
@pytest.mark.parametrize("kind", list(DEEP_CASES))
def test_a_30_layer_523_token_result_prints_every_kind(kind, width):
    deep = deep_result()
    other = dataclasses.replace(deep, meta={**deep.meta, "model_id": "synthetic:other"})
    check_print(kind, width, figure_bytes(build(kind, width, (deep, other), DEEP_CASES), "pdf"))


@pytest.mark.parametrize("kind", ["ess_time", "overview", "diagnostics", "utilisation", "compare"])
def test_64_layers_of_4096_tokens_print_every_layer_view(kind):
    shaped = shaped_result(64, 4096)
    chart = figure({"a": shaped, "b": shaped} if kind == "compare" else shaped, kind, width="single")
    check_print(kind, "single", figure_bytes(chart, "pdf"))


def check_print(kind: str, width: str, data: bytes) -> None:
    (page_w, page_h), chars = pdf_text(data)
    target = PAPER_WIDTHS[width]
    assert target - 2 <= page_w <= target, f"{kind} at {width}: page {page_w} pt wide for a {target} pt column"
    assert 60 < page_h < 1.2 * max(page_w, 240)
    assert chars, "no text drawn"
    families = {c["font"] for c in chars}
    assert len(families) == 1, f"{kind}: several fonts {families} (a glyph missing from the paper font?)"
    assert families == {"LiberationSerif"}
    small = sorted({(c["char"], round(c["size"], 2)) for c in chars if c["size"] < 7 - 1e-6})
    assert not small, f"{kind}: text below 7 pt: {small[:5]}"
    assert max(c["size"] for c in chars) <= 9 + 1e-6
    assert not collisions(data), f"{kind} at {width}: labels drawn over each other: {collisions(data)[:3]}"
    drawn = "".join(c["char"] for c in chars)
    assert "_" not in drawn, f"{kind}: a code name in the figure: {drawn}"


def test_sans_figures_use_the_sans_family_only(results):
    _, chars = pdf_text(figure_bytes(figure(results[0], "spectrum", layer=0, t=20, font="sans"), "pdf"))
    assert {c["font"] for c in chars} == {"LiberationSans"}


def test_collision_check_sees_overlapping_labels():
    """The collision measure itself: two labels placed on the same spot are found."""
    import altair as alt

    chart = (
        alt.Chart(alt.InlineData(values=[{"a": "overlap here"}, {"a": "and here too"}]))
        .mark_text(fontSize=9)
        .encode(text="a:N", x=alt.value(50), y=alt.value(20))
        .properties(width=100, height=40)
    )
    assert collisions(figure_bytes(chart, "pdf"))


def test_spectrum_drops_round_off_and_fits_its_log_axis():
    res = copy.deepcopy(reference_result())
    lay = res.layer(0)
    row = int(np.flatnonzero(np.asarray(lay.positions) == 24)[0])
    sigma = np.asarray(lay.singular_values[1, row], dtype=np.float64)
    sigma[3:] = 0.0
    sigma[3] = 1e-18 * sigma[0]  # a rank-3 cut's round-off: not a singular value
    lay.singular_values[1, row] = sigma
    spec = figure(res, "spectrum", layer=0, unit=1, positions=[24, 36]).to_dict()
    values = [v for data in spec["datasets"].values() for v in data if "sigma" in v]
    mine = [v["sigma"] for v in values if v["series"].startswith("t = 24 ")]
    assert len(mine) == 3 and min(mine) > 1e-12
    shown = [v["sigma"] for v in values]
    y = next(layer["encoding"]["y"] for layer in spec["layer"] if "sigma" in str(layer.get("encoding", {}).get("y")))
    low, high = y["scale"]["domain"]
    # the decades the data and the drawn tolerance span, no more
    floor = min(min(shown), res.meta["tol"])
    assert high == 1.0 and low <= floor < 10 * low


def test_ess_time_labels_its_separator_rules():
    res = reference_result()
    _, chars = pdf_text(figure_bytes(figure(res, "ess_time", layers=[2]), "pdf"))
    assert re.search("separator", "".join(c["char"] for c in chars))
