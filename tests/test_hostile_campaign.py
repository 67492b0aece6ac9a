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
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_hostile import assert_clean, fake_cli, files_in, no_forward, run_cli

from ess_explorer import bounded
from ess_explorer.core.ess import entropy_ess, tolerance_ess
from ess_explorer.io import ResultCache, read_result, write_result_dir
from ess_explorer.result import ESSResult
from ess_explorer.runs import AnalysisRun
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
    mine = AnalysisRun({"source": "zoo:a"}, tuple(ref.input_ids), prompt="mine").cache_key()
    theirs = AnalysisRun({"source": "zoo:b"}, tuple(other.input_ids), prompt="theirs").cache_key()
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


# ---- the core: silent answers become refusals -------------------------------------------------
SIGMA = np.array([[2.0, 1.0, 0.5]])
LOWER = np.tril(np.random.default_rng(0).standard_normal((6, 6)))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: tolerance_ess(spectra=SIGMA, tol=1.0), "below 1"),
        (lambda: tolerance_ess(spectra=SIGMA, tol=7.5), "below 1"),
        (lambda: tolerance_ess(spectra=SIGMA, reference=-1), "reference"),
        (lambda: tolerance_ess(spectra=SIGMA, reference=float("nan")), "reference"),
        (lambda: tolerance_ess(spectra=SIGMA[:, ::-1].copy()), "descending"),
        (lambda: entropy_ess(spectra=np.array([[0.0, 1.0]])), "descending"),
        (lambda: tolerance_ess(LOWER, stride=1.5), "stride"),
        (lambda: tolerance_ess(LOWER, stride=True), "stride"),
        (lambda: entropy_ess(LOWER, positions=["a"]), "positions"),
        (lambda: tolerance_ess(torch.tensor(LOWER).to(torch.int32)), "floating"),
        (lambda: tolerance_ess(LOWER, dtype=torch.int32), "dtype"),
    ],
)
def test_core_inputs_that_were_silent_or_raw_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_an_absolute_tolerance_above_1_is_a_threshold(ref):
    assert tolerance_ess(spectra=SIGMA, tol=1.5, relative=False).tolist() == [1]


@PROPERTIES
@given(
    sigma=st.lists(st.floats(0, 1e6), min_size=1, max_size=8),
    tol=st.floats(0, 0.999),
)
def test_property_tolerance_ess_counts_above_the_threshold(sigma, tol):
    values = sorted(sigma, reverse=True)
    count = int(tolerance_ess(spectra=np.array([values]), tol=tol)[0])
    assert count == sum(v > tol * values[0] for v in values)
    assert 0 <= float(entropy_ess(spectra=np.array([values]))[0]) <= len(values) + 1e-9


# ---- analyze and load_model -------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    from ess_explorer.sources import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model("zoo:mamba2_n16")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"input_ids": [[1, 2], [3]]}, "ragged"),
        ({"input_ids": [2**70, 1]}, "int64"),
        ({"input_ids": [1, 2, 3], "device": "meta"}, "no data"),
        ({"input_ids": [1, 2, 3], "device": "gpu9"}, "not usable"),
        ({"input_ids": [1, 2, 3], "tol": 1.0}, "below 1"),
        ({"input_ids": [1, 2, 3], "max_seconds": -1}, "max_seconds"),
    ],
)
def test_analyze_refuses_before_the_forward_pass(tiny, monkeypatch, kwargs, message):
    from ess_explorer.analysis import analyze

    no_forward(monkeypatch)
    with pytest.raises(ValueError, match=message):
        analyze(tiny[0], progress=False, **kwargs)


def test_analyze_refuses_a_source_name_for_a_model():
    from ess_explorer.analysis import analyze

    with pytest.raises(ValueError, match="load it first"):
        analyze("zoo:llama", [1, 2, 3])


def test_a_stride_beyond_the_prompt_is_refused(tiny):
    from ess_explorer.analysis import analyze

    with pytest.raises(ValueError, match="leaves only the cut t = 0"):
        analyze(tiny[0], [3, 4, 5, 6], stride=4, progress=False)
    assert analyze(tiny[0], [3, 4, 5, 6], stride=3, layers=[0], progress=False).layer(0).positions.tolist() == [0, 3]


