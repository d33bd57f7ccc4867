"""The report (docs/concepts.md#the-report): the verdict of a rollback, built from the plan and each step's outcome.

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
                ``deferred`` -> ``deferred``; ``cancelled`` (not started: the request was
                cancelled) -> ``cancelled``; no outcome, ``pending`` or ``running`` -> ``pending``;
                the statuses of rules 15 and 16 (:data:`STATUS_BUCKETS`): ``alreadyRecovered``,
                ``conflict`` ``{step, reason}``, ``handlerUnavailable`` ``{step, reason}``,
                ``compensationDeadlinePassed`` -> the bucket of that name; a step undone
                although its precondition failed is also listed in ``forced``
expired         ``expired`` ``{step, reason}`` (the undo window had passed: not attempted)
handlerUnav.    ``handlerUnavailable`` ``{step, reason}`` (its runner is not in the manifest)
============== ===========================================================================

``pending`` is a bucket beyond the report's contract (steps not settled yet, e.g. at a deadline), so
that a report made before the end never claims more than happened; ``cancelled`` too (rule 13, cancel).

``residue`` is typed (:func:`typed_residue`, docs/concepts.md#the-report): ``{step, type, text}`` with type
``declared`` (each residue line the manifest states, for a step undone by this or an earlier
request, or found already undone), ``failed`` (the undo failed: the effect may remain),
``notAttempted`` (not undone: irreversible, unmanifested, deferred, not approved or denied,
deadline, cancelled, expired, handler unavailable, conflict) or ``unknown`` (uncertain outcome, an
undo not checked, a failed undo whose effect nobody knows: ``StepOutcome.effect_unknown``, its last
compensator killed mid-call or its read-back failed). Every step of a bucket other than compensated, skipped and
alreadyRecovered has exactly one entry that is not ``declared``; the one mapping from a step
status to its type is :func:`residue_type`. ``complete`` is true exactly when every residue entry
is ``declared`` -- the same as: failed, unrecoverable, unresolved, unmanifested, deferred,
awaitingApproval, unverified, pending, cancelled, expired, handlerUnavailable, conflict and
compensationDeadlinePassed are all empty (``alreadyRecovered`` counts as undone).
:func:`outcome_reason` says whether an incomplete rollback is ``Partial`` (something was undone)
or ``NotPossible`` (nothing could be).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ..models.rollbackrequest import Plan, PlanAction, Report, StepBlocked, StepError, StepReason, StepResidue
from ..models.run import StepUndo
from .plan import (COMPENSATE, DEFER, EXPIRED, SKIP, UNMANIFESTED, UNRECOVERABLE, UNRESOLVED,
                   UndoStateInput, undo_by_step)
from .schedule import (ALREADY_RECOVERED, AWAITING_APPROVAL, CANCELLED, COMPENSATED, CONFLICT, DEADLINE_PASSED,
                       DEFERRED, FAILED, PENDING, RUNNING)
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
    "cancelled",
    "expired",
    "handler_unavailable",
    "conflict",
    "compensation_deadline_passed",
)
#: the step statuses of guards, undo windows and two phases (rules 15, 16) by schedule state / plan kind:
#: (report field, items carry a reason)
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
                 "awaiting_approval", "unverified", "pending", "cancelled", "already_recovered", "expired",
                 "handler_unavailable", "conflict", "compensation_deadline_passed")
#: buckets whose steps no longer stand: they count as undone for :func:`outcome_reason`
UNDONE_FIELDS = ("compensated", "unverified", "already_recovered")


@dataclass(frozen=True)
class StepOutcome:
    """What happened to one step in a rollback.

    ``state``: pending, running, compensated, failed, awaitingApproval or deferred (see
    ``schedule``); ``verification``: verified, none (no read-back declared), unverified,
    verificationFailed or ``None`` (= not checked); ``error``: why it failed (or why it was not
    undone: conflict, handlerUnavailable); ``blocked_by``: for deferred steps; ``forced_by``: who
    forced the undo over a failed precondition (``spec.force``); ``effect_unknown``: for a failed
    undo, nobody knows whether its effect remains (its last compensator that ran gave no answer of
    its own, or its read-back failed or could not be made: residue ``unknown``, else ``failed``).
    """

    state: str
    verification: str | None = None
    error: str | None = None
    blocked_by: tuple[int, ...] = ()
    forced_by: str | None = None
    effect_unknown: bool = False


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
        return StepOutcome(FAILED, verification=entry.verification, error=entry.last_error,
                           effect_unknown=bool(entry.effect_unknown))
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
    buckets = _Buckets(require_verification)
    for action in plan.actions:
        raw = outcomes.get(action.step)
        buckets.place(action, StepOutcome(raw) if isinstance(raw, str) else raw)
    report = buckets.report()
    report.residue = typed_residue(plan, report, buckets.unknown)
    report.complete = all(entry.type == DECLARED for entry in report.residue)
    return report


class _Buckets:
    """The report's buckets as :func:`build_report` fills them, one step at a time."""

    def __init__(self, require_verification: bool):
        self.require_verification = require_verification
        self.compensated: list[int] = []
        self.skipped: list[int] = []
        self.failed: list[StepError] = []
        self.unrecoverable: list[StepReason] = []
        self.unresolved: list[int] = []
        self.unmanifested: list[int] = []
        self.deferred: list[StepBlocked] = []
        self.awaiting: list[int] = []
        self.denied: list[StepReason] = []
        self.unverified: list[int] = []
        self.no_read_back: list[int] = []
        self.pending: list[int] = []
        self.cancelled: list[int] = []
        self.forced: list[StepReason] = []
        self.unknown: set[int] = set()  # failed steps whose effect nobody knows (StepOutcome.effect_unknown)
        self.statuses: dict[str, list] = {field: [] for field, _ in STATUS_BUCKETS.values()}

    def place(self, action: PlanAction, outcome: StepOutcome | None) -> None:
        """Put one planned step in its bucket, by its plan kind and (for a compensation) its outcome."""
        step, kind = action.step, action.kind
        if kind == SKIP:
            if outcome is not None and outcome.state == COMPENSATED:
                self.undone(step, outcome)
            else:
                self.skipped.append(step)
        elif kind == UNRECOVERABLE:
            self.unrecoverable.append(StepReason(step=step, reason=action.reason))
        elif kind == UNRESOLVED:
            self.unresolved.append(step)
        elif kind == UNMANIFESTED:
            self.unmanifested.append(step)
        elif kind in STATUS_BUCKETS:  # expired, handlerUnavailable (plan kinds)
            _status_item(self.statuses, kind, step, action.reason)
        elif kind == DEFER:
            known = outcome.blocked_by if outcome is not None and outcome.blocked_by else action.blocked_by
            self.deferred.append(StepBlocked(step=step, blocked_by=list(known)))
        elif kind == COMPENSATE:
            self.compensation(action, outcome)
        else:  # pragma: no cover - the plan's kinds are a closed set
            raise ValueError(f"step {step}: unknown plan kind {kind!r}")

    def compensation(self, action: PlanAction, outcome: StepOutcome | None) -> None:
        """A planned compensation, by its outcome so far. Raises ``ValueError`` for an unknown state."""
        step = action.step
        state = outcome.state if outcome is not None else PENDING
        if state == COMPENSATED:
            self.undone(step, outcome)  # type: ignore[arg-type]
        elif state == FAILED:
            error = (outcome.error if outcome else None) or "compensation failed"
            self.failed.append(StepError(step=step, error=error))
            if outcome is not None and outcome.effect_unknown:
                self.unknown.add(step)
        elif state == AWAITING_APPROVAL:
            self.awaiting.append(step)
            if outcome is not None and outcome.error:  # denied: still not undone, and why
                self.denied.append(StepReason(step=step, reason=outcome.error))
        elif state == CANCELLED:
            self.cancelled.append(step)
        elif state == DEFERRED:
            self.deferred.append(StepBlocked(step=step, blocked_by=list(outcome.blocked_by) if outcome else []))
        elif state in (PENDING, RUNNING):
            self.pending.append(step)
        elif state in STATUS_BUCKETS:
            _status_item(self.statuses, state, step, (outcome.error if outcome else None) or action.reason)
        else:
            raise ValueError(f"step {step}: unknown outcome state {state!r}")

    def undone(self, step: int, outcome: StepOutcome) -> None:
        """A step whose compensation ran: compensated, unverified or failed, by its read-back."""
        if outcome.verification == VERIFIED:
            self.compensated.append(step)
        elif outcome.verification == NO_READ_BACK and not self.require_verification:
            self.compensated.append(step)
            self.no_read_back.append(step)
        elif outcome.verification == VERIFICATION_FAILED:
            self.failed.append(StepError(step=step, error=outcome.error or "verification failed"))
            if outcome.effect_unknown:
                self.unknown.add(step)
            return
        else:
            self.unverified.append(step)
        if outcome.forced_by:
            self.forced.append(StepReason(step=step, reason=f"forced by {outcome.forced_by}"))

    def report(self) -> Report:
        """The :class:`Report` of the buckets, its residue and ``complete`` still to be set."""
        return Report(
            compensated=self.compensated,
            skipped=self.skipped,
            failed=self.failed,
            unrecoverable=self.unrecoverable,
            unresolved=self.unresolved,
            unmanifested=self.unmanifested,
            deferred=self.deferred,
            awaiting_approval=self.awaiting,
            denied=self.denied,
            unverified=self.unverified,
            no_read_back=self.no_read_back,
            pending=self.pending,
            cancelled=self.cancelled,
            forced=self.forced,
            complete=False,
            **self.statuses,
        )


