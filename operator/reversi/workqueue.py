"""The operator's one work queue: keyed, delaying, de-duplicating, debouncing and rate-limited (a
backoff per key), served by a fixed pool of worker threads.

It is client-go's workqueue (``k8s.io/client-go/util/workqueue``: a delaying, rate-limited,
de-duplicating queue drained by a fixed number of workers) with one more mode, debounce. Two parts
of the operator use it:

- the rollback workers (:mod:`reversi.handlers.workers`): events add a RollbackRequest's key
  (``namespace/name``), ``settings.workers`` threads run one reconcile pass per due key, a pass
  says when to come back, and a pass that raises backs off;
- the Run status writer (:class:`reversi.handlers.runs.RunStatusWriter`): one thread; each event
  of a Run debounces its key, so a burst of edits makes one status write.

No library on PyPI offers this with the rules below (the ones found are job queues backed by a
broker, or plain delay queues without per-key de-duplication), so it is kept here, small. The
rules are in :class:`Schedule`, which has no threads and no clock of its own (the times are passed
in), so they are checked with a fake clock and hypothesis (``tests/unit/test_workqueue.py``);
:class:`WorkQueue` adds the threads and ``time.monotonic``.

Rules:

- **De-duplicated.** A key is queued once, however often it is asked for.
- **Two ways to ask.** :meth:`WorkQueue.add` (client-go's ``AddAfter``): the earlier due time wins
  (an event asking for "now" overtakes a requeue in 5 s; a requeue in 5 s never postpones a pass
  that is due now). :meth:`WorkQueue.debounce`: the key is due ``delay`` seconds after the *last*
  call, earlier or later than before (a burst of calls makes one pass, after the burst).
- **One pass per key at a time.** A key being processed is never handed to a second worker. If it
  is asked for while it is processed, it is queued again when the pass ends (at the due time asked
  for, or earlier if the pass itself asks for an earlier requeue).
- **Backoff per key** (client-go's ``ItemExponentialFailureRateLimiter``). With a :class:`Backoff`,
  a pass that raises is retried after ``backoff.delay(n)`` seconds for the n-th failure in a row,
  and nothing brings that retry forward: a key asked for during its backoff is due when the
  backoff ends. A pass that returns ends the count. Without a backoff, a pass that raises is
  logged and the key is not requeued (an event may ask for it again).
- **Bounded threads.** Exactly ``workers`` threads take keys, however many keys are queued; a pass
  that blocks holds one worker, never more.
- **Paused.** While ``paused()`` is true no worker starts a pass; passes already running finish.

``process(key)`` returns the seconds until the key's next pass, or None for no requeue.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger("reversi.workqueue")

#: how often a paused pool looks whether it may work again (seconds)
PAUSE_POLL_SECONDS = 1.0

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff per key: the n-th failing pass in a row (n >= 1) is retried after
    ``min(base * 2**min(n, doublings), most)`` seconds (``base`` 0.5, ``most`` 30: 1, 2, 4, 8, 16,
    16 ... s)."""

    base: float
    most: float
    doublings: int = 5

    def delay(self, failures: int) -> float:
        """Seconds before the retry of the ``failures``-th failing pass in a row."""
        return min(self.base * (2 ** min(failures, self.doublings)), self.most)


