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


# ---- tolerance scope --------------------------------------------------------------------

from ess_explorer.core.diagnostics import layer_modulation, modulation_at  # noqa: E402
from ess_explorer.core.ess import entropy_ess, tolerance_ess  # noqa: E402


def _near_reset(length=16, n=8, sep=3, factor=1e-4, seed=5):
    ssm = diagonal_ssm(length, n, units=1, seed=seed)
    a = ssm.a.clone()
    a[:, sep, :] *= factor
    return ssm, DiagonalSSM(a, ssm.b, ssm.c, ssm.d)


def test_scope_sets_the_reference_sigma_1():
    sigma = torch.tensor(
        [[[4.0, 1.0, 0.03], [1.0, 0.5, 0.02]], [[10.0, 0.09, 0.0], [2.0, 0.01, 0.0]]], dtype=torch.float64
    )  # (U=2, P=2, K=3)
    # cut: tau = 0.01 x (4, 1 | 10, 2)
    assert tolerance_ess(spectra=sigma, tol=0.01, scope="cut").tolist() == [[2, 3], [1, 1]]
    # unit: unit 0 refers to 4, unit 1 to 10; tol 0.2 -> tau 0.8 and 2
    assert tolerance_ess(spectra=sigma, tol=0.2, scope="unit").tolist() == [[2, 1], [1, 0]]
    # layer: everything refers to 10; tol 0.2 -> tau 2
    assert tolerance_ess(spectra=sigma, tol=0.2, scope="layer").tolist() == [[1, 0], [1, 0]]
    with pytest.raises(ValueError, match="absolute"):
        tolerance_ess(spectra=sigma, tol=0.01, relative=False, scope="unit")
    with pytest.raises(ValueError, match="scope"):
        tolerance_ess(spectra=sigma, scope="token")


def test_layer_scope_equals_the_block_operators_tolerance_ess():
    """The layer read as one block-diagonal operator (time-major channels): its cut after
    time step t is the direct sum of the units' cuts H_t, so its count with the reset-aware
    reference (its own largest sigma_1 over cuts, scope "unit") is the sum of the units'
    counts at scope "layer"."""
    ssm = diagonal_ssm(10, 3, units=3, seed=7)
    dense = ssm.materialize()
    scale = torch.tensor([1.0, 30.0, 0.2], dtype=torch.float64)[:, None, None]
    dense = dense * scale  # units on different scales, so the scope matters
    block = torch.block_diag(*dense)  # (3L, 3L) but with unit-major rows: permute to time-major
    length = 10
    order = torch.arange(3 * length).reshape(3, length).T.reshape(-1)  # time-major interleave
    block = block[order][:, order]
    positions = torch.arange(length)
    per_unit = tolerance_ess(dense, tol=1e-2, scope="layer").sum(0)  # (L,)
    whole = tolerance_ess(block, tol=1e-2, positions=3 * positions, scope="unit")  # cuts after whole time steps
    assert torch.equal(per_unit, whole)
    assert not torch.equal(tolerance_ess(dense, tol=1e-2, scope="cut").sum(0), whole)


def test_near_reset_modulation_unit_scope_vs_cut_scope():
    length, n, sep = 16, 8, 3
    plain, reset = _near_reset(length, n, sep)
    lay = LayerESS.from_operator(0, "lti_ssm", reset, tol=1e-3, relative=True)
    unscaled = LayerESS.from_operator(0, "lti_ssm", plain, tol=1e-3, relative=True)
    # The per-cut scope is blind to the uniform scaling of H_sep (every entry of H_sep crosses
    # the scaled decay): ESS(sep) is the generic min(s, N) of the operator without the reset.
    assert lay.tolerance_ess[0, sep] == unscaled.tolerance_ess[0, sep] == min(sep, n)
    # Before the separator only the s - t rows before it keep their scale: ESS(t) = min(t, s - t, N)
    # = 1, 1 at t = 1, 2; so the per-cut modulation is 1 - 3 / 1 = -2, a "rise" at a near-reset.
    assert lay.tolerance_ess[0, 1:sep].tolist() == [min(t, sep - t, n) for t in range(1, sep)]
    per_cut = layer_modulation(lay, [sep], scope="cut", lag=0)[0]  # at the separator itself
    assert per_cut == pytest.approx(1 - min(sep, n) / np.mean([min(t, sep - t, n) for t in range(1, sep)]))
    assert per_cut < 0
    # Entropy-ESS is blind in the same way.
    assert entropy_ess(spectra=lay.singular_values)[0, sep] == pytest.approx(
        float(entropy_ess(spectra=unscaled.singular_values)[0, sep]), rel=1e-6
    )
    # The reset-aware default sees it.
    assert layer_modulation(lay, [sep])[0] >= 0.9
    # Without the reset the reset-aware scope reports the growth min(t, N): 1 - 3 / mean(1, 2).
    assert layer_modulation(unscaled, [sep])[0] == pytest.approx(1 - 3 / 1.5)
    # The same through analyze-style arrays: scope="unit" at build time equals the recount.
    built = LayerESS.from_operator(0, "lti_ssm", reset, tol=1e-3, relative=True, scope="unit")
    assert np.array_equal(built.tolerance_ess, lay.tolerance_ess_at(1e-3, True, "unit")[0])
    assert modulation_at(built.tolerance_ess[0].astype(float), built.positions, [sep])[0] >= 0.9