# ------------------------------------------------------------------------------ typed residue

DECLARED = "declared"
RESIDUE_FAILED = "failed"
NOT_ATTEMPTED = "notAttempted"
UNKNOWN = "unknown"

#: step status (report bucket, camelCase) -> residue type; ``skipped`` leaves nothing behind.
RESIDUE_TYPES: dict[str, str] = {
    "compensated": DECLARED,
    "alreadyRecovered": DECLARED,
    "failed": RESIDUE_FAILED,
    "unrecoverable": NOT_ATTEMPTED,
    "unmanifested": NOT_ATTEMPTED,
    "deferred": NOT_ATTEMPTED,
    "awaitingApproval": NOT_ATTEMPTED,
    "pending": NOT_ATTEMPTED,
    "cancelled": NOT_ATTEMPTED,
    "expired": NOT_ATTEMPTED,
    "handlerUnavailable": NOT_ATTEMPTED,
    "conflict": NOT_ATTEMPTED,
    "compensationDeadlinePassed": NOT_ATTEMPTED,
    "unresolved": UNKNOWN,
    "unverified": UNKNOWN,
}

_NOT_ATTEMPTED_WHY = {
    "unmanifested": "it has no manifest entry (recorded in observe mode)",
    "awaitingApproval": "its compensation was not approved",
    "pending": "its undo had not started or settled when this report was made (still running, or the deadline "
               "passed)",
    "cancelled": "the request was cancelled before its undo started",
    "expired": "the window in which it could be undone has passed",
    "handlerUnavailable": "no runner could run its compensator",
    "conflict": "its precondition did not hold (the state it would restore changed since) or could not be read",
    "compensationDeadlinePassed": "spec.compensationDeadlineSeconds passed before its compensation could start",
}


