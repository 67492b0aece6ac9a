"""The engine's alternative paths give the same spectra: scan == sweep == dense SVD, batched
dense == per-cut dense, the per-unit cost choice is exact and recorded; CUDA == CPU."""

import numpy as np
import pytest
import torch
from _contracts import assert_exact_contract, assert_spectra_match
from test_ess_core import random_ssm

from ess_explorer import DiagonalSSM, hankel_singular_values
from ess_explorer.core.spectra import choose_ssm_path
from ess_explorer.core.sweeps import balanced_chunk
from ess_explorer.core.units import SSMCapture
from ess_explorer.result import ESSResult, LayerESS
from ess_explorer.synthetic import diagonal_ssm, softmax_attention

CASES = [
    (64, 4, 0.3, 0.99, False),
    (97, 8, 1e-6, 1e-2, False),  # decays near 0; L not a multiple of the block
    (96, 8, 0.999, 1.0, False),  # decays near 1
    (80, 6, 0.2, 0.9, True),  # LTI: values down to ~1e-10 sigma_1
    (80, 8, 0.1, 0.5, True),  # LTI with values between 1e-13 and 1e-9 of sigma_1
]


@pytest.mark.parametrize("length, modes, low, high, lti", CASES)
def test_scan_matches_sweep_and_dense_svd(length, modes, low, high, lti):
    ssm = random_ssm(length, modes, units=2, seed=length + modes, decay_low=low, decay_high=high, lti=lti)
    dense = hankel_singular_values(ssm.materialize(), method="svd")
    scan = hankel_singular_values(ssm, method="scan")
    assert_spectra_match(scan, dense)
    assert_spectra_match(scan, hankel_singular_values(ssm, method="sweep"))


@pytest.mark.parametrize("block", [1, 5, 64, 200])
def test_scan_is_exact_for_any_block_size(block):
    from ess_explorer.core.scan import scan_chunk

    ssm = random_ssm(64, 4, units=3, seed=block, decay_low=0.5, decay_high=1.0)
    wanted = torch.tensor([1, 7, 31, 32, 33, 63])
    dense = hankel_singular_values(ssm.materialize(), method="svd", positions=wanted)
    assert_spectra_match(scan_chunk(ssm.a, ssm.b, ssm.c, wanted, block=block), dense)


def test_scan_handles_exact_zero_decays_and_positions():
    ssm = diagonal_ssm(40, 4, units=2, seed=5, resets=[20])
    positions = [0, 3, 19, 20, 21, 39]
    dense = hankel_singular_values(ssm.materialize(), method="svd", positions=positions)
    scan = hankel_singular_values(ssm, method="scan", positions=positions)
    assert (scan[:, 0] == 0).all() and (scan[:, 3] == 0).all()  # t = 0 and the cut at the reset
    assert_spectra_match(scan, dense)


@pytest.mark.parametrize("length, modes, low, high, lti", CASES)
@pytest.mark.parametrize("stride", [2, 5, 33])
def test_strided_sweep_segments_match_dense_svd(length, modes, low, high, lti, stride):
    """Cuts at a stride jump between the needed roots in one QR per segment; the values are
    those of the dense SVD at the same cuts."""
    ssm = random_ssm(length, modes, units=2, seed=length + stride, decay_low=low, decay_high=high, lti=lti)
    positions = torch.arange(0, length, stride)
    dense = hankel_singular_values(ssm.materialize(), method="svd", positions=positions)
    assert_spectra_match(hankel_singular_values(ssm, method="sweep", positions=positions), dense)


def test_sweep_segments_across_exact_resets():
    ssm = diagonal_ssm(60, 4, units=2, seed=3, resets=[20, 41])
    positions = [0, 1, 9, 20, 21, 33, 41, 42, 59]  # irregular gaps, cuts at and after the resets
    dense = hankel_singular_values(ssm.materialize(), method="svd", positions=positions)
    sweep = hankel_singular_values(ssm, method="sweep", positions=positions)
    assert (sweep[:, 3] == 0).all() and (sweep[:, 6] == 0).all()  # nothing crosses a reset
    assert_spectra_match(sweep, dense)


@pytest.mark.parametrize("method", ["scan", "sweep"])
def test_causal_spectrum_from_either_pass_equals_the_reachability_sweep(method):
    """Causal ESS's sigma(R_t) read off the scan's or the sweep's forward roots equals the
    separate reachability sweep's (core/causal.py), next to the unchanged Hankel spectra."""
    from ess_explorer.core.causal import reachability_singular_values
    from ess_explorer.core.sweeps import factored_hankel_singular_values

    ssm = random_ssm(70, 6, units=3, seed=11, decay_low=0.2, decay_high=1.0)
    positions = torch.tensor([0, 1, 2, 13, 35, 36, 69])
    sigma, reach = factored_hankel_singular_values(ssm, positions=positions, method=method, causal=True)
    reference = reachability_singular_values(ssm, positions)
    torch.testing.assert_close(reach, reference, rtol=1e-10, atol=1e-12 * float(reference.max()))
    torch.testing.assert_close(sigma, hankel_singular_values(ssm, positions=positions, method="sweep"))


def test_unknown_factored_method_is_refused():
    with pytest.raises(ValueError, match="sweep"):
        hankel_singular_values(diagonal_ssm(16, 2, seed=0), method="qr")


@pytest.mark.parametrize("method", ["auto", "svd"])
def test_batched_dense_equals_per_cut(method):
    op = torch.cat([softmax_attention(70, units=2, seed=2), diagonal_ssm(70, 4, seed=3).materialize()])
    loop = hankel_singular_values(op, method=method, batched=False)
    batched = hankel_singular_values(op, method=method, batched=True)
    assert batched.shape == loop.shape
    assert_exact_contract(batched, loop)
    picked = hankel_singular_values(op, method=method, batched=True, positions=[69, 0, 35, 1, 34])
    expected = loop[:, [69, 0, 35, 1, 34]]
    assert_exact_contract(picked, expected)


