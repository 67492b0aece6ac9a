"""The disk cache: keys separate everything that changes a result; entries are written
atomically; a truncated or corrupt entry is recomputed and overwritten, never trusted."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from ess_explorer import sources as sources_mod
from ess_explorer.io import ResultCache, default_cache_dir
from ess_explorer.result import ESSResult
from ess_explorer.runs import AnalysisRun, RunSettings
from ess_explorer.sources import folder_identity, model_identity
from ess_explorer.synthetic import reference_result


@pytest.fixture(scope="module")
def ref():
    return reference_result()


# The key of the reference result's own run: an entry is served only to the run it was computed by.
BASE = dict(
    identity={"kind": "hub", "source": "org/m", "revision": "abc"},
    input_ids=tuple(reference_result().input_ids),
    prompt="abc",
    dtype="float32",
)
SETTINGS = dict(layers=[0, 1, 2, 3], tol=1e-3, relative=True, stride=None)


def key(**change):
    """The cache key of the base run with some of its description or settings changed."""
    run = {**BASE, **{k: v for k, v in change.items() if k in AnalysisRun.__dataclass_fields__}}
    settings = {**SETTINGS, **{k: v for k, v in change.items() if k not in AnalysisRun.__dataclass_fields__}}
    return AnalysisRun(settings=RunSettings(**settings), **run).cache_key()


def test_key_is_stable_and_separates_every_setting():
    assert key() == key() and key(layers=[3, 2, 1, 0]) == key()  # order of layers does not matter
    variants = [
        key(identity={"kind": "hub", "source": "org/m", "revision": "def"}),
        key(identity={"kind": "hub", "source": "org/other", "revision": "abc"}),
        key(input_ids=[1, 2, 4]),
        key(layers=[0]),
        key(layers=[0, 1]),
        key(layers=None),
        key(dtype="float64"),
        key(tol=1e-4),
        key(relative=False),
        key(stride=2),
        key(prompt="abd"),
        key(version="9.9.9"),
        key(scope="unit"),
        key(gates="outside"),
        key(precision="exact"),
        key(causal=False),
        key(device="cpu"),
        key(units=2),
        key(revision="v2"),
        key(separators=(3,)),
    ]
    assert len({key(), *variants}) == len(variants) + 1


def test_put_get_round_trip(ref, tmp_path):
    store = ResultCache(tmp_path)
    k = key()
    assert store.get(k) is None
    path = store.put(k, copy.deepcopy(ref))
    assert path.is_file() and path.parent.parent == tmp_path / "results"
    back = store.get(k)
    assert back.meta["cache_key"] == k
    assert np.array_equal(back.layer(2).tolerance_ess, ref.layer(2).tolerance_ess)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary files left


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "bitflip"])
def test_a_damaged_entry_is_recomputed_and_overwritten(ref, tmp_path, damage):
    store = ResultCache(tmp_path)
    k = key()
    path = store.put(k, copy.deepcopy(ref))
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"not an npz at all")
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(flipped))
    calls = []

    def compute():
        calls.append(1)
        fresh = copy.deepcopy(ref)
        fresh.meta["recomputed"] = True
        return fresh

    with pytest.warns(UserWarning, match="cache entry"):
        result, hit = store.get_or_compute(k, compute)
    assert not hit and calls == [1] and result.meta["recomputed"]
    again, hit = store.get_or_compute(k, compute)  # the overwritten entry is good
    assert hit and calls == [1] and again.meta["recomputed"]


def test_an_entry_under_the_wrong_key_is_not_trusted(ref, tmp_path):
    store = ResultCache(tmp_path)
    source = store.put(key(), copy.deepcopy(ref))
    other = key(tol=0.5)
    target = store.path(other)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source.read_bytes())  # e.g. a file copied or renamed by hand
    with pytest.warns(UserWarning, match="another key"):
        assert store.get(other) is None
    assert not target.exists()


def test_a_failed_write_leaves_the_old_entry(ref, tmp_path, monkeypatch):
    store = ResultCache(tmp_path)
    k = key()
    good = store.put(k, copy.deepcopy(ref))
    before = good.read_bytes()

    def broken_savez(handle, **arrays):
        handle.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez_compressed", broken_savez)
    with pytest.warns(UserWarning, match="disk full"):  # a cache failure never costs the result
        assert store.put(k, copy.deepcopy(ref)) is None
    assert good.read_bytes() == before
    assert [p.name for p in good.parent.iterdir()] == [good.name]


def test_bad_keys_are_refused(tmp_path):
    with pytest.raises(ValueError, match="hex digest"):
        ResultCache(tmp_path).path("../../etc/passwd")


def test_location_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ESS_EXPLORER_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c" and ResultCache().root == tmp_path / "c"
    monkeypatch.delenv("ESS_EXPLORER_CACHE")
    assert default_cache_dir().parts[-2:] == (".cache", "ess-explorer")


def test_folder_identity_follows_config_and_weights(tmp_path, monkeypatch):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "x", "hidden_size": 8}))
    (folder / "model.safetensors").write_bytes(b"weights-1")
    first = folder_identity(folder)
    assert model_identity(str(folder)) == {"source": str(folder.resolve()), **first}
    (folder / "model.safetensors").write_bytes(b"weights-2")
    second = folder_identity(folder)
    assert second != first
    (folder / "config.json").write_text(json.dumps({"model_type": "x", "hidden_size": 16}))
    assert folder_identity(folder) != second
    monkeypatch.setattr(sources_mod, "HASH_BYTES_UP_TO", 0)  # big files: size + mtime
    assert "size=" in folder_identity(folder)["weights"]["model.safetensors"]
    with pytest.raises(ValueError, match="no config.json"):
        folder_identity(tmp_path)


def test_hub_identity_uses_the_loaded_commit():
    class Config:
        _commit_hash = "0123abcd"

    class Model:
        config = Config()

    assert model_identity("org/name", Model()) == {"kind": "hub", "source": "org/name", "revision": "0123abcd"}
    assert model_identity("org/name", Model(), revision="v2")["revision"] == "v2"
    assert model_identity("org/name")["revision"] is None


def test_a_result_folder_links_the_cache_entry_and_a_hit_rewrites_nothing(tmp_path):
    from ess_explorer.io import RESULT_FILE, TABLE_FILE, write_result_dir

    cache = ResultCache(tmp_path / "cache")
    k = key(prompt="linked")
    result, hit = cache.get_or_compute(k, lambda: reference_result())
    entry = cache.path(k)
    assert not hit
    out = write_result_dir(result, tmp_path / "run")
    # one copy on disk: the folder's result.npz is the cache entry
    assert (out / RESULT_FILE).samefile(entry) and entry.stat().st_nlink == 2
    written = {name: (out / name).stat().st_mtime_ns for name in (RESULT_FILE, TABLE_FILE)}
    again, hit = cache.get_or_compute(k, lambda: pytest.fail("a hit computes nothing"))
    assert hit
    write_result_dir(again, out)
    assert {name: (out / name).stat().st_mtime_ns for name in written} == written
    # a result changed in memory is written afresh, never linked to the file it came from
    again.meta["note"] = "changed"
    write_result_dir(again, tmp_path / "other")
    assert not (tmp_path / "other" / RESULT_FILE).samefile(entry)
    assert json.loads((tmp_path / "other" / "meta.json").read_text())["meta"]["note"] == "changed"
    assert ESSResult.load(tmp_path / "other" / RESULT_FILE).meta["note"] == "changed"
