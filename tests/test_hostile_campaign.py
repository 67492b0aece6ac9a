"""Hostile input, second campaign: a table of bad inputs per entry point, each asserting the
class of its outcome (a result, one clear error, a warning), plus property tests of the
result-file reader.

Outcome classes: "refused" (a ValueError / exit 1 or 2 with one `ess-explorer: error:` line,
nothing written), "warned" (the right answer and a warning), "ok" (the right answer).
"""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_hostile import assert_clean, fake_cli, files_in, run_cli

from ess_explorer import bounded
from ess_explorer.io import ResultCache, cache_key, read_result, write_result_dir
from ess_explorer.result import ESSResult
from ess_explorer.sources import model_dir
from ess_explorer.synthetic import reference_result

PROPERTIES = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.fixture(scope="module")
def ref():
    return reference_result(16)


@pytest.fixture(scope="module")
def other():
    """A result of another run (another prompt length) than ``ref``."""
    return reference_result(24)


# ---- security ---------------------------------------------------------------------------------
def remote_code_folder(tmp_path: Path) -> Path:
    """A model folder whose config asks for its own code; importing that code leaves a mark."""
    folder = tmp_path / "remote"
    folder.mkdir()
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir("mamba2_n16") / name, folder / name)
    config = json.loads((model_dir("mamba2_n16") / "config.json").read_text())
    config.update(model_type="evil_custom", auto_map={"AutoConfig": "configuration_evil.EvilConfig"})
    (folder / "config.json").write_text(json.dumps(config))
    mark = tmp_path / "code-ran"
    (folder / "configuration_evil.py").write_text(f"open({str(mark)!r}, 'w').write('ran')\n")
    return folder


def test_remote_code_is_never_asked_for_nor_run(tmp_path, monkeypatch):
    folder = remote_code_folder(tmp_path)
    asked = []
    # answer "y" as a user at a terminal might: the question must never come
    monkeypatch.setattr("builtins.input", lambda *a: asked.append(a) or "y")
    monkeypatch.setenv("ESS_EXPLORER_CACHE", str(tmp_path / "cache"))
    for extra in ([], ["--no-cache"]):
        code, _, err = run_cli(["analyze", "--model", folder, "-p", "a b c", "-q", *extra])
        assert code == 1 and "never runs" in err, err
        assert_clean(code, err)
    assert asked == [] and not (tmp_path / "code-ran").exists()


@pytest.mark.parametrize("name", ["../../../some/folder", "/abs/folder", "mamba2_n16/../mamba2_n4", "", ".hidden"])
def test_zoo_names_are_names_never_paths(name, tmp_path):
    from ess_explorer.sources import load_model

    with pytest.raises(ValueError, match="not a zoo model name"):
        load_model(f"zoo:{name}")


def test_a_zoo_name_cannot_reach_a_model_folder_outside_the_zoo(tmp_path):
    from ess_explorer import sources

    outside = tmp_path / "outside"
    shutil.copytree(model_dir("mamba2_n4"), outside)
    relative = os.path.relpath(outside, sources.ZOO_DIR)
    for name in (relative, str(outside)):
        with pytest.raises(ValueError, match="not a zoo model name"):
            sources.model_dir(name)


def test_a_cache_entry_of_another_run_is_not_served(ref, other, tmp_path):
    cache = ResultCache(tmp_path)
    parts = dict(layers=None, dtype="float32", tol=1e-3, relative=True)
    mine = cache_key({"source": "zoo:a"}, ref.input_ids, prompt="mine", **parts)
    theirs = cache_key({"source": "zoo:b"}, other.input_ids, prompt="theirs", **parts)
    cache.put(theirs, copy.deepcopy(other))
    cache.path(mine).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(cache.path(theirs), cache.path(mine))  # e.g. copied or renamed by hand
    with pytest.warns(UserWarning, match="another"):
        assert cache.get(mine) is None
    # forged: the entry says it is this key, but holds another prompt's tokens
    forged = copy.deepcopy(other)
    forged.meta.update(cache_key=str(mine), cache_record=mine.record)
    forged.save(cache.path(mine))
    with pytest.warns(UserWarning, match="other tokens"):
        assert cache.get(mine) is None
    cache.put(mine, copy.deepcopy(ref))
    assert cache.get(mine).input_ids == ref.input_ids  # its own entry is served


