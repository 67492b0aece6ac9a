"""Views of a result as deep and long as a real LLM's (30 layers, 523 tokens): rows in numeric
layer order in every panel, no data-size limit reached, and line thinning that keeps dips."""

from __future__ import annotations

import base64
import dataclasses
import re

import numpy as np
import pandas as pd
import pytest
from _deep import N_LAYERS, deep_result, level

from ess_explorer.result import ESSResult
from ess_explorer.synthetic import reference_result
from ess_explorer.views.charts import linked_views
from ess_explorer.views.data import layer_label, time_data
from ess_explorer.views.figures import figure
from ess_explorer.views.frames import FIGURE_ROWS, envelope, layer_summary_frame
from ess_explorer.views.render import figure_bytes
from ess_explorer.views.specs import diagnostics_chart, spectrum


def bar_rows(svg: str, field: str) -> dict[int, float]:
    """{layer: top y} of the bars or cells whose description names ``field``, from Vega's SVG."""
    rows = {}
    for label, top in re.findall(r'<path aria-label="([^"]*)"[^>]*?d="M[-0-9.e]+,([-0-9.e]+)', svg):
        layer = re.search(r"; layer: (\d+)", label)
        if label.startswith(field) and layer:
            rows.setdefault(int(layer.group(1)), float(top))  # a row's first cell
    return rows


@pytest.fixture(scope="module")
def deep():
    return deep_result()


def test_diagnostics_rows_follow_the_layer_number_in_both_panels(deep):
    svg = figure_bytes(diagnostics_chart(deep, layer=3), "svg").decode()
    util, mod = bar_rows(svg, "utilisation"), bar_rows(svg, "modulation")
    assert sorted(util) == sorted(mod) == list(range(N_LAYERS))
    for rows in (util, mod):
        tops = [rows[i] for i in range(N_LAYERS)]
        assert tops == sorted(tops) and len(set(tops)) == N_LAYERS, "rows not in layer order"
    # each utilisation bar is its own layer's (layers differ in level by construction)
    widths = {}
    for label in re.findall(r'aria-label="(utilisation[^"]*)"', svg):
        widths[int(re.search(r"; layer: (\d+)", label).group(1))] = float(
            re.search(r"of the ceiling: ([0-9.]+)", label)[1]
        )
    assert (
        np.argsort([widths[i] for i in range(N_LAYERS)]).tolist()
        == np.argsort([level(i) for i in range(N_LAYERS)], kind="stable").tolist()
    )


def test_the_explorer_draws_overview_and_diagnostics_rows_side_by_side(deep):
    svg = figure_bytes(linked_views(deep, layer=12), "svg").decode()
    cells = bar_rows(svg, "position t")  # the overview's cells (ESS over time has no layer field)
    util, mod = bar_rows(svg, "utilisation"), bar_rows(svg, "modulation")
    order = list(range(N_LAYERS))
    for rows in (cells, util, mod):
        tops = [rows[i] for i in order]
        assert tops == sorted(tops)
    # one row height in all three: row i sits at the same offset from row 0 everywhere
    for rows in (util, mod):
        assert np.allclose(np.diff([rows[i] for i in order]), np.diff([cells[i] for i in order]), atol=0.5)


def test_layer_labels_name_the_family_only_when_layers_differ(deep):
    assert layer_label(deep, 12) == "12"
    assert layer_label(reference_result(), 2) == "2 · mamba"


@pytest.mark.parametrize("layers", [None, list(range(10))])
def test_ess_time_of_more_rows_than_vega_takes_is_drawn(deep, layers):
    spec = figure(deep, "ess_time", layers=layers).to_dict()
    rows = sum(len(v) for v in spec["datasets"].values())
    assert rows <= FIGURE_ROWS + 100  # the separators' rows come on top of the lines'
    # 10 or 30 lines: a gradient over the layer number, not a legend entry each
    (colour,) = [layer["encoding"]["color"] for layer in spec["layer"] if "color" in layer.get("encoding", {})]
    assert colour["field"] == "layer" and colour["type"] == "quantitative"
    figure_bytes(figure(deep, "ess_time", layers=layers), "svg")  # draws (no row limit in the way)


def test_a_few_layers_keep_one_legend_entry_each(deep):
    spec = figure(deep, "ess_time", layers=[0, 12, 25]).to_dict()
    (colour,) = [layer["encoding"]["color"] for layer in spec["layer"] if "color" in layer.get("encoding", {})]
    assert colour["field"] == "series" and len(colour["scale"]["domain"]) == 3


def test_envelope_keeps_every_dip_and_peak():
    t = np.arange(4096)
    ess = np.minimum(t, 4096 - t).astype(float)
    ess[[700, 2047, 3001]] = 0.0  # one-token drops at separators
    ess[1500] = 5000.0
    frame = pd.DataFrame({"series": "a", "t": t, "ess": ess})
    thin = envelope(frame, ["series"], budget=400)
    assert len(thin) <= 400
    assert {700, 2047, 3001, 1500} <= set(thin["t"])
    assert thin["t"].is_monotonic_increasing
    assert (
        envelope(frame.head(100), ["series"], budget=400) is not None
        and len(envelope(frame.head(100), ["series"])) == 100
    )


