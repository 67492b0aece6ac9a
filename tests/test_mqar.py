"""The MQAR task: generator properties, readable tokens, accuracy."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import AutoTokenizer

from ess_explorer.zoo.mqar import NONE, SEP, MQARTask, Vocabulary, accuracy_from_logits, build_tokenizer


def _segments(task: MQARTask, row: torch.Tensor) -> list[list[str]]:
    words = task.vocab.decode(row)
    out, current = [], []
    for w in words:
        if w == SEP:
            out.append(current)
            current = []
        else:
            current.append(w)
    return out + [current]


@pytest.mark.parametrize("task", [MQARTask(num_pairs=8), MQARTask(num_pairs=5, num_queries=3, num_segments=3)])
def test_keys_unique_within_a_segment_and_answers_correct(task):
    batch = task.sample(32, seed=7)
    assert batch.input_ids.shape == (32, task.length)
    keys, values = set(task.vocab.keys), set(task.vocab.values)
    for b in range(32):
        segs = _segments(task, batch.input_ids[b])
        assert len(segs) == task.num_segments
        for seg in segs:
            pairs, queries = seg[: 2 * task.num_pairs], seg[2 * task.num_pairs :]
            stored = dict(zip(pairs[0::2], pairs[1::2]))
            assert len(stored) == task.num_pairs  # distinct keys
            assert set(stored) <= keys and set(stored.values()) <= values
            asked = queries[0::2]
            assert len(asked) == task.queries and len(set(asked)) == task.queries
            for key, answer in zip(queries[0::2], queries[1::2]):
                assert stored[key] == answer  # the queried value is the one stored under that key


def test_labels_mark_exactly_the_query_answers():
    task = MQARTask(num_pairs=6, num_segments=2)
    batch = task.sample(4, seed=1)
    asked = batch.labels != -100
    assert int(asked.sum()) == 4 * task.num_segments * task.queries
    assert torch.equal(batch.labels[asked], batch.input_ids[asked])
    answer_positions = batch.query_positions + 1
    assert asked.gather(1, answer_positions).all()
    seps = batch.separator_positions.tolist()
    assert seps == [2 * 6 + 2 * 6] and (batch.input_ids[:, seps[0]] == task.vocab.sep_id).all()
    assert task.context_end(1) == seps[0] + 1 + 12


def test_seeds_are_reproducible_and_distinct():
    task = MQARTask(num_pairs=8)
    a, b, c = task.sample(16, seed=3), task.sample(16, seed=3), task.sample(16, seed=4)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.input_ids, c.input_ids)
    # training batches use two-word seeds; they never coincide with an integer (held-out) seed
    assert not torch.equal(task.sample(16, seed=[0, 3]).input_ids, a.input_ids)


def test_tokens_are_readable_and_round_trip_through_the_tokenizer(tmp_path):
    task = MQARTask(num_pairs=4, num_segments=2)
    prompt = task.prompt(seed=5)
    words = prompt.split()
    assert all(len(w) <= 2 for w in words)  # syllables, two-digit values, "|"
    assert SEP in words
    tok = build_tokenizer(task.vocab)
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    ids = loaded(prompt)["input_ids"]
    assert ids == task.sample(1, seed=5).input_ids[0].tolist()
    assert loaded.decode(ids) == prompt
    assert len(loaded) == task.vocab.size
    assert loaded.convert_ids_to_tokens(task.vocab.encode("ba 07 |")) == ["ba", "07", "|"]


def test_vocabulary_encode_rejects_unknown_words():
    with pytest.raises(ValueError, match="unknown token"):
        Vocabulary().encode("ba 07 hello")


def test_bad_settings_are_value_errors():
    with pytest.raises(ValueError, match="num_pairs"):
        MQARTask(num_pairs=61)
    with pytest.raises(ValueError, match="num_queries"):
        MQARTask(num_pairs=4, num_queries=0)
    with pytest.raises(ValueError, match="num_keys"):
        MQARTask(num_keys=100)


def test_accuracy_counts_exact_matches():
    task = MQARTask(num_pairs=4)
    batch = task.sample(3, seed=0)
    vocab_size = task.vocab.size
    # a perfect "oracle" puts all mass on the next token
    logits = torch.nn.functional.one_hot(batch.input_ids.roll(-1, dims=1), vocab_size).float()
    assert accuracy_from_logits(logits, batch.labels) == (12, 12, 3, 3)
    # break one answer of the first sequence
    pos = int(batch.query_positions[0, 0])
    logits[0, pos] = torch.roll(logits[0, pos], 1)
    assert accuracy_from_logits(logits, batch.labels) == (11, 12, 2, 3)


def test_more_queries_than_pairs_ask_every_key_before_any_again():
    task = MQARTask(num_pairs=3, num_queries=7)
    batch = task.sample(8, seed=2)
    for row in batch.input_ids:
        words = task.vocab.decode(row)
        stored = dict(zip(words[0:6:2], words[1:6:2]))
        asked = words[6::2]
        assert len(asked) == 7 and set(asked[:3]) == set(stored) and set(asked[3:6]) == set(stored)
        assert all(stored[k] == v for k, v in zip(words[6::2], words[7::2]))


def test_with_pairs_keeps_the_length_and_fills_with_queries():
    task = MQARTask(num_pairs=16, num_queries=48)
    for k in (2, 4, 8, 16, 32):
        variant = task.with_pairs(k)
        assert variant.length == 128 and variant.num_pairs == k and variant.queries == 64 - k
        assert variant.context_end(0) == 2 * k
    with pytest.raises(ValueError, match="num_pairs"):
        task.with_pairs(64)  # no room for a query


def test_stale_queries_ask_an_earlier_segments_absent_key_and_expect_none():
    task = MQARTask(num_pairs=8, num_segments=4, stale_queries=3)
    batch = task.sample(16, seed=4)
    n_stale = 0
    for b in range(16):
        segs = _segments(task, batch.input_ids[b])
        seen: set[str] = set()
        for s, seg in enumerate(segs):
            pairs, queries = seg[:16], seg[16:]
            stored = dict(zip(pairs[0::2], pairs[1::2]))
            answers = list(zip(queries[0::2], queries[1::2]))
            stale = [(k, v) for k, v in answers if v == NONE]
            assert len(stale) == (0 if s == 0 else 3)
            for key, _ in stale:  # absent now, present in an earlier segment
                assert key not in stored and key in seen
            for key, value in answers:
                if value != NONE:
                    assert stored[key] == value
            seen |= set(stored)
            n_stale += len(stale)
    assert n_stale == 16 * 3 * 3
    labels = batch.labels[batch.labels != -100]
    assert int((labels == task.vocab.none_id).sum()) == n_stale


def test_stale_queries_need_separators_and_room():
    with pytest.raises(ValueError, match="stale_queries"):
        MQARTask(num_pairs=4, stale_queries=1)  # one segment: nothing earlier to ask
    with pytest.raises(ValueError, match="stale_queries"):
        MQARTask(num_pairs=4, num_segments=2, stale_queries=5)
    with pytest.raises(ValueError, match="stale_queries"):
        MQARTask(num_pairs=4, num_segments=2, stale_queries=1, separators=False)


def test_segments_without_separators_follow_each_other():
    task = MQARTask(num_pairs=3, num_queries=2, num_segments=13, num_keys=6, separators=False)
    batch = task.sample(4, seed=0)
    assert task.length == 130 == batch.input_ids.shape[1]
    assert task.separator_positions() == [] and not (batch.input_ids == task.vocab.sep_id).any()
    assert task.context_end(1) == 10 + 6
    assert MQARTask.from_dict(task.to_dict()) == task


def test_evaluate_splits_stale_and_recall_accuracy():
    from ess_explorer.zoo.mqar import evaluate_model

    task = MQARTask(num_pairs=4, num_segments=3, stale_queries=2)

    class AlwaysNone(torch.nn.Module):  # answers "--" to everything
        def forward(self, input_ids):
            logits = torch.zeros(*input_ids.shape, task.vocab.size)
            logits[..., task.vocab.none_id] = 1.0
            return type("Out", (), {"logits": logits})()

    got = evaluate_model(AlwaysNone(), task, n_samples=8)
    assert got["stale_accuracy"] == 1.0 and got["recall_accuracy"] == 0.0
    assert got["n_stale"] == 8 * 2 * 2 and got["accuracy"] == got["n_stale"] / got["n_queries"]


def test_the_keep_control_draws_the_same_prompts_and_answers_stale_queries_with_the_earlier_value():
    """stale_answer="earlier" changes only the answers of stale queries: same seed, same keys,
    values and query slots; a stale query's answer is its key's latest value in an earlier
    segment ("--" only for a key never bound before)."""
    reset = MQARTask(num_pairs=4, num_segments=4, num_keys=10, stale_queries=2)
    keep = MQARTask(num_pairs=4, num_segments=4, num_keys=10, stale_queries=2, stale_answer="earlier")
    a, b = reset.sample(32, seed=[3, 1]), keep.sample(32, seed=[3, 1])
    stale = a.stale_answers
    assert torch.equal(stale, b.stale_answers) and int(stale.sum()) == 32 * 3 * 2
    assert torch.equal(a.input_ids[~stale], b.input_ids[~stale])
    assert torch.equal(a.labels[~stale], b.labels[~stale])
    assert (a.labels[stale] == reset.vocab.none_id).all()
    assert torch.equal(a.labels != b.labels, stale & (b.labels != keep.vocab.none_id))
    n_old = 0
    for row_ids in b.input_ids:
        latest = {}
        for seg in _segments(keep, row_ids):
            pairs = dict(zip(seg[0 : 2 * 4 : 2], seg[1 : 2 * 4 : 2]))
            for key, value in zip(seg[2 * 4 :: 2], seg[2 * 4 + 1 :: 2]):
                if key in pairs:
                    assert value == pairs[key]
                else:  # a stale query: the key's latest earlier binding, or "--" if it never had one
                    assert value == latest.get(key, NONE)
                    n_old += key in latest
            latest.update(pairs)
    assert n_old > 0.9 * 32 * 3 * 2  # the fallback to never-bound keys is rare


def test_stale_answer_is_validated_and_old_task_dicts_still_load():
    with pytest.raises(ValueError, match="stale_answer must be one of"):
        MQARTask(num_pairs=4, num_segments=2, stale_queries=1, stale_answer="latest")
    keep = MQARTask(num_pairs=4, num_segments=2, stale_queries=1, stale_answer="earlier")
    assert MQARTask.from_dict(keep.to_dict()).stale_answer == "earlier"
    old = {k: v for k, v in keep.to_dict().items() if k != "stale_answer"}  # written before the field existed
    assert MQARTask.from_dict(old).stale_answer == "none"


def test_the_keep_controls_stale_accuracy_scores_the_earlier_value():
    from ess_explorer.zoo.mqar import evaluate_model

    task = MQARTask(num_pairs=4, num_segments=3, stale_queries=2, stale_answer="earlier")

    class Oracle(torch.nn.Module):  # reads the answer off the next input token: right everywhere
        def forward(self, input_ids):
            logits = torch.zeros(*input_ids.shape, task.vocab.size)
            logits[:, :-1].scatter_(-1, input_ids[:, 1:, None], 1.0)
            return type("Out", (), {"logits": logits})()

    got = evaluate_model(Oracle(), task, n_samples=8)
    assert got["stale_accuracy"] == 1.0 and got["recall_accuracy"] == 1.0 and got["n_stale"] == 8 * 2 * 2