def test_layer_scope_in_chunks_matches_one_pass(monkeypatch):
    import ess_explorer.core.layer as layer_module

    ssm = diagonal_ssm(12, 3, units=5, seed=9)
    scaled = DiagonalSSM(ssm.a, ssm.b * torch.tensor([1.0, 50.0, 0.3, 2.0, 0.01])[:, None, None], ssm.c, ssm.d)
    one = LayerESS.from_operator(0, "lti_ssm", scaled, tol=1e-3, relative=True, scope="layer")
    monkeypatch.setattr(layer_module, "UNIT_CHUNK_VALUES", 12 * 3)  # one unit per chunk
    chunked = LayerESS.from_operator(0, "lti_ssm", scaled, tol=1e-3, relative=True, scope="layer")
    assert np.array_equal(one.tolerance_ess, chunked.tolerance_ess)
    assert np.array_equal(one.causal_ess, chunked.causal_ess)
    cut = LayerESS.from_operator(0, "lti_ssm", scaled, tol=1e-3, relative=True)
    assert (one.tolerance_ess <= cut.tolerance_ess).all() and (one.tolerance_ess < cut.tolerance_ess).any()


# ---- causal ESS -------------------------------------------------------------------------

from ess_explorer.core.causal import reachability_singular_values  # noqa: E402
from ess_explorer.synthetic import softmax_attention  # noqa: E402


def _reachability(ssm, t):
    """R_t built column by column: column j = (prod_{k=j+1..t-1} a_k) b_j."""
    a, b = ssm.a[0], ssm.b[0]
    cols = []
    for j in range(t):
        decay = torch.prod(a[j + 1 : t], dim=0) if j + 1 < t else torch.ones_like(a[0])
        cols.append(decay * b[j])
    return torch.stack(cols, dim=1)


def test_reachability_spectra_match_the_explicit_matrix():
    ssm = diagonal_ssm(9, 4, units=1, seed=11)
    sigma = reachability_singular_values(ssm, torch.arange(9))
    assert torch.equal(sigma[0, 0], torch.zeros(4))
    for t in range(1, 9):
        explicit = torch.linalg.svdvals(_reachability(ssm, t))
        assert torch.allclose(sigma[0, t, : len(explicit)], explicit, rtol=1e-10, atol=1e-12)


def test_causal_ess_closed_forms():
    length, n = 14, 4
    lay = LayerESS.from_operator(0, "lti_ssm", diagonal_ssm(length, n, units=2, seed=12), tol=1e-3, relative=True)
    expected = np.minimum(np.arange(length), n)  # generic: min(t, N), past the middle too
    assert np.array_equal(lay.causal_ess, np.broadcast_to(expected, (2, length)))
    reset_at = 6
    reset = LayerESS.from_operator(
        0, "lti_ssm", diagonal_ssm(length, n, seed=12, resets=[reset_at]), tol=1e-3, relative=True
    )
    assert reset.causal_ess[0, reset_at + 1] == 1  # only b_s u_s is left in the state
    assert reset.causal_ess[0, reset_at] == n  # the cut before the reset still holds everything
    attention = LayerESS.from_operator(
        0, "softmax_attention", softmax_attention(10, units=2, seed=1), tol=1e-3, relative=True
    )
    assert np.array_equal(attention.causal_ess, np.broadcast_to(np.arange(10.0), (2, 10)))  # the KV cache: t
    unknown = LayerESS.from_operator(
        0, "short_conv", softmax_attention(10, units=1, seed=1), tol=1e-3, relative=True, kernel_size=3
    )
    assert np.isnan(unknown.causal_ess).all()  # a dense operator with no realisation: no guess


