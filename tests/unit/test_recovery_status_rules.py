"""Rules 15 and 16 in the pure engine: two phases (inverses first, dependencies win), the
compensation deadline, and the step statuses alreadyRecovered, expired, handlerUnavailable,
conflict and compensationDeadlinePassed (plan, executor, report)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reversi.engine import executor as ex
from reversi.engine import build_graph, build_plan, build_report, deferred_steps, initial_progress, is_finished
from reversi.engine.plan import BLOCKING_KINDS, EXPIRED, HANDLER_UNAVAILABLE
from reversi.engine.report import BUCKET_FIELDS, StepOutcome, bucket_of, outcome_reason
from reversi.engine.schedule import (ALREADY_RECOVERED, AWAITING_APPROVAL, COMPENSATED, CONFLICT, DEADLINE_PASSED,
                                     DEFERRED, FAILED, HANDLER_UNAVAILABLE as HANDLER_STATE, PENDING, RUNNING, SETTLED,
                                     closed_steps, ready_steps)
from reversi_testkit import RUN_ID, run_spec, step, tool

T0 = 1_800_000_000.0
RECORDED = "2027-01-15T08:00:00Z"  # = T0


def kinded(name, kind="inverse", requires=(), **compensation):
    entry = tool(name, requires=list(requires))
    entry["compensation"].update(kind=kind, **compensation)
    return entry


def setup(steps, **kw):
    spec = run_spec(steps)
    graph = build_graph(spec)
    return build_plan(spec, run_id=RUN_ID, graph=graph, **kw), graph


# ------------------------------------------------------------------------------ two phases

def test_phase1_inverses_start_before_newer_compensations():
    plan, graph = setup([step(0, kinded("inv")), step(1, kinded("amend", "compensation"))])
    progress = initial_progress(plan)
    assert ready_steps(plan, graph, progress, parallelism=4) == [0]  # not newest first: the inverse first
    progress[0] = RUNNING
    assert ready_steps(plan, graph, progress, parallelism=4) == []  # inverses run to completion
    progress[0] = FAILED  # ... continuing past failures
    assert ready_steps(plan, graph, progress, parallelism=4) == [1]


def test_dependencies_win_over_phase_order():
    # step 1 (a compensation) requires step 0's tool (an inverse): 1 must be undone first
    plan, graph = setup([step(0, kinded("inv")), step(1, kinded("amend", "compensation", requires=["inv"]))])
    progress = initial_progress(plan)
    assert ready_steps(plan, graph, progress, parallelism=4) == [1]
    progress[1] = COMPENSATED
    assert ready_steps(plan, graph, progress, parallelism=4) == [0]


def test_compensation_deadline_closes_the_compensation_phase_only():
    plan, graph = setup([step(0, kinded("amend", "compensation")), step(1, kinded("inv"))])
    progress = initial_progress(plan)
    assert ready_steps(plan, graph, progress, 4, compensations_open=False) == [1]
    progress[1] = COMPENSATED
    assert ready_steps(plan, graph, progress, 4, compensations_open=False) == []
    assert is_finished(plan, graph, progress, compensations_open=False)
    assert closed_steps(plan, graph, progress) == [0]


# ---------------------------------------------------------------------- plan: expired, handler

def test_expired_after_the_window_and_its_dependencies_deferred():
    steps = [dict(step(0, kinded("charge")), recordedAt=RECORDED),
             dict(step(1, kinded("capture", requires=["charge"], windowSeconds=60)), recordedAt=RECORDED)]
    plan, _ = setup(steps, now=T0 + 30)
    assert [a.kind for a in plan.actions] == ["compensate", "compensate"]
    plan, _ = setup(steps, now=T0 + 61)
    assert plan.actions[1].kind == EXPIRED and "within 60s of recordedAt" in plan.actions[1].reason
    assert plan.actions[0].kind == "defer" and plan.actions[0].blocked_by == [1]
    assert plan.fully_reversible is False


def test_a_missing_runner_makes_only_its_step_handler_unavailable():
    steps = [step(0, kinded("a")), step(1, kinded("b", runner="gone"))]
    plan, _ = setup(steps, handlers=["cli"])
    assert [a.kind for a in plan.actions] == ["compensate", HANDLER_UNAVAILABLE]
    assert "runner gone" in plan.actions[1].reason
    assert setup(steps)[0].actions[1].kind == "compensate"  # handlers not known: not judged


# --------------------------------------------------------------------------- executor guards

def _read(output):
    return lambda role, attempt, read: ex.JobView("succeeded", output=output)


PRECHECK = ex.VerifyPlan("reader", tool="get", args={}, expect={"gone": True}, runner="cli")
PRE = ex.VerifyPlan("reader", tool="witness", args={}, expect={"state": "held"}, runner="cli")
POLICY = ex.Policy(retries=2, base_ms=10, max_ms=20)


def test_precheck_that_matches_is_already_recovered_and_runs_no_compensator():
    run, effects = ex.start(ex.StepRun(0), None, ex.Guards(precheck=PRECHECK))
    assert run.stage == "prechecking" and effects == [ex.StartJob(0, "precheck", 1, 0)]
    done, effects = ex.advance(run, _read('{"gone": true}'), PRECHECK, POLICY, 0.0, guards=ex.Guards(precheck=PRECHECK))
    assert done.stage == "alreadyRecovered"
    assert not [e for e in effects if isinstance(e, (ex.StartJob, ex.Journal))]


def test_precheck_that_does_not_match_starts_the_compensator_of_the_same_attempt():
    run, _ = ex.start(ex.StepRun(0), None, ex.Guards(precheck=PRECHECK))
    new, effects = ex.advance(run, _read('{"gone": false}'), PRECHECK, POLICY, 0.0, guards=ex.Guards(precheck=PRECHECK))
    assert new.stage == "compensating" and new.attempts == 1
    assert ex.Journal(0, "compensating", 1) in effects and ex.StartJob(0, "compensator", 1) in effects


def test_precondition_that_fails_is_a_conflict_unless_forced():
    guards = ex.Guards(precondition=PRE)
    run, effects = ex.start(ex.StepRun(0), None, guards)
    assert run.stage == "preconditioning" and effects == [ex.StartJob(0, "precondition", 1, 0)]
    new, effects = ex.advance(run, _read('{"state": "shipped"}'), PRECHECK, POLICY, 0.0, guards=guards)
    assert new.stage == "conflict" and 'state is "shipped"' in new.error
    assert not [e for e in effects if isinstance(e, (ex.StartJob, ex.Journal))]
    forced = ex.Guards(precondition=PRE, forced_by="alice")
    new, effects = ex.advance(run, _read('{"state": "shipped"}'), PRECHECK, POLICY, 0.0, guards=forced)
    assert new.stage == "compensating" and new.forced_by == "alice"
    assert any(isinstance(e, ex.Note) and e.reason == "Forced" and "alice" in e.message for e in effects)
    held, _ = ex.advance(run, _read('{"state": "held"}'), PRECHECK, POLICY, 0.0, guards=guards)
    assert held.stage == "compensating" and held.forced_by is None


def test_a_precondition_that_could_not_be_read_is_not_undone_and_says_to_fix_the_read_not_to_force():
    """Rule 16: nothing is known of the state, so nothing is written; the advice is the read's error."""
    guards = ex.Guards(precondition=PRE)
    run, _ = ex.start(ex.StepRun(0), None, guards)
    failed = lambda role, attempt, read: ex.JobView("failed", message="get ConfigMap shop/x is forbidden")  # noqa: E731
    new, effects = ex.advance(run, failed, PRECHECK, POLICY, 0.0, guards=guards)
    assert new.stage == "conflict" and "could not be read" in new.error and "is forbidden" in new.error
    assert "force it with" not in new.error and not [e for e in effects if isinstance(e, (ex.StartJob, ex.Journal))]