class Schedule(Generic[K]):
    """The queue's rules (module docstring) as bookkeeping only: no threads, no clock. Every
    method that needs the time takes it (``now``, ``due``: seconds on any one monotonic clock).
    Not thread-safe: :class:`WorkQueue` calls it under its lock."""

    def __init__(self, backoff: Backoff | None = None):
        self.backoff = backoff
        self._heap: list[tuple[float, int, K]] = []  # (due, seq, key); stale entries are skipped
        self._seq = itertools.count()
        self._due: dict[K, float] = {}  # queued keys (not running) and their due time
        self._running: set[K] = set()
        self._again: dict[K, float] = {}  # keys asked for while running: due time of their next pass
        self._forgotten: set[K] = set()  # keys forgotten while running: that pass's requeue is dropped
        self._failures: dict[K, int] = {}  # failing passes in a row
        self._hold: dict[K, float] = {}  # backing off: no pass before this time

    def add(self, key: K, due: float) -> None:
        """Ask for a pass of ``key`` at ``due``; the earlier of this and any due time asked before wins."""
        self._put(key, due, latest=False)

    def debounce(self, key: K, due: float) -> None:
        """Ask for a pass of ``key`` at ``due``, replacing any due time asked before (earlier or later)."""
        self._put(key, due, latest=True)

    def _put(self, key: K, due: float, *, latest: bool) -> None:
        due = max(due, self._hold.get(key, due))  # a key backing off waits for the end of its backoff
        if key in self._running:
            current = self._again.get(key)
            self._again[key] = due if latest or current is None else min(current, due)
            return
        current = self._due.get(key)
        if current is not None and (current == due or (not latest and current < due)):
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, next(self._seq), key))

    def next_due(self) -> float | None:
        """When the earliest queued key is due (None: nothing is queued)."""
        heap = self._heap
        while heap and self._due.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)  # stale: asked for again at another time, forgotten or taken
        return heap[0][0] if heap else None

    def take(self, now: float) -> K | None:
        """A key due at ``now``, marked running (the earliest first), or None."""
        due = self.next_due()
        if due is None or due > now:
            return None
        _, _, key = heapq.heappop(self._heap)
        del self._due[key]
        self._running.add(key)
        self._forgotten.discard(key)
        return key

    def fail(self, key: K, now: float) -> tuple[int, float] | None:
        """The pass of the running ``key`` raised: count it and hold the key back until its backoff
        ends. Returns (failing passes in a row, seconds until the retry), or None without a
        backoff (no retry). Call :meth:`done` next, with those seconds."""
        if self.backoff is None:
            return None
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        delay = self.backoff.delay(failures)
        self._hold[key] = now + delay
        return failures, delay

    def done(self, key: K, now: float, again_in: float | None, *, failed: bool = False) -> None:
        """The pass of ``key`` ended at ``now``; ``again_in``: seconds until the pass it asks for
        (None: none). A pass that did not fail ends the key's backoff."""
        self._running.discard(key)
        if not failed:
            self._failures.pop(key, None)
            self._hold.pop(key, None)
        if key in self._forgotten:
            self._forgotten.discard(key)
            self._failures.pop(key, None)
            self._hold.pop(key, None)
            again_in = None
        asked = self._again.pop(key, None)
        if again_in is not None:
            self._put(key, now + max(again_in, 0.0), latest=False)
        if asked is not None:
            self._put(key, asked, latest=False)

    def forget(self, key: K) -> None:
        """Drop ``key``: not queued any more, its backoff ended; a pass running now finishes and
        is not requeued (unless the key is asked for again meanwhile)."""
        self._due.pop(key, None)
        self._again.pop(key, None)
        self._failures.pop(key, None)
        self._hold.pop(key, None)
        if key in self._running:
            self._forgotten.add(key)

    def clear(self) -> None:
        """Drop every queued key (running passes finish; their requeues are dropped)."""
        self._forgotten |= self._running
        self._heap.clear()
        self._due.clear()
        self._again.clear()
        self._failures.clear()
        self._hold.clear()

    def queued(self) -> int:
        """Keys waiting for a pass (due or not)."""
        return len(self._due) + len(self._again)

    def running(self) -> int:
        """Keys being processed now."""
        return len(self._running)

    def keys(self) -> set[K]:
        """Every key queued or being processed."""
        return set(self._due) | self._running | set(self._again)

    def failures(self, key: K) -> int:
        """Failing passes of ``key`` in a row (0: none, or its last pass returned)."""
        return self._failures.get(key, 0)


