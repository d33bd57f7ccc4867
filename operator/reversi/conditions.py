"""Condition types and reasons: the closed set Reversi ever writes (cert-manager style).

Code never writes a type or reason string inline: it uses the constants below, and
:func:`condition` refuses anything outside :data:`TYPES` / :data:`REASONS`.

Conditions are plain dicts in the Kubernetes wire shape::

    {"type": "Complete", "status": "False", "reason": "Incomplete",
     "message": "step 3 could not be undone: ...", "observedGeneration": 2,
     "lastTransitionTime": "2025-01-01T00:00:00Z"}

Which types go where:

- RollbackRequest summary: ``Planned``, ``Running``, ``AwaitingApproval``, ``Complete``, ``Invalid``.
- RollbackRequest per-step entries (``status.steps[].conditions``): ``Approved``,
  ``Compensated``, ``Verified``.
- Run summary: ``RolledBack`` (every standing step settled by compensation), ``Locked``
  (a RollbackRequest holds the run: ``status.activeRequest``), ``Archived`` (False while
  the run's record cannot be written to the archive, so the run is not deleted: by retention,
  or, deleted by hand, it stays marked deleted).
- ToolManifest: ``Accepted``.  Halt / ClusterHalt: ``Active``, ``MatchesNoTool``.
- Every kind, for GitOps tools (kstatus: Flux, ``kubectl wait``, cli-utils; Argo CD health
  checks): ``Ready``, ``Reconciling`` (True while work is in progress) and ``Stalled`` (True when
  it cannot progress without a person), next to ``status.observedGeneration``. Built by
  ``reversi.adapters.status.readiness`` and its per-kind callers, never by hand.

This module imports only the standard library.
"""

from __future__ import annotations

from datetime import datetime, UTC
from typing import Any
from collections.abc import Iterable

# --------------------------------------------------------------------------------------- status
TRUE = "True"
FALSE = "False"
UNKNOWN = "Unknown"
STATUSES = frozenset({TRUE, FALSE, UNKNOWN})

# ---------------------------------------------------------------------------------------- types
# RollbackRequest summary
PLANNED = "Planned"
RUNNING = "Running"
AWAITING_APPROVAL = "AwaitingApproval"  # also a reason
COMPLETE = "Complete"
INVALID = "Invalid"
# RollbackRequest per step
APPROVED = "Approved"
COMPENSATED = "Compensated"
VERIFIED = "Verified"  # also a reason
# Run
ROLLED_BACK = "RolledBack"
LOCKED = "Locked"
ARCHIVED = "Archived"  # False while the Run's record cannot be written to the archive (the Run then waits)
# ToolManifest
ACCEPTED = "Accepted"
# Halt / ClusterHalt
ACTIVE = "Active"
# Every kind (kstatus conventions)
READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"
MATCHES_NO_TOOL = "MatchesNoTool"  # True: scope.tool matches no tool of any ToolManifest in reach
IN_FORCE = "InForce"  # Halt/ClusterHalt, True: the API server refused a dry run of a call it matches

TYPES = frozenset(
    {
        PLANNED,
        RUNNING,
        AWAITING_APPROVAL,
        COMPLETE,
        INVALID,
        APPROVED,
        COMPENSATED,
        VERIFIED,
        ROLLED_BACK,
        LOCKED,
        ARCHIVED,
        ACCEPTED,
        ACTIVE,
        READY,
        RECONCILING,
        STALLED,
        MATCHES_NO_TOOL,
        IN_FORCE,
    }
)

