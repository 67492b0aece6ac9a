"""The teaching notebook's helpers (ess_explorer/teaching.py, views/teaching_charts.py) against
closed forms and independent constructions."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ess_explorer import synthetic, tolerance_ess
from ess_explorer.teaching import (
    attainable_ceiling,
    lti_ssm,
    memory_at_cut,
    realisation_factors,
    recall_answers,
    truncation_errors,
)


def test_realisation_factors_rebuild_the_cut_of_the_materialised_operator():
    length, n = 20, 3
    ssm = synthetic.diagonal_ssm(length, n, seed=5)
    T = ssm.materialize()[0].to(torch.float64)  # built by the operator's own (different) code path
    for t in (1, 7, 19):
        O_t, R_t = realisation_factors(ssm, t)
        assert O_t.shape == (length - t, n) and R_t.shape == (n, t)
        assert torch.allclose((O_t @ R_t).to(torch.float64), T[t:, :t], atol=1e-10)
    with pytest.raises(ValueError, match="1..L-1"):
        realisation_factors(ssm, 0)


def test_truncation_errors_follow_eckart_young_on_a_diagonal_matrix():
    H = torch.diag(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64))
    rows = truncation_errors(H, max_state=4)
    assert [r["state size m"] for r in rows] == [0, 1, 2, 3, 4]
    # the best rank-m approximation of diag(3, 2, 1) leaves the (m + 1)-th diagonal entry
    assert [round(r["worst-case error"], 12) for r in rows] == [3.0, 2.0, 1.0, 0.0, 0.0]
    assert [r["sigma_{m+1}"] for r in rows] == [3.0, 2.0, 1.0, 0.0, 0.0]


def test_lti_ssm_stays_below_its_state_and_rejects_an_unstable_decay():
    assert int(tolerance_ess(lti_ssm(32, 8, 0.9))[0].max()) < 8
    with pytest.raises(ValueError, match="decay"):
        lti_ssm(32, 4, 1.0)


def test_attainable_ceiling_is_min_of_tss_and_the_cut_shape():
    result = synthetic.reference_result()
    t = np.arange(result.length)
    edge = np.minimum(t, result.length - t)
    for lay in result.layers.values():
        ceiling = attainable_ceiling(lay)
        assert ceiling.shape == lay.tss.shape
        assert (np.asarray(lay.tolerance_ess) <= ceiling + 1e-12).all()  # no unit exceeds what it could reach
    attention = result.layer(0)
    assert attention.family == "softmax_attention"  # TSS = t: the ceiling is min(t, L - t)
    assert (attainable_ceiling(attention) == edge[None, :]).all()


def test_memory_at_cut_sums_units_and_rejects_a_missing_cut():
    result = synthetic.reference_result()
    rows = memory_at_cut(result, 20)
    assert [r["layer"] for r in rows] == sorted(result.layers)
    conv = next(r for r in rows if r["family"] == "short_conv")
    lay = result.layer(conv["layer"])
    expected = float((lay.multiplicity * lay.tolerance_ess[:, 20]).sum())  # totals count scalars
    assert conv["ESS"] == expected and conv["units"] == lay.n_units
    assert all(r["ESS"] <= r["ceiling"] <= r["TSS"] or r["family"] == "softmax_attention" for r in rows)
    with pytest.raises(ValueError, match="not computed"):
        memory_at_cut(result, 10_000)


class _Predicts:
    """A stand-in causal LM whose logits at position p put all mass on token (p + 1) % V."""

    def __init__(self, vocab=10):
        self.vocab = vocab

    def __call__(self, input_ids):
        length = input_ids.shape[1]
        logits = torch.zeros(1, length, self.vocab)
        logits[0, torch.arange(length), (torch.arange(length) + 1) % self.vocab] = 1.0
        return SimpleNamespace(logits=logits)


def test_recall_answers_reads_the_logits_one_position_earlier():
    ids = torch.tensor([4, 5, 6, 7, 8, 9])
    labels = torch.full((6,), -100)
    labels[3], labels[5] = 3, 0  # asked at positions 3 and 5; the model predicts 3 there, then 5
    out = recall_answers(_Predicts(), ids, labels)
    assert out["positions"].tolist() == [3, 5]
    assert out["predicted"].tolist() == [3, 5] and out["target"].tolist() == [3, 0]
    assert out["correct"].tolist() == [True, False]
    labels[0] = 1
    with pytest.raises(ValueError, match="position 0"):
        recall_answers(_Predicts(), ids, labels)


def test_pdf_page_size_of_an_exported_single_column_figure(tmp_path):
    alt = pytest.importorskip("altair")
    pytest.importorskip("vl_convert")
    import pandas as pd

    from ess_explorer.views.figures import apply_paper_theme
    from ess_explorer.views.render import save_figure, to_png
    from ess_explorer.views.teaching_charts import pdf_page_points, png_width

    chart = apply_paper_theme(
        alt.Chart(pd.DataFrame({"x": [0, 1], "y": [0, 1]})).mark_line().encode(x="x:Q", y="y:Q"),
        width="single",
        height=150,
    )
    width, height = pdf_page_points(save_figure(chart, tmp_path / "f.pdf"))
    assert abs(width - 240) < 1.5 and abs(height - 150) < 1.5
    assert png_width(to_png(chart, scale=2.0)) == pytest.approx(480, abs=3)
    with pytest.raises(ValueError, match="MediaBox"):
        (tmp_path / "x.txt").write_text("not a pdf")
        pdf_page_points(tmp_path / "x.txt")


def test_slider_panel_redraws_its_image_when_a_slider_moves():
    W = pytest.importorskip("ipywidgets")
    pytest.importorskip("vl_convert")
    from ess_explorer.views import teaching_charts as draw

    seen = []

    def chart(kernel, width):
        seen.append((kernel, width))
        return draw.mixers_over_time({"convolution": synthetic.convolution(16, kernel, seed=0)}, width=width)

    panel = draw.slider_panel(chart, kernel=W.IntSlider(3, 1, 8), width=W.fixed(200))
    slider, image = panel.children[0], panel.children[-1]
    first = bytes(image.value)
    assert first.startswith(b"\x89PNG") and seen == [(3, 200)]
    slider.value = 6
    assert seen[-1] == (6, 200) and bytes(image.value) != first
