"""The life of one compensation (rules 3–5), as pure transitions: engine/executor.py."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from reversi.engine import executor as ex
from reversi.models.run import StepUndo
from reversi.models.toolmanifest import ToolSpec

KEY = "a" * 64
POLICY = ex.Policy(retries=3, base_ms=100, max_ms=1000)
READER = ex.VerifyPlan("reader", tool="payments.get_charge", args={"charge_id": "ch_1"},
                       expect={"refunded": True}, runner="cli", retries=2, backoff_ms=200)


def jobs(**views):
    """observe() answering from ``{"compensator-1": JobView, "reader-1-1": ...}``."""
    def observe(role, attempt, read):
        key = f"{role}-{attempt}" + (f"-{read}" if role != "compensator" else "")
        return views.get(key.replace("-", "_"))
    return observe


def effects_of(kind, effects):
    return [e for e in effects if isinstance(e, kind)]


def test_rule3_start_journals_before_the_job():
    run, effects = ex.start(ex.StepRun(4), None)
    assert run.stage == "compensating" and run.attempts == 1
    assert isinstance(effects[0], ex.Journal) and effects[0].state == "compensating"
    assert isinstance(effects[1], ex.StartJob) and effects[1].attempt == 1


def test_rule3_a_journaled_compensation_is_resumed_at_its_attempt_not_restarted():
    journaled = StepUndo(step=4, state="compensating", attempts=2, idempotency_key=KEY)
    run, effects = ex.start(ex.StepRun(4), journaled)
    assert run.attempts == 2
    assert effects_of(ex.StartJob, effects)[0].attempt == 2  # same name: the existing Job is adopted


def test_rule6_a_rerun_continues_the_attempt_count():
    failed = StepUndo(step=4, state="compensationFailed", attempts=3, idempotency_key=KEY)
    run, _ = ex.start(ex.StepRun(4), failed)
    assert run.attempts == 4


def test_rule3_missing_job_after_a_crash_is_created_again():
    run = ex.StepRun(1, stage="compensating", attempts=1)
    new, effects = ex.advance(run, jobs(), READER, POLICY, now=0)
    assert new == run and effects == [ex.StartJob(1, "compensator", 1)]


def test_rule4_failure_waits_with_backoff_then_retries_with_a_new_attempt():
    run = ex.StepRun(1, stage="compensating", attempts=1)
    failing = jobs(compensator_1=ex.JobView("failed", "HTTP 500"))
    new, effects = ex.advance(run, failing, READER, POLICY, now=100.0, rng=random.Random(1))
    assert new.stage == "retrying" and new.error == "HTTP 500"
    assert 100.0 <= new.next_at <= 100.1  # full jitter below the 100 ms ceiling of attempt 1
    same, nothing = ex.advance(new, failing, READER, POLICY, now=new.next_at - 0.01)
    assert same == new and nothing == []
    later, effects = ex.advance(new, failing, READER, POLICY, now=new.next_at)
    assert later.stage == "compensating" and later.attempts == 2
    assert effects == [ex.Journal(1, "compensating", 2), ex.StartJob(1, "compensator", 2)]


def test_rule4_out_of_attempts_is_compensation_failed_with_error_and_count():
    run = ex.StepRun(1, stage="compensating", attempts=3)
    new, effects = ex.advance(run, jobs(compensator_3=ex.JobView("failed", "card is disputed")), READER, POLICY, now=0)
    assert new.stage == "failed"
    journal = effects_of(ex.Journal, effects)[0]
    assert journal.state == "compensationFailed" and journal.attempts == 3
    assert journal.error == "compensation failed after 3 attempts: card is disputed"


def test_rule5_a_matching_answer_is_verified():
    run = ex.StepRun(1, stage="compensating", attempts=1)
    new, effects = ex.advance(run, jobs(compensator_1=ex.JobView("succeeded")), READER, POLICY, now=0)
    assert new.stage == "verifying" and effects == [ex.StartJob(1, "reader", 1, 1)]
    done, effects = ex.advance(new, jobs(reader_1_1=ex.JobView("succeeded", output='{"refunded": true, "id": "ch_1"}')),
                               READER, POLICY, now=1)
    assert done.stage == "compensated" and done.verification == "verified"
    assert effects_of(ex.Journal, effects)[0] == ex.Journal(1, "compensated", 1, "verified")


def test_rule5_a_mismatch_rereads_with_doubling_backoff_then_fails_naming_the_field():
    run = ex.StepRun(1, stage="verifying", attempts=1, reads=1)
    wrong = ex.JobView("succeeded", output='{"refunded": false}')
    new, _ = ex.advance(run, jobs(reader_1_1=wrong), READER, POLICY, now=10.0)
    assert new.stage == "rereading" and new.next_at == 10.2
    new, effects = ex.advance(new, jobs(), READER, POLICY, now=10.2)
    assert new.stage == "verifying" and new.reads == 2 and effects == [ex.StartJob(1, "reader", 1, 2)]
    final, effects = ex.advance(new, jobs(reader_1_2=wrong), READER, POLICY, now=11)
    assert final.stage == "failed" and final.verification == "verificationFailed"
    assert final.error == "verification failed: refunded is false, expected true"


def test_rule5_a_reader_printing_no_json_is_a_failed_read():
    run = ex.StepRun(1, stage="verifying", attempts=1, reads=2)
    final, _ = ex.advance(run, jobs(reader_1_2=ex.JobView("succeeded", output="oops")), READER, POLICY, now=0)
    assert final.stage == "failed" and "read failed: the reader printed no JSON" in final.error


def test_rule5_a_reader_exiting_non_zero_is_a_failed_read():
    run = ex.StepRun(1, stage="verifying", attempts=1, reads=2)
    final, _ = ex.advance(run, jobs(reader_1_2=ex.JobView("failed", "exit code 1")), READER, POLICY, now=0)
    assert final.error == "verification failed: read failed: exit code 1"


def test_rule5_a_read_back_lost_with_its_pod_is_read_again_without_counting():
    """A reader Job that failed with no answer from its program (its pod lost with the node, or
    ended by the Job's deadline before it exited) is not a failed read: the step reads again and
    still has its whole verification.retries budget."""
    lost = ex.JobView("failed", "The container could not be located when the pod was terminated", lost=True)
    run = ex.StepRun(1, stage="verifying", attempts=1, reads=1)
    new, effects = ex.advance(run, jobs(reader_1_1=lost), READER, POLICY, now=10.0)
    assert new.stage == "rereading" and new.lost_reads == 1 and new.next_at == 10.2
    assert not effects_of(ex.Journal, effects) and effects_of(ex.Note, effects)[0].reason == "ReadBackLost"
    new, effects = ex.advance(new, jobs(), READER, POLICY, now=10.2)
    assert new.stage == "verifying" and new.reads == 2 and effects == [ex.StartJob(1, "reader", 1, 2)]
    # READER.retries is 2: a mismatch now is the first counted read, so the step reads once more
    wrong = ex.JobView("succeeded", output='{"refunded": false}')
    new, _ = ex.advance(new, jobs(reader_1_2=wrong), READER, POLICY, now=11)
    assert new.stage == "rereading" and new.reads == 2
    new, _ = ex.advance(new, jobs(), READER, POLICY, now=20)
    done, effects = ex.advance(new, jobs(reader_1_3=ex.JobView("succeeded", output='{"refunded": true}')),
                               READER, POLICY, now=21)
    assert done.stage == "compensated" and done.verification == "verified"


def test_rule5_lost_reads_are_bounded_then_count_as_failed_reads():
    lost = ex.JobView("failed", "DeadlineExceeded: Job was active longer than specified deadline", lost=True)
    run = ex.StepRun(1, stage="verifying", attempts=1, reads=1)
    now = 0.0
    while run.stage != "failed":
        run, _ = ex.advance(run, lambda role, attempt, read, at=run.reads: lost if read == at else None,
                            READER, POLICY, now)
        now += 10
        run, _ = ex.advance(run, jobs(), READER, POLICY, now)
        assert run.reads <= ex.LOST_READS_MAX + READER.retries
    assert run.lost_reads == ex.LOST_READS_MAX and run.reads == ex.LOST_READS_MAX + READER.retries
    assert run.error.startswith("verification failed: read failed: DeadlineExceeded")


def test_rule5_a_reader_that_exited_non_zero_answered_even_when_its_pod_is_gone():
    run = ex.StepRun(1, stage="verifying", attempts=1, reads=2)
    final, _ = ex.advance(run, jobs(reader_1_2=ex.JobView("failed", "exit code 1")), READER, POLICY, now=0)
    assert final.stage == "failed" and final.lost_reads == 0


def test_rule13_a_cancelled_request_does_not_read_a_lost_read_back_again():
    lost = ex.JobView("failed", "lost", lost=True)
    run = ex.StepRun(1, stage="verifying", attempts=1, reads=1)
    final, effects = ex.advance(run, jobs(reader_1_1=lost), READER, replace(POLICY, stop="cancelled by ann"), now=0)
    # no read answered: the undo ran but is unchecked (a later request reads it back)
    assert final.stage == "compensated" and final.verification == "unverified"
    assert not effects_of(ex.StartJob, effects)


def test_rule5_no_reader_runner_means_compensated_but_unverified():
    snapshot = ToolSpec.model_validate({"name": "t", "effect": "write", "compensation": {
        "tool": "u", "kind": "inverse", "args": {}, "runner": "cli"},
        "verification": {"tool": "r", "args": {}, "expect": {"ok": True}}})
    plan = ex.verify_plan(snapshot, {}, {}, {"cli"})
    assert plan.mode == "noReader"
    run = ex.StepRun(1, stage="compensating", attempts=1)
    done, effects = ex.advance(run, jobs(compensator_1=ex.JobView("succeeded")), plan, POLICY, now=0)
    assert done.stage == "compensated" and done.verification == "unverified"
    assert effects_of(ex.Journal, effects)[0].verification == "unverified"


def test_rule5_unresolvable_verification_arguments_fail_the_step():
    snapshot = ToolSpec.model_validate({"name": "t", "effect": "write", "compensation": {
        "tool": "u", "kind": "inverse", "args": {}, "runner": "cli"},
        "verification": {"tool": "r", "args": {"id": "$result.id"}, "expect": {"ok": True}, "runner": "cli"}})
    plan = ex.verify_plan(snapshot, {}, {"no_id": 1}, {"cli"})
    assert plan.mode == "unavailable"
    run = ex.StepRun(1, stage="compensating", attempts=1)
    done, _ = ex.advance(run, jobs(compensator_1=ex.JobView("succeeded")), plan, POLICY, now=0)
    assert done.stage == "failed" and done.error.startswith("cannot verify: arguments unavailable")


def test_verify_command_runs_after_the_undo_and_its_failure_fails_the_step():
    policy = ex.Policy(3, 100, 1000, check=True)
    run = ex.StepRun(1, stage="compensating", attempts=1)
    checking, effects = ex.advance(run, jobs(compensator_1=ex.JobView("succeeded")), READER, policy, now=0)
    assert checking.stage == "checking" and effects == [ex.StartJob(1, "check", 1, 0)]
    failed, _ = ex.advance(checking, jobs(check_1_0=ex.JobView("failed", "ledger mismatch")), READER, policy, now=1)
    assert failed.stage == "failed" and "verifyCommand failed" in failed.error


@given(st.lists(st.sampled_from(["ok", "fail", "running"]), min_size=1, max_size=30), st.integers(1, 10))
def test_property_attempts_never_exceed_retries_and_every_final_state_is_journaled(outcomes, retries):
    """Whatever the compensator does, a step makes at most ``retries`` attempts and its final
    state is journaled exactly once, after a journaled start (rule 3, rule 4)."""
    policy = ex.Policy(retries, 0, 0)
    run, effects = ex.start(ex.StepRun(0), None)
    journal = effects_of(ex.Journal, effects)
    now = 0.0
    for outcome in outcomes:
        if run.stage in ex.FINAL_STAGES:
            break
        view = {"ok": ex.JobView("succeeded"), "fail": ex.JobView("failed", "x"),
                "running": ex.JobView("running")}[outcome]
        run, effects = ex.advance(run, lambda role, attempt, read, view=view: view, ex.VerifyPlan("none"), policy, now)
        journal += effects_of(ex.Journal, effects)
        now += 1.0
        assert run.attempts <= retries
    finals = [j for j in journal if j.state != "compensating"]
    assert len(finals) == (1 if run.stage in ex.FINAL_STAGES else 0)
    assert journal[0].state == "compensating"


# ------------------------------------------ verification none (rule 5), retries per request (rule 4)

NO_CHECK = ToolSpec.model_validate({"name": "t", "effect": "write", "compensation": {
    "tool": "u", "kind": "inverse", "args": {}, "runner": "cli"}})


def test_rule5_no_read_back_declared_is_compensated_with_verification_none():
    plan = ex.verify_plan(NO_CHECK, {}, {}, {"cli"})
    assert plan.mode == "none"
    run = ex.StepRun(1, stage="compensating", attempts=1)
    done, effects = ex.advance(run, jobs(compensator_1=ex.JobView("succeeded")), plan, POLICY, now=0)
    assert done.stage == "compensated" and done.verification == "none" and done.reason == "NoReadBackDeclared"
    assert effects_of(ex.Journal, effects)[0].verification == "none"
    assert not effects_of(ex.StartJob, effects), "no reader runs when none is declared"


def test_rule5_require_verification_makes_an_undo_without_read_back_unverified():
    plan = ex.verify_plan(NO_CHECK, {}, {}, {"cli"})
    policy = ex.Policy(retries=3, base_ms=100, max_ms=1000, require_verification=True)
    run = ex.StepRun(1, stage="compensating", attempts=1)
    done, effects = ex.advance(run, jobs(compensator_1=ex.JobView("succeeded")), plan, policy, now=0)
    assert done.stage == "compensated" and done.verification == "unverified" and done.reason == "ReadBackRequired"
    assert effects_of(ex.Journal, effects)[0].verification == "unverified"


@given(before=st.integers(min_value=0, max_value=20), retries=st.integers(min_value=1, max_value=10))
def test_rule6_property_each_request_gets_its_full_retries_budget(before, retries):
    """Whatever attempts earlier requests made, a request runs exactly ``retries`` attempts of a
    compensation that always fails, numbered on from the journal's total, then fails the step."""
    policy = ex.Policy(retries=retries, base_ms=1, max_ms=1)
    journaled = StepUndo(step=0, state="compensationFailed", attempts=before, idempotency_key=KEY) if before else None
    run, effects = ex.start(ex.StepRun(0), journaled)
    started = [e.attempt for e in effects_of(ex.StartJob, effects)]
    now = 0.0
    for _ in range(100):
        if run.stage == "failed":
            break
        observe = lambda role, attempt, read: ex.JobView("failed", "boom")  # noqa: E731
        run, effects = ex.advance(run, observe, READER, policy, now=now, rng=random.Random(0))
        started += [e.attempt for e in effects_of(ex.StartJob, effects)]
        now += 10.0
    assert run.stage == "failed"
    assert started == list(range(before + 1, before + retries + 1)), "attempt numbers continue: Job names stay unique"
    assert run.attempts == before + retries, "the journal keeps the total"
    assert run.attempts_here() == retries


def test_rule5_a_reader_configured_since_the_step_was_recorded_is_used_for_its_read_back():
    snapshot = ToolSpec.model_validate({"name": "t", "effect": "write", "compensation": {
        "tool": "u", "kind": "inverse", "args": {}, "runner": "cli"},
        "verification": {"tool": "r", "args": {}, "expect": {"ok": True}}})
    assert ex.verify_plan(snapshot, {}, {}, {"cli"}).mode == "noReader"
    later = ex.verify_plan(snapshot, {}, {}, {"cli", "reader"}, readers={"r": "reader"})
    assert later.mode == "reader" and later.runner == "reader" and later.tool == "r" and later.expect == {"ok": True}
    assert ex.verify_plan(snapshot, {}, {}, {"cli"}, readers={"r": "gone"}).mode == "noReader"
    assert ex.verify_plan(snapshot, {}, {}, {"cli", "reader"}, readers={"other": "reader"}).mode == "noReader"


def _jobs(**views):
    """observe() over Jobs named by role (attempt 1, first read)."""
    return lambda role, attempt, read: views.get(role) if attempt == 1 and read in (0, 1) else None


def test_a_read_back_started_by_an_unwritten_pass_is_followed_not_created_again():
    # status still says compensating (the hand-over to the read-back is not written): the reader
    # Job exists, so the pass follows it instead of creating it again
    run = ex.StepRun(0, stage="compensating", attempts=1, first_attempt=1)
    policy = ex.Policy(retries=2, base_ms=10, max_ms=20)
    new, effects = ex.advance(run, _jobs(compensator=ex.JobView("succeeded"), reader=ex.JobView("running")),
                              READER, policy, now=1.0)
    assert (new.stage, new.reads) == ("verifying", 1) and effects == []
    # the compensator's Job is gone (ttlSecondsAfterFinished) but its read-back is there: not run again
    new, effects = ex.advance(run, _jobs(reader=ex.JobView("running")), READER, policy, now=1.0)
    assert new.stage == "verifying" and not any(isinstance(e, ex.StartJob) for e in effects)
    # no read-back Job yet: it is started, once
    new, effects = ex.advance(run, _jobs(compensator=ex.JobView("succeeded")), READER, policy, now=1.0)
    assert new.stage == "verifying" and effects == [ex.StartJob(0, "reader", 1, 1)]
    # a failed compensator never counts a read-back as its success
    new, _ = ex.advance(run, _jobs(compensator=ex.JobView("failed", "502"), reader=ex.JobView("succeeded")),
                        READER, policy, now=1.0)
    assert new.stage == "retrying"


def test_a_check_started_by_an_unwritten_pass_is_followed_too():
    run = ex.StepRun(0, stage="compensating", attempts=1, first_attempt=1)
    policy = ex.Policy(retries=2, base_ms=10, max_ms=20, check=True)
    new, effects = ex.advance(run, _jobs(compensator=ex.JobView("succeeded"), check=ex.JobView("running")),
                              READER, policy, now=1.0)
    assert new.stage == "checking" and effects == []
    new, effects = ex.advance(replace(run, stage="checking"),
                              _jobs(check=ex.JobView("succeeded"), reader=ex.JobView("running")), READER, policy,
                              now=1.0)
    assert new.stage == "verifying" and effects == []


def test_a_check_whose_job_is_gone_is_not_run_again_once_its_read_back_started():
    # status says checking (written with another step's change in the same pass); the check
    # succeeded and the read-back started (that hand-over is not written); then the check's Job
    # was deleted (ttlSecondsAfterFinished, or by hand): the pass follows the reader, it does not
    # run verifyCommand again
    run = ex.StepRun(0, stage="checking", attempts=1, first_attempt=1)
    policy = ex.Policy(retries=2, base_ms=10, max_ms=20, check=True)
    new, effects = ex.advance(run, _jobs(reader=ex.JobView("running")), READER, policy, now=1.0)
    assert (new.stage, new.reads) == ("verifying", 1) and effects == []
    # no read-back yet and no check Job: the check is started (it never ran)
    new, effects = ex.advance(run, _jobs(), READER, policy, now=1.0)
    assert new.stage == "checking" and effects == [ex.StartJob(0, "check", 1, 0)]


def test_rule13_a_cancel_while_only_lost_reads_were_made_leaves_the_undo_unverified_not_failed():
    """Cancelled while waiting to read again after a lost read, or when a lost
    read comes back after the cancel, no read-back answered: the undo ran, so the step is
    compensated but unverified (a later request reads it back, never compensates again)."""
    waiting = ex.StepRun(1, stage="rereading", attempts=1, reads=1, lost_reads=1, next_at=99.0, error="lost")
    done, effects = ex.give_up(waiting, "cancelled by ann")
    assert done.stage == "compensated" and done.verification == "unverified" and done.reason == "Cancelled"
    assert effects_of(ex.Journal, effects) == [ex.Journal(1, "compensated", 1, "unverified")]
    done, _ = ex.give_up(waiting, "the deadline passed", "DeadlineExceeded")
    assert done.verification == "unverified" and done.reason == "DeadlineExceeded"
    # a read that answered (a mismatch) before: failed, as rule 13 says of a mismatching read-back
    answered = replace(waiting, reads=2, lost_reads=1)
    assert ex.give_up(answered, "cancelled by ann")[0].stage == "failed"
    # the lost read comes back after the cancel
    lost = ex.JobView("failed", "lost", lost=True)
    run = ex.StepRun(1, stage="verifying", attempts=1, reads=2, lost_reads=1)
    done, _ = ex.advance(run, jobs(reader_1_2=lost), READER, replace(POLICY, stop="cancelled by ann"), now=0)
    assert done.stage == "compensated" and done.verification == "unverified"


def test_rule13_a_cancelled_request_never_creates_a_journaled_attempts_missing_job():
    """Attempt 2 journaled, then the pass ended before its Job existed, then the
    request was cancelled: no new Job starts (rule 13); the attempt never ran, the step fails."""
    run = ex.StepRun(1, stage="compensating", attempts=2, first_attempt=1, error="502")
    done, effects = ex.advance(run, jobs(), READER, replace(POLICY, stop="cancelled by ann"), now=0)
    assert done.stage == "failed" and "attempt 2 was not started: cancelled by ann" in done.error
    assert not effects_of(ex.StartJob, effects)
    assert effects_of(ex.Journal, effects)[0].state == "compensationFailed"


def test_a_rereading_note_counts_only_the_reads_that_answered():
    wrong = ex.JobView("succeeded", output='{"refunded": false}')
    run = ex.StepRun(1, stage="verifying", attempts=1, reads=3, lost_reads=2)
    new, effects = ex.advance(run, jobs(reader_1_3=wrong), READER, POLICY, now=0)
    assert new.stage == "rereading"
    assert "read-back 1 of 2 (2 lost, not counted)" in effects_of(ex.Note, effects)[0].message


# ------------------------------- a failed undo whose effect nobody knows (docs/concepts.md#the-report)

#: a compensator stopped mid-call (the deadline, an eviction, an OOM kill, its node lost): no answer of its own
KILLED = ex.JobView("failed", "DeadlineExceeded: Job was active longer than specified deadline; exit code 143",
                    lost=True, effect_unknown=True)
#: a compensator that answered: it exited non-zero by itself
ANSWERED = ex.JobView("failed", "refund refused: 409")
#: a compensator whose program never ran (its image could not be pulled)
NEVER_RAN = ex.JobView("failed", "DeadlineExceeded: ...; its container never ran: ErrImagePull", lost=True)


def _attempts(views, retries, policy=None):
    """Run one step's compensator attempts, each failing as ``views`` says, until it is final."""
    policy = policy or ex.Policy(retries, 0, 0)
    run, effects = ex.start(ex.StepRun(0), None)
    journal = effects_of(ex.Journal, effects)
    now = 0.0
    for view in views:
        run, effects = ex.advance(run, lambda role, attempt, read, view=view: view, READER, policy, now)
        journal += effects_of(ex.Journal, effects)
        if run.stage in ex.FINAL_STAGES:
            break
        run, effects = ex.advance(run, jobs(), READER, policy, now)  # retrying -> the next attempt
        journal += effects_of(ex.Journal, effects)
        now += 1.0
    return run, journal


def test_a_compensator_killed_mid_call_leaves_the_effect_unknown_and_journals_it():
    run, journal = _attempts([KILLED], retries=1)
    assert run.stage == "failed" and run.effect_unknown is True
    assert journal[-1].state == "compensationFailed" and journal[-1].effect_unknown is True


def test_a_compensator_that_answered_or_never_ran_is_a_plain_failure():
    for view in (ANSWERED, NEVER_RAN):
        run, journal = _attempts([view], retries=1)
        assert run.stage == "failed" and run.effect_unknown is False, view
        assert journal[-1].effect_unknown is False


def test_the_last_attempt_that_ran_decides_whether_the_effect_is_unknown():
    """An answer after a killed attempt says the effect may remain (failed); an attempt that
    never ran tells nothing new, so a killed attempt before it still leaves the effect unknown."""
    assert _attempts([KILLED, ANSWERED], retries=2)[0].effect_unknown is False
    assert _attempts([ANSWERED, KILLED], retries=2)[0].effect_unknown is True
    assert _attempts([KILLED, NEVER_RAN], retries=2)[0].effect_unknown is True


def test_a_step_given_up_while_it_waits_after_a_killed_attempt_is_unknown():
    """Cancelled (or past its deadline) while it waits to try again: it fails, and its last attempt
    was killed mid-call, so its effect is unknown."""
    run = ex.StepRun(1, stage="compensating", attempts=1)
    waiting, _ = ex.advance(run, jobs(compensator_1=KILLED), READER, POLICY, now=0, rng=random.Random(1))
    assert waiting.stage == "retrying" and waiting.effect_unknown is True
    final, effects = ex.give_up(waiting, "the request was cancelled by ann")
    assert final.stage == "failed" and final.effect_unknown is True
    assert effects_of(ex.Journal, effects)[0].effect_unknown is True


def test_a_cancel_that_stops_a_retry_keeps_what_the_killed_attempt_left():
    run = ex.StepRun(1, stage="compensating", attempts=1)
    final, _ = ex.advance(run, jobs(compensator_1=KILLED), READER, replace(POLICY, stop="cancelled by ann"), now=0)
    assert final.stage == "failed" and final.effect_unknown is True


def test_a_failed_read_back_leaves_the_effect_unknown_a_mismatch_does_not():
    run = ex.StepRun(1, stage="verifying", attempts=1, reads=2)
    failed_read, effects = ex.advance(run, jobs(reader_1_2=ex.JobView("failed", "exit code 1")), READER, POLICY, now=0)
    assert failed_read.stage == "failed" and failed_read.effect_unknown is True
    assert effects_of(ex.Journal, effects)[0].effect_unknown is True
    no_json, _ = ex.advance(run, jobs(reader_1_2=ex.JobView("succeeded", output="oops")), READER, POLICY, now=0)
    assert no_json.stage == "failed" and no_json.effect_unknown is True
    wrong = ex.JobView("succeeded", output='{"refunded": false}')
    mismatch, effects = ex.advance(run, jobs(reader_1_2=wrong), READER, POLICY, now=0)
    assert mismatch.stage == "failed" and mismatch.effect_unknown is False
    assert effects_of(ex.Journal, effects)[0].effect_unknown is False


def test_a_killed_compensator_followed_by_a_success_is_not_unknown_any_more():
    """A later attempt that succeeded answered: what a read-back says next decides."""
    run, _ = ex.advance(ex.StepRun(1, stage="compensating", attempts=1), jobs(compensator_1=KILLED), READER,
                        POLICY, now=0)
    run, _ = ex.advance(run, jobs(), READER, POLICY, now=10)
    assert run.stage == "compensating" and run.attempts == 2 and run.effect_unknown is True
    run, effects = ex.advance(run, jobs(compensator_2=ex.JobView("succeeded")), READER, POLICY, now=11)
    assert run.stage == "verifying" and run.effect_unknown is False and effects == [ex.StartJob(1, "reader", 2, 1)]


def test_unresolvable_verification_arguments_leave_the_effect_unknown():
    plan = ex.VerifyPlan("unavailable", tool="r", detail=f"{ex.UNAVAILABLE} (no id)")
    done, effects = ex.advance(ex.StepRun(1, stage="compensating", attempts=1),
                               jobs(compensator_1=ex.JobView("succeeded")), plan, POLICY, now=0)
    assert done.stage == "failed" and done.effect_unknown is True
    assert effects_of(ex.Journal, effects)[0].effect_unknown is True


@given(st.lists(st.sampled_from(["killed", "answered", "never_ran"]), min_size=1, max_size=8))
def test_property_a_failed_step_is_unknown_exactly_when_its_last_attempt_that_ran_was_killed(kinds):
    """Whatever its attempts did, a step that fails is ``effect_unknown`` exactly when the last
    attempt whose program ran gave no answer of its own; what is journaled says the same."""
    views = {"killed": KILLED, "answered": ANSWERED, "never_ran": NEVER_RAN}
    run, journal = _attempts([views[k] for k in kinds], retries=len(kinds))
    ran = [k for k in kinds if k != "never_ran"]
    assert run.stage == "failed"
    assert run.effect_unknown is (bool(ran) and ran[-1] == "killed")
    assert [j.effect_unknown for j in journal if j.state == "compensationFailed"] == [run.effect_unknown]
