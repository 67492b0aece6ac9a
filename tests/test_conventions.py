"""Accounting conventions (docs/conventions.md): state counted in scalars (multiplicity and
layer totals), the tolerance scope, causal ESS and the gate policy."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
import torch

from ess_explorer.core.operators import DiagonalSSM
from ess_explorer.io import summary_table
from ess_explorer.result import ESSResult, LayerESS
from ess_explorer.synthetic import diagonal_ssm


def _layer(ssm, multiplicity=None, family="mamba2"):
    return LayerESS.from_operator(0, family, ssm, tol=1e-3, relative=True, multiplicity=multiplicity)


# ---- multiplicity and totals in scalars -------------------------------------------------


def test_totals_weigh_each_unit_by_its_multiplicity():
    ssm = diagonal_ssm(12, 3, units=4, seed=1)
    lay = _layer(ssm, multiplicity=5)
    assert lay.multiplicity.tolist() == [5, 5, 5, 5]
    assert np.allclose(lay.total_tss(), 4 * 5 * 3)  # 4 heads x 5 channels x N = 3 states
    assert np.allclose(lay.total("tolerance"), 5 * lay.tolerance_ess.sum(0))
    assert np.allclose(lay.total("entropy"), 5 * lay.entropy_ess.sum(0))
    plain = _layer(ssm)
    assert plain.multiplicity.tolist() == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="variant"):
        lay.total("nope")


def test_multiplicity_is_saved_and_old_files_load_with_one(tmp_path):
    lay = _layer(diagonal_ssm(10, 2, units=3, seed=2), multiplicity=4)
    result = ESSResult([str(i) for i in range(10)], list(range(10)), {0: lay}, {"tol": 1e-3, "relative": True})
    path = result.save(tmp_path / "r.npz")
    back = ESSResult.load(path)
    assert back.layer(0).multiplicity.tolist() == [4, 4, 4]
    frame = back.to_frame()
    assert (frame["multiplicity"] == 4).all() and len(frame) == 30
    # A file written before multiplicity existed: the same archive without that array.
    old = tmp_path / "old.npz"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():
            if "multiplicity" not in item.filename:
                dst.writestr(item, src.read(item.filename))
    legacy = ESSResult.load(old).layer(0)
    assert legacy.multiplicity.tolist() == [1, 1, 1]
    assert np.array_equal(legacy.tolerance_ess, lay.tolerance_ess)


def test_summary_table_reports_totals_in_scalars():
    lay = _layer(diagonal_ssm(10, 2, units=3, seed=3), multiplicity=4)
    result = ESSResult([str(i) for i in range(10)], list(range(10)), {0: lay}, {"tol": 1e-3, "relative": True})
    row = summary_table(result).iloc[0]
    assert row["multiplicity"] == 4
    assert row["total_tss"] == pytest.approx(3 * 4 * 2)
    assert row["total_ess"] == pytest.approx(float((4 * lay.tolerance_ess).sum(0).max()))


def _zoo(name):
    from ess_explorer import zoo
    from ess_explorer.sources import load_model

    if name not in zoo.list_models():
        pytest.skip(f"zoo model {name} is not on disk")
    return load_model(f"zoo:{name}")[0]


def test_mamba_and_mamba2_with_the_same_state_report_the_same_total_tss():
    from ess_explorer import analyze

    mamba, mamba2 = _zoo("mamba_n16"), _zoo("mamba2_n16")
    ids = list(range(3, 15))
    totals = {}
    for name, model in (("mamba", mamba), ("mamba2", mamba2)):
        lay = analyze(model, ids, layers=[0], progress=False).layer(0)
        totals[name] = lay.total_tss()
    cfg, cfg2 = mamba.config, mamba2.config
    state_numbers = cfg.intermediate_size * cfg.state_size  # per layer: channels x N
    assert state_numbers == cfg2.num_heads * cfg2.head_dim * cfg2.state_size
    assert np.allclose(totals["mamba"], state_numbers) and np.allclose(totals["mamba2"], state_numbers)
