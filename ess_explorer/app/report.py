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

import numpy as np
import pandas as pd

from ..atomic import atomic_write
from ..io import META_FILE, RESULT_FILE, TABLE_FILE, jsonable, result_metadata, summary_table, table_bytes
from ..result import ESSResult
from ..views.labels import family_name
from ..views.linked import linked_views_per_layer
from ..views.params import ViewNames
from ..views.render import javascript_bundle, vl_version
from .advice_section import advice_section_html
from .session import opening_layer

__all__ = ["write_report", "report_html", "MAX_EMBED_BYTES"]

MAX_EMBED_BYTES = 20_000_000  # above this the report links no data (the page would be too heavy)


def _script_json(value) -> str:
    """JSON safe inside <script>: '<' escaped so a token such as '</script>' cannot end it."""
    return json.dumps(jsonable(value)).replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


# The report draws the narrow layout of the linked views (views/linked.py) at this width, so the
# page fits a 900 px window: 840 px of chart, 16 px of padding on each side, room for a scroll bar.
REPORT_WIDTH = 840

# What a reader needs before the charts: one paragraph, defined as in the README.
WHAT_ESS_IS = (
    "A sequence-mixing layer applies y = T(u) u with T lower triangular, one T per head or channel "
    "(a <em>unit</em>). Cut T at position t: the block H<sub>t</sub> = T[t:, :t] carries the past inputs "
    "to the present and future outputs, and any recurrence that reproduces T needs a state of at least "
    "rank(H<sub>t</sub>) at t. The <strong>effective state size</strong> (ESS) is that rank made robust to "
    "noise: tolerance-ESS counts the singular values of H<sub>t</sub> above &tau; = 10<sup>-3</sup> "
    "&sigma;<sub>1</sub>; entropy-ESS is the exponential of their entropy. Against the layer's capacity "
    "(TSS: d_state, d_k, or t for attention's KV cache) it shows whether a layer is <em>saturated</em> "
    "(ESS near the most it can reach) or <em>collapsed</em> (far below)."
)


def _report_views(result: ESSResult, layer, view_options: dict) -> tuple[int, dict, dict]:
    """(opening layer, shared datasets, the page's record: the overview's layer param, the
    opening layer and {layer: spec}): the explorer's linked views of every
    layer (views.linked.linked_views_per_layer), so the page shows the layer picked in the
    overview. Opens on ``layer``, else where the explorer would (plan.opening_layer)."""
    layer = opening_layer(result.layers, result)[0] if layer is None else layer
    if layer not in result.layers:
        raise ValueError(f"layer {layer} was not analysed; analysed layers: {sorted(result.layers)}")
    names = ViewNames.fresh()
    shared, specs = linked_views_per_layer(result, layer=layer, names=names, max_width=REPORT_WIDTH, **view_options)
    return layer, shared, {"param": names.layer, "initial": layer, "specs": specs}


# The page's script: draw a layer's views; when the overview's selection names another layer,
# draw that layer's. The data of every layer is in the page (no network, no Python).
_SWITCH_SCRIPT = """
  const essPages = JSON.parse(document.getElementById('ess-layers').textContent);
  function essShow(layer) {
    const spec = Object.assign({}, essPages.specs[layer]);
    spec.datasets = Object.assign({}, essPages.shared, spec.datasets);
    return vegaEmbed('#ess-explorer', spec, embedOpt).then(function (res) {
      window.essView = res.view;
      document.getElementById('ess-explorer').dataset.layer = String(layer);
      document.getElementById('ess-shown').textContent = String(layer);
      res.view.addSignalListener(essPages.param, function (name, value) {
        const picked = value && value.layer !== undefined ? [].concat(value.layer)[0] : undefined;
        if (picked !== undefined && String(picked) !== String(layer) && essPages.specs[picked]) {
          essShow(picked);
        }
      });
    }).catch(console.error);
  }
  essShow(essPages.initial);
"""
_TEMPLATE_CALL = "vegaEmbed('#ess-explorer', spec, embedOpt).catch(console.error);"


# The summary's columns (io.summary_table): the header a reader sees and what it counts.
SUMMARY_COLUMNS = {
    "layer": ("layer", "the layer's index in the model"),
    "family": ("family", "the kind of sequence mixer"),
    "units": ("units", "heads or channels: one operator T each"),
    "multiplicity": ("scalars per unit", "m: the value channels that share one unit's T"),
    "mean_ess": ("mean ESS", "a unit's ESS, mean over units and over t"),
    "mean_tss": ("mean TSS", "a unit's capacity, mean over units and over t"),
    "total_ess": ("total ESS", "sum over units of m × ESS, in scalars; the largest over t"),
    "total_tss": ("total TSS", "sum over units of the state each keeps, in scalars; the largest over t"),
    "peak_ess": ("peak ESS", "per unit the largest ESS over t, mean over units"),
    "peak_ceiling": (
        "peak ceiling",
        "per unit the largest min(TSS, t, L − t) over t: the most this prompt lets it show",
    ),
    "utilisation": (
        "utilisation",
        "per unit peak ESS / peak ceiling, then the mean over units: a mean of ratios, so it differs from "
        "total ESS / total TSS (a ratio of sums, against TSS rather than the ceiling)",
    ),
    "state": ("state", "saturated: utilisation ≥ 0.9; collapsed: ≤ 0.1; else normal"),
    "tss_utilisation": ("ESS/TSS (paper)", "per unit peak ESS / peak TSS, mean over units: the paper's ratio"),
    "max_causal_ess": ("peak causal ESS", "the largest over t of the unit mean of causal ESS (rank of Rₜ)"),
}


