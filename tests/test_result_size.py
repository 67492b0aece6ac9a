"""A saved result is sized for real models and draws the same views as the result in memory:
a 30-layer, 523-token attention result (9 heads per layer) fits in 30 MB."""

from __future__ import annotations

import numpy as np
import pytest
from _deep import deep_result

from ess_explorer.core.diagnostics import layer_modulation
from ess_explorer.result import SAVED_SPECTRUM_K, ESSResult
from ess_explorer.views.charts import linked_data
from ess_explorer.views.data import operator_data, separator_positions
from ess_explorer.views.figures import KINDS, figure

LIMIT = 30e6


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    deep = deep_result()
    path = deep.save(tmp_path_factory.mktemp("deep") / "result.npz")
    return deep, path, ESSResult.load(path)


def test_a_30_layer_523_token_result_fits_in_30_mb(saved):
    deep, path, _ = saved
    assert deep.layer(0).singular_values.shape[-1] > SAVED_SPECTRUM_K  # the case has more to cut
    assert path.stat().st_size <= LIMIT, f"{path.stat().st_size / 1e6:.1f} MB"


def test_the_file_keeps_the_top_values_in_float32_and_every_count_exact(saved):
    deep, _, back = saved
    for index in (0, 17):
        mine, other = deep.layer(index), back.layer(index)
        np.testing.assert_array_equal(
            other.singular_values, mine.singular_values[..., :SAVED_SPECTRUM_K].astype(np.float32)
        )
        np.testing.assert_array_equal(other.tolerance_ess, mine.tolerance_ess)
        np.testing.assert_array_equal(other.entropy_ess, mine.entropy_ess)
        # a recount at the analysis tolerance, any scope, is the full spectrum's, not a lower bound
        for scope in ("cut", "unit", "layer"):
            ess, exact = other.tolerance_ess_at(deep.meta["tol"], True, scope)
            full, _ = mine.tolerance_ess_at(deep.meta["tol"], True, scope)
            np.testing.assert_array_equal(ess, full)
            assert exact.all() and full.max() > SAVED_SPECTRUM_K
        # at another tolerance the cut values give a lower bound, and say so
        ess, exact = other.tolerance_ess_at(1e-4, True, "cut")
        assert not exact.all() and (ess <= mine.tolerance_ess_at(1e-4, True, "cut")[0]).all()


def test_modulation_and_operator_view_of_the_file_are_the_results(saved):
    deep, _, back = saved
    seps = separator_positions(deep)[:6]
    for index in (0, 29):
        np.testing.assert_array_equal(
            layer_modulation(back.layer(index), seps, tol=deep.meta["tol"]),
            layer_modulation(deep.layer(index), seps, tol=deep.meta["tol"]),
        )
        mine, size = operator_data(deep, layer=index, unit=4)
        other, other_size = operator_data(back, layer=index, unit=4)
        assert other_size == size > 1
        assert [(r["i0"], r["j0"]) for r in other] == [(r["i0"], r["j0"]) for r in mine]
        np.testing.assert_allclose([r["logabs"] for r in other], [r["logabs"] for r in mine], atol=1e-3)
    data = linked_data(back, layer=12)
    assert data and all(len(r["sigma"]) <= SAVED_SPECTRUM_K for r in data["ess_time"])


def test_every_figure_kind_draws_from_the_file(saved):
    _, _, back = saved
    options = {"spectrum": {"layer": 3, "t": 200}, "operator": {"layer": 3, "t": 200}}
    for kind in KINDS:
        figure(back if kind != "compare" else {"a": back, "b": back}, kind, **options.get(kind, {})).to_dict()
