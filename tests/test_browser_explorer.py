"""The explorer in a real browser, in each frontend that serves notebooks from
jupyter_server: JupyterLab and Jupyter Notebook 7, each on 127.0.0.1 (a random free port),
opening a notebook that calls explore(), in headless Debian Chromium driven by Playwright.

Checks, the same in both frontends: the linked views render, with no request leaving
127.0.0.1 (the widget JS comes from vl-convert, not a CDN) and no visible static image; a
click on ESS over time changes the spectrum view (in the browser); choosing another layer
in the dropdown redraws the views, and the status line carries no warning; the notebook's
``ex = explore()`` (assigned) shows exactly one explorer. In JupyterLab with the file browser
open at 1366 x 900 the explorer fits its output area, and at 1100 x 900 nothing of it is out
of reach (its panels stack and narrow; what has not narrowed yet scrolls in its box).
Screenshots go to test-artifacts/explorer-lab.png, explorer-notebook7.png,
explorer-lab-<width>.png (the page at <width> x 900) and explorer-lab-<width>-whole.png (the
explorer alone).
Run: .venv/bin/python -m pytest tests/test_browser_explorer.py -m browser -q
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from _browser import ARGS, CHROMIUM, missing, require_browser

pytestmark = [pytest.mark.browser, pytest.mark.timeout(170)]

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = Path(__file__).parent / "notebooks" / "explorer.ipynb"
ARTIFACTS = ROOT / "test-artifacts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Frontend:
    module: str  # run as `python -m <module>`: the frontend's server extension on jupyter_server
    expose_app: str  # the option that puts the app on window.jupyterapp, so the test can drive it
    path: str  # where the frontend opens the fixture notebook
    kernel_idle: str  # JS: the open notebook's kernel is started and idle
    run_all: str  # JS: run every cell of the open notebook


# Notebook 7 is built from JupyterLab's packages: its shell and commands answer the same calls,
# so only the server module, the option name and the URL differ.
_KERNEL_IDLE = (
    "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
    " return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
    " && w.sessionContext.session.kernel.status === 'idle'; }"
)
_RUN_ALL = "window.jupyterapp.commands.execute('notebook:run-all-cells')"
FRONTENDS = {
    "lab": Frontend(
        module="jupyterlab",
        expose_app="--LabApp.expose_app_in_browser=True",
        path="/lab/tree/explorer.ipynb",
        kernel_idle=_KERNEL_IDLE,
        run_all=_RUN_ALL,
    ),
    "notebook7": Frontend(
        module="notebook",
        expose_app="--JupyterNotebookApp.expose_app_in_browser=True",
        path="/notebooks/explorer.ipynb",
        kernel_idle=_KERNEL_IDLE,
        run_all=_RUN_ALL,
    ),
}


@pytest.fixture(params=list(FRONTENDS))
def server(request, tmp_path):
    """(name, frontend, base URL, working directory): a server for one frontend on a free port
    serving a copy of the fixture notebook; the server's process group is ended afterwards."""
    require_browser()
    name = request.param
    frontend = FRONTENDS[name]
    if importlib.util.find_spec(frontend.module) is None:
        missing(f"the {frontend.module} package is not installed (pip install -e '.[test]')")
    shutil.copy(NOTEBOOK, tmp_path / "explorer.ipynb")
    port = _free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
    }
    cmd = [
        sys.executable,
        "-m",
        frontend.module,
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--allow-root",
        "--ServerApp.token=",
        "--ServerApp.password=",
        "--ServerApp.disable_check_xsrf=True",
        frontend.expose_app,
        f"--ServerApp.root_dir={tmp_path}",
        "--ServerApp.port_retries=0",
    ]
    log_path = tmp_path / "server.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{frontend.module} did not start:\n" + log_path.read_text()[-3000:])
                time.sleep(0.5)
        yield name, frontend, url, tmp_path
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its kernels: the group we started
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        log.close()


def _svg_texts(page) -> list[str]:
    return page.eval_on_selector_all(".vega-embed svg text", "els => els.map(e => e.textContent)")


def _spectrum_label(page) -> str:
    labels = [t for t in _svg_texts(page) if " σ above " in t]
    return labels[0] if labels else ""


