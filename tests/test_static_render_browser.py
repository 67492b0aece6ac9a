"""Static renders: a notebook with explorers, executed with its widget state saved and
converted to HTML by nbconvert, viewed in headless Chromium with every network request
blocked, shows a drawn figure in each explorer's cell (the saved widget view cannot draw
offline) at its CSS size, not twice it."""

from __future__ import annotations

import nbformat
import pytest
from _browser import ARGS, require_browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CELLS = [
    # a result opened directly: drawn in the constructor
    "from ess_explorer import explore\n"
    "from ess_explorer.synthetic import reference_result\n"
    "explore(result=reference_result(24), layer=1)",
    # a model analysed in the background: wait for it before displaying (docs/README)
    "ex = explore('zoo:mamba2_n2', cache=False)\nex.wait()\nex",
]


@pytest.fixture(scope="module")
def html_page(tmp_path_factory):
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code) for code in CELLS])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(notebook, timeout=240, store_widget_state=True, kernel_name="python3").execute()
    state = notebook.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state")
    assert state, "the executed notebook saved its widget state (the case that used to render blank)"
    page, _ = HTMLExporter().from_notebook_node(notebook)
    path = tmp_path_factory.mktemp("static") / "explorer.html"
    path.write_text(page, encoding="utf-8")
    return path


def test_every_explorer_cell_shows_its_figure_offline(html_page):
    chromium, sync_api = require_browser()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            fetched = []

            def block(route):
                if route.request.url.startswith("file:"):
                    return route.continue_()
                fetched.append(route.request.url)
                return route.abort()

            page.route("**/*", block)
            page.goto(html_page.as_uri(), wait_until="load")
            page.wait_for_timeout(1500)  # whatever scripts could still run
            cells = page.evaluate("""() => [...document.querySelectorAll('.jp-CodeCell')].map(cell => ({
                widget: cell.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').length,
                images: [...cell.querySelectorAll('.jp-OutputArea img')].map(img => {
                    const box = img.getBoundingClientRect();
                    return {drawn: img.complete && img.naturalWidth > 0, visible: box.width > 0 && box.height > 0,
                            natural: img.naturalWidth, shown: box.width};
                }),
            }))""")
        finally:
            browser.close()
    assert len(cells) == len(CELLS)
    for index, cell in enumerate(cells):
        assert cell["widget"] == 1, f"cell {index}: the saved widget view is in the page (and cannot draw offline)"
        visible = [img for img in cell["images"] if img["drawn"] and img["visible"]]
        assert visible, f"cell {index}: no figure drawn where the widget is: {cell['images']}"
        for img in visible:
            assert img["shown"] == pytest.approx(img["natural"] / 2, abs=1), "shown at its CSS size, not twice"
    assert fetched, "the page tried the network (the widget manager) and was refused"