class WorkQueue(Generic[K]):
    """See the module docstring. ``process``: the pass of one key; ``workers``: the pool size (>= 1);
    ``backoff``: retry passes that raise (None: do not); ``failed(key, error, failures)``: called
    in the failing pass's thread, before the key may be taken again, for each pass that raised
    while there is a backoff (it logs; without it the queue logs); ``paused``: whether passes may
    start now; ``name``: the threads' name prefix. Raises ``ValueError`` for a pool size below 1."""

    def __init__(self, process: Callable[[K], float | None], *, workers: int = 1, backoff: Backoff | None = None,
                 failed: Callable[[K, Exception, int], None] | None = None,
                 paused: Callable[[], bool] = lambda: False, name: str = "worker"):
        if workers < 1:
            raise ValueError(f"a work queue needs at least one worker, not {workers}")
        self.size = workers
        self.process = process
        self.failed = failed
        self.paused = paused
        self.name = name
        self._schedule: Schedule[K] = Schedule(backoff)
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._stopped = False

    # ----------------------------------------------------------------------------- public

    def start(self) -> None:
        """Start the pool's threads (once; later calls do nothing)."""
        with self._cond:
            if self._threads or self._stopped:
                return
            self._threads = [threading.Thread(target=self._work, daemon=True, name=f"{self.name}-{i}")
                             for i in range(self.size)]
        for thread in self._threads:
            thread.start()

    def add(self, key: K, delay: float = 0.0) -> None:
        """Queue ``key`` for a pass in ``delay`` seconds (the earlier due time wins)."""
        self._ask(key, delay, latest=False)

    def debounce(self, key: K, delay: float) -> None:
        """Queue ``key`` for a pass ``delay`` seconds from now, whatever was asked before: a key
        asked for again and again is due ``delay`` seconds after the last time."""
        self._ask(key, delay, latest=True)

    def _ask(self, key: K, delay: float, *, latest: bool) -> None:
        due = time.monotonic() + max(delay, 0.0)
        with self._cond:
            if self._stopped:
                return
            if latest:
                self._schedule.debounce(key, due)
            else:
                self._schedule.add(key, due)
            self._cond.notify()

    def forget(self, key: K) -> None:
        """Drop ``key`` from the queue and end its backoff (a pass running now finishes and is not
        requeued)."""
        with self._cond:
            self._schedule.forget(key)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop taking keys; wait up to ``timeout`` seconds for running passes to end."""
        with self._cond:
            self._stopped = True
            self._schedule.clear()
            self._cond.notify_all()
        end = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(end - time.monotonic(), 0))

    def queued(self) -> int:
        """Keys waiting for a pass (due or not)."""
        with self._cond:
            return self._schedule.queued()

    def running(self) -> int:
        """Keys being processed now (at most the pool size)."""
        with self._cond:
            return self._schedule.running()

    def keys(self) -> set[K]:
        """Every key queued or being processed."""
        with self._cond:
            return self._schedule.keys()

    def threads(self) -> int:
        """The pool's threads alive now."""
        return sum(1 for t in self._threads if t.is_alive())

    # -------------------------------------------------------------------------- internals

    def _take(self) -> K | None:
        """The next due key (marked running), waiting for one; None once stopped."""
        with self._cond:
            while not self._stopped:
                if self.paused():
                    self._cond.wait(PAUSE_POLL_SECONDS)
                    continue
                now = time.monotonic()
                key = self._schedule.take(now)
                if key is not None:
                    return key
                due = self._schedule.next_due()
                self._cond.wait(due - now if due is not None else None)
            return None

    def _work(self) -> None:
        while True:
            key = self._take()
            if key is None:
                return
            try:
                again_in = self.process(key)
            except Exception as err:  # a worker never dies of one key
                with self._cond:
                    retry = self._schedule.fail(key, time.monotonic())
                if retry is None or self.failed is None:
                    log.exception("%s: processing %s failed%s", self.name, key,
                                  "" if retry is None else f"; retrying in {retry[1]:.2f} s")
                else:
                    try:
                        self.failed(key, err, retry[0])
                    except Exception:  # the retry stands whatever the report does
                        log.exception("%s: reporting the failure of %s failed", self.name, key)
                self._finish(key, None if retry is None else retry[1], failed=True)
            else:
                self._finish(key, again_in, failed=False)

    def _finish(self, key: K, again_in: float | None, *, failed: bool) -> None:
        with self._cond:
            self._schedule.done(key, time.monotonic(), again_in, failed=failed)
            self._cond.notify_all()
