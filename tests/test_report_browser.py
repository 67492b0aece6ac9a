"""The standalone report in a real headless Chromium, with every network request blocked:
the linked views draw, a click on the ESS chart moves the H_t outline (the views link in
the browser, no Python), and nothing is logged as an error. Screenshots of the report and
of a PDF figure go to test-artifacts/ for a human to look at.

Needs Debian's chromium at /usr/bin/chromium (never `playwright install`)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from _browser import ARGS, CHROMIUM, require_browser

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"

pytestmark = [pytest.mark.browser]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from ess_explorer.app.report import write_report
    from ess_explorer.synthetic import reference_result

    result = reference_result()
    result.meta["prompt"] = " ".join(result.tokens)
    return write_report(result, tmp_path_factory.mktemp("report") / "report.html", layer=2)


@pytest.fixture(scope="module")
def browser_page(tmp_path_factory):
    _, sync_api = require_browser()
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=str(CHROMIUM),
            headless=True,
            args=ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()


def _mark_counts(page) -> dict:
    """Vega's SVG renderer: one <g class="mark-TYPE role-mark ..."> per mark, items inside."""
    return page.evaluate(
        """() => {
            const out = {};
            for (const g of document.querySelectorAll('#ess-explorer svg g.role-mark')) {
                const type = [...g.classList].find(c => c.startsWith('mark-'));
                out[type] = (out[type] || 0) + g.querySelectorAll('path, line, text, rect').length;
            }
            return out;
        }"""
    )


def _outline_path(page) -> str:
    """The H_t outline: the only rect mark whose stroke is the selection red."""
    return page.evaluate(
        """() => {
            for (const p of document.querySelectorAll('#ess-explorer svg g.mark-rect path')) {
                if ((p.getAttribute('stroke') || '').toLowerCase() === '#d62728' && p.getAttribute('fill') === 'none'
                    || (p.getAttribute('stroke') || '').toLowerCase() === '#d62728' && !p.getAttribute('fill')) {
                    return p.getAttribute('d') + '|' + (p.getAttribute('transform') || '');
                }
            }
            return null;
        }"""
    )


def test_report_renders_offline_and_links_views(report, browser_page):
    page = browser_page.new_page()
    blocked, errors = [], []
    # Block everything that is not the file itself: an accidental CDN script would fail here.
    page.route(
        "**/*",
        lambda route: (
            route.continue_()
            if route.request.url.startswith(("file:", "data:", "blob:"))
            else (blocked.append(route.request.url), route.abort())[1]
        ),
    )
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(report.as_uri())
    page.wait_for_selector("#ess-explorer svg g.mark-rect path", timeout=30_000)
    page.wait_for_timeout(300)

    counts = _mark_counts(page)
    assert counts.get("mark-line", 0) >= 2, counts  # ESS and TSS over time, spectrum stems
    assert counts.get("mark-rect", 0) >= 100, counts  # operator heatmap + overview cells
    assert counts.get("mark-symbol", 0) >= 40, counts  # points over t and the spectrum
    assert counts.get("mark-text", 0) >= 1, counts
    assert page.locator("table").count() >= 2 and page.locator("a[download='result.npz']").count() == 1

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)

    # Linked views: a click on the ESS-over-time chart moves the H_t outline of the operator.
    before = _outline_path(page)
    assert before, "no H_t outline drawn"
    top = page.locator("#ess-explorer svg").first.bounding_box()
    moved = False
    for fraction in (0.2, 0.8, 0.5):
        page.mouse.click(top["x"] + 60 + fraction * 700, top["y"] + 140)
        page.wait_for_timeout(200)
        if _outline_path(page) != before:
            moved = True
            break
    assert moved, "clicking on the ESS chart did not move the H_t outline"
    page.screenshot(path=str(ARTIFACTS / "report-after-click.png"), full_page=False)
    assert blocked == [], f"the report tried to reach the network: {blocked[:3]}"
    assert errors == [], errors


