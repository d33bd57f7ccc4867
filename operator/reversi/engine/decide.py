"""The decision of one reconcile pass of a RollbackRequest: pure.

A pass *loads* what the API holds (the request, its Run and journal, the Jobs), *decides* here,
then *acts* (journal first, then Jobs, then Events: rule 3) and writes the request's status.
:func:`decide` takes what was loaded (:class:`PassInputs`) and returns a :class:`Decision`:

1. **Rebuild each step** (:func:`rebuild`) from the request's status (in-flight detail: stage,
   reads, next attempt) and the Run's journal. The journal outranks the status: it is written
   first (rule 3), so a step journaled ``compensated`` is never started again whatever the status
   says, and one journaled ``compensating`` is resumed at that attempt. A step that needs approval
   waits for it (``awaitingApproval``, rule 8) unless approved by step or for all; a denied step
   is not undone, for good.
2. **Re-verify** (rule 5) each undo an earlier request left ``unverified`` whose declared reader
   can run now.
3. **Move every active step on** (:func:`reversi.engine.executor.advance`), give up the waiting
   ones once the request's deadline passed or it was cancelled, mark the steps a cancelled request
   did not start ``cancelled``, and start what the schedule allows (newest first, dependents
   first, within ``parallelism``; rule 1) — nothing starts after the deadline or a cancel.
4. **End** (:func:`conclude`): whether the rollback is finished, the steps that did not start
   before ``compensationDeadlineSeconds`` closed, the deferred steps, each step's outcome and the
   report (docs/concepts.md#the-report).

Nothing here calls the API, reads the clock or keeps metrics: ``now`` and ``started`` come in,
Jobs are seen through ``observe`` (a read-only lookup), and the random source for backoff jitter
is an argument. The effects come out in the order they must be carried out.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..models.rollbackrequest import Plan, PlanAction, Report, RollbackRequestSpec
from ..models.run import RunSpec, StepUndo
from . import executor as ex
from .graph import Graph
from .plan import COMPENSATE, undo_by_step
from .report import StepOutcome, build_report
from .schedule import closed_steps, deferred_steps, is_finished, ready_steps

#: condition reasons the decision writes or reads on a step (the same strings as
#: :mod:`reversi.conditions`, which the engine does not import; a unit test keeps them equal)
VERIFIED = "Verified"
NO_READ_BACK_DECLARED = "NoReadBackDeclared"
NO_READER = "NoReader"
READ_BACK_REQUIRED = "ReadBackRequired"
CANCELLED = "Cancelled"
DENIED = "Denied"
VERIFICATION_ARGUMENTS_UNAVAILABLE = "VerificationArgumentsUnavailable"
COMPENSATION_DEADLINE_PASSED = "CompensationDeadlinePassed"
DEADLINE_EXCEEDED = "DeadlineExceeded"

#: ``observe(role, attempt, read, step)``: what the Job of that step, role, attempt and read did,
#: or None when it does not exist (a read-only lookup: the pass loaded the Jobs)
Observe = Callable[[ex.Role, int, int, int], "ex.JobView | None"]


@dataclass(frozen=True)
class PassInputs:
    """What one pass loaded, the input of :func:`decide`.

    ``request``: the request's name; ``spec``: its spec (approvals, denials, force, retries,
    backoff, verification policy, deadlines, parallelism, cancel); ``plan`` and ``graph``: the
    plan of the Run as pinned at the lock (``plan.actions[i].step == i``); ``run``: that Run's spec
    (steps, snapshots, resolutions); ``mine``: this request's journal entries by step; ``prior``:
    the entries of earlier requests; ``entries``: the request's ``status.steps`` by step (the last
    pass's in-flight detail); ``now`` and ``started`` (the request's ``startTime``): epoch
    seconds; ``floor``: the steps below it wait for a child run (nested runs, 0 without);
    ``runner_names``: the runners the request recorded (``status.runners``); ``readers``:
    ``{read-back tool: runner}``; ``observe``: see :data:`Observe`."""

    request: str
    spec: RollbackRequestSpec
    plan: Plan
    graph: Graph
    run: RunSpec
    mine: Mapping[int, StepUndo]
    prior: Sequence[StepUndo]
    entries: Mapping[int, Mapping[str, Any]]
    now: float
    started: float
    observe: Observe
    floor: int = 0
    runner_names: frozenset[str] = frozenset()
    readers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Ending:
    """How the pass ends (:func:`conclude`): ``runs`` and ``progress`` with the steps the closed
    compensation phase kept from starting (``compensationDeadlinePassed``, once finished);
    ``finished``: nothing can move any more; ``deferred``: ``{step: blockedBy}``; ``outcomes``
    by step and the ``report`` (docs/concepts.md#the-report) of the request's own run."""

    runs: Mapping[int, ex.StepRun]
    progress: Mapping[int, str]
    finished: bool
    deferred: Mapping[int, list[int]]
    outcomes: Mapping[int, StepOutcome]
    report: Report


@dataclass(frozen=True)
class Decision:
    """What one pass does (:func:`decide`).

    ``runs``: each compensate step's progress after the pass moved it, ``reverify`` the undos of
    earlier requests read back by this one; ``progress``: ``{step: schedule state}``;
    ``effects``: in order (journal, Jobs, Events are carried out in that order: rule 3);
    ``moves``: ``(before, after)`` of each step the pass advanced or started, re-verified undos
    included (for timing);
    ``verify_plans`` and ``guards`` by step (what the Jobs run); ``approved``/``approved_all_by``:
    who approved; ``stop``: why no new Job starts (cancel), or None; ``deadline_passed``,
    ``compensations_open``; ``running``: a Job runs or a step waits for its next attempt or
    read; ``awaiting``: steps waiting for an approval (not denied); ``settled``: nothing of the
    request's own steps can move any more; ``ending``: :func:`conclude` with no child run left."""

    runs: Mapping[int, ex.StepRun]
    reverify: Mapping[int, ex.StepRun]
    progress: Mapping[int, str]
    effects: tuple[ex.Effect, ...]
    moves: tuple[tuple[ex.StepRun, ex.StepRun], ...]
    verify_plans: Mapping[int, ex.VerifyPlan]
    guards: Mapping[int, ex.Guards]
    approved: Mapping[int, str]
    approved_all_by: str | None
    stop: str | None
    deadline_passed: bool
    compensations_open: bool
    running: bool
    awaiting: list[int]
    settled: bool
    ending: Ending


def stop_reason(spec: RollbackRequestSpec) -> str | None:
    """Why no new Job may start: ``the request was cancelled by <who>`` (``spec.cancel``), or None."""
    return f"the request was cancelled by {spec.cancelled_by or 'an unknown user'}" if spec.cancel else None


def deadline_text(spec: RollbackRequestSpec) -> str:
    """Why a waiting step gives up once ``spec.deadlineSeconds`` passed."""
    return f"the request's deadline ({spec.deadline_seconds}s) passed"


def epoch(ts: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 time (``...Z``), None for None or ``""``."""
    if not ts:
        return None
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def step_guards(snapshot, verify: ex.VerifyPlan, args: dict | None, result: dict | None,
                forced_by: str | None) -> ex.Guards:
    """What runs before a step's compensator (rule 16, guards): the precheck read when the compensation
    asks for it and a reader can run, the precondition read when declared, and who forced it."""
    comp = snapshot.compensation if snapshot is not None else None
    precheck = verify if comp is not None and comp.precheck and verify.mode == "reader" else None
    return ex.Guards(precheck=precheck, precondition=ex.precondition_plan(snapshot, args, result), forced_by=forced_by)


def verification_reason(verification: str | None) -> str:
    """The Verified condition reason of a journaled verification."""
    return {"verified": VERIFIED, "none": NO_READ_BACK_DECLARED}.get(verification or "", NO_READER)


def _said(entry: Mapping[str, Any] | None) -> str | None:
    """The reason of the Verified condition a status entry shows."""
    for cond in (entry or {}).get("conditions") or ():
        if cond.get("type") == VERIFIED:
            return cond.get("reason")
    return None


def rebuild(action: PlanAction, entry: Mapping[str, Any] | None, journaled: StepUndo | None,
            approved: Mapping[int, str], approved_all_by: str | None,
            denied: Mapping[int, str] | None = None) -> ex.StepRun:
    """A step's progress at the start of a pass, from the request's status entry (in-flight
    detail) and the Run's journal, which outranks it (it is written first, rule 3): journaled
    ``compensated`` is compensated; ``compensationFailed`` is failed unless the status shows a
    later attempt under way (or a guard read before one); ``compensating`` resumes a step the
    status shows not started (or failed), and resumes the journaled attempt of a step the status
    shows ``retrying`` an earlier one (never the attempt after it). A final stage of this
    request in which nothing was undone stays. A step not started waits for approval when it
    needs one it does not have (rule 8); a denied one waits for good (reason ``Denied``)."""
    s = action.step
    if entry and entry.get("stage") in ex.STAGES and entry.get("stage") not in ("deferred",):
        run = ex.StepRun(s, stage=entry["stage"], attempts=entry.get("attempts", 0), reads=entry.get("reads", 0),
                         lost_reads=entry.get("lostReads", 0),
                         next_at=epoch(entry.get("nextAttemptAt")), error=entry.get("lastError"),
                         first_attempt=entry.get("firstAttempt"), forced_by=entry.get("forcedBy"),
                         effect_unknown=bool(entry.get("effectUnknown")))
    else:
        run = ex.StepRun(s)
    if run.stage in ex.NOT_UNDONE_STAGES:  # final in this request (a refused Job's journal says compensationFailed)
        return run
    if journaled is not None:
        # the journal outranks the request's status: it is written first (rule 3)
        if journaled.state == "compensated":
            reason = verification_reason(journaled.verification)
            said = _said(entry)
            if journaled.verification == "unverified" and said in (READ_BACK_REQUIRED, CANCELLED, DEADLINE_EXCEEDED):
                reason = said  # why it is unchecked, as the pass that undid it said (not in the journal)
            return replace(run, stage="compensated", attempts=journaled.attempts,
                           verification=journaled.verification, error=None, reason=reason, effect_unknown=False)
        # failed for good at this attempt: the status (still showing its Jobs under way) was not
        # written before a crash, and those Jobs may be gone (ttlSecondsAfterFinished): never again.
        # A guard read (precheck, precondition) comes before the next attempt: it goes on.
        ended = (run.stage in ex.ACTIVE_STAGES and run.stage not in ("prechecking", "preconditioning")
                 and run.attempts <= journaled.attempts)
        if journaled.state == "compensationFailed" and (run.stage not in ex.ACTIVE_STAGES or ended):
            why = VERIFICATION_ARGUMENTS_UNAVAILABLE if _said(entry) == VERIFICATION_ARGUMENTS_UNAVAILABLE \
                else run.reason
            return replace(run, stage="failed", attempts=journaled.attempts, verification=journaled.verification,
                           error=journaled.last_error, reason=why, effect_unknown=bool(journaled.effect_unknown))
        if journaled.state == "compensating" and run.stage in ("pending", "awaitingApproval", "failed"):
            return replace(run, stage="compensating", attempts=journaled.attempts)
        if journaled.state == "compensating" and run.stage == "retrying" and journaled.attempts > run.attempts:
            # the retry's attempt was journaled, then the pass ended before the status said so
            # (a crash, or its Job create failed on the way): resume that attempt, never the next
            return replace(run, stage="compensating", attempts=journaled.attempts, next_at=None)
        run = replace(run, attempts=max(run.attempts, journaled.attempts))
    if run.stage in ("pending", "awaitingApproval"):
        needs = action.needs_approval and s not in approved and approved_all_by is None
        run = replace(run, stage="awaitingApproval" if needs else "pending")
        if denied and s in denied:  # a denial of a step not started: it is not undone, for good
            run = replace(run, stage="awaitingApproval", reason=DENIED, error=denied[s])
    return run


def outcomes(runs: Mapping[int, ex.StepRun], deferred: Mapping[int, list[int]], prior: Sequence[StepUndo],
             finished: bool, reverify: Mapping[int, ex.StepRun] | None = None) -> dict[int, StepOutcome]:
    """Each step's outcome for the report: the undos earlier requests settled (rule 6: reported,
    never redone), the read-backs of this pass, then this request's steps (a step blocked for good
    is ``deferred`` only once the rollback is finished)."""
    out: dict[int, StepOutcome] = {}
    for u in prior:  # settled by earlier requests (rule 6): reported, never redone
        if u.state == "compensated":
            out[u.step] = StepOutcome("compensated", verification=u.verification)
        elif u.state == "compensationFailed" and u.verification == "verificationFailed" and u.verified_by:
            out[u.step] = StepOutcome("compensated", verification=u.verification, error=u.last_error,
                                      effect_unknown=bool(u.effect_unknown))
    for s, r in (reverify or {}).items():  # read back in this pass (the journal just written)
        if r.stage in ("compensated", "failed"):
            out[s] = StepOutcome("compensated", verification=r.verification, error=r.error,
                                 effect_unknown=r.effect_unknown)
    for s, r in runs.items():
        if r.stage == "compensated":
            out[s] = StepOutcome("compensated", verification=r.verification, forced_by=r.forced_by)
        elif r.stage in ex.NOT_UNDONE_STAGES:
            out[s] = StepOutcome(r.stage, error=r.error)
        elif r.stage == "failed":
            out[s] = StepOutcome("failed", verification=r.verification, error=r.error, effect_unknown=r.effect_unknown)
        elif r.stage == "awaitingApproval":
            out[s] = StepOutcome("awaitingApproval", error=r.error if r.reason == DENIED else None)
        elif r.stage == "cancelled":
            out[s] = StepOutcome("cancelled", error=r.error)
        elif finished and s in deferred:
            out[s] = StepOutcome("deferred", blocked_by=tuple(deferred[s]))
        elif r.stage in ex.ACTIVE_STAGES:
            out[s] = StepOutcome("running")
        else:
            out[s] = StepOutcome("pending")
    return out


def journal_entry(j: ex.Journal, *, key: str, request: str, at: str | None, error: str | None,
                  earlier: StepUndo | None = None) -> StepUndo:
    """The undo entry a :class:`~reversi.engine.executor.Journal` effect writes on the step's
    RunStep (rule 3): ``key`` the step's idempotency key, ``request`` this request's name, ``at``
    the time (RFC 3339), ``error`` the effect's error as it is kept (shortened). A read-back of an
    earlier request's undo (``earlier``, rule 5) keeps the undo that request's (its attempts, key
    and request) and records this one as the checker (``verifiedBy``, ``verifiedAt``).
    ``effectUnknown`` is written only for a failed undo whose effect nobody knows
    (:attr:`~reversi.engine.executor.Journal.effect_unknown`)."""
    unknown = True if j.effect_unknown else None  # written only when true
    if earlier is not None:
        return StepUndo(step=j.step, state=j.state, attempts=earlier.attempts, idempotency_key=earlier.idempotency_key,
                        verification=j.verification, last_error=error, request=earlier.request,
                        updated_at=at, verified_by=request, verified_at=at, effect_unknown=unknown)
    return StepUndo(step=j.step, state=j.state, attempts=j.attempts, idempotency_key=key, last_error=error,
                    verification=j.verification, request=request, updated_at=at, effect_unknown=unknown)


def _reverify(inputs: PassInputs, verify_plans: dict[int, ex.VerifyPlan]) -> dict[int, ex.StepRun]:
    """The undos of earlier requests this request reads back (rule 5): the ones it read back in an
    earlier pass (shown as they ended), and every undo left ``unverified`` whose declared reader
    can run now. Adds their read-back plans to ``verify_plans``."""
    steps_by_index = {s.index: s for s in inputs.run.steps}
    resolutions = {r.step: r for r in inputs.run.resolutions}
    reverify: dict[int, ex.StepRun] = {}
    for u in inputs.prior:
        if u.verified_by == inputs.request:  # read back by this request in an earlier pass: keep showing it
            done_step = steps_by_index.get(u.step)
            done_snap = inputs.run.snapshot_of(done_step) if done_step is not None else None
            verify_plans[u.step] = ex.VerifyPlan("reader", tool=done_snap.verification.tool
                                                 if done_snap is not None and done_snap.verification else None)
            reverify[u.step] = ex.StepRun(u.step, stage="compensated" if u.state == "compensated" else "failed",
                                          attempts=u.attempts, reads=(inputs.entries.get(u.step) or {}).get("reads", 1),
                                          verification=u.verification, error=u.last_error,
                                          effect_unknown=bool(u.effect_unknown))
            continue
        if u.state != "compensated" or u.verification != "unverified" or u.verified_by is not None:
            continue
        step = steps_by_index.get(u.step)
        snapshot = inputs.run.snapshot_of(step) if step is not None else None
        if step is None or snapshot is None or snapshot.verification is None:
            continue
        res = resolutions.get(u.step)
        vp = ex.verify_plan(snapshot, step.args, res.result if res and res.result is not None else step.result,
                            inputs.runner_names, inputs.readers)
        if vp.mode != "reader":
            continue
        verify_plans[u.step] = vp
        entry = inputs.entries.get(u.step) or {}
        if entry.get("stage") in ("verifying", "rereading"):
            reverify[u.step] = ex.StepRun(u.step, stage=entry["stage"], attempts=u.attempts,
                                          reads=entry.get("reads", 1), lost_reads=entry.get("lostReads", 0),
                                          next_at=epoch(entry.get("nextAttemptAt")),
                                          error=entry.get("lastError"), effect_unknown=bool(entry.get("effectUnknown")))
        else:
            reverify[u.step] = ex.StepRun(u.step, stage="verifying", attempts=u.attempts, reads=1)
    return reverify


def decide(inputs: PassInputs, rng: random.Random | None = None) -> Decision:
    """The decision of one pass (see the module docstring). ``rng``: the random source of the
    backoff jitter (None: the module's). Pure but for ``rng`` and the ``observe`` lookup; raises
    nothing for a plan built from ``inputs.run`` (a step of the plan missing from it: KeyError)."""
    spec, plan, now, started = inputs.spec, inputs.plan, inputs.now, inputs.started
    cancelling = spec.cancel
    stop = stop_reason(spec)
    approved = {a.step: (a.approver or "an unknown approver") for a in spec.approvals}
    approved_all_by = (spec.approved_by or "an unknown approver") if spec.approve_compensations else None
    denied = {d.step: f"denied by {d.actor or 'an unknown user'}: {d.note}" for d in spec.denials}
    forced = {f.step: (f.actor or "an unknown user") for f in spec.force}
    steps_by_index = {s.index: s for s in inputs.run.steps}
    resolutions = {r.step: r for r in inputs.run.resolutions}

    # ---- each step, rebuilt from status and journal ----
    runs: dict[int, ex.StepRun] = {}
    verify_plans: dict[int, ex.VerifyPlan] = {}
    guards: dict[int, ex.Guards] = {}
    for action in plan.of_kind(COMPENSATE):
        s = action.step
        step = steps_by_index[s]
        res = resolutions.get(s)
        args, result = step.args, (res.result if res and res.result is not None else step.result)
        snapshot = inputs.run.snapshot_of(step)
        verify_plans[s] = ex.verify_plan(snapshot, args, result, inputs.runner_names, inputs.readers)
        guards[s] = step_guards(snapshot, verify_plans[s], args, result, forced.get(s))
        runs[s] = rebuild(action, inputs.entries.get(s), inputs.mine.get(s), approved, approved_all_by, denied)
    reverify = _reverify(inputs, verify_plans)

    # ---- move them on ----
    deadline_passed = spec.deadline_seconds is not None and now > started + spec.deadline_seconds
    policy = ex.Policy(spec.retries, spec.backoff.base_ms, spec.backoff.max_ms, check=bool(spec.verify_command),
                       require_verification=spec.require_verification, stop=stop)
    effects: list[ex.Effect] = []
    moves: list[tuple[ex.StepRun, ex.StepRun]] = []

    def seen(s: int) -> Callable[[ex.Role, int, int], ex.JobView | None]:
        return lambda role, attempt, read: inputs.observe(role, attempt, read, s)

    for s, run in list(runs.items()):
        if (deadline_passed or cancelling) and run.stage in ("retrying", "rereading"):
            runs[s], eff = ex.give_up(run, stop or deadline_text(spec),
                                      ex.CANCELLED_REASON if cancelling else DEADLINE_EXCEEDED)
            effects += eff
            continue
        if run.stage in ex.ACTIVE_STAGES:
            new, eff = ex.advance(run, seen(s), verify_plans[s], policy, now, rng, guards[s])
            runs[s] = new
            effects += eff
            moves.append((run, new))
    for s, run in list(reverify.items()):
        if cancelling and run.stage == "verifying" and inputs.observe("reader", run.attempts, run.reads, s) is None:
            del reverify[s]  # its read-back has not started: no new Job; the undo stays unverified
            continue
        if (deadline_passed or cancelling) and run.stage == "rereading":
            new, eff = ex.give_up(run, stop or deadline_text(spec))
        else:
            new, eff = ex.advance(run, seen(s), verify_plans[s], policy, now, rng)
        reverify[s] = new
        effects += eff
        moves.append((run, new))  # a read-back of an earlier undo is timed like any other
    if cancelling:
        runs = {s: ex.cancel(r, stop or "") for s, r in runs.items()}
    progress = {s: ex.schedule_state(r.stage) for s, r in runs.items()}
    # the compensation phase closes at spec.compensationDeadlineSeconds (checked before each start)
    open_ = not spec.compensation_deadline_seconds or now <= started + spec.compensation_deadline_seconds
    if not deadline_passed and not cancelling:
        journaled = undo_by_step([*inputs.mine.values(), *inputs.prior])
        for s in ready_steps(plan, inputs.graph, progress, spec.parallelism, compensations_open=open_,
                             floor=inputs.floor, holding=ex.holding_slots(runs)):
            new, eff = ex.start(runs[s], journaled.get(s), guards[s])
            moves.append((runs[s], new))
            runs[s] = new
            progress[s] = ex.schedule_state(new.stage)
            effects += eff

    moved = Decision(runs=runs, reverify=reverify, progress=progress, effects=tuple(effects), moves=tuple(moves),
                     verify_plans=verify_plans, guards=guards, approved=approved, approved_all_by=approved_all_by,
                     stop=stop, deadline_passed=deadline_passed, compensations_open=open_,
                     running=False, awaiting=[], settled=False, ending=_NO_ENDING)
    return _summed(inputs, moved)


def refused(inputs: PassInputs, decision: Decision, step: int, why: str) -> tuple[Decision, list[ex.Effect]]:
    """The compensator Job of ``step`` was refused for good (an invalid Job or Secret): the step
    is ``handlerUnavailable`` (:func:`reversi.engine.executor.unavailable`). Returns the decision
    with that step moved (and its ending made again) and the effects to carry out for it (its
    journal entry, then its Event)."""
    new, more = ex.unavailable(decision.runs[step], why)
    runs = {**decision.runs, step: new}
    progress = {**decision.progress, step: ex.schedule_state(new.stage)}
    return _summed(inputs, replace(decision, runs=runs, progress=progress)), more


def conclude(inputs: PassInputs, decision: Decision, children_left: bool = False) -> Ending:
    """How the pass ends: finished when nothing of the request's own steps can move
    (``decision.settled``) and no child run is left to roll back (``children_left``, nested runs).
    Once finished, a step that could start but for the closed compensation phase is
    ``compensationDeadlinePassed`` (not attempted). Then the deferred steps, the outcomes and the
    report of the request's own run."""
    plan, graph, spec = inputs.plan, inputs.graph, inputs.spec
    finished = decision.settled and not children_left
    runs, progress = dict(decision.runs), dict(decision.progress)
    if finished and not decision.compensations_open and not decision.deadline_passed and not spec.cancel:
        for s in closed_steps(plan, graph, progress):  # not started before the compensation deadline
            runs[s] = replace(runs[s], stage="compensationDeadlinePassed", reason=COMPENSATION_DEADLINE_PASSED,
                              error=f"not started: spec.compensationDeadlineSeconds "
                              f"({spec.compensation_deadline_seconds}s) had passed")
            progress[s] = ex.schedule_state(runs[s].stage)
    deferred = deferred_steps(plan, graph, progress)
    out = outcomes(runs, deferred, inputs.prior, finished, decision.reverify)
    report = build_report(plan, out, require_verification=spec.require_verification)
    return Ending(runs=runs, progress=progress, finished=finished, deferred=deferred, outcomes=out, report=report)


def _summed(inputs: PassInputs, decision: Decision) -> Decision:
    """``decision`` with ``running``, ``awaiting``, ``settled`` and ``ending`` made from its runs."""
    runs = decision.runs
    running = any(r.stage in ex.ACTIVE_STAGES for r in [*runs.values(), *decision.reverify.values()])
    awaiting = sorted(s for s, r in runs.items() if r.stage == "awaitingApproval" and r.reason != DENIED)
    settled = (not running) and (decision.deadline_passed or inputs.spec.cancel or is_finished(
        inputs.plan, inputs.graph, decision.progress, compensations_open=decision.compensations_open,
        floor=inputs.floor))
    summed = replace(decision, running=running, awaiting=awaiting, settled=settled)
    return replace(summed, ending=conclude(inputs, summed))


_NO_ENDING = Ending(runs={}, progress={}, finished=False, deferred={}, outcomes={}, report=Report())