def test_short_conv_causal_ess_counts_its_register():
    from ess_explorer.core.units import ShortConvCapture

    length, k = 8, 3
    gate_in = torch.randn(2, length, dtype=torch.float64)
    gate_in[1, 4] = 0.0  # an input that never enters the state
    units = ShortConvCapture(
        layer=0,
        family="short_conv",
        kernel_size=k,
        gate_in=gate_in,
        gate_out=torch.randn(2, length, dtype=torch.float64),
        weight=torch.randn(2, k, dtype=torch.float64),
    )
    lay = LayerESS.from_units(units, tol=1e-3, relative=True)
    assert lay.causal_ess[0].tolist() == [min(t, k - 1) for t in range(length)]
    assert lay.causal_ess[1, 5] == 1 and lay.causal_ess[1, 6] == 1 and lay.causal_ess[1, 7] == 2


def test_causal_ess_is_saved_and_old_files_read_nan(tmp_path):
    lay = LayerESS.from_operator(0, "lti_ssm", diagonal_ssm(8, 2, units=2, seed=13), tol=1e-3, relative=True)
    result = ESSResult([str(i) for i in range(8)], list(range(8)), {0: lay}, {"tol": 1e-3, "relative": True})
    back = ESSResult.load(result.save(tmp_path / "r.npz")).layer(0)
    assert np.array_equal(back.causal_ess, lay.causal_ess)
    assert np.array_equal(result.to_frame()["causal_ess"].to_numpy(), lay.causal_ess.reshape(-1))
    old = tmp_path / "old.npz"
    with zipfile.ZipFile(tmp_path / "r.npz") as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():
            if "causal_ess" not in item.filename:
                dst.writestr(item, src.read(item.filename))
    assert np.isnan(ESSResult.load(old).layer(0).causal_ess).all()


# ---- the causal variant in the views ------------------------------------------------------


def test_causal_variant_and_totals_in_scalars_in_figures():
    from ess_explorer.core.diagnostics import layer_diagnostics
    from ess_explorer.views.figures import ess_over_time_frame, figure

    lay = _layer(diagonal_ssm(12, 3, units=2, seed=14), multiplicity=6, family="mamba2")
    result = ESSResult([str(i) for i in range(12)], list(range(12)), {0: lay}, {"tol": 1e-3, "relative": True})
    assert np.array_equal(lay.ess("causal"), lay.causal_ess)
    frame = ess_over_time_frame(result, variant="causal", unit="sum")
    assert np.allclose(frame["ess"], 6 * 2 * np.minimum(np.arange(12), 3))  # 2 heads x 6 channels x min(t, N)
    assert np.allclose(frame["tss"], 6 * 2 * 3)
    spec = figure(result, "ess_time", variant="causal", unit="sum").to_dict()
    assert "causal-ESS (total in scalars" in json_dumps(spec)
    assert layer_diagnostics(lay, variant="causal")["total_ess"] == pytest.approx(6 * 2 * 3)


def json_dumps(spec) -> str:
    import json

    return json.dumps(spec)


def test_views_recount_at_the_results_scope():
    from ess_explorer.views.charts import layer_at_tolerance

    plain, reset = _near_reset()
    lay = LayerESS.from_operator(0, "lti_ssm", reset, tol=1e-3, relative=True, scope="unit")
    result = ESSResult(
        [str(i) for i in range(16)], list(range(16)), {0: lay}, {"tol": 1e-3, "relative": True, "scope": "unit"}
    )
    recount = layer_at_tolerance(result, 0, tol=1e-2, relative=True)
    assert np.array_equal(recount.tolerance_ess, lay.tolerance_ess_at(1e-2, True, "unit")[0])
    assert not np.array_equal(recount.tolerance_ess, lay.tolerance_ess_at(1e-2, True, "cut")[0])
