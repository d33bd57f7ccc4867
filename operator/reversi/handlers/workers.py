"""Rollback workers: RollbackRequests on the operator's work queue, served by a fixed pool of threads.

kopf tells us about requests, their Jobs and their Runs (:mod:`reversi.handlers.rollback`); each
event adds the request's key (``namespace/name``) to a :class:`reversi.workqueue.WorkQueue`.
``settings.workers`` threads take the keys that are due and run one reconcile pass each;
:meth:`Reconciler.reconcile` returns the seconds until the request's next pass (None: final, no
requeue). So the operator's threads do not grow with the requests, a request never has two
passes at once, and a burst of events for one request makes one pass.

A pass that raises is retried with the queue's backoff per key (``tick * 2**failures``, at most
30 s); during the backoff an event does not bring the pass forward (the request's own status
write would), and after three failures in a row the request says so (``report_error``). While
this replica does not hold the Lease (a standby: docs/operations.md#leader-election), no pass
starts (``paused``); a pass whose write the fence refused (the Lease was lost mid-pass) is no
failure: it is queued again and runs if this replica holds the Lease again.

Workers are plain threads rather than kopf daemons because kopf puts a finalizer on objects with
daemons, and a finalizer would keep requests (and their namespaces) from being deleted whenever
the operator is not running.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kubernetes.client.rest import ApiException

from ..adapters.kube import api_message
from ..adapters.lease import NotLeading
from ..workqueue import Backoff, WorkQueue
from .reconciler import PassMemory, Reconciler

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
    """The rollback work queue and its pool (see the module docstring). ``tick_seconds``: the
    backoff's base; ``size``: threads in the pool (``settings.workers``); ``paused``: true while no
    pass may start (this replica does not hold the Lease)."""

    def __init__(self, reconciler: Reconciler, tick_seconds: float, size: int = 4,
                 paused: Callable[[], bool] = lambda: False):
        self.reconciler = reconciler
        self.queue: WorkQueue[str] = WorkQueue(
            self._pass, workers=size, backoff=Backoff(tick_seconds, MAX_BACKOFF_SECONDS), failed=self._failed,
            paused=paused, name="rollback-worker")
        self._lock = threading.Lock()
        self._memory: dict[str, PassMemory] = {}  # what a request's passes keep between them

    def start(self) -> None:
        """Start the pool's threads (also done by the first :meth:`ensure`)."""
        self.queue.start()

    def ensure(self, namespace: str, name: str) -> None:
        """Queue a pass of the request now (or when its backoff ends). Safe from any thread; many
        calls at once still make one pass at a time."""
        self.queue.start()
        self.queue.add(f"{namespace}/{name}")

    def stop(self, namespace: str, name: str) -> None:
        """Forget the request (it was deleted): no further pass; one running now ends as it is."""
        key = f"{namespace}/{name}"
        self.queue.forget(key)
        self._forget_memory(key)

    def count(self) -> int:
        """Requests queued or in a pass now."""
        return len(self.queue.keys())

    def threads(self) -> int:
        """The pool's threads alive (at most ``size``)."""
        return self.queue.threads()

    def stop_all(self) -> None:
        self.queue.stop()

    def forget_memories(self) -> None:
        """Forget what every request's passes kept: this replica (re)gained the Lease, and what it
        remembers from before (undo entries it wrote, a pin's time, a probe's start) may be older
        than what the replica that held the Lease meanwhile wrote (docs/operations.md#leader-election)."""
        with self._lock:
            self._memory.clear()

    def _forget_memory(self, key: str) -> None:
        with self._lock:
            self._memory.pop(key, None)

    def _pass(self, key: str) -> float | None:
        """One reconcile pass of ``key``; the seconds until the next one, or None. What it raises
        the queue retries after its backoff (:meth:`_failed` says so)."""
        namespace, name = key.split("/", 1)
        with self._lock:
            memory = self._memory.setdefault(key, PassMemory())
        try:
            delay = self.reconciler.reconcile(namespace, name, memory)
        except NotLeading as err:
            log.info("RollbackRequest %s: pass stopped, %s", key, err)
            return self.reconciler.settings.tick_seconds
        if delay is None:
            self._forget_memory(key)
        return delay

    def _failed(self, key: str, err: Exception, failures: int) -> None:
        """A pass of ``key`` raised ``err``, the ``failures``-th in a row: log it and, from the
        third on, say so on the request."""
        log.error("RollbackRequest %s: reconcile failed (%d in a row); retrying", key, failures, exc_info=err)
        if failures >= REPORT_AFTER_FAILURES:
            namespace, name = key.split("/", 1)
            try:
                self.reconciler.report_error(namespace, name, _describe(err))
            except Exception:  # noqa: BLE001 - the API may be what fails
                log.warning("RollbackRequest %s: could not report the error on it", key)