def test_unknown_words_are_refused_or_warned(tiny):
    from ess_explorer.analysis import analyze

    model, tokenizer = tiny
    with pytest.raises(ValueError, match="unknown to the tokenizer"):
        analyze(model, prompt="hello world", tokenizer=tokenizer, progress=False)
    with pytest.warns(UserWarning, match="1 of 3 tokens"):
        analyze(model, prompt="ba hello bo", tokenizer=tokenizer, layers=[0], progress=False)


def test_a_tokenizer_without_its_vocabulary_is_named_not_the_prompt(tiny):
    """A tokenizer class loaded without its vocabulary files reads any text as no tokens."""
    from ess_explorer.analysis import analyze

    def empty(text, add_special_tokens=True):
        return {"input_ids": []}

    with pytest.raises(ValueError, match="turned a 11-character prompt into no tokens"):
        analyze(tiny[0], prompt="hello world", tokenizer=empty, progress=False)


def test_a_long_run_is_refused_with_its_estimate(tiny):
    from ess_explorer.analysis import analyze, capture_layers, estimate_seconds

    ids = [3 + i % 10 for i in range(600)]
    with pytest.raises(ValueError, match=r"would take about \d+ s \(limit 1 s\)"):
        analyze(tiny[0], ids, max_seconds=1, progress=False)
    estimate = estimate_seconds(capture_layers(tiny[0], ids))
    assert estimate_seconds(capture_layers(tiny[0], ids), stride=8) < estimate / 4


def test_on_a_gpu_a_run_over_the_limit_warns_instead_of_being_refused(tiny):
    """The estimate's figures are a 2-core CPU's: on a GPU (its routes, run here on the CPU) a
    run estimated over the limit goes on, and a warning says why the limit was not applied."""
    from ess_explorer.analysis import analyze
    from ess_explorer.core.accelerator import accelerator_routes_on_cpu

    ids = [3 + i % 10 for i in range(96)]
    with pytest.raises(ValueError, match="would take about"):
        analyze(tiny[0], ids, max_seconds=1e-6, progress=False, layers=[0])
    with accelerator_routes_on_cpu(), pytest.warns(UserWarning, match="on 2 CPU cores.*no time estimate exists for"):
        result = analyze(tiny[0], ids, max_seconds=1e-6, progress=False, layers=[0])
    assert result.layers[0].tolerance_ess.shape[-1] == len(ids)


def test_a_config_with_100000_layers_is_refused_before_it_is_built(tmp_path, monkeypatch):
    from ess_explorer.sources import load_model

    folder = tmp_path / "model"
    shutil.copytree(model_dir("mamba2_n16"), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 100_000}))
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", lambda *a, **k: pytest.fail("built"))
    with pytest.raises(ValueError, match="declares 100000 layers"):
        load_model(str(folder))


@pytest.mark.parametrize(
    "model_type, why",
    [("markuplm", "model types are supported: `ess-explorer models --families`"), ("jetmoe", "routed per token")],
)
def test_an_unsupported_model_type_is_refused_before_its_weights_are_read(tmp_path, monkeypatch, model_type, why):
    import transformers

    from ess_explorer.sources import load_model

    folder = tmp_path / "model"
    folder.mkdir()
    transformers.AutoConfig.for_model(model_type, num_hidden_layers=1).save_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"")  # never read: the config decides first
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", lambda *a, **k: pytest.fail("built"))
    with pytest.raises(ValueError, match=f"'{model_type}'.*not supported.*{why}"):
        load_model(str(folder))