# -------------------------------------------------------------------------------------- reasons
# Planning / request lifecycle
PLAN_READY = "PlanReady"  # Planned=True: the plan is in status.plan
DRY_RUN = "DryRun"  # Running=False / Complete=False: dry run, nothing is undone
WAITING_FOR_RUN = "WaitingForRun"  # another RollbackRequest holds the run (rule 6)
RUN_NOT_FOUND = "RunNotFound"  # Invalid=True, phase Failed
MANIFEST_NOT_FOUND = "ManifestNotFound"  # Invalid=True, phase Failed
RUNNERS_TOO_LARGE = "RunnersTooLarge"  # Invalid=True: the runners to record in status.runners are too big
INVALID_DEPENDENCIES = "InvalidDependencies"  # Invalid=True: the run's dependencies are broken
INVALID_SPEC = "InvalidSpec"  # Invalid=True: the request's own spec is unusable
VALID = "Valid"  # Invalid=False
NOT_STARTED = "NotStarted"  # Running=False before the first compensation starts (later: Idle or AwaitingApproval)
IN_PROGRESS = "InProgress"  # Running=True
FINISHED = "Finished"  # Running=False after the last compensation settled
DEADLINE_EXCEEDED = "DeadlineExceeded"  # spec.deadlineSeconds passed; the rest is reported
CANCELLED = "Cancelled"  # spec.cancel: Complete=False (request), Compensated=False (a step not started)
REQUEST_DELETED = "RequestDeleted"  # Locked=False: the request holding the run was deleted mid-way
NOTHING_TO_UNDO = "NothingToUndo"  # Complete=True: no standing step needs an undo
RECONCILE_ERROR = "ReconcileError"  # Running=Unknown: the operator keeps failing on this request; it retries
# Per-step compensation (Compensated condition)
PENDING = "Pending"  # Compensated=False: not started yet (order or parallelism)
COMPENSATING = "Compensating"  # Compensated=Unknown: the compensator Job is running (rule 3)
COMPENSATION_SUCCEEDED = "CompensationSucceeded"  # Compensated=True
ALREADY_COMPENSATED = "AlreadyCompensated"  # Compensated=True: settled earlier (rule 6)
COMPENSATION_RETRYING = "CompensationRetrying"  # Compensated=Unknown: waiting for backoff (rule 4)
COMPENSATION_FAILED = "CompensationFailed"  # Compensated=False: retries used up (rule 4)
BLOCKED = "Blocked"  # Compensated=False: deferred, a dependent still stands (rule 1)
ALREADY_RECOVERED = "AlreadyRecovered"  # Compensated=True: the precheck read showed it undone; no compensator ran
EXPIRED = "Expired"  # Compensated=False: compensation.windowSeconds after recordedAt passed: not attempted
HANDLER_UNAVAILABLE = "HandlerUnavailable"  # Compensated=False: its runner is missing or its Job cannot be made
CONFLICT = "Conflict"  # Compensated=False: compensation.precondition does not hold: not undone (spec.force)
FORCED = "Forced"  # Compensated=Unknown/True: the precondition did not hold; spec.force names the step
# Compensated=False: not started before spec.compensationDeadlineSeconds
COMPENSATION_DEADLINE_PASSED = "CompensationDeadlinePassed"
# Per-step approval (Approved condition, rule 8); AWAITING_APPROVAL is also a reason
APPROVED_BY_USER = "ApprovedByUser"  # Approved=True: spec.approvals names the step
APPROVED_FOR_ALL = "ApprovedForAll"  # Approved=True: spec.approveCompensations
NONE_AWAITING = "NoneAwaiting"  # AwaitingApproval=False: no step waits (approved one by one, or none needs it)
APPROVAL_NOT_REQUIRED = "ApprovalNotRequired"  # Approved=True: snapshot does not require it
DENIED = "Denied"  # Approved=False / Compensated=False: spec.denials names the step: it is not undone
# Per-step verification (Verified condition, rule 5); VERIFIED is also a reason
VERIFYING = "Verifying"  # Verified=Unknown: the reader Job is running or waiting for backoff
VERIFICATION_FAILED = "VerificationFailed"  # Verified=False: the answer does not contain expect
VERIFICATION_ARGUMENTS_UNAVAILABLE = "VerificationArgumentsUnavailable"  # Verified=False
READ_FAILED = "ReadFailed"  # Verified=False: reader exited non-zero or printed no JSON
NO_READER = "NoReader"  # Verified=False: a read-back is declared but no reader ran: the step is unverified
NO_READ_BACK_DECLARED = "NoReadBackDeclared"  # Verified=False: the manifest declares no read-back (complete)
READ_BACK_REQUIRED = "ReadBackRequired"  # Verified=False: none declared, but spec.requireVerification: unverified
# Summary verdicts (Complete condition, Run RolledBack)
ALL_COMPENSATED = "AllCompensated"  # Complete=True / RolledBack=True
INCOMPLETE = "Incomplete"  # Complete=False: the report lists what is not undone
PARTIAL = "Partial"  # Complete=False: some steps were undone, others not (the report lists them)
NOT_POSSIBLE = "NotPossible"  # Complete=False: nothing could be undone
# Run lock
HELD_BY_REQUEST = "HeldByRequest"  # Locked=True
RELEASED = "Released"  # Locked=False
# ToolManifest
MANIFEST_VALID = "ManifestValid"  # Accepted=True
MANIFEST_INVALID = "ManifestInvalid"  # Accepted=False
# Halt
HALT_IN_EFFECT = "HaltInEffect"  # Active=True
# Ready / Reconciling / Stalled (every kind); most reuse the reasons above
NO_ROLLBACK = "NoRollback"  # Run Ready=True: no rollback has worked on the run yet
RESIDUE_ACKNOWLEDGED = "ResidueAcknowledged"  # Ready=True (a Run, its last request): a person accepted what stands
SUPERSEDED = "Superseded"  # Ready=True (an Incomplete request): a later rollback of its Run says what stands now
IDLE = "Idle"  # Reconciling=False / Stalled=False: nothing is in progress, nothing is stuck
SCHEMA_OUTDATED = "SchemaOutdated"  # Event reason: the installed CRDs are older than the operator
SCHEMA_CURRENT = "SchemaCurrent"  # Event reason: the installed CRDs are current again
INVALID_PATTERN = "InvalidPattern"  # Active=False: a scope pattern can never match (stored before the rule)
NO_TOOL_IN_REACH = "NoToolInReach"  # MatchesNoTool=True: no manifested tool in reach matches scope.tool
TOOLS_IN_REACH = "ToolsInReach"  # MatchesNoTool=False: the message names the tools it matches
REFUSED_BY_API_SERVER = "RefusedByAPIServer"  # InForce=True: a dry run of a matching call was refused
NOT_YET_REFUSED = "NotYetRefused"  # InForce=False: the API server still admitted the dry run when last probed
NOT_PROBED = "NotProbed"  # InForce=Unknown: no namespace to probe in (a ClusterHalt's namespace glob)
ARCHIVE_FAILED = "ArchiveFailed"  # Archived=False (and a Warning Event): the record could not be written; not deleted

