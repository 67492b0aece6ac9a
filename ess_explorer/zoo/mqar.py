"""Multi-query associative recall (MQAR) with readable tokens.

One segment of a sequence (K = num_pairs, Q = num_queries):

    ba 07 ko 31 mi 12 ... (K key-value pairs)  ko 31 ba 07 ... (Q queries: a stored key, then its value)

Keys are consonant-vowel syllables ("ba", "be", ... "ta"), values are two-digit strings
("00" .. "59"), so a prompt can be read and typed: given "ba 07 ko 31 mi 12 ko" a model
that recalls well answers "31". Keys are distinct within a segment (sampled without
replacement); values are drawn with replacement; each query asks a different stored key.

More queries than pairs (``num_queries > num_pairs``) ask the stored keys again: the
queried keys run through random permutations of the K keys, one after another. This keeps
the sequence length fixed while K varies (``task.with_pairs(k)``), which the difficulty
sweep uses.

The segmented variant joins ``num_segments`` independent segments with the separator
token "|": keys reset after it (the same key may come back with a new value). With
``stale_queries = s`` every segment after the first replaces s of its queries by keys of an
*earlier* segment that are absent from the current one; their answer is the token "--"
("not in this segment"). Keeping old bindings across "|" then gives wrong answers, so a
model has to drop its state at the separator (recency alone no longer answers).

``stale_answer = "earlier"`` is the matched control of that task: the same draws (same keys,
values and query slots for the same seed), but a stale query is answered with the key's
latest binding in an earlier segment, so "|" carries no reset and keeping the past is right.
Only a key never bound before (the rare fallback draw) is still answered "--".

Targets follow the transformers convention: ``labels`` has the shape of ``input_ids``,
holds the value id at every *query value* position and -100 elsewhere, and a causal LM
is scored on predicting position p from the logits at position p - 1 (the queried key).
Exact-match accuracy is the fraction of queries whose arg-max prediction is the value.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "PAD",
    "UNK",
    "SEP",
    "NONE",
    "CONSONANTS",
    "VOWELS",
    "MQARTask",
    "MQARBatch",
    "Vocabulary",
    "build_tokenizer",
    "accuracy_from_logits",
    "evaluate_model",
]

PAD, UNK, SEP, NONE = "<pad>", "<unk>", "|", "--"
CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
IGNORE = -100
STALE_ANSWERS = ("none", "earlier")


@dataclass(frozen=True)
class Vocabulary:
    """Token strings and ids: specials first (<pad>=0, <unk>=1, "|"=2), then keys, then values,
    then "--" (the answer "not in this segment")."""

    num_keys: int = 60
    num_values: int = 60

    def __post_init__(self):
        if not 1 <= self.num_keys <= len(CONSONANTS) * len(VOWELS):
            raise ValueError(
                f"num_keys must be in 1..{len(CONSONANTS) * len(VOWELS)} (one syllable each), got {self.num_keys}"
            )
        if not 1 <= self.num_values <= 100:
            raise ValueError(f"num_values must be in 1..100 (two-digit strings), got {self.num_values}")

    @property
    def keys(self) -> list[str]:
        syllables = [c + v for c in CONSONANTS for v in VOWELS]
        return syllables[: self.num_keys]

    @property
    def values(self) -> list[str]:
        return [f"{i:02d}" for i in range(self.num_values)]

    @property
    def tokens(self) -> list[str]:
        """All token strings in id order."""
        return [PAD, UNK, SEP] + self.keys + self.values + [NONE]

    @property
    def size(self) -> int:
        return 4 + self.num_keys + self.num_values

    @property
    def key_offset(self) -> int:
        return 3

    @property
    def value_offset(self) -> int:
        return 3 + self.num_keys

    @property
    def sep_id(self) -> int:
        return 2

    @property
    def none_id(self) -> int:
        """Id of "--", the answer to a query whose key is not in the current segment."""
        return 3 + self.num_keys + self.num_values

    def decode(self, ids) -> list[str]:
        """Token strings of a sequence of ids."""
        tokens = self.tokens
        return [tokens[int(i)] for i in ids]

    def encode(self, text: str) -> list[int]:
        """Ids of a whitespace-separated prompt; ValueError naming an unknown word."""
        index = {tok: i for i, tok in enumerate(self.tokens)}
        unknown = [w for w in text.split() if w not in index]
        if unknown:
            raise ValueError(
                f"unknown token(s) {unknown[:5]}: keys are syllables like {self.keys[:3]}, values two-digit strings "
                f"{self.values[:3]}..., segments are separated by '{SEP}'"
            )
        return [index[w] for w in text.split()]


@dataclass
class MQARBatch:
    """A batch of MQAR sequences.

    input_ids (B, L) int64; labels (B, L) int64 with -100 except at query value positions;
    query_positions (B, S*Q) the positions of the queried keys (the answer is at +1);
    separator_positions (S-1,) positions of "|" (the same for every row);
    stale_answers (B, L) bool, True at the answer positions of stale queries (keys of an
    earlier segment absent from the current one), whatever their answer.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    query_positions: torch.Tensor
    separator_positions: torch.Tensor
    stale_answers: torch.Tensor | None = None


