"""Data export, result directories and the standalone HTML report; all from one ESSResult.

Result directory (what ``ess-explorer analyze --out DIR`` writes, and what
``ess-explorer figure DIR`` reads):

    DIR/result.npz   the ESSResult (ESSResult.save: arrays + JSON header, no pickle)
    DIR/table.csv    the tidy table, one row per (layer, unit, t) (ESSResult.to_frame)
    DIR/meta.json    the metadata needed to regenerate a figure: model id and revision,
                     dtype, device, tolerance (tol, relative), convention, package version,
                     prompt and token count, and a per-layer summary

Standalone report: ONE html file, all JavaScript inline (the vega-embed bundle that
vl-convert ships), the explorer's linked views (charts.linked_views, the same spec as the
widget), a per-layer summary, the metadata, and the data (table.csv, result.npz,
meta.json) as downloadable data: links. It opens with no network.
"""

from __future__ import annotations

import base64
import functools
import html
import json
import os
import secrets
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from .result import ESSResult

__all__ = [
    "RESULT_FILE",
    "TABLE_FILE",
    "META_FILE",
    "REQUIRED_META",
    "result_metadata",
    "summary_table",
    "export_table",
    "write_result_dir",
    "read_result",
    "write_report",
    "report_html",
]

RESULT_FILE, TABLE_FILE, META_FILE = "result.npz", "table.csv", "meta.json"
# What a reader needs to regenerate a figure or re-run the analysis (ESSResult docstring).
REQUIRED_META = ("model_id", "revision", "dtype", "device", "tol", "relative", "convention", "package_version")
TABLE_SUFFIXES = (".csv", ".parquet")
MAX_EMBED_BYTES = 20_000_000  # above this the report links no data (the page would be too heavy)


def _atomic_write(path: Path, data: bytes) -> Path:
    """Write bytes to ``path`` via a uniquely named temporary file in the same folder +
    os.replace, so a reader (or a crash) never sees half a file. The file gets the usual
    permissions (umask), unlike a mkstemp file (0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _jsonable(value):
    """numpy scalars / arrays -> plain JSON values (meta may hold them)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def summary_table(result: ESSResult, *, variant: str = "tolerance", saturated: float | None = None,
                  collapsed: float | None = None) -> pd.DataFrame:
    """One row per analysed layer: layer, family, units (count and kind), mean ESS and max
    ESS (mean over units, then mean / max over t), mean TSS, utilisation (peak ESS/TSS over
    t, mean over units; diagnostics.layer_diagnostics) and its state."""
    from .diagnostics import COLLAPSED_AT, SATURATED_AT, layer_diagnostics

    saturated = SATURATED_AT if saturated is None else saturated
    collapsed = COLLAPSED_AT if collapsed is None else collapsed
    rows = []
    for index in sorted(result.layers):
        lay = result.layers[index]
        ess = np.asarray(lay.tolerance_ess if variant == "tolerance" else lay.entropy_ess, dtype=np.float64)
        diag = layer_diagnostics(lay, variant=variant, saturated=saturated, collapsed=collapsed)
        over_units = ess.mean(0) if ess.size else np.zeros(0)
        rows.append({
            "layer": int(index), "family": lay.family, "units": f"{lay.n_units} {lay.unit_kind}s",
            "mean_ess": float(over_units.mean()) if over_units.size else 0.0,
            "max_ess": float(over_units.max()) if over_units.size else 0.0,
            "mean_tss": float(np.asarray(lay.tss, dtype=np.float64).mean()) if lay.tss.size else 0.0,
            "utilisation": float(diag["utilisation"]), "state": str(diag["state"]),
        })
    return pd.DataFrame(rows, columns=["layer", "family", "units", "mean_ess", "max_ess", "mean_tss", "utilisation", "state"])


def result_metadata(result: ESSResult) -> dict:
    """meta.json: the result's meta (every REQUIRED_META key present, None when unknown),
    the shape of what was analysed, and the per-layer summary."""
    meta = _jsonable(dict(result.meta))
    for key in REQUIRED_META:
        meta.setdefault(key, None)
    return {
        "meta": meta,
        "length": result.length,
        "layers": {
            str(i): {"family": lay.family, "unit_kind": lay.unit_kind, "units": lay.n_units,
                     "positions": int(len(lay.positions)), "kept_singular_values": int(lay.singular_values.shape[-1]),
                     "operators_kept": sorted(int(u) for u in lay.operators)}
            for i, lay in sorted(result.layers.items())
        },
        "summary": _jsonable(summary_table(result).to_dict(orient="records")),
        "files": {"result": RESULT_FILE, "table": TABLE_FILE, "meta": META_FILE},
        "how_to_reload": "ESSResult.load('result.npz'); ess-explorer figure DIR --kind KIND --out fig.pdf",
    }


