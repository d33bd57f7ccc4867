"""The decision of one reconcile pass: engine/decide.py, pure.

Examples of each rule the pass applies, then hypothesis properties over journals, status entries
and Job outcomes made at random (consistent with one another the way rule 3 keeps them: the
journal is written first, then Jobs, then the request's status)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reversi import conditions as cond
from reversi.engine import decide as dc
from reversi.engine import executor as ex
from reversi.engine.graph import build_graph
from reversi.engine.plan import build_plan
from reversi.models.rollbackrequest import RollbackRequestSpec
from reversi.models.run import StepUndo
from reversi_testkit import RUN_ID, run_spec, snapshot, step, tool

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_000_000.0
KEY = "a" * 64


def make_run(n: int, approval: frozenset[int] = frozenset(), reader: bool = True, prior: list[StepUndo] | None = None):
    """``n`` independent write steps (runner ``cli``, a read-back with a reader unless told not);
    the steps in ``approval`` need approval. Planned against ``prior`` (earlier requests' undo)
    as the reconciler plans."""
    steps = [step(i, snapshot(tool(f"w{i}", approval=i in approval, reader=reader))) for i in range(n)]
    spec = run_spec(steps)
    graph = build_graph(spec)
    plan = build_plan(spec, prior or [], run_id=RUN_ID, graph=graph, runner_names={"cli"}, handlers={"cli"}, now=NOW)
    return spec, graph, plan


def inputs(n: int = 3, *, approval: frozenset[int] = frozenset(), reader: bool = True,
           mine: dict[int, StepUndo] | None = None, prior: list[StepUndo] | None = None,
           entries: dict[int, dict] | None = None, jobs: dict[tuple, ex.JobView] | None = None,
           now: float = NOW, **spec) -> dc.PassInputs:
    """What a pass loaded; ``jobs`` keyed ``(role, step, attempt, read)``."""
    run, graph, plan = make_run(n, approval, reader, prior)
    views = jobs or {}
    return dc.PassInputs(
        request="undo", spec=RollbackRequestSpec.model_validate({"runRef": {"name": "r"}, **spec}), plan=plan,
        graph=graph, run=run, mine=mine or {}, prior=prior or [], entries=entries or {}, now=now, started=NOW,
        observe=lambda role, attempt, read, s: views.get((role, s, attempt, read)),
        runner_names=frozenset({"cli"}))


def undo(s: int, state: str, attempts: int = 1, request: str = "undo", **more) -> StepUndo:
    return StepUndo(step=s, state=state, attempts=attempts, idempotency_key=KEY, request=request, **more)


def starts(d: dc.Decision, role: str = "compensator") -> list[ex.StartJob]:
    return [e for e in d.effects if isinstance(e, ex.StartJob) and e.role == role]


# ------------------------------------------------------------------------------ examples


def test_rule1_a_fresh_pass_starts_the_newest_step_journal_first():
    d = dc.decide(inputs(3))
    assert [e for e in d.effects if not isinstance(e, ex.Note)] == [
        ex.Journal(2, "compensating", 1), ex.StartJob(2, "compensator", 1)]
    assert d.runs[2].stage == "compensating" and d.runs[1].stage == d.runs[0].stage == "pending"
    assert d.progress == {0: "pending", 1: "pending", 2: "running"}
    assert d.running and not d.settled and not d.ending.finished
    assert d.moves == ((ex.StepRun(2), d.runs[2]),)
    assert d.ending.report.pending == [0, 1, 2]


def test_parallelism_starts_that_many_at_once():
    d = dc.decide(inputs(5, parallelism=3))
    assert [e.step for e in starts(d)] == [4, 3, 2]


def test_rule5_a_compensator_that_succeeded_moves_to_its_read_back():
    d = dc.decide(inputs(1, mine={0: undo(0, "compensating")},
                         entries={0: {"step": 0, "stage": "compensating", "attempts": 1}},
                         jobs={("compensator", 0, 1, 0): ex.JobView("succeeded")}))
    assert d.runs[0].stage == "verifying" and starts(d, "reader") == [ex.StartJob(0, "reader", 1, 1)]
    assert not starts(d)


def test_rule5_a_matching_read_back_journals_verified():
    d = dc.decide(inputs(1, mine={0: undo(0, "compensating")},
                         entries={0: {"step": 0, "stage": "verifying", "attempts": 1, "reads": 1}},
                         jobs={("reader", 0, 1, 1): ex.JobView("succeeded", output='{"gone": true}')}))
    assert d.runs[0].stage == "compensated" and d.runs[0].verification == "verified"
    assert ex.Journal(0, "compensated", 1, "verified") in d.effects
    assert d.settled and d.ending.finished and d.ending.report.complete


def test_rule3_the_journal_outranks_the_status():
    d = dc.decide(inputs(2, mine={1: undo(1, "compensated", verification="verified")},
                         entries={1: {"step": 1, "stage": "pending"}}))
    assert d.runs[1].stage == "compensated" and d.runs[1].reason == cond.VERIFIED
    assert [e.step for e in starts(d)] == [0]  # step 1 is never started again


def test_rule3_a_journaled_compensation_whose_job_is_missing_is_created_not_journaled_again():
    d = dc.decide(inputs(1, mine={0: undo(0, "compensating", attempts=2)}))
    assert d.effects == (ex.StartJob(0, "compensator", 2),)
    assert d.runs[0].stage == "compensating" and d.runs[0].attempts == 2


def test_rule3_a_retry_journaled_before_a_crash_resumes_that_attempt_not_the_next():
    """The status says ``retrying`` after attempt 1 failed (written at once); the pass whose
    backoff ended journaled attempt 2 and crashed before its Job existed. The next pass resumes
    attempt 2 (its Job created, or adopted by name), never skipping to attempt 3 (make chaos saw
    compensator Jobs for attempts [1, 3])."""
    for jobs in ({}, {("compensator", 0, 2, 0): ex.JobView("running")}):
        d = dc.decide(inputs(1, mine={0: undo(0, "compensating", attempts=2)}, jobs=jobs, retries=5,
                             entries={0: {"step": 0, "stage": "retrying", "attempts": 1, "firstAttempt": 1,
                                          "nextAttemptAt": "1970-01-01T00:00:00Z", "lastError": "502"}}))
        assert d.runs[0].stage == "compensating" and d.runs[0].attempts == 2, d.runs[0]
        assert starts(d) == ([ex.StartJob(0, "compensator", 2)] if not jobs else [])
        assert not [e for e in d.effects if isinstance(e, ex.Journal)], "attempt 2 is journaled already"


def test_rule3_a_final_failure_journaled_before_a_crash_is_never_run_again():
    # the journal says the attempt failed for good; the status (not written before the crash) still
    # shows it under way, and its Job is gone (ttlSecondsAfterFinished): no Job, failed
    for stage in ("compensating", "retrying", "checking", "verifying", "rereading"):
        d = dc.decide(inputs(1, mine={0: undo(0, "compensationFailed", attempts=2, last_error="502")},
                             entries={0: {"step": 0, "stage": stage, "attempts": 2, "reads": 1}}))
        assert d.runs[0].stage == "failed" and not any(isinstance(e, ex.StartJob) for e in d.effects), stage
    # a later attempt under way (a request of the same name, created again) goes on
    d = dc.decide(inputs(1, mine={0: undo(0, "compensationFailed", attempts=2)},
                         entries={0: {"step": 0, "stage": "compensating", "attempts": 3}}))
    assert d.runs[0].stage == "compensating" and starts(d) == [ex.StartJob(0, "compensator", 3)]


def test_rule8_a_step_that_needs_approval_waits_until_approved():
    waiting = dc.decide(inputs(2, approval=frozenset({1})))
    assert waiting.runs[1].stage == "awaitingApproval" and waiting.awaiting == [1]
    assert [e.step for e in starts(waiting)] == [0]  # independent of step 1: it does not wait for it
    approved = dc.decide(inputs(2, approval=frozenset({1}), approvals=[{"step": 1, "approver": "ana"}]))
    assert [e.step for e in starts(approved)] == [1] and approved.approved == {1: "ana"}
    for_all = dc.decide(inputs(2, approval=frozenset({1}), approveCompensations=True, approvedBy="bo"))
    assert [e.step for e in starts(for_all)] == [1] and for_all.approved_all_by == "bo"


def test_rule8_a_denied_step_is_not_undone_and_the_request_finishes():
    d = dc.decide(inputs(1, approval=frozenset({0}), denials=[{"step": 0, "note": "no", "actor": "cy"}]))
    assert d.runs[0].stage == "awaitingApproval" and d.runs[0].reason == cond.DENIED
    assert d.runs[0].error == "denied by cy: no" and d.awaiting == [] and not d.effects
    assert d.settled and d.ending.report.awaiting_approval == [0]
    assert [x.reason for x in d.ending.report.denied] == ["denied by cy: no"]


def test_rule13_a_cancelled_request_starts_nothing_and_cancels_what_did_not_start():
    d = dc.decide(inputs(2, cancel=True, cancelledBy="dee"))
    assert not d.effects and {r.stage for r in d.runs.values()} == {"cancelled"}
    assert d.stop == "the request was cancelled by dee" and d.settled and d.ending.report.cancelled == [0, 1]


def test_rule13_a_cancelled_request_does_not_retry_a_failed_attempt():
    d = dc.decide(inputs(1, cancel=True, mine={0: undo(0, "compensating")},
                         entries={0: {"step": 0, "stage": "compensating", "attempts": 1}},
                         jobs={("compensator", 0, 1, 0): ex.JobView("failed", "HTTP 500")}))
    assert d.runs[0].stage == "failed" and "not retried" in (d.runs[0].error or "")
    assert not starts(d) and ex.Journal(0, "compensating", 2) not in d.effects


def test_the_deadline_gives_up_a_step_waiting_for_its_next_attempt():
    d = dc.decide(inputs(1, deadlineSeconds=10, now=NOW + 11, mine={0: undo(0, "compensating")},
                         entries={0: {"step": 0, "stage": "retrying", "attempts": 1, "lastError": "HTTP 500"}}))
    assert d.runs[0].stage == "failed" and "deadline (10s) passed" in (d.runs[0].error or "")
    assert d.deadline_passed and d.settled and not starts(d)


def test_backoff_takes_its_jitter_from_the_random_source_passed_in():
    loaded = inputs(1, mine={0: undo(0, "compensating")},
                    entries={0: {"step": 0, "stage": "compensating", "attempts": 1}},
                    jobs={("compensator", 0, 1, 0): ex.JobView("failed", "HTTP 500")})
    one, two = dc.decide(loaded, random.Random(7)), dc.decide(loaded, random.Random(7))
    assert one == two and one.runs[0].stage == "retrying" and one.runs[0].next_at is not None


def test_a_refused_compensator_job_makes_only_its_step_handler_unavailable():
    d = dc.decide(inputs(2, parallelism=2))
    d2, more = dc.refused(inputs(2, parallelism=2), d, 1, "cannot create the compensator Job: forbidden")
    assert d2.runs[1].stage == "handlerUnavailable" and d2.runs[0].stage == "compensating"
    assert isinstance(more[0], ex.Journal) and more[0].state == "compensationFailed"
    assert d2.progress[1] == "handlerUnavailable" and d2.running
    assert 1 in [x.step for x in d2.ending.report.handler_unavailable]


def test_a_child_run_left_keeps_the_pass_unfinished_and_the_closed_phase_unmarked():
    loaded = inputs(1, compensationDeadlineSeconds=5, now=NOW + 6)
    # compensation kind: the closed phase keeps it from starting
    comp = snapshot({**tool("w0"), "compensation": {**tool("w0")["compensation"], "kind": "compensation"}})
    spec = run_spec([step(0, comp)])
    graph = build_graph(spec)
    plan = build_plan(spec, [], run_id=RUN_ID, graph=graph, runner_names={"cli"}, handlers={"cli"}, now=NOW)
    loaded = replace(loaded, run=spec, graph=graph, plan=plan)
    d = dc.decide(loaded)
    assert not d.effects and d.settled
    assert d.ending.finished and d.ending.runs[0].stage == "compensationDeadlinePassed"
    held = dc.conclude(loaded, d, children_left=True)
    assert not held.finished and held.runs[0].stage == "pending" and held.report.pending == [0]


def test_an_earlier_requests_unverified_undo_is_read_back_not_redone():
    d = dc.decide(inputs(1, prior=[undo(0, "compensated", request="older", verification="unverified")]))
    assert 0 not in d.runs or d.runs[0].stage != "compensating"
    assert d.reverify[0].stage == "verifying" and starts(d, "reader") == [ex.StartJob(0, "reader", 1, 1)]
    assert not starts(d)


def test_a_read_back_of_an_earlier_undo_is_among_the_moves_so_it_is_timed():
    prior = [undo(0, "compensated", request="older", verification="unverified")]
    d = dc.decide(inputs(1, prior=prior))
    assert [(old.stage, new.stage) for old, new in d.moves] == [("verifying", "verifying")]
    answered = {("reader", 0, 1, 1): ex.JobView("succeeded", output='{"gone": true}')}
    d = dc.decide(inputs(1, prior=prior, entries={0: {"step": 0, "stage": "verifying", "reads": 1}}, jobs=answered))
    assert [(old.stage, new.stage) for old, new in d.moves] == [("verifying", "compensated")]


def test_a_pending_read_back_of_an_earlier_undo_is_dropped_on_cancel():
    d = dc.decide(inputs(1, cancel=True, prior=[undo(0, "compensated", request="older", verification="unverified")]))
    assert d.reverify == {} and not d.effects


def test_the_reasons_are_the_conditions_module_s():
    for name in ("VERIFIED", "NO_READ_BACK_DECLARED", "NO_READER", "READ_BACK_REQUIRED", "CANCELLED", "DENIED",
                 "DEADLINE_EXCEEDED",
                 "VERIFICATION_ARGUMENTS_UNAVAILABLE", "COMPENSATION_DEADLINE_PASSED"):
        assert getattr(dc, name) == getattr(cond, name), name
    assert ex.CANCELLED_REASON == cond.CANCELLED


def test_epoch_reads_rfc3339():
    assert dc.epoch("1970-01-01T00:01:00Z") == 60.0 and dc.epoch(None) is None and dc.epoch("") is None


def test_rule3_a_journal_entry_is_this_requests_and_a_read_back_keeps_the_earlier_undo():
    mine = dc.journal_entry(ex.Journal(2, "compensating", 3), key=KEY, request="undo", at="2026-01-01T00:00:00Z",
                            error=None)
    assert (mine.step, mine.state, mine.attempts, mine.request, mine.idempotency_key) == (2, "compensating", 3,
                                                                                          "undo", KEY)
    assert mine.verified_by is None and mine.updated_at is not None
    earlier = undo(2, "compensated", attempts=5, request="older", verification="unverified")
    checked = dc.journal_entry(ex.Journal(2, "compensated", 1, "verified"), key="b" * 64, request="undo",
                               at="2026-01-01T00:00:00Z", error=None, earlier=earlier)
    assert (checked.attempts, checked.idempotency_key, checked.request) == (5, KEY, "older")
    assert (checked.verification, checked.verified_by) == ("verified", "undo") and checked.verified_at is not None


def test_a_failed_undo_whose_effect_nobody_knows_is_journaled_so_and_reported_unknown():
    """A compensator killed mid-call (no answer of its own) fails the step; the pass journals
    ``effectUnknown`` with it and the report types its residue ``unknown``
    (docs/concepts.md#the-report), not ``failed``."""
    killed = ex.JobView("failed", "DeadlineExceeded: ...; exit code 143", lost=True, effect_unknown=True)
    d = dc.decide(inputs(1, mine={0: undo(0, "compensating")}, entries={0: {"step": 0, "stage": "compensating",
                                                                            "attempts": 1}},
                         jobs={("compensator", 0, 1, 0): killed}, retries=1))
    assert d.runs[0].stage == "failed" and d.runs[0].effect_unknown is True
    journal = [e for e in d.effects if isinstance(e, ex.Journal)]
    assert journal[-1].state == "compensationFailed" and journal[-1].effect_unknown is True
    entry = dc.journal_entry(journal[-1], key=KEY, request="undo", at="2026-01-01T00:00:00Z", error="x")
    assert entry.effect_unknown is True
    assert [(r.step, r.type) for r in d.ending.report.residue] == [(0, "unknown")]
    answered = dc.decide(replace(inputs(1, mine={0: undo(0, "compensating")}, retries=1,
                                        entries={0: {"step": 0, "stage": "compensating", "attempts": 1}},
                                        jobs={("compensator", 0, 1, 0): ex.JobView("failed", "refund refused")})))
    assert [(r.step, r.type) for r in answered.ending.report.residue] == [(0, "failed")]
    assert dc.journal_entry(ex.Journal(0, "compensationFailed", 1, error="x"), key=KEY, request="undo",
                            at=None, error="x").effect_unknown is None, "written only when true"


def test_rule3_an_unknown_effect_outlives_the_pass_in_the_journal_and_the_status():
    """Later passes rebuild the fact: from the journal for a step failed for good (also when the
    status was not written before a crash), from the status entry while it waits to try again."""
    failed = undo(0, "compensationFailed", attempts=1, last_error="compensation failed after 1 attempt: OOMKilled",
                  effect_unknown=True)
    for stage in ("failed", "compensating"):
        d = dc.decide(inputs(1, mine={0: failed}, entries={0: {"step": 0, "stage": stage, "attempts": 1}}))
        assert d.runs[0].stage == "failed" and d.runs[0].effect_unknown is True, stage
        assert [(r.step, r.type) for r in d.ending.report.residue] == [(0, "unknown")], stage
    waiting = {0: {"step": 0, "stage": "retrying", "attempts": 1, "lastError": "exit code 143", "effectUnknown": True}}
    d = dc.decide(inputs(1, deadlineSeconds=10, now=NOW + 11, mine={0: undo(0, "compensating")}, entries=waiting))
    assert d.runs[0].stage == "failed" and d.runs[0].effect_unknown is True
    assert [(r.step, r.type) for r in d.ending.report.residue] == [(0, "unknown")]


def test_an_earlier_requests_failed_read_back_is_reported_unknown_by_its_journal():
    """A re-verify that failed to read (journaled ``effectUnknown``) stays ``unknown`` in later
    reports; one that read a mismatch stays ``failed``."""
    from reversi.engine.report import build_report

    _, _, plan = make_run(1, prior=[undo(0, "compensated", request="older", verification="unverified")])  # at the lock
    for unknown, kind in ((True, "unknown"), (None, "failed")):
        prior = [undo(0, "compensationFailed", request="older", verification="verificationFailed",
                      verified_by="undo", last_error="verification failed: x", effect_unknown=unknown)]
        report = build_report(plan, dc.outcomes({}, {}, prior, finished=True))
        assert [(r.step, r.type) for r in report.residue] == [(0, kind)], unknown


def test_decide_imports_no_kubernetes():
    code = ("import json, sys; import reversi.engine.decide; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'kopf'))))")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------------------ properties

STAGES = ("none", "compensating", "retrying", "verifying", "compensated", "failed", "compensatedByEarlier")
JOBS = (None, "running", "succeeded", "failed")


@st.composite
def passes(draw):
    """A pass over 1–6 steps whose journal, status entries and Jobs agree as rule 3 keeps them."""
    n = draw(st.integers(1, 6))
    approval = frozenset(draw(st.sets(st.integers(0, n - 1))))
    mine: dict[int, StepUndo] = {}
    prior: list[StepUndo] = []
    entries: dict[int, dict] = {}
    jobs: dict[tuple, ex.JobView] = {}
    for s in range(n):
        state = draw(st.sampled_from(STAGES))
        a = draw(st.integers(1, 3))
        if state == "none":
            if draw(st.booleans()):
                entries[s] = {"step": s, "stage": draw(st.sampled_from(["pending", "awaitingApproval"]))}
            continue
        if state == "compensatedByEarlier":
            prior.append(undo(s, "compensated", a, request="older",
                              verification=draw(st.sampled_from(["verified", "none", "unverified"]))))
            continue
        if state in ("compensating", "retrying", "verifying"):
            mine[s] = undo(s, "compensating", a)
            if state == "compensating" and draw(st.booleans()):
                pass  # a crash after the journal, before the status: no entry
            else:
                entries[s] = {"step": s, "stage": state, "attempts": a, "reads": 1, "firstAttempt": 1,
                              "nextAttemptAt": "1970-01-12T13:46:00Z" if draw(st.booleans()) else None}
            view = draw(st.sampled_from(JOBS))
            if view is not None:
                role, read = ("reader", 1) if state == "verifying" else ("compensator", 0)
                output = draw(st.sampled_from(['{"gone": true}', '{"gone": false}', "not json"]))
                jobs[(role, s, a, read)] = ex.JobView(view, "boom" if view == "failed" else "", output)
            continue
        if state == "compensated":  # compensated by this request: whatever its status entry says
            mine[s] = undo(s, "compensated", a, verification="verified")
            stages = ["pending", "compensating", "verifying", "compensated", "failed"]
        else:  # failed by this request: the status says so, or was never written
            mine[s] = undo(s, "compensationFailed", a, last_error="boom")
            stages = ["pending", "failed"]
        if draw(st.booleans()):
            entries[s] = {"step": s, "stage": draw(st.sampled_from(stages)), "attempts": a}
    spec = {"parallelism": draw(st.integers(1, 4)), "cancel": draw(st.booleans()), "retries": draw(st.integers(1, 3))}
    approved = sorted(draw(st.sets(st.sampled_from(sorted(approval)))) if approval else set())
    denied = sorted(draw(st.sets(st.sampled_from(sorted(approval)))) if approval else set())
    spec["approvals"] = [{"step": s} for s in approved]
    spec["denials"] = [{"step": s, "note": "no"} for s in denied]
    spec["approveCompensations"] = draw(st.booleans())
    if draw(st.booleans()):
        spec["deadlineSeconds"] = 60
    now = NOW + draw(st.sampled_from([0, 30, 120]))
    return inputs(n, approval=approval, mine=mine, prior=prior, entries=entries, jobs=jobs, now=now, **spec)


PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(passes())
def test_a_step_never_gets_two_compensator_jobs_in_one_pass(loaded):
    d = dc.decide(loaded, random.Random(0))
    steps = [e.step for e in starts(d)]
    assert len(steps) == len(set(steps))


@PROPS
@given(passes())
def test_rule3_every_compensator_attempt_is_journaled_compensating_before_its_job(loaded):
    d = dc.decide(loaded, random.Random(0))
    for i, e in enumerate(d.effects):
        if isinstance(e, ex.StartJob) and e.role == "compensator":
            journaled_now = ex.Journal(e.step, "compensating", e.attempt) in d.effects[:i]
            journaled = loaded.mine.get(e.step)
            assert journaled_now or (journaled is not None and journaled.state == "compensating"
                                     and journaled.attempts == e.attempt)


@PROPS
@given(passes())
def test_rule13_a_cancelled_request_begins_nothing(loaded):
    if not loaded.spec.cancel:
        return
    d = dc.decide(loaded, random.Random(0))
    assert not [e for e in d.effects if isinstance(e, ex.Journal) and e.state == "compensating"]
    before = {old.step: old for old, _ in d.moves}
    for e in d.effects:
        if isinstance(e, ex.StartJob):  # only the Job of an attempt or read already begun (adopted after a crash)
            assert e.step in before and before[e.step].stage in ex.ACTIVE_STAGES
    assert all(r.stage not in ("pending", "awaitingApproval") or r.reason == cond.DENIED for r in d.runs.values())


@PROPS
@given(passes())
def test_parallelism_bounds_the_compensations_under_way(loaded):
    # parallelism counts the steps whose compensation is under way (SLOT_STAGES); a step whose undo
    # is done and being checked or read back holds no slot
    d = dc.decide(loaded, random.Random(0))
    started = [new for old, new in d.moves if old.stage in ("pending", "awaitingApproval")]
    holding_before = sum(1 for old, _ in d.moves if old.stage in ex.SLOT_STAGES)
    holding = sum(1 for run in d.runs.values() if run.stage in ex.SLOT_STAGES)
    assert holding <= max(loaded.spec.parallelism, holding_before)
    if started:
        assert holding <= loaded.spec.parallelism


@PROPS
@given(passes())
def test_rule3_a_journaled_compensated_step_is_never_started_again(loaded):
    d = dc.decide(loaded, random.Random(0))
    done = {s for s, u in loaded.mine.items() if u.state == "compensated"}
    done |= {u.step for u in loaded.prior if u.state == "compensated"}
    assert not [e for e in d.effects if isinstance(e, ex.StartJob) and e.step in done and e.role != "reader"]
    assert not [e for e in d.effects if isinstance(e, ex.Journal) and e.step in done and e.state == "compensating"]
    for s in done & set(loaded.mine):
        assert d.runs[s].stage == "compensated"


@PROPS
@given(passes())
def test_rule8_a_step_without_approval_is_never_started(loaded):
    d = dc.decide(loaded, random.Random(0))
    approved = {a.step for a in loaded.spec.approvals}
    denied = {x.step for x in loaded.spec.denials}
    for action in loaded.plan.actions:
        s = action.step
        if not action.needs_approval or s in loaded.mine:
            continue
        if s in denied:
            assert d.runs[s].stage == "awaitingApproval" and d.runs[s].reason == cond.DENIED
            assert s in d.ending.report.awaiting_approval and s not in d.awaiting
        elif s not in approved and not loaded.spec.approve_compensations and not loaded.spec.cancel:
            assert d.runs[s].stage == "awaitingApproval" and s in d.awaiting
        if s in denied or (s not in approved and not loaded.spec.approve_compensations):
            assert not [e for e in d.effects if e.step == s and not isinstance(e, ex.Note)]


@PROPS
@given(passes())
def test_a_compensator_that_succeeded_moves_to_its_read_back(loaded):
    d = dc.decide(loaded, random.Random(0))
    for s, u in loaded.mine.items():
        entry = loaded.entries.get(s) or {}
        view = loaded.observe("compensator", u.attempts, 0, s)
        if (u.state == "compensating" and entry.get("stage", "compensating") == "compensating"
                and view is not None and view.state == "succeeded" and not loaded.spec.cancel):
            assert d.runs[s].stage == "verifying"
            assert ex.StartJob(s, "reader", u.attempts, 1) in d.effects


@PROPS
@given(passes())
def test_decide_is_pure_and_its_ending_matches_conclude(loaded):
    one, two = dc.decide(loaded, random.Random(3)), dc.decide(loaded, random.Random(3))
    assert one == two
    assert dc.conclude(loaded, one) == one.ending
    assert one.ending.finished == one.settled
    if one.running:
        assert not one.settled