@dataclass(frozen=True)
class MQARTask:
    """MQAR settings: pairs K, queries Q (default K; may exceed K), segments S, stale
    queries per later segment, vocabulary sizes.

    Sequence length = S * (2K + 2Q) + (S - 1).
    """

    num_pairs: int = 16
    num_queries: int | None = None
    num_segments: int = 1
    num_keys: int = 60
    num_values: int = 60
    stale_queries: int = 0
    separators: bool = True  # False: segments follow each other with no "|" (a stream of short recalls)
    # the answer to a stale query: "none" ("--", the reset task) or "earlier" (the key's latest earlier value)
    stale_answer: str = "none"

    def __post_init__(self):
        Vocabulary(self.num_keys, self.num_values)  # validates the sizes
        if self.num_pairs < 1 or self.num_pairs > self.num_keys:
            raise ValueError(
                f"num_pairs must be in 1..num_keys={self.num_keys} (keys are distinct), got {self.num_pairs}"
            )
        if self.num_queries is not None and self.num_queries < 1:
            raise ValueError(f"num_queries must be >= 1, got {self.num_queries}")
        if self.num_segments < 1:
            raise ValueError(f"num_segments must be >= 1, got {self.num_segments}")
        if not 0 <= self.stale_queries <= self.queries:
            raise ValueError(f"stale_queries must be in 0..num_queries={self.queries}, got {self.stale_queries}")
        if self.stale_queries and (self.num_segments < 2 or not self.separators):
            raise ValueError("stale_queries ask keys of an earlier segment: they need num_segments >= 2")
        if self.stale_answer not in STALE_ANSWERS:
            raise ValueError(
                f"stale_answer must be one of {list(STALE_ANSWERS)} ('none': stale queries are answered '--'; "
                f"'earlier': with the key's latest value in an earlier segment), got {self.stale_answer!r}"
            )
        if self.stale_queries and 2 * self.num_pairs > self.num_keys:
            raise ValueError(
                f"stale_queries need keys absent from the current segment: num_pairs must be <= num_keys / 2 = {self.num_keys // 2}"
            )

    @property
    def queries(self) -> int:
        return self.num_pairs if self.num_queries is None else self.num_queries

    @property
    def segment_length(self) -> int:
        return 2 * self.num_pairs + 2 * self.queries

    @property
    def length(self) -> int:
        return self.num_segments * self.segment_length + self._gap * (self.num_segments - 1)

    @property
    def _gap(self) -> int:
        """Tokens between segments: 1 ("|") or 0."""
        return 1 if self.separators else 0

    @property
    def vocab(self) -> Vocabulary:
        return Vocabulary(self.num_keys, self.num_values)

    def with_pairs(self, num_pairs: int) -> "MQARTask":
        """The same task with ``num_pairs`` pairs and the same segment length (queries fill the rest).

        The difficulty sweep's variants: only K changes, the sequence length stays.
        """
        queries = (self.segment_length - 2 * num_pairs) // 2
        if num_pairs < 1 or queries < 1:
            raise ValueError(
                f"num_pairs must be in 1..{self.segment_length // 2 - 1} for segments of {self.segment_length} tokens, got {num_pairs}"
            )
        return replace(self, num_pairs=num_pairs, num_queries=queries, stale_queries=min(self.stale_queries, queries))

    def separator_positions(self) -> list[int]:
        if not self.separators:
            return []
        return [(s + 1) * (self.segment_length + 1) - 1 for s in range(self.num_segments - 1)]

    def context_end(self, segment: int = 0) -> int:
        """The cut t right after the key-value pairs of a segment (first query position)."""
        return segment * (self.segment_length + self._gap) + 2 * self.num_pairs

    def to_dict(self) -> dict:
        return {**asdict(self), "num_queries": self.queries, "length": self.length, "vocab_size": self.vocab.size}

    @classmethod
    def from_dict(cls, data: dict) -> "MQARTask":
        names = [f.name for f in fields(cls)]  # a missing name keeps its default (older task dicts)
        return cls(**{k: data[k] for k in names if k in data})

    def sample(self, batch_size: int, seed: int) -> MQARBatch:
        """``batch_size`` sequences drawn with ``np.random.default_rng(seed)``: same seed, same batch."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        rng = np.random.default_rng(seed)
        vocab = self.vocab
        k, q = self.num_pairs, self.queries
        ids, labels, queries = [], [], []
        offset = 0
        earlier = np.zeros((batch_size, self.num_keys), dtype=bool)  # keys seen in earlier segments
        latest = np.full((batch_size, self.num_keys), -1, dtype=np.int64)  # latest value id bound to each key
        stale_masks = []
        for s in range(self.num_segments):
            keys = np.argsort(rng.random((batch_size, self.num_keys)), axis=1)[:, :k]  # distinct per row
            values = rng.integers(0, self.num_values, size=(batch_size, k))
            # which pairs are queried, in order: permutations of the K pairs, one after another
            rounds = -(-q // k)
            asked = np.concatenate([np.argsort(rng.random((batch_size, k)), axis=1) for _ in range(rounds)], axis=1)[
                :, :q
            ]
            key_ids = keys + vocab.key_offset
            value_ids = values + vocab.value_offset
            q_keys = np.take_along_axis(key_ids, asked, axis=1)
            q_values = np.take_along_axis(value_ids, asked, axis=1)
            stale = np.zeros(q_keys.shape, dtype=bool)
            if s > 0 and self.stale_queries:
                q_keys, q_values, stale = self._stale(rng, keys, earlier, latest, q_keys, q_values)
            present = np.zeros_like(earlier)
            np.put_along_axis(present, keys, True, axis=1)
            earlier |= present
            np.put_along_axis(latest, keys, value_ids, axis=1)
            seg = np.empty((batch_size, self.segment_length), dtype=np.int64)
            seg[:, 0 : 2 * k : 2], seg[:, 1 : 2 * k : 2] = key_ids, value_ids
            seg[:, 2 * k :: 2], seg[:, 2 * k + 1 :: 2] = q_keys, q_values
            lab = np.full_like(seg, IGNORE)
            lab[:, 2 * k + 1 :: 2] = q_values
            mask = np.zeros(seg.shape, dtype=bool)
            mask[:, 2 * k + 1 :: 2] = stale
            ids.append(seg)
            labels.append(lab)
            stale_masks.append(mask)
            queries.append(offset + 2 * k + 2 * np.arange(q))
            offset += self.segment_length
            if s < self.num_segments - 1 and self.separators:
                ids.append(np.full((batch_size, 1), vocab.sep_id, dtype=np.int64))
                labels.append(np.full((batch_size, 1), IGNORE, dtype=np.int64))
                stale_masks.append(np.zeros((batch_size, 1), dtype=bool))
                offset += 1
        query_positions = np.broadcast_to(np.concatenate(queries), (batch_size, self.num_segments * q))
        return MQARBatch(
            input_ids=torch.from_numpy(np.concatenate(ids, axis=1)),
            labels=torch.from_numpy(np.concatenate(labels, axis=1)),
            query_positions=torch.from_numpy(query_positions.copy()),
            separator_positions=torch.tensor(self.separator_positions(), dtype=torch.int64),
            stale_answers=torch.from_numpy(np.concatenate(stale_masks, axis=1)),
        )

    def _stale(self, rng, keys, earlier, latest, q_keys, q_values):
        """Replace ``stale_queries`` random query slots per row by a key of an earlier segment
        that is absent from this one (``keys`` (B, K) key indices, ``earlier`` (B, num_keys)
        bool, ``latest`` (B, num_keys) the latest value id bound to each key, -1 if never).

        The answer is "--" (stale_answer "none") or the key's latest earlier value ("earlier";
        "--" for a key never bound). The random draws do not depend on stale_answer, so both
        settings give the same inputs for the same seed. Returns new (q_keys, q_values) id
        arrays and the (B, Q) bool mask of the replaced slots."""
        vocab = self.vocab
        q_keys, q_values = q_keys.copy(), q_values.copy()
        stale = np.zeros(q_keys.shape, dtype=bool)
        present = np.zeros_like(earlier)
        np.put_along_axis(present, keys, True, axis=1)
        for row in range(q_keys.shape[0]):
            pool = np.flatnonzero(earlier[row] & ~present[row])
            if pool.size == 0:  # every earlier key came back: any absent key is still "not in this segment"
                pool = np.flatnonzero(~present[row])
            slots = rng.choice(q_keys.shape[1], size=self.stale_queries, replace=False)
            asked = rng.choice(pool, size=self.stale_queries, replace=pool.size < self.stale_queries)
            q_keys[row, slots] = asked + vocab.key_offset
            old = latest[row, asked]
            keep = self.stale_answer == "earlier"
            q_values[row, slots] = np.where(keep & (old >= 0), old, vocab.none_id)
            stale[row, slots] = True
        return q_keys, q_values, stale

    def prompt(self, seed: int = 0) -> str:
        """One readable sequence, e.g. for the explorer's text box."""
        batch = self.sample(1, seed)
        return " ".join(self.vocab.decode(batch.input_ids[0]))