def _write_png(path: Path, pixels) -> None:
    """A minimal RGB(A) PNG writer (no Pillow here): pixels (H, W, C) uint8."""
    import numpy as np

    pixels = np.ascontiguousarray(pixels[..., :4] if pixels.shape[-1] >= 4 else pixels[..., :3])
    height, width, channels = pixels.shape
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    colour = {3: 2, 4: 6}[channels]
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def test_pdf_figure_screenshot(tmp_path):
    """Render PDF figures as a reader would see them (pypdfium2 at 4x) for a visual check;
    without pypdfium2 the 300 ppi PNG export stands in."""
    import numpy as np

    from ess_explorer import figure, save_figure
    from ess_explorer.synthetic import reference_result

    result = reference_result()
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        import pypdfium2 as pdfium
    except ImportError:
        pdfium = None
    for kind, kw in {"ess_time": {}, "operator": {"layer": 2, "t": 20}}.items():
        chart = figure(result, kind, **kw)
        pdf = save_figure(chart, ARTIFACTS / f"figure-{kind}.pdf")
        if pdfium is None:
            save_figure(chart, ARTIFACTS / f"figure-{kind}-pdf.png")
            continue
        page = pdfium.PdfDocument(pdf.read_bytes())[0]
        rgb = np.ascontiguousarray(page.render(scale=4).to_numpy()[..., [2, 1, 0]])  # pdfium gives BGR(A)
        _write_png(ARTIFACTS / f"figure-{kind}-pdf.png", rgb)
        inked = (rgb < 235).any(-1).mean()
        assert 0.02 < inked < 0.9


SHOTS = Path("/tmp/shots-h26")


def test_report_fits_900_px_and_shows_the_layer_picked_in_the_overview(report, browser_page):
    """At a 900 px window the page never scrolls sideways (the charts, the table and the
    tokens stay inside it), and a click on another layer's row of the overview redraws the
    detail views for that layer, in the browser alone."""
    page = browser_page.new_page()
    page.set_viewport_size({"width": 900, "height": 900})
    errors = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(report.as_uri())
    page.wait_for_selector("#ess-explorer svg g.mark-rect path", timeout=30_000)
    page.wait_for_timeout(300)
    width, inner = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert width <= inner, f"the page scrolls sideways: {width} px of content in a {inner} px window"
    chart = page.locator("#ess-explorer svg").first.bounding_box()
    assert chart["x"] >= 0 and chart["x"] + chart["width"] <= inner
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / "report-900.png"), full_page=True)

    def subtitle() -> list[str]:
        return page.evaluate(
            "() => [...document.querySelectorAll('#ess-explorer svg text')].map(t => t.textContent)"
            ".filter(t => t.startsWith('layer '))"
        )

    assert page.evaluate("() => document.getElementById('ess-explorer').dataset.layer") == "2"
    assert subtitle()[0].startswith("layer 2 (mamba)")
    # the overview cell of layer 0 at t = 10, found by its accessible label, scrolled into view
    centre = page.evaluate(
        """() => { for (const p of document.querySelectorAll('#ess-explorer svg g.mark-rect path')) {
            const a = p.getAttribute('aria-label') || '';
            if (a.includes('layer: 0 · softmax attention') && a.includes('t: 10;')) {
                p.scrollIntoView({block: 'center'}); const r = p.getBoundingClientRect();
                return [r.x + r.width / 2, r.y + r.height / 2]; } }
            return null; }"""
    )
    assert centre, "no overview cell for layer 0"
    page.mouse.click(*centre)
    page.wait_for_function("() => document.getElementById('ess-explorer').dataset.layer === '0'", timeout=10_000)
    page.wait_for_timeout(300)
    assert subtitle()[0].startswith("layer 0 (softmax_attention)")
    assert page.locator("#ess-shown").text_content() == "0"
    page.screenshot(path=str(SHOTS / "report-900-layer0.png"), full_page=False)
    assert errors == [], errors
