"""Export a notebook to one HTML file that reads offline, math included.

    python scripts/export_notebook.py notebooks/01_what_is_ess.ipynb out.html

nbconvert's HTML loads MathJax from a CDN, so opened without a network it shows raw ``$...$``.
This writes the same page (nbconvert's HTMLExporter, the notebook's own outputs) with MathJax
3.2.2 (``scripts/assets``, Apache-2.0, the single-file TeX-to-SVG build: no fonts or
extensions to fetch) inlined in place of the CDN script, configured for the ``$...$`` and
``$$...$$`` delimiters notebooks use. The page is about 2 MB larger; nothing else changes.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

MATHJAX = Path(__file__).resolve().parent / "assets" / "mathjax-3.2.2-tex-svg.js"
# MathJax 3 reads its configuration from window.MathJax before the script runs.
CONFIG = (
    "window.MathJax = {tex: {inlineMath: [['$', '$'], ['\\\\(', '\\\\)']], "
    "displayMath: [['$$', '$$'], ['\\\\[', '\\\\]']], processEscapes: true}, "
    "svg: {fontCache: 'global'}, options: {enableMenu: false}};"
)
# nbconvert's MathJax block: the CDN script and its MathJax 2 configuration after it.
_CDN_BLOCK = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S)


def offline_html(notebook_path) -> str:
    """The nbconvert HTML of ``notebook_path`` with MathJax inlined (module docstring)."""
    import nbformat
    from nbconvert import HTMLExporter

    notebook = nbformat.read(Path(notebook_path), as_version=4)
    page, _ = HTMLExporter().from_notebook_node(notebook)
    if not _CDN_BLOCK.search(page):
        raise RuntimeError("nbconvert's MathJax block changed; update scripts/export_notebook.py")
    script = MATHJAX.read_text(encoding="utf-8").replace("</script", "<\\/script")
    inline = f"<script>{CONFIG}</script>\n<script>{script}</script>"
    return _CDN_BLOCK.sub(lambda _: inline, page, count=1)


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    args.out.write_text(offline_html(args.notebook), encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")
    return args.out


if __name__ == "__main__":
    main()