# ---- data loss --------------------------------------------------------------------------------
@pytest.mark.parametrize("member", ["table.csv", "meta.json", "result.npz"])
def test_an_old_result_folder_is_untouched_when_a_member_cannot_be_replaced(ref, other, tmp_path, member):
    out = tmp_path / "out"
    write_result_dir(other, out)
    before = {name: (out / name).read_bytes() for name in ("result.npz", "table.csv", "meta.json")}
    (out / member).unlink()
    (out / member).mkdir()
    with pytest.raises(ValueError, match="is not a file"):
        write_result_dir(ref, out)
    for name, data in before.items():
        if name != member:
            assert (out / name).read_bytes() == data, name
    assert sorted(p.name for p in out.iterdir()) == sorted(before)  # no staging folder left


def test_the_cli_refuses_such_a_folder_in_one_line(ref, other, tmp_path):
    out = tmp_path / "out"
    write_result_dir(other, out)
    (out / "table.csv").unlink()
    (out / "table.csv").mkdir()
    with fake_cli(ref, tmp_path):
        code, _, err = run_cli(["analyze", "-p", "some text", "--out", out, "-q"])
    assert code == 1 and "table.csv" in err
    assert_clean(code, err)
    assert read_result(out).input_ids == other.input_ids


def test_a_cache_entry_that_is_a_folder_only_warns_after_out_is_written(ref, tmp_path, monkeypatch):
    out = tmp_path / "out"
    with fake_cli(ref, tmp_path) as calls:
        key_paths = []
        original = ResultCache.put

        def put_into_a_folder(self, key, result):
            self.path(key).mkdir(parents=True)  # the entry's place is taken by a folder
            key_paths.append(out.exists())
            return original(self, key, result)

        monkeypatch.setattr(ResultCache, "put", put_into_a_folder)
        code, _, err = run_cli(["analyze", "-p", "some text", "--out", out, "-q"])
    assert code == 0 and calls["analyze"] == 1, err
    assert "warning: could not write the cache entry" in err
    assert key_paths == [True]  # --out was written before the cache was tried
    assert files_in(out) == ["meta.json", "result.npz", "table.csv"]


