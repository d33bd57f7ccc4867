"""The rollback workers: one pass per request at a time however many handlers ask at once, the
pool bound, and the backoff of failing passes."""

from __future__ import annotations

import threading
import time

from reversi.handlers.workers import Workers


class CountingReconciler:
    """Counts the passes of each request and how many run at the same time."""

    def __init__(self, fail: int = 0) -> None:
        self.lock = threading.Lock()
        self.threads: set[int] = set()
        self.running = 0
        self.most = 0
        self.passes: list[tuple[str, float]] = []
        self.release = threading.Event()
        self.fail = fail
        self.errors: list[str] = []

    def reconcile(self, namespace, name, memory):
        with self.lock:
            self.threads.add(threading.get_ident())
            self.running += 1
            self.most = max(self.most, self.running)
            self.passes.append((name, time.monotonic()))
            failing = self.fail > 0
            self.fail -= 1
        self.release.wait(5)
        with self.lock:
            self.running -= 1
        if failing:
            raise RuntimeError("the API is down")
        return None  # final: no requeue

    def report_error(self, namespace, name, error):
        self.errors.append(error)


def _settle(workers: Workers) -> None:
    deadline = time.monotonic() + 5
    while workers.count() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_many_handlers_asking_at_once_never_run_two_passes_of_a_request():
    """kopf runs the request's and its Jobs' handlers in parallel after a restart; each calls
    ensure(). A request is never reconciled by two workers at once; the calls made while its pass
    ran make one more pass after it, not eight."""
    for _ in range(20):
        rec = CountingReconciler()
        workers = Workers(rec, tick_seconds=0.01, size=4)  # type: ignore[arg-type]
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
        _settle(workers)
        workers.stop_all()
        assert rec.most == 1, f"{rec.most} passes of one request at once"
        assert 1 <= len(rec.passes) <= 2, f"{len(rec.passes)} passes for one burst of events"


def test_threads_stay_at_the_pool_size_with_many_requests():
    rec = CountingReconciler()
    workers = Workers(rec, tick_seconds=0.01, size=3)  # type: ignore[arg-type]
    before = threading.active_count()
    for i in range(50):
        workers.ensure("ns", f"r{i}")
    deadline = time.monotonic() + 5
    while rec.running < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rec.running == 3 and threading.active_count() - before == 3 and workers.threads() == 3
    rec.release.set()
    _settle(workers)
    workers.stop_all()
    assert len(rec.passes) == 50 and rec.most == 3


def test_a_failing_request_backs_off_in_full_and_says_so_after_three_failures():
    rec = CountingReconciler(fail=3)
    rec.release.set()
    workers = Workers(rec, tick_seconds=0.05, size=2)  # type: ignore[arg-type]
    workers.ensure("ns", "undo")
    deadline = time.monotonic() + 5
    while len(rec.passes) < 2 and time.monotonic() < deadline:
        workers.ensure("ns", "undo")  # events during the backoff do not bring the pass forward
        time.sleep(0.005)
    _settle(workers)
    workers.stop_all()
    times = [t for _, t in rec.passes]
    assert len(times) == 4  # three failures, then the pass that ends it
    assert times[1] - times[0] >= 0.09 and times[2] - times[1] >= 0.19 and times[3] - times[2] >= 0.39
    assert len(rec.errors) == 1 and "RuntimeError: the API is down" in rec.errors[0]
