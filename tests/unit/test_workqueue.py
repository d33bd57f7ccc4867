"""The keyed work queue with real threads: passes really overlap, the pool bound holds, a key is
never in two passes at once, adds de-duplicate (earliest due wins), pauses hold passes back."""

from __future__ import annotations

import threading
import time

import pytest

from reversi.workqueue import WorkQueue


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


class Recorder:
    """A pass that records who ran it, how many ran at once (overall and per key), and can be
    held until released."""

    def __init__(self, hold: float = 0.0, requeue: dict[str, list[float | None]] | None = None):
        self.lock = threading.Lock()
        self.hold = hold
        self.requeue = requeue or {}
        self.running = 0
        self.most = 0
        self.per_key: dict[str, int] = {}
        self.most_per_key = 0
        self.passes: list[tuple[str, float]] = []
        self.threads: set[int] = set()
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, key: str) -> float | None:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.per_key[key] = self.per_key.get(key, 0) + 1
            self.most_per_key = max(self.most_per_key, self.per_key[key])
            self.passes.append((key, time.monotonic()))
            self.threads.add(threading.get_ident())
            plan = self.requeue.get(key)
            delay = plan.pop(0) if plan else None
        self.gate.wait(10)
        if self.hold:
            time.sleep(self.hold)
        with self.lock:
            self.running -= 1
            self.per_key[key] -= 1
        return delay

    def count(self, key: str) -> int:
        with self.lock:
            return sum(1 for k, _ in self.passes if k == key)


@pytest.fixture
def queues():
    made: list[WorkQueue] = []
    yield made
    for q in made:
        q.stop()


def make(queues, size: int, process, **kw) -> WorkQueue:
    q = WorkQueue(size, process, **kw)
    queues.append(q)
    q.start()
    return q


def test_passes_overlap_up_to_the_pool_size_and_no_further(queues):
    rec = Recorder(hold=0.05)
    rec.gate.clear()
    q = make(queues, 4, rec)
    for i in range(40):
        q.add(f"ns/r{i}")
    wait_until(lambda: rec.running == 4)  # four passes really run at the same time ...
    time.sleep(0.05)
    assert rec.running == 4 and q.running() == 4  # ... and no fifth starts while they block
    rec.gate.set()
    wait_until(lambda: len(rec.passes) == 40 and rec.running == 0)
    assert rec.most == 4, f"{rec.most} passes at once with a pool of 4"
    assert len(rec.threads) <= 4 and q.threads() == 4
    assert q.queued() == 0 and q.running() == 0


def test_adds_of_a_queued_key_make_one_pass(queues):
    rec = Recorder()
    rec.gate.clear()
    q = make(queues, 2, rec)
    q.add("ns/busy")  # holds one worker ...
    wait_until(lambda: rec.running == 1)
    q.add("ns/a", delay=0.3)  # ... and "a" is added many times, from many threads, while queued
    callers = [threading.Thread(target=q.add, args=("ns/a", 0.3)) for _ in range(16)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert q.queued() == 1
    rec.gate.set()
    wait_until(lambda: rec.count("ns/a") == 1)
    time.sleep(0.4)
    assert rec.count("ns/a") == 1, "adds of a queued key made more than one pass"


def test_the_earlier_due_time_wins(queues):
    rec = Recorder()
    q = make(queues, 1, rec)
    start = time.monotonic()
    q.add("ns/a", delay=5.0)
    q.add("ns/a", delay=0.0)  # now overtakes the later pass
    wait_until(lambda: rec.count("ns/a") == 1, timeout=2)
    q.add("ns/b", delay=0.0)
    q.add("ns/b", delay=5.0)  # a later due time never postpones a pass that is due
    wait_until(lambda: rec.count("ns/b") == 1, timeout=2)
    assert time.monotonic() - start < 2
    time.sleep(0.2)
    assert rec.count("ns/a") == 1 and rec.count("ns/b") == 1


def test_a_key_is_never_in_two_passes_and_runs_again_when_added_while_running(queues):
    rec = Recorder()
    rec.gate.clear()
    q = make(queues, 8, rec)  # plenty of idle workers that could take it twice
    q.add("ns/a")
    wait_until(lambda: rec.running == 1)
    for _ in range(10):
        q.add("ns/a")
    time.sleep(0.1)
    assert rec.count("ns/a") == 1 and rec.most_per_key == 1  # not taken by a second worker
    rec.gate.set()
    wait_until(lambda: rec.count("ns/a") == 2)  # the adds while it ran made exactly one more pass
    time.sleep(0.2)
    assert rec.count("ns/a") == 2 and rec.most_per_key == 1


def test_postpone_holds_back_the_pass_asked_for_while_one_ran(queues):
    """A failed pass backs off in full: an add that came while it ran does not start the next
    pass before the postponed time (the rollback workers' backoff, reversi.handlers.workers)."""
    rec = Recorder()
    rec.gate.clear()
    q = make(queues, 2, rec)
    q.add("ns/a")
    wait_until(lambda: rec.running == 1)
    q.add("ns/a")  # an event during the pass: "now"
    q.postpone("ns/a", 0.3)
    rec.gate.set()
    wait_until(lambda: rec.count("ns/a") == 2, timeout=5)
    (_, first), (_, second) = rec.passes
    assert second - first >= 0.3
    q.postpone("ns/b", 5.0)  # a key not running and not asked for: nothing to hold back
    q.add("ns/b")
    wait_until(lambda: rec.count("ns/b") == 1, timeout=2)


def test_a_pass_returns_its_requeue_delay(queues):
    rec = Recorder(requeue={"ns/a": [0.2, 0.2, None]})
    q = make(queues, 2, rec)
    q.add("ns/a")
    wait_until(lambda: rec.count("ns/a") == 3, timeout=5)
    times = [t for k, t in rec.passes if k == "ns/a"]
    assert times[1] - times[0] >= 0.19 and times[2] - times[1] >= 0.19
    time.sleep(0.4)
    assert rec.count("ns/a") == 3  # None: no requeue
    assert q.queued() == 0


def test_forget_drops_a_queued_key_and_the_requeue_of_a_running_one(queues):
    rec = Recorder(requeue={"ns/run": [0.0]})
    rec.gate.clear()
    q = make(queues, 1, rec)
    q.add("ns/run")
    wait_until(lambda: rec.running == 1)
    q.add("ns/queued")
    q.forget("ns/queued")
    q.forget("ns/run")  # its pass asks for a requeue in 0 s: dropped
    rec.gate.set()
    time.sleep(0.3)
    assert [k for k, _ in rec.passes] == ["ns/run"]


def test_no_pass_starts_while_paused(queues):
    rec = Recorder()
    paused = threading.Event()
    paused.set()
    q = make(queues, 2, rec, paused=paused.is_set)
    q.add("ns/a")
    time.sleep(0.3)
    assert rec.passes == [] and q.queued() == 1
    paused.clear()
    wait_until(lambda: rec.count("ns/a") == 1, timeout=5)


def test_a_failing_pass_does_not_kill_its_worker(queues):
    seen: list[str] = []

    def process(key: str) -> float | None:
        seen.append(key)
        raise RuntimeError("boom")

    q = make(queues, 1, process)
    q.add("ns/a")
    q.add("ns/b")
    wait_until(lambda: seen == ["ns/a", "ns/b"])
    assert q.threads() == 1


def test_a_pool_needs_a_worker():
    with pytest.raises(ValueError, match="at least one worker"):
        WorkQueue(0, lambda key: None)
