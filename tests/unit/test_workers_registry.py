"""The registry of rollback workers: one worker per request, however many handlers ask at once."""

from __future__ import annotations

import threading
import time

import reversi.handlers.runtime  # noqa: F401 - imports the handlers in the order the operator does
from reversi.handlers.workers import Workers


class CountingReconciler:
    """Counts the threads that reconcile each request and how many run at the same time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.threads: set[int] = set()
        self.running = 0
        self.most = 0
        self.release = threading.Event()

    def reconcile(self, namespace, name, memory):
        with self.lock:
            self.threads.add(threading.get_ident())
            self.running += 1
            self.most = max(self.most, self.running)
        self.release.wait(5)
        with self.lock:
            self.running -= 1
        return None  # final: the worker ends


def test_many_handlers_asking_at_once_start_one_worker_for_a_request():
    """kopf runs the request's and its Jobs' handlers in parallel after a restart; each calls
    ensure(). Before the fix a worker registered but not started yet looked dead to the second
    caller, which started a second worker reconciling the same request at the same time."""
    for _ in range(20):
        rec = CountingReconciler()
        workers = Workers(rec, tick_seconds=0.01)  # type: ignore[arg-type]
        go = threading.Barrier(8)

        def ask():
            go.wait()
            workers.ensure("ns", "undo")

        callers = [threading.Thread(target=ask) for _ in range(8)]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        time.sleep(0.05)
        rec.release.set()
        deadline = time.monotonic() + 5
        while workers.count() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rec.most == 1 and len(rec.threads) == 1, f"{len(rec.threads)} workers reconciled one request"
