"""Publication figures: every kind exports to a valid PDF, SVG and PNG at paper size, with
the paper theme (fonts, palette, no titles), and the data in the figures is right."""

from __future__ import annotations

import copy
import json
import re
import struct
import xml.etree.ElementTree as ET
import zlib

import numpy as np
import pytest

from ess_explorer.synthetic import reference_result
from ess_explorer.views import figures
from ess_explorer.views.figures import OKABE_ITO, PAPER_WIDTHS, figure
from ess_explorer.views.render import save_figure


@pytest.fixture(scope="module")
def ref():
    return reference_result()


@pytest.fixture(scope="module")
def other(ref):
    res = reference_result(seed=3)
    res.meta["model_id"] = "synthetic:other"
    return res


# ---- decoders that check what a viewer would check -----------------------------------
def png_pixels(data: bytes) -> tuple[int, int, np.ndarray]:
    """(width, height, (H, W, channels) uint8) of an 8-bit non-interlaced PNG, decoded
    with zlib and the PNG filters: a PNG that does not decode fails here."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in chunk {kind!r}"
        chunks.append((kind, body))
        pos += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert depth == 8 and interlace == 0
    channels = {2: 3, 6: 4, 0: 1, 4: 2}[colour]
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    stride = width * channels
    assert len(raw) == height * (stride + 1), "IDAT size does not match the header"
    out = np.zeros((height, stride), dtype=np.int32)
    prev = np.zeros(stride, dtype=np.int32)
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(height, stride + 1)
    for y in range(height):
        ftype, line = rows[y, 0], rows[y, 1:].astype(np.int32)
        if ftype == 0:
            cur = line
        elif ftype == 2:
            cur = (line + prev) % 256
        else:  # filters 1, 3, 4 depend on the left pixel: decode byte by byte
            cur = np.zeros(stride, dtype=np.int32)
            for x in range(stride):
                left = cur[x - channels] if x >= channels else 0
                up, ul = prev[x], prev[x - channels] if x >= channels else 0
                if ftype == 1:
                    pred = left
                elif ftype == 3:
                    pred = (left + up) // 2
                else:
                    p = left + up - ul
                    pa, pb, pc = abs(p - left), abs(p - up), abs(p - ul)
                    pred = left if pa <= pb and pa <= pc else (up if pb <= pc else ul)
                cur[x] = (line[x] + pred) % 256
        out[y], prev = cur, cur
    return width, height, out.reshape(height, width, channels).astype(np.uint8)


def check_pdf(data: bytes) -> tuple[float, float, float | None]:
    """(width pt, height pt, fraction of non-white pixels) of a one-page PDF. The page is
    opened and rendered with pdfium when pypdfium2 is installed (a test dependency);
    without it only the structure is checked and the fraction is None."""
    assert data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF")
    try:
        import pypdfium2 as pdfium
    except ImportError:
        boxes = re.findall(rb"/MediaBox\s*\[\s*0 0 ([0-9.]+) ([0-9.]+)\s*\]", data)
        assert len(boxes) == 1, "expected one page"
        return float(boxes[0][0]), float(boxes[0][1]), None
    doc = pdfium.PdfDocument(data)
    assert len(doc) == 1
    page = doc[0]
    width, height = page.get_size()
    pixels = page.render(scale=1).to_numpy()
    inked = float((pixels[..., :3] < 235).any(-1).mean())
    return width, height, inked


def check_svg(data: bytes) -> ET.Element:
    root = ET.fromstring(data)
    assert root.tag.endswith("svg")
    return root


# figure kind -> options; the same set the CLI exposes.
CASES = {
    "ess_time": dict(),
    "spectrum": dict(layer=0, positions=[12, 24, 36]),
    "operator": dict(layer=2, t=20),
    "overview": dict(),
    "utilisation": dict(),
    "diagnostics": dict(),
}


@pytest.fixture(scope="module")
def charts_by_kind(ref, other):
    built = {kind: figure(ref, kind, **kw) for kind, kw in CASES.items()}
    built["compare"] = figure({"A": ref, "B": other}, "compare", width="double")
    return built


def test_every_kind_is_covered():
    assert set(CASES) | {"compare"} == set(figures.KINDS)
    assert {"ess_time", "spectrum", "operator", "overview", "utilisation", "compare"} <= set(figures.KINDS)


@pytest.mark.parametrize("kind", list(CASES) + ["compare"])
def test_kind_exports_valid_pdf_svg_png(kind, charts_by_kind, tmp_path):
    chart = charts_by_kind[kind]
    target = PAPER_WIDTHS["double" if kind == "compare" else "single"]

    pdf = save_figure(chart, tmp_path / f"{kind}.pdf").read_bytes()
    width, height, inked = check_pdf(pdf)
    # Single views fit exactly; concatenated panels are padded to about the target.
    assert (
        (abs(width - target) < 1) if kind not in ("compare", "diagnostics") else (0.7 * target < width < 1.25 * target)
    )
    assert 60 < height < width * 1.2
    assert inked is None or 0.02 < inked < 0.9, f"{kind}: a blank or solid page ({inked:.3f} inked)"

    root = check_svg(save_figure(chart, tmp_path / f"{kind}.svg").read_bytes())
    assert abs(float(root.get("width")) - width) < 1
    assert len(root.findall(".//{http://www.w3.org/2000/svg}path")) >= 5

    png = save_figure(chart, tmp_path / f"{kind}.png", ppi=108).read_bytes()
    pw, ph, pixels = png_pixels(png)
    assert abs(pw - 1.5 * width) <= 2 and abs(ph - 1.5 * height) <= 2  # 108 ppi = 1.5 px per point
    assert (pixels[..., :3] < 235).any(-1).mean() > 0.02


def test_paper_theme_fonts_palette_and_no_titles(ref, tmp_path):
    serif = save_figure(figure(ref, "ess_time"), tmp_path / "a.svg").read_text()
    sans = save_figure(figure(ref, "ess_time", font="sans"), tmp_path / "b.svg").read_text()
    assert "Liberation Serif" in serif and "Liberation Sans" not in serif
    assert "Liberation Sans" in sans
    # Four layers: the first four Okabe-Ito colours, each once per series.
    strokes = set(re.findall(r'stroke="(#[0-9A-Fa-f]{6})"', serif))
    assert {c.lower() for c in OKABE_ITO[:4]} <= {c.lower() for c in strokes}
    sizes = {float(s) for s in re.findall(r'font-size="([0-9.]+)px"', serif)}
    assert sizes and max(sizes) <= 9.0 and min(sizes) >= 6.0, sizes  # print sizes in points
    for kind in ("operator", "overview", "spectrum", "diagnostics"):  # widget views lose their titles
        spec = figure(ref, kind, **CASES.get(kind, {})).to_dict()
        assert '"title": {"text"' not in json.dumps(spec) and "subtitle" not in json.dumps(spec)


def test_double_width_and_explicit_points(ref, tmp_path):
    width, _, _ = check_pdf(save_figure(figure(ref, "ess_time", width="double"), tmp_path / "d.pdf").read_bytes())
    assert abs(width - 504) < 1
    width, height, _ = check_pdf(
        save_figure(figure(ref, "overview", width=300, height=120), tmp_path / "e.pdf").read_bytes()
    )
    assert abs(width - 300) < 1 and abs(height - 120) < 1


def test_ess_time_data_matches_closed_forms(ref):
    frame = figures.ess_over_time_frame(ref, layers=[1, 3])
    conv = frame[frame.layer == 1].set_index("t")["ess"]
    # short conv k = 4: ESS = k - 1 = 3 once min(t, L - t) >= 3 (docs/math.md)
    interior = [t for t in conv.index if min(t, ref.length - t) >= 3]
    assert np.allclose(conv.loc[interior], 3.0)
    lin = frame[frame.layer == 3].set_index("t")["ess"]
    assert (lin <= np.minimum(4, np.minimum(lin.index, ref.length - lin.index)) + 1e-9).all()
    assert set(frame["series"]) == {"layer 1 (short conv)", "layer 3 (linear attention)"}
    total = figures.ess_over_time_frame(ref, layers=[2], unit="sum")
    assert np.allclose(total["ess"], ref.layer(2).tolerance_ess.sum(0))


def test_overlays_name_series_by_model_and_layer(ref, other):
    frame = figures.ess_over_time_frame({"A": ref, "B": other}, layers=[2])
    assert set(frame["series"]) == {"A", "B"}
    frame = figures.ess_over_time_frame({"A": ref, "B": other}, layers=[0, 2])
    assert "A · layer 0" in set(frame["series"]) and "B · layer 2" in set(frame["series"])
    same = figures.ess_over_time_frame([ref, ref], layers=[0])
    assert len(set(same["model"])) == 2  # duplicate labels are told apart


def test_spectrum_overlay_points_match_tolerance_ess(ref):
    lay = ref.layer(0)
    spec = figure(ref, "spectrum", layer=0, unit=1, positions=[10, 30]).to_dict()
    values = [v for name, data in spec["datasets"].items() for v in data if "sigma" in v]
    tol = ref.meta["tol"]
    for t in (10, 30):
        mine = [v for v in values if v["series"].startswith(f"t = {t} ")]
        assert mine and max(v["sigma"] for v in mine) == pytest.approx(1.0)  # normalised by sigma_1
        assert sum(v["sigma"] > tol for v in mine) == lay.tolerance_ess[1, t]


def test_operator_outlines_the_requested_cut(ref):
    spec = json.dumps(figure(ref, "operator", layer=2, t=20).to_dict())
    assert '"value": [{"t": 20}]' in spec


def test_bad_input_gives_clear_errors(ref, tmp_path):
    with pytest.raises(ValueError, match="unknown figure kind 'pie'.*ess_time"):
        figure(ref, "pie")
    with pytest.raises(ValueError, match="takes no option colour"):
        figure(ref, "ess_time", colour="red")
    with pytest.raises(ValueError, match=r"layers \[9\] were not analysed"):
        figure(ref, "ess_time", layers=[9])
    with pytest.raises(ValueError, match="width must be"):
        figure(ref, "ess_time", width="triple")
    with pytest.raises(ValueError, match="shows one result"):
        figure([ref, ref], "overview")
    with pytest.raises(ValueError, match="position 5 was not computed|t must be"):
        stripped = copy.deepcopy(ref)
        stripped.layers[0].positions = stripped.layers[0].positions + 100
        figure(stripped, "spectrum", layer=0, positions=[5, 6])
    empty = copy.deepcopy(ref)
    for lay in empty.layers.values():
        lay.operators = {}
    with pytest.raises(ValueError, match="no layer kept an operator"):
        figure(empty, "operator")
    with pytest.raises(ValueError, match=r"\.pdf, \.svg or \.png"):
        save_figure(figure(ref, "overview"), tmp_path / "fig.jpeg")
    different = copy.deepcopy(ref)
    different.meta["prompt"], ref_copy = "another prompt", copy.deepcopy(ref)
    ref_copy.meta["prompt"] = "a prompt"
    with pytest.raises(ValueError, match="one prompt"):
        figure([ref_copy, different], "compare")
    with pytest.raises(ValueError, match="needs an ESSResult"):
        figure("result.npz", "overview")


def test_default_series_labels_are_short(ref):
    a, b = copy.deepcopy(ref), copy.deepcopy(ref)
    a.meta["model_id"], a.meta["source"] = "/abs/path/to/zoo/mamba2_n16", "zoo:mamba2_n16"
    b.meta["model_id"] = "/abs/path/to/lfm2"
    b.meta.pop("source", None)
    frame = figures.ess_over_time_frame([a, b], layers=[0])
    assert set(frame["model"]) == {"zoo:mamba2_n16", "lfm2"}


def test_utilisation_bars_and_dots_share_the_legend_order(ref, other):
    spec = figure({"zeta": ref, "alpha": other}, "utilisation").to_dict()
    offsets = [layer["encoding"]["xOffset"] for layer in spec["layer"] if "xOffset" in layer.get("encoding", {})]
    assert len(offsets) == 2 and all(o["scale"]["domain"] == ["zeta", "alpha"] for o in offsets)
    per_layer, per_unit = figures.layer_summary_frame({"zeta": ref}, reduce="mean")
    assert len(per_unit) == sum(lay.n_units for lay in ref.layers.values())
    for i, lay in ref.layers.items():  # the bar is the mean of its units' dots
        units = per_unit[per_unit.layer == i]["utilisation"]
        assert per_layer.set_index("layer").loc[i, "utilisation"] == pytest.approx(units.mean())


def test_paperise_resolves_widget_highlights(ref):
    spec = figure(ref, "overview").to_dict()
    enc, mark = spec["encoding"], spec["mark"]
    assert "condition" not in json.dumps(enc)  # the selected layer's red outline is gone
    assert mark["x2Offset"] == 0.5  # cells overlap: no white seams between them
    spectrum = figure(ref, "spectrum", layer=0, t=20).to_dict()
    log_axes = [
        layer["encoding"]["y"].get("axis", {})
        for layer in spectrum["layer"]
        if (layer.get("encoding", {}).get("y", {}).get("scale") or {}).get("type") == "log"
    ]
    assert log_axes and all(axis.get("grid") is False for axis in log_axes)
    texts = [layer for layer in spectrum["layer"] if (layer.get("mark") or {}).get("type") == "text"]
    assert all(float(t["mark"].get("fontSize", 0)) <= 8 for t in texts)


def test_ess_time_marks_separators(ref):
    spec = figure(ref, "ess_time", layers=[2]).to_dict()
    rules = [v["t"] for data in spec["datasets"].values() for v in data if set(v) == {"t"}]
    assert rules == ref.meta["separators"]
    bare = copy.deepcopy(ref)
    bare.meta.pop("separators")  # found from the tokens ("|") instead
    spec = figure(bare, "ess_time", layers=[2], separators="|").to_dict()
    assert [v["t"] for data in spec["datasets"].values() for v in data if set(v) == {"t"}] == ref.meta["separators"]
    spec = figure(ref, "ess_time", layers=[2], separators=False).to_dict()
    assert not [v for data in spec["datasets"].values() for v in data if set(v) == {"t"}]