def test_a_cancel_during_a_guard_read_starts_no_compensator():
    """Cancel (point 6) meets the guards (point 5): the read's answer is in, but no new Job starts."""
    stopped = ex.Policy(retries=2, base_ms=10, max_ms=20, stop="the request was cancelled by bob")
    run, _ = ex.start(ex.StepRun(0), None, ex.Guards(precheck=PRECHECK))
    precheck = ex.Guards(precheck=PRECHECK)
    new, effects = ex.advance(run, _read('{"gone": false}'), PRECHECK, stopped, 0.0, guards=precheck)
    assert new.stage == "cancelled" and "bob" in new.error and effects == []
    found, _ = ex.advance(run, _read('{"gone": true}'), PRECHECK, stopped, 0.0, guards=precheck)
    assert found.stage == "alreadyRecovered"  # a finished read is recorded with its true answer
    guards = ex.Guards(precondition=PRE)
    run, _ = ex.start(ex.StepRun(0), None, guards)
    new, effects = ex.advance(run, _read('{"state": "held"}'), PRECHECK, stopped, 0.0, guards=guards)
    assert new.stage == "cancelled" and effects == []


def test_a_refused_compensator_job_is_handler_unavailable_and_settles_the_journal():
    run, _ = ex.start(ex.StepRun(0), None)
    new, effects = ex.unavailable(run, "cannot create the compensator Job: forbidden")
    assert new.stage == "handlerUnavailable"
    assert [e.state for e in effects if isinstance(e, ex.Journal)] == ["compensationFailed"]


# ---------------------------------------------------------------------------- properties

NAMES = ["a", "b", "c", "d"]


