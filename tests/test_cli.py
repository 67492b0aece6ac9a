"""The ess-explorer command line: round trips analyze -> figure / report, the cache seen
from the CLI, prompts from stdin and files, and one-line errors with non-zero status.

Most tests replace the model-dependent steps (cli._load_model, cli._analyze,
cli._identity) with a fake that returns the synthetic reference result, so they need no
model; the last tests run the real default / zoo models when they are on disk."""

from __future__ import annotations

import copy
import io
import json

import numpy as np
import pytest

from ess_explorer.app import cli
from ess_explorer.result import ESSResult
from ess_explorer.synthetic import reference_result
from ess_explorer.views import figures


@pytest.fixture(scope="module")
def ref():
    return reference_result()


def fake_ids(text: str) -> list[int]:
    """As many ids as the reference result has tokens (48), from the text: the cache serves an
    entry only to the run whose token ids it holds."""
    return [ord(c) % 64 for c in (text * 48)[:48]]


class FakeTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": fake_ids(text)}


class FakeModel:
    def parameters(self):
        import torch

        yield torch.zeros(1)


@pytest.fixture
def fake(ref, monkeypatch, tmp_path):
    """Replace the model steps; record calls. The cache lives in tmp_path/cache."""
    calls = {"load": [], "analyze": []}

    def load(source, revision):
        if "missing" in source:
            raise ValueError(f"cannot load hub id {source!r}: not in the local cache")
        calls["load"].append(source)
        return FakeModel(), FakeTokenizer()

    def analyze(model, ids, tokenizer, **kw):
        calls["analyze"].append({"ids": list(ids), **kw})
        result = copy.deepcopy(ref)
        result.input_ids = list(ids)
        result.meta["model_id"] = "fake/model"
        result.meta["causal"] = kw.get("causal", True)  # as analyze records it
        return result

    monkeypatch.setattr(cli, "_load_model", load)
    monkeypatch.setattr(cli, "_analyze", analyze)
    monkeypatch.setattr(cli, "_identity", lambda source, model, revision: {"kind": "fake", "source": source})
    monkeypatch.setattr(cli, "_identity_without_weights", lambda source, revision: None)
    monkeypatch.setattr(cli, "_default_source", lambda: "zoo:default-for-test")
    monkeypatch.setenv("ESS_EXPLORER_CACHE", str(tmp_path / "cache"))
    return calls


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> str:
    """The error is exactly one line, the last on stderr (progress lines may come before)."""
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ess-explorer: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in err, err
    return errors[0]


def test_parse_layers():
    assert cli.parse_layers("0,2,5-7") == [0, 2, 5, 6, 7]
    assert cli.parse_layers("3, 1,1") == [1, 3]
    assert cli.parse_layers(None) is None and cli.parse_layers("all") is None
    for bad in ("x", "3-1", "1,,2", "-1"):
        with pytest.raises(cli.UsageError):
            cli.parse_layers(bad)


def test_cli_lists_every_figure_kind():
    assert cli.FIGURE_KINDS == tuple(figures.KINDS)


def test_analyze_writes_a_result_dir_and_prints_a_summary(fake, capsys, tmp_path, ref):
    code, out, err = run(capsys, "analyze", "--prompt", "hello world", "--layers", "0-3", "--out", str(tmp_path / "r"))
    assert code == 0, err
    assert fake["load"] == ["zoo:default-for-test"]  # no --model: the built-in default
    assert fake["analyze"][0]["ids"] == fake_ids("hello world")
    assert fake["analyze"][0]["layers"] == [0, 1, 2, 3] and fake["analyze"][0]["tol"] == 1e-3
    lines = out.splitlines()
    assert "cache miss" in lines[0]
    rows = [line.split() for line in lines if line[:1].isdigit()]
    assert [r[0] for r in rows] == ["0", "1", "2", "3"] and [r[1] for r in rows][:2] == [
        "softmax_attention",
        "short_conv",
    ]
    assert float(rows[1][5]) == pytest.approx(3.0)  # short conv k = 4: max ESS = k - 1
    saved = ESSResult.load(tmp_path / "r" / "result.npz")
    assert saved.meta["prompt"] == "hello world" and saved.meta["source"] == "zoo:default-for-test"
    assert np.array_equal(saved.layer(0).tolerance_ess, ref.layer(0).tolerance_ess)
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert meta["meta"]["prompt"] == "hello world"
    assert (tmp_path / "r" / "table.csv").is_file()


