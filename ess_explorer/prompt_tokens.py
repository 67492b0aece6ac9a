"""From what a user gives `analyze` to token ids: a prompt, a conversation or ids, checked.

Every check happens here, before the forward pass: one prompt (batch 1) of at least two
integer ids inside the embedding and the model's context, a prompt the tokenizer knows,
a conversation formatted by the tokenizer's own chat template (its turn ends are the
separators), separators inside the prompt.
"""

from __future__ import annotations

import torch

from .capture.registry import language_model_config

__all__ = [
    "chat_tokens",
    "prompt_ids",
    "tokenize",
    "check_separators",
    "input_ids_of",
    "check_unknown",
    "display_tokens",
]


def chat_tokens(tokenizer, chat) -> tuple[str, list[int], list[int]]:
    """(text, token ids, turn ends) of a conversation formatted by the tokenizer's chat template.

    chat: [{"role": str, "content": str}, ...]. The ids are the text's tokens with no special
    tokens added (the template writes its own), as for a prompt. A turn ends at the last special
    token of its span (ChatML's <|im_end|>, Llama 3's <|eot_id|>), else at its last token: each
    turn's span is found by formatting the conversation up to it, which must give a prefix of
    the whole (it does for the common templates; where it does not, no turn ends are given and
    the views fall back to their separator tokens).
    """
    if tokenizer is None:
        raise ValueError("chat= needs tokenizer= (load_model returns one)")
    if (
        not isinstance(chat, (list, tuple))
        or not chat
        or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in chat
        )
    ):
        raise ValueError('chat must be a non-empty list of {"role": str, "content": str} messages')
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat template; format the conversation yourself and pass prompt=")

    def render(messages) -> tuple[str, list[int]]:
        text = tokenizer.apply_chat_template(list(messages), tokenize=False)
        return text, prompt_ids(tokenizer, text)

    text, ids = render(chat)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special |= {i for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items() if token.special}
    ends, start = [], 0
    for k in range(1, len(chat) + 1):
        _, part = render(chat[:k])
        if ids[: len(part)] != part or len(part) <= start:
            return text, ids, []
        span = range(start, len(part))
        marks = [t for t in span if ids[t] in special]
        ends.append(marks[-1] if marks else span[-1])
        start = len(part)
    return text, ids, ends


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The token ids of a prompt text: the tokenizer's, with no special tokens added (ESS is
    about the text given, not a BOS the model card may add), checked for unknown words."""
    if tokenizer is None:
        raise ValueError("this model ships no tokenizer; ess-explorer needs one to read a prompt (or pass input_ids)")
    ids = [int(i) for i in tokenizer(prompt, add_special_tokens=False)["input_ids"]]
    if not ids and prompt.strip():
        raise ValueError(
            f"the tokenizer ({type(tokenizer).__name__}) turned a {len(prompt)}-character prompt into no "
            "tokens: its vocabulary files are missing or are not this model's; load the tokenizer the "
            "model was trained with (a model folder needs its tokenizer files), or pass input_ids"
        )
    check_unknown(ids, tokenizer)
    return ids


def tokenize(tokenizer, *, prompt=None, chat=None) -> tuple[str | None, list[int], list[int] | None]:
    """(text, token ids, separators) of what a user gives: a prompt text (`prompt_ids`), a list
    of token ids (``prompt`` itself, no text), or a conversation (`chat_tokens`: the formatted
    text, its ids and its turn ends). The one tokenising step of every entry point."""
    if (prompt is None) == (chat is None):
        raise ValueError("give exactly one of a prompt or a chat")
    if chat is not None:
        return chat_tokens(tokenizer, chat)
    if isinstance(prompt, str):
        return prompt, prompt_ids(tokenizer, prompt), None
    return None, [int(i) for i in prompt], None


def check_separators(separators, length: int) -> list[int] | None:
    if separators is None:
        return None
    try:
        positions = sorted({int(t) for t in separators})
    except (TypeError, ValueError):
        raise ValueError(f"separators must be token positions (integers), got {separators!r}") from None
    if positions and not 0 <= positions[0] <= positions[-1] < length:
        raise ValueError(f"separators must lie in [0, {length - 1}], got {positions}")
    return positions


def input_ids_of(model, input_ids, prompt, tokenizer) -> list[int]:
    if not isinstance(model, torch.nn.Module):
        raise ValueError(
            f"analyze takes a loaded model, got {type(model).__name__} {model!r:.40}; load it first: "
            "model, tokenizer = ess_explorer.load_model(source)"
        )
    if isinstance(input_ids, str):  # text in the place of the ids: the prompt, where a tokenizer can read it
        if tokenizer is None:
            raise ValueError(
                "input_ids is text: pass the prompt with its tokenizer, analyze(model, prompt=text, "
                "tokenizer=tokenizer) (load_model returns both), or pass token ids"
            )
        if prompt is not None:
            raise ValueError("pass the prompt once: as text in the place of input_ids or as prompt=, not both")
        input_ids, prompt = None, input_ids
    if (input_ids is None) == (prompt is None):
        raise ValueError("pass exactly one of input_ids or prompt= (with tokenizer=)")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
        if tokenizer is None:
            raise ValueError("prompt= needs tokenizer= (load_model returns one), or pass input_ids")
        if not prompt:
            raise ValueError("the prompt is empty: ESS needs at least 2 tokens")
        input_ids = prompt_ids(tokenizer, prompt)
    try:
        ids = torch.as_tensor(input_ids)
    except (TypeError, ValueError, RuntimeError, OverflowError) as error:
        raise ValueError(
            f"input_ids must be one flat list (or a tensor) of integer token ids, not ragged nor beyond int64; "
            f"the {type(input_ids).__name__} given is not ({str(error).splitlines()[0] if str(error) else error!r})"
        ) from None
    if ids.ndim == 2:
        if ids.shape[0] != 1:
            raise ValueError(f"analyze takes one prompt (batch 1); got input_ids of shape {tuple(ids.shape)}")
        ids = ids[0]
    if ids.ndim != 1:
        raise ValueError(f"input_ids must be 1-D (L,) or (1, L); got shape {tuple(ids.shape)}")
    if ids.numel() and (ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool):
        raise ValueError(f"input_ids must be integers, got {ids.dtype}")
    length = ids.numel()
    if length < 2:
        raise ValueError(f"the prompt has {length} token(s); ESS needs at least 2 (a past and a future)")
    vocab = model.get_input_embeddings().num_embeddings
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab:
        raise ValueError(f"token ids must lie in [0, {vocab - 1}] (the embedding size); got min {low}, max {high}")
    context, read = _context(language_model_config(model.config))
    if context is not None and length > context:
        raise ValueError(
            f"the prompt has {length} tokens, more than the model's context of {context} ({read}); shorten it"
        )
    return [int(i) for i in ids.tolist()]


# Model types whose position ids start at pad_token_id + 1 (RoBERTa's lineage: transformers'
# create_position_ids_from_input_ids), so their position table holds that many fewer positions.
_POSITIONS_AFTER_PADDING = (
    "roberta",
    "camembert",
    "xlm-roberta",
    "xlm-roberta-xl",
    "roberta-prelayernorm",
    "data2vec-text",
)


def _context(config) -> tuple[int | None, str]:
    """The longest prompt the model's position table holds (None: the config does not say),
    and where that number comes from."""
    context = getattr(config, "max_position_embeddings", None)
    if not isinstance(context, int):
        return None, ""
    if config.model_type not in _POSITIONS_AFTER_PADDING:
        return context, "config.max_position_embeddings"
    skipped = (config.pad_token_id or 0) + 1
    return context - skipped, (
        f"config.max_position_embeddings less the {skipped} position ids before pad_token_id + 1, where its "
        "numbering starts"
    )


def check_unknown(input_ids, tokenizer) -> None:
    """A prompt the tokenizer does not know: all <unk> is refused (there is nothing to analyse),
    some <unk> is a warning (those words are one and the same token to the model)."""
    import warnings

    unk = getattr(tokenizer, "unk_token_id", None)
    ids = list(input_ids) if isinstance(input_ids, (list, tuple)) else []
    unknown = sum(1 for i in ids if unk is not None and i == unk)
    if ids and unknown == len(ids):
        raise ValueError(
            f"every token of the prompt is unknown to the tokenizer ({len(ids)} x <unk>); write it in the model's "
            "vocabulary (a zoo model knows only its task's symbols: see its example prompt)"
        )
    if unknown:
        warnings.warn(
            f"{unknown} of {len(ids)} tokens of the prompt are unknown to the tokenizer (<unk>): the model sees "
            "them as one and the same token",
            stacklevel=4,
        )


def display_tokens(ids: list[int], tokenizer) -> list[str]:
    """Display strings, one per token (the decoded text of each id; the id without a tokenizer)."""
    if tokenizer is None:
        return [str(i) for i in ids]
    return [tokenizer.decode([i]) for i in ids]
