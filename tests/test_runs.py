"""One analysis run (ess_explorer/runs.py): its description and cache key, the cached run
that the CLI, the explorer's session and the sweep share, and the one tokenising step."""

from __future__ import annotations

import copy
import json

import pytest

from ess_explorer.app import session as S
from ess_explorer.io import ResultCache
from ess_explorer.prompt_tokens import tokenize
from ess_explorer.runs import AnalysisRun, RunRequest, RunSettings, RunSteps, open_run, run_cached
from ess_explorer.synthetic import reference_result
from ess_explorer.zoo import task_of

MODEL = "zoo:mamba2_n4"  # the smallest built-in model
PROMPT = " ".join(task_of("mamba2_n4").prompt(seed=0).split()[:12])  # in the model's vocabulary


class FakeTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 64 for c in (text * 48)[:48]]}


class FakeModel:
    def parameters(self):
        import torch

        yield torch.zeros(1)


def fake_steps(calls: dict, *, before_loading: bool = True) -> RunSteps:
    """Model steps that record what they are asked; the result is the synthetic reference."""

    def analyze(model, ids, tokenizer, **options):
        calls.setdefault("analyze", []).append(options)
        result = copy.deepcopy(reference_result())
        result.input_ids = list(ids)
        result.meta.update(
            tol=options["tol"], relative=options["relative"], stride=options["stride"]
        )  # as analyze records
        return result

    def load(source, revision):
        calls.setdefault("load", []).append(source)
        return FakeModel(), FakeTokenizer()

    identity = {"kind": "fake", "source": "zoo:fake"}
    return RunSteps(
        load=load,
        identity=lambda source, model, revision: identity,
        identity_without_weights=lambda source, revision: (identity, FakeTokenizer()) if before_loading else None,
        analyze=analyze,
    )


@pytest.mark.parametrize("before_loading", [True, False])
def test_a_stored_run_is_answered_without_loading_or_analysing(tmp_path, before_loading):
    """A second run of the same request is a hit: before loading when the identity and the
    tokenizer come from the files, else after loading (a hub id whose commit only the loaded
    model tells) but without analysing."""
    cache, calls = ResultCache(tmp_path), {}
    request = RunRequest("zoo:fake", prompt="ab cd", settings=RunSettings(tol=1e-2))
    result, hit, store = run_cached(request, cache=cache, steps=fake_steps(calls, before_loading=before_loading))
    assert not hit and len(calls["analyze"]) == 1 and calls["analyze"][0]["tol"] == 1e-2
    assert result.meta["source"] == "zoo:fake" and result.meta["prompt"] == "ab cd"
    assert not list(tmp_path.glob("results/*/*.npz"))  # nothing stored before store()
    store()
    again, hit, _ = run_cached(request, cache=cache, steps=fake_steps(calls, before_loading=before_loading))
    assert hit and len(calls["analyze"]) == 1 and again.input_ids == result.input_ids
    assert len(calls["load"]) == (1 if before_loading else 2)
    other = RunRequest("zoo:fake", prompt="ab cd", settings=RunSettings(tol=1e-2, gates="outside"))
    assert not run_cached(other, cache=cache, steps=fake_steps(calls))[1]  # another setting: a miss


def test_without_a_cache_the_run_loads_and_analyses_and_stores_nothing(tmp_path):
    calls = {}
    result, hit, store = run_cached(RunRequest("zoo:fake", prompt=[5, 6, 7]), steps=fake_steps(calls))
    store()
    assert not hit and calls["load"] == ["zoo:fake"] and result.input_ids == [5, 6, 7]
    assert "prompt" not in result.meta  # token ids carry no text


def test_the_cli_and_the_session_share_cache_entries(tmp_path):
    """The explorer's session and `run_cached` (the CLI, the sweep) describe the same run
    with the same key: what one stores, the other finds."""
    cache = ResultCache(tmp_path)
    computed = S.ExplorerSession(cache=cache).run(MODEL, PROMPT)
    result, hit, _ = run_cached(RunRequest(MODEL, prompt=PROMPT), cache=cache)
    assert hit and sorted(result.layers) == sorted(computed.layers)
    opened = open_run(RunRequest(MODEL, prompt=PROMPT, settings=RunSettings(tol=1e-2)), cache=cache)
    assert opened.hit is None and opened.model is not None  # another tolerance: loaded to compute
    _, hit, store = run_cached(RunRequest(MODEL, prompt=PROMPT, settings=RunSettings(tol=1e-2)), cache=cache)
    store()
    session = S.ExplorerSession(cache=cache)
    session.run(MODEL, PROMPT, tol=1e-2)
    assert not hit and session.cache_hit is True and session.forward_passes == 0


def test_the_key_digests_the_whole_description():
    run = AnalysisRun(
        {"source": "zoo:x"},
        (1, 2, 3),
        RunSettings(layers=[2, 0], scope="unit", gates="outside", precision="exact", stride=2, causal=False),
        prompt="a b",
        separators=(1,),
        revision="v2",
    )
    record = json.loads(run.cache_key().record)
    assert record["layers"] == [0, 2] and record["input_ids"] == [1, 2, 3] and record["scope"] == "unit"
    assert record["options"] == {
        "causal": False,
        "device": None,
        "gates": "outside",
        "precision": "exact",
        "revision": "v2",
        "separators": [1],
    }
    assert run.cache_key() == AnalysisRun(**{**run.__dict__}).cache_key()  # a pure function of the description


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"tol": 2.0}, "below 1"),
        ({"tol": -1.0}, "finite number >= 0"),
        ({"scope": "unit", "relative": False}, "scope"),
        ({"scope": "head"}, "scope must be one of"),
        ({"gates": "both"}, "gates must be one of"),
        ({"precision": "fast"}, "precision must be one of"),
        ({"stride": 0}, "stride must be a positive integer"),
    ],
)
def test_run_settings_refuse_bad_values_when_made(settings, message):
    with pytest.raises(ValueError, match=message):
        RunSettings(**settings)


def test_tokenize_reads_a_text_ids_or_a_conversation():
    tokenizer = FakeTokenizer()
    text, ids, separators = tokenize(tokenizer, prompt="ab")
    assert text == "ab" and ids == tokenizer("ab")["input_ids"] and separators is None
    assert tokenize(tokenizer, prompt=[3, 4]) == (None, [3, 4], None)
    with pytest.raises(ValueError, match="exactly one"):
        tokenize(tokenizer)
    with pytest.raises(ValueError, match="no tokenizer"):
        tokenize(None, prompt="ab")
    with pytest.raises(ValueError, match="chat template"):
        tokenize(tokenizer, chat=[{"role": "user", "content": "hi"}])