def test_second_run_is_a_cache_hit_and_no_cache_bypasses(fake, capsys, tmp_path):
    assert run(capsys, "analyze", "-p", "same prompt", "-q")[0] == 0
    code, out, _ = run(capsys, "analyze", "-p", "same prompt", "-q")
    assert code == 0 and "cache hit" in out and len(fake["analyze"]) == 1
    code, out, _ = run(capsys, "analyze", "-p", "same prompt", "--tol", "1e-2", "-q")
    assert "cache miss" in out and len(fake["analyze"]) == 2  # another tolerance, another entry
    entries = list((tmp_path / "cache" / "results").glob("*/*.npz"))
    code, out, _ = run(capsys, "analyze", "-p", "same prompt", "--no-cache", "-q")
    assert code == 0 and "cache" not in out.splitlines()[0] and len(fake["analyze"]) == 3
    assert list((tmp_path / "cache" / "results").glob("*/*.npz")) == entries  # untouched


def test_no_causal_reaches_analyze_and_has_its_own_cache_entry(fake, capsys):
    code, out, _ = run(capsys, "analyze", "-p", "same prompt", "-q")
    assert code == 0 and "no causal ESS" not in out
    code, out, _ = run(capsys, "analyze", "-p", "same prompt", "--no-causal", "-q")
    assert code == 0 and "cache miss" in out and len(fake["analyze"]) == 2  # not the full result's entry
    assert "no causal ESS" in out.splitlines()[0]  # the summary says what is missing
    assert [call["causal"] for call in fake["analyze"]] == [True, False]
    code, out, _ = run(capsys, "analyze", "-p", "same prompt", "--no-causal", "-q")
    assert "cache hit" in out and len(fake["analyze"]) == 2


def test_a_truncated_cache_entry_is_recomputed_by_the_cli(fake, capsys, tmp_path):
    assert run(capsys, "analyze", "-p", "cached", "-q")[0] == 0
    (entry,) = (tmp_path / "cache" / "results").glob("*/*.npz")
    entry.write_bytes(entry.read_bytes()[:100])
    code, out, err = run(capsys, "analyze", "-p", "cached", "-q")  # the CLI prints warnings as one line
    assert "ess-explorer: warning: ignoring an unreadable cache entry" in err and "Traceback" not in err
    assert code == 0 and "cache miss" in out and len(fake["analyze"]) == 2
    assert ESSResult.load(entry).layers  # overwritten with a good entry


def test_prompt_from_stdin_and_file(fake, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("from stdin\n"))
    assert run(capsys, "analyze", "-q")[0] == 0
    assert fake["analyze"][-1]["ids"] == fake_ids("from stdin")  # trailing newline dropped
    monkeypatch.setattr("sys.stdin", io.StringIO("dash means stdin"))
    assert run(capsys, "analyze", "-q", "--prompt", "-")[0] == 0
    assert fake["analyze"][-1]["ids"] == fake_ids("dash means stdin")
    long_prompt = tmp_path / "long.txt"
    long_prompt.write_text("a longer prompt\nover two lines\n")
    assert run(capsys, "analyze", "-q", "--prompt-file", str(long_prompt))[0] == 0
    assert fake["analyze"][-1]["ids"] == fake_ids("a longer prompt\nover two lines")


def test_no_prompt_uses_the_zoo_example(fake, capsys, monkeypatch):
    monkeypatch.setattr(cli, "_example_prompt", lambda source: "k1 v1 k1" if source.startswith("zoo:") else None)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    code, _, err = run(capsys, "analyze")
    assert code == 0, err
    assert "example prompt" in err and fake["analyze"][-1]["ids"] == fake_ids("k1 v1 k1")


def test_the_model_may_be_named_without_model(fake, capsys, tmp_path):
    """`analyze MODEL` is `analyze --model MODEL`; two different models are a usage error."""
    code, _, err = run(capsys, "analyze", "org/some-model", "-p", "x y", "--no-cache")
    assert code == 0, err
    assert fake["load"][-1] == "org/some-model"
    code, _, err = run(
        capsys, "report", "org/other-model", "-p", "x y", "--no-cache", "--out", str(tmp_path / "r.html")
    )
    assert code == 0, err
    assert fake["load"][-1] == "org/other-model"
    code, _, err = run(capsys, "analyze", "org/a", "--model", "org/b", "-p", "x")
    assert code == 2 and "two models: 'org/a' and --model 'org/b'" in one_line_error(err)
    assert fake["load"][-1] == "org/other-model"  # refused before anything loads


