"""Cancel and delete (rules 13, 14) in the engine: a cancelled request starts no new Job
(Policy.stop), records the running one's true outcome, cancels what did not start; an undo left in
flight by a deleted request is settled from its Job (engine/orphans.py)."""

from __future__ import annotations

from reversi.engine import executor as ex
from reversi.engine.orphans import settle
from reversi.models.run import StepUndo

STOP = "the request was cancelled by oncall"
CANCELLED = ex.Policy(retries=3, base_ms=10, max_ms=20, stop=STOP)
READER = ex.VerifyPlan("reader", tool="get", args={}, expect={"ok": True}, runner="tools", retries=3)


_ROLE_OF_STAGE = {"compensating": "compensator", "checking": "check", "verifying": "reader", "rereading": "reader"}


def _advance(run, view, verify=READER, policy=CANCELLED):
    """``view`` is the Job of the step's current stage; the next stage's Job does not exist yet."""
    role = _ROLE_OF_STAGE.get(run.stage)
    return ex.advance(run, lambda r, attempt, read: view if r == role else None, verify, policy, now=100.0)


def test_cancel_a_failed_attempt_is_not_retried():
    run = ex.StepRun(0, stage="compensating", attempts=1, first_attempt=1)
    new, effects = _advance(run, ex.JobView("failed", "502"))
    assert new.stage == "failed" and "not retried: " + STOP in new.error
    assert not any(isinstance(e, ex.StartJob) for e in effects)


def test_cancel_a_successful_undo_starts_no_read_back_and_is_unverified():
    run = ex.StepRun(0, stage="compensating", attempts=1, first_attempt=1)
    new, effects = _advance(run, ex.JobView("succeeded"))
    assert (new.stage, new.verification, new.reason) == ("compensated", "unverified", "Cancelled")
    assert [e for e in effects if isinstance(e, ex.Journal)] == [ex.Journal(0, "compensated", 1, "unverified")]
    assert not any(isinstance(e, ex.StartJob) for e in effects)


def test_cancel_with_no_read_back_declared_is_compensated_as_usual():
    run = ex.StepRun(0, stage="compensating", attempts=1, first_attempt=1)
    new, _ = _advance(run, ex.JobView("succeeded"), verify=ex.VerifyPlan("none"))
    assert (new.stage, new.verification) == ("compensated", "none")


def test_cancel_a_running_read_back_finishes_and_a_mismatch_is_not_read_again():
    run = ex.StepRun(0, stage="verifying", attempts=1, reads=1, first_attempt=1)
    new, effects = _advance(run, ex.JobView("succeeded", output='{"ok": false}'))
    assert new.stage == "failed" and new.verification == "verificationFailed"
    assert not any(isinstance(e, ex.StartJob) for e in effects)
    ok, _ = _advance(run, ex.JobView("succeeded", output='{"ok": true}'))
    assert ok.stage == "compensated" and ok.verification == "verified"


def test_cancel_marks_only_unstarted_steps_cancelled():
    assert ex.cancel(ex.StepRun(0), STOP).stage == "cancelled"
    assert ex.cancel(ex.StepRun(0, stage="awaitingApproval"), STOP).stage == "cancelled"
    denied = ex.StepRun(0, stage="awaitingApproval", reason="Denied", error="denied by x: no")
    assert ex.cancel(denied, STOP) == denied
    for stage in ("compensating", "checking", "verifying", "compensated", "failed"):
        run = ex.StepRun(0, stage=stage, attempts=1)
        assert ex.cancel(run, STOP) == run
    assert ex.schedule_state("cancelled") == "cancelled"


KEY = "a" * 64
LEFT = StepUndo(step=3, state="compensating", attempts=2, idempotency_key=KEY, request="gone")


def test_orphan_settled_from_its_job():
    now = "2025-01-01T00:00:00Z"
    done = settle(LEFT, request="gone", attempt=2, job=ex.JobView("succeeded"), readback_declared=True, now=now)
    assert (done.state, done.verification, done.attempts, done.request) == ("compensated", "unverified", 2, "gone")
    none = settle(LEFT, request="gone", attempt=2, job=ex.JobView("succeeded"), readback_declared=False, now=now)
    assert none.verification == "none"
    failed = settle(LEFT, request="gone", attempt=2, job=ex.JobView("failed", "boom"), readback_declared=True, now=now)
    assert not failed.effect_unknown  # its program answered: the effect may remain (residue failed)
    evicted = ex.JobView("failed", "evicted", lost=True, effect_unknown=True)
    stopped = settle(LEFT, request="gone", attempt=2, job=evicted, readback_declared=True, now=now)
    # stopped mid-call with no answer of its own: nobody knows (residue unknown, docs/concepts.md#the-report)
    assert stopped.state == "compensationFailed" and stopped.effect_unknown
    # a compensator that never ran tells nothing new: an earlier attempt's unknown stands
    earlier = LEFT.model_copy(update={"effect_unknown": True})
    never_ran = settle(earlier, request="gone", attempt=2, job=ex.JobView("failed", "image pull", lost=True),
                       readback_declared=True, now=now)
    assert never_ran.effect_unknown
    assert failed.state == "compensationFailed" and failed.last_error.startswith("boom")


def test_orphan_left_alone_while_its_job_runs_or_when_someone_else_took_it():
    now = "2025-01-01T00:00:00Z"
    assert settle(LEFT, request="gone", attempt=2, job=ex.JobView("running"), readback_declared=True, now=now) is None
    assert settle(LEFT, request="other", attempt=2, job=ex.JobView("succeeded"), readback_declared=True,
                  now=now) is None
    assert settle(LEFT, request="gone", attempt=1, job=ex.JobView("succeeded"), readback_declared=True, now=now) is None
    done = LEFT.model_copy(update={"state": "compensated"})
    assert settle(done, request="gone", attempt=2, job=ex.JobView("failed"), readback_declared=True, now=now) is None
    assert settle(None, request="gone", attempt=2, job=ex.JobView("failed"), readback_declared=True, now=now) is None
