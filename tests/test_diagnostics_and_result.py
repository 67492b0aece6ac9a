"""Diagnostics (TSS, utilisation, flags, modulation) and the ESSResult contract."""

import json
import zipfile

import numpy as np
import pytest
import torch

from ess_explorer import hankel_singular_values, tolerance_ess
from ess_explorer.core.diagnostics import (
    classify_utilisation,
    layer_diagnostics,
    modulation_at,
    theoretical_state_size,
    utilisation,
)
from ess_explorer.core.operators import DiagonalSSM
from ess_explorer.core.precision import Accuracy
from ess_explorer.result import ESSResult, LayerESS
from ess_explorer.synthetic import diagonal_ssm, reference_result


@pytest.fixture(scope="module")
def result():
    return reference_result(length=32)


def test_theoretical_state_size_per_family():
    t = np.arange(6)
    np.testing.assert_array_equal(theoretical_state_size("softmax_attention", t), t)
    np.testing.assert_array_equal(theoretical_state_size("softmax_attention", t, window=3), [0, 1, 2, 2, 2, 2])
    np.testing.assert_array_equal(theoretical_state_size("mamba", t, state_size=16), np.full(6, 16))
    np.testing.assert_array_equal(theoretical_state_size("short_conv", t, kernel_size=3), np.full(6, 2))
    with pytest.raises(ValueError, match="unknown family"):
        theoretical_state_size("rnn", t)
    with pytest.raises(ValueError, match="needs state_size"):
        theoretical_state_size("mamba2", t)


def test_classification_thresholds():
    labels = classify_utilisation(np.array([0.0, 0.1, 0.5, 0.9, 1.0]))
    assert list(labels) == ["collapsed", "collapsed", "normal", "saturated", "saturated"]
    assert classify_utilisation(0.5, saturated=0.4, collapsed=0.2) == "saturated"
    with pytest.raises(ValueError, match="collapsed < saturated"):
        classify_utilisation(0.5, saturated=0.1, collapsed=0.2)
    np.testing.assert_array_equal(utilisation([2, 4], [4, 0]), [0.5, 0.0])


def layer_from_ssm(ssm, state_size, tol=1e-3):
    positions = np.arange(ssm.length)
    return LayerESS.from_operator(
        0, "mamba", ssm, theoretical_state_size("mamba", positions, state_size=state_size), tol=tol, relative=True
    )


def test_saturated_and_collapsed_layers_are_flagged():
    length, modes = 48, 16
    busy = diagonal_ssm(length, modes, units=2, seed=0)  # generic: uses every mode
    g = torch.Generator().manual_seed(1)
    a = torch.full((2, length, modes), 1e-3, dtype=torch.float64)  # forgets at once
    b = torch.zeros(2, length, modes, dtype=torch.float64)
    b[..., 0] = 1.0  # and only one mode is ever written
    idle = DiagonalSSM(a, b, torch.randn(2, length, modes, generator=g, dtype=torch.float64))
    saturated = layer_diagnostics(layer_from_ssm(busy, modes, tol=1e-10))
    collapsed = layer_diagnostics(layer_from_ssm(idle, modes))
    assert saturated["state"] == "saturated" and saturated["n_saturated"] == 2
    assert collapsed["state"] == "collapsed" and collapsed["n_collapsed"] == 2
    assert collapsed["utilisation"] == pytest.approx(1 / modes)
    assert saturated["thresholds"] == {"saturated": 0.9, "collapsed": 0.1}


def test_modulation_is_one_where_the_state_is_emptied(result):
    ssm_layer = result.layer(2)  # the diagonal SSM whose decay is 0 at each separator
    scores = modulation_at(ssm_layer.tolerance_ess, ssm_layer.positions, result.meta["separators"])
    np.testing.assert_allclose(scores, 1.0)
    attention = result.layer(0)  # softmax attention keeps everything: ESS barely moves
    assert (modulation_at(attention.tolerance_ess, attention.positions, [16]) < 0.2).all()
    with pytest.raises(ValueError, match="was not computed"):
        modulation_at(ssm_layer.tolerance_ess, ssm_layer.positions, [999])


def test_layer_from_operator_matches_the_core(result):
    # the stored values meet the result's contract: exact to rounding, or within the "ess"
    # resolution of each cut's sigma_1 (core/precision.py)
    resolution = Accuracy(result.meta["precision"], result.meta["tol"]).resolution
    for layer in result.layers.values():
        for unit, op in layer.operators.items():
            expected = tolerance_ess(torch.from_numpy(op), tol=result.meta["tol"]).numpy()
            np.testing.assert_array_equal(layer.tolerance_ess[unit], expected)
            sigma = hankel_singular_values(torch.from_numpy(op), method="svd").numpy()
            width = layer.singular_values.shape[-1]
            bound = 1e-7 * sigma[:, :width] + 1e-12 + resolution * sigma[:, :1]
            assert (np.abs(layer.singular_values[unit] - sigma[:, :width]) <= bound).all()


