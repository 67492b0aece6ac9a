"""The standalone HTML report of one ESSResult.

Standalone report: ONE html file, all JavaScript inline (the vega-embed bundle that
vl-convert ships), the explorer's linked views (charts.linked_views, the same spec as the
widget), a per-layer summary, the metadata, and the data (table.csv, result.npz,
meta.json) as downloadable data: links. It opens with no network.
"""

from __future__ import annotations

import base64
import html
import json
import tempfile
from pathlib import Path

import pandas as pd

from ..atomic import atomic_write
from ..io import META_FILE, RESULT_FILE, TABLE_FILE, jsonable, result_metadata, summary_table, table_bytes
from ..result import ESSResult
from ..views import charts
from ..views.render import javascript_bundle, vl_version
from .advice_section import advice_section_html
from .session import opening_layer

__all__ = ["write_report", "report_html", "MAX_EMBED_BYTES"]

MAX_EMBED_BYTES = 20_000_000  # above this the report links no data (the page would be too heavy)


def _script_json(value) -> str:
    """JSON safe inside <script>: '<' escaped so a token such as '</script>' cannot end it."""
    return json.dumps(jsonable(value)).replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _report_chart(result: ESSResult, layer, view_options: dict):
    """The explorer's linked views (charts.linked_views): the widget's own spec."""

    layer = opening_layer(result.layers, result)[0] if layer is None else layer
    if layer not in result.layers:
        raise ValueError(f"layer {layer} was not analysed; analysed layers: {sorted(result.layers)}")
    return charts.linked_views(result, layer=layer, **view_options)


def _cell(value, floats: str) -> str:
    """A table cell's text: numbers from 1,000 up in full with thousands separators (a total of
    30,720 scalars, not "3.07e+04"), smaller floats to ``floats``."""
    if isinstance(value, float) and abs(value) >= 1000:
        return f"{value:,.0f}"
    return floats.format(value) if isinstance(value, float) else str(value)


def _table_html(frame: pd.DataFrame, floats: str = "{:.3g}") -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = []
    for record in frame.itertuples(index=False):
        cells = "".join(f"<td>{html.escape(_cell(v, floats))}</td>" for v in record)
        rows.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _data_links(result: ESSResult, meta_json: str, embed_data: bool, max_bytes: int) -> str:
    if not embed_data:
        return "<p>Data not embedded (embed_data=False).</p>"
    import io

    rows = sum(lay.tolerance_ess.size for lay in result.layers.values())
    if rows * 40 > max_bytes:  # a CSV row takes 40-80 bytes: do not even build a table that big
        return (
            f"<p>Data not embedded: the table has {rows:,} rows (over {max_bytes / 1e6:.0f} MB). "
            "Use <code>ess-explorer analyze --out DIR</code> for result.npz, table.csv and meta.json.</p>"
        )
    buffer = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp:
        buffer.write(Path(result.save(Path(tmp) / RESULT_FILE)).read_bytes())
    files = [
        (TABLE_FILE, "text/csv", table_bytes(result, "csv")),
        (RESULT_FILE, "application/octet-stream", buffer.getvalue()),
        (META_FILE, "application/json", meta_json.encode("utf-8")),
    ]
    total = sum(len(data) for _, _, data in files)
    if total > max_bytes:
        return (
            f"<p>Data not embedded: {total / 1e6:.1f} MB is above the {max_bytes / 1e6:g} MB limit. "
            "Use <code>ess-explorer analyze --out DIR</code> for result.npz, table.csv and meta.json.</p>"
        )
    items = "".join(
        f'<li><a download="{name}" href="data:{mime};base64,{base64.b64encode(data).decode("ascii")}">{name}</a>'
        f" ({len(data) / 1e3:.1f} kB)</li>"
        for name, mime, data in files
    )
    return (
        f"<ul class='files'>{items}</ul><p>Reload the result with <code>ESSResult.load('result.npz')</code>; "
        "regenerate a figure with <code>ess-explorer figure result.npz --kind overview --out fig.pdf</code>.</p>"
    )


_STYLE = """
body { font-family: system-ui, -apple-system, 'Segoe UI', 'Liberation Sans', sans-serif; margin: 24px auto;
       max-width: 1280px; color: #222; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px 0; } h2 { font-size: 16px; margin: 28px 0 8px 0; }
.sub { color: #555; margin: 0 0 16px 0; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
td.mono, code { font-family: 'DejaVu Sans Mono', monospace; font-size: 12px; }
.prompt { white-space: pre-wrap; background: #f7f7f7; padding: 8px; border-radius: 4px; font-size: 13px;
          max-height: 160px; overflow: auto; }
.state-saturated { color: #b2182b; } .state-collapsed { color: #5e3c99; }
"""


