"""A keyed, de-duplicating delay queue served by a fixed pool of worker threads.

The operator's rollback workers (:mod:`reversi.handlers.workers`) use it in the way client-go's
``workqueue`` is used: events add keys (``namespace/name`` of a RollbackRequest), a fixed number
of threads take the keys that are due and process them. No library on PyPI offers this with the
three rules below (the ones found are job queues backed by a broker, or plain delay queues
without per-key de-duplication), so it is kept here, small and tested with real threads
(``tests/unit/test_workqueue.py``).

Rules:

- **De-duplicated, earliest due wins.** :meth:`WorkQueue.add` of a key already queued keeps one
  entry, due at the earlier of the two times (an event asking for "now" overtakes a requeue in
  5 s; a requeue in 5 s never postpones a pass that is due now).
- **One pass per key at a time.** A key being processed is never handed to a second worker. If it
  is added while it is processed, it is queued again when the pass ends (at the due time asked
  for, or earlier if the pass itself asks for an earlier requeue).
- **Bounded threads.** Exactly ``workers`` threads take keys, however many keys are queued; a
  pass that blocks holds one worker, never more.

``process(key)`` returns the seconds until the key's next pass, or None for no requeue (an event
may add it again). An exception raised by ``process`` is logged and the key is not requeued
(callers handle their own errors and backoff). While ``paused()`` is true no worker starts a
pass; passes already running finish.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("reversi.workqueue")

#: how often a paused pool looks whether it may work again (seconds)
PAUSE_POLL_SECONDS = 1.0


class WorkQueue:
    """See the module docstring. ``workers``: the pool size (>= 1); ``process``: the pass;
    ``paused``: whether passes may start now; ``name``: the threads' name prefix.
    Raises ``ValueError`` for a pool size below 1."""

    def __init__(self, workers: int, process: Callable[[str], float | None], *,
                 paused: Callable[[], bool] = lambda: False, name: str = "worker"):
        if workers < 1:
            raise ValueError(f"a work queue needs at least one worker, not {workers}")
        self.size = workers
        self.process = process
        self.paused = paused
        self.name = name
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, str]] = []  # (due, seq, key); stale entries are skipped
        self._due: dict[str, float] = {}  # queued keys and their due time (monotonic seconds)
        self._running: set[str] = set()
        self._again: dict[str, float] = {}  # keys added while running: due time of their next pass
        self._forgotten: set[str] = set()  # keys forgotten while running: that pass's requeue is dropped
        self._seq = itertools.count()
        self._threads: list[threading.Thread] = []
        self._stopped = False

    # ----------------------------------------------------------------------------- public

    def start(self) -> None:
        """Start the pool's threads (once; a second call does nothing)."""
        with self._cond:
            if self._threads or self._stopped:
                return
            self._threads = [threading.Thread(target=self._work, daemon=True, name=f"{self.name}-{i}")
                             for i in range(self.size)]
        for thread in self._threads:
            thread.start()

    def add(self, key: str, delay: float = 0.0) -> None:
        """Queue ``key`` for a pass in ``delay`` seconds (earliest due wins; see the rules)."""
        due = time.monotonic() + max(delay, 0.0)
        with self._cond:
            if self._stopped:
                return
            if key in self._running:
                self._again[key] = min(due, self._again.get(key, due))
                return
            current = self._due.get(key)
            if current is not None and current <= due:
                return
            self._due[key] = due
            heapq.heappush(self._heap, (due, next(self._seq), key))
            self._cond.notify()

    def postpone(self, key: str, delay: float) -> None:
        """A pass of ``key`` asked for while its current pass runs starts no sooner than ``delay``
        seconds from now (a failed pass backs off in full, whatever events came meanwhile)."""
        not_before = time.monotonic() + max(delay, 0.0)
        with self._cond:
            if key in self._again:
                self._again[key] = max(self._again[key], not_before)

    def forget(self, key: str) -> None:
        """Drop ``key`` from the queue (a pass running now finishes and is not requeued)."""
        with self._cond:
            self._due.pop(key, None)
            self._again.pop(key, None)
            if key in self._running:
                self._forgotten.add(key)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop taking keys; wait up to ``timeout`` seconds for running passes to end."""
        with self._cond:
            self._stopped = True
            self._heap.clear()
            self._due.clear()
            self._again.clear()
            self._cond.notify_all()
        end = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(end - time.monotonic(), 0))

    def queued(self) -> int:
        """Keys waiting for a pass (due or not)."""
        with self._cond:
            return len(self._due) + len(self._again)

    def running(self) -> int:
        """Keys being processed now (at most the pool size)."""
        with self._cond:
            return len(self._running)

    def keys(self) -> set[str]:
        """Every key queued or being processed."""
        with self._cond:
            return set(self._due) | self._running | set(self._again)

    def threads(self) -> int:
        """The pool's threads alive now."""
        return sum(1 for t in self._threads if t.is_alive())

    # -------------------------------------------------------------------------- internals

    def _take(self) -> str | None:
        """The next due key (marked running), waiting for one; None once stopped."""
        with self._cond:
            while not self._stopped:
                if self.paused():
                    self._cond.wait(PAUSE_POLL_SECONDS)
                    continue
                now = time.monotonic()
                while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
                    heapq.heappop(self._heap)  # stale: re-added earlier, forgotten or taken
                if self._heap and self._heap[0][0] <= now:
                    _, _, key = heapq.heappop(self._heap)
                    del self._due[key]
                    self._running.add(key)
                    self._forgotten.discard(key)
                    return key
                self._cond.wait(self._heap[0][0] - now if self._heap else None)
            return None

    def _done(self, key: str, delay: float | None) -> None:
        with self._cond:
            self._running.discard(key)
            forgotten = key in self._forgotten
            self._forgotten.discard(key)
            again = self._again.pop(key, None)
        if delay is not None and not forgotten:
            self.add(key, delay)
        if again is not None:
            self.add(key, again - time.monotonic())

    def _work(self) -> None:
        while True:
            key = self._take()
            if key is None:
                return
            delay: float | None = None
            try:
                delay = self.process(key)
            except Exception:  # a worker never dies of one key
                log.exception("%s: processing %s failed", self.name, key)
            finally:
                self._done(key, delay)
