"""BERT's family (BERT, RoBERTa, ELECTRA, RoFormer, ...) as decoders: the model types whose
causal-LM class (BertLMHeadModel, RobertaForCausalLM, ...) sets ``config.is_decoder``, so that
each token attends to itself and the tokens before it. `bert_decoder_types()` gives their
entries, which capture/registry.py adds to REGISTRY.

Each layer's self-attention sits at ``<prefix>.encoder.layer[i].attention.self`` with BERT's
layout (``query`` / ``key`` / ``value``, the output projection after the module), which the
attention adapter reads as GIT's (docs/families.md). The same types as encoders (is_decoder
False: their masked-LM checkpoints) are refused, and so are their decoders with cross-attention
(``add_cross_attention``: the decoder of an EncoderDecoderModel): `as_a_decoder`, the
``refuses`` of each entry, says why from the config before any weight is read.
"""

from __future__ import annotations

from .attention import AttentionAdapter
from .layouts import ModelType, uniform
from .refused import DECODER_OF_ENCODER_DECODER, ENCODER

__all__ = ["as_a_decoder", "bert_decoder_types"]

# model type -> the attribute of its causal-LM class that holds the base model (X-MOD is left
# out: its forward needs a language set first)
_PREFIXES = {
    **dict.fromkeys(("bert", "bert-generation", "big_bird", "megatron-bert"), "bert"),
    **dict.fromkeys(("roberta", "camembert", "xlm-roberta", "xlm-roberta-xl"), "roberta"),
    **{name: name.replace("-", "_") for name in ("roberta-prelayernorm", "data2vec-text")},
    **{name: name for name in ("electra", "ernie", "rembert", "roc_bert", "roformer")},
}


def as_a_decoder(config) -> str | None:
    """Why a model of BERT's family is refused, for what its config makes it: an encoder unless
    ``config.is_decoder``, and the decoder of an encoder-decoder where it has cross-attention.
    None for a decoder alone."""
    if not getattr(config, "is_decoder", False):
        return f"{ENCODER} A model of this type trained as a decoder (config.is_decoder = True) is supported."
    if getattr(config, "add_cross_attention", False):
        return DECODER_OF_ENCODER_DECODER
    return None


def bert_decoder_types() -> dict[str, ModelType]:
    return {
        name: ModelType(
            uniform(f"{prefix}.encoder.layer", "attention.self", "attention"),
            (AttentionAdapter.family,),
            f"{prefix}.encoder.layer[i].attention.self",
            "softmax attention, as a decoder only (config.is_decoder, without cross-attention)",
            refuses=as_a_decoder,
        )
        for name, prefix in _PREFIXES.items()
    }
