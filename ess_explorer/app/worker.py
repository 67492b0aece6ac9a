"""The explorer's background worker: one analysis at a time in a thread, and the one lock
under which the views change.

The worker runs a job (the session's `run` or `resume`) in a daemon thread with the caller's
torch thread count (session.torch_thread), so `explore()` returns at once and the controls
stay live. A new job cancels the one running (session.cancel) and starts once it has
stopped. The lock is re-entrant: the job's progress callbacks and the user's changes both
update the views under it, one at a time. `quiet` marks updates the code itself makes (filling
the layer list, echoing a browser selection): the widget's observers do nothing during them,
so one change never redraws twice.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable

from .session import Cancelled, ExplorerSession, torch_thread

__all__ = ["Worker"]


class Worker:
    """Runs jobs of ``session`` one at a time, in the background unless ``background`` is
    False, and reports them: on ``status`` (controls.StatusBar: the progress, the outcome in
    words) and through ``on_state(busy, error)`` (error: the failure in words, None after a
    success; not given at the start). ``ok``: whether the last finished job succeeded (None
    before any)."""

    def __init__(self, session: ExplorerSession, status, *, background: bool = True, on_state: Callable):
        self.session, self.status, self.on_state = session, status, on_state
        self.background = background
        self.lock = threading.RLock()
        self.ok: bool | None = None
        self._quiet_in: int | None = None  # the thread whose updates are quiet now
        self._thread: threading.Thread | None = None

    @property
    def is_quiet(self) -> bool:
        """True inside a `quiet` block of the calling thread (observers run in the thread that
        changed a trait: another thread's change is never taken for the code's own)."""
        return self._quiet_in == threading.get_ident()

    @contextlib.contextmanager
    def quiet(self):
        """Under the lock, the updates of the block are the code's own (observers skip them)."""
        with self.lock:
            before, self._quiet_in = self._quiet_in, threading.get_ident()
            try:
                yield
            finally:
                self._quiet_in = before

    def start(self, job: Callable, *, label: str, after: Callable, wait: bool = False) -> bool:
        """Run ``job()`` (analysing ``label``) after cancelling (and waiting for) the running
        one; then ``after(result)``, or ``after(None)`` when it failed (not for a job cancelled
        by a newer one). Returns True at once, or with ``wait`` (or in the foreground) whether
        it succeeded."""
        previous = self._thread
        if previous is not None and previous.is_alive():
            self.session.cancel()
        self.on_state(True)
        self.status.starting()

        def run() -> None:
            if previous is not None:
                previous.join()
            started = time.perf_counter()
            try:
                result = job()
            except Cancelled:
                return  # a newer job took over; it reports
            except Exception as error:  # noqa: BLE001  (a failed load/analysis is reported, never raised)
                self.ok = False
                message = f"{label}: {type(error).__name__}: {error}"
                self.on_state(False, message)
                self.status.ended(message, ok=False, resumable=bool(self.session.pending))
                after(None)
                return
            self.ok = True
            self.on_state(False, None)
            summary = self._summary(result, label, time.perf_counter() - started)
            self.status.ended(summary, ok=True, opened=self.session.opened)
            after(result)

        if not self.background:
            run()
            return bool(self.ok)
        self._thread = torch_thread(run, "ess-explorer")  # the caller's torch threads, not one core
        self._thread.start()
        return bool(self.wait()) if wait else True

    def _summary(self, result, label: str, seconds: float) -> str:
        how = "from the cache" if self.session.cache_hit else f"in {seconds:.1f} s"
        return f"analysed {len(result.layers)} layers of {label} on {result.length} tokens {how}"

    def wait(self, timeout: float | None = None) -> bool | None:
        """Block until the running job ends; whether it succeeded (None: still running)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                return None
        return self.ok