REASONS = frozenset(
    {
        RESIDUE_ACKNOWLEDGED,
        SUPERSEDED,
        PLAN_READY,
        DRY_RUN,
        WAITING_FOR_RUN,
        RUN_NOT_FOUND,
        MANIFEST_NOT_FOUND,
        RUNNERS_TOO_LARGE,
        INVALID_DEPENDENCIES,
        INVALID_SPEC,
        VALID,
        NOT_STARTED,
        IN_PROGRESS,
        FINISHED,
        DEADLINE_EXCEEDED,
        CANCELLED,
        REQUEST_DELETED,
        NOTHING_TO_UNDO,
        RECONCILE_ERROR,
        PENDING,
        COMPENSATING,
        COMPENSATION_SUCCEEDED,
        ALREADY_COMPENSATED,
        COMPENSATION_RETRYING,
        COMPENSATION_FAILED,
        BLOCKED,
        ALREADY_RECOVERED,
        EXPIRED,
        HANDLER_UNAVAILABLE,
        CONFLICT,
        FORCED,
        COMPENSATION_DEADLINE_PASSED,
        PARTIAL,
        NOT_POSSIBLE,
        AWAITING_APPROVAL,
        APPROVED_BY_USER,
        APPROVED_FOR_ALL,
        NONE_AWAITING,
        APPROVAL_NOT_REQUIRED,
        DENIED,
        VERIFIED,
        VERIFYING,
        VERIFICATION_FAILED,
        VERIFICATION_ARGUMENTS_UNAVAILABLE,
        READ_FAILED,
        NO_READER,
        NO_READ_BACK_DECLARED,
        READ_BACK_REQUIRED,
        ALL_COMPENSATED,
        INCOMPLETE,
        HELD_BY_REQUEST,
        RELEASED,
        MANIFEST_VALID,
        MANIFEST_INVALID,
        HALT_IN_EFFECT,
        NO_ROLLBACK,
        IDLE,
        INVALID_PATTERN,
        NO_TOOL_IN_REACH,
        TOOLS_IN_REACH,
        REFUSED_BY_API_SERVER,
        NOT_YET_REFUSED,
        NOT_PROBED,
        ARCHIVE_FAILED,
    }
)

# Longest message kept in a condition (Kubernetes allows 32768; keep status small).
MAX_MESSAGE_LENGTH = 4096


