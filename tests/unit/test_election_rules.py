"""Leader election's rules (docs/operations.md#leader-election): the pure decisions of
reversi.engine.election, and the candidate (reversi.handlers.leader.Leader) over an in-memory
Lease with a fake clock: at no moment do two replicas act, a stopped holder stops acting before
another takes over, and a released Lease is taken at the standby's next look."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reversi.adapters.lease import Fence, LeaseConflict, NotLeading, record_of, spec_of
from reversi.engine import election as el
from reversi.handlers.leader import Leader

T = el.Timings()
UTC0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_timings_default_to_client_go_and_must_be_ordered():
    assert (T.lease, T.renew_deadline, T.retry) == (15.0, 10.0, 2.0)
    for bad in ((10, 10, 2), (15, 10, 10), (15, 10, 0), (5, 10, 2)):
        with pytest.raises(ValueError):
            el.Timings(*bad)


def test_no_lease_is_created_and_the_holder_renews():
    assert el.decide("a", None, 0.0) is el.Action.CREATE
    held = el.observe(None, el.Record(holder="a", duration=15), 0.0)
    assert el.decide("a", held, 100.0) is el.Action.RENEW


def test_another_holder_is_waited_for_until_its_lease_ran_out_on_our_clock():
    seen = el.observe(None, el.Record(holder="b", duration=15, renewed=UTC0), 100.0)
    assert el.decide("a", seen, 114.9) is el.Action.WAIT
    assert el.decide("a", seen, 115.0) is el.Action.TAKE
    # the same record read again keeps its clock; a renewal (a new record) restarts it
    assert el.observe(seen, el.Record(holder="b", duration=15, renewed=UTC0), 110.0) is seen
    renewed = el.observe(seen, el.Record(holder="b", duration=15, renewed=UTC0 + dt.timedelta(seconds=2)), 110.0)
    assert el.decide("a", renewed, 115.0) is el.Action.WAIT


def test_a_released_lease_is_taken_at_once():
    released = el.released(el.Record(holder="b", duration=15, acquired=UTC0, renewed=UTC0, transitions=3),
                           UTC0 + dt.timedelta(seconds=5))
    assert released.holder is None and released.duration == el.RELEASED_LEASE_SECONDS
    assert released.transitions == 3
    assert el.decide("a", el.observe(None, released, 0.0), 0.0) is el.Action.TAKE


def test_the_holder_acts_only_within_the_renew_deadline():
    assert not el.acting(None, 5.0, T)
    assert el.acting(100.0, 109.99, T)
    assert not el.acting(100.0, 110.0, T)
    assert not el.acting(100.0, 99.0, T)  # a clock that went backwards is not trusted


def test_written_records_keep_the_acquire_time_and_count_transitions():
    created = el.written("a", el.Action.CREATE, None, UTC0, T)
    assert (created.holder, created.duration, created.transitions) == ("a", 15, 0)
    later = UTC0 + dt.timedelta(seconds=2)
    renewed = el.written("a", el.Action.RENEW, created, later, T)
    assert (renewed.acquired, renewed.renewed, renewed.transitions) == (UTC0, later, 0)
    taken = el.written("b", el.Action.TAKE, renewed, later, T)
    assert (taken.holder, taken.acquired, taken.transitions) == ("b", later, 1)
    with pytest.raises(ValueError):
        el.written("a", el.Action.WAIT, created, later, T)


@given(lease=st.floats(2.0, 100.0), deadline_share=st.floats(0.1, 0.95), seen=st.floats(0, 1e6),
       renew_began=st.floats(0, 1e6), later=st.floats(0, 200))
def test_the_holder_stops_acting_before_a_standby_may_take_over(lease, deadline_share, seen, renew_began, later):
    """The rule the fence rests on: a standby saw the renewal land after it began, so when the
    standby may take (``seen + lease``), the holder's renew deadline has passed."""
    timings = el.Timings(lease=lease, renew_deadline=lease * deadline_share, retry=lease * deadline_share / 2)
    seen = max(seen, renew_began)  # a renewal is seen after it began
    now = seen + later
    observed = el.Observed(el.Record(holder="b", duration=int(-(-lease // 1))), seen)
    if el.decide("a", observed, now) is el.Action.TAKE:
        assert not el.acting(renew_began, now, timings)


def test_lease_records_round_trip_through_the_api_shape():
    record = el.Record(holder="a", duration=15, acquired=UTC0, renewed=UTC0 + dt.timedelta(microseconds=5),
                       transitions=2)
    assert record_of({"spec": spec_of(record)}) == record
    assert spec_of(el.released(record, UTC0))["holderIdentity"] is None


# ---------------------------------------------------------------- the candidate, on an in-memory Lease

class MemoryLock:
    """A Lease in memory with resourceVersions (the API server's optimistic concurrency)."""

    namespace, name = "ns", "reversi-operator"

    def __init__(self) -> None:
        self.record: el.Record | None = None
        self.version = 0

    def read(self):
        return (self.record, str(self.version)) if self.record is not None else None

    def create(self, record):
        if self.record is not None:
            raise LeaseConflict("exists")
        self.record, self.version = record, self.version + 1

    def replace(self, record, resource_version):
        if self.record is None or resource_version != str(self.version):
            raise LeaseConflict("changed")
        self.record, self.version = record, self.version + 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def utc(self) -> dt.datetime:
        return UTC0 + dt.timedelta(seconds=self.now)


def _pair(lock=None, clock=None):
    lock, clock = lock or MemoryLock(), clock or Clock()
    started: list[str] = []
    a, b = (Leader(lock, name, T, clock=clock, utc=clock.utc, on_started=lambda n=name: started.append(n))
            for name in ("a", "b"))
    return lock, clock, a, b, started


def test_one_candidate_acts_and_the_other_waits():
    _lock, clock, a, b, _ = _pair()
    assert a.attempt() is True and a.acting()
    assert b.attempt() is False and not b.acting() and b.holder() == "a"
    clock.now += T.retry
    assert a.attempt() is False and a.acting()  # renewed: no second start


def test_a_killed_holder_is_replaced_after_the_lease_and_a_paused_one_never_acts_again():
    """SIGKILL: the holder stops renewing; the standby takes over once the lease ran out on its
    own clock. SIGSTOP past the lease then SIGCONT: the resumed holder's deadline has passed, it
    does not act, and its next attempt finds the other holder."""
    _lock, clock, a, b, _ = _pair()
    a.attempt()
    b.attempt()
    for _ in range(7):  # a is silent (killed or stopped) for 14 s: b waits
        clock.now += T.retry
        assert b.attempt() is False
    assert not a.acting()  # past its renew deadline already
    clock.now += T.retry
    assert b.attempt() is True and b.acting()
    assert not a.acting()  # a resumes: it does not act
    assert a.attempt() is False and not a.acting() and a.holder() == "b"


def test_a_release_closes_the_fence_and_the_standby_takes_over_at_its_next_look():
    lock, clock, a, b, _ = _pair()
    a.attempt()
    b.attempt()
    a.release()
    assert not a.acting() and lock.record.holder is None and lock.record.duration == 1
    clock.now += T.retry
    assert b.attempt() is True
    assert a.attempt() is False and lock.record.holder == "b"  # a stopping replica never takes it back


def test_a_restarted_replica_with_the_same_name_takes_its_lease_back_at_once():
    """A pod's container restarted by the kubelet keeps the pod's name (the holder identity)."""
    lock, clock, a, _, _ = _pair()
    a.attempt()
    again = Leader(lock, "a", T, clock=clock, utc=clock.utc)
    assert again.attempt() is True


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.floats(0.0, 20.0), st.sampled_from(["attempt", "release"])),
                min_size=1, max_size=60))
def test_two_candidates_never_act_at_once(schedule):
    """Any interleaving of attempts, silences (a kill or a SIGSTOP is a candidate that makes no
    attempt for a while) and releases: at no moment do both act."""
    _lock, clock, a, b, _ = _pair()
    who = {"a": a, "b": b}
    for name, wait, what in schedule:
        clock.now += wait
        assert not (a.acting() and b.acting())
        if what == "release" and wait > 15:
            who[name].release()
        else:
            who[name].attempt()
        assert not (a.acting() and b.acting())


class _Rest:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def request(self, method, url, *args, **kwargs):
        self.sent.append(method)
        return "answer"


class _Api:
    def __init__(self) -> None:
        self.rest_client = _Rest()


def test_the_fence_refuses_writes_unless_acting_and_lets_reads_through():
    acting = [False]
    api = _Api()
    inner = api.rest_client
    fence = Fence(lambda: acting[0])
    fence.wrap(api)
    assert api.rest_client.request("GET", "/apis/x") == "answer"
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        with pytest.raises(NotLeading):
            api.rest_client.request(method, "/apis/x?dryRun=All")
    acting[0] = True
    assert api.rest_client.request("POST", "/apis/x") == "answer"
    assert inner.sent == ["GET", "POST"] and fence.drained(0.1)


def test_the_leader_gauge_names_the_identity():
    from reversi.metrics import Metrics

    metrics = Metrics()
    lock, clock = MemoryLock(), Clock()
    a = Leader(lock, "pod-a", T, metrics=metrics, clock=clock, utc=clock.utc)
    value = lambda: metrics.registry.get_sample_value("reversi_leader", {"identity": "pod-a"})  # noqa: E731
    assert value() == 0
    a.attempt()
    assert value() == 1
    a.release()
    assert value() == 0


def test_a_watched_renewal_starts_the_standbys_clock_and_the_next_attempt_comes_at_expiry():
    """The Lease watch notes a renewal when it lands: the standby's next attempt is due when that
    lease runs out (sooner than a retry period when it is close), and a release wakes it at once."""
    lock, clock, a, b, _ = _pair()
    woken: list[bool] = []
    b._wake = lambda: woken.append(True)
    a.attempt()
    assert b.next_attempt() == T.retry  # nothing observed yet
    b.seen(lock.record)
    clock.now += 14.5
    assert b.next_attempt() == pytest.approx(0.51)
    assert b.attempt() is False  # the read finds the same record: its clock started at the watch event
    clock.now += 0.51
    assert b.attempt() is True
    a.attempt()
    b.release()
    assert not woken
    a.seen(lock.record)
    a._wake = lambda: woken.append(True)
    a.seen(lock.record)
    assert woken == [True]