def test_damaged_model_files_are_named(tmp_path):
    from ess_explorer.sources import load_model

    folder = tmp_path / "model"
    shutil.copytree(model_dir("mamba2_n16"), folder)
    (folder / "tokenizer.json").write_text("{broken")
    with pytest.warns(UserWarning, match="tokenizer files of .* cannot be read"):
        load_model(str(folder))
    weights = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(weights[: len(weights) // 3])
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        load_model(str(folder))


# ---- the command line -------------------------------------------------------------------------
def binary_stdin(path: str):
    return io.TextIOWrapper(open(path, "rb"), encoding="utf-8")  # noqa: SIM115 (closed by the test)


@pytest.mark.parametrize(
    "argv, stdin, code, message",
    [
        (["--prompt-file", "/dev/zero"], None, 1, "longer than 1 MiB"),
        (["--prompt-file", "/dev/urandom"], None, 1, "longer than 1 MiB"),
        (["-p", "-"], "/dev/zero", 1, "longer than 1 MiB"),
        (["--prompt-file", "-"], "closed", 1, "stdin is closed"),
        (["-p", "-"], "closed", 1, "stdin is closed"),
        (["-p", "abc", "--tol", "1"], None, 1, "below 1"),
        (["-p", "abc", "--tol", "3", "--absolute"], None, 0, ""),
        (["-p", "abc", "--max-seconds", "-1"], None, 2, "max-seconds"),
    ],
)
def test_analyze_on_the_command_line(ref, tmp_path, monkeypatch, argv, stdin, code, message):
    with fake_cli(ref, tmp_path) as calls:
        if stdin == "closed":
            closed = io.StringIO("")
            closed.close()
            monkeypatch.setattr("sys.stdin", closed)
        elif stdin is not None:
            monkeypatch.setattr("sys.stdin", binary_stdin(stdin))
        got, _, err = run_cli(["analyze", *argv, "-q", "--no-cache"])
    assert got == code and message in err, err
    assert_clean(got, err)
    assert calls["analyze"] == (1 if code == 0 else 0)


def test_a_20000_token_prompt_on_the_default_model_is_refused_with_an_estimate(tmp_path):
    prompt = tmp_path / "long.txt"
    prompt.write_text(" ".join(f"ba {i % 100:02d}" for i in range(10_000)))
    code, _, err = run_cli(["analyze", "--prompt-file", prompt, "--no-cache", "-q"])
    assert code == 1 and "would take about" in err and "--max-seconds" in err, err
    assert_clean(code, err)


@pytest.mark.parametrize("ppi", ["0.0001", "5"])
def test_a_resolution_too_low_to_draw_is_refused(ref, tmp_path, ppi):
    write_result_dir(ref, tmp_path / "r")
    with fake_cli(ref, tmp_path):
        code, _, err = run_cli(
            ["figure", tmp_path / "r", "--kind", "overview", "--out", tmp_path / "f.png", "--ppi", ppi]
        )
    assert code == 2 and "--ppi must be in [10," in err
    assert_clean(code, err)


def test_figures_refuse_an_unknown_font_and_results_of_other_prompts(ref, other):
    from ess_explorer.views.figures import figure

    with pytest.raises(ValueError, match="font must be"):
        figure(ref, "overview", font="comic")
    assert figure(ref, "overview", font="Comic Neue, sans-serif") is not None
    with pytest.raises(ValueError, match="one prompt"):
        figure({"a": ref, "b": other}, "compare")


# ---- the explorer and the magic ---------------------------------------------------------------
@pytest.mark.parametrize(
    "options, message",
    [
        ({"layer": 99}, "layer 99 is not in the result"),
        ({"layer": -1}, "layer must be a layer index"),
        ({"unit": 999}, "unit 999 is not in layer"),
        ({"unit": "median"}, "unit must be one of"),
        ({"cache": "yes"}, "cache must be"),
        ({"tol": True}, "tol must be"),
        ({"tol": 2.0}, "below 1"),
    ],
)
def test_the_explorer_refuses_options_it_would_replace(ref, options, message):
    from ess_explorer.app.widget import ESSExplorer

    with pytest.raises(ValueError, match=message):
        ESSExplorer(result=ref, static=False, **options)


@pytest.mark.parametrize("value, message", [(True, "tol must be"), (float("nan"), "finite"), (1.0, "below 1")])
def test_the_explorer_tol_trait_refuses_in_words(ref, value, message):
    import traitlets

    from ess_explorer.app.widget import ESSExplorer

    explorer = ESSExplorer(result=ref, static=False)
    with pytest.raises(traitlets.TraitError, match=message):
        explorer.tol = value
    assert explorer.tol == pytest.approx(ref.meta["tol"]) and explorer.tol_w.value == explorer.tol


def test_the_magic_refuses_a_layer_not_in_the_result_and_takes_causal(ref, tmp_path, capsys):
    from ess_explorer.app.magic import ess_magic

    path = ref.save(tmp_path / "r.npz")
    assert ess_magic(f"--result {path} --layer 7") is None
    assert "%ess: error: layer 7 is not in the result" in capsys.readouterr().out
    assert ess_magic(f"--result {path} --variant causal").variant == "causal"


# ---- sweeps -----------------------------------------------------------------------------------
SWEEP = dict(models="zoo:mamba2_n4", prompts=["ba 01 bo 02", "bi 03 bu 04"], layers=[0], shard_size=1, progress=False)


def test_sweep_refuses_a_layer_string_and_a_plan_that_is_no_plan(tmp_path):
    from ess_explorer.sweep import run_sweep

    with pytest.raises(ValueError, match="layers must be an int or a list"):
        run_sweep(**{**SWEEP, "layers": "10"}, out=tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_sweep_recomputes_damaged_shards_with_a_warning(tmp_path):
    from ess_explorer.sweep import read_table, run_sweep

    out = tmp_path / "s"
    first = run_sweep(**SWEEP, out=out)
    table = read_table(out)
    shards = sorted((out / "table").rglob("*.parquet"))
    assert first.computed == 2 and len(shards) == 2
    for damage in ("truncate", "empty", "swap"):
        if damage == "truncate":
            shards[0].write_bytes(shards[0].read_bytes()[:100])
        elif damage == "empty":
            shards[0].write_bytes(b"")
        else:
            shutil.copy(shards[1], shards[0])  # a shard of the other prompt in its place
        with pytest.warns(UserWarning, match="recomputing the damaged shard"):
            again = run_sweep(**SWEEP, out=out)
        assert (again.computed, again.skipped) == (1, 1)
        assert read_table(out).equals(table)
    (out / "sweep.json").write_text("[]")
    with pytest.raises(ValueError, match="not a sweep plan"):
        run_sweep(**SWEEP, out=out)


def test_a_refused_sweep_can_be_rerun_corrected_into_the_same_folder(tmp_path):
    from ess_explorer.sweep import run_sweep

    out = tmp_path / "s"
    with pytest.raises(ValueError, match="out of range"):
        run_sweep(**{**SWEEP, "layers": [7]}, out=out)
    assert run_sweep(**SWEEP, out=out).computed == 2


def test_a_bad_prompt_in_a_sweep_is_named(tmp_path):
    from ess_explorer.sweep import run_sweep

    with pytest.raises(ValueError, match=r"prompt 1 \(\[999999, 1\]\)"):
        run_sweep(**{**SWEEP, "prompts": [[3, 4, 5], [999999, 1]]}, out=tmp_path / "s")


def test_a_ray_address_where_nothing_listens_is_refused_quickly(tmp_path):
    import time

    from ess_explorer.sweep.ray_backend import check_address

    start = time.perf_counter()
    with pytest.raises(ValueError, match="no Ray cluster answers at 127.0.0.1:1"):
        check_address("127.0.0.1:1")
    assert time.perf_counter() - start < 5
    with pytest.raises(ValueError, match="host:port"):
        check_address("nowhere")


def test_the_trainer_callback_refuses_text_prompts_without_a_tokenizer_before_training():
    from ess_explorer.sweep.callback import ESSCallback

    callback = ESSCallback(["ba 01 bo 02"], every_n_steps=1)
    with pytest.raises(ValueError, match="neither tokenizer="):
        callback.on_train_begin(None, None, None, processing_class=None)
    assert ESSCallback([[3, 4, 5]]).on_train_begin(None, None, "go", processing_class=None) == "go"


@pytest.mark.parametrize("device", ["gpu9", "meta"] + ([] if torch.cuda.is_available() else ["cuda"]))
def test_a_device_that_cannot_hold_data_is_refused_before_loading(device, tmp_path, monkeypatch):
    from ess_explorer.sources import load_model

    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", lambda *a, **k: pytest.fail("loading began"))
    with pytest.raises(ValueError, match="not usable here"):
        load_model("zoo:mamba2_n4", device=device)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("ba 01 bo 02\n")
    argv = ["sweep", "--models", "zoo:mamba2_n4", "--prompts", prompts, "--out", tmp_path / "s", "--device", device]
    code, _, err = run_cli([*argv, "-q"])
    assert code == 1 and "not usable here" in err
    assert_clean(code, err)


def test_sweep_prompt_files_are_read_within_a_bound(tmp_path, monkeypatch):
    from ess_explorer.sweep.inputs import load_prompts

    monkeypatch.setattr("ess_explorer.sweep.inputs.MAX_PROMPTS_FILE_BYTES", 64)
    (tmp_path / "big.txt").write_text("ba 01 bo 02\n" * 100)
    with pytest.raises(ValueError, match="longer than"):
        load_prompts(tmp_path / "big.txt")
    (tmp_path / "deep.jsonl").write_text("[" * 5000 + "]" * 5000 + "\n")
    monkeypatch.undo()
    with pytest.raises(ValueError, match="nested deeper"):
        load_prompts(tmp_path / "deep.jsonl")
