"""Rollback workers: a keyed work queue of RollbackRequests served by a fixed pool of threads.

kopf tells us about requests, their Jobs and their Runs (:mod:`reversi.handlers.rollback`); each
event adds the request's key (``namespace/name``) to a :class:`reversi.workqueue.WorkQueue`.
``settings.workers`` threads take the keys that are due and run one reconcile pass each;
:meth:`Reconciler.reconcile` returns the seconds until the request's next pass (None: final, no
requeue). So the operator's threads do not grow with the requests, a request never has two
passes at once, and a burst of events for one request makes one pass.

A pass that raises is retried with exponential backoff (``tick * 2**failures``, at most 30 s);
during the backoff an event does not bring the pass forward (the request's own status write
would), and after three failures in a row the request says so (``report_error``). While kopf's
peering pauses the operator (a standby replica), no pass starts (``paused``).

Workers are plain threads rather than kopf daemons because kopf puts a finalizer on objects with
daemons, and a finalizer would keep requests (and their namespaces) from being deleted whenever
the operator is not running.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kubernetes.client.rest import ApiException

from ..adapters.kube import api_message
from ..workqueue import WorkQueue
from .reconciler import Memory, Reconciler

log = logging.getLogger("reversi.workers")

#: the longest backoff between failing passes of one request (seconds)
MAX_BACKOFF_SECONDS = 30.0
#: failing passes in a row after which the request's status says the operator keeps failing
REPORT_AFTER_FAILURES = 3


def _describe(err: Exception) -> str:
    """A stable, short account of a failed pass for the request's status (an API error by its
    status and message, never its headers)."""
    if isinstance(err, ApiException):
        return f"the API server answered {err.status}: {api_message(err)}"
    return f"{type(err).__name__}: {err}"


class Workers:
    """The rollback work queue and its pool (see the module docstring). ``size``: threads in the
    pool (``settings.workers``); ``paused``: true while no pass may start (kopf's peering pause)."""

    def __init__(self, reconciler: Reconciler, tick_seconds: float, size: int = 4,
                 paused: Callable[[], bool] = lambda: False):
        self.reconciler = reconciler
        self.tick = tick_seconds
        self.queue = WorkQueue(size, self._pass, paused=paused, name="rollback-worker")
        self._lock = threading.Lock()
        self._memory: dict[str, Memory] = {}  # what a request's passes keep between them
        self._failures: dict[str, int] = {}  # failing passes in a row
        self._hold: dict[str, float] = {}  # backing off until (monotonic seconds): events do not wake it

    def start(self) -> None:
        """Start the pool's threads (also done by the first :meth:`ensure`)."""
        self.queue.start()

    def ensure(self, namespace: str, name: str) -> None:
        """Queue a pass of the request now (or when its backoff ends). Safe from any thread; many
        calls at once still make one pass at a time."""
        key = f"{namespace}/{name}"
        with self._lock:
            hold = self._hold.get(key)
        self.queue.start()
        self.queue.add(key, max(hold - time.monotonic(), 0.0) if hold else 0.0)

    def stop(self, namespace: str, name: str) -> None:
        """Forget the request (it was deleted): no further pass; one running now ends as it is."""
        key = f"{namespace}/{name}"
        self.queue.forget(key)
        self._drop(key)

    def count(self) -> int:
        """Requests queued or in a pass now."""
        return len(self.queue.keys())

    def threads(self) -> int:
        """The pool's threads alive (at most ``size``)."""
        return self.queue.threads()

    def stop_all(self) -> None:
        self.queue.stop()

    def _drop(self, key: str) -> None:
        with self._lock:
            self._memory.pop(key, None)
            self._failures.pop(key, None)
            self._hold.pop(key, None)

    def _pass(self, key: str) -> float | None:
        """One reconcile pass of ``key``; the seconds until the next one, or None."""
        namespace, name = key.split("/", 1)
        with self._lock:
            memory = self._memory.setdefault(key, Memory())
        delay: float | None
        try:
            delay = self.reconciler.reconcile(namespace, name, memory)
            with self._lock:
                self._failures.pop(key, None)
                self._hold.pop(key, None)
        except Exception as err:  # log, back off, try again: never crash the operator
            with self._lock:
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                backoff = min(self.tick * (2 ** min(failures, 5)), MAX_BACKOFF_SECONDS)
                self._hold[key] = time.monotonic() + backoff  # back off in full: events must not wake it early
            self.queue.postpone(key, backoff)  # nor an event that came during this pass
            log.exception("RollbackRequest %s: reconcile failed (%d in a row); retrying", key, failures)
            if failures >= REPORT_AFTER_FAILURES:
                try:
                    self.reconciler.report_error(namespace, name, _describe(err))
                except Exception:  # noqa: BLE001 - the API may be what fails
                    log.warning("RollbackRequest %s: could not report the error on it", key)
            delay = backoff
        if delay is None:
            self._drop(key)
        return delay
