"""core/memory.py: the scope that keeps freed large blocks for reuse, then settles malloc and trims."""

import threading

import pytest
import torch

from ess_explorer.core import memory


class RecordingLibc:
    """Stands in for glibc: records every mallopt and malloc_trim call."""

    def __init__(self):
        self.calls = []

    def mallopt(self, parameter, value):
        self.calls.append(("mallopt", parameter, value))
        return 1

    def malloc_trim(self, pad):
        self.calls.append(("trim", pad))
        return 1


@pytest.fixture
def libc(monkeypatch):
    fake = RecordingLibc()
    monkeypatch.setattr(memory, "_LIBC", fake)
    return fake


def settings(calls):
    return {parameter: value for kind, *rest in calls if kind == "mallopt" for parameter, value in [rest]}


def test_nested_scopes_tune_once_and_settle_at_the_outermost_exit(libc):
    with memory.reused_memory():
        assert settings(libc.calls) == memory.REUSED
        with memory.reused_memory():
            pass
        assert len(libc.calls) == len(memory.REUSED)  # the inner scope neither set nor settled
    assert settings(libc.calls[len(memory.REUSED) :]) == memory.SETTLED
    assert libc.calls[-1] == ("trim", 0)


def test_an_error_inside_still_settles_and_trims(libc):
    with pytest.raises(RuntimeError, match="boom"):
        with memory.reused_memory():
            raise RuntimeError("boom")
    assert settings(libc.calls[len(memory.REUSED) : -1]) == memory.SETTLED
    assert libc.calls[-1] == ("trim", 0)
    assert memory._depth == 0


def test_a_scope_in_another_thread_keeps_the_tuning_until_both_have_left(libc):
    inside, leave = threading.Event(), threading.Event()

    def worker():
        with memory.reused_memory():
            inside.set()
            leave.wait(5)

    thread = threading.Thread(target=worker)
    with memory.reused_memory():
        thread.start()
        assert inside.wait(5)
    assert ("trim", 0) not in libc.calls  # the worker is still inside
    leave.set()
    thread.join(5)
    assert libc.calls[-1] == ("trim", 0)


def test_a_whole_run_is_one_scope_and_a_lone_layer_its_own(libc):
    import transformers as tf

    from ess_explorer import DiagonalSSM, LayerESS, analyze

    torch.manual_seed(0)
    config = tf.MambaConfig(num_hidden_layers=3, hidden_size=16, state_size=4, vocab_size=64)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    analyze(model, [(7 * i + 3) % 64 for i in range(24)], progress=False)
    # three layers, one scope: the freed arrays of one layer serve the next, one trim at the end
    assert [call for call in libc.calls if call[0] == "trim"] == [("trim", 0)]
    libc.calls.clear()
    g = torch.Generator().manual_seed(0)
    ssm = DiagonalSSM(*(torch.rand(2, 12, 3, generator=g, dtype=torch.float64) for _ in range(3)))
    LayerESS.from_operator(0, "mamba", ssm, tol=1e-3, relative=True)
    assert settings(libc.calls[: len(memory.REUSED)]) == memory.REUSED
    assert libc.calls[-1] == ("trim", 0)
