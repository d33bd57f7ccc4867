"""One worker thread per unfinished RollbackRequest.

kopf tells us about requests (:mod:`reversi.handlers.rollback`); a worker runs reconcile passes
every ``tick_seconds`` until the request is final or deleted. Workers are plain threads rather
than kopf daemons because kopf puts a finalizer on objects with daemons, and a finalizer would keep
requests (and their namespaces) from being deleted whenever the operator is not running.
"""

from __future__ import annotations

import logging
import threading

from kubernetes.client.rest import ApiException

from ..adapters.kube import api_message
from .reconciler import Memory, Reconciler

log = logging.getLogger("reversi.workers")


def _describe(err: Exception) -> str:
    """A stable, short account of a failed pass for the request's status (an API error by its
    status and message, never its headers)."""
    if isinstance(err, ApiException):
        return f"the API server answered {err.status}: {api_message(err)}"
    return f"{type(err).__name__}: {err}"


class Workers:
    """The registry of worker threads, keyed by ``namespace/name``."""

    def __init__(self, reconciler: Reconciler, tick_seconds: float):
        self.reconciler = reconciler
        self.tick = tick_seconds
        self._threads: dict[str, tuple[threading.Thread, threading.Event]] = {}
        self._lock = threading.Lock()
        self._wake: dict[str, threading.Event] = {}

    def ensure(self, namespace: str, name: str) -> None:
        """Start a worker for the request unless one runs; wake it up if it does. Safe to call
        from many threads at once (kopf's request and Job handlers do, right after a start): the
        thread is started under the lock, so a second caller never sees a registered worker that
        is not alive yet and starts another one for the same request."""
        key = f"{namespace}/{name}"
        with self._lock:
            current = self._threads.get(key)
            if current and current[0].is_alive():
                self._wake[key].set()
                return
            stop, wake = threading.Event(), threading.Event()
            thread = threading.Thread(target=self._loop, args=(namespace, name, stop, wake), daemon=True,
                                      name=f"rollback-{key}")
            self._threads[key] = (thread, stop)
            self._wake[key] = wake
            thread.start()

    def stop(self, namespace: str, name: str) -> None:
        """Stop the request's worker (the request was deleted)."""
        with self._lock:
            entry = self._threads.pop(f"{namespace}/{name}", None)
            self._wake.pop(f"{namespace}/{name}", None)
        if entry:
            entry[1].set()

    def count(self) -> int:
        """Workers alive now."""
        with self._lock:
            return sum(1 for thread, _ in self._threads.values() if thread.is_alive())

    def stop_all(self) -> None:
        with self._lock:
            entries = list(self._threads.values())
            self._threads.clear()
        for _, stop in entries:
            stop.set()

    def _loop(self, namespace: str, name: str, stop: threading.Event, wake: threading.Event) -> None:
        memory = Memory()
        failures = 0
        while not stop.is_set():
            try:
                delay = self.reconciler.reconcile(namespace, name, memory)
                failures = 0
            except Exception as err:  # log, back off, try again: never crash the operator
                failures += 1
                log.exception("RollbackRequest %s/%s: reconcile failed (%d in a row); retrying", namespace, name,
                              failures)
                if failures >= 3:
                    try:
                        self.reconciler.report_error(namespace, name, _describe(err))
                    except Exception:  # noqa: BLE001 - the API may be what fails
                        log.warning("RollbackRequest %s/%s: could not report the error on it", namespace, name)
                delay = min(self.tick * (2 ** min(failures, 5)), 30.0)
            if delay is None:
                break
            if failures:
                stop.wait(delay)  # back off in full: the request's own status write must not wake it early
            else:
                wake.wait(delay)
            wake.clear()
        with self._lock:
            key = f"{namespace}/{name}"
            if key in self._threads and self._threads[key][1] is stop:
                self._threads.pop(key, None)
                self._wake.pop(key, None)