def residue_type(status: str, effect_unknown: bool = False) -> str:
    """The residue type of a step reported with ``status`` (a report bucket, camelCase or
    snake_case): see :data:`RESIDUE_TYPES`. A ``failed`` step whose effect nobody knows
    (``effect_unknown``, :attr:`StepOutcome.effect_unknown`: its last compensator that ran was
    killed mid-call, or its undo ran and its read-back failed or could not be made) is
    ``unknown``; ``effect_unknown`` says nothing for any other status. Raises ``KeyError`` for a
    status with no residue (``skipped``) or an unknown one."""
    status = _camel(status)
    if status == "failed" and effect_unknown:
        return UNKNOWN
    return RESIDUE_TYPES[status]


def typed_residue(plan: Plan, report: Report, unknown: Collection[int] = ()) -> list[StepResidue]:
    """The typed residue of ``report`` (``{step, type, text}``), in step order: each residue line
    of an undone step (``declared``) and one entry for every step of any other bucket but
    ``skipped``, typed by :func:`residue_type`, its text saying what stays and why. ``unknown``:
    the failed steps whose effect nobody knows (:attr:`StepOutcome.effect_unknown`). Every bucket
    of :data:`RESIDUE_TYPES` present on the report is read, by name. O(n + residue lines)."""
    out: list[StepResidue] = []
    denied = {d.step: d.reason for d in report.denied}
    for field_name in type(report).model_fields:
        status = _camel(field_name)
        if status not in RESIDUE_TYPES:
            continue
        for item in getattr(report, field_name) or []:
            step = item if isinstance(item, int) else item.step
            action = plan.action(step)
            kind = residue_type(status, step in unknown)
            if kind == DECLARED:
                out += [StepResidue(step=step, type=DECLARED, text=line) for line in action.residue]
                continue
            out.append(StepResidue(step=step, type=kind, text=_residue_text(status, kind, action, item, denied)))
    out.sort(key=lambda e: e.step)
    return out


