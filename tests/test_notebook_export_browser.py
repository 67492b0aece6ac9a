"""The teaching notebook exported to HTML (scripts/export_notebook.py) renders its math with
no network: viewed in headless Chromium with every request blocked, each $...$ of its
markdown is typeset (MathJax, inlined), none is left as raw text and none is a TeX error."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest
from _browser import launch, require_browser

pytestmark = [pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "01_what_is_ess.ipynb"
SHOTS = Path("/tmp/shots-h26")


def _exporter():
    spec = importlib.util.spec_from_file_location("export_notebook", ROOT / "scripts" / "export_notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _math_spans(notebook) -> int:
    """$...$ and $$...$$ spans of the markdown cells (what MathJax must typeset)."""
    text = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
    display = re.findall(r"\$\$.+?\$\$", text, re.S)
    inline = re.findall(r"(?<![\\$])\$(?!\$)[^$]+?\$", re.sub(r"\$\$.+?\$\$", "", text, flags=re.S))
    return len(display) + len(inline)


def test_the_exported_lecture_typesets_its_math_offline(tmp_path):
    _, sync_api = require_browser()
    page_html = _exporter().offline_html(NOTEBOOK)
    assert "cdnjs.cloudflare.com/ajax/libs/mathjax" not in page_html
    path = tmp_path / "01.html"
    path.write_text(page_html, encoding="utf-8")
    expected = _math_spans(nbformat.read(NOTEBOOK, as_version=4))
    assert expected >= 20
    with sync_api.sync_playwright() as p:
        context = launch(p, tmp_path / "profile", 1100, 900)
        try:
            page = context.new_page()
            errors = []
            page.route(
                "**/*",
                lambda route: route.continue_() if route.request.url.startswith(("file:", "data:")) else route.abort(),
            )
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(path.as_uri())
            page.wait_for_function(
                f"() => document.querySelectorAll('mjx-container').length >= {expected}", timeout=60_000
            )
            raw = page.evaluate(
                "() => [...document.querySelectorAll('.jp-RenderedMarkdown')].map(e => e.innerText).join('').split('$').length - 1"
            )
            failed = page.evaluate("() => document.querySelectorAll('mjx-merror, [data-mjx-error]').length")
            SHOTS.mkdir(exist_ok=True)
            page.screenshot(path=str(SHOTS / "01-offline-math.png"), full_page=False)
        finally:
            context.close()
    assert raw == 0, f"{raw} '$' left as text: math not typeset"
    assert failed == 0, f"{failed} formulas did not compile"
    assert errors == [], errors
