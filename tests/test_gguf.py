"""GGUF files as a model source: a .gguf file (or a folder holding one) loads through
transformers' GGUF reader, analyses from the API, the CLI and the explorer, records its file
and quantisation, and is dequantised once (the next load reads the cached safetensors)."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from _gguf import write_tiny_gguf

from ess_explorer import analyze, sources
from ess_explorer.app import cli
from ess_explorer.app.session import ExplorerSession
from ess_explorer.io import read_result

PROMPT = "the the cat sat on the mat | the cat"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ESS_EXPLORER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def gguf_file(tmp_path):
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    return write_tiny_gguf(tmp_path / "model" / "tiny.gguf")


def test_a_gguf_file_loads_as_transformers_reads_it_and_dequantises_once(gguf_file, cache, monkeypatch):
    from transformers import AutoModelForCausalLM

    model, tokenizer = sources.load_model(gguf_file)
    reference = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    expected = reference.state_dict()

    def same_weights(loaded):
        weights = loaded.state_dict()
        assert weights.keys() == expected.keys()
        for name, value in expected.items():
            torch.testing.assert_close(weights[name], value, rtol=0, atol=0, msg=name)

    same_weights(model)
    assert model.config._attn_implementation == "eager" and tokenizer.chat_template
    assert list((cache / "gguf").glob("*/model.safetensors")), "the dequantised weights are kept"

    calls = []
    real = AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        calls.append(kwargs.get("gguf_file"))
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    again, _ = sources.load_model(gguf_file.parent)  # the folder that holds the file: the same source
    assert calls == [None], "the second load reads the cached safetensors, not the GGUF file"
    same_weights(again)


def test_the_result_records_the_file_and_its_quantisation(gguf_file, cache, tmp_path):
    model, tokenizer = sources.load_model(gguf_file)
    result = analyze(model, prompt=PROMPT, tokenizer=tokenizer, progress=False)
    assert result.meta["model_id"] == str(gguf_file.resolve()) and sorted(result.layers) == [0, 1]
    gguf = result.meta["gguf"]
    assert gguf["file"] == "tiny.gguf" and gguf["file_type"] == "MOSTLY_Q8_0" and gguf["architecture"] == "llama"
    assert gguf["tensor_types"] == {"F32": 5, "Q8_0": 16}  # norms stay float, the 16 matrices are Q8_0
    assert result.layer(0).n_units == 4 and result.layer(0).family == "softmax_attention"
    # another file, even of the same shape, is another model for the cache
    other = write_tiny_gguf(tmp_path / "other" / "tiny.gguf", seed=1)
    assert sources.model_identity(other) != sources.model_identity(gguf_file)
    assert sources.model_identity(gguf_file) == sources.model_identity(gguf_file.parent)


def test_a_folder_with_a_config_beside_the_gguf_file_loads_the_file(gguf_file, cache):
    (gguf_file.parent / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert sources.parse_source(gguf_file.parent) == ("gguf", str(gguf_file))
    (gguf_file.parent / "second.gguf").write_bytes(gguf_file.read_bytes())
    with pytest.raises(ValueError, match="several GGUF files.*second.gguf.*tiny.gguf"):
        sources.load_model(gguf_file.parent)


def test_the_cli_analyses_a_gguf_file_and_the_second_run_is_a_cache_hit(gguf_file, cache, tmp_path, capsys):
    argv = ["analyze", "--model", str(gguf_file), "-p", PROMPT, "-q", "--out", str(tmp_path / "run")]
    assert cli.main(argv) == 0, capsys.readouterr().err
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())["meta"]
    assert meta["gguf"]["file_type"] == "MOSTLY_Q8_0"
    capsys.readouterr()
    assert cli.main(argv) == 0
    assert "cache hit" in capsys.readouterr().out


def test_the_cli_analyses_a_chat_with_the_files_template(gguf_file, cache, tmp_path, capsys):
    chat = tmp_path / "chat.json"
    messages = [{"role": "user", "content": "the cat?"}, {"role": "assistant", "content": "the mat"}]
    chat.write_text(json.dumps({"messages": messages}))
    out = tmp_path / "chat-run"
    code = cli.main(["analyze", "--model", str(gguf_file), "--chat", str(chat), "-q", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    meta = json.loads((out / "meta.json").read_text())["meta"]
    assert meta["chat"] == messages and meta["prompt"].startswith("<|im_start|>user\nthe cat?<|im_end|>")
    result = read_result(out)
    assert [result.tokens[t] for t in meta["separators"]] == ["<|im_end|>", "<|im_end|>"]
    code = cli.main(["analyze", "--model", str(gguf_file), "--chat", str(chat), "-p", "x", "-q"])
    assert code == 2 and "not both" in capsys.readouterr().err


def test_the_explorer_session_analyses_a_gguf_file(gguf_file, cache):
    result = ExplorerSession().run(str(gguf_file), PROMPT)
    assert result.meta["gguf"]["file"] == "tiny.gguf" and result.meta["exact_layers"] == [0, 1]


def test_a_sweep_takes_the_gguf_file_as_a_source(gguf_file, cache, tmp_path):
    import ess_explorer

    prompts = [PROMPT, "the mat | the cat sat"]
    done = ess_explorer.run_sweep([str(gguf_file)], prompts, out=tmp_path / "sweep", progress=False)
    table = done.table()
    model, tokenizer = sources.load_model(gguf_file)
    reference = analyze(model, prompt=prompts[1], tokenizer=tokenizer, progress=False).to_frame()
    mine = table[table.prompt_id == 1].reset_index(drop=True)
    assert set(table.model) == {str(gguf_file)} and len(mine) == len(reference)
    assert (mine.tolerance_ess.to_numpy() == reference.tolerance_ess.to_numpy()).all()


def test_without_the_gguf_package_the_message_says_what_to_install(tmp_path, cache, monkeypatch):
    file = tmp_path / "m.gguf"
    file.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf raises ImportError
    with pytest.raises(ValueError, match=r"pip install 'ess-explorer\[gguf\]'"):
        sources.load_model(file)


def test_a_missing_gguf_file_is_named(tmp_path, cache):
    with pytest.raises(ValueError, match="absent.gguf is not a file"):
        sources.load_model(tmp_path / "absent.gguf")
