"""The life of one compensation: journal, compensator, retries, extra check, read-back (rules 3–5).

Pure: the caller observes Jobs and passes what it saw; this module answers with the step's new
state and the *effects* to carry out, in order. The handler carries them out in that order —
journal first (rule 3), then Jobs — and then writes the request's status.

Stages of a step (``StepRun.stage``)::

    pending ─start─> compensating ─ok─> [checking ─ok─>] verifying ─match─> compensated (verified)
       │                 │ fail                              │ mismatch / failed read
       │                 └─> retrying ─backoff─> compensating└─> rereading ─backoff─> verifying
       │                        (attempts < retries)      (answered reads < verification.retries)
       └─ awaitingApproval (needs approval)           out of attempts or reads ─> failed

    a read-back whose Job failed with no answer from its program (:attr:`JobView.lost`: its pod was
        lost with the node, or never ran to an exit before the Job's deadline) is read again without
        counting against ``verification.retries``, at most :data:`LOST_READS_MAX` times per attempt

    before the compensator (rule 16, guards), when declared: ``prechecking`` (the verification read; it
        already matches: ``alreadyRecovered``, no compensator runs), then ``preconditioning`` (the
        precondition read; it does not match: ``conflict``, not undone, unless forced); the
        compensator Job cannot be made: ``handlerUnavailable`` (:func:`unavailable`)

    no read-back declared: compensated, verification ``none`` (complete; ``unverified`` when the
        request sets ``requireVerification``)
    a read-back declared but no reader runner: compensated (unverified)
    verification arguments missing: failed ("cannot verify: arguments unavailable")

A failed step says whether its effect is unknown (``StepRun.effect_unknown``, journaled with it;
residue ``unknown`` rather than ``failed``, docs/concepts.md#the-report): its last compensator that
ran gave no answer of its own (:attr:`JobView.effect_unknown`: killed by its deadline, evicted,
OOM-killed, lost with its node), or its undo ran and the last read-back that answered failed, or
none can be made. A compensator that answered (exited non-zero by itself) or never ran leaves it
``failed``; so does a read-back that answered with a mismatch.

Cancel (rule 13, ``Policy.stop``): no new Job starts. A running Job finishes and its true
outcome is recorded: a failed attempt is not retried (failed); a successful undo whose check or
read-back has not started is compensated but ``unverified`` (reason ``Cancelled``; a later request
runs the read-back); a mismatching read-back is not read again (failed). A step not started is
``cancelled`` (:func:`cancel`).

Retries are per request (rules 4 and 6): each request gives a step its full ``retries`` budget, counted
starting at the attempt it started at (``StepRun.first_attempt``). Attempt numbers keep increasing across
requests (the run's ``status.undo`` keeps the total), so Job names stay unique, and the
idempotency key is the same on every attempt. A step journaled ``compensating`` is resumed at that
attempt, and its Job, whose name is deterministic, is adopted instead of started again (rule 3).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any, Literal
from collections.abc import Callable, Mapping

from ..models.run import StepUndo
from ..models.toolmanifest import ToolSpec
from .backoff import ceiling_ms, delay_seconds
from .templates import MissingValue, resolve
from .verify import first_mismatch, parse_answer

Stage = Literal["pending", "awaitingApproval", "prechecking", "preconditioning", "compensating", "retrying",
                "checking", "verifying", "rereading", "compensated", "failed", "deferred", "cancelled",
                "alreadyRecovered", "conflict", "handlerUnavailable", "compensationDeadlinePassed"]
STAGES: tuple[str, ...] = ("pending", "awaitingApproval", "prechecking", "preconditioning", "compensating",
                           "retrying", "checking", "verifying", "rereading", "compensated", "failed", "deferred",
                           "cancelled", "alreadyRecovered", "conflict", "handlerUnavailable",
                           "compensationDeadlinePassed")
ACTIVE_STAGES = frozenset({"prechecking", "preconditioning", "compensating", "retrying", "checking", "verifying",
                           "rereading"})
#: stages that hold one of the request's ``parallelism`` slots: its compensation is under way (the
#: reads before it, the compensator, its retries); a step whose undo is done and being checked or
#: read back (checking, verifying, rereading) holds none (``parallelism``: compensations at once)
SLOT_STAGES = frozenset({"prechecking", "preconditioning", "compensating", "retrying"})
#: final stages in which no undo happened in this request (and none is journaled unless a Job was refused)
NOT_UNDONE_STAGES = frozenset({"alreadyRecovered", "conflict", "handlerUnavailable", "compensationDeadlinePassed"})
FINAL_STAGES = frozenset({"compensated", "failed"}) | NOT_UNDONE_STAGES
Role = Literal["compensator", "reader", "check", "precheck", "precondition"]
READ_ROLES = frozenset({"reader", "precheck", "precondition"})

UNAVAILABLE = "cannot verify: arguments unavailable"
#: read-backs of one attempt that gave no answer (:attr:`JobView.lost`) and are read again without
#: counting against ``verification.retries``; past this many, a lost read counts as a failed read
LOST_READS_MAX = 3


@dataclass(frozen=True)
class JobView:
    """What a Job did: ``state`` running, succeeded or failed; ``message`` the error (the
    container's termination message or the Job's failure reason); ``output`` a reader's stdout;
    ``lost`` for a failed Job whose program gave no answer of its own: no pod ran it to an exit
    (the node lost it, or the Job's deadline ended it first). A failed read is an answer (the
    reader exited non-zero, rule 5); a lost one is not.

    ``effect_unknown``, for a failed compensator: its program started and ended without an
    answer of its own (the Job's deadline or an eviction stopped it, the kernel OOM-killed it, a
    signal ended it, the node lost it, or its pod is gone and nothing says it never ran), so
    whether its call took effect is unknown (residue ``unknown``,
    docs/concepts.md#the-report). A failed compensator that is ``lost`` but not
    ``effect_unknown`` never ran its program; one that is neither answered (it exited non-zero by
    itself, or its Job could not be made)."""

    state: Literal["running", "succeeded", "failed"]
    message: str = ""
    output: str | None = None
    lost: bool = False
    effect_unknown: bool = False


@dataclass(frozen=True)
class VerifyPlan:
    """How a compensated step is checked (rule 5).

    ``mode``: ``reader`` (a reader Job runs ``tool`` with ``args`` and must answer ``expect``),
    ``none`` (the manifest declares no verification: compensated with verification ``none``),
    ``noReader`` (declared, but no reader runner is configured: unverified) or ``unavailable``
    (arguments cannot be resolved: the step fails). ``retries`` read-backs, ``backoff_ms`` doubling between them.
    """

    mode: Literal["reader", "none", "noReader", "unavailable"]
    tool: str | None = None
    args: Any = None
    expect: Any = None
    runner: str | None = None
    retries: int = 1
    backoff_ms: int = 0
    detail: str = ""


def verify_plan(snapshot: ToolSpec | None, args: dict | None, result: dict | None,
                runner_names: set[str] | frozenset[str], readers: Mapping[str, str] | None = None) -> VerifyPlan:
    """Decide how a step's undo is checked from its manifest snapshot (rule 5).

    ``args``/``result``: the original call's (after any resolution, rule 7); ``runner_names``:
    runners the ToolManifest defines now; ``readers``: ``{read-back tool: runner}`` the
    ToolManifest gives now. What is read and expected always comes from the snapshot; the reader
    *runner* is the snapshot's when the manifest still defines it, else the one the manifest now
    gives the same read-back tool (a reader configured since). Never raises: missing pieces give ``none``,
    ``noReader`` or ``unavailable``.
    """
    v = snapshot.verification if snapshot is not None else None
    if v is None:
        return VerifyPlan("none", detail="the manifest declares no verification for this tool")
    later = (readers or {}).get(v.tool)
    if (not v.runner or v.runner not in runner_names) and later and later in runner_names:
        v = v.model_copy(update={"runner": later})
    if not v.runner or v.runner not in runner_names:
        what = (f"runner {v.runner!r} is not defined in the ToolManifest" if v.runner
                else "no reader runner is configured")
        return VerifyPlan("noReader", tool=v.tool, detail=what)
    try:
        resolved = resolve(v.args, args, result)
    except MissingValue as err:
        return VerifyPlan("unavailable", tool=v.tool, detail=f"{UNAVAILABLE} ({err})")
    return VerifyPlan("reader", tool=v.tool, args=resolved, expect=v.expect, runner=v.runner,
                      retries=v.retries, backoff_ms=v.backoff_ms)


def precondition_plan(snapshot: ToolSpec | None, args: dict | None, result: dict | None) -> VerifyPlan | None:
    """The precondition read of a step's compensation (rule 16), or ``None`` when none is
    declared: mode ``reader`` (runner: the precondition's, else the compensation's) or
    ``unavailable`` (its arguments cannot be resolved: the precondition cannot be shown to hold)."""
    comp = snapshot.compensation if snapshot is not None else None
    pre = comp.precondition if comp is not None else None
    if pre is None or comp is None:
        return None
    try:
        resolved = resolve(pre.args, args, result)
    except MissingValue as err:
        return VerifyPlan("unavailable", tool=pre.tool, detail=f"precondition arguments unavailable ({err})")
    return VerifyPlan("reader", tool=pre.tool, args=resolved, expect=pre.expect, runner=pre.runner or comp.runner,
                      retries=1)


@dataclass(frozen=True)
class Guards:
    """What runs before a step's compensator (rule 16): ``precheck`` (the verification read,
    when ``compensation.precheck`` and a reader can run), ``precondition`` (its read, when
    declared) and ``forced_by`` (who forced the step with ``spec.force``, or ``None``)."""

    precheck: VerifyPlan | None = None
    precondition: VerifyPlan | None = None
    forced_by: str | None = None


NO_GUARDS = Guards()


@dataclass(frozen=True)
class StepRun:
    """One step's progress inside one request. ``attempts`` counts compensator runs (across
    requests), ``first_attempt`` the first attempt this request ran (its ``retries`` budget starts
    there), ``reads`` read-backs of the current attempt, ``lost_reads`` those of them that gave no
    answer and do not count against ``verification.retries``, ``next_at`` (epoch seconds) when a
    waiting stage moves on; ``verification`` verified, none, unverified or verificationFailed;
    ``forced_by`` who forced the undo although its precondition did not hold (``spec.force``);
    ``effect_unknown`` whether the last answer about the undo leaves its effect unknown: the last
    compensator that ran gave no answer of its own (:attr:`JobView.effect_unknown`), or the last
    read-back that answered failed (not a mismatch), or none can be made (``cannot verify``). A
    step that ends failed with it is residue ``unknown``, without it ``failed``
    (docs/concepts.md#the-report)."""

    step: int
    stage: Stage = "pending"
    attempts: int = 0
    reads: int = 0
    next_at: float | None = None
    error: str | None = None
    verification: str | None = None
    reason: str | None = None
    first_attempt: int | None = None
    forced_by: str | None = None
    lost_reads: int = 0
    effect_unknown: bool = False

    def answered_reads(self) -> int:
        """Read-backs of the current attempt that answered (``reads`` less the lost ones): what
        ``verification.retries`` counts."""
        return self.reads - self.lost_reads

    def attempts_here(self) -> int:
        """Attempts made by this request (its ``retries`` budget counts these)."""
        first = self.first_attempt if self.first_attempt is not None else 1
        return max(self.attempts - first + 1, 0)


@dataclass(frozen=True)
class StartJob:
    """Create (or adopt) the Job ``role`` for ``attempt`` (and read-back ``read``)."""

    step: int
    role: Role
    attempt: int
    read: int = 0


@dataclass(frozen=True)
class Journal:
    """Write the step's undo state on the Run (``status.undo``) — before any Job (rule 3);
    ``effect_unknown``: a failed undo whose effect nobody knows (:attr:`StepRun.effect_unknown`)."""

    step: int
    state: Literal["compensating", "compensated", "compensationFailed"]
    attempts: int
    verification: str | None = None
    error: str | None = None
    effect_unknown: bool = False


@dataclass(frozen=True)
class Note:
    """Something a person should see: a Kubernetes Event on the request (``reason`` CamelCase)."""

    step: int
    reason: str
    message: str
    warning: bool = False


Effect = StartJob | Journal | Note


@dataclass(frozen=True)
class Policy:
    """The request's retry policy: ``retries`` attempts, backoff ``base_ms`` doubling to ``max_ms``;
    ``check`` whether ``verifyCommand`` runs after each successful undo; ``require_verification``
    whether an undo with no read-back declared counts as unverified (``spec.requireVerification``);
    ``stop`` why no new Job may start (``spec.cancel``), or None."""

    retries: int
    base_ms: int
    max_ms: int
    check: bool = False
    require_verification: bool = False
    stop: str | None = None  # why no new Job may start (the request was cancelled), else None


def start(run: StepRun, journaled: StepUndo | None, guards: Guards = NO_GUARDS) -> tuple[StepRun, list[Effect]]:
    """Start a pending step (the scheduler chose it, rule 1).

    A step the run journaled ``compensating`` resumes at that attempt (its Job is adopted);
    otherwise the next attempt after those journaled so far starts (rule 6: same key). The
    request's ``retries`` budget counts from the attempt started here. With ``guards``, the
    precheck read (then the precondition read) runs first; nothing is journaled for a read.
    """
    if journaled is not None and journaled.state == "compensating":
        attempt = max(journaled.attempts, 1)
    else:
        attempt = max(run.attempts, journaled.attempts if journaled else 0) + 1
        # a read runs first: ``attempts`` stays at the last attempt made until the compensator starts
        if guards.precheck is not None:
            return replace(run, stage="prechecking", attempts=attempt - 1, reads=0, next_at=None), [
                StartJob(run.step, "precheck", attempt, 0)]
        if guards.precondition is not None:
            return _precondition(replace(run, attempts=attempt - 1), guards, attempt)
    return _compensate(run, attempt)


def _compensate(run: StepRun, attempt: int) -> tuple[StepRun, list[Effect]]:
    first = run.first_attempt if run.first_attempt is not None else attempt
    new = replace(run, stage="compensating", attempts=attempt, reads=0, next_at=None, first_attempt=first)
    # no Event for a routine start or success (to keep API writes per step few): status.steps and the journal say it;
    # Events are for what a person may need to act on (retries, failures, unverified undos)
    return new, [Journal(run.step, "compensating", attempt), StartJob(run.step, "compensator", attempt)]


def _precondition(run: StepRun, guards: Guards, attempt: int) -> tuple[StepRun, list[Effect]]:
    pre = guards.precondition
    if pre is not None and pre.mode != "reader":  # cannot be shown to hold
        return _conflict(run, pre.detail or "the precondition cannot be read", guards, attempt)
    return (replace(run, stage="preconditioning", reads=0, next_at=None),
            [StartJob(run.step, "precondition", attempt, 0)])


def _conflict(run: StepRun, problem: str, guards: Guards, attempt: int) -> tuple[StepRun, list[Effect]]:
    s = run.step
    tool = guards.precondition.tool if guards.precondition else "the precondition"
    if guards.forced_by:
        new, effects = _compensate(replace(run, reason="Forced", forced_by=guards.forced_by), attempt)
        return new, [Note(s, "Forced", f"step {s}: precondition {tool} does not hold ({problem}); undone anyway: "
                          f"forced by {guards.forced_by}", warning=True), *effects]
    if problem.startswith("read failed"):  # nothing is known of the state: forcing would undo it unseen
        why = (f"precondition {tool} could not be read ({problem}): whether the state changed since is not known; "
               "not undone: fix what the read needs, then re-run (forcing would undo it unseen)")
    else:
        why = f"precondition {tool} does not hold: {problem}; not undone (force it with spec.force, RBAC verb force)"
    return replace(run, stage="conflict", error=why, next_at=None, reason="Conflict"), [
        Note(s, "Conflict", f"step {s}: {why}", warning=True)]


def _read_answer(job: JobView, expect: Any) -> str | None:
    """The first difference between a finished read and ``expect`` (None: it matches)."""
    if job.state == "failed":
        return f"read failed: {job.message or 'the reader exited non-zero'}"
    try:
        return first_mismatch(parse_answer(job.output or ""), expect)
    except ValueError as err:
        return f"read failed: {err}"


def _guard(run: StepRun, observe: Callable[[Role, int, int], JobView | None],
           guards: Guards) -> tuple[StepRun, list[Effect]]:
    """Move a step on from its precheck or precondition read (the attempt about to start is the
    one after those journaled: ``run.attempts + 1``)."""
    s, attempt = run.step, run.attempts + 1
    role: Role = "precheck" if run.stage == "prechecking" else "precondition"
    job = observe(role, attempt, 0)
    if job is None:
        return run, [StartJob(s, role, attempt, 0)]
    if job.state == "running":
        return run, []
    if role == "precheck":
        check = guards.precheck
        problem = _read_answer(job, check.expect if check else None)
        if problem is None:
            done = replace(run, stage="alreadyRecovered", error=None, reason="AlreadyRecovered")
            return done, [Note(s, "AlreadyRecovered", f"step {s}: {check.tool if check else 'the read'} shows it "
                               "already undone: no compensator runs")]
        if guards.precondition is not None:
            return _precondition(run, guards, attempt)
        return _compensate(run, attempt)
    pre = guards.precondition
    problem = _read_answer(job, pre.expect if pre else None)
    if problem is None:
        return _compensate(run, attempt)
    return _conflict(run, problem, guards, attempt)


def unavailable(run: StepRun, why: str) -> tuple[StepRun, list[Effect]]:
    """The compensator Job of a step cannot be made (refused for good): the step is
    ``handlerUnavailable`` (the compensator never ran); a journaled ``compensating`` attempt is
    settled ``compensationFailed`` so that no entry is left ``compensating``."""
    s = run.step
    error = f"handler unavailable: {why}"
    new = replace(run, stage="handlerUnavailable", error=error, next_at=None, reason="HandlerUnavailable")
    return new, [Journal(s, "compensationFailed", run.attempts, None, error, run.effect_unknown),
                 Note(s, "HandlerUnavailable", f"step {s}: {error}; not attempted", warning=True)]


def advance(
    run: StepRun,
    observe: Callable[[Role, int, int], JobView | None],
    verify: VerifyPlan,
    policy: Policy,
    now: float,
    rng: random.Random | None = None,
    guards: Guards = NO_GUARDS,
) -> tuple[StepRun, list[Effect]]:
    """Move an active step on, given what its Jobs did (``observe(role, attempt, read)``, None
    when the Job does not exist). Returns the new state and the effects, in order.

    Final and waiting-for-the-scheduler stages are returned unchanged.
    """
    stage = {"compensating": _compensating, "retrying": _retrying, "checking": _checking,
             "verifying": _verifying, "rereading": _rereading}.get(run.stage)
    if run.stage in ("prechecking", "preconditioning"):
        new, effects = _guard(run, observe, guards)
        if policy.stop and any(isinstance(e, StartJob) for e in effects):
            # cancelled while a guard read ran: its answer is in, but no new Job starts
            return replace(run, stage="cancelled", reason=CANCELLED_REASON, error=policy.stop, next_at=None), []
        return new, effects
    if stage is None:
        return run, []
    return stage(run, observe, verify, policy, now, rng, guards)


def _compensating(run: StepRun, observe: Callable[[Role, int, int], JobView | None], verify: VerifyPlan, policy: Policy,
                  now: float, rng: random.Random | None, guards: Guards) -> tuple[StepRun, list[Effect]]:
    """The compensator of the current attempt: adopted, started, still running, failed (retry or
    fail), or succeeded (its check, or the verification, comes next)."""
    s = run.step
    job = observe("compensator", run.attempts, 0)
    handed = _handed_over(run, observe, verify, policy) if job is None or job.state == "succeeded" else None
    if handed is not None:
        # its check or read-back Job exists (started after the compensator succeeded by a pass
        # whose status was not written, or the compensator's Job is gone since): go on from there
        return advance(handed, observe, verify, policy, now, rng, guards)
    if job is None and policy.stop:
        # journaled, then cancelled before its Job existed (a crash in between): it never runs
        return _fail(run, f"compensation attempt {run.attempts} was not started: {policy.stop}", None,
                     "CompensationFailed")
    if job is None:  # journaled but not created yet (a crash in between): create it now
        return run, [StartJob(s, "compensator", run.attempts)]
    if job.state == "running":
        return run, []
    if job.state == "failed":
        error = job.message or "the compensator exited non-zero"
        # the last answer decides the residue: a program that started and gave no answer of its own
        # leaves the effect unknown; one that never ran tells nothing new (an earlier attempt's stands)
        run = replace(run, effect_unknown=job.effect_unknown or (job.lost and run.effect_unknown))
        here = run.attempts_here()
        if here < policy.retries and not policy.stop:
            wait = delay_seconds(here, policy.base_ms, policy.max_ms, rng)
            return replace(run, stage="retrying", next_at=now + wait, error=error), [
                Note(s, "CompensationRetrying",
                     f"step {s}: attempt {here} of {policy.retries} failed: {error}; "
                     f"retrying in {wait:.1f}s with the same idempotency key", warning=True)]
        not_retried = f"; not retried: {policy.stop}" if policy.stop and here < policy.retries else ""
        return _fail(run, f"compensation failed after {_attempts_text(run)}: {error}{not_retried}", None,
                     "CompensationFailed")
    run = replace(run, effect_unknown=False)  # its program answered: the undo ran
    if policy.stop and (policy.check or verify.mode == "reader"):
        return _unchecked(run, policy.stop)
    if policy.check:
        return replace(run, stage="checking", reads=0, error=None), [StartJob(s, "check", run.attempts, 0)]
    return _begin_verification(replace(run, error=None), verify, policy)


def _retrying(run: StepRun, observe: Callable[[Role, int, int], JobView | None], verify: VerifyPlan, policy: Policy,
              now: float, rng: random.Random | None, guards: Guards) -> tuple[StepRun, list[Effect]]:
    """Between attempts: the next one starts once its backoff has passed."""
    s = run.step
    if run.next_at is not None and now < run.next_at:
        return run, []
    attempt = run.attempts + 1
    return replace(run, stage="compensating", attempts=attempt, next_at=None), [
        Journal(s, "compensating", attempt), StartJob(s, "compensator", attempt)]


def _checking(run: StepRun, observe: Callable[[Role, int, int], JobView | None], verify: VerifyPlan, policy: Policy,
              now: float, rng: random.Random | None, guards: Guards) -> tuple[StepRun, list[Effect]]:
    """The verifyCommand check after the undo: started, running, failed, or passed (verification next)."""
    s = run.step
    job = observe("check", run.attempts, 0)
    handed = _handed_over(run, observe, verify, policy) if job is None else None
    if handed is not None:  # the check ran, its read-back started since, and its Job is gone (TTL)
        return advance(handed, observe, verify, policy, now, rng, guards)
    if job is None:
        return run, [StartJob(s, "check", run.attempts, 0)]
    if job.state == "running":
        return run, []
    if job.state == "failed":
        return _fail(run, f"verifyCommand failed after the undo: {job.message or 'exited non-zero'}",
                     "verificationFailed", "VerificationFailed")
    handed = _handed_over(run, observe, verify, policy)
    if handed is not None:
        return advance(handed, observe, verify, policy, now, rng, guards)
    if policy.stop and verify.mode == "reader":
        return _unchecked(run, policy.stop)
    return _begin_verification(run, verify, policy)


def _verifying(run: StepRun, observe: Callable[[Role, int, int], JobView | None], verify: VerifyPlan, policy: Policy,
               now: float, rng: random.Random | None, guards: Guards) -> tuple[StepRun, list[Effect]]:
    """A read-back of the undo: started, running, lost (read again, not counted), failed or
    mismatched (read again within verification.retries, then failed), or as expected
    (compensated, verified)."""
    s = run.step
    job = observe("reader", run.attempts, run.reads)
    if job is None:
        return run, [StartJob(s, "reader", run.attempts, run.reads)]
    if job.state == "running":
        return run, []
    if job.state == "failed" and job.lost and policy.stop and run.answered_reads() <= 1:
        # cancelled, and no read-back of this attempt answered (this lost one is not counted
        # yet): the undo is done but unchecked
        return _unchecked(run, policy.stop)
    if job.state == "failed" and job.lost and run.lost_reads < LOST_READS_MAX and not policy.stop:
        # no answer is not a failed read: read again, not counted against verification.retries
        lost = f"read-back {run.reads} gave no answer: {job.message or 'its pod did not run to an exit'}"
        wait = verify.backoff_ms / 1000.0
        return replace(run, stage="rereading", next_at=now + wait, error=lost, lost_reads=run.lost_reads + 1), [
            Note(s, "ReadBackLost", f"step {s}: {lost}; reading again in {wait:.1f}s (not counted against "
                 f"verification.retries, {run.lost_reads + 1} of {LOST_READS_MAX} lost reads)", warning=True)]
    # a failed read leaves the undo's effect unknown; a mismatch says it may remain (residue failed)
    unknown = True
    if job.state == "failed":
        problem: str | None = f"read failed: {job.message or 'the reader exited non-zero'}"
    else:
        try:
            problem, unknown = first_mismatch(parse_answer(job.output or ""), verify.expect), False
        except ValueError as err:
            problem = f"read failed: {err}"
    if problem is None:
        done = replace(run, stage="compensated", verification="verified", error=None, reason="Verified")
        return done, [Journal(s, "compensated", run.attempts, "verified")]
    run = replace(run, effect_unknown=unknown)
    if run.answered_reads() < verify.retries and not policy.stop:
        counted = run.answered_reads()
        wait = ceiling_ms(counted, verify.backoff_ms, 2**31) / 1000.0
        lost_text = f" ({run.lost_reads} lost, not counted)" if run.lost_reads else ""
        return replace(run, stage="rereading", next_at=now + wait, error=problem), [
            Note(s, "VerificationRetrying", f"step {s}: read-back {counted} of {verify.retries}{lost_text}: "
                 f"{problem}; reading again in {wait:.1f}s")]
    return _fail(run, f"verification failed: {problem}", "verificationFailed", "VerificationFailed")


def _rereading(run: StepRun, observe: Callable[[Role, int, int], JobView | None], verify: VerifyPlan, policy: Policy,
               now: float, rng: random.Random | None, guards: Guards) -> tuple[StepRun, list[Effect]]:
    """Between read-backs: the next one starts once its backoff has passed."""
    s = run.step
    if run.next_at is not None and now < run.next_at:
        return run, []
    reads = run.reads + 1
    return replace(run, stage="verifying", reads=reads, next_at=None), [StartJob(s, "reader", run.attempts, reads)]


CANCELLED_REASON = "Cancelled"


def cancel(run: StepRun, why: str) -> StepRun:
    """A step the cancelled request has not started (pending, or awaiting an approval it did not
    get) becomes ``cancelled`` (final: no compensator ran for it in this request). A denied step
    stays denied; every other stage is returned unchanged (running Jobs finish, see ``Policy.stop``)."""
    if run.stage == "pending" or (run.stage == "awaitingApproval" and run.reason != "Denied"):
        return replace(run, stage="cancelled", reason=CANCELLED_REASON, error=why, next_at=None)
    return run


def _unchecked(run: StepRun, why: str, reason: str = CANCELLED_REASON) -> tuple[StepRun, list[Effect]]:
    s = run.step
    done = replace(run, stage="compensated", verification="unverified", reason=reason, error=None)
    return done, [Journal(s, "compensated", run.attempts, "unverified"),
                  Note(s, "Unverified", f"step {s}: undone but not checked: {why}; a later request runs the read-back",
                       warning=True)]


def give_up(run: StepRun, why: str, reason: str = CANCELLED_REASON) -> tuple[StepRun, list[Effect]]:
    """End a step that waits for another attempt or read-back (the request was cancelled, or its
    deadline passed): it fails with ``why`` and its last error; a step waiting to read again
    after reads that were all lost (none answered) is compensated but ``unverified`` (its undo
    ran; a later request runs the read-back), with ``reason``. Other stages are returned unchanged."""
    if run.stage == "retrying":
        return _fail(run, f"compensation failed after {_attempts_text(run)}: {why}; last error: {run.error}",
                     None, "CompensationFailed")
    if run.stage == "rereading" and run.answered_reads() == 0:
        return _unchecked(run, why, reason)
    if run.stage == "rereading":
        return _fail(run, f"verification failed: {why}; last read: {run.error}", "verificationFailed",
                     "VerificationFailed")
    return run, []


def _attempts_text(run: StepRun) -> str:
    here = run.attempts_here()
    text = f"{here} attempt{'s' if here != 1 else ''}"
    if run.attempts != here:
        text += f" in this request ({run.attempts} in all)"
    return text


def _handed_over(run: StepRun, observe: Callable[[Role, int, int], JobView | None], verify: VerifyPlan,
                 policy: Policy) -> StepRun | None:
    """The stage a ``compensating`` or ``checking`` step is really in when the next Job of its
    attempt already exists (the check of ``verifyCommand``, or the first read-back), else None.

    Those Jobs start only once the one before succeeded, and the request's status is not written
    for that hand-over (to keep API writes per step few: docs/concepts.md#the-rollbackrequests-status):
    a pass that rebuilds the step from an older status finds the Job by its deterministic name and
    follows it, instead of creating it again, and a compensator or check whose Job was deleted since
    (``ttlSecondsAfterFinished``) is not run again.
    """
    if run.stage == "compensating" and policy.check and observe("check", run.attempts, 0) is not None:
        return replace(run, stage="checking", reads=0, error=None, effect_unknown=False)
    if verify.mode == "reader" and observe("reader", run.attempts, 1) is not None:
        return replace(run, stage="verifying", reads=1, next_at=None, error=None, effect_unknown=False)
    return None


def _begin_verification(run: StepRun, verify: VerifyPlan, policy: Policy) -> tuple[StepRun, list[Effect]]:
    s = run.step
    if verify.mode == "reader":
        return replace(run, stage="verifying", reads=1, next_at=None), [StartJob(s, "reader", run.attempts, 1)]
    if verify.mode == "unavailable":  # the undo ran; no read can tell whether it took: unknown
        return _fail(replace(run, effect_unknown=True), verify.detail or UNAVAILABLE, "verificationFailed",
                     "VerificationArgumentsUnavailable")
    if verify.mode == "none" and not policy.require_verification:
        done = replace(run, stage="compensated", verification="none", reason="NoReadBackDeclared", error=None)
        return done, [Journal(s, "compensated", run.attempts, "none")]
    reason = "ReadBackRequired" if verify.mode == "none" else "NoReader"
    done = replace(run, stage="compensated", verification="unverified", reason=reason,
                   error=None)
    return done, [Journal(s, "compensated", run.attempts, "unverified"),
                  Note(s, "Unverified", f"step {s}: undone but not checked: {verify.detail}", warning=True)]


def _fail(run: StepRun, error: str, verification: str | None, reason: str) -> tuple[StepRun, list[Effect]]:
    """The step fails for good in this request; its journal entry keeps ``run.effect_unknown``."""
    failed = replace(run, stage="failed", error=error, verification=verification, next_at=None, reason=reason)
    return failed, [Journal(run.step, "compensationFailed", run.attempts, verification, error, run.effect_unknown),
                    Note(run.step, reason, f"step {run.step}: {error}", warning=True)]


def holding_slots(runs: Mapping[int, StepRun]) -> set[int]:
    """The steps of ``runs`` (``{step: StepRun}``) that hold a parallelism slot (:data:`SLOT_STAGES`)."""
    return {s for s, run in runs.items() if run.stage in SLOT_STAGES}


def schedule_state(stage: str) -> str:
    """The :mod:`~reversi.engine.schedule` progress state of a stage."""
    if stage in ACTIVE_STAGES:
        return "running"
    return stage
