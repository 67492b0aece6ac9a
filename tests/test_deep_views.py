"""Views of a result as deep and long as a real LLM's (30 layers, 523 tokens): rows in numeric
layer order in every panel, no data-size limit reached, and line thinning that keeps dips."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from _deep import N_LAYERS, deep_result, level

from ess_explorer.synthetic import reference_result
from ess_explorer.views.charts import linked_views
from ess_explorer.views.data import layer_label
from ess_explorer.views.figures import figure
from ess_explorer.views.frames import FIGURE_ROWS, envelope
from ess_explorer.views.render import figure_bytes
from ess_explorer.views.specs import diagnostics_chart


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
            re.search(r"utilisation: ([0-9.]+)", label)[1]
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
