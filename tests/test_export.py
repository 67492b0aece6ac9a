"""Data export (CSV, Parquet), result directories, and the standalone report's contents
(self-contained, data and metadata embedded, safe against hostile tokens)."""

from __future__ import annotations

import base64
import copy
import io
import json
import re

import numpy as np
import pandas as pd
import pytest

from ess_explorer.app.report import report_html, write_report
from ess_explorer.io import REQUIRED_META, export_table, read_result, result_metadata, summary_table, write_result_dir
from ess_explorer.result import ESSResult
from ess_explorer.synthetic import reference_result


@pytest.fixture(scope="module")
def ref():
    res = reference_result()
    res.meta["prompt"] = "k0 v3 k4 ... | a prompt"
    return res


def expected_rows(res: ESSResult) -> int:
    return sum(lay.tolerance_ess.size for lay in res.layers.values())


def test_csv_and_parquet_round_trip(ref, tmp_path):
    csv = pd.read_csv(export_table(ref, tmp_path / "t.csv"), keep_default_na=False)
    assert len(csv) == expected_rows(ref)
    assert list(csv.columns) == [
        "layer",
        "unit",
        "t",
        "token",
        "family",
        "unit_kind",
        "multiplicity",
        "tolerance_ess",
        "entropy_ess",
        "tss",
        "causal_ess",
        "utilisation",
    ]
    lay = ref.layer(2)
    rows = csv[(csv.layer == 2) & (csv.unit == 1)].sort_values("t")
    assert np.array_equal(rows["tolerance_ess"].to_numpy(), lay.tolerance_ess[1])
    assert np.allclose(rows["entropy_ess"].to_numpy(), lay.entropy_ess[1])
    assert list(rows["token"]) == [ref.tokens[t] for t in lay.positions]

    import pyarrow.parquet as pq

    table = pq.read_table(export_table(ref, tmp_path / "t.parquet"))
    assert table.num_rows == expected_rows(ref)
    meta = json.loads(table.schema.metadata[b"ess_explorer"])
    assert meta["model_id"] == "synthetic:reference" and meta["tol"] == ref.meta["tol"]
    back = table.to_pandas()
    assert np.allclose(back["utilisation"], csv["utilisation"])


def test_table_suffix_is_checked(ref, tmp_path):
    with pytest.raises(ValueError, match=r"\.csv or \.parquet"):
        export_table(ref, tmp_path / "t.xlsx")


def test_result_dir_layout_and_metadata(ref, tmp_path):
    out = write_result_dir(ref, tmp_path / "run")
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "result.npz", "table.csv"]
    back = read_result(out)
    assert back.tokens == ref.tokens and sorted(back.layers) == sorted(ref.layers)
    for i, lay in ref.layers.items():
        assert np.array_equal(back.layer(i).tolerance_ess, lay.tolerance_ess)
        assert np.array_equal(back.layer(i).singular_values, lay.singular_values.astype(np.float32))
    meta = json.loads((out / "meta.json").read_text())
    for key in REQUIRED_META:  # everything needed to regenerate a figure
        assert key in meta["meta"], key
    assert meta["meta"]["package_version"] and "H_t = T[t:, :t]" in meta["meta"]["convention"]
    assert meta["length"] == ref.length and len(meta["summary"]) == len(ref.layers)
    assert meta["layers"]["0"]["units"] == ref.layer(0).n_units
    assert len(pd.read_csv(out / "table.csv")) == expected_rows(ref)
    # no temporary files left behind
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_missing_meta_keys_are_present_as_null(ref):
    bare = copy.deepcopy(ref)
    bare.meta = {"tol": 1e-3}
    meta = result_metadata(bare)["meta"]
    assert meta["model_id"] is None and meta["revision"] is None and meta["tol"] == 1e-3


def test_read_result_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no ESS result"):
        read_result(tmp_path / "nothing")
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"PK\x03\x04 this is not a zip archive")
    with pytest.raises(ValueError, match="not a readable ESS result"):
        read_result(broken)


def test_summary_table_matches_the_layers(ref):
    table = summary_table(ref)
    assert list(table["layer"]) == sorted(ref.layers)
    conv = table.set_index("layer").loc[1]
    assert conv["family"] == "short_conv" and conv["max_ess"] == pytest.approx(3.0)  # k - 1, k = 4
    assert conv["mean_tss"] == pytest.approx(3.0)
    assert table.set_index("layer").loc[0, "max_ess"] == pytest.approx(ref.length // 2)  # min(t, L - t)
    # causal ESS: attention keeps every past token (t, peak L - 1); the diagonal SSM fills its
    # N = 4 modes; the synthetic conv is a dense stack with no realisation: NaN, not a guess
    assert table.set_index("layer").loc[0, "max_causal_ess"] == pytest.approx(ref.length - 1)
    assert table.set_index("layer").loc[2, "max_causal_ess"] == pytest.approx(4.0)
    assert np.isnan(conv["max_causal_ess"])


@pytest.fixture(scope="module")
def page(ref):
    return report_html(ref)


def test_report_is_self_contained(page):
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"<script[^>]+src=", page), "an external script"
    assert not re.search(r"<link[^>]+href=", page), "an external stylesheet"
    assert "vegaEmbed(" in page and len(page) > 500_000  # the JS bundle is inline
    pages = _layer_pages(page)
    for spec in pages["specs"].values():
        assert "vconcat" in spec and spec.get("datasets")  # the linked views, data inline
        assert not any("url" in (v.get("data") or {}) for v in spec.get("vconcat", []))


def _layer_pages(page: str) -> dict:
    """The page's record of every layer's linked views (app/report.py)."""
    found = re.search(r"<script type='application/json' id='ess-layers'>(.*?)</script>", page, re.S)
    return json.loads(found.group(1))


