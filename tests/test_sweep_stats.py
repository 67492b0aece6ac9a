"""Statistics over a sweep table, on hand-made tables whose answers are worked out by hand."""

import numpy as np
import pandas as pd
import pytest

from ess_explorer import summarize
from ess_explorer.sweep.stats import bootstrap_mean, modulation, utilisation
from ess_explorer.sweep.table import COLUMNS


def table(rows):
    """rows: dicts with prompt_id, unit, t, tolerance_ess and optional others."""
    defaults = {
        "model": "m",
        "checkpoint_step": pd.NA,
        "layer": 0,
        "multiplicity": 1,
        "token": "a",
        "family": "mamba",
        "entropy_ess": 0.0,
        "tss": 4.0,
        "nuclear_norm": np.nan,
    }
    frame = pd.DataFrame([{**defaults, **row} for row in rows])
    frame["checkpoint_step"] = frame["checkpoint_step"].astype("Int64")
    if "causal_ess" in COLUMNS:
        frame["causal_ess"] = np.nan
    return frame[COLUMNS]


def test_summarize_weights_units_by_multiplicity_and_averages_prompts():
    # Per prompt p: units worth 2 (x1) and 6 (x3) -> (2 + 18) / 4 = 5, plus p.
    rows = [
        {"prompt_id": p, "unit": u, "t": 1, "tolerance_ess": v + p, "multiplicity": m}
        for p in range(4)
        for u, v, m in [(0, 2, 1), (1, 6, 3)]
    ]
    out = summarize(table(rows))
    assert len(out) == 1 and out.n_prompts[0] == 4
    assert out["mean"][0] == pytest.approx(6.5)  # mean of 5, 6, 7, 8
    assert 5 <= out["low"][0] < 6.5 < out["high"][0] <= 8
    same = summarize(table([{"prompt_id": p, "unit": 0, "t": 1, "tolerance_ess": 3} for p in range(5)]))
    assert same["low"][0] == same["mean"][0] == same["high"][0] == 3


def test_bootstrap_interval_matches_the_normal_approximation():
    values = np.random.default_rng(1).normal(size=400)
    mean, low, high = bootstrap_mean(values[:, None], np.ones((400, 1)), n_boot=4000, seed=0)
    half = 1.96 * values.std(ddof=1) / np.sqrt(400)
    assert mean[0] == pytest.approx(values.mean())
    assert (high[0] - low[0]) / 2 == pytest.approx(half, rel=0.1)
    assert low[0] < mean[0] < high[0]


def test_summarize_keeps_runs_and_layers_apart():
    rows = [
        {
            "prompt_id": p,
            "unit": 0,
            "t": t,
            "tolerance_ess": 10 * step + layer + t,
            "checkpoint_step": step,
            "layer": layer,
        }
        for p in range(2)
        for t in (1, 2)
        for step in (1, 2)
        for layer in (0, 1)
    ]
    out = summarize(table(rows))
    assert len(out) == 8
    assert list(out.columns[:4]) == ["model", "checkpoint_step", "layer", "t"]
    for row in out.itertuples():
        assert row.mean == 10 * row.checkpoint_step + row.layer + row.t
    with pytest.raises(ValueError, match="over prompts"):
        summarize(table(rows), by=("prompt_id",))


def test_modulation_at_a_token_over_every_occurrence():
    ess0 = [0, 1, 4, 4, 4, 4, 1, 4, 4, 2]  # "|" at t = 6 and t = 9
    ess1 = [0, 2, 2, 2, 2, 1]  # "|" at t = 5 (with surrounding spaces: matched after strip)
    rows = [
        {"prompt_id": 0, "unit": 0, "t": t, "tolerance_ess": e, "token": "|" if t in (6, 9) else "x"}
        for t, e in enumerate(ess0)
    ]
    rows += [
        {"prompt_id": 1, "unit": 0, "t": t, "tolerance_ess": e, "token": " | " if t == 5 else "x"}
        for t, e in enumerate(ess1)
    ]
    out = modulation(table(rows), "|", window=4)
    scores = [1 - 1 / 4, 1 - 2 / np.mean([4, 1, 4, 4]), 1 - 1 / 2]
    assert out["n_occurrences"][0] == 3 and out["n_prompts"][0] == 2
    assert out["mean"][0] == pytest.approx(np.mean(scores))
    assert out["low"][0] <= out["mean"][0] <= out["high"][0]
    with pytest.raises(ValueError, match="does not occur"):
        modulation(table(rows), "EOS")


def test_utilisation_is_peak_ess_over_peak_tss_without_t0():
    rows = [
        {"prompt_id": 0, "unit": 0, "t": t, "tolerance_ess": e, "tss": s}
        for t, e, s in [(0, 0, 0.0), (1, 1, 2.0), (2, 3, 8.0), (3, 2, 8.0)]
    ]
    out = utilisation(table(rows))
    assert out["utilisation"].tolist() == [3 / 8]
