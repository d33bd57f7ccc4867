"""The archive's finalizer (docs/operations.md#a-run-deleted-by-hand): one test per case of the
pure decision, a hypothesis property over every combination, the Run's facts that carry it, and
the pace of the controller's writes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reversi.engine import archive as records
from reversi.engine import retention as rules
from reversi.handlers.finalizer import Slots

FOREIGN = "example.com/keep"


def _step(archive_on: bool, deleting: bool, *finalizers: str) -> str:
    return records.finalizer_step(archive_on=archive_on, deleting=deleting, finalizers=finalizers)


def test_archive_on_a_run_without_the_finalizer_gets_it():
    assert _step(True, False) == records.ADD
    assert _step(True, False, FOREIGN) == records.ADD


def test_archive_on_a_run_with_the_finalizer_is_left_alone_until_it_is_deleted():
    assert _step(True, False, records.FINALIZER) == records.NOTHING


def test_archive_on_a_run_deleted_by_hand_is_archived_before_its_finalizer_goes():
    assert _step(True, True, records.FINALIZER) == records.ARCHIVE
    assert _step(True, True, FOREIGN, records.FINALIZER) == records.ARCHIVE


def test_archive_on_a_run_deleted_without_the_finalizer_is_not_the_operators_to_keep():
    assert _step(True, True) == records.NOTHING
    assert _step(True, True, FOREIGN) == records.NOTHING


def test_archive_off_the_finalizer_is_removed_at_once_deleted_or_not():
    assert _step(False, False, records.FINALIZER) == records.REMOVE
    assert _step(False, True, records.FINALIZER) == records.REMOVE
    assert _step(False, True, FOREIGN, records.FINALIZER) == records.REMOVE


def test_archive_off_a_run_without_the_finalizer_is_left_alone():
    assert _step(False, False) == records.NOTHING
    assert _step(False, True, FOREIGN) == records.NOTHING


@given(st.booleans(), st.booleans(), st.lists(st.sampled_from([records.FINALIZER, FOREIGN, "foregroundDeletion"]),
                                              max_size=3, unique=True))
def test_property_the_archive_off_never_keeps_a_run_and_on_never_lets_one_go_unwritten(archive_on, deleting,
                                                                                        finalizers):
    step = _step(archive_on, deleting, *finalizers)
    held = records.FINALIZER in finalizers
    if not archive_on:  # turning the archive off never leaves a Run undeletable
        assert step in (records.REMOVE, records.NOTHING) and (step == records.REMOVE) == held
    elif deleting and held:  # the finalizer goes only with the record written
        assert step == records.ARCHIVE
    else:
        assert step in (records.ADD, records.NOTHING) and (step == records.ADD) == (not held and not deleting)
    after = records.with_finalizer(finalizers) if step == records.ADD else (
        records.without_finalizer(finalizers) if step in (records.REMOVE, records.ARCHIVE) else list(finalizers))
    assert [f for f in after if f != records.FINALIZER] == [f for f in finalizers if f != records.FINALIZER]
    assert after.count(records.FINALIZER) <= 1


def test_the_finalizer_is_added_once_and_others_keep_their_order():
    assert records.with_finalizer([FOREIGN]) == [FOREIGN, records.FINALIZER]
    assert records.with_finalizer([records.FINALIZER, FOREIGN]) == [FOREIGN, records.FINALIZER]
    assert records.without_finalizer([records.FINALIZER, FOREIGN]) == [FOREIGN]


def test_the_runs_facts_carry_its_finalizers():
    run = {"metadata": {"name": "r", "namespace": "shop", "uid": "u", "resourceVersion": "3",
                        "finalizers": [records.FINALIZER], "deletionTimestamp": "2026-03-01T00:00:00Z"},
           "spec": {"manifestRef": {"name": "m"}}}
    facts = rules.facts_of(run)
    assert facts.finalizers == (records.FINALIZER,) and facts.deleting
    assert rules.facts_of({"metadata": {"name": "r", "namespace": "shop"}}).finalizers == ()


def test_a_failed_write_says_why_the_run_is_still_there():
    by_hand = records.failure_message(records.DELETED, "unreachable", "connection refused")
    assert "not deleted yet" in by_hand and "(unreachable): connection refused" in by_hand
    assert records.FINALIZER in by_hand and "tried again with backoff" in by_hand
    expired = records.failure_message(records.EXPIRED, "auth", "password authentication failed")
    assert expired.startswith("not deleted: ") and "retention tries again with backoff" in expired


def test_paced_turns_are_one_per_key_and_kept_until_the_key_comes_back():
    now = [100.0]
    slots = Slots(10.0, clock=lambda: now[0])
    assert slots.wait("a") == 0.0  # the first is now
    assert slots.wait("b") == pytest.approx(0.1) and slots.wait("c") == pytest.approx(0.2)
    assert slots.wait("b") == pytest.approx(0.1), "asked again early: the same turn, no new one"
    now[0] += 0.1
    assert slots.wait("b") == 0.0 and slots.wait("c") == pytest.approx(0.1)
    slots.forget("c")
    now[0] += 60  # idle: the next one is now again
    assert slots.wait("d") == 0.0 and slots.wait("e") == pytest.approx(0.1)


@given(st.lists(st.integers(0, 9), min_size=1, max_size=60))
def test_property_paced_turns_never_come_faster_than_the_rate(keys):
    now = [0.0]
    slots = Slots(20.0, clock=lambda: now[0])
    used = []
    for key in keys:
        if slots.wait(key) == 0.0:
            used.append(now[0])
        now[0] += 0.01
    # by any moment t, at most 1 + 20 t turns were used (a key that comes back late uses an older turn)
    assert all(n <= 1 + 20.0 * at + 1e-9 for n, at in enumerate(used, 1))