@pytest.mark.parametrize("length", [33, 64])
def test_recursive_grams_equal_direct_products_and_svd(length):
    """The per-cut dense path builds each cut's Gram from the previous one by rank-one terms;
    every Gram equals the direct product to rounding, and the spectra equal one SVD per cut,
    for any order, repetition or gap of positions."""
    from ess_explorer.core.spectra import _gram_sequence

    op = softmax_attention(length, head_dim=8, units=3, seed=length)
    times = [length - 1, 1, 5, length // 2, length // 2 + 1, 17, 17, 9]
    for t, gram in _gram_sequence(op, times):
        cut = op[:, t:, :t]
        direct = cut.mT @ cut if t <= length - t else cut @ cut.mT
        torch.testing.assert_close(gram, direct, rtol=1e-12, atol=1e-14)
    positions = [0] + times
    exact = hankel_singular_values(op, positions=positions, method="svd", batched=False)
    assert_spectra_match(hankel_singular_values(op, positions=positions, method="auto", batched=False), exact)
    gram_only = hankel_singular_values(op, positions=positions, method="gram", batched=False)
    assert (gram_only - exact).abs().max() <= 1e-7 * exact.max()  # no redo: the Gram's sqrt(eps) floor


@pytest.mark.parametrize("tall", [True, False])
def test_group_grams_equal_the_products_of_the_masked_cuts(tall):
    """The batched path's Grams come from running sums over a group's cuts; each equals the
    product of its padded, masked cut, for a group with gaps between its cuts."""
    from ess_explorer.core.spectra import _group_grams, _masked_cuts

    length = 50
    op = softmax_attention(length, head_dim=8, units=3, seed=7)
    t = torch.tensor([22, 9, 25, 14]) if tall else torch.tensor([28, 41, 33, 26])
    g_max = int(torch.minimum(t, length - t).max())
    cuts = _masked_cuts(op[:, None], t, g_max, tall)  # (units, cuts, ...)
    direct = cuts.mT @ cuts if tall else cuts @ cuts.mT
    torch.testing.assert_close(_group_grams(op, t, g_max, tall), direct, rtol=1e-12, atol=1e-15)


def test_batched_dense_groups_respect_the_memory_bound(monkeypatch):
    from ess_explorer.core import spectra

    monkeypatch.setattr(spectra, "BATCH_CELLS", 3 * 40 * 20)  # at most one or two cuts per call
    groups = spectra._size_groups(torch.arange(40), 40, units=3)
    assert sorted(torch.cat(groups).tolist()) == list(range(1, 40))
    sizes = [torch.minimum(g, 40 - g) for g in groups]
    assert all(3 * 40 * int(s.max()) * len(s) <= 3 * 40 * 20 or len(s) == 1 for s in sizes)
    op = softmax_attention(40, units=3, seed=4)
    assert torch.allclose(
        hankel_singular_values(op, batched=True), hankel_singular_values(op, batched=False), rtol=1e-9, atol=1e-12
    )


def test_cost_choice_is_dense_when_the_state_is_large_and_recorded():
    assert choose_ssm_path(128, 128, np.arange(128)) == {"method": "dense", "reason": "N=128 >= L/2=64"}
    assert choose_ssm_path(1024, 16, np.arange(1024))["method"] == "sweep"
    assert choose_ssm_path(1024, 16, np.arange(1024), device="cuda")["method"] == "scan"
    # a Mamba2 head's 64 channels at L = 512: factored per channel, unless they share the
    # head's SVDs on the dense path (measured: 3.3x faster there, core/row_scaled.py)
    assert choose_ssm_path(512, 128, np.arange(512))["method"] == "sweep"
    shared = choose_ssm_path(512, 128, np.arange(512), units_per_owner=64)
    assert shared["method"] == "dense" and "row-scaled" in shared["reason"]

    # a Mamba2-like head: scalar decay over N = 24 modes at L = 40 (N >= L / 2)
    g = torch.Generator().manual_seed(3)
    a = torch.rand(3, 40, 1, generator=g, dtype=torch.float64).expand(3, 40, 24) * 0.5 + 0.5
    ssm = DiagonalSSM(
        a,
        torch.randn(3, 40, 24, generator=g, dtype=torch.float64),
        torch.randn(3, 40, 24, generator=g, dtype=torch.float64),
    )
    capture = SSMCapture(layer=0, family="mamba2", state_size=24, realize=lambda index: ssm[index], shape=(3, 40))
    positions = np.arange(40)
    assert capture.spectra_path(positions)["method"] == "dense"
    chosen = capture.spectra(range(3), positions)
    factored = hankel_singular_values(ssm, method="sweep")
    assert chosen.shape[-1] >= 20  # the whole spectrum: rank(H_t) <= min(t, L - t) <= 20
    assert_spectra_match(factored[..., :20], chosen)

    layer = LayerESS.from_units(capture, positions, tol=1e-6, relative=True)
    assert layer.path == {"method": "dense", "reason": "N=24 >= L/2=20"}
    small = LayerESS.from_operator(1, "mamba", diagonal_ssm(64, 4, units=2, seed=1), tol=1e-6, relative=True)
    assert small.path["method"] == "sweep" and "N=4" in small.path["reason"]


def test_path_survives_save_and_load(tmp_path):
    layer = LayerESS.from_operator(0, "mamba", diagonal_ssm(32, 4, units=2, seed=1), tol=1e-6, relative=True)
    result = ESSResult(["a"] * 32, list(range(32)), {0: layer}, {})
    loaded = ESSResult.load(result.save(tmp_path / "r.npz"))
    assert loaded.layers[0].path == layer.path and layer.path["method"] in ("sweep", "dense")


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("length, modes, low, high, lti", CASES)
def test_cuda_scan_and_sweep_equal_cpu(length, modes, low, high, lti):
    ssm = random_ssm(length, modes, units=2, seed=length + modes, decay_low=low, decay_high=high, lti=lti)
    cpu = hankel_singular_values(ssm, method="sweep")
    for method in ("scan", "sweep"):
        assert_spectra_match(hankel_singular_values(ssm, method=method, device="cuda").cpu(), cpu)


@pytest.mark.gpu
@cuda
def test_cuda_batched_dense_equals_cpu():
    op = torch.cat([softmax_attention(256, units=2, seed=2), diagonal_ssm(256, 4, seed=3).materialize()])
    cpu = hankel_singular_values(op, batched=False)
    gpu = hankel_singular_values(op, device="cuda").cpu()
    assert_exact_contract(gpu, cpu)


def _gated_heads(length=40, modes=24, heads=2, channels=5, seed=4, reset=None):
    """Mamba2-like heads (scalar decay, N >= L / 2) and per-channel gates: the capture that
    gates="inside" makes of them (core/gates.py), and its materialised channels."""
    g = torch.Generator().manual_seed(seed)
    a = 0.5 + 0.5 * torch.rand(heads, length, 1, generator=g, dtype=torch.float64)
    if reset is not None:
        a[:, reset] = 0.0  # nothing before the reset reaches the outputs from it on
    a = a.expand(heads, length, modes)
    ssm = DiagonalSSM(
        a,
        torch.randn(heads, length, modes, generator=g, dtype=torch.float64),
        torch.randn(heads, length, modes, generator=g, dtype=torch.float64),
    )
    gate = torch.rand(heads * channels, length, generator=g, dtype=torch.float64) + 0.1
    owner = torch.arange(heads).repeat_interleave(channels)
    capture = SSMCapture(
        layer=0,
        family="mamba2",
        state_size=modes,
        realize=lambda index: ssm[index],
        shape=(heads * channels, length),
        owner=owner,
        row_scale=gate,
    )
    return capture, gate[..., None] * ssm.materialize()[owner]


@pytest.mark.parametrize("modes", [24, 6])  # N >= L / 2; N below most cuts' size (the rank bound cuts r)
def test_row_scaled_channels_match_their_own_dense_svd(modes, monkeypatch):
    """The channels of a split head take their spectra from one SVD of the head's cut per
    cut (core/row_scaled.py): equal to one SVD of each channel's own materialised cut."""
    capture, channels = _gated_heads(modes=modes)
    positions = np.array([0, 39, 1, 20, 20, 7, 33])  # unsorted, repeated, both ends
    assert "5 units per owner" in capture.spectra_path(positions)["reason"] or modes * 2 >= 40
    monkeypatch.setattr(
        SSMCapture, "spectra_path", lambda self, positions, device=None, accuracy=None: {"method": "dense"}
    )
    units = [9, 0, 3, 5, 6]  # both heads, out of order
    chosen = capture.spectra(units, positions)
    dense = hankel_singular_values(channels[units], method="svd", positions=positions)
    assert (chosen[:, 0] == 0).all()
    assert_spectra_match(chosen, dense[..., : chosen.shape[-1]])
    assert capture.dense(units).equal(channels[units])


def test_chunks_of_channels_end_where_a_head_ends(monkeypatch):
    """core/layer.py computes a layer in chunks of units; with heads of 5 channels and room
    for 7 a chunk, each chunk stops at a head's last channel (no head's reachability computed
    twice), a head larger than a chunk is split, and the ESS equal a one-chunk run's."""
    from ess_explorer.core import layer as layer_module

    capture, _ = _gated_heads(heads=3, channels=5)
    assert layer_module._unit_chunks(capture, list(range(15)), 7) == [slice(0, 5), slice(5, 10), slice(10, 15)]
    assert layer_module._unit_chunks(capture, [1, 2, 3, 4, 5, 6], 3) == [slice(0, 3), slice(3, 6)]
    assert layer_module._unit_chunks(capture, list(range(15)), 3)[:2] == [slice(0, 3), slice(3, 5)]
    positions = np.arange(40)
    whole = layer_module.layer_arrays(capture, positions, tol=1e-3, relative=True)
    owners_seen = []
    original = capture.causal_spectra
    monkeypatch.setattr(
        capture,
        "causal_spectra",
        lambda units, *a, **k: owners_seen.extend(capture._owners(units)[0].tolist()) or original(units, *a, **k),
    )
    most = int(capture.rank_bound(positions).max())
    monkeypatch.setattr(layer_module, "UNIT_CHUNK_VALUES", 7 * len(positions) * most)  # 7 units a chunk
    chunked = layer_module.layer_arrays(capture, positions, tol=1e-3, relative=True)
    assert sorted(owners_seen) == [0, 1, 2]  # each head's reachability once
    for field in ("tolerance_ess", "causal_ess"):
        np.testing.assert_array_equal(chunked[field], whole[field])
    # these full-rank heads take the dense route, whose batched Gram products round with the batch
    np.testing.assert_allclose(chunked["entropy_ess"], whole["entropy_ess"], rtol=1e-9)
    # scope "layer" over several chunks: counted after the layer's largest sigma_1 is known
    chunked = layer_module.layer_arrays(capture, positions, tol=1e-3, relative=True, scope="layer")
    monkeypatch.undo()
    whole = layer_module.layer_arrays(capture, positions, tol=1e-3, relative=True, scope="layer")
    for field in ("tolerance_ess", "causal_ess"):
        np.testing.assert_array_equal(chunked[field], whole[field])


def test_row_scaled_channel_whose_bound_fails_is_redone(monkeypatch):
    """After an exact reset at step 30 the head's cuts have zero rows from 30 on; with a gate
    of 1e12 there, the worst-case bound on the shared factor's rounding (1e12 times it) no
    longer certifies that channel's values, so its cut is redone by its own SVD; every value
    matches the dense SVD."""
    from ess_explorer.core import row_scaled

    capture, _ = _gated_heads(heads=1, channels=3, reset=30)
    capture.row_scale[1, 30:] = 1e12
    head = capture.realize(torch.tensor([0])).materialize()
    channels = capture.row_scale[..., None] * head[[0, 0, 0]]
    calls = []
    original = torch.linalg.svdvals
    monkeypatch.setattr(torch.linalg, "svdvals", lambda x: calls.append(tuple(x.shape)) or original(x))
    owner_of = torch.zeros(3, dtype=torch.long)
    chosen = row_scaled.row_scaled_hankel_singular_values(head, owner_of, capture.row_scale, torch.arange(40))
    assert any(shape[0] == 1 for shape in calls)  # one channel redone on its own
    assert_spectra_match(chosen[..., :20], hankel_singular_values(channels, method="svd")[..., :20])


def _fast_and_reset_heads(length: int, modes: int):
    """A fast head (decay 0.15) and a slow one (0.97) with an exact reset at step 30, three
    channels each, channel 5 gated by 1e12 past the reset: (heads (2, L, L), owner_of, gate)."""
    g = torch.Generator().manual_seed(21)
    a = torch.tensor([0.15, 0.97], dtype=torch.float64)[:, None, None].expand(2, length, modes).clone()
    a[1, 30] = 0.0  # an exact reset in the slow head
    b, c = (torch.randn(2, length, modes, generator=g, dtype=torch.float64) for _ in range(2))
    gate = torch.rand(6, length, generator=g, dtype=torch.float64) + 0.1
    gate[5, 30:] = 1e12
    return DiagonalSSM(a, b, c).materialize(), torch.tensor([0, 0, 0, 1, 1, 1]), gate


@pytest.mark.parametrize("kernel", [False, True])
def test_row_scaled_channels_under_the_ess_contract(kernel, monkeypatch):
    """Under "ess" each head's channels take the Gram of that head's factor, cut at the
    head's own rank (a fast-decaying head keeps fewer columns than a slow one): tolerance
    counts equal to each channel's own exact SVD, entropy-ESS within the contract's 1e-5. A
    channel gated by 1e12 past an exact reset cannot keep the shared result and is redone.
    With ``kernel`` the Grams and their eigenvalues come from core/channel_kernel.py (this
    job is too small to take it by itself: dense_jobs.KERNEL_MIN_WORK)."""
    from ess_explorer import entropy_ess, tolerance_ess
    from ess_explorer.core import channel_kernel, dense_jobs, row_scaled
    from ess_explorer.core.precision import Accuracy

    if kernel and not channel_kernel.available():
        pytest.skip("numba is not installed")
    compiled_calls = []
    if kernel:
        monkeypatch.setattr(dense_jobs, "KERNEL_MIN_WORK", 0.0)
        original_kernel = channel_kernel._grams_and_eigenvalues
        monkeypatch.setattr(
            channel_kernel, "_grams_and_eigenvalues", lambda *a: compiled_calls.append(1) or original_kernel(*a)
        )

    length, modes = 48, 24
    heads, owner_of, gate = _fast_and_reset_heads(length, modes)
    widths, own_cuts = {}, []
    original_gram, original_svdvals = row_scaled._owner_values, torch.linalg.svdvals

    def gram(factors, groups, *rest):
        for owner, _ in groups:
            widths.setdefault(factors[owner].base.shape[0], []).append(factors[owner].base.shape[-1])
        return original_gram(factors, groups, *rest)

    monkeypatch.setattr(row_scaled, "_owner_values", gram)
    monkeypatch.setattr(torch.linalg, "svdvals", lambda x: own_cuts.append(tuple(x.shape)) or original_svdvals(x))
    chosen = row_scaled.row_scaled_hankel_singular_values(
        heads, owner_of, gate, torch.arange(length), max_rank=modes, accuracy=Accuracy("ess")
    )
    monkeypatch.undo()
    assert bool(compiled_calls) == kernel
    exact = hankel_singular_values(gate[..., None] * heads[owner_of], method="svd")
    assert torch.equal(tolerance_ess(spectra=chosen), tolerance_ess(spectra=exact))
    entropy, reference = entropy_ess(spectra=chosen), entropy_ess(spectra=exact)
    assert bool(((entropy - reference).abs() <= 1e-5 * reference).all())
    middle = widths[length - 24]  # the cut t = 24: both heads' factors (m = L - t rows)
    assert min(middle) < max(middle) <= modes  # the fast head's factor is narrower
    assert (1, length - 24, 24) in own_cuts  # channel 5 at t = 24: 1e12 on the rows the reset zeroed


def test_on_a_gpu_under_ess_row_scaled_channels_take_the_dense_route_within_the_contract(monkeypatch):
    """A GPU under "ess" gives every head's channels to the dense route (each channel's cuts
    as batched Grams) instead of an SVD of every head at every cut; "exact" keeps the shared
    factors. The dense route, forced here on the CPU for every head, meets the "ess" contract
    on a fast head, a slow one with an exact reset, and a channel gated by 1e12 past it:
    tolerance counts of each channel's exact SVD, entropy-ESS within 1e-5."""
    from ess_explorer import entropy_ess, tolerance_ess
    from ess_explorer.core import row_scaled
    from ess_explorer.core.precision import Accuracy

    ess, exact, cuda = Accuracy("ess"), Accuracy("exact"), torch.device("cuda")
    assert row_scaled.takes_dense_route(3, range(1, 64), 64, cuda, ess)  # however narrow the head
    assert not row_scaled.takes_dense_route(32, range(1, 64), 64, cuda, exact)

    length, modes = 48, 24
    heads, owner_of, gate = _fast_and_reset_heads(length, modes)
    shared = []
    monkeypatch.setattr(row_scaled, "_carried_factor", lambda *x: shared.append(1))
    monkeypatch.setattr(row_scaled, "takes_dense_route", lambda *x: True)  # what a GPU decides
    chosen = row_scaled.row_scaled_hankel_singular_values(
        heads, owner_of, gate, torch.arange(length), max_rank=modes, accuracy=ess
    )
    assert not shared  # no head was factored
    reference = hankel_singular_values(gate[..., None] * heads[owner_of], method="svd")[..., :modes]
    assert torch.equal(tolerance_ess(spectra=chosen), tolerance_ess(spectra=reference))
    entropy, expected = entropy_ess(spectra=chosen), entropy_ess(spectra=reference)
    assert bool(((entropy - expected).abs() <= 1e-5 * expected).all())


def test_under_ess_a_head_that_keeps_every_direction_gives_its_channels_to_the_dense_route(monkeypatch):
    """Under "ess" a head whose cuts keep nearly all their directions (a slow one) costs less
    on the dense route (each channel's cut Grams, built cut from cut) than on its shared
    factors, which then hold as many columns as the cut and add an SVD per cut; a fast head
    keeps its factors. Routed per head, as measured on Mamba2-130m's heads (L = 256, N = 128:
    width 126 three times faster dense, width 19 twice as fast on its factors; never dense at
    L = 1024); "exact" keeps the factors. Both routes meet the contract against each channel's
    own SVD."""
    from ess_explorer import entropy_ess, tolerance_ess
    from ess_explorer.core import row_scaled
    from ess_explorer.core.precision import Accuracy

    ess, cpu = Accuracy("ess"), torch.device("cpu")
    cuts = range(1, 256)
    assert row_scaled.takes_dense_route(126, cuts, 256, cpu, ess)
    assert not row_scaled.takes_dense_route(19, cuts, 256, cpu, ess)
    assert not row_scaled.takes_dense_route(126, cuts, 256, cpu, Accuracy("exact"))
    assert not row_scaled.takes_dense_route(128, range(1, 1024), 1024, cpu, ess)

    length, modes, g = 64, 32, torch.Generator().manual_seed(23)
    a = torch.tensor([0.2, 0.995], dtype=torch.float64)[:, None, None].expand(2, length, modes).clone()
    b, c = (torch.randn(2, length, modes, generator=g, dtype=torch.float64) for _ in range(2))
    heads = DiagonalSSM(a, b, c).materialize()
    owner_of = torch.tensor([0, 0, 0, 1, 1, 1])
    gate = torch.rand(6, length, generator=g, dtype=torch.float64) + 0.1
    dense_batches, original = [], row_scaled.hankel_singular_values
    monkeypatch.setattr(
        row_scaled, "hankel_singular_values", lambda x, **k: dense_batches.append(x.shape[0]) or original(x, **k)
    )
    args = (heads, owner_of, gate, torch.arange(length))
    chosen = row_scaled.row_scaled_hankel_singular_values(*args, max_rank=modes, accuracy=ess)
    assert dense_batches == [3]  # the slow head's three channels, once
    row_scaled.row_scaled_hankel_singular_values(*args, max_rank=modes, accuracy=Accuracy("exact"))
    assert dense_batches == [3]
    exact = hankel_singular_values(gate[..., None] * heads[owner_of], method="svd")[..., :modes]
    assert torch.equal(tolerance_ess(spectra=chosen), tolerance_ess(spectra=exact))
    entropy, reference = entropy_ess(spectra=chosen)[:, 1:], entropy_ess(spectra=exact)[:, 1:]
    assert bool(((entropy - reference).abs() <= 1e-5 * reference).all())


def _spiked_heads(length=64, modes=8, spikes=(21, 22, 23)):
    """Fast-forgetting heads (few values above the truncation, so factors are carried from
    cut to cut), head k with its output row spikes[k] scaled by 1e8: the cut's sigma_1 falls
    by about that much when the row leaves it."""
    g = torch.Generator().manual_seed(5)
    heads = len(spikes)
    a = torch.full((heads, length, modes), 0.3, dtype=torch.float64)
    b, c = (torch.randn(heads, length, modes, generator=g, dtype=torch.float64) for _ in range(2))
    for k, row in enumerate(spikes):
        c[k, row] *= 1e8
    return DiagonalSSM(a, b, c).materialize()


def test_a_carried_factor_is_within_its_error_bound_and_restarts_when_sigma_1_falls():
    """`_carried_factor`: the next cut's factor from the previous one and the new column is a
    fraction of the cut's width, and every singular value of it is within its stated error of
    the cut's own (Weyl). When the spiked row leaves the cut, the carried error would be about
    1e8 x the truncation relative to the new sigma_1: the cut's own SVD starts again."""
    from ess_explorer.core.row_scaled import RESTART, TRUNCATE, _carried_factor

    owner = _spiked_heads(spikes=(21,))[0]
    factor = _carried_factor(owner, 10, None, TRUNCATE, 8)
    assert factor.whole
    for t in range(11, 21):
        factor = _carried_factor(owner, t, factor, TRUNCATE, 8)
        assert not factor.whole and factor.base.shape[-1] < min(t, 64 - t)
        own = torch.linalg.svdvals(owner[t:, :t])
        mine = torch.linalg.svdvals(factor.base)
        width = min(len(own), len(mine))
        assert ((own[:width] - mine[:width]).abs() <= factor.error).all() and (own[width:] <= factor.error).all()
        assert factor.error <= RESTART * TRUNCATE * own[0]
    factor = _carried_factor(owner, 21, factor, TRUNCATE, 8)  # the spike is the cut's first row
    assert not factor.whole
    factor = _carried_factor(owner, 22, factor, TRUNCATE, 8)  # the spike has left
    assert factor.whole


def test_channels_whose_carried_factors_fail_retry_every_owner_in_one_guard(monkeypatch):
    """Where channels of several heads fail the "ess" guard with their heads' carried factors,
    each of those heads takes its cut's own SVD and all of their failing channels are read by
    one more guard (not one per head: each guard is a kernel call and its bookkeeping), after
    which every channel's counts are those of its own exact SVD and entropy-ESS is within the
    contract. The carried factors' stated mass is inflated here so that the first guard fails."""
    from ess_explorer import entropy_ess, tolerance_ess
    from ess_explorer.core import row_scaled
    from ess_explorer.core.channel_kernel import ChannelLanes
    from ess_explorer.core.precision import Accuracy

    length, modes, t = 48, 24, 20
    heads, owner_of, gate = _fast_and_reset_heads(length, modes)
    gate[5, 30:] = 1.0  # no channel that only its own SVD can answer
    truncate, accuracy = row_scaled.TRUNCATE_ESS, Accuracy("ess")
    factors = {}
    for owner in range(2):
        previous = row_scaled._whole_factor(heads[owner, t - 1 :, : t - 1], t - 1, truncate, modes)
        carried = row_scaled._carried_factor(heads[owner], t, previous, truncate, modes)
        assert not carried.whole
        factors[owner] = carried._replace(mass=1e3 * float(carried.values[0]))  # fails the guard
    guards, original = [], row_scaled._guarded_values
    monkeypatch.setattr(row_scaled, "_guarded_values", lambda *a: guards.append(a[3]) or original(*a))
    lanes = ChannelLanes(owner_of, gate)
    groups = [(owner, units) for owner, units in lanes.units_of.items()]
    sigma = torch.zeros(len(owner_of), min(length - t, t), dtype=torch.float64)
    cut = heads[:, t:, :t]
    row_scaled._shared_factor_values(sigma, cut, factors, gate[:, t:], groups, accuracy, truncate, modes, lanes)
    assert [sorted(owner for owner, _ in groups) for groups in guards] == [[0, 1], [0, 1]]
    assert all(factor.whole for factor in factors.values())
    exact = torch.linalg.svdvals(gate[:, t:, None] * cut[owner_of])
    assert torch.equal(tolerance_ess(spectra=sigma[:, None]), tolerance_ess(spectra=exact[:, None]))
    entropy, reference = entropy_ess(spectra=sigma[:, None]), entropy_ess(spectra=exact[:, None])
    assert bool(((entropy - reference).abs() <= 1e-5 * reference).all())


def test_what_a_carried_factor_drops_moves_a_gated_channel_only_as_the_ess_guard_assumes():
    """The "ess" guard of a channel diag(g) H_t (`row_scaled._ess_guard`) reads two
    properties of the owner's factor, checked here along a chain of carried cuts truncated
    hard (1e-4 of S_1, so what is dropped is far above rounding): each sigma_k^2 of the
    channel's cut lies between that of diag(g) base and it plus (max|g| ||E||)^2, a second-
    order amount (the dropped part is orthogonal to the kept one; a first-order shift would be
    2 sigma_k max|g| ||E||, ten thousand times more at sigma_1), and the 1-norm of the spectrum
    moves by at most max|g| times the factor's mass."""
    from ess_explorer.core.row_scaled import _carried_factor

    length, modes = 64, 12
    g = torch.Generator().manual_seed(8)
    a = torch.linspace(0.5, 0.95, modes, dtype=torch.float64).expand(1, length, modes)
    b, c = (torch.randn(1, length, modes, generator=g, dtype=torch.float64) for _ in range(2))
    owner = DiagonalSSM(a, b, c).materialize()[0]
    gate = torch.rand(length, generator=g, dtype=torch.float64) * 3
    factor, carried, truncated = None, 0, 0
    for t in range(8, 40):
        factor = _carried_factor(owner, t, factor, 1e-4, modes)
        carried += not factor.whole
        true = torch.linalg.svdvals(gate[t:, None] * owner[t:, :t])
        kept = torch.linalg.svdvals(gate[t:, None] * factor.base)
        kept = torch.nn.functional.pad(kept, (0, len(true) - len(kept)))
        largest = float(gate[t:].max())
        dropped = largest * factor.dropped
        slack = 4 * largest * factor.rounding * float(true[0]) + 1e-13 * float(true[0]) ** 2
        gap = true**2 - kept**2
        truncated += dropped > 1e-7 * float(true[0])  # a real truncation, not rounding
        assert bool((gap >= -slack).all()) and bool((gap <= dropped**2 + slack).all()), t
        assert float(true.sum() - kept.sum()) <= largest * (factor.mass + factor.rounding_mass) + slack
    assert carried > 10 and truncated > 10  # carried, not restarted at every cut, and truncated


def _fast_head_cut():
    """A fast-forgetting head's cut at t = 40 of L = 64 (N = 6, decays 0.2-0.4): its first
    columns have decayed far below its sigma_1. Returns the cut, the generator (for more
    random draws after it) and (L, N, t)."""
    length, modes, t = 64, 6, 40
    g = torch.Generator().manual_seed(12)
    a = torch.linspace(0.2, 0.4, modes, dtype=torch.float64).expand(1, length, modes)
    b, c = (torch.randn(1, length, modes, generator=g, dtype=torch.float64) for _ in range(2))
    return DiagonalSSM(a, b, c).materialize()[0, t:, :t], g, (length, modes, t)


def test_a_cuts_own_svd_leaves_out_decayed_columns_within_the_factors_stated_error(monkeypatch):
    """`row_scaled._whole_factor` leaves out a fast-forgetting head's leading columns, decayed
    below the truncation: its SVD takes a narrower matrix than the cut. What it leaves out is
    stated as the factor's own drop: every value of the cut within ``error`` of the factor's
    (Weyl), a gated channel's sigma_k^2 moved by at most (max|g| dropped)^2 (second order: the
    left-out columns are orthogonal to the kept directions) and its spectrum's 1-norm by at
    most max|g| times the mass. Truncated hard (1e-4) so what is left out is far above
    rounding."""
    from ess_explorer.core import row_scaled

    cut, g, (length, modes, t) = _fast_head_cut()
    gate = torch.rand(length - t, generator=g, dtype=torch.float64) * 3
    widths, original = [], row_scaled.svd
    monkeypatch.setattr(row_scaled, "svd", lambda x: widths.append(x.shape[-1]) or original(x))
    factor = row_scaled._whole_factor(cut, t, 1e-4, modes)
    assert factor.whole and widths[0] < t - 10  # more than ten decayed columns left out
    own = torch.linalg.svdvals(cut)
    mine = torch.nn.functional.pad(torch.linalg.svdvals(factor.base), (0, len(own) - factor.base.shape[-1]))
    assert bool(((own - mine).abs() <= factor.error).all())
    true = torch.linalg.svdvals(gate[:, None] * cut)
    kept = torch.nn.functional.pad(
        torch.linalg.svdvals(gate[:, None] * factor.base), (0, len(true) - factor.base.shape[-1])
    )
    largest = float(gate.max())
    slack = 4 * largest * factor.rounding * float(true[0]) + 1e-13 * float(true[0]) ** 2
    gap = true**2 - kept**2
    assert bool((gap >= -slack).all()) and bool((gap <= (largest * factor.dropped) ** 2 + slack).all())
    assert float(true.sum() - kept.sum()) <= largest * (factor.mass + factor.rounding_mass) + slack
    left_out = cut[:, : t - widths[0]]  # so the test can fail: what was left out is not rounding
    assert float(torch.linalg.matrix_norm(left_out)) > 1e3 * factor.rounding


def test_a_channel_that_reads_mostly_what_its_head_dropped_is_redone_for_its_entropy():
    """The entropy half of the "ess" guard of gated channels (`row_scaled._ess_guard`). A head's
    cut holds one direction of size 1 (on its first rows) and 100 of size 1e-11, below the
    factor's truncation (1e-10 of S_1), on the other rows: the shared factor keeps one column.
    A channel gated by 1e-4 on the first rows and 1 on the rest has the values 1e-4 and 100 x
    1e-11: the dropped ones carry 1e-5 of its spectrum's sum, which moves its entropy-ESS by
    about 2e-4, while each lies far below tau, so no count can move. Only the mass bound sees
    it and redoes the channel (by its own SVD); a channel gated by 1 everywhere keeps the
    shared result. Both match their own SVD: same tolerance-ESS, entropy-ESS within 1e-5."""
    from ess_explorer import entropy_ess, tolerance_ess
    from ess_explorer.core.precision import Accuracy
    from ess_explorer.core.row_scaled import row_scaled_hankel_singular_values

    length, t, first_rows, small = 240, 120, 10, 100
    g = torch.Generator().manual_seed(31)
    rows = torch.linalg.qr(torch.randn(length - t - first_rows, small, generator=g, dtype=torch.float64)).Q
    columns = torch.linalg.qr(torch.randn(t, small + 1, generator=g, dtype=torch.float64)).Q
    top_row = torch.randn(first_rows, generator=g, dtype=torch.float64)
    cut = torch.zeros(length - t, t, dtype=torch.float64)
    cut[:first_rows] = (top_row / top_row.norm())[:, None] * columns[:, 0]  # the one direction of size 1
    cut[first_rows:] = 1e-11 * rows @ columns[:, 1:].T  # 100 directions of size 1e-11
    head = torch.zeros(1, length, length, dtype=torch.float64)
    head[0, t:, :t] = cut
    gate = torch.ones(2, length, dtype=torch.float64)
    gate[1, t : t + first_rows] = 1e-4
    svd_inputs, original = [], torch.linalg.svdvals
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.linalg, "svdvals", lambda x: svd_inputs.append(x) or original(x))
        chosen = row_scaled_hankel_singular_values(
            head, torch.zeros(2, dtype=torch.long), gate, torch.tensor([t]), accuracy=Accuracy("ess")
        )
    exact = torch.linalg.svdvals(gate[:, t:, None] * cut)[:, None]  # (2, 1, 120)
    own_cut = gate[1, t:, None] * cut
    assert any(x.shape[-2:] == own_cut.shape and torch.equal(x[0], own_cut) for x in svd_inputs)  # redone
    assert torch.equal(tolerance_ess(spectra=chosen), tolerance_ess(spectra=exact))
    entropy, reference = entropy_ess(spectra=chosen), entropy_ess(spectra=exact)
    assert bool(((entropy - reference).abs() <= 1e-5 * reference).all())
    kept_only = entropy_ess(spectra=exact[..., :1])  # what the shared factor alone gives
    assert float((kept_only[1] - reference[1]).abs() / reference[1]) > 1e-4  # so the test can fail