def report_html(
    result: ESSResult,
    *,
    layer: int | None = None,
    title: str | None = None,
    embed_data: bool = True,
    max_embed_bytes: int = MAX_EMBED_BYTES,
    advice=None,
    **view_options,
) -> str:
    """The standalone report as an HTML string (see write_report)."""
    from altair.utils.html import INLINE_HTML_TEMPLATE

    if not isinstance(result, ESSResult):
        raise ValueError(f"write_report needs an ESSResult, got {type(result).__name__}")
    if not result.layers:
        raise ValueError("the result has no analysed layers; nothing to report")
    chart = _report_chart(result, layer, view_options)
    spec = chart.to_dict()
    bundle, version = javascript_bundle(), vl_version()
    meta = result_metadata(result)
    meta_json = json.dumps(meta, indent=2)
    model = str(result.meta.get("model_id") or "unknown model")
    title = title or f"Effective state size · {model}"
    page = INLINE_HTML_TEMPLATE.render(
        spec=_script_json(spec),
        embed_options=json.dumps(
            {
                "mode": "vega-lite",
                "renderer": "svg",
                "actions": {"export": True, "source": False, "compiled": False, "editor": False},
            }
        ),
        output_div="ess-explorer",
        vegaembed_script=bundle,
        vegalite_version=version,
    )
    # max_ess (the peak of the unit mean) is not what utilisation divides: peak_ess is
    summary = summary_table(result).drop(columns=["max_ess"])
    meta_rows = pd.DataFrame(
        [(k, json.dumps(v) if not isinstance(v, str) else v) for k, v in meta["meta"].items() if k != "prompt"],
        columns=["key", "value"],
    )
    prompt = result.meta.get("prompt")
    prompt_html = f"<h2>Prompt</h2><div class='prompt'>{html.escape(str(prompt))}</div>" if prompt else ""
    tokens = " ".join(f"<code>{html.escape(repr(tok)[1:-1])}</code>" for tok in result.tokens[:2000])
    header = (
        f"<h1>{html.escape(title)}</h1>"
        f"<p class='sub'>{result.length} tokens · layers {', '.join(str(i) for i in sorted(result.layers))} · "
        f"tolerance {html.escape(str(result.meta.get('tol')))} ({'relative' if result.meta.get('relative', True) else 'absolute'}, "
        f"scope {html.escape(str(result.meta.get('scope', 'cut')))}) · gates {html.escape(str(result.meta.get('gates', 'outside')))} · "
        f"{'no causal ESS · ' if result.meta.get('causal') is False else ''}"
        f"ess-explorer {html.escape(str(result.meta.get('package_version')))}. Click a position on the ESS chart to move "
        "the spectrum and the H<sub>t</sub> outline; click a layer in the overview to mark it. "
        "Everything on this page works offline.</p>"
    )
    sections = (
        f"<h2>Per-layer summary</h2>{_table_html(summary)}"
        f"{'' if advice is None else advice_section_html(advice, model)}"
        f"{prompt_html}<h2>Tokens</h2><p>{tokens}</p>"
        f"<h2>Metadata</h2>{_table_html(meta_rows)}"
        f"<h2>Data</h2>{_data_links(result, meta_json, embed_data, max_embed_bytes)}"
        f"<script type='application/json' id='ess-meta'>{_script_json(meta)}</script>"
    )
    marker = '<div class="vega-visualization" id="ess-explorer"></div>'
    if marker not in page or "<head>" not in page:  # altair's template changed: fail loudly, not silently
        raise RuntimeError("altair's inline HTML template changed; update export.report_html")
    page = page.replace("<head>", f"<head>\n  <title>{html.escape(title)}</title>\n  <style>{_STYLE}</style>", 1)
    return page.replace(marker, f"{header}\n{marker}\n{sections}", 1)


def write_report(
    result: ESSResult,
    path,
    *,
    layer: int | None = None,
    title: str | None = None,
    embed_data: bool = True,
    max_embed_bytes: int = MAX_EMBED_BYTES,
    advice=None,
    **view_options,
) -> Path:
    """One self-contained HTML file: the explorer's linked views (charts.linked_views, the
    same spec as the widget, working in the browser with no network), the per-layer summary,
    the metadata and the data used (table.csv, result.npz, meta.json as download links, and
    the metadata as JSON in <script id="ess-meta">). ``advice``: an Advice of a sweep
    (ess_explorer.advise) whose rows of this model are shown after the summary (app/advice_section.py).
    ``view_options`` go to linked_views (unit=, variant=, tol=, relative=, saturated=, collapsed=)."""
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"a report is an .html file; got {path.name!r}")
    page = report_html(
        result,
        layer=layer,
        title=title,
        embed_data=embed_data,
        max_embed_bytes=max_embed_bytes,
        advice=advice,
        **view_options,
    )
    return atomic_write(path, page.encode("utf-8"))