def test_errors_are_one_line_and_non_zero(fake, capsys, tmp_path, monkeypatch):
    code, _, err = run(capsys, "analyze", "--model", "org/missing-model", "-p", "x y")
    assert code == 1 and "missing-model" in one_line_error(err)
    code, _, err = run(capsys, "analyze", "--prompt-file", str(tmp_path / "nope.txt"))
    assert code == 1 and "no such file" in one_line_error(err)
    code, _, err = run(capsys, "analyze", "--layers", "a-b", "-p", "x")
    assert code == 2 and "--layers" in one_line_error(err)
    code, _, err = run(capsys, "analyze", "--tol", "-1", "-p", "x")
    assert code == 2 and "tolerance" in one_line_error(err)
    code, _, err = run(capsys, "analyze", "--bogus")
    assert code == 2 and "--bogus" in one_line_error(err)
    code, _, err = run(capsys, "frobnicate")
    assert code == 2 and "frobnicate" in one_line_error(err)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    code, _, err = run(capsys, "analyze", "--model", "org/some-model")  # not a zoo model: no example prompt
    assert code == 2 and "give a prompt" in one_line_error(err)
    code, _, err = run(capsys, "analyze", "-p", "x", "--prompt-file", "y")
    assert code == 2 and "not both" in one_line_error(err)
    code, _, err = run(capsys, "figure", str(tmp_path / "none"), "--kind", "overview", "--out", str(tmp_path / "f.pdf"))
    assert code == 1 and "no ESS result" in one_line_error(err)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"garbage")
    code, _, err = run(capsys, "figure", str(bad), "--kind", "overview", "--out", str(tmp_path / "f.pdf"))
    assert code == 1 and "not a readable ESS result" in one_line_error(err)
    code, _, err = run(capsys, "figure", str(bad), "--kind", "pie", "--out", str(tmp_path / "f.pdf"))
    assert code == 2 and "unknown --kind 'pie'" in one_line_error(err)
    code, _, err = run(capsys, "figure", str(bad), "--kind", "overview", "--out", str(tmp_path / "f.gif"))
    assert code == 2 and ".pdf, .svg or .png" in one_line_error(err)
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.startswith("ess-explorer ")


def test_figure_and_report_round_trips(fake, capsys, tmp_path):
    assert run(capsys, "analyze", "-p", "round trip", "-q", "--out", str(tmp_path / "a"))[0] == 0
    for kind, extra in [("overview", []), ("spectrum", ["--layers", "0", "--positions", "8,16,24"])]:
        out = tmp_path / f"{kind}.pdf"
        code, stdout, err = run(capsys, "figure", str(tmp_path / "a"), "--kind", kind, "--out", str(out), *extra)
        assert code == 0, err
        assert out.read_bytes().startswith(b"%PDF-") and f"wrote {out}" in stdout
    code, _, err = run(
        capsys,
        "figure",
        str(tmp_path / "a" / "result.npz"),
        "--kind",
        "utilisation",
        "--out",
        str(tmp_path / "u.svg"),
        "--font",
        "sans",
        "--width",
        "double",
    )
    assert code == 0 and "Liberation Sans" in (tmp_path / "u.svg").read_text()
    code, _, err = run(
        capsys, "figure", str(tmp_path / "a"), "--kind", "compare", "--t", "3", "--out", str(tmp_path / "x.png")
    )
    assert code == 2 and "--kind compare takes no --t" in one_line_error(err)
    code, _, err = run(
        capsys, "figure", str(tmp_path / "a"), "--kind", "spectrum", "--layers", "0,1", "--out", str(tmp_path / "s.png")
    )
    assert code == 2 and "give --layers N" in one_line_error(err)
    # two results: compare
    assert run(capsys, "analyze", "-p", "round trip", "-q", "--tol", "0.1", "--out", str(tmp_path / "b"))[0] == 0
    code, _, err = run(
        capsys,
        "figure",
        str(tmp_path / "a"),
        str(tmp_path / "b"),
        "--kind",
        "compare",
        "--width",
        "double",
        "--out",
        str(tmp_path / "c.png"),
    )
    assert code == 0, err
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    # report from a saved result, and straight from a model + prompt (cached analysis reused)
    code, out, err = run(capsys, "report", "--result", str(tmp_path / "a"), "--out", str(tmp_path / "r.html"))
    assert code == 0, err
    assert "vegaEmbed(" in (tmp_path / "r.html").read_text()
    analyses = len(fake["analyze"])
    code, out, err = run(capsys, "report", "-p", "round trip", "-q", "--layer", "2", "--out", str(tmp_path / "r2.html"))
    assert code == 0, err
    assert "cache hit" in out and len(fake["analyze"]) == analyses
    assert '"layer": 2' in (tmp_path / "r2.html").read_text()
    code, _, err = run(capsys, "report", "--result", str(tmp_path / "a"), "-p", "x", "--out", str(tmp_path / "r3.html"))
    assert code == 2 and "--result" in one_line_error(err)