@st.composite
def mixed_runs(draw):
    """Random runs whose tools mix inverse and compensation kinds, undo windows and missing runners."""
    entries = {}
    for name in NAMES:
        entry = kinded(name, draw(st.sampled_from(["inverse", "compensation"])),
                       requires=draw(st.lists(st.sampled_from(NAMES), max_size=2, unique=True)))
        if draw(st.integers(0, 5)) == 0:
            entry["compensation"]["windowSeconds"] = 10
        if draw(st.integers(0, 5)) == 0:
            entry["compensation"]["runner"] = "gone"
        if draw(st.integers(0, 5)) == 0:
            entry = tool(name, draw(st.sampled_from(["read", "irreversible"])))
        entries[name] = entry
    steps = []
    for i in range(draw(st.integers(1, 14))):
        deps = draw(st.lists(st.integers(0, i - 1), max_size=2, unique=True)) if i else []
        outcome = draw(st.sampled_from(["succeeded"] * 5 + ["failed", "uncertain"]))
        steps.append(dict(step(i, entries[draw(st.sampled_from(NAMES))], outcome, depends_on=deps),
                          recordedAt=RECORDED))
    spec = run_spec(steps)
    graph = build_graph(spec)
    plan = build_plan(spec, run_id=RUN_ID, graph=graph, handlers=["cli"], now=T0 + draw(st.sampled_from([0, 60])))
    return graph, plan


def _unsettled(plan, progress, t):
    kind = plan.actions[t].kind
    return progress.get(t, PENDING) not in SETTLED if kind == "compensate" else kind in BLOCKING_KINDS


def _allowed_inverses(plan, graph, progress):
    """Inverse-kind steps that dependencies allow and that are pending or running (brute force)."""
    out = set()
    for a in plan.actions:
        if a.kind != "compensate" or a.compensation_kind != "inverse":
            continue
        state = progress.get(a.step, PENDING)
        if state == RUNNING or (state == PENDING and
                                not any(_unsettled(plan, progress, t) for t in graph.dependents(a.step))):
            out.add(a.step)
    return out


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), run=mixed_runs())
def test_property_phases_never_break_a_dependency_and_every_step_gets_one_status(data, run):
    graph, plan = run
    parallelism = data.draw(st.integers(1, 3))
    progress = initial_progress(plan, approve_all=True)
    open_ = True
    results = [COMPENSATED, COMPENSATED, FAILED, ALREADY_RECOVERED, CONFLICT, HANDLER_STATE]
    for _ in range(4 * len(plan.actions) + 4):
        open_ = open_ and data.draw(st.integers(0, 7)) > 0  # the compensation deadline may pass
        ready = ready_steps(plan, graph, progress, parallelism, compensations_open=open_)
        for s in ready:
            # phase order never breaks a dependency: no dependent of s is unsettled
            assert not any(_unsettled(plan, progress, t) for t in graph.dependents(s)), (s, progress)
            if plan.actions[s].compensation_kind != "inverse":
                # no compensation-kind step starts while an allowed inverse is pending or running
                assert not _allowed_inverses(plan, graph, progress), (s, progress)
                assert open_
        for s in ready:
            progress[s] = RUNNING
        running = [s for s, state in progress.items() if state == RUNNING]
        if not running:
            break
        progress[data.draw(st.sampled_from(running))] = data.draw(st.sampled_from(results))
    assert is_finished(plan, graph, progress, compensations_open=open_)
    outcomes = {s: StepOutcome(state, verification="verified" if state == COMPENSATED else None, error="why")
                for s, state in progress.items()}
    for s in closed_steps(plan, graph, progress) if not open_ else []:
        progress[s] = DEADLINE_PASSED
        outcomes[s] = StepOutcome(DEADLINE_PASSED)
    for s, blockers in deferred_steps(plan, graph, progress).items():
        outcomes[s] = StepOutcome(DEFERRED, blocked_by=tuple(blockers))
    report = build_report(plan, outcomes)
    placed = bucket_of(report)
    assert report.pending == []  # at the end every step is settled somewhere
    assert sorted(placed) == list(range(len(plan.actions)))
    assert all(len(fields) == 1 for fields in placed.values()), placed  # exactly one bucket, one status
    assert not (set(progress.values()) & {PENDING, RUNNING, AWAITING_APPROVAL}) or report.deferred \
        or report.compensation_deadline_passed
    assert report.complete == all(f in ("compensated", "skipped", "already_recovered")
                                  for fields in placed.values() for f in fields)
    reason = outcome_reason(report)
    undone = any(placed[s][0] in ("compensated", "unverified", "already_recovered") for s in placed)
    assert reason == ("AllCompensated" if report.complete else "Partial" if undone else "NotPossible")
    assert set(BUCKET_FIELDS) >= {f for fields in placed.values() for f in fields}