def _table_bytes(result: ESSResult, fmt: str) -> bytes:
    frame = result.to_frame()
    if fmt == "csv":
        return frame.to_csv(index=False).encode("utf-8")
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    # The metadata travels inside the Parquet file, so the table alone is self-describing.
    schema_meta = dict(table.schema.metadata or {})
    schema_meta[b"ess_explorer"] = json.dumps(result_metadata(result)["meta"]).encode("utf-8")
    table = table.replace_schema_metadata(schema_meta)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def export_table(result: ESSResult, path) -> Path:
    """The tidy table (ESSResult.to_frame) as .csv or .parquet, by suffix; written atomically.
    A Parquet file also carries the metadata under the schema key ``ess_explorer``."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise ValueError(f"cannot tell the table format from {path.name!r}; use a name ending in .csv or .parquet")
    return _atomic_write(path, _table_bytes(result, suffix[1:]))


def write_result_dir(result: ESSResult, out_dir) -> Path:
    """Write result.npz, table.csv and meta.json into ``out_dir`` (created); returns it."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{out_dir} exists and is not a directory; give a directory for the result")
    out_dir.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=".result.", suffix=".npz", dir=out_dir)
    os.close(handle)
    try:
        written = result.save(tmp)
        os.replace(written, out_dir / RESULT_FILE)
    finally:
        Path(tmp).unlink(missing_ok=True)
    export_table(result, out_dir / TABLE_FILE)
    _atomic_write(out_dir / META_FILE, json.dumps(result_metadata(result), indent=2).encode("utf-8"))
    return out_dir