def test_concurrent_writers_never_leave_a_folder_mixing_runs(ref, other, tmp_path):
    out = tmp_path / "out"
    errors = []

    def write(result):
        try:
            write_result_dir(result, out)
        except Exception as error:  # noqa: BLE001 (collected, asserted empty below)
            errors.append(error)

    threads = [threading.Thread(target=write, args=(ref if i % 2 else other,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    meta = json.loads((out / "meta.json").read_text())
    back = read_result(out)  # checks result.npz against meta.json's record
    assert meta["length"] == back.length
    assert (out / "table.csv").read_text().count("\n") - 1 == len(back.to_frame())
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "result.npz", "table.csv"]


@pytest.mark.slow
def test_concurrent_processes_leave_one_whole_result(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ESS_EXPLORER_CACHE": str(tmp_path / "cache")}
    script = (
        "import sys; from ess_explorer.synthetic import reference_result; from ess_explorer.io import "
        "write_result_dir; write_result_dir(reference_result(int(sys.argv[1])), sys.argv[2])"
    )
    runs = [
        subprocess.Popen([sys.executable, "-c", script, str(16 + 8 * (i % 2)), str(out)], env=env) for i in range(4)
    ]
    assert [run.wait(timeout=120) for run in runs] == [0] * 4
    assert read_result(out).length == json.loads((out / "meta.json").read_text())["length"]


def test_a_folder_whose_members_come_from_two_runs_is_refused(ref, other, tmp_path):
    write_result_dir(ref, tmp_path / "a")
    write_result_dir(other, tmp_path / "b")
    shutil.copy(tmp_path / "b" / "result.npz", tmp_path / "a" / "result.npz")
    with pytest.raises(ValueError, match="mixes files of different runs"):
        read_result(tmp_path / "a")


# ---- result files: bounded, never unpickled ---------------------------------------------------
def zip_of(members: dict) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def npy_header(shape, descr="<f8") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def npy_of(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=array.dtype.hasobject)
    return buffer.getvalue()


def header_member(data: bytes) -> bytes:
    return npy_of(np.frombuffer(data, dtype=np.uint8))


BAD_RESULT_FILES = {
    "zeroed": b"\0" * 4096,
    "random bytes": bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)),
    "text": b"hello, I am a text file\n",
    "empty": b"",
    "a 233 TiB array": zip_of({"__header__.npy": npy_header((1 << 45,)) + b"\0" * 64}),
    "object array": zip_of({"__header__.npy": npy_of(np.array([1, "x"], dtype=object))}),
    "nested 100000 deep": zip_of({"__header__.npy": header_member(b"[" * 100_000 + b"]" * 100_000)}),
    "zip bomb": None,  # built in the test: twice the limit of zeros in a few hundred KB
}


def zip_bomb(path: Path, size: int) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("a.npy", "w", force_zip64=True) as member:
            member.write(npy_header((size // 8,)))
            block = b"\0" * (1 << 20)
            for _ in range(size // len(block)):
                member.write(block)


@pytest.mark.parametrize("kind", list(BAD_RESULT_FILES))
def test_unreadable_result_files_are_one_clear_error(kind, tmp_path, monkeypatch):
    path = tmp_path / "r.npz"
    if kind == "zip bomb":
        monkeypatch.setattr(bounded, "MAX_RESULT_BYTES", 64 << 20)  # the same check, a smaller bomb
        zip_bomb(path, 128 << 20)
    else:
        path.write_bytes(BAD_RESULT_FILES[kind])
    with pytest.raises(ValueError, match="not a readable ESS result") as caught:
        ESSResult.load(path)
    message = str(caught.value)
    assert "pickle" not in message.replace("never unpickled", "") and "allow_pickle" not in message
    if kind in ("zip bomb", "a 233 TiB array", "nested 100000 deep"):
        assert any(word in message for word in ("limit", "declares", "deeper")), message


def test_a_symlink_to_a_text_file_and_a_device_are_refused(tmp_path):
    (tmp_path / "t.txt").write_text("text")
    (tmp_path / "link.npz").symlink_to(tmp_path / "t.txt")
    for path in (tmp_path / "link.npz", Path("/dev/zero")):
        with pytest.raises(ValueError, match="not an .npz archive|not a regular file"):
            ESSResult.load(path)


def test_the_figure_command_refuses_a_bad_result_in_one_line(ref, tmp_path):
    (tmp_path / "r.npz").write_bytes(BAD_RESULT_FILES["a 233 TiB array"])
    with fake_cli(ref, tmp_path):
        code, _, err = run_cli(["figure", tmp_path / "r.npz", "--kind", "overview", "--out", tmp_path / "f.pdf"])
    assert code == 1 and "declares shape" in err
    assert_clean(code, err)


@PROPERTIES
@given(data=st.binary(max_size=2048), cut=st.integers(0, 4096), flip=st.integers(0, 4095))
def test_property_the_reader_gives_a_result_or_a_value_error(data, cut, flip, tmp_path_factory):
    """Arbitrary bytes, and a real result truncated or with one byte flipped: a result or a
    ValueError, never another exception and never numpy's advice to unpickle."""
    folder = tmp_path_factory.mktemp("prop")
    good = reference_result(8).save(folder / "good.npz").read_bytes()
    damaged = bytearray(good[: max(cut, 1)])
    damaged[flip % len(damaged)] ^= 0xFF
    for payload in (data, bytes(damaged), good[:cut]):
        path = folder / "r.npz"
        path.write_bytes(payload)
        try:
            ESSResult.load(path)
        except ValueError as error:
            assert "allow_pickle" not in str(error)


@PROPERTIES
@given(depth=st.integers(0, 200), size=st.integers(0, 300))
def test_property_json_headers_are_parsed_within_the_limits(depth, size):
    text = b'{"a": ' * depth + b'"' + b"[" * size + b'"' + b"}" * depth
    if depth > bounded.MAX_JSON_DEPTH:
        with pytest.raises(ValueError, match="nested deeper"):
            bounded.parse_json(text, "the header")
    else:
        assert bounded.parse_json(text, "the header") is not None  # brackets inside strings do not count
