"""The report (DESIGN §5): the verdict of a rollback, built from the plan and each step's outcome.

Every step lands in exactly one bucket (standing steps in one of the non-``skipped`` buckets or in
``skipped`` when they need no undo; steps whose outcome failed in ``skipped``):

============== ===========================================================================
plan kind       bucket
============== ===========================================================================
skip            ``skipped`` -- unless the step was compensated by an earlier request (rule 6):
                then it is reported like a compensation of this one (below), so a re-run
                never turns an unchecked undo into a checked one
unrecoverable   ``unrecoverable`` ``{step, reason}`` (irreversible: the reason states the residue)
unresolved      ``unresolved``
unmanifested    ``unmanifested``
defer           ``deferred`` ``{step, blockedBy}``
compensate      by outcome state: ``compensated`` + verification ``verified`` -> ``compensated``;
                ``compensated`` + verification ``none`` (no read-back declared) -> ``compensated``
                and also listed in ``noReadBack`` ("undone, no read-back declared"), or
                ``unverified`` when the request sets ``requireVerification``;
                ``compensated`` otherwise -> ``unverified`` (only there, not also in compensated);
                ``failed`` -> ``failed`` ``{step, error}``; ``awaitingApproval`` (a denied
                step too, with ``denied by <actor>: <note>`` in ``denied``);
                ``deferred`` -> ``deferred``; no outcome, ``pending`` or ``running`` -> ``pending``;
                the statuses of issue 9 (:data:`STATUS_BUCKETS`): ``alreadyRecovered``,
                ``conflict`` ``{step, reason}``, ``handlerUnavailable`` ``{step, reason}``,
                ``compensationDeadlinePassed`` -> the bucket of that name; a step undone
                although its precondition failed is also listed in ``forced``
expired         ``expired`` ``{step, reason}`` (the undo window had passed: not attempted)
handlerUnav.    ``handlerUnavailable`` ``{step, reason}`` (its runner is not in the manifest)
============== ===========================================================================

``pending`` is a bucket beyond DESIGN §5 (steps not settled yet, e.g. at a deadline), so that a
report made before the end never claims more than happened. ``residue`` lists the residue of
every step undone by this or an earlier request (compensated or unverified). ``complete`` is true
exactly when failed, unrecoverable, unresolved, unmanifested, deferred, awaitingApproval,
unverified, pending, expired, handlerUnavailable, conflict and compensationDeadlinePassed are all
empty (``alreadyRecovered`` counts as undone). :func:`outcome_reason` says whether an incomplete
rollback is ``Partial`` (something was undone) or ``NotPossible`` (nothing could be).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..models.rollbackrequest import Plan, Report, StepBlocked, StepError, StepReason, StepResidue
from ..models.run import StepUndo
from .plan import (COMPENSATE, DEFER, EXPIRED, HANDLER_UNAVAILABLE, SKIP, UNMANIFESTED, UNRECOVERABLE, UNRESOLVED,
                   UndoStateInput, undo_by_step)
from .schedule import (ALREADY_RECOVERED, AWAITING_APPROVAL, COMPENSATED, CONFLICT, DEADLINE_PASSED, DEFERRED, FAILED,
                       PENDING, RUNNING)
from .schedule import HANDLER_UNAVAILABLE as HANDLER_STATE

VERIFIED = "verified"
NO_READ_BACK = "none"
UNVERIFIED = "unverified"
VERIFICATION_FAILED = "verificationFailed"

INCOMPLETE_BUCKETS = (
    "failed",
    "unrecoverable",
    "unresolved",
    "unmanifested",
    "deferred",
    "awaiting_approval",
    "unverified",
    "pending",
    "expired",
    "handler_unavailable",
    "conflict",
    "compensation_deadline_passed",
)
#: the step statuses of issue 9 by schedule state / plan kind: (report field, items carry a reason)
STATUS_BUCKETS: dict[str, tuple[str, bool]] = {
    ALREADY_RECOVERED: ("already_recovered", False),
    CONFLICT: ("conflict", True),
    HANDLER_STATE: ("handler_unavailable", True),
    DEADLINE_PASSED: ("compensation_deadline_passed", False),
    EXPIRED: ("expired", True),
}
#: every report field that is a bucket (each standing step is in exactly one); noReadBack, denied
#: and forced only annotate steps of a bucket
BUCKET_FIELDS = ("compensated", "skipped", "failed", "unrecoverable", "unresolved", "unmanifested", "deferred",
                 "awaiting_approval", "unverified", "pending", "already_recovered", "expired", "handler_unavailable",
                 "conflict", "compensation_deadline_passed")
#: buckets whose steps no longer stand: they count as undone for :func:`outcome_reason`
UNDONE_FIELDS = ("compensated", "unverified", "already_recovered")


@dataclass(frozen=True)
class StepOutcome:
    """What happened to one step in a rollback.

    ``state``: pending, running, compensated, failed, awaitingApproval or deferred (see
    ``schedule``); ``verification``: verified, none (no read-back declared), unverified,
    verificationFailed or ``None`` (= not checked); ``error``: why it failed (or why it was not
    undone: conflict, handlerUnavailable); ``blocked_by``: for deferred steps; ``forced_by``: who
    forced the undo over a failed precondition (``spec.force``).
    """

    state: str
    verification: str | None = None
    error: str | None = None
    blocked_by: tuple[int, ...] = ()
    forced_by: str | None = None


def outcomes_from_undo(undo_state: UndoStateInput) -> dict[int, StepOutcome]:
    """Outcomes recorded in the run's undo state (``status.undo``): compensated -> compensated
    (with its verification), compensationFailed -> failed (with the last error), compensating ->
    running. Use it for steps settled by an earlier request (rule 6)."""
    out: dict[int, StepOutcome] = {}
    for step, entry in undo_by_step(undo_state).items():
        out[step] = _from_undo(entry)
    return out


def _from_undo(entry: StepUndo) -> StepOutcome:
    if entry.state == "compensated":
        return StepOutcome(COMPENSATED, verification=entry.verification)
    if entry.state == "compensationFailed":
        return StepOutcome(FAILED, verification=entry.verification, error=entry.last_error)
    return StepOutcome(RUNNING)


def build_report(plan: Plan, outcomes: Mapping[int, StepOutcome | str] | None = None, *,
                 require_verification: bool = False) -> Report:
    """Build the report of ``plan`` given ``outcomes`` (``{step: StepOutcome}``; a bare state
    string is accepted for outcomes without detail). O(n).

    ``require_verification`` (the request's ``spec.requireVerification``): an undo with no
    read-back declared is ``unverified`` instead of compensated.

    ``plan`` is the full plan of ``build_plan`` (a ``compact_plan`` would drop steps: refused).
    See the module docstring for the buckets. Raises ``ValueError`` for an unknown state.
    """
    if plan.omitted:
        raise ValueError("build_report needs the full plan from build_plan, not a compact_plan")
    outcomes = outcomes or {}
    compensated: list[int] = []
    skipped: list[int] = []
    failed: list[StepError] = []
    unrecoverable: list[StepReason] = []
    unresolved: list[int] = []
    unmanifested: list[int] = []
    deferred: list[StepBlocked] = []
    awaiting: list[int] = []
    denied: list[StepReason] = []
    unverified: list[int] = []
    no_read_back: list[int] = []
    pending: list[int] = []
    residue: list[StepResidue] = []
    statuses: dict[str, list] = {field: [] for field, _ in STATUS_BUCKETS.values()}
    forced: list[StepReason] = []

    def undone(step: int, outcome: StepOutcome, lines: list[str]) -> None:
        if outcome.verification == VERIFIED:
            compensated.append(step)
        elif outcome.verification == NO_READ_BACK and not require_verification:
            compensated.append(step)
            no_read_back.append(step)
        elif outcome.verification == VERIFICATION_FAILED:
            failed.append(StepError(step=step, error=outcome.error or "verification failed"))
            return
        else:
            unverified.append(step)
        if outcome.forced_by:
            forced.append(StepReason(step=step, reason=f"forced by {outcome.forced_by}"))
        if lines:
            residue.append(StepResidue(step=step, residue=list(lines)))

    for action in plan.actions:
        step = action.step
        raw = outcomes.get(step)
        outcome = StepOutcome(raw) if isinstance(raw, str) else raw
        kind = action.kind
        if kind == SKIP:
            if outcome is not None and outcome.state == COMPENSATED:
                undone(step, outcome, list(action.residue))
            else:
                skipped.append(step)
        elif kind == UNRECOVERABLE:
            unrecoverable.append(StepReason(step=step, reason=action.reason))
        elif kind == UNRESOLVED:
            unresolved.append(step)
        elif kind == UNMANIFESTED:
            unmanifested.append(step)
        elif kind in STATUS_BUCKETS:  # expired, handlerUnavailable (plan kinds)
            _status_item(statuses, kind, step, action.reason)
        elif kind == DEFER:
            blocked = list(outcome.blocked_by) if outcome is not None and outcome.blocked_by else list(action.blocked_by)
            deferred.append(StepBlocked(step=step, blocked_by=blocked))
        elif kind == COMPENSATE:
            state = outcome.state if outcome is not None else PENDING
            if state == COMPENSATED:
                undone(step, outcome, list(action.residue))  # type: ignore[arg-type]
            elif state == FAILED:
                failed.append(StepError(step=step, error=(outcome.error if outcome else None) or "compensation failed"))
            elif state == AWAITING_APPROVAL:
                awaiting.append(step)
                if outcome is not None and outcome.error:  # denied: still not undone, and why
                    denied.append(StepReason(step=step, reason=outcome.error))
            elif state == DEFERRED:
                deferred.append(StepBlocked(step=step, blocked_by=list(outcome.blocked_by) if outcome else []))
            elif state in (PENDING, RUNNING):
                pending.append(step)
            elif state in STATUS_BUCKETS:
                _status_item(statuses, state, step, (outcome.error if outcome else None) or action.reason)
            else:
                raise ValueError(f"step {step}: unknown outcome state {state!r}")
        else:  # pragma: no cover - the plan's kinds are a closed set
            raise ValueError(f"step {step}: unknown plan kind {kind!r}")

    report = Report(
        compensated=compensated,
        skipped=skipped,
        failed=failed,
        unrecoverable=unrecoverable,
        unresolved=unresolved,
        unmanifested=unmanifested,
        deferred=deferred,
        awaiting_approval=awaiting,
        denied=denied,
        unverified=unverified,
        no_read_back=no_read_back,
        pending=pending,
        residue=residue,
        forced=forced,
        complete=False,
        **statuses,
    )
    report.complete = all(not getattr(report, bucket) for bucket in INCOMPLETE_BUCKETS)
    return report


def _status_item(statuses: dict[str, list], status: str, step: int, reason: str) -> None:
    field, with_reason = STATUS_BUCKETS[status]
    statuses[field].append(StepReason(step=step, reason=reason or status) if with_reason else step)


def outcome_reason(report: Report) -> str:
    """``"Partial"`` when an incomplete report has a step undone (compensated, unverified or
    already recovered, by this or an earlier request), else ``"NotPossible"``; a complete report
    is ``"AllCompensated"``."""
    if report.complete:
        return "AllCompensated"
    return "Partial" if any(getattr(report, f) for f in UNDONE_FIELDS) else "NotPossible"


def bucket_of(report: Report) -> dict[int, list[str]]:
    """``{step: [bucket fields it is in]}`` (the invariant: exactly one per step)."""
    out: dict[int, list[str]] = {}
    for field in BUCKET_FIELDS:
        for item in getattr(report, field):
            out.setdefault(item if isinstance(item, int) else item.step, []).append(field)
    return out


def report_message(report: Report) -> str:
    """A one-line summary for a condition message, e.g.
    ``"incomplete: 1 compensated, 1 unrecoverable (3), 1 unresolved (2), 1 deferred (1 blocked by 2)"``."""
    parts: list[str] = []

    def add(name: str, steps: list[int], detail: str = "") -> None:
        if steps:
            shown = ", ".join(str(s) for s in steps[:10]) + (", ..." if len(steps) > 10 else "")
            parts.append(f"{len(steps)} {name} ({shown}{detail})")

    add("compensated", report.compensated)
    add("with no read-back declared", report.no_read_back)
    add("unverified", report.unverified)
    add("failed", [f.step for f in report.failed])
    add("unrecoverable", [u.step for u in report.unrecoverable])
    add("unresolved", report.unresolved)
    add("unmanifested", report.unmanifested)
    if report.deferred:
        shown = ", ".join(
            f"{d.step} blocked by {', '.join(str(b) for b in d.blocked_by) or 'a dependent'}" for d in report.deferred[:10]
        )
        parts.append(f"{len(report.deferred)} deferred ({shown}{', ...' if len(report.deferred) > 10 else ''})")
    denied = {d.step for d in report.denied}
    add("awaiting approval", [s for s in report.awaiting_approval if s not in denied])
    add("denied", [s for s in report.awaiting_approval if s in denied])  # not undone: a person said no
    add("pending", report.pending)
    add("already recovered", report.already_recovered)
    add("expired", [e.step for e in report.expired])
    add("handler unavailable", [h.step for h in report.handler_unavailable])
    add("conflict", [x.step for x in report.conflict])
    add("not started before the compensation deadline", report.compensation_deadline_passed)
    add("forced", [f.step for f in report.forced])
    if report.skipped:
        parts.append(f"{len(report.skipped)} skipped")
    verdict = "complete" if report.complete else "incomplete"
    return f"{verdict}: " + (", ".join(parts) if parts else "nothing to undo")