def rfc3339(moment: datetime | None = None) -> str:
    """Format ``moment`` (default: now) as a Kubernetes timestamp, UTC, seconds: ``2025-01-01T00:00:00Z``."""
    moment = moment or datetime.now(UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(
    type_: str,
    status: str,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Build one condition dict (wire shape, camelCase keys).

    ``status`` is ``"True"``, ``"False"`` or ``"Unknown"`` (a Python bool is accepted and
    converted). ``message`` is cut to :data:`MAX_MESSAGE_LENGTH` characters.
    ``lastTransitionTime`` is ``now`` (default: the current time) as RFC 3339.

    Raises ``ValueError`` for a type, status or reason outside the closed sets of this module.
    """
    if isinstance(status, bool):
        status = TRUE if status else FALSE
    if type_ not in TYPES:
        raise ValueError(f"unknown condition type {type_!r}; add it to reversi.conditions.TYPES")
    if status not in STATUSES:
        raise ValueError(f"condition status must be True, False or Unknown, not {status!r}")
    if reason not in REASONS:
        raise ValueError(f"unknown condition reason {reason!r}; add it to reversi.conditions.REASONS")
    if len(message) > MAX_MESSAGE_LENGTH:
        message = message[: MAX_MESSAGE_LENGTH - 1] + "…"
    out: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": rfc3339(now),
    }
    if observed_generation is not None:
        out["observedGeneration"] = observed_generation
    return out


def get_condition(conditions: Iterable[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    """Return the condition of ``type_`` in ``conditions`` (or ``None``)."""
    for cond in conditions or ():
        if cond.get("type") == type_:
            return cond
    return None


def set_condition(conditions: Iterable[dict[str, Any]] | None, new: dict[str, Any]) -> list[dict[str, Any]]:
    """Return a new list with ``new`` replacing the condition of the same type (or appended).

    When the status does not change, the old ``lastTransitionTime`` is kept (reason, message and
    observedGeneration are updated). The input list is not modified; order is kept.
    """
    out: list[dict[str, Any]] = []
    placed = False
    for cond in conditions or ():
        if cond.get("type") == new["type"]:
            merged = dict(new)
            if cond.get("status") == new["status"] and cond.get("lastTransitionTime"):
                merged["lastTransitionTime"] = cond["lastTransitionTime"]
            out.append(merged)
            placed = True
        else:
            out.append(dict(cond))
    if not placed:
        out.append(dict(new))
    return out


def is_true(conditions: Iterable[dict[str, Any]] | None, type_: str) -> bool:
    """True when the condition of ``type_`` exists and has status ``"True"``."""
    cond = get_condition(conditions, type_)
    return bool(cond and cond.get("status") == TRUE)


# ----------------------------------------------------------------- kstatus: Ready / Reconciling / Stalled

READY_STATE, PROGRESSING, STALLED_STATE = "ready", "progressing", "stalled"


def readiness(state: str, reason: str, message: str) -> list[tuple[str, str, str, str]]:
    """The ``Ready``, ``Reconciling`` and ``Stalled`` updates (for ``reversi.adapters.status.summary_conditions``)
    of an object that is ``"ready"``, ``"progressing"`` or ``"stalled"`` (kstatus conventions):

    - ready: Ready=True (``reason``), Reconciling=False and Stalled=False (``Idle``);
    - progressing: Ready=False and Reconciling=True (``reason``; it may wait for a person, e.g.
      an approval), Stalled=False (``Idle``);
    - stalled (a person must act): Ready=False and Stalled=True (``reason``), Reconciling=False.

    kstatus then computes Current, InProgress and Failed. Raises ``ValueError`` for another state.
    """
    if state not in (READY_STATE, PROGRESSING, STALLED_STATE):
        raise ValueError(f"readiness state must be ready, progressing or stalled, not {state!r}")
    idle = "nothing is in progress" if state != PROGRESSING else "work is in progress"
    return [
        (READY, TRUE if state == READY_STATE else FALSE, reason, message),
        (RECONCILING, TRUE if state == PROGRESSING else FALSE, reason if state == PROGRESSING else IDLE,
         message if state == PROGRESSING else idle),
        (STALLED, TRUE if state == STALLED_STATE else FALSE, reason if state == STALLED_STATE else IDLE,
         message if state == STALLED_STATE else "nothing needs a person" if state == READY_STATE
         else "not stalled: Reconciling says what it is doing or waiting for"),
    ]


def request_readiness(phase: str, reason: str, message: str) -> list[tuple[str, str, str, str]]:
    """Ready/Reconciling/Stalled of a RollbackRequest in ``phase``: ready when Planned or
    Succeeded; stalled when Incomplete or Failed (the report or the Invalid condition says what
    a person must do); progressing otherwise (Pending, Waiting, Running, AwaitingApproval)."""
    if phase in ("Planned", "Succeeded"):
        return readiness(READY_STATE, reason, message)
    if phase in ("Incomplete", "Failed"):
        return readiness(STALLED_STATE, reason, message)
    return readiness(PROGRESSING, reason, message)