# JS: how far (px) the explorer reaches past its output area: its root's and its charts'
# scrollWidth against the area's clientWidth, and the right edge of every visible element in it.
_OVERFLOW = """() => {
  const root = document.querySelector('.ess-explorer');
  const area = root.closest('.jp-OutputArea-output') || root.parentElement;
  const box = area.getBoundingClientRect();
  const probe = root.querySelector('.ess-width-probe');
  const out = {area: area.clientWidth, worst: 0, unreachable: 0, cut: [], probe: probe ? probe.dataset.measured : null};
  const name = (el) => el.tagName + '.' + String(el.className.baseVal ?? el.className).split(' ').slice(-2).join('.');
  // inside a box that scrolls sideways and itself ends within the area, what overflows can be
  // scrolled to: not fitted, but not cut off either
  const scrolled = (el) => {
    for (let p = el.parentElement; p && p !== area; p = p.parentElement) {
      const x = getComputedStyle(p).overflowX;
      if ((x === 'auto' || x === 'scroll') && p.getBoundingClientRect().right <= box.right + 1) return true;
    }
    return false;
  };
  const note = (el, over) => {
    if (over <= 1) return;
    out.worst = Math.max(out.worst, over);
    if (!scrolled(el)) out.unreachable = Math.max(out.unreachable, over);
    if (out.cut.length < 6) out.cut.push(name(el) + ' +' + Math.round(over));
  };
  for (const el of [root, ...root.querySelectorAll('.vega-embed, .vega-embed svg, .widget-box, .widget-inline-hbox')]) {
    note(el, el.scrollWidth - area.clientWidth);
  }
  for (const el of root.querySelectorAll('*')) {
    const r = el.getBoundingClientRect(), style = getComputedStyle(el);
    if (r.width === 0 || style.visibility === 'hidden' || style.display === 'none') continue;
    note(el, r.right - box.right);
  }
  return out;
}"""


# JS: the widest entry of the unit menu and the room its select gives text (padding, arrow excluded).
_UNIT_MENU = """() => {
  const box = [...document.querySelectorAll('.ess-explorer .widget-dropdown')]
    .find(d => d.querySelector('label') && d.querySelector('label').textContent.trim() === 'unit');
  const select = box.querySelector('select'), style = getComputedStyle(select);
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
  const widest = Math.max(...[...select.options].map(o => ctx.measureText(o.text).width));
  return {widest, room: select.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight)};
}"""


def _settled_box(page, locator, tries: int = 20) -> dict:
    """The bounding box of ``locator`` once it is drawn: a redraw of the chart (the fit, a late
    update of the analysis) detaches its marks for a moment, when Playwright gives None."""
    for _ in range(tries):
        box = locator.bounding_box()
        if box is not None and box["width"] > 0:
            return box
        page.wait_for_timeout(250)
    raise AssertionError(f"{locator} was not drawn within {tries * 0.25:.0f} s")


