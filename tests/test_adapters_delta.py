"""Delta-rule models (Gated DeltaNet, KDA): the captured DPLR units are the operators the
models applied, and `analyze` on them agrees with the dense core."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from _contracts import assert_spectra_match
from test_adapters import LENGTH, build

from ess_explorer import DPLRSSM, analyze, entropy_ess, hankel_singular_values, tolerance_ess
from ess_explorer.capture import capture, layer_slots
from ess_explorer.capture.gated_delta import gated_norm
from ess_explorer.core.gates import gates_inside

DELTA_MODELS = ["qwen3_next", "qwen3_5_text", "olmo_hybrid", "kimi_linear"]


def long_memory(model):
    """Decay rates of a trained model (alpha_t close to 1) instead of random ones: random
    inits may set A = exp(A_log) up to 16, which empties the state every step and leaves
    the delta term nothing to act on."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("A_log"):
                parameter.copy_(torch.log(torch.empty_like(parameter).uniform_(0.01, 0.1)))
    return model


@pytest.fixture(scope="module", params=DELTA_MODELS)
def delta_layer(request):
    model, ids = build(request.param)
    model = long_memory(model)
    return request.param, model, ids, capture(model, ids, layer_slots(model))[0]


def test_reconstruction_with_long_memory(delta_layer):
    name, _model, _ids, layer = delta_layer
    assert float(layer.ssm(range(layer.n_units)).a.mean()) > 0.5, "the decays must keep a long memory"
    predicted, observed = layer.reconstruct()
    scale = observed.abs().max().item()
    torch.testing.assert_close(predicted, observed, rtol=1e-4, atol=1e-4 * scale, msg=name)


def test_units_are_value_heads_with_rank_one_transitions(delta_layer):
    name, model, _ids, layer = delta_layer
    ssm = layer.ssm(range(layer.n_units))
    assert isinstance(ssm, DPLRSSM) and ssm.rank == 1
    assert layer.info["multiplicity"] == layer.inputs.shape[-1] == layer.info["head_dim"]
    assert layer.state_size == ssm.state_size == layer.info["key_dim"]
    # The keys are unit vectors (normalised in the kernel): b = beta k, so |b| = beta <= 2.
    norms = ssm.b.norm(dim=-1)
    assert float(norms.max()) <= (2.0 if name == "olmo_hybrid" else 1.0) + 1e-6
    if name == "kimi_linear":  # KDA: one decay per key dimension
        assert float((ssm.a.max(-1).values - ssm.a.min(-1).values).max()) > 1e-3
    else:  # Gated DeltaNet: one decay per head and token
        torch.testing.assert_close(ssm.a, ssm.a[..., :1].expand_as(ssm.a))


def test_the_delta_term_is_needed_for_reconstruction(delta_layer):
    """Dropping the rank-one part of A_t (a plain gated linear attention) must not reproduce
    the output: the reconstruction test would catch a missing or mis-signed delta term."""
    _name, _model, _ids, layer = delta_layer
    ssm = layer.ssm(range(layer.n_units))
    for p in (torch.zeros_like(ssm.p), -ssm.p):
        wrong = DPLRSSM(ssm.a, p, ssm.q, ssm.b, ssm.c).materialize() @ layer.inputs
        assert (wrong - layer.outputs).abs().max() > 1e-3 * layer.outputs.abs().max()


def test_factored_spectra_of_captured_units_match_dense_svd(delta_layer):
    _name, _model, _ids, layer = delta_layer
    units = range(min(layer.n_units, 2))
    dense = hankel_singular_values(layer.dense(units), method="svd")
    assert_spectra_match(layer.spectra(units, torch.arange(LENGTH)), dense)


def test_gate_is_the_gated_norms_scale(delta_layer):
    """weight * (o * g) is exactly what the model's gated RMSNorm after the kernel returned:
    g = act(z) / rms_t over the head's V channels, captured as the out_gate."""
    name, model, ids, _layer = delta_layer
    slot = layer_slots(model)[0]
    norm = gated_norm(slot.module)
    seen = {}
    handle = norm.register_forward_hook(lambda _m, _a, out: seen.setdefault("out", out.detach()))
    try:
        layer = capture(model, ids, [slot])[0]
    finally:
        handle.remove()
    heads, length, value_dim = layer.outputs.shape
    ours = layer.outputs.transpose(0, 1) * norm.weight.detach().to(torch.float64)  # (L, H, V)
    torch.testing.assert_close(ours, seen["out"].to(torch.float64).reshape(length, heads, value_dim), msg=name)
    # The kernel's own output alone is not the norm's: the gate is what makes them agree.
    plain = (layer.outputs / layer.out_gate).transpose(0, 1) * norm.weight.detach().to(torch.float64)
    assert (plain - ours).abs().max() > 1e-2 * ours.abs().max()


def test_analyze_equals_the_dense_core_on_a_channels_operator(delta_layer):
    """gates="inside" (the default): each value channel is a unit, T_c = diag(g_c) T_head."""
    _name, model, ids, layer = delta_layer
    inside = gates_inside(layer)
    result = analyze(model, ids, layers=0, progress=False)
    lay = result.layers[0]
    value_dim = layer.info["head_dim"]
    assert lay.family == layer.family and lay.tolerance_ess.shape == (layer.n_units * value_dim, LENGTH)
    for unit in (0, value_dim + 1, inside.n_units - 1):
        dense = inside.dense([unit])
        np.testing.assert_array_equal(lay.tolerance_ess[unit], tolerance_ess(dense)[0].numpy())
        np.testing.assert_allclose(lay.entropy_ess[unit], entropy_ess(dense)[0].numpy(), rtol=1e-6, atol=1e-9)
    assert (lay.tss == layer.info["key_dim"])[1:].all()
    assert lay.tolerance_ess.max() <= layer.info["key_dim"]
    # Outside, the value head is the unit again and the gate changes nothing in T.
    outside = analyze(model, ids, layers=0, gates="outside", progress=False).layers[0]
    assert outside.tolerance_ess.shape == (layer.n_units, LENGTH)
    np.testing.assert_array_equal(outside.tolerance_ess[0], tolerance_ess(layer.dense([0]))[0].numpy())
