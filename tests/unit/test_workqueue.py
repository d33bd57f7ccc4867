"""The operator's work queue (reversi.workqueue). With real threads: passes really overlap, the
pool bound holds, a key is never in two passes at once, adds de-duplicate (earliest due wins),
debounces wait for the last one, a failing pass backs off per key, pauses hold passes back. Its
rules on a fake clock (Schedule), with hypothesis: every key asked for is processed at least once
after the last time it was asked for, never by two workers at once, and never before it is due."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from reversi.workqueue import Backoff, Schedule, WorkQueue
from tests.helpers import wait_for


def wait_until(predicate, timeout: float = 10.0) -> None:
    wait_for(predicate, timeout=timeout, interval=0.005)


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
    q = WorkQueue(process, workers=size, **kw)
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


class Failing(Recorder):
    """A pass that raises its first ``fail`` times."""

    def __init__(self, fail: int, **kw):
        super().__init__(**kw)
        self.fail = fail

    def __call__(self, key: str) -> float | None:
        super().__call__(key)
        with self.lock:
            self.fail -= 1
            failing = self.fail >= 0
        if failing:
            raise RuntimeError("the API is down")
        return None


def test_a_failing_pass_backs_off_in_full_whatever_is_asked_meanwhile(queues):
    """The n-th failure in a row waits base * 2**n (0.1, 0.2, 0.4 s); adds during a pass or during
    the backoff do not bring the retry forward; a pass that returns ends the count."""
    rec = Failing(3)
    reports: list[tuple[str, str, int]] = []
    q = make(queues, 2, rec, backoff=Backoff(0.05, 30.0),
             failed=lambda key, err, n: reports.append((key, str(err), n)))
    q.add("ns/a")
    deadline = time.monotonic() + 5
    while rec.count("ns/a") < 4 and time.monotonic() < deadline:
        q.add("ns/a")  # events all along
        time.sleep(0.005)
    wait_until(lambda: q.running() == 0 and q.queued() == 0)
    times = [t for _, t in rec.passes]
    assert len(times) == 4, "three failures, then the pass that ends it"
    assert times[1] - times[0] >= 0.09 and times[2] - times[1] >= 0.19 and times[3] - times[2] >= 0.39
    assert reports == [("ns/a", "the API is down", 1), ("ns/a", "the API is down", 2), ("ns/a", "the API is down", 3)]
    rec.fail = 1  # a new failure after a pass that returned: the count starts again at 1
    q.add("ns/a")
    wait_until(lambda: len(reports) == 4)
    assert reports[-1][2] == 1


def test_a_backoff_doubles_up_to_its_limits():
    backoff = Backoff(0.5, 30.0)
    assert [backoff.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 16, 16]
    assert Backoff(1.0, 10.0).delay(5) == 10.0


def test_debounce_makes_one_pass_after_the_last_ask(queues):
    rec = Recorder()
    q = make(queues, 2, rec)
    start = time.monotonic()
    for _ in range(5):
        time.sleep(0.05)
        q.debounce("ns/r", 0.2)
    last = time.monotonic()
    q.debounce("ns/other", 0.4)
    wait_until(lambda: rec.count("ns/other") == 1)
    assert [k for k, _ in rec.passes] == ["ns/r", "ns/other"]
    (_, r_at), (_, other_at) = rec.passes
    assert r_at - last >= 0.19, "the pass came before the key was quiet"
    assert r_at - start >= 0.44 and other_at - last >= 0.39


def test_a_debounce_may_move_the_due_time_later_unlike_an_add(queues):
    rec = Recorder()
    q = make(queues, 1, rec)
    q.debounce("ns/r", 0.0)
    q.debounce("ns/r", 0.3)  # the last ask decides
    q.add("ns/a", 0.0)
    q.add("ns/a", 0.3)  # the earlier one decides
    wait_until(lambda: rec.count("ns/a") == 1)
    assert rec.count("ns/r") == 0
    wait_until(lambda: rec.count("ns/r") == 1)


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


def test_a_failing_pass_does_not_kill_its_worker_and_without_a_backoff_is_not_retried(queues):
    seen: list[str] = []

    def process(key: str) -> float | None:
        seen.append(key)
        raise RuntimeError("boom")

    q = make(queues, 1, process)
    q.add("ns/a")
    q.add("ns/b")
    wait_until(lambda: seen == ["ns/a", "ns/b"])
    assert q.threads() == 1
    wait_until(lambda: q.running() == 0)
    assert q.queued() == 0


def test_a_pool_needs_a_worker():
    with pytest.raises(ValueError, match="at least one worker"):
        WorkQueue(lambda key: None, workers=0)


# --------------------------------------------------------------- the rules, on a fake clock

KEYS = ["a", "b", "c"]
DELAYS = [0.0, 0.5, 1.0, 2.0]
OPS = st.one_of(
    st.tuples(st.sampled_from(["add", "debounce"]), st.sampled_from(KEYS), st.sampled_from(DELAYS)),
    st.tuples(st.just("tick"), st.sampled_from([0.25, 0.5, 1.0, 3.0])),
    st.tuples(st.just("take")),
    st.tuples(st.just("finish"), st.integers(0, 3), st.sampled_from([None, 0.0, 1.0, "raise"])),
    st.tuples(st.just("forget"), st.sampled_from(KEYS)),
)


@given(st.lists(OPS, max_size=80))
@example([("add", "a", 0.0), ("take",), ("forget", "a"), ("finish", 0, "raise"), ("add", "a", 0.0)])
def test_every_key_asked_for_is_processed_after_its_last_ask_by_one_worker_at_a_time(ops):
    """Two workers on a fake clock, with asks, passes that end (requeue or not) or raise, and
    forgets in any order, then drained: no key is taken while it runs or while it backs off; a
    debounced key is not taken before it has been quiet for its delay; and every key asked for
    (and not forgotten since) is taken at least once after its last ask."""
    schedule: Schedule[str] = Schedule(Backoff(0.25, 2.0))
    workers, now, seq = 2, 0.0, 0
    running: list[str] = []
    last_ask: dict[str, int] = {}  # key -> seq of its last ask (dropped when forgotten)
    quiet_until: dict[str, float] = {}  # debounced (its last ask), not running then: not taken before
    backoff_until: dict[str, float] = {}  # its pass raised: not taken before
    forgotten: set[str] = set()  # forgotten while its pass ran: that pass's failure holds nothing back
    takes: list[tuple[str, int]] = []

    def take() -> None:
        nonlocal seq
        if len(running) >= workers:
            return
        key = schedule.take(now)
        if key is None:
            return
        seq += 1
        assert key not in running, f"{key} taken by a second worker"
        assert now >= quiet_until.pop(key, now), f"{key} taken at {now}, before it was quiet"
        assert now >= backoff_until.pop(key, now), f"{key} taken at {now}, before its backoff ended"
        running.append(key)
        takes.append((key, seq))

    def finish(key: str, outcome: float | str | None) -> None:
        running.remove(key)
        dropped = key in forgotten
        forgotten.discard(key)
        if outcome == "raise":
            retry = schedule.fail(key, now)
            assert retry is not None
            if not dropped:  # forget ends a key's backoff, the one its running pass earns too
                backoff_until[key] = now + retry[1]
            schedule.done(key, now, retry[1], failed=True)
        else:
            assert outcome is None or isinstance(outcome, float)
            schedule.done(key, now, outcome)

    for op in ops:
        seq += 1
        if op[0] in ("add", "debounce"):
            _, key, delay = op
            quiet_until.pop(key, None)  # the last ask decides
            if op[0] == "add":
                schedule.add(key, now + delay)
            else:
                schedule.debounce(key, now + delay)
                if key not in running:  # else the running pass may ask for an earlier requeue
                    quiet_until[key] = now + delay
            last_ask[key] = seq
        elif op[0] == "tick":
            now += op[1]
        elif op[0] == "take":
            take()
        elif op[0] == "finish" and running:
            finish(running[op[1] % len(running)], op[2])
        elif op[0] == "forget":
            schedule.forget(op[1])
            for kept in (last_ask, quiet_until, backoff_until):
                kept.pop(op[1], None)
            if op[1] in running:
                forgotten.add(op[1])
    for _ in range(1000):  # drain: every pass ends without a requeue
        while running:
            finish(running[0], None)
        due = schedule.next_due()
        if due is None:
            break
        now = max(now, due)
        take()
    assert schedule.queued() == 0 and schedule.running() == 0 and not schedule.keys()
    for key, asked in last_ask.items():
        assert any(k == key and at > asked for k, at in takes), f"{key} was never taken after its last ask"


@settings(max_examples=15)
@given(st.lists(st.tuples(st.sampled_from(["add", "debounce"]), st.sampled_from(KEYS),
                          st.sampled_from([0.0, 0.005, 0.02])), min_size=1, max_size=30))
def test_with_real_threads_every_key_is_processed_after_its_last_ask_by_one_worker_at_a_time(asks):
    """The same property with real threads: three callers ask at once, four workers take."""
    rec = Recorder(hold=0.002)
    q: WorkQueue[str] = WorkQueue(rec, workers=4)
    q.start()
    last: dict[str, float] = {}
    lock = threading.Lock()

    def ask(part: list[tuple[str, str, float]]) -> None:
        for how, key, delay in part:
            with lock:  # the asks in one order, each with its time (taken just before it)
                last[key] = time.monotonic()
                (q.add if how == "add" else q.debounce)(key, delay)

    callers = [threading.Thread(target=ask, args=(asks[i::3],)) for i in range(3)]
    try:
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        wait_until(lambda: q.queued() == 0 and q.running() == 0)
    finally:
        q.stop()
    assert rec.most_per_key == 1, "a key was processed by two workers at once"
    for key, asked in last.items():
        assert any(k == key and at >= asked for k, at in rec.passes), f"{key} not processed after its last ask"