def _check_fits(page, name: str) -> None:
    """With the file browser open, at 1366 x 900 and 1100 x 900 the explorer stays inside
    its output area (the chart narrows as the browser reports the width: app/fit.py)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.evaluate("window.jupyterapp.shell.activateById('filebrowser')")
    page.wait_for_function(
        "document.querySelector('#filebrowser') && document.querySelector('#filebrowser').offsetWidth > 0"
    )
    for width in (1366, 1100):
        page.set_viewport_size({"width": width, "height": 900})
        try:
            page.wait_for_function(f"({_OVERFLOW})().worst <= 1", timeout=60_000)
        except PlaywrightTimeout:
            pass  # the assertion below says by how much
        measured = page.evaluate(_OVERFLOW)
        page.locator(".ess-explorer").first.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / f"explorer-{name}-{width}.png"))
        if width == 1366:  # the panels narrow to the output area (app/fit.py)
            assert measured["worst"] <= 1, f"at {width} x 900 the explorer is cut off: {measured}"
        else:  # stacked and narrowed; where the last narrowing has not landed yet, the box scrolls
            assert measured["unreachable"] <= 1, f"at {width} x 900 the explorer is cut off: {measured}"
        assert measured["area"] < {1366: 1000, 1100: 800}[width], f"the file browser is not open: {measured}"
        page.set_viewport_size({"width": width, "height": 2400})  # the whole explorer, same width
        page.wait_for_timeout(1000)
        page.locator(".ess-explorer").first.screenshot(path=str(ARTIFACTS / f"explorer-{name}-{width}-whole.png"))
        assert page.evaluate(_OVERFLOW)["unreachable"] <= 1, "the whole explorer, at the same width"
    menu = page.evaluate(_UNIT_MENU)
    assert menu["widest"] <= menu["room"], f"the unit menu cuts its labels: {menu}"


def test_explorer_in_browser(server):
    from playwright.sync_api import sync_playwright

    name, frontend, url, workdir = server
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(workdir / "chromium-profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=ARGS,
            viewport={"width": 1400, "height": 1700},
        )
        try:
            page = context.new_page()
            console = []  # the page's errors, printed when the test fails
            page.on("console", lambda m: console.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: console.append(str(e)))
            outside = []  # offline: nothing may be fetched from anywhere but the local server
            page.on(
                "request",
                lambda r: outside.append(r.url) if r.url.startswith("http") and not r.url.startswith(url) else None,
            )
            page.goto(f"{url}{frontend.path}", wait_until="domcontentloaded")
            page.wait_for_function("window.jupyterapp && document.querySelector('.jp-Notebook')", timeout=60_000)
            page.wait_for_function(frontend.kernel_idle, timeout=60_000)
            page.evaluate(frontend.run_all)
            # the linked views are drawn (SVG renderer) with the spectrum's stated count
            page.wait_for_function(
                "[...document.querySelectorAll('.vega-embed svg text')].some(e => e.textContent.includes(' σ above '))",
                timeout=90_000,
            )
            # the first chart can come before the rest of the analysis, whose updates redraw the
            # views; the clicks below are checked on the finished result
            page.wait_for_function(
                "[...document.querySelectorAll('.ess-explorer .ess-explorer-status')]"
                ".some(e => e.textContent.includes('analysed '))",
                timeout=120_000,
            )
            # the chart has narrowed to its output area (app/fit.py) before anything is clicked
            page.wait_for_function(f"({_OVERFLOW})().worst <= 1", timeout=60_000)
            page.wait_for_timeout(1500)
            before = _spectrum_label(page)
            assert before.startswith("t = "), before
            assert page.locator(".ess-explorer").count() == 1, "ex = explore() shows one explorer, once"
            # the live widget, not the static copy (in the page, hidden by the widget's style)
            assert page.locator(".jp-OutputArea-output img:visible").count() == 0

            # 1. a click on ESS over time selects another t: the spectrum follows, in the browser
            points = page.locator(".vega-embed svg g.mark-symbol").first
            box = _settled_box(page, points)
            page.mouse.click(box["x"] + 0.2 * box["width"], box["y"] + box["height"] / 2)
            page.wait_for_function(
                "(before) => [...document.querySelectorAll('.vega-embed svg text')]"
                ".some(e => e.textContent.includes(' σ above ') && e.textContent !== before)",
                arg=before,
                timeout=10_000,
            )
            after = _spectrum_label(page)
            assert after != before and after.startswith("t = ")

            # 2. another layer from the dropdown: Python redraws the views
            # (the selected layer is drawn first; the list fills as the other layers arrive)
            select = page.locator(".widget-dropdown", has=page.locator("label", has_text="layer")).locator("select")
            deadline = time.monotonic() + 90
            while len(options := select.locator("option").all_inner_texts()) < 2:
                assert time.monotonic() < deadline, f"the layer list never filled: {options}"
                page.wait_for_timeout(250)
            current = select.evaluate("el => el.options[el.selectedIndex].text")
            target = next(i for i, text in enumerate(options) if text != current)
            select.select_option(index=target)
            wanted = options[target].split()[0]  # option texts use non-breaking spaces
            deadline = time.monotonic() + 60
            while not any(t.startswith(f"layer {wanted} (") for t in _svg_texts(page)):
                assert time.monotonic() < deadline, f"the views did not switch to layer {wanted!r}"
                page.wait_for_timeout(250)
            page.wait_for_timeout(500)
            status = page.locator(".ess-explorer .ess-explorer-status").first.inner_text()
            assert "⚠" not in status, status
            page.screenshot(path=str(ARTIFACTS / f"explorer-{name}.png"), full_page=True)
            if name == "lab":
                _check_fits(page, name)
            assert not outside, f"requests left the machine (a CDN script?): {outside[:5]}"
        except Exception:
            page.screenshot(path=str(ARTIFACTS / f"explorer-{name}-failure.png"), full_page=True)
            print("status:", page.locator(".ess-explorer .ess-explorer-status").all_inner_texts())
            print("svg texts:", _svg_texts(page)[:40])
            print("console:", console[-20:])
            raise
        finally:
            context.close()
