"""Sweep figures: bands and error bars drawn from the statistics' own columns, in the paper theme."""

import pandas as pd
import pytest

from ess_explorer.views.render import save_figure
from ess_explorer.views.sweep_figures import (
    sweep_checkpoints,
    sweep_ess_time,
    sweep_modulation,
    sweep_utilisation,
)


def summary(**extra):
    rows = [
        {
            "model": m,
            "checkpoint_step": pd.NA,
            "layer": layer,
            "t": t,
            "mean": t + layer,
            "low": t + layer - 0.5,
            "high": t + layer + 0.5,
            "n_prompts": 3,
            **extra,
        }
        for m in ("a", "b")
        for layer in (0, 1)
        for t in range(4)
    ]
    return pd.DataFrame(rows)


def marks(spec):
    return [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"] for layer in spec["layer"]]


def test_ess_time_draws_the_interval_as_a_band_under_the_mean():
    spec = sweep_ess_time(summary(), layers=[1]).to_dict()
    assert marks(spec) == ["area", "line"]
    band, line = spec["layer"]
    assert (band["encoding"]["y"]["field"], band["encoding"]["y2"]["field"], line["encoding"]["y"]["field"]) == (
        "low",
        "high",
        "mean",
    )
    (data,) = spec["datasets"].values()
    assert {row["series"] for row in data} == {"a", "b"}  # one layer chosen: the series are the models
    assert spec["width"] == 240 and spec["config"]["range"]["category"][0] == "#0072B2"  # the paper theme


def test_modulation_error_bars_and_checkpoints_and_utilisation(tmp_path):
    frame = pd.DataFrame(
        {
            "model": ["a", "b"],
            "checkpoint_step": [pd.NA, pd.NA],
            "layer": [0, 0],
            "mean": [0.2, 0.4],
            "low": [0.1, 0.3],
            "high": [0.3, 0.5],
        }
    )
    spec = sweep_modulation(frame, token="|").to_dict()
    assert marks(spec) == ["rule", "rule", "point"]
    assert spec["layer"][1]["encoding"]["y2"]["field"] == "high"
    steps = summary().drop(columns="t").assign(checkpoint_step=[10, 20] * 8)
    assert marks(sweep_checkpoints(steps).to_dict()) == ["area", "line"]
    with pytest.raises(ValueError, match="checkpoint steps"):
        sweep_checkpoints(summary().drop(columns="t"))
    with pytest.raises(ValueError, match=r"needs the columns \['low', 'high'\]"):
        sweep_ess_time(summary().drop(columns=["low", "high"]))
    util = pd.DataFrame({"model": ["a"] * 4, "layer": [0, 0, 1, 1], "utilisation": [0.1, 0.5, 0.7, 0.9]})
    path = save_figure(sweep_utilisation(util), tmp_path / "util.png")
    assert path.stat().st_size > 1000
