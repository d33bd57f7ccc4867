"""Issue 11, P4: the request's status is written when a step starts and ends, not at the hand-over
from its compensator to its check or read-back (handlers/reconciler.py ``only_hand_overs``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reversi.handlers.reconciler import only_hand_overs


def entry(step, stage, attempts=1, reads=0, message="m"):
    return {"step": step, "stage": stage, "attempts": attempts, "reads": reads,
            "conditions": [{"type": "Compensated", "status": "Unknown", "message": message}]}


def status(*entries, phase="Running", progress="0/2"):
    return {"phase": phase, "progress": progress, "steps": list(entries)}


def test_a_hand_over_alone_is_not_written():
    old = status(entry(0, "compensating"), entry(1, "pending", 0))
    assert only_hand_overs(old, status(entry(0, "verifying", reads=1, message="checking"), entry(1, "pending", 0)))
    assert only_hand_overs(old, status(entry(0, "checking", message="check"), entry(1, "pending", 0)))
    assert only_hand_overs(old, old)


def test_anything_else_is_written():
    old = status(entry(0, "compensating"), entry(1, "pending", 0))
    # an outcome, a start, a second read-back, a new attempt, a phase or other field change
    assert not only_hand_overs(old, status(entry(0, "compensated"), entry(1, "pending", 0)))
    assert not only_hand_overs(old, status(entry(0, "verifying", reads=1), entry(1, "compensating")))
    assert not only_hand_overs(old, status(entry(0, "verifying", reads=2), entry(1, "pending", 0)))
    assert not only_hand_overs(old, status(entry(0, "verifying", attempts=2, reads=1), entry(1, "pending", 0)))
    assert not only_hand_overs(old, status(entry(0, "verifying", reads=1), entry(1, "pending", 0), phase="X"))
    assert not only_hand_overs(old, status(entry(0, "verifying", reads=1), entry(1, "pending", 0), progress="1/2"))
    assert not only_hand_overs({}, status(entry(0, "verifying", reads=1)))  # the first write always happens
    assert not only_hand_overs(status(entry(0, "verifying", reads=1)), status(entry(0, "compensating")))


STAGES = ["pending", "compensating", "checking", "verifying", "rereading", "compensated", "failed"]


@given(st.lists(st.tuples(st.sampled_from(STAGES), st.sampled_from(STAGES), st.integers(0, 2)), min_size=1,
                max_size=6))
def test_a_skipped_write_never_hides_an_outcome_or_a_start(changes):
    old = status(*[entry(i, a) for i, (a, _, _) in enumerate(changes)])
    new = status(*[entry(i, b, reads=r) for i, (_, b, r) in enumerate(changes)])
    if only_hand_overs(old, new):
        for a, b, r in changes:
            assert (a == b and r == 0) or (a in ("compensating", "checking") and b in ("checking", "verifying"))