def _residue_text(status: str, kind: str, action, item, denied: dict[int, str]) -> str:
    tool = action.tool
    detail = getattr(item, "error", None) or getattr(item, "reason", None) or ""
    if kind == RESIDUE_FAILED:
        return f"the undo of {tool} failed, so its effect may remain: {detail or 'compensation failed'}"
    if kind == UNKNOWN:
        if status == "unresolved":
            return (f"the outcome of {tool} is uncertain: whether it had an effect is unknown "
                    "(settle it with a resolution)")
        if status == "unverified":
            return f"{tool} was undone but the undo was not checked: whether its effect is gone is unknown"
        # a failed undo whose effect nobody knows: stopped mid-call, or run and not checked (the detail says which)
        return f"the undo of {tool} ran but gave no verdict, so whether its effect is gone is unknown: {detail}"
    if status == "unrecoverable":
        return f"{tool} was not undone: {detail or 'it cannot be undone'}"
    if status == "deferred":
        blockers = ", ".join(str(b) for b in getattr(item, "blocked_by", []) or []) or "a dependent"
        return f"{tool} was not undone: steps {blockers} that depend on it still stand"
    if status == "awaitingApproval" and action.step in denied:
        return f"{tool} was not undone: its compensation was {denied[action.step]}"
    why = _NOT_ATTEMPTED_WHY.get(status, status)
    return f"{tool} was not undone: {why}" + (f" ({detail})" if detail else "")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


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
            f"{d.step} blocked by {', '.join(str(b) for b in d.blocked_by) or 'a dependent'}"
            for d in report.deferred[:10]
        )
        parts.append(f"{len(report.deferred)} deferred ({shown}{', ...' if len(report.deferred) > 10 else ''})")
    denied = {d.step for d in report.denied}
    add("awaiting approval", [s for s in report.awaiting_approval if s not in denied])
    add("denied", [s for s in report.awaiting_approval if s in denied])  # not undone: a person said no
    add("pending", report.pending)
    add("cancelled", report.cancelled)
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



def when_run_gone(report: Report, started: Collection[int]) -> Report:
    """The last report of a request whose Run was deleted mid-way (docs/guarantees.md#delete-run).
    A step still ``pending`` whose compensator had started (``started``: steps with an attempt)
    may or may not have taken effect, and its journal went with the Run: its residue is
    ``unknown``, never ``notAttempted``. The rest of the report stands; it is not complete."""
    why = ("its undo was under way when the Run was deleted: whether it took effect is unknown (its journal "
           "went with the Run); look at the downstream")
    residue = [r.model_copy(update={"type": UNKNOWN, "text": why}) if r.step in started and r.step in report.pending
               else r for r in report.residue]
    return report.model_copy(update={"residue": residue, "complete": False})
