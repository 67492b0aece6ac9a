"""The one modulation (core/diagnostics.py): every consumer reports the number of
`separator_modulation`, a reset reads as a drop under the default scope, and the graded
(nuclear-norm) modulation has its closed form on a diagonal SSM while the count does not move."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ess_explorer.core.diagnostics import (
    MODULATION_LAG,
    MODULATION_WINDOW,
    layer_modulation,
    modulation_values,
    separator_modulation,
    strongest_layer,
)
from ess_explorer.core.operators import DiagonalSSM
from ess_explorer.result import ESSResult, LayerESS
from ess_explorer.sweep.run import SWEEP_SCOPE
from ess_explorer.sweep.stats import modulation as sweep_modulation
from ess_explorer.sweep.table import read_table, result_table
from ess_explorer.synthetic import diagonal_ssm
from ess_explorer.views.data import ViewState, diagnostics_rows
from ess_explorer.zoo import measure
from ess_explorer.zoo.claim import _resets

LENGTH, SEPS = 40, (13, 27)


def _scaled_past(ssm: DiagonalSSM, seps, factor: float) -> DiagonalSSM:
    """The same SSM with its state scaled by ``factor`` at every separator s (a_s *= factor):
    every entry T[i, j] with j < s <= i, so the whole cut H_s, is multiplied by ``factor``."""
    a = ssm.a.clone()
    for s in seps:
        a[..., s, :] *= factor
    return DiagonalSSM(a, ssm.b, ssm.c, ssm.d)


def _layer(factor: float, index: int = 0, scope: str = "cut", units: int = 3) -> LayerESS:
    ssm = _scaled_past(diagonal_ssm(LENGTH, 4, units=units, seed=index + 5), SEPS, factor)
    return LayerESS.from_operator(
        index, "mamba", ssm, tol=1e-3, relative=True, scope=scope, multiplicity=2 if index else None
    )


def _result(factor: float, scope: str = "cut") -> ESSResult:
    tokens = ["|" if t in SEPS else "ab" for t in range(LENGTH)]
    layers = {i: _layer(factor if i == 1 else 1.0, i, scope) for i in (0, 1)}  # layer 1 resets, layer 0 not
    return ESSResult(tokens=tokens, input_ids=list(range(LENGTH)), layers=layers, meta={"tol": 1e-3, "relative": True})


def _one(layer: LayerESS, measure_name: str = "count") -> np.ndarray:
    """The one definition written out: layer total in scalars of the measure's values."""
    values = modulation_values(layer, measure_name)
    return separator_modulation(values, layer.multiplicity, layer.positions, SEPS)


@pytest.mark.parametrize("factor", [1.0, 0.26, 1e-4])
def test_every_consumer_reports_the_one_modulation(tmp_path, factor, monkeypatch):
    result = _result(factor)
    one = {i: _one(result.layer(i)) for i in result.layers}
    graded = {i: _one(result.layer(i), "graded") for i in result.layers}
    for i, lay in result.layers.items():
        np.testing.assert_allclose(layer_modulation(lay, SEPS), one[i])
        np.testing.assert_allclose(layer_modulation(lay, SEPS, measure="graded"), graded[i])

    # the explorer / report diagnostics: mean over separators, per layer
    rows = {r["layer"]: r for r in diagnostics_rows(result, ViewState.of(result))}
    for i in result.layers:
        assert rows[i]["modulation"] == pytest.approx(one[i].mean(), abs=1e-4)
        assert rows[i]["graded_modulation"] == pytest.approx(graded[i].mean(), abs=1e-4)

    # the sweep statistics, on the table a sweep writes at its default (reset-aware) scope
    swept = _result(factor, scope=SWEEP_SCOPE)
    frame = result_table(swept, prompt_id=0, checkpoint_step=None).to_pandas()
    frame.insert(0, "model", "m")
    folder = tmp_path / "table" / "model=m"
    folder.mkdir(parents=True)
    frame.drop(columns="model").to_parquet(folder / "0.parquet")
    table = read_table(tmp_path)
    for name, expected in (("count", one), ("graded", graded)):
        stats = sweep_modulation(table, "|", measure=name, n_boot=50).set_index("layer")
        for i in result.layers:
            assert stats.loc[i, "mean"] == pytest.approx(expected[i].mean(), rel=1e-9), (name, i)

    # the zoo cards (separator_drop) and the claim that reads them: the strongest layer's value
    class Task:
        def separator_positions(self):
            return list(SEPS)

        def sample(self, n, seed):
            return type("Batch", (), {"input_ids": torch.zeros(1, LENGTH, dtype=torch.long)})

    monkeypatch.setattr(measure, "_analyze", lambda model, ids: result)
    drop = measure.separator_drop(None, Task(), n_prompts=2)
    best = strongest_layer({i: one[i].mean() for i in one})
    assert drop["layer"] == best and drop["modulation"] == pytest.approx(one[best].mean())
    assert drop["graded_modulation"] == pytest.approx(max(g.mean() for g in graded.values()))
    card = {"separator_drop": drop, "heldout": {"accuracy": 1.0}}
    (reset,) = _resets({"m": card})
    assert reset["modulation"] == drop["modulation"] and reset["graded_modulation"] == drop["graded_modulation"]