def read_result(path) -> ESSResult:
    """An ESSResult from a result directory (its result.npz) or an .npz file.
    FileNotFoundError when nothing is there; ValueError when the file is not a result."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULT_FILE
    if not path.exists():
        raise FileNotFoundError(f"no ESS result at {path} (give a directory written by `ess-explorer analyze` or a .npz)")
    try:
        return ESSResult.load(path)
    except ValueError:
        raise
    except Exception as error:  # a truncated zip raises BadZipFile, zlib.error, EOFError ...
        raise ValueError(f"{path} is not a readable ESS result ({type(error).__name__}: {error}); recompute it") from error


# ---- report ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _vega_bundle() -> tuple[str, str]:
    """(vega-embed + Vega + Vega-Lite JavaScript bundle, Vega-Lite version), from vl-convert:
    no CDN, works offline. ~1 MB; built once per process (a few seconds)."""
    import vl_convert as vlc
    from altair.utils._importers import vl_version_for_vl_convert

    version = vl_version_for_vl_convert()
    return vlc.javascript_bundle(vl_version=version), version


def _script_json(value) -> str:
    """JSON safe inside <script>: '<' escaped so a token such as '</script>' cannot end it."""
    return json.dumps(_jsonable(value)).replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _report_chart(result: ESSResult, layer, view_options: dict):
    """The explorer's linked views (charts.linked_views): the widget's own spec."""
    from . import charts

    layer = min(result.layers) if layer is None else layer
    if layer not in result.layers:
        raise ValueError(f"layer {layer} was not analysed; analysed layers: {sorted(result.layers)}")
    return charts.linked_views(result, layer=layer, **view_options)


def _table_html(frame: pd.DataFrame, floats: str = "{:.3g}") -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = []
    for record in frame.itertuples(index=False):
        cells = "".join(
            f"<td>{html.escape(floats.format(v) if isinstance(v, float) else str(v))}</td>" for v in record
        )
        rows.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _data_links(result: ESSResult, meta_json: str, embed_data: bool, max_bytes: int) -> str:
    if not embed_data:
        return "<p>Data not embedded (embed_data=False).</p>"
    import io

    rows = sum(lay.tolerance_ess.size for lay in result.layers.values())
    if rows * 40 > max_bytes:  # a CSV row takes 40-80 bytes: do not even build a table that big
        return (f"<p>Data not embedded: the table has {rows:,} rows (over {max_bytes / 1e6:.0f} MB). "
                "Use <code>ess-explorer analyze --out DIR</code> for result.npz, table.csv and meta.json.</p>")
    buffer = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp:
        buffer.write(Path(result.save(Path(tmp) / RESULT_FILE)).read_bytes())
    files = [(TABLE_FILE, "text/csv", _table_bytes(result, "csv")),
             (RESULT_FILE, "application/octet-stream", buffer.getvalue()),
             (META_FILE, "application/json", meta_json.encode("utf-8"))]
    total = sum(len(data) for _, _, data in files)
    if total > max_bytes:
        return (f"<p>Data not embedded: {total / 1e6:.1f} MB is above the {max_bytes / 1e6:g} MB limit. "
                "Use <code>ess-explorer analyze --out DIR</code> for result.npz, table.csv and meta.json.</p>")
    items = "".join(
        f'<li><a download="{name}" href="data:{mime};base64,{base64.b64encode(data).decode("ascii")}">{name}</a>'
        f" ({len(data) / 1e3:.1f} kB)</li>"
        for name, mime, data in files
    )
    return (f"<ul class='files'>{items}</ul><p>Reload the result with <code>ESSResult.load('result.npz')</code>; "
            "regenerate a figure with <code>ess-explorer figure result.npz --kind overview --out fig.pdf</code>.</p>")


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


def report_html(result: ESSResult, *, layer: int | None = None, title: str | None = None, embed_data: bool = True,
                max_embed_bytes: int = MAX_EMBED_BYTES, **view_options) -> str:
    """The standalone report as an HTML string (see write_report)."""
    from altair.utils.html import INLINE_HTML_TEMPLATE

    if not isinstance(result, ESSResult):
        raise ValueError(f"write_report needs an ESSResult, got {type(result).__name__}")
    if not result.layers:
        raise ValueError("the result has no analysed layers; nothing to report")
    chart = _report_chart(result, layer, view_options)
    spec = chart.to_dict()
    bundle, version = _vega_bundle()
    meta = result_metadata(result)
    meta_json = json.dumps(meta, indent=2)
    model = str(result.meta.get("model_id") or "unknown model")
    title = title or f"Effective state size · {model}"
    page = INLINE_HTML_TEMPLATE.render(
        spec=_script_json(spec),
        embed_options=json.dumps({"mode": "vega-lite", "renderer": "svg",
                                  "actions": {"export": True, "source": False, "compiled": False, "editor": False}}),
        output_div="ess-explorer",
        vegaembed_script=bundle,
        vegalite_version=version,
    )
    summary = summary_table(result)
    meta_rows = pd.DataFrame(
        [(k, json.dumps(v) if not isinstance(v, str) else v) for k, v in meta["meta"].items() if k != "prompt"],
        columns=["key", "value"],
    )
    prompt = result.meta.get("prompt")
    prompt_html = (f"<h2>Prompt</h2><div class='prompt'>{html.escape(str(prompt))}</div>" if prompt else "")
    tokens = " ".join(f"<code>{html.escape(repr(tok)[1:-1])}</code>" for tok in result.tokens[:2000])
    header = (
        f"<h1>{html.escape(title)}</h1>"
        f"<p class='sub'>{result.length} tokens · layers {', '.join(str(i) for i in sorted(result.layers))} · "
        f"tolerance {html.escape(str(result.meta.get('tol')))} ({'relative' if result.meta.get('relative', True) else 'absolute'}) · "
        f"ess-explorer {html.escape(str(result.meta.get('package_version')))}. Click a position on the ESS chart to move "
        "the spectrum and the H<sub>t</sub> outline; click a layer in the overview to mark it. "
        "Everything on this page works offline.</p>"
    )
    sections = (
        f"<h2>Per-layer summary</h2>{_table_html(summary)}"
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


def write_report(result: ESSResult, path, *, layer: int | None = None, title: str | None = None,
                 embed_data: bool = True, max_embed_bytes: int = MAX_EMBED_BYTES, **view_options) -> Path:
    """One self-contained HTML file: the explorer's linked views (charts.linked_views, the
    same spec as the widget, working in the browser with no network), the per-layer summary,
    the metadata and the data used (table.csv, result.npz, meta.json as download links, and
    the metadata as JSON in <script id="ess-meta">). ``view_options`` go to linked_views
    (unit=, variant=, tol=, relative=, saturated=, collapsed=)."""
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"a report is an .html file; got {path.name!r}")
    page = report_html(result, layer=layer, title=title, embed_data=embed_data, max_embed_bytes=max_embed_bytes,
                       **view_options)
    return _atomic_write(path, page.encode("utf-8"))
