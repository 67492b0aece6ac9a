"""The layer the explorer opens on (app/plan.opening_layer) and the typed card reader it uses
(zoo.read_card).

Expected layers come from the card files themselves (read as plain JSON here) or from the
stored ESS arrays with numpy, never from the functions under test.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from ess_explorer import zoo
from ess_explorer.app.plan import card_memory_layer, opening_layer
from ess_explorer.synthetic import reference_result


def _card_json(name: str) -> dict:
    return json.loads((zoo.model_dir(name) / "card.json").read_text())


def test_a_zoo_model_opens_on_its_cards_memory_layer():
    """LFM2: a short conv (layer 0, ESS flat at its kernel's 2) then attention (layer 1), which
    the card names as the memory layer."""
    assert _card_json("lfm2")["ess"]["memory_layer"] == 1
    layer, why = opening_layer([0, 1], source="zoo:lfm2")
    assert layer == 1 and why == "the memory layer of the model card of zoo:lfm2"
    # a finished result of it carries its source: the same answer, whatever the numbers say
    result = dataclasses.replace(reference_result(16), meta={**reference_result(16).meta, "source": "zoo:lfm2"})
    assert opening_layer([0, 1, 2, 3], result)[0] == 1


def _utilisation_against_ceiling(lay) -> float:
    """Per unit: max ESS over max min(TSS, t, L - t) on the cuts where TSS > 0; mean over units."""
    valid = lay.tss > 0
    ceiling = np.minimum(lay.tss, lay.rank_bound)
    ess = np.where(valid, lay.tolerance_ess, -np.inf).max(1)
    top = np.where(valid, ceiling, -np.inf).max(1)
    return float(np.mean(ess / top))


def test_a_model_without_a_card_opens_on_its_most_used_layer():
    result = reference_result(48)  # synthetic: no source, no card
    layer, why = opening_layer(result.layers, result)
    scores = {i: _utilisation_against_ceiling(lay) for i, lay in result.layers.items()}
    best = max(scores.values())
    assert layer == min(i for i, s in scores.items() if np.isclose(s, best))
    assert why.startswith("the highest utilisation against the ceiling") and f"{best:.2f}" in why
    assert card_memory_layer(None) is None and card_memory_layer("gpt2") is None
    assert card_memory_layer("/some/folder") is None


def test_a_card_layer_that_was_not_analysed_is_not_forced():
    # the card names layer 1; an analysis of layer 0 only opens on layer 0
    assert opening_layer([0], source="zoo:lfm2") == (0, "the first layer")


def test_read_card_gives_every_card_as_typed_fields():
    for name in zoo.list_models():
        raw, card = _card_json(name), zoo.read_card(name)
        assert isinstance(card, zoo.ModelCard)
        assert card.memory_layer == raw["ess"]["memory_layer"] and card.memory_layer in card.layers
        assert card.accuracy == raw["heldout"]["accuracy"] and card.n_queries == raw["heldout"]["n_queries"]
        assert card.pairs == raw["task"]["num_pairs"] and card.segments == raw["task"].get("num_segments", 1)
        assert card.ess_per_kv == pytest.approx(card.ess / card.pairs)
        assert [row["pairs"] for row in card.sweep] == [row["pairs"] for row in raw["sweep"]["rows"]]
        assert all({"pairs", "accuracy", "ess_per_kv", "tss_per_kv"} <= set(row) for row in card.sweep)
        assert card.state in {"saturated", "normal", "collapsed"}
        assert (card.separator_drop is None) == ("separator_drop" not in raw)


def test_read_card_errors_say_what_to_do(monkeypatch):
    with pytest.raises(ValueError, match="no zoo model 'nope'; the zoo has .*lfm2"):
        zoo.read_card("nope")
    from ess_explorer.zoo import card_record

    broken = _card_json("lfm2")
    del broken["ess"]["memory_layer"]
    monkeypatch.setattr(card_record, "_card_dict", lambda name: broken)
    with pytest.raises(ValueError, match="has no field 'memory_layer'; rewrite it with zoo.cards.write_card"):
        zoo.read_card("lfm2")
    assert card_memory_layer("zoo:lfm2") is None  # the explorer falls back on the numbers
