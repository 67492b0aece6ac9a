"""The engine's worker threads: one pool per thread count, kept for the process.

The CPU routes split their work into chunks run in a thread per core (core/sweeps.py
`over_chunks`), a few hundred times per analysis. A fresh pool for each call started its
threads again every time: 814 thread starts in one analysis of the whole Mamba2-130m, each
waiting for the new thread to be scheduled while the other core worked (four Mamba2 layers
at L = 256 on 2 threads, alternated three times in one process: 12.67-12.74 s with a pool
per call, 12.48-12.53 s with this one).

A call from one of the pool's own threads runs its items in that thread: waiting there on
the same pool could wait forever for a thread that is itself waiting. A forked child
starts with no pools and a fresh lock (the parent's threads do not exist in it).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait

__all__ = ["in_threads"]

_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()
_local = threading.local()  # .in_pool: set in the pools' own threads


def _mark_pool_thread() -> None:
    _local.in_pool = True


def _pool(workers: int) -> ThreadPoolExecutor:
    with _pools_lock:
        if workers not in _pools:
            _pools[workers] = ThreadPoolExecutor(
                workers, thread_name_prefix="ess-worker", initializer=_mark_pool_thread
            )
        return _pools[workers]


def _forget_pools() -> None:
    """In a forked child: no pools, and a fresh lock (the parent's may have been held by a
    thread that does not exist here)."""
    global _pools_lock
    _pools.clear()
    _pools_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def in_threads(run, items, workers: int, stop: threading.Event | None = None, in_flight: int | None = None) -> None:
    """run(item) for every item, in ``workers`` threads when there are several of both, else
    one after the other in this thread. ``items`` may be a generator: with ``in_flight``, at
    most that many of its items are queued or running at once, so a generator of large items
    holds no more of them than that. On an error or an interrupt the items not yet begun are
    dropped, ``stop`` (if given) is set so that running ones can return early, and the first
    error is raised once the running ones have ended."""
    one = hasattr(items, "__len__") and len(items) <= 1
    if workers <= 1 or one or getattr(_local, "in_pool", False):
        for item in items:
            run(item)
        return
    pool, pending = _pool(workers), deque()
    try:
        for item in items:
            pending.append(pool.submit(run, item))
            while in_flight is not None and len(pending) > in_flight:
                pending.popleft().result()
        while pending:
            pending.popleft().result()
    except BaseException:
        if stop is not None:
            stop.set()
        for future in pending:
            future.cancel()
        wait(pending)
        raise