def test_a_reset_reads_as_a_drop_under_the_default_scope():
    reset, plain = _layer(1e-4), _layer(1.0)
    # the default: reset-aware scope, the cut at the separator counts (almost) nothing
    assert (layer_modulation(reset, SEPS) >= 0.9).all()
    assert (layer_modulation(plain, SEPS) < 0.2).all()
    # the per-cut scope at the separator itself reads the same reset as a rise: H_sep is the plain
    # cut times 1e-4 (same count), while the cuts before lose the rows after the separator
    assert (layer_modulation(reset, SEPS, scope="cut", lag=0) < 0).all()


def _geometric(q: float, n: int) -> float:
    return n if q == 1 else (1 - q**n) / (1 - q)


def _nuclear_closed_form(alpha: float, factor: float, t: int, s: int, length: int) -> float:
    """||H_t||_* of the scalar SSM T[i, j] = alpha^(i - j), times ``factor`` where j < s <= i.
    H_t is rank one, so its nuclear norm is its Frobenius norm; q = alpha^2 and geometric sums:
    t <= s:  q G(t) (G(s - t) + factor^2 q^(s - t) G(L - s))
    t = s+1: (q + factor^2 q^2 G(s)) G(L - s - 1)                     (G(n) = sum_{m<n} q^m)"""
    q = alpha**2
    if t <= s:
        squared = q * _geometric(q, t) * (_geometric(q, s - t) + factor**2 * q ** (s - t) * _geometric(q, length - s))
    elif t == s + 1:
        squared = (q + factor**2 * q**2 * _geometric(q, s)) * _geometric(q, length - s - 1)
    else:
        raise ValueError("closed form written for t <= s + 1")
    return float(np.sqrt(squared))


@pytest.mark.parametrize("alpha", [0.5, 0.9])
def test_graded_modulation_has_its_closed_form_while_the_count_stays(alpha):
    length, s, factor = 24, 12, 0.26
    ones = torch.ones(1, length, 1, dtype=torch.float64)
    ssm = _scaled_past(DiagonalSSM(alpha * ones, ones, ones), [s], factor)
    lay = LayerESS.from_operator(0, "lti_ssm", ssm, tol=1e-3, relative=True)
    before = np.mean([_nuclear_closed_form(alpha, factor, t, s, length) for t in range(s - MODULATION_WINDOW, s)])
    after = min(_nuclear_closed_form(alpha, factor, t, s, length) for t in range(s, s + MODULATION_LAG + 1))
    graded = layer_modulation(lay, [s], measure="graded")[0]
    assert graded == pytest.approx(1 - after / before, rel=1e-9)
    # the cuts before are dominated by their near past, so the drop is close to 1 - factor
    assert graded == pytest.approx(1 - factor, abs=0.05 if alpha == 0.5 else 0.25)
    assert graded > 0.5

    # the count at tau = 1e-3 (reset-aware scope) does not move for factor 0.26 ...
    plain = LayerESS.from_operator(0, "lti_ssm", _scaled_past(ssm, [s], 1 / factor), tol=1e-3, relative=True)
    assert layer_modulation(lay, [s])[0] == layer_modulation(plain, [s])[0] == 0.0
    # ... nor for a state of 4 modes (every direction stays above 1e-3 of the unit's largest sigma_1)
    wide = diagonal_ssm(length, 4, units=2, seed=3)
    scaled = LayerESS.from_operator(0, "mamba", _scaled_past(wide, [s], factor), tol=1e-3, relative=True)
    unscaled = LayerESS.from_operator(0, "mamba", wide, tol=1e-3, relative=True)
    np.testing.assert_array_equal(layer_modulation(scaled, [s]), layer_modulation(unscaled, [s]))
    assert (
        layer_modulation(scaled, [s], measure="graded")[0] > layer_modulation(unscaled, [s], measure="graded")[0] + 0.5
    )


def test_bad_measure_and_no_finite_layer_are_clear_errors():
    with pytest.raises(ValueError, match="measure must be one of"):
        layer_modulation(_layer(1.0), SEPS, measure="nuclear")
    with pytest.raises(ValueError, match="no layer has a finite modulation"):
        strongest_layer({0: float("nan"), 1: None})
    with pytest.raises(ValueError, match="one value per unit"):
        separator_modulation(np.ones((3, LENGTH)), [1, 2], np.arange(LENGTH), SEPS)