@pytest.mark.parametrize("kernel", [False, True])
def test_a_channel_gated_onto_its_heads_decayed_rows_is_redone(kernel, monkeypatch):
    """Under "ess" a channel's Gram leaves out its head factor's trailing rows where they
    have decayed below LEADING x the truncation (`channel_kernel.decayed_rows`), counted as a
    drop of the factor (`row_scaled._owner_values`). Truncated hard (1e-4, so the rows left out
    are far above rounding): a head's cut of rank 2, both directions of size about 1 on the
    first 10 rows and 1e-6 on the last 20 (left out with the zero rows between). A channel
    gated by 1e-5 on the first rows and by 2 on the others reads the left-out rows at about a
    quarter of its own values: only what the guard charges for them sees it, and it is redone
    by its own SVD, matching it: the same tolerance-ESS, entropy-ESS within 1e-5. With
    ``kernel`` the rows are left out by core/channel_kernel.py's numba count, else by its
    torch reference."""
    from ess_explorer import entropy_ess, tolerance_ess
    from ess_explorer.core import channel_kernel, dense_jobs, row_scaled
    from ess_explorer.core.precision import Accuracy

    if kernel and not channel_kernel.available():
        pytest.skip("numba is not installed")
    if kernel:
        monkeypatch.setattr(dense_jobs, "KERNEL_MIN_WORK", 0.0)
    else:
        monkeypatch.setattr(channel_kernel, "available", lambda: False)
    monkeypatch.setattr(row_scaled, "TRUNCATE_ESS", 1e-4)
    length, t = 240, 120
    g = torch.Generator().manual_seed(33)
    columns = torch.linalg.qr(torch.randn(t, 2, generator=g, dtype=torch.float64)).Q
    rows = torch.zeros(length - t, 2, dtype=torch.float64)
    rows[:10] = torch.randn(10, 2, generator=g, dtype=torch.float64)
    rows[-20:] = 1e-6 * torch.randn(20, 2, generator=g, dtype=torch.float64)
    cut = rows @ columns.T
    head = torch.zeros(1, length, length, dtype=torch.float64)
    head[0, t:, :t] = cut
    gate = torch.full((1, length), 2.0, dtype=torch.float64)
    gate[0, t : t + 10] = 1e-5
    left_out, original = [], channel_kernel.ChannelLanes.eigenvalues

    def recorded(*args, **kwargs):
        values, rows_out = original(*args, **kwargs)
        left_out.append(rows_out[0])
        return values, rows_out

    monkeypatch.setattr(channel_kernel.ChannelLanes, "eigenvalues", recorded)
    svd_inputs, original_svdvals = [], torch.linalg.svdvals
    monkeypatch.setattr(torch.linalg, "svdvals", lambda x: svd_inputs.append(x) or original_svdvals(x))
    chosen = row_scaled.row_scaled_hankel_singular_values(
        head, torch.zeros(1, dtype=torch.long), gate, torch.tensor([t]), accuracy=Accuracy("ess")
    )
    monkeypatch.undo()
    own_cut = gate[0, t:, None] * cut
    assert left_out[-1][0] == length - t - 10  # every row past the first 10 left out
    assert any(x.shape[-2:] == cut.shape and torch.equal(x[0], own_cut) for x in svd_inputs)  # redone
    exact = torch.linalg.svdvals(own_cut)[None, None]  # (1, 1, 120)
    assert torch.equal(tolerance_ess(spectra=chosen), tolerance_ess(spectra=exact))
    entropy, reference = entropy_ess(spectra=chosen), entropy_ess(spectra=exact)
    assert bool(((entropy - reference).abs() <= 1e-5 * reference).all())
    first_rows = torch.linalg.svdvals(own_cut[:10])  # what the channel's Gram of the kept rows gives
    first_rows = torch.nn.functional.pad(first_rows, (0, exact.shape[-1] - 2))[None, None]
    assert float((entropy_ess(spectra=first_rows) - reference).abs().max() / reference.min()) > 1e-4