def test_report_has_every_layers_views_for_the_overview_to_pick(ref, page):
    """A click in the overview shows that layer: the page carries each layer's spec (its own
    ESS over time and operator) and the datasets they share, under the overview's param."""
    pages = _layer_pages(page)
    assert sorted(map(int, pages["specs"])) == sorted(ref.layers)
    assert set(pages["shared"]) == {"ess_overview", "ess_diagnostics", "ess_thresholds", "ess_labels"}
    for layer, spec in pages["specs"].items():
        assert set(spec["datasets"]) == {"ess_time", "ess_operator"}
        params = {p["name"]: p for p in spec["params"]}
        assert params[pages["param"]]["value"] == [{"layer": int(layer)}]  # the picked row is marked
        rows = spec["datasets"]["ess_time"]
        expected = ref.layer(int(layer)).tolerance_ess.mean(0)
        assert [r["ess"] for r in rows] == pytest.approx(expected.tolist(), rel=1e-3)
    assert pages["param"].endswith("_layer") and "addSignalListener(essPages.param" in page


def test_report_says_what_it_shows(ref, page):
    """ESS is defined before the charts, every summary column is defined under the table, the
    summary's numbers are formatted, and the prompt is printed once."""
    assert page.index("effective state size</strong>") < page.index('id="ess-explorer"')
    from ess_explorer.app.report import SUMMARY_COLUMNS

    table = page[page.index("<h2>Per-layer summary</h2>") : page.index("</dl>")]
    shown = summary_table(ref).drop(columns=["max_ess"]).columns
    for column in shown:
        header, meaning = SUMMARY_COLUMNS[column]
        assert f">{header}</th>" in table and f"<dt>{header}</dt><dd>{meaning}</dd>" in table.replace("&#x27;", "'")
    cells = re.findall(r"<td>([^<]*)</td>", table)
    assert not any(re.search(r"\de[+-]\d", c) for c in cells)
    assert not any(re.fullmatch(r"-?\d+\.\d{4,}", c) for c in cells), "unrounded numbers"
    assert "utilisation" in table and "differs from total ESS / total TSS" in table
    visible = re.sub(r"<script.*?</script>", "", page.split("<body>", 1)[1], flags=re.S)  # what a reader sees
    assert "a prompt" not in visible  # the raw prompt is in the metadata, the page shows its tokens once
    assert visible.count("<h2>Prompt, as") == 1 and "<h2>Tokens</h2>" not in visible


def test_report_embeds_metadata_and_data(ref, page):
    meta = json.loads(re.search(r"<script type='application/json' id='ess-meta'>(.*?)</script>", page, re.S).group(1))
    assert meta["meta"]["model_id"] == "synthetic:reference" and meta["length"] == ref.length
    links = dict(re.findall(r'<a download="([^"]+)" href="data:[^;]+;base64,([^"]+)"', page))
    assert set(links) == {"table.csv", "result.npz", "meta.json"}
    table = pd.read_csv(io.BytesIO(base64.b64decode(links["table.csv"])))
    assert len(table) == expected_rows(ref)
    blob = base64.b64decode(links["result.npz"])
    path = __import__("tempfile").mkstemp(suffix=".npz")[1]
    open(path, "wb").write(blob)
    back = ESSResult.load(path)
    assert np.array_equal(back.layer(3).tolerance_ess, ref.layer(3).tolerance_ess)
    assert "Per-layer summary" in page and "short_conv" in page


def test_hostile_tokens_cannot_break_the_page(ref, tmp_path):
    evil = copy.deepcopy(ref)
    evil.tokens[5] = "</script><script>alert(1)</script>"
    evil.meta["prompt"] = "<b>bold</b></script>"
    html = write_report(evil, tmp_path / "r.html", embed_data=False).read_text()
    # Every </script> closes a <script> the page itself opened: none comes from the data.
    assert html.count("</script>") == len(re.findall(r"<script[ >]", html))
    assert "alert(1)</script>" not in html and "<b>bold</b>" not in html


def test_report_options_and_errors(ref, tmp_path):
    small = report_html(ref, layer=2, embed_data=False, max_embed_bytes=10)
    assert "Data not embedded" in small
    from ess_explorer.app.report import _data_links  # the data section alone: no chart to build

    tiny = _data_links(ref, "{}", True, 1000)  # the table alone would be bigger: not even built
    assert "Data not embedded: the table has" in tiny and "download=" not in tiny
    rows = sum(lay.tolerance_ess.size for lay in ref.layers.values())
    medium = _data_links(ref, "{}", True, rows * 41)  # the estimate passes, the real size does not
    assert "MB limit" in medium and "download=" not in medium
    assert "download=" in _data_links(ref, "{}", True, 10**8)
    with pytest.raises(ValueError, match="layer 7 was not analysed"):
        report_html(ref, layer=7)
    with pytest.raises(ValueError, match=r"\.html"):
        write_report(ref, tmp_path / "r.pdf")
    with pytest.raises(ValueError, match="needs an ESSResult"):
        write_report("result.npz", tmp_path / "r.html")


def test_written_files_get_normal_permissions(ref, tmp_path):
    import os

    from ess_explorer import figure, save_figure

    umask = os.umask(0o022)
    try:
        paths = [
            export_table(ref, tmp_path / "t.csv"),
            write_report(ref, tmp_path / "r.html", embed_data=False),
            save_figure(figure(ref, "overview"), tmp_path / "f.svg"),
            *(write_result_dir(ref, tmp_path / "d").iterdir()),
        ]
    finally:
        os.umask(umask)
    for path in paths:  # readable by others, like any file a command writes (not mkstemp's 0600)
        assert path.stat().st_mode & 0o777 == 0o644, path