def test_tolerance_recomputed_from_kept_values(result):
    layer = result.layer(0)
    ess, exact = layer.tolerance_ess_at(result.meta["tol"], relative=True)
    np.testing.assert_array_equal(ess, layer.tolerance_ess)
    assert exact.all()
    truncated = LayerESS(**{**layer.__dict__, "singular_values": layer.singular_values[..., :3]})
    ess3, exact3 = truncated.tolerance_ess_at(1e-6)
    assert (ess3 <= 3).all() and not exact3[:, 10].any() and exact3[:, :3].all()


def test_to_frame_is_tidy(result):
    frame = result.to_frame()
    for column in ["layer", "unit", "t", "token", "family", "tolerance_ess", "entropy_ess", "tss"]:
        assert column in frame.columns
    assert len(frame) == sum(lay.n_units * len(lay.positions) for lay in result.layers.values())
    row = frame[(frame.layer == 1) & (frame.unit == 2) & (frame.t == 15)].iloc[0]
    assert row.token == result.tokens[15] == "|"
    assert row.tolerance_ess == result.layer(1).tolerance_ess[2, 15] and row.family == "short_conv"


def test_save_load_round_trip_without_pickle(result, tmp_path):
    path = result.save(tmp_path / "run")
    assert path.suffix == ".npz"
    back = ESSResult.load(path)
    assert back.tokens == result.tokens and back.meta["model_id"] == "synthetic:reference"
    for index, layer in result.layers.items():
        other = back.layer(index)
        assert other.family == layer.family and sorted(other.operators) == sorted(layer.operators)
        # stored in float32, the precision the views draw (the ESS values are stored as computed)
        np.testing.assert_array_equal(other.singular_values, layer.singular_values.astype(np.float32))
        np.testing.assert_array_equal(other.tolerance_ess, layer.tolerance_ess)
    with zipfile.ZipFile(path) as archive:  # the header is plain JSON
        header = json.loads(np.lib.format.read_array(archive.open("__header__.npy")).tobytes())
    assert header["meta"]["package_version"]


def test_corrupt_or_missing_result_files(tmp_path, result):
    path = result.save(tmp_path / "run.npz")
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="not a readable ESS result"):
        ESSResult.load(path)
    with pytest.raises(FileNotFoundError):
        ESSResult.load(tmp_path / "absent.npz")
    with pytest.raises(KeyError, match="analysed layers"):
        result.layer(99)


def test_full_rank_attention_is_saturated_against_its_ceiling_not_against_tss(result):
    # ESS(t) = min(t, L - t): all the ceiling min(TSS, t, L - t) allows, at any prompt length
    attention = layer_diagnostics(result.layer(0))
    np.testing.assert_allclose(attention["unit_utilisation"], 1.0)
    assert attention["state"] == "saturated" and attention["against"] == "ceiling"
    # the paper's ratio: against TSS(t) = t the ratio of peaks is (L/2) / (L-1), never saturated
    paper = layer_diagnostics(result.layer(0), against="tss")
    length = len(result.tokens)
    np.testing.assert_allclose(paper["unit_utilisation"], (length // 2) / (length - 1))
    assert paper["state"] == "normal"
    assert attention["tss_utilisation"] == pytest.approx(paper["utilisation"])
    assert paper["ceiling_utilisation"] == pytest.approx(1.0)
    assert attention["peak_ceiling"] == pytest.approx(length // 2)
    assert attention["peak_tss"] == pytest.approx(length - 1)


def test_a_bounded_state_is_judged_the_same_both_ways(result):
    # a recurrence with L >= 2N: the peaks of TSS and of the ceiling are both N
    ssm = result.layer(2)
    both = [layer_diagnostics(ssm, against=a)["unit_utilisation"] for a in ("ceiling", "tss")]
    np.testing.assert_allclose(*both)
    with pytest.raises(ValueError, match="against"):
        layer_diagnostics(ssm, against="capacity")


def test_modulation_lag_finds_a_drop_after_the_separator():
    ess = np.array([4.0, 4.0, 4.0, 4.0, 4.0, 1.0, 4.0])  # drops one token after t = 4
    positions = np.arange(7)
    assert modulation_at(ess, positions, [4], window=2, lag=0)[0] == 0.0
    assert modulation_at(ess, positions, [4], window=2, lag=1)[0] == pytest.approx(0.75)
