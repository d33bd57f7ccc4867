"""How a RollbackRequest ends (reversi.engine.request_phase; docs/concepts.md#the-rollbackrequests-status):
phase, condition reasons, readiness, Event and metric verdict, for every combination."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reversi import conditions as cond
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
    assert _reasons(done)[cond.COMPLETE] == (cond.TRUE, cond.ALL_COMPENSATED)
    assert done.readiness[0] == cond.ALL_COMPENSATED
    nothing = _end(complete=True, compensates_nothing=True)
    assert _reasons(nothing)[cond.COMPLETE][1] == cond.NOTHING_TO_UNDO and nothing.readiness[0] == cond.NOTHING_TO_UNDO


def test_an_incomplete_rollback_says_partial_or_not_possible_and_stalls_on_incomplete_or_the_deadline():
    partial = _end(undone_some=True)
    assert (partial.phase, partial.event, partial.outcome) == ("Incomplete", "RollbackIncomplete", "incomplete")
    assert _reasons(partial)[cond.COMPLETE] == (cond.FALSE, cond.PARTIAL) and partial.readiness[0] == cond.INCOMPLETE
    assert _reasons(_end())[cond.COMPLETE][1] == cond.NOT_POSSIBLE
    assert _end(deadline_passed=True).readiness[0] == cond.DEADLINE_EXCEEDED


def test_cancelled_wins_and_the_verdict_names_who_cancelled():
    cancelled = _end(cancelling=True, cancelled_by="oncall", undone_some=True, deadline_passed=True)
    assert _reasons(cancelled)[cond.COMPLETE][1] == cond.CANCELLED and cancelled.readiness[0] == cond.CANCELLED
    assert cancelled.verdict == "cancelled by oncall: 1 failed (0)"
    assert (cancelled.event, cancelled.outcome) == ("RollbackCancelled", "cancelled")
    late = _end(cancelling=True, complete=True, verdict="complete")
    assert late.verdict == "cancelled by an unknown user; nothing was left to stop: complete"
    assert late.outcome == "complete" and _reasons(late)[cond.COMPLETE][1] == cond.ALL_COMPENSATED


def test_steps_still_awaiting_approval_are_named_before_the_verdict():
    late = _end(awaiting=[2, 3], deadline_passed=True)
    assert late.readiness == (cond.AWAITING_APPROVAL,
                              "steps [2, 3] were not approved before the deadline; 1 failed (0)")
    assert _reasons(late)[cond.AWAITING_APPROVAL] == (cond.FALSE, cond.AWAITING_APPROVAL)
    assert _reasons(_end(approve_all=True))[cond.AWAITING_APPROVAL] == (cond.FALSE, cond.APPROVED_FOR_ALL)
    assert _reasons(_end())[cond.AWAITING_APPROVAL] == (cond.FALSE, cond.NONE_AWAITING)


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
    assert _reasons(e)[cond.COMPLETE][0] == (cond.TRUE if complete else cond.FALSE)
    assert all(r in cond.REASONS for _, _, r, _ in e.conditions) and e.readiness[0] in cond.REASONS
    if complete:
        assert _reasons(e)[cond.COMPLETE][1] in (cond.ALL_COMPENSATED, cond.NOTHING_TO_UNDO)
    elif cancelling:
        assert _reasons(e)[cond.COMPLETE][1] == cond.CANCELLED
    assert e.warning == (not complete)
    assert (e.outcome == "cancelled") == (cancelling and not complete)
    assert e.readiness[0] == cond.AWAITING_APPROVAL if awaiting else e.readiness[0] != cond.AWAITING_APPROVAL
    assert e.verdict.endswith("1 failed (0)")


def _way(**kw):
    args = dict(running=False, awaiting=[], only_approvals_left=False, started_any=True, progress="1/3",
                active=[], busy_children=[], verdict="incomplete so far", approve_all=False)
    return under_way(**{**args, **kw})


def test_a_request_awaits_approval_only_when_nothing_else_can_start():
    waiting = _way(awaiting=[1], only_approvals_left=True)
    assert waiting.phase == "AwaitingApproval"
    assert waiting.readiness == (cond.AWAITING_APPROVAL, "steps [1] wait for approval (kubectl reversi approve, "
                                                      "or spec.approveCompensations)")
    assert _reasons(waiting)[cond.RUNNING] == (cond.FALSE, cond.AWAITING_APPROVAL)
    busy = _way(awaiting=[1], running=True, active=[0])
    assert busy.phase == "Running" and _reasons(busy)[cond.RUNNING] == (cond.TRUE, cond.IN_PROGRESS)
    assert busy.readiness == (cond.IN_PROGRESS, "1/3 compensated; active steps: [0]")


def test_running_false_says_why_nothing_runs_and_child_runs_are_named():
    assert _reasons(_way(started_any=False))[cond.RUNNING] == (cond.FALSE, cond.NOT_STARTED)
    assert _reasons(_way())[cond.RUNNING] == (cond.FALSE, cond.IDLE)
    child = _way(busy_children=[("child-a", "undo-child-a")])
    assert child.readiness[1] == ("1/3 compensated; active steps: none; child Run child-a is being rolled back by "
                                  "RollbackRequest undo-child-a")
    assert _reasons(_way(approve_all=True))[cond.AWAITING_APPROVAL] == (cond.FALSE, cond.APPROVED_FOR_ALL)
    assert _reasons(_way())[cond.COMPLETE] == (cond.FALSE, cond.IN_PROGRESS)


@given(running=st.booleans(), awaiting=st.lists(st.integers(0, 9), max_size=3), only=st.booleans(),
       started=st.booleans())
def test_every_request_under_way_is_consistent(running, awaiting, only, started):
    """AwaitingApproval is the phase exactly when steps await approval and nothing else can start;
    Running=True exactly when a Job runs; the reasons are in the closed set."""
    way = _way(running=running, awaiting=awaiting, only_approvals_left=only and not running, started_any=started)
    assert (way.phase == "AwaitingApproval") == bool(awaiting and only and not running)
    assert (_reasons(way)[cond.RUNNING][0] == cond.TRUE) == running
    assert all(r in cond.REASONS for _, _, r, _ in way.conditions) and way.readiness[0] in cond.REASONS


def test_a_dry_run_and_a_waiting_request_say_what_they_are():
    from reversi.engine.request_phase import dry_run, planned, waiting

    assert dry_run().phase == "Planned" and dry_run().readiness[0] == cond.PLAN_READY
    said = waiting("shop", "undo-a", "order-9")
    assert said.phase == "Waiting" and said.readiness == (
        cond.WAITING_FOR_RUN,
        "RollbackRequest shop/undo-a is working on Run shop/order-9; this one starts when it ends")
    assert planned(2, False)[1] == (cond.PLANNED, cond.TRUE, cond.PLAN_READY,
                                    "2 compensations planned; fullyReversible=false")


# ---------------------------------------------------------------- every phase, its readiness, the pass's end

def _all_phases():
    from reversi.engine.request_phase import (cancelled_before_planning, dry_run, failed, run_missing,
                                              waiting)

    return [dry_run(), run_missing("Run shop/r not found"), failed(cond.RUN_NOT_FOUND, "fix spec.runRef.name"),
            cancelled_before_planning("oncall", "its Run shop/r does not exist"), waiting("shop", "a", "r"),
            _way(), _way(awaiting=[1], only_approvals_left=True), _end(complete=True), _end()]


def test_every_phase_sets_its_readiness_from_the_phase_alone():
    """Ready when Planned or Succeeded, Stalled when Incomplete or Failed, Reconciling otherwise
    (kstatus; docs/concepts.md#the-rollbackrequests-status): one rule for every phase a request
    can say, including those of a request that never planned."""
    kstatus = {"Planned": cond.READY, "Succeeded": cond.READY, "Incomplete": cond.STALLED, "Failed": cond.STALLED,
               "Pending": cond.RECONCILING, "Waiting": cond.RECONCILING, "Running": cond.RECONCILING,
               "AwaitingApproval": cond.RECONCILING}
    for said in _all_phases():
        updates = {t: (s, r, m) for t, s, r, m in said.updates()}
        true = [t for t in (cond.READY, cond.RECONCILING, cond.STALLED) if updates[t][0] == cond.TRUE]
        assert true == [kstatus[said.phase]], said
        assert updates[kstatus[said.phase]][1:] == said.readiness
        assert all(r in cond.REASONS for _, _, r, _ in said.updates()), said


def test_a_request_that_cannot_be_carried_out_fails_with_invalid_and_a_warning():
    from reversi.engine.request_phase import failed

    said = failed(cond.MANIFEST_NOT_FOUND, "ToolManifest shop/tools not found; create it again")
    assert (said.phase, said.event, said.warning, said.outcome) == ("Failed", cond.MANIFEST_NOT_FOUND, True, "invalid")
    assert _reasons(said)[cond.INVALID] == (cond.TRUE, cond.MANIFEST_NOT_FOUND)
    assert _reasons(said)[cond.COMPLETE] == (cond.FALSE, cond.MANIFEST_NOT_FOUND)
    assert said.verdict == "ToolManifest shop/tools not found; create it again"


def test_a_request_cancelled_before_it_planned_names_who_and_why_and_undid_nothing():
    from reversi.engine.request_phase import cancelled_before_planning

    said = cancelled_before_planning(None, "its Run shop/r does not exist")
    assert (said.phase, said.event, said.outcome, said.warning) == ("Incomplete", "RollbackCancelled", "cancelled",
                                                                    True)
    assert said.verdict == ("cancelled by an unknown user before anything was planned (its Run shop/r does not "
                            "exist): nothing was undone")
    assert _reasons(said)[cond.COMPLETE] == (cond.FALSE, cond.CANCELLED) and said.readiness[0] == cond.CANCELLED


@given(finished=st.booleans(), awaiting=st.lists(st.integers(0, 9), max_size=3), deadline_passed=st.booleans())
def test_a_request_ends_when_nothing_can_move_unless_a_person_may_still_approve(finished, awaiting, deadline_passed):
    from reversi.engine.request_phase import ends

    said = ends(finished=finished, awaiting=awaiting, deadline_passed=deadline_passed)
    assert said == (finished and (not awaiting or deadline_passed))


def test_the_next_pass_comes_at_the_tick_or_later_while_awaiting_approval_and_a_recount_wins():
    from reversi.engine.request_phase import next_pass

    assert next_pass("Running", tick_seconds=1.0, wait_seconds=5.0) == 1.0
    assert next_pass("AwaitingApproval", tick_seconds=1.0, wait_seconds=5.0) == 5.0
    assert next_pass("AwaitingApproval", tick_seconds=1.0, wait_seconds=5.0, late=0.3) == 0.3


def test_a_status_with_only_steps_under_way_may_wait_at_most_the_defer_window():
    from reversi.engine.request_phase import STATUS_DEFER_SECONDS, may_defer_write

    old = {"phase": "Running", "steps": [{"step": 0, "stage": "pending", "attempts": 0}]}
    started = {"phase": "Running", "steps": [{"step": 0, "stage": "compensating", "attempts": 1}]}
    assert may_defer_write(old, started, None, 100.0)
    assert may_defer_write(old, started, 100.0, 100.0 + STATUS_DEFER_SECONDS - 0.1)
    assert not may_defer_write(old, started, 100.0, 100.0 + STATUS_DEFER_SECONDS)
    ended = {"phase": "Running", "steps": [{"step": 0, "stage": "compensated", "attempts": 1}]}
    assert not may_defer_write(old, ended, None, 100.0)


def test_a_request_already_waiting_for_the_same_holder_skips_planning_and_any_change_plans_again():
    """A Waiting request whose stored status names the lock's holder now ends its pass before it
    plans (rule 6); a new generation of its spec, another holder or another phase plans again."""
    from reversi.adapters.status import summary_conditions
    from reversi.engine.request_phase import already_waiting, waiting

    said = waiting("shop", "undo-a", "order-9")
    status = {"phase": "Waiting", "observedGeneration": 2, "conditions": summary_conditions([], 2, said.updates())}
    assert already_waiting(status, 2, "shop", "undo-a", "order-9")
    assert not already_waiting(status, 3, "shop", "undo-a", "order-9")
    assert not already_waiting(status, 2, "shop", "undo-b", "order-9")
    assert not already_waiting(status, 2, "shop", "undo-a", "child-1")
    assert not already_waiting({**status, "phase": "Running"}, 2, "shop", "undo-a", "order-9")