def build_tokenizer(vocab: Vocabulary, max_length: int = 512):
    """A word-level fast tokenizer over the vocabulary (whitespace-separated words).

    Wrapped in ``PreTrainedTokenizerFast``; ``save_pretrained`` writes tokenizer.json and
    the folder reloads through ``AutoTokenizer`` offline.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    word_level = models.WordLevel({tok: i for i, tok in enumerate(vocab.tokens)}, unk_token=UNK)
    raw = Tokenizer(word_level)
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=raw, pad_token=PAD, unk_token=UNK, sep_token=SEP, model_max_length=max_length
    )


def accuracy_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> tuple[int, int, int, int]:
    """Exact-match counts: (correct queries, queries, fully correct sequences, sequences).

    logits (B, L, V) of a causal LM, labels (B, L) with -100 where nothing is asked: the
    prediction for position p is the arg-max of logits[:, p - 1].
    """
    predicted = logits[:, :-1].argmax(-1)
    target = labels[:, 1:]
    asked = target != IGNORE
    hit = (predicted == target) & asked
    per_seq = hit.sum(1) == asked.sum(1)
    return int(hit.sum()), int(asked.sum()), int(per_seq.sum()), int(labels.shape[0])


@torch.no_grad()
def evaluate_model(model, task: MQARTask, n_samples: int = 1024, seed: int = 10_000, batch_size: int = 256) -> dict:
    """Held-out exact-match accuracy of ``model`` (any causal LM returning ``.logits``).

    Returns dict(accuracy = correct queries / queries, sequence_accuracy, n_samples, n_queries,
    seed); a task with stale queries adds stale_accuracy (the stale queries: keys of an earlier
    segment, answered "--" or, with stale_answer "earlier", with the key's earlier value) and
    recall_accuracy (the others). Use a seed the training never drew (training seeds are
    below 10_000 by convention).
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    was_training = model.training
    model.eval()
    correct = asked = seq_ok = seqs = stale_ok = stale = 0
    try:
        for start in range(0, n_samples, batch_size):
            size = min(batch_size, n_samples - start)
            batch = task.sample(size, seed=seed + start)
            logits = model(input_ids=batch.input_ids).logits
            c, a, s, n = accuracy_from_logits(logits, batch.labels)
            correct, asked, seq_ok, seqs = correct + c, asked + a, seq_ok + s, seqs + n
            is_stale = batch.stale_answers[:, 1:]
            stale_ok += int(((logits[:, :-1].argmax(-1) == batch.labels[:, 1:]) & is_stale).sum())
            stale += int(is_stale.sum())
    finally:
        model.train(was_training)
    out = {
        "accuracy": correct / asked,
        "sequence_accuracy": seq_ok / seqs,
        "n_samples": n_samples,
        "n_queries": asked,
        "seed": seed,
    }
    if stale:
        out.update(
            stale_accuracy=stale_ok / stale, recall_accuracy=(correct - stale_ok) / (asked - stale), n_stale=stale
        )
    return out


def save_task(task: MQARTask, path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(task.to_dict(), indent=2))
    return path
