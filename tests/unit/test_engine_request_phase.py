"""How a RollbackRequest ends (reversi.engine.request_phase; docs/concepts.md#the-rollbackrequests-status):
phase, condition reasons, readiness, Event and metric verdict, for every combination."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reversi import conditions as c
from reversi.engine.request_phase import ending, under_way


def _end(**kw):
    args = dict(complete=False, verdict="1 failed (0)", undone_some=False, compensates_nothing=False,
                deadline_passed=False, cancelled_by=None, cancelling=False, awaiting=[], approve_all=False)
    return ending(**{**args, **kw})


def _reasons(e) -> dict[str, tuple[str, str]]:
    return {t: (s, r) for t, s, r, _ in e.conditions}


def test_a_complete_rollback_succeeds_and_says_whether_there_was_anything_to_undo():
    done = _end(complete=True, verdict="complete: 2 compensated (0, 1)")
    assert (done.phase, done.event, done.outcome, done.warning) == ("Succeeded", "RollbackComplete", "complete", False)
    assert _reasons(done)[c.COMPLETE] == (c.TRUE, c.ALL_COMPENSATED) and done.readiness[0] == c.ALL_COMPENSATED
    nothing = _end(complete=True, compensates_nothing=True)
    assert _reasons(nothing)[c.COMPLETE][1] == c.NOTHING_TO_UNDO and nothing.readiness[0] == c.NOTHING_TO_UNDO


def test_an_incomplete_rollback_says_partial_or_not_possible_and_stalls_on_incomplete_or_the_deadline():
    partial = _end(undone_some=True)
    assert (partial.phase, partial.event, partial.outcome) == ("Incomplete", "RollbackIncomplete", "incomplete")
    assert _reasons(partial)[c.COMPLETE] == (c.FALSE, c.PARTIAL) and partial.readiness[0] == c.INCOMPLETE
    assert _reasons(_end())[c.COMPLETE][1] == c.NOT_POSSIBLE
    assert _end(deadline_passed=True).readiness[0] == c.DEADLINE_EXCEEDED


def test_cancelled_wins_and_the_verdict_names_who_cancelled():
    cancelled = _end(cancelling=True, cancelled_by="oncall", undone_some=True, deadline_passed=True)
    assert _reasons(cancelled)[c.COMPLETE][1] == c.CANCELLED and cancelled.readiness[0] == c.CANCELLED
    assert cancelled.verdict == "cancelled by oncall: 1 failed (0)"
    assert (cancelled.event, cancelled.outcome) == ("RollbackCancelled", "cancelled")
    late = _end(cancelling=True, complete=True, verdict="complete")
    assert late.verdict == "cancelled by an unknown user; nothing was left to stop: complete"
    assert late.outcome == "complete" and _reasons(late)[c.COMPLETE][1] == c.ALL_COMPENSATED


def test_steps_still_awaiting_approval_are_named_before_the_verdict():
    late = _end(awaiting=[2, 3], deadline_passed=True)
    assert late.readiness == (c.AWAITING_APPROVAL,
                              "steps [2, 3] were not approved before the deadline; 1 failed (0)")
    assert _reasons(late)[c.AWAITING_APPROVAL] == (c.FALSE, c.AWAITING_APPROVAL)
    assert _reasons(_end(approve_all=True))[c.AWAITING_APPROVAL] == (c.FALSE, c.APPROVED_FOR_ALL)
    assert _reasons(_end())[c.AWAITING_APPROVAL] == (c.FALSE, c.NONE_AWAITING)


@given(complete=st.booleans(), undone_some=st.booleans(), compensates_nothing=st.booleans(),
       deadline_passed=st.booleans(), cancelling=st.booleans(), awaiting=st.lists(st.integers(0, 9), max_size=3),
       approve_all=st.booleans())
def test_every_ending_is_consistent(complete, undone_some, compensates_nothing, deadline_passed, cancelling,
                                    awaiting, approve_all):
    """Whatever the pass found: the phase follows the report; Complete's status follows it too;
    every reason is one of the closed set; a complete request never stalls on Cancelled or the
    deadline; the Event is a Warning exactly when the report is incomplete; the metric's verdict
    is cancelled only for a cancelled, incomplete request."""
    e = _end(complete=complete, undone_some=undone_some, compensates_nothing=compensates_nothing,
             deadline_passed=deadline_passed, cancelling=cancelling, cancelled_by="x", awaiting=awaiting,
             approve_all=approve_all)
    assert e.phase == ("Succeeded" if complete else "Incomplete")
    assert _reasons(e)[c.COMPLETE][0] == (c.TRUE if complete else c.FALSE)
    assert all(r in c.REASONS for _, _, r, _ in e.conditions) and e.readiness[0] in c.REASONS
    if complete:
        assert _reasons(e)[c.COMPLETE][1] in (c.ALL_COMPENSATED, c.NOTHING_TO_UNDO)
    elif cancelling:
        assert _reasons(e)[c.COMPLETE][1] == c.CANCELLED
    assert e.warning == (not complete)
    assert (e.outcome == "cancelled") == (cancelling and not complete)
    assert e.readiness[0] == c.AWAITING_APPROVAL if awaiting else e.readiness[0] != c.AWAITING_APPROVAL
    assert e.verdict.endswith("1 failed (0)")


def _way(**kw):
    args = dict(running=False, awaiting=[], only_approvals_left=False, started_any=True, progress="1/3",
                active=[], busy_children=[], verdict="incomplete so far", approve_all=False)
    return under_way(**{**args, **kw})


def test_a_request_awaits_approval_only_when_nothing_else_can_start():
    waiting = _way(awaiting=[1], only_approvals_left=True)
    assert waiting.phase == "AwaitingApproval"
    assert waiting.readiness == (c.AWAITING_APPROVAL, "steps [1] wait for approval (kubectl reversi approve, "
                                                      "or spec.approveCompensations)")
    assert _reasons(waiting)[c.RUNNING] == (c.FALSE, c.AWAITING_APPROVAL)
    busy = _way(awaiting=[1], running=True, active=[0])
    assert busy.phase == "Running" and _reasons(busy)[c.RUNNING] == (c.TRUE, c.IN_PROGRESS)
    assert busy.readiness == (c.IN_PROGRESS, "1/3 compensated; active steps: [0]")


def test_running_false_says_why_nothing_runs_and_child_runs_are_named():
    assert _reasons(_way(started_any=False))[c.RUNNING] == (c.FALSE, c.NOT_STARTED)
    assert _reasons(_way())[c.RUNNING] == (c.FALSE, c.IDLE)
    child = _way(busy_children=[("child-a", "undo-child-a")])
    assert child.readiness[1] == ("1/3 compensated; active steps: none; child Run child-a is being rolled back by "
                                  "RollbackRequest undo-child-a")
    assert _reasons(_way(approve_all=True))[c.AWAITING_APPROVAL] == (c.FALSE, c.APPROVED_FOR_ALL)
    assert _reasons(_way())[c.COMPLETE] == (c.FALSE, c.IN_PROGRESS)


@given(running=st.booleans(), awaiting=st.lists(st.integers(0, 9), max_size=3), only=st.booleans(),
       started=st.booleans())
def test_every_request_under_way_is_consistent(running, awaiting, only, started):
    """AwaitingApproval is the phase exactly when steps await approval and nothing else can start;
    Running=True exactly when a Job runs; the reasons are in the closed set."""
    way = _way(running=running, awaiting=awaiting, only_approvals_left=only and not running, started_any=started)
    assert (way.phase == "AwaitingApproval") == bool(awaiting and only and not running)
    assert (_reasons(way)[c.RUNNING][0] == c.TRUE) == running
    assert all(r in c.REASONS for _, _, r, _ in way.conditions) and way.readiness[0] in c.REASONS


def test_a_dry_run_and_a_waiting_request_say_what_they_are():
    from reversi.engine.request_phase import dry_run, planned, waiting

    assert dry_run().phase == "Planned" and dry_run().readiness[0] == c.PLAN_READY
    said = waiting("shop", "undo-a", "order-9")
    assert said.phase == "Waiting" and said.readiness == (
        c.WAITING_FOR_RUN, "RollbackRequest shop/undo-a is working on Run shop/order-9; this one starts when it ends")
    assert planned(2, False)[1] == (c.PLANNED, c.TRUE, c.PLAN_READY, "2 compensations planned; fullyReversible=false")
