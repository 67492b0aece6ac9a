"""Without ``layer=`` the explorer opens on the layer that holds the memory (app/plan.py
`opening_layer`: the model card's memory layer, else the highest utilisation against the
ceiling) and says why in its status line."""

from __future__ import annotations

from ess_explorer import zoo
from ess_explorer.app import widget


def test_lfm2_opens_on_its_attention_layer_and_says_why():
    """zoo:lfm2 is a short convolution (layer 0, flat near its TSS) and the attention layer
    that carries the pairs to the queries (layer 1, the card's memory layer)."""
    assert zoo.card("lfm2")["ess"]["memory_layer"] == 1
    ex = widget.explore("zoo:lfm2", static=False, cache=False, background=False)
    assert ex.layer == 1 and ex.layer_w.value == 1
    assert "opened on layer 1: the memory layer of the model card of zoo:lfm2" in ex.status_w.value
    assert ex.result.layers[0].family != ex.result.layers[1].family
    # once the user picks another layer the line no longer says the view is the opened one
    ex.layer = 0
    assert "opened on layer 1" not in ex.status_w.value
    assert "layer 0 (opened on 1: the memory layer of the model card" in ex.status_w.value
    assert "analysed 2 layers" in ex.status_w.value
    ex.layer = 1
    assert "opened on layer 1: the memory layer" in ex.status_w.value


def test_a_layer_asked_for_is_kept():
    ex = widget.explore("zoo:lfm2", static=False, cache=False, background=False, layer=0)
    assert ex.layer == 0 and "opened on layer" not in ex.status_w.value