def _cell(value) -> str:
    """A table cell's text: whole numbers and numbers from 100 up as integers with thousands
    separators (a total of 30,720 scalars, not "3.07e+04"), others to 3 significant digits
    (0.705, 23.5), NaN as "–"."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if not np.isfinite(value):
            return "–"
        if value.is_integer() or abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)


def _table_html(frame: pd.DataFrame, headers: dict | None = None) -> str:
    headers = headers or {}
    head = "".join(
        f"<th title='{html.escape(headers[c][1])}'>{html.escape(headers[c][0])}</th>"
        if c in headers
        else f"<th>{html.escape(str(c))}</th>"
        for c in frame.columns
    )
    rows = []
    for record in frame.itertuples(index=False):
        cells = "".join(f"<td>{html.escape(_cell(v))}</td>" for v in record)
        rows.append(f"<tr>{cells}</tr>")
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"


def _definitions_html(columns) -> str:
    """What each shown column of the summary counts, under the table."""
    items = "".join(
        f"<dt>{html.escape(SUMMARY_COLUMNS[c][0])}</dt><dd>{html.escape(SUMMARY_COLUMNS[c][1])}</dd>"
        for c in columns
        if c in SUMMARY_COLUMNS
    )
    return f"<dl class='defs'>{items}</dl>"


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
.sub { color: #555; margin: 0 0 16px 0; } .what { max-width: 840px; line-height: 1.45; }
.scroll { max-width: 100%; overflow-x: auto; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 7px; text-align: left; vertical-align: top; }
th { font-size: 12px; }
th { background: #f4f4f4; }
td.mono, code { font-family: 'DejaVu Sans Mono', monospace; font-size: 12px; }
.tokens { max-height: 160px; overflow: auto; background: #f7f7f7; padding: 8px; border-radius: 4px;
          overflow-wrap: anywhere; }
dl.defs { font-size: 13px; display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; max-width: 840px; }
dl.defs dt { font-weight: 600; } dl.defs dd { margin: 0; color: #444; }
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
    layer, shared, pages = _report_views(result, layer, view_options)
    bundle, version = javascript_bundle(), vl_version()
    meta = result_metadata(result)
    meta_json = json.dumps(meta, indent=2)
    model = str(result.meta.get("model_id") or "unknown model")
    title = title or f"Effective state size · {model}"
    page = INLINE_HTML_TEMPLATE.render(
        spec="null",  # the page's own script draws the views (_SWITCH_SCRIPT)
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
    summary["family"] = summary["family"].map(family_name)  # words, which wrap: the table fits 900 px
    meta_rows = pd.DataFrame(
        [(k, json.dumps(v) if not isinstance(v, str) else v) for k, v in meta["meta"].items() if k != "prompt"],
        columns=["key", "value"],
    )
    # the prompt once, as the tokenizer split it (the raw text is in the metadata file)
    tokens = " ".join(f"<code>{html.escape(repr(tok)[1:-1])}</code>" for tok in result.tokens[:2000])
    more = f" (the first 2,000 of {result.length:,})" if result.length > 2000 else ""
    header = (
        f"<h1>{html.escape(title)}</h1>"
        f"<p class='sub'>{result.length:,} tokens · layers {', '.join(str(i) for i in sorted(result.layers))} · "
        f"tolerance {html.escape(str(result.meta.get('tol')))} ({'relative' if result.meta.get('relative', True) else 'absolute'}, "
        f"scope {html.escape(str(result.meta.get('scope', 'cut')))}) · gates {html.escape(str(result.meta.get('gates', 'outside')))} · "
        f"{'no causal ESS · ' if result.meta.get('causal') is False else ''}"
        f"ess-explorer {html.escape(str(result.meta.get('package_version')))}.</p>"
        f"<p class='what'>{WHAT_ESS_IS}</p>"
        f"<p class='sub'>Below: layer <span id='ess-shown'>{layer}</span> in detail. Click a position on the ESS chart "
        "to move the spectrum and the H<sub>t</sub> outline; click a layer in the overview to show that layer. "
        "Everything on this page works offline.</p>"
    )
    sections = (
        f"<h2>Per-layer summary</h2>{_table_html(summary, SUMMARY_COLUMNS)}{_definitions_html(summary.columns)}"
        f"{'' if advice is None else advice_section_html(advice, model)}"
        f"<h2>Prompt, as {result.length:,} tokens{more}</h2><div class='tokens'>{tokens}</div>"
        f"<h2>Metadata</h2>{_table_html(meta_rows)}"
        f"<h2>Data</h2>{_data_links(result, meta_json, embed_data, max_embed_bytes)}"
        f"<script type='application/json' id='ess-meta'>{_script_json(meta)}</script>"
        f"<script type='application/json' id='ess-layers'>{_script_json({**pages, 'shared': shared})}</script>"
    )
    marker = '<div class="vega-visualization" id="ess-explorer"></div>'
    if marker not in page or "<head>" not in page or _TEMPLATE_CALL not in page:
        raise RuntimeError("altair's inline HTML template changed; update app/report.py")  # fail loudly
    page = page.replace("<head>", f"<head>\n  <title>{html.escape(title)}</title>\n  <style>{_STYLE}</style>", 1)
    page = page.replace(_TEMPLATE_CALL, _SWITCH_SCRIPT.strip(), 1)
    # the sections (with the layers' data) come before the template's script, which reads them
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