@pytest.mark.parametrize("precision", ["exact", "ess"])
def test_row_scaled_channels_with_carried_factors_match_their_own_svd(precision, monkeypatch):
    """Every cut of channels whose heads' factors are carried from cut to cut, across rows
    that take sigma_1 down by 1e8: the same values as each channel's own SVD (within the
    exact contract's bound), or under "ess" the same tolerance-ESS and entropy within 1e-5;
    many of the heads' SVDs are the narrow carried ones."""
    from ess_explorer import entropy_ess, tolerance_ess
    from ess_explorer.core.precision import Accuracy
    from ess_explorer.core.row_scaled import row_scaled_hankel_singular_values

    heads = _spiked_heads()
    owner_of = torch.tensor([0, 0, 1, 1, 2, 2])
    gate = torch.rand(6, 64, generator=torch.Generator().manual_seed(6), dtype=torch.float64) + 0.1
    shapes, original = [], torch.linalg.svd
    monkeypatch.setattr(torch.linalg, "svd", lambda x, **k: shapes.append(tuple(x.shape)) or original(x, **k))
    chosen = row_scaled_hankel_singular_values(
        heads, owner_of, gate, torch.arange(64), max_rank=8, accuracy=Accuracy(precision)
    )
    monkeypatch.undo()
    exact = hankel_singular_values(gate[..., None] * heads[owner_of], method="svd")
    if precision == "exact":
        assert_spectra_match(chosen, exact[..., : chosen.shape[-1]])
    else:
        assert torch.equal(tolerance_ess(spectra=chosen), tolerance_ess(spectra=exact))
        entropy, reference = entropy_ess(spectra=chosen), entropy_ess(spectra=exact)
        assert bool(((entropy - reference).abs() <= 1e-5 * reference).all())
    carried = [m for m, n in shapes if n < min(64 - m, m)]  # an m x w SVD narrower than its cut
    assert len(carried) > len(shapes) / 3  # the rest: the first cut of each chunk, and cuts t <= r


