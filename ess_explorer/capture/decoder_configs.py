"""Model types analysed only where their config makes them decoders: BERT's family (BERT,
RoBERTa, ELECTRA, RoFormer, ...) with ``config.is_decoder``, as their causal-LM classes
(BertLMHeadModel, RobertaForCausalLM, ...) are built, and XLM with ``config.causal``, as its
causal checkpoints are. Each token then attends to itself and the tokens before it. Their
masked-LM checkpoints are encoders and refused, from the config before any weight is read, by
each entry's ``refuses``. `decoder_config_types()` gives the entries, which capture/registry.py
adds to REGISTRY.

- BERT's family: each layer's self-attention at ``<prefix>.encoder.layer[i].attention.self``
  with BERT's layout (``query`` / ``key`` / ``value``, the output projection after the
  module), which the attention adapter reads as GIT's (docs/families.md). A decoder with
  cross-attention (``add_cross_attention``: the decoder of an EncoderDecoderModel) is refused
  too (`as_a_decoder`).
- XLM: its attention modules are the list ``transformer.attentions`` (``q_lin`` / ``k_lin`` /
  ``v_lin`` / ``out_lin``). A multilingual one (``use_lang_emb`` with ``n_langs`` > 1, as the
  causal checkpoints xlm-clm-enfr-1024 and xlm-clm-ende-1024 are) adds a language embedding to
  each token from ``langs``, which a text prompt does not give, and is refused
  (`xlm_as_a_decoder`).
"""

from __future__ import annotations

from .attention import AttentionAdapter
from .layouts import ModelType, uniform
from .refused import DECODER_OF_ENCODER_DECODER, ENCODER

__all__ = ["as_a_decoder", "decoder_config_types", "xlm_as_a_decoder"]

# BERT's family: model type -> the attribute of its causal-LM class that holds the base model
# (X-MOD is left out: its forward needs a language set first)
_BERT_PREFIXES = {
    **dict.fromkeys(("bert", "bert-generation", "big_bird", "megatron-bert"), "bert"),
    **dict.fromkeys(("roberta", "camembert", "xlm-roberta", "xlm-roberta-xl"), "roberta"),
    **{name: name.replace("-", "_") for name in ("roberta-prelayernorm", "data2vec-text")},
    **{name: name for name in ("electra", "ernie", "rembert", "roc_bert", "roformer")},
}
_AS_A_DECODER = "A model of this type trained as a decoder ({setting}) is supported."


def as_a_decoder(config) -> str | None:
    """Why a model of BERT's family is refused, for what its config makes it: an encoder unless
    ``config.is_decoder``, and the decoder of an encoder-decoder where it has cross-attention.
    None for a decoder alone."""
    if not getattr(config, "is_decoder", False):
        return f"{ENCODER} {_AS_A_DECODER.format(setting='config.is_decoder = True')}"
    if getattr(config, "add_cross_attention", False):
        return DECODER_OF_ENCODER_DECODER
    return None


def xlm_as_a_decoder(config) -> str | None:
    """Why an XLM model is refused, for what its config makes it: an encoder unless
    ``config.causal``; a multilingual one for the language embedding it needs. None for a
    causal XLM of one language."""
    if not getattr(config, "causal", False):
        return f"{ENCODER} {_AS_A_DECODER.format(setting='config.causal = True')}"
    if getattr(config, "use_lang_emb", True) and getattr(config, "n_langs", 1) > 1:
        return (
            f"it is multilingual ({config.n_langs} languages): its forward adds a language embedding to each "
            "token from `langs`, which a text prompt does not give, and run without it, it would not be the "
            "model it was trained as"
        )
    return None


def decoder_config_types() -> dict[str, ModelType]:
    note = "softmax attention, as a decoder only ({})"
    return {
        **{
            name: ModelType(
                uniform(f"{prefix}.encoder.layer", "attention.self", "attention"),
                (AttentionAdapter.family,),
                f"{prefix}.encoder.layer[i].attention.self",
                note.format("config.is_decoder, without cross-attention"),
                refuses=as_a_decoder,
            )
            for name, prefix in _BERT_PREFIXES.items()
        },
        "xlm": ModelType(
            uniform("transformer.attentions", "", "attention"),
            (AttentionAdapter.family,),
            "transformer.attentions[i]",
            note.format("config.causal, one language"),
            refuses=xlm_as_a_decoder,
        ),
    }
