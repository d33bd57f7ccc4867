"""Few status writes (docs/concepts.md#the-rollbackrequests-status): the request's status is
written when a step ends (or the phase, an approval, a retry changes), not at once when steps only
start or hand over from their compensator to its check or read-back (engine/request_phase.py
``only_under_way``; written at the latest after ``STATUS_DEFER_SECONDS``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reversi.engine import executor as ex
from reversi.engine.request_phase import only_under_way


def entry(step, stage, attempts=1, reads=0, message="m"):
    return {"step": step, "stage": stage, "attempts": attempts, "reads": reads,
            "conditions": [{"type": "Compensated", "status": "Unknown", "message": message}]}


def status(*entries, phase="Running", progress="0/2", running="active steps: 0", runners=None):
    out = {"phase": phase, "progress": progress, "steps": list(entries),
           "conditions": [{"type": "Running", "status": "True", "reason": "InProgress", "message": running}]}
    if runners is not None:
        out["runners"] = runners
    return out


def test_a_hand_over_or_a_start_alone_is_not_written_at_once():
    old = status(entry(0, "compensating"), entry(1, "pending", 0))
    assert only_under_way(old, status(entry(0, "verifying", reads=1, message="checking"), entry(1, "pending", 0)))
    assert only_under_way(old, status(entry(0, "checking", message="check"), entry(1, "pending", 0)))
    # a start, with the active steps named in the Running condition's message
    assert only_under_way(old, status(entry(0, "verifying", reads=1), entry(1, "compensating"),
                                      running="active steps: 0, 1"))
    assert only_under_way(old, status(entry(0, "compensating"), entry(1, "prechecking")))
    assert only_under_way(old, old)


def test_anything_else_is_written():
    old = status(entry(0, "compensating"), entry(1, "pending", 0))
    # an outcome, a second read-back, a new attempt, a phase or other field change, an approval wait
    assert not only_under_way(old, status(entry(0, "compensated"), entry(1, "pending", 0)))
    assert not only_under_way(old, status(entry(0, "verifying", reads=2), entry(1, "pending", 0)))
    assert not only_under_way(old, status(entry(0, "verifying", attempts=2, reads=1), entry(1, "pending", 0)))
    assert not only_under_way(old, status(entry(0, "retrying"), entry(1, "pending", 0)))
    assert not only_under_way(old, status(entry(0, "verifying", reads=1), entry(1, "pending", 0), phase="X"))
    assert not only_under_way(old, status(entry(0, "verifying", reads=1), entry(1, "pending", 0), progress="1/2"))
    assert not only_under_way(old, status(entry(0, "compensating"), entry(1, "awaitingApproval", 0)))
    assert not only_under_way(old, status(entry(0, "compensating"), entry(1, "compensating"), runners=[{"name": "x"}]))
    changed = status(entry(0, "compensating"), entry(1, "pending", 0))
    changed["conditions"][0]["status"] = "False"
    assert not only_under_way(old, changed)
    assert not only_under_way({}, status(entry(0, "verifying", reads=1)))  # the first write always happens
    assert not only_under_way(status(entry(0, "verifying", reads=1)), status(entry(0, "compensating")))
    # an approved step starting is written (the approval wait ends)
    assert not only_under_way(status(entry(0, "awaitingApproval", 0)), status(entry(0, "compensating")))


STAGES = ["pending", "awaitingApproval", "prechecking", "compensating", "retrying", "checking", "verifying",
          "rereading", "compensated", "failed"]


@given(st.lists(st.tuples(st.sampled_from(STAGES), st.sampled_from(STAGES), st.integers(0, 2)), min_size=1,
                max_size=6))
def test_a_deferred_write_never_hides_an_outcome(changes):
    old = status(*[entry(i, a) for i, (a, _, _) in enumerate(changes)])
    new = status(*[entry(i, b, reads=r) for i, (_, b, r) in enumerate(changes)])
    if only_under_way(old, new):
        for a, b, r in changes:
            assert (a == b and r == 0) or (a in ("compensating", "checking") and b in ("checking", "verifying")) \
                or (a == "pending" and b in ex.SLOT_STAGES)
            assert b not in ex.FINAL_STAGES or a == b