@pytest.mark.gpu
@cuda
def test_cuda_row_scaled_channels_and_shared_causal_equal_cpu():
    capture, _ = _gated_heads(length=64, modes=24)
    positions = np.arange(64)
    units = list(range(capture.n_units))
    sigma, reach = capture.spectra_and_causal(units, positions)
    gpu_sigma, gpu_reach = capture.spectra_and_causal(units, positions, device="cuda")
    assert_spectra_match(gpu_sigma.cpu(), sigma)
    assert_spectra_match(gpu_reach.per_unit().cpu(), reach.per_unit())


def test_row_scaled_channels_of_well_conditioned_heads_take_their_grams(monkeypatch):
    """Where a head's cut is well conditioned (a random dense head: its smallest value above
    10x the Gram guard), its channels' values come from their Grams (eigvalsh, guarded), not
    the shared factor; both routes match each channel's own dense SVD."""
    from ess_explorer.core.units import DenseCapture

    g = torch.Generator().manual_seed(8)
    heads = torch.tril(torch.randn(2, 40, 40, generator=g, dtype=torch.float64))
    owner = torch.tensor([0, 0, 0, 1, 1])
    scale = torch.rand(5, 40, generator=g, dtype=torch.float64) + 0.5
    capture = DenseCapture(layer=0, family="softmax_attention", operator=heads, owner=owner, row_scale=scale)
    grams = []
    original = torch.linalg.eigvalsh
    monkeypatch.setattr(torch.linalg, "eigvalsh", lambda x: grams.append(x.shape[0]) or original(x))
    chosen = capture.spectra(range(5), np.arange(40))
    assert sum(grams) > 0  # some cuts went by the Grams
    expected = hankel_singular_values(scale[..., None] * heads[owner], method="svd")
    assert_spectra_match(chosen, expected)


