"""The collapsed example (synthetic.collapsed_result): a state of 32 of which every cut uses
one direction, checked with numpy's SVD on the materialised operator."""

from __future__ import annotations

import numpy as np

from ess_explorer import layer_diagnostics
from ess_explorer.synthetic import collapsed_result, collapsed_ssm


def test_every_cut_of_the_collapsed_operator_has_rank_one():
    T = collapsed_ssm(40, 32, units=2, seed=3).materialize().numpy()  # (units, L, L)
    for unit in range(2):
        for t in (1, 5, 20, 39):
            sigma = np.linalg.svd(T[unit, t:, :t], compute_uv=False)
            assert (sigma > 1e-3 * sigma[0]).sum() == 1, (unit, t, sigma[:3])


def test_the_collapsed_result_is_called_collapsed():
    result = collapsed_result(length=64, state_size=32)
    lay = result.layer(0)
    assert (lay.tolerance_ess[:, 1:] == 1).all() and (lay.tss == 32).all()
    d = layer_diagnostics(lay)
    # per unit: peak ESS 1 over the peak ceiling min(32, t, 64 - t) = 32
    assert d["utilisation"] == 1 / 32 and d["state"] == "collapsed" and d["n_collapsed"] == lay.n_units
