"""load_model: local folders (safetensors only), hub ids offline, zoo names."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import transformers as tf

from ess_explorer.sources import load_model


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    config = tf.LlamaConfig(
        num_hidden_layers=1,
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=len(tf.ByT5Tokenizer()),
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(folder)
    tf.ByT5Tokenizer().save_pretrained(folder)
    return folder, model


def test_local_folder_loads_float32_eval_eager_with_same_logits(saved_llama):
    folder, original = saved_llama
    model, tokenizer = load_model(str(folder))
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert model.config._attn_implementation == "eager"
    assert tokenizer is not None and tokenizer("ab")["input_ids"][:2] == [ord("a") + 3, ord("b") + 3]
    ids = torch.tensor([[5, 9, 44, 7]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, original(ids).logits)


@pytest.mark.parametrize(
    "name, class_name", [("glm5_next_text", "Glm5NextTextModel"), ("qwen2_5_vl_text", "Qwen2_5_VLTextModel")]
)
def test_a_language_model_without_a_head_or_vision_class_loads_as_its_base_model(tmp_path, name, class_name):
    """GLM-5.3-Flash's text model (glm5_next_text) and a vision-language class's language model
    saved alone (Qwen2.5-VL's) have no causal-LM or vision-language class."""
    from test_families import CONFIGS

    config = CONFIGS[name].__class__.from_dict(CONFIGS[name].to_dict())
    config.vocab_size = len(tf.ByT5Tokenizer())
    torch.manual_seed(0)
    tf.AutoModel.from_config(config).save_pretrained(tmp_path)
    tf.ByT5Tokenizer().save_pretrained(tmp_path)
    model, _tokenizer = load_model(str(tmp_path))
    assert type(model).__name__ == class_name


def test_folder_with_only_pickle_weights_is_refused(saved_llama, tmp_path):
    folder, _ = saved_llama
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ValueError, match=r"pytorch_model.bin \(pickle\).*safetensors only"):
        load_model(str(tmp_path))


def test_folder_without_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        load_model(str(tmp_path))


def test_unreachable_hub_id_fails_fast_with_advice(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match=r"HF_HUB_OFFLINE.*network.*local model folder or zoo:NAME"):
        load_model("ess-explorer-tests/no-such-model")


def test_unknown_zoo_name_lists_what_exists():
    with pytest.raises(ValueError, match="no zoo model"):
        load_model("zoo:no_such_model")


def test_fixed_arguments_cannot_be_overridden(saved_llama):
    with pytest.raises(ValueError, match="use_safetensors"):
        load_model(str(saved_llama[0]), use_safetensors=False)


def test_zoo_model_loads_when_present():
    from ess_explorer import zoo

    names = zoo.list_models()
    if not names:
        pytest.skip("no zoo models on disk yet")
    model, tokenizer = load_model(f"zoo:{names[0]}")
    assert not model.training and next(model.parameters()).dtype == torch.float32
    from ess_explorer import analyze

    result = analyze(model, input_ids=[3, 4, 5, 6], progress=False)
    assert result.meta["model_id"] == f"zoo:{names[0]}"  # not a path on this machine