def test_compare_of_two_prompts_names_the_flag_that_allows_it(fake, capsys, tmp_path):
    for name, prompt in (("a", "one prompt"), ("b", "another prompt")):
        assert run(capsys, "analyze", "-p", prompt, "-q", "--out", str(tmp_path / name))[0] == 0
    args = ["figure", str(tmp_path / "a"), str(tmp_path / "b"), "--kind", "compare", "--out"]
    code, _, err = run(capsys, *args, str(tmp_path / "c.svg"))
    assert code != 0 and "--any-prompt" in one_line_error(err)
    code, _, err = run(capsys, *args, str(tmp_path / "c.svg"), "--any-prompt")
    assert code == 0, err
    assert (tmp_path / "c.svg").read_text().startswith("<svg")
    for against, title in (("tss", "ESS / TSS"), ("ceiling", "ESS / ceiling")):
        out = tmp_path / f"u-{against}.svg"
        code, _, err = run(
            capsys, "figure", str(tmp_path / "a"), "--kind", "utilisation", "--against", against, "--out", str(out)
        )
        assert code == 0, err
        assert title in out.read_text()


# ---- the real models: only when the zoo ships them ---------------------------------------
def _zoo_models():
    try:
        from ess_explorer import zoo

        return zoo.list_models(), zoo.DEFAULT_MODEL
    except Exception:  # noqa: BLE001 (no zoo in this checkout)
        return [], None


def test_real_default_model_analyze_figure_offline(capsys, tmp_path, monkeypatch):
    names, default = _zoo_models()
    if default not in names:
        pytest.skip(f"the default zoo model {default!r} is not on disk yet")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ESS_EXPLORER_CACHE", str(tmp_path / "cache"))
    from ess_explorer import zoo

    words = " ".join(zoo.task_of(default).prompt(seed=1).split()[:5])  # in the model's vocabulary
    code, out, err = run(capsys, "analyze", "--prompt", words, "-q", "--out", str(tmp_path / "d"))
    assert code == 0, err
    result = ESSResult.load(tmp_path / "d" / "result.npz")
    assert default in str(result.meta["model_id"]) or default in str(result.meta.get("source"))
    assert result.length >= 2 and result.layers and "cache miss" in out
    code, out, err = run(capsys, "analyze", "--prompt", words, "-q")
    assert code == 0 and "cache hit" in out  # the folder-hash identity is stable across runs
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # `make run`: no prompt, nothing piped
    code, out, err = run(capsys, "report", "-q", "--out", str(tmp_path / "r.html"))
    assert code == 0, err
    assert zoo.task_of(default).prompt(seed=0) in (tmp_path / "r.html").read_text()
    code, _, err = run(capsys, "figure", str(tmp_path / "d"), "--kind", "overview", "--out", str(tmp_path / "o.pdf"))
    assert code == 0, err


def test_real_unknown_model_fails_in_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run(capsys, "analyze", "--model", "no-such-org/no-such-model-xyz", "-p", "a b", "--no-cache")
    assert code == 1 and "no-such-model-xyz" in one_line_error(err)
    code, _, err = run(capsys, "analyze", "--model", str(tmp_path), "-p", "a b", "--no-cache")
    assert code == 1 and "config.json" in one_line_error(err)


def test_a_cache_hit_on_a_zoo_model_loads_no_weights(capsys, tmp_path, monkeypatch):
    """The real pipeline: the first run computes; the second finds the entry from the model's
    files and tokenizer alone, so loading the weights would be an error."""
    monkeypatch.setenv("ESS_EXPLORER_CACHE", str(tmp_path / "cache"))
    argv = ("analyze", "--model", "zoo:mamba2_n4", "-p", "ba 07 ko 31 | ba", "-q")
    code, out, _ = run(capsys, *argv)
    assert code == 0 and "cache miss" in out

    def no_weights(*args, **kwargs):
        raise AssertionError("a cache hit must not load the model")

    monkeypatch.setattr(cli, "_load_model", no_weights)
    code, out, _ = run(capsys, *argv)
    assert code == 0 and "cache hit" in out
    code, _, err = run(capsys, *argv, "--tol", "0.01")  # another tolerance is another entry: it loads
    assert code != 0 and "must not load" in err


def test_a_cache_hit_on_a_cached_hub_model_loads_no_weights(tmp_path):
    """A hub id offline: the commit comes from the hub cache's refs, so the second run finds
    its entry with the weights file gone (loading it would fail)."""
    import os
    import shutil
    import subprocess
    import sys

    from ess_explorer import sources

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--test-org--tiny-mamba2"
    shutil.copytree(sources.model_dir("mamba2_n4"), repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_HUB_OFFLINE": "1",
        "ESS_EXPLORER_CACHE": str(tmp_path / "cache"),
    }
    argv = [sys.executable, "-m", "ess_explorer.app.cli", "analyze", "--model", "test-org/tiny-mamba2"]
    argv += ["-p", "ba 07 ko 31 | ba", "-q"]
    first = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0 and "cache miss" in first.stdout, first.stderr
    (repo / "snapshots" / commit / "model.safetensors").unlink()
    second = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert second.returncode == 0 and "cache hit" in second.stdout, second.stderr
