"""The engine's worker pool (core/workers.py): kept across calls, safe to nest, stops on errors."""

import multiprocessing
import threading
import time

import pytest

from ess_explorer.core import workers
from ess_explorer.core.workers import in_threads


def test_the_same_threads_serve_every_call():
    seen = []
    for _ in range(3):
        in_threads(lambda item: seen.append(threading.get_ident()), range(8), 2)
    assert len(seen) == 24
    assert threading.get_ident() not in seen  # run in the pool, not in the caller
    assert len(set(seen)) <= 2  # three calls, at most two threads between them


def test_one_worker_or_one_item_runs_in_the_callers_thread():
    for count, items in ((1, range(5)), (2, [0])):
        seen = []
        in_threads(lambda item: seen.append(threading.get_ident()), items, count)
        assert set(seen) == {threading.get_ident()}


def test_a_call_from_a_pool_thread_runs_its_items_there():
    """Both pool threads waiting on inner items they would have to run themselves would wait
    forever; the inner calls run in the thread that makes them."""
    inner = []

    def outer(item):
        me = threading.get_ident()
        in_threads(lambda sub: inner.append((me, threading.get_ident())), range(4), 2)

    done = threading.Event()
    caller = threading.Thread(target=lambda: (in_threads(outer, range(2), 2), done.set()), daemon=True)
    caller.start()
    assert done.wait(60), "nested calls on the shared pool did not finish"
    assert len(inner) == 8 and all(outer_id == inner_id for outer_id, inner_id in inner)


def test_an_error_drops_the_items_not_begun_and_sets_stop():
    begun, stop = [], threading.Event()

    def run(item):
        begun.append(item)
        if item == 0:
            raise ValueError("item 0")
        time.sleep(0.01)

    with pytest.raises(ValueError, match="item 0"):
        in_threads(run, range(200), 2, stop)
    assert stop.is_set()
    assert len(begun) < 200


def test_a_generator_is_read_no_further_ahead_than_in_flight():
    """The dense path's Grams come from a generator, each a large array: at most ``in_flight``
    of them may wait or run at once."""
    produced, finished, ahead = [], [], []

    def items():
        for k in range(20):
            ahead.append(len(produced) - len(finished))  # queued or running as item k is made
            produced.append(k)
            yield k

    def run(item):
        time.sleep(0.005)
        finished.append(item)

    in_threads(run, items(), 2, in_flight=2)
    assert sorted(finished) == list(range(20))
    assert max(ahead) <= 2


def _child_runs_the_pool(queue):
    seen = []
    in_threads(lambda item: seen.append(item), range(6), 2)
    queue.put(sorted(seen))


def test_a_forked_child_starts_its_own_pool():
    """The parent's pool threads do not exist in a forked child: a pool inherited from it
    would take the items and never run them."""
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    in_threads(lambda item: None, range(4), 2)
    assert 2 in workers._pools  # the parent holds a started pool
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_runs_the_pool, args=(queue,))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child's call did not finish")
    assert child.exitcode == 0 and queue.get(timeout=5) == list(range(6))
