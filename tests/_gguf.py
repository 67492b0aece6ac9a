"""A tiny Llama GGUF file written here (gguf.GGUFWriter), the form in which people keep models
on their own machines: 2 layers, 4 query heads on 2 key-value heads, a byte-level BPE
tokenizer with ChatML turn tokens and a chat template, weights quantised to Q8_0 (norms F32)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_tokens() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return list(bytes_to_unicode().values())


def write_tiny_gguf(path, *, seed: int = 0, quantised: bool = True) -> Path:
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tokens = _byte_tokens() + ["Ġt", "he", "Ġthe"] + SPECIALS
    merges = ["Ġ t", "h e", "Ġt he"]
    types = [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS)) + [gguf.TokenType.CONTROL] * len(SPECIALS)
    vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama-test")
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quantised else gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_chat_template(CHAT_TEMPLATE)

    def add(name, shape, norm=False):
        data = (np.ones(shape) if norm else rng.normal(0, 0.08, shape)).astype(np.float32)
        if quantised and not norm:
            kind = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, data)

    head_dim = HIDDEN // HEADS
    add("token_embd.weight", (vocab, HIDDEN))
    for i in range(LAYERS):
        add(f"blk.{i}.attn_norm.weight", (HIDDEN,), norm=True)
        add(f"blk.{i}.attn_q.weight", (HEADS * head_dim, HIDDEN))
        add(f"blk.{i}.attn_k.weight", (KV_HEADS * head_dim, HIDDEN))
        add(f"blk.{i}.attn_v.weight", (KV_HEADS * head_dim, HIDDEN))
        add(f"blk.{i}.attn_output.weight", (HIDDEN, HEADS * head_dim))
        add(f"blk.{i}.ffn_norm.weight", (HIDDEN,), norm=True)
        add(f"blk.{i}.ffn_gate.weight", (FFN, HIDDEN))
        add(f"blk.{i}.ffn_up.weight", (FFN, HIDDEN))
        add(f"blk.{i}.ffn_down.weight", (HIDDEN, FFN))
    add("output_norm.weight", (HIDDEN,), norm=True)
    add("output.weight", (vocab, HIDDEN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