def test_utilisation_of_thousands_of_channels_draws_their_spread(deep):
    wide = dataclasses.replace(
        deep,
        layers={
            i: dataclasses.replace(
                lay,
                tolerance_ess=np.tile(lay.tolerance_ess, (20, 1)),
                entropy_ess=np.tile(lay.entropy_ess, (20, 1)),
                tss=np.tile(lay.tss, (20, 1)),
                singular_values=lay.singular_values[:1].repeat(180, 0),
                rank_bound=np.tile(lay.rank_bound, (20, 1)),
                multiplicity=None,
                state_weight=None,
                causal_ess=None,
                operators={},
            )
            for i, lay in deep.layers.items()
        },
    )
    spec = figure(wide, "utilisation").to_dict()
    units = [row for rows in spec["datasets"].values() for row in rows if "unit" in row]
    assert 30 * 5 <= len(units) <= FIGURE_ROWS
    per_layer = pd.DataFrame(units).groupby("layer")["utilisation"]
    # the extremes of every layer are drawn

    full = layer_summary_frame(wide)[1].groupby("layer")["utilisation"]
    assert np.allclose(per_layer.min(), full.min()) and np.allclose(per_layer.max(), full.max())
    figure_bytes(figure(wide, "utilisation"), "svg")


def summary_html(page: str) -> str:
    start = page.index("<h2>Per-layer summary</h2>")
    return page[start : page.index("</table>", start)]


def test_the_report_table_shows_what_utilisation_divides_and_totals_in_full():
    from ess_explorer.app.report import report_html
    from ess_explorer.io import summary_table

    result = reference_result()
    page = report_html(result, embed_data=False)
    table = summary_html(page)
    header = re.findall(r"<th[^>]*>([^<]*)</th>", table)
    assert "max ESS" not in header and {"peak ESS", "peak ceiling", "utilisation", "ESS/TSS (paper)"} <= set(header)
    summary = summary_table(result)
    # utilisation is the mean over units of per-unit peak ratios; for the equal units of a
    # synthetic layer it is exactly peak_ess / peak_ceiling
    assert np.allclose(summary["utilisation"], summary["peak_ess"] / summary["peak_ceiling"], atol=0.05)
    big = dataclasses.replace(
        result, layers={0: dataclasses.replace(result.layer(0), multiplicity=np.array([1280, 1280]))}
    )
    page = report_html(big, embed_data=False)
    assert "e+0" not in summary_html(page)
    assert f"{summary_table(big)['total_tss'][0]:,.0f}" in page


def test_the_static_copy_of_a_deep_explorer_is_one_png_sized_for_a_notebook(deep):
    from ess_explorer.app import static

    bundle = static.static_bundle(linked_views(deep, layer=12).to_dict())
    assert set(bundle) == {"text/plain", "text/html"}
    (data,) = re.findall(r"data:image/png;base64,([^\"]+)\"", bundle["text/html"])
    png = base64.b64decode(data)
    assert len(png) <= static.STATIC_MAX_BYTES
    # too large at twice its size, so drawn at its size: shown at the PNG's own pixels
    width, height = static.png_size(png)
    assert re.search(rf'width="{width}" height="{height}"', bundle["text/html"])


def test_the_spectrum_title_states_the_full_count_and_how_many_values_are_drawn(deep, tmp_path):
    rows = {row["t"]: row for row in time_data(deep, layer=12, unit=0)}
    row = rows[261]
    assert row["unit_exact"] and row["unit_tol_ess"] == deep.layer(12).tolerance_ess[0, 261] > 64
    assert not row["complete"] and len(row["sigma"]) == 64
    svg = figure_bytes(spectrum(deep, layer=12, unit=0, t=261), "svg").decode()
    assert f"{row['unit_tol_ess']} σ above" in svg and "(top 64 drawn)" in svg and "of ≥" not in svg
    # a saved file keeps 64 values: at another tolerance its count is a lower bound, marked
    back = ESSResult.load(deep.save(tmp_path / "deep.npz"))
    low = {r["t"]: r for r in time_data(back, layer=12, unit=0, tol=1e-6)}[261]
    assert not low["unit_exact"] and low["unit_tol_ess"] == 64
    svg = figure_bytes(spectrum(back, layer=12, unit=0, t=261, tol=1e-6), "svg").decode()
    assert "at least 64 σ above" in svg and "recounted from the 64 kept" in svg


def test_ess_time_draws_the_attainable_ceiling_it_is_asked_for():
    result = reference_result()
    spec = figure(result, "ess_time", layers=[0], show_ceiling=True).to_dict()
    fields = [layer["encoding"]["y"].get("field") for layer in spec["layer"] if "y" in layer.get("encoding", {})]
    assert "ceiling" in fields and "tss" not in fields
    rows = [row for data in spec["datasets"].values() for row in data if "ceiling" in row]
    lay = result.layer(0)
    # attention: min(TSS = t, t, L - t) = min(t, L - t), mean over the heads
    expected = np.minimum(lay.tss, lay.rank_bound).mean(0)
    assert [row["ceiling"] for row in sorted(rows, key=lambda r: r["t"])] == pytest.approx(expected.tolist())
    assert max(row["ceiling"] for row in rows) == result.length // 2