def test_a_row_scaled_layer_is_chunked_by_owners_and_bounds_its_own_dense_copies(monkeypatch):
    """core/layer.py sizes a chunk of row-scaled channels by the owners it materialises (a
    Mamba2-130m layer at L = 256 is one chunk), and core/row_scaled.py keeps the dense copies
    it makes of those channels (the dense route's T, a well-conditioned cut's channels) within
    DENSE_CHUNK_CELLS by groups: with room for less than one copy, each call gets one channel,
    and every ESS is as in one group."""
    from ess_explorer.core import layer as layer_module
    from ess_explorer.core import row_scaled
    from ess_explorer.core.precision import Accuracy
    from ess_explorer.core.units import DenseCapture

    capture, _ = _gated_heads(heads=3, channels=5)  # L = 40
    ess = Accuracy("ess")
    positions = np.arange(40)
    assert capture.units_per_owner() == 5
    path = {"method": "dense"}
    monkeypatch.setattr(layer_module, "DENSE_CHUNK_CELLS", 2 * 40 * 40)  # room for two owners
    assert layer_module._chunk_size(capture, 40, 24, path, ess, None) == 10
    g = torch.Generator().manual_seed(8)
    heads = torch.tril(torch.randn(2, 40, 40, generator=g, dtype=torch.float64))
    unscaled = DenseCapture(layer=0, family="softmax_attention", operator=heads, owner=torch.tensor([0, 0, 1, 1]))
    assert unscaled.units_per_owner() == 1  # no row scale: the chunk's units are materialised
    assert layer_module._chunk_size(unscaled, 40, 20, path, ess, None) == 2
    lonely = DenseCapture(
        layer=0, family="softmax_attention", operator=heads, owner=torch.tensor([0, 0, 1]), row_scale=torch.ones(3, 40)
    )
    assert lonely.units_per_owner() == 1  # an owner with one channel: a chunk may hold no shared owner
    monkeypatch.undo()

    scale = torch.rand(5, 40, generator=g, dtype=torch.float64) + 0.5
    attention = DenseCapture(
        layer=0, family="softmax_attention", operator=heads, owner=torch.tensor([0, 0, 0, 1, 1]), row_scale=scale
    )
    # the slow heads take the dense route under "ess"; the attention heads' well-conditioned
    # cuts give their channels' Grams under "exact" (under "ess" they would go dense too)
    for layer, precision, route in ((capture, "ess", "dense route"), (attention, "exact", "cut Grams")):
        whole = layer_module.layer_arrays(layer, positions, tol=1e-3, relative=True, precision=precision)
        largest = {"dense route": 0, "cut Grams": 0}
        hankel, gram = row_scaled.hankel_singular_values, row_scaled.gram_singular_values

        def dense_route(channels, *a, **k):
            largest["dense route"] = max(largest["dense route"], len(channels))
            return hankel(channels, *a, **k)

        def cut_grams(channels, *a, **k):
            largest["cut Grams"] = max(largest["cut Grams"], len(channels))
            return gram(channels, *a, **k)

        monkeypatch.setattr(row_scaled, "DENSE_CHUNK_CELLS", 1)  # room for no copy: one channel a call
        monkeypatch.setattr(row_scaled, "hankel_singular_values", dense_route)
        monkeypatch.setattr(row_scaled, "gram_singular_values", cut_grams)
        grouped = layer_module.layer_arrays(layer, positions, tol=1e-3, relative=True, precision=precision)
        monkeypatch.undo()
        assert largest[route] == 1  # taken, one channel a call
        for field in ("tolerance_ess", "causal_ess"):
            np.testing.assert_array_equal(grouped[field], whole[field])
        np.testing.assert_allclose(grouped["entropy_ess"], whole["entropy_ess"], rtol=1e-9)


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_balanced_chunks_keep_the_budget_and_load_every_worker_equally(workers):
    for total in (1, 2, 5, 127, 1536):
        for most in (1, 3, 100, 512, 4096):
            size = balanced_chunk(total, most, workers)
            rounds = -(-total // (most * workers))  # chunks per worker the budget forces
            assert 1 <= size <= most
            assert -(-total // size) <= rounds * workers
            # the busiest worker holds its fair share, up to one item per round of rounding
            # (1536 items, at most 512 per chunk, 2 workers: 4 chunks of 384, not 512 + 512 + 512)
            assert size * rounds <= -(-total // workers) + rounds


def test_a_cut_that_overflowed_is_factored_whole(monkeypatch):
    """`row_scaled._whole_factor` leaves out no column of a cut whose norms are not finite
    (`channel_kernel.decayed_lines`, the rule of a factor's decayed rows too): an inf in the
    first column would make every column look "decayed" against an infinite limit. The SVD
    sees the whole cut, overflow and all, as it did before columns were left out."""
    from ess_explorer.core import row_scaled

    cut, _, (length, modes, t) = _fast_head_cut()
    widths, original = [], row_scaled.svd
    monkeypatch.setattr(row_scaled, "svd", lambda x: widths.append(x.shape[-1]) or original(x))
    row_scaled._whole_factor(cut, t, 1e-4, modes)
    assert widths[-1] < t - 10  # finite: its decayed first columns are left out
    cut[0, 0] = float("inf")
    row_scaled._whole_factor(cut, t, 1e-4, modes)
    assert widths[-1] == t
