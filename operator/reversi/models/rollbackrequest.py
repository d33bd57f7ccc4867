"""RollbackRequest (namespaced): asks for a run to be undone, or only planned
(docs/concepts.md#the-rollbackrequests-status).

``spec.runRef`` and ``spec.dryRun`` are immutable (CEL); approvers are stamped at admission and
never change. The status carries the plan (:class:`Plan`), one :class:`StepStatus` per
compensate/defer action, the :class:`Report`, the summary conditions and a readable ``phase``:

    Pending -> Waiting (another request holds the run) -> Planned (dry run: final)
            -> Running <-> AwaitingApproval -> Succeeded | Incomplete
    Failed: the request itself is unusable (run or manifest missing, broken dependencies).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field

from .common import (
    MAX_CONDITIONS,
    MAX_NAME,
    MAX_RUNNERS,
    MAX_STEPS,
    MAX_TOOLS,
    Backoff,
    Condition,
    CrdInfo,
    JSONObject,
    ObjectRef,
    ReversiModel,
    StatusModel,
    Text,
    ToolName,
    age_column,
    ready_column,
    immutable,
    list_map,
    rule,
)
from .toolmanifest import Runner

Phase = Literal["Pending", "Waiting", "Planned", "Running", "AwaitingApproval", "Succeeded", "Incomplete", "Failed"]
StepStage = Literal["pending", "awaitingApproval", "prechecking", "preconditioning", "compensating", "retrying",
                    "checking", "verifying", "rereading", "compensated", "failed", "deferred", "alreadyRecovered",
                    "expired", "handlerUnavailable", "conflict", "compensationDeadlinePassed", "cancelled"]
ActionKind = Literal["compensate", "skip", "unrecoverable", "unresolved", "unmanifested", "defer", "expired",
                     "handlerUnavailable"]

PHASES: tuple[str, ...] = ("Pending", "Waiting", "Planned", "Running", "AwaitingApproval", "Succeeded", "Incomplete",
                           "Failed")
TERMINAL_PHASES = frozenset({"Planned", "Succeeded", "Incomplete", "Failed"})


def run_ref_name(request: Any) -> str | None:
    """The name of the Run a RollbackRequest (a dict, as the API returns it) names in
    ``spec.runRef``, or None when it names none. Pure."""
    name = ((request.get("spec") or {}).get("runRef") or {}).get("name")
    return name if isinstance(name, str) else None


class Approval(ReversiModel):
    """Approval of one step's compensation (rule 8 of docs/concepts.md#rollback-rules)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                rule(
                    "!has(oldSelf.approver) || (has(self.approver) && self.approver == oldSelf.approver)",
                    "an approval's approver cannot change",
                )
            ]
        }
    )

    step: int = Field(ge=0, le=MAX_STEPS - 1, description="Index of the step whose compensation is approved.")
    approver: str | None = Field(
        default=None, max_length=MAX_NAME * 2, description="Who approved (stamped at admission from the authenticated "
        "user)."
    )
    approved_at: datetime | None = Field(default=None, description="When it was approved.")


class Denial(ReversiModel):
    """Denial of one step's compensation that awaits approval (RBAC verb approve): the step is not
    undone, the report lists it under awaitingApproval with ``denied by <actor>: <note>``, and the
    request finishes."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                rule(
                    "!has(oldSelf.actor) || (has(self.actor) && self.actor == oldSelf.actor)",
                    "a denial's actor cannot change",
                )
            ]
        }
    )

    step: int = Field(ge=0, le=MAX_STEPS - 1, description="Index of the step whose compensation is denied.")
    note: str = Field(min_length=1, max_length=1024, description="Why it is denied, for the record.")
    actor: str | None = Field(
        default=None, max_length=MAX_NAME * 2, description="Who denied (stamped at admission from the authenticated "
        "user)."
    )
    denied_at: datetime | None = Field(default=None, description="When it was denied (stamped at admission).")


class Force(ReversiModel):
    """Undo one step even though its compensation's precondition does not hold (a ``conflict``):
    needs the RBAC verb ``force`` on rollbackrequests; the actor is stamped at admission."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                rule(
                    "!has(oldSelf.actor) || (has(self.actor) && self.actor == oldSelf.actor)",
                    "a force's actor cannot change",
                )
            ]
        }
    )

    step: int = Field(ge=0, le=MAX_STEPS - 1, description="Index of the step to undo despite a failed precondition.")
    actor: str | None = Field(
        default=None, max_length=MAX_NAME * 2, description="Who forced it (stamped at admission from the "
        "authenticated user)."
    )
    forced_at: datetime | None = Field(default=None, description="When it was forced (stamped at admission).")


class RollbackRequestSpec(ReversiModel):
    """Which run to undo and how: dry run, approvals, retries, backoff, parallelism, deadline."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                rule(
                    "!has(oldSelf.approvedBy) || (has(self.approvedBy) && self.approvedBy == oldSelf.approvedBy)",
                    "spec.approvedBy is immutable once set",
                    fieldPath=".approvedBy",
                ),
                rule(
                    "!has(oldSelf.cancel) || !oldSelf.cancel || (has(self.cancel) && self.cancel)",
                    "spec.cancel cannot be undone: a cancelled request stays cancelled; create a new request",
                    fieldPath=".cancel",
                ),
                rule(
                    "!has(oldSelf.cancelledBy) || (has(self.cancelledBy) && self.cancelledBy == oldSelf.cancelledBy)",
                    "spec.cancelledBy is immutable once set",
                    fieldPath=".cancelledBy",
                ),
            ]
        }
    )

    run_ref: ObjectRef = Field(
        description="The Run (same namespace) to undo. Immutable.",
        json_schema_extra={"x-kubernetes-validations": [immutable("spec.runRef")]},
    )
    dry_run: bool = Field(
        default=False,
        description="Only plan: status.plan says what would be done; nothing is undone. Immutable.",
        json_schema_extra={"x-kubernetes-validations": [immutable("spec.dryRun")]},
    )
    approve_compensations: bool = Field(
        default=False, description="Approve every compensation that requires approval (RBAC verb approve)."
    )
    approvals: list[Approval] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        description="Per-step approvals, keyed by step (RBAC verb approve).",
        json_schema_extra=list_map("step"),
    )
    denials: list[Denial] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        description="Per-step denials of compensations that await approval, keyed by step (RBAC verb approve): "
        "the step is not undone and the request finishes.",
        json_schema_extra=list_map("step"),
    )
    approved_by: str | None = Field(
        default=None,
        max_length=MAX_NAME * 2,
        description="Who set approveCompensations (stamped at admission). Immutable once set.",
    )
    retries: int = Field(default=3, ge=1, le=10, description="Attempts per compensation before it is "
    "compensationFailed.")
    backoff: Backoff = Field(default_factory=Backoff, description="Backoff between attempts (exponential, with "
    "jitter).")
    parallelism: int = Field(
        default=1, ge=1, le=32,
        description="Compensations under way at once (the reads before a compensator, the compensator and its "
        "retries); a step whose undo is done and is being checked or read back holds no slot. Order still holds.")
    verify_command: list[Text] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="Optional extra check run after each successful undo (in the compensation's runner).",
    )
    require_verification: bool = Field(
        default=False,
        description="Count an undo whose tool declares no read-back as unverified (incomplete) instead of compensated.",
    )
    deadline_seconds: int | None = Field(
        default=None, ge=1, le=7 * 86400, description="Give up starting new work after this many seconds; the report "
        "says what is left."
    )
    compensation_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        le=7 * 86400,
        description="Steps whose compensation kind is compensation (not inverse) start only within this many seconds "
        "of the request's start (checked before each start); a step not started in time is compensationDeadlinePassed.",
    )
    force: list[Force] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        description="Steps undone even when their compensation's precondition does not hold (conflict), keyed by "
        "step (RBAC verb force); each records who forced it.",
        json_schema_extra=list_map("step"),
    )

    cancel: bool = Field(
        default=False,
        description="Stop the request (kubectl reversi cancel): no new Job starts; running Jobs finish and are "
        "recorded with their true outcome; every step not started is cancelled; the Run is released; the request "
        "ends Incomplete with Complete=False reason Cancelled. Cannot be set back to false; a no-op on a finished "
        "request.",
    )
    cancelled_by: str | None = Field(
        default=None,
        max_length=MAX_NAME * 2,
        description="Who set cancel (stamped at admission). Immutable once set.",
    )

    def approved_steps(self) -> set[int]:
        """Indices of steps approved one by one in ``spec.approvals``."""
        return {approval.step for approval in self.approvals}


class PlanAction(StatusModel):
    """What the rollback does with one step (rule 2 of docs/concepts.md#rollback-rules)."""

    step: int = Field(ge=0, description="Index of the step.")
    tool: str = Field(description="Tool of the step.")
    kind: ActionKind = Field(
        description="compensate, skip, unrecoverable, unresolved, unmanifested, defer, expired (past the "
        "compensation's windowSeconds) or handlerUnavailable (its runner is not in the ToolManifest)."
    )
    reason: str = Field(default="", description="Why this kind, for a person.")
    compensation_tool: str | None = Field(default=None, description="compensate: the tool that undoes the step.")
    compensation_kind: Literal["inverse", "compensation"] | None = Field(
        default=None, description="compensate: inverse (exact prior state) or compensation (amends)."
    )
    runner: str | None = Field(default=None, description="compensate: runner of the compensator Job.")
    args: JSONObject | None = Field(default=None, description="compensate: resolved compensation arguments.")
    idempotency_key: str | None = Field(
        default=None, description="compensate: compensation idempotency key (64 hex), the same on every retry and "
        "re-run."
    )
    needs_approval: bool = Field(default=False, description="compensate: waits for approval before it runs.")
    residue: list[str] = Field(
        default_factory=list, description="What the undo cannot take back (for irreversible steps: what stays)."
    )
    verified: bool = Field(default=False, description="compensate: a reader Job will check the undo.")
    blocked_by: list[int] = Field(
        default_factory=list, description="defer: standing dependents that will not be undone (the lowest 8 listed)."
    )


class Plan(StatusModel):
    """The dry run: one action per step (skip for steps that failed) and fullyReversible."""

    fully_reversible: bool = Field(
        description="Every standing step is compensate or skip, assuming each compensation succeeds; residue does not "
        "make it false."
    )
    actions: list[PlanAction] = Field(
        default_factory=list, description="One action per step, in step order (see omitted)."
    )
    omitted: int = Field(
        default=0,
        ge=0,
        description="Actions left out to keep the status small (skips first, then the oldest); the report lists every "
        "step.",
    )

    def action(self, step: int) -> PlanAction:
        """The action of step ``step``. A full plan (``omitted == 0``) is in step order:
        ``actions[i].step == i``; a compacted one is searched. Raises ``KeyError`` when absent."""
        if not self.omitted and step < len(self.actions) and self.actions[step].step == step:
            return self.actions[step]
        for action in self.actions:
            if action.step == step:
                return action
        raise KeyError(step)

    def of_kind(self, *kinds: str) -> list[PlanAction]:
        """Actions of the given kinds, in step order."""
        return [a for a in self.actions if a.kind in kinds]


class StepStatus(StatusModel):
    """Progress of one compensate or defer action, with its own conditions (Approved, Compensated, Verified)."""

    step: int = Field(ge=0, description="Index of the step.")
    tool: str | None = Field(default=None, description="Tool of the step.")
    compensation_tool: str | None = Field(default=None, description="Tool that undoes it.")
    stage: StepStage | None = Field(
        default=None,
        description="Where the step is: pending, awaitingApproval, prechecking, preconditioning, compensating, "
        "retrying, "
        "checking (verifyCommand), verifying, rereading, compensated, failed, deferred, alreadyRecovered, expired, "
        "handlerUnavailable, conflict, compensationDeadlinePassed or cancelled (not started: the request was "
        "cancelled). docs/concepts.md has a table of every step status.",
    )
    attempts: int = Field(default=0, ge=0, description="Compensation attempts so far (across requests: the attempt "
    "number).")
    first_attempt: int | None = Field(
        default=None, ge=1,
        description="The first attempt this request ran: its retries budget counts from there (retries are per "
        "request).",
    )
    reads: int = Field(default=0, ge=0, description="Read-backs of the current attempt so far (verification).")
    lost_reads: int | None = Field(
        default=None, ge=0,
        description="Read-backs of the current attempt that gave no answer (the reader's pod was lost, or never ran "
        "to an exit before its deadline): read again without counting against verification.retries, at most 3.")
    idempotency_key: str | None = Field(default=None, description="Compensation idempotency key (64 hex).")
    blocked_by: list[int] = Field(default_factory=list, description="Standing dependents that keep this step from "
    "being undone.")
    last_error: str | None = Field(default=None, description="Error of the last failed attempt or check.")
    next_attempt_at: datetime | None = Field(default=None, description="Earliest time of the next attempt (backoff).")
    forced_by: str | None = Field(
        default=None, description="Who forced the undo although its compensation's precondition did not hold "
        "(spec.force)."
    )
    effect_unknown: bool | None = Field(
        default=None,
        description="The last answer about the undo leaves its effect unknown: the last compensator that ran gave no "
        "answer of its own (killed by its deadline, evicted, OOM-killed, lost with its node), or the last read-back "
        "failed or could not be made. A step that ends failed with it is residue unknown, without it failed.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="Approved, Compensated, Verified.",
        json_schema_extra=list_map("type"),
    )


class StepError(StatusModel):
    """A step and why it failed."""

    step: int = Field(ge=0, description="Index of the step.")
    error: str = Field(description="What failed: the compensation's error or the first field that differs.")


class StepReason(StatusModel):
    """A step and why it cannot be undone."""

    step: int = Field(ge=0, description="Index of the step.")
    reason: str = Field(description="Why the step cannot be undone, with its residue.")


class StepBlocked(StatusModel):
    """A step that was not undone because dependents still stand."""

    step: int = Field(ge=0, description="Index of the step.")
    blocked_by: list[int] = Field(default_factory=list, description="Standing dependents that keep it from being "
    "undone.")


ResidueType = Literal["declared", "failed", "notAttempted", "unknown"]
RESIDUE_TYPES: tuple[str, ...] = ("declared", "failed", "notAttempted", "unknown")


class StepResidue(StatusModel):
    """One thing a rollback leaves behind (typed residue, docs/concepts.md#the-report): ``type`` declared (a
    residue line the manifest states for an undone step), failed (the undo failed: the effect may
    remain), notAttempted (the step was not undone: irreversible, deadline, cancel, deferred,
    approval, ...: the effect remains) or unknown (uncertain outcome, an unchecked undo, a failed
    read). ``residue`` is the shape of reports written before typed residue (read as declared)."""

    step: int = Field(ge=0, description="Index of the step.")
    type: ResidueType = Field(
        default="declared",
        description="declared (stated in the manifest, for an undone step), failed (the undo failed: the effect may "
        "remain), notAttempted (not undone: the effect remains) or unknown (uncertain outcome, unchecked undo, failed "
        "read).",
    )
    text: str = Field(default="", description="What is left behind, for a person.")
    residue: list[str] | None = Field(
        default=None,
        description="Deprecated: the manifest's residue lines of a report written before typed residue "
        "(read as type declared); new reports use type and text.",
    )


RunOutcome = Literal["pending", "running", "rolledBack", "incomplete", "alreadyRecovered", "cancelled"]
#: sections of one report: the run and every run below it (models.run.MAX_TREE_RUNS)
MAX_SECTIONS = 65


class RunSection(StatusModel):
    """One run of a tree rollback (nested runs, docs/concepts.md#nested-runs): the request's run itself, or a
    run below it, in the order they are rolled back. A child's full report is in the status of
    the request that rolled it back (``request``, owned by this one)."""

    run: str = Field(description="Name of the Run.")
    parent: str | None = Field(default=None, description="Its parent Run (absent for the request's own run).")
    opened: int | None = Field(
        default=None, ge=0, description="The parent's step count when this run was opened (its spec.parentRef.step)."
    )
    request: str | None = Field(
        default=None, description="RollbackRequest whose status holds this run's full report (for a child: one made "
        "and owned by this request; absent when no request was needed).",
    )
    outcome: RunOutcome = Field(
        description="pending (not reached yet), running, rolledBack (complete), incomplete, alreadyRecovered (rolled "
        "back completely by an earlier request: nothing ran again) or cancelled (not started: the request was "
        "cancelled).",
    )
    complete: bool = Field(default=False, description="The run's own report is complete (alreadyRecovered counts).")
    compensated: int = Field(default=0, ge=0, description="Steps of the run in its report's compensated bucket.")
    failed: int = Field(default=0, ge=0, description="Steps in its failed bucket.")
    message: str | None = Field(default=None, description="The run's verdict, for a person.")


class TreeRun(StatusModel):
    """A run below the request's run, locked with it (nested runs)."""

    run: str = Field(description="Name of the Run.")
    parent: str = Field(description="Its parent Run.")
    opened: int = Field(default=0, ge=0, description="The parent's step count when it was opened.")
    created: str | None = Field(default=None, description="Its creationTimestamp (orders children opened at one "
    "index).")


class Report(StatusModel):
    """The verdict of a rollback (docs/concepts.md#the-report). Every standing step is in exactly one bucket."""

    compensated: list[int] = Field(
        default_factory=list,
        description="Undone: checked by a reader, or with no read-back declared (those are also in noReadBack).",
    )
    skipped: list[int] = Field(
        default_factory=list, description="Needed no undo: read or idempotent, outcome failed, or already compensated."
    )
    failed: list[StepError] = Field(default_factory=list, description="Compensation or verification failed.")
    unrecoverable: list[StepReason] = Field(
        default_factory=list, description="Cannot be undone: irreversible, or compensation arguments missing."
    )
    unresolved: list[int] = Field(default_factory=list, description="Outcome intended or uncertain: settle with a "
    "resolution.")
    unmanifested: list[int] = Field(default_factory=list, description="No manifest entry (observe mode).")
    deferred: list[StepBlocked] = Field(default_factory=list, description="Not undone because dependents still stand.")
    awaiting_approval: list[int] = Field(default_factory=list, description="Waiting for approval, or denied (see "
    "denied).")
    denied: list[StepReason] = Field(
        default_factory=list,
        description="Steps of awaitingApproval whose compensation was denied: denied by <actor>: <note>. Not a bucket "
        "of its own.",
    )
    unverified: list[int] = Field(
        default_factory=list,
        description="Undone but not checked: a declared read-back could not run (no reader runner), or none is "
        "declared and the request sets requireVerification. Not in compensated.",
    )
    no_read_back: list[int] = Field(
        default_factory=list,
        description="Compensated steps whose tool declares no read-back (verification none): undone, not checked. "
        "Also in compensated; not a bucket of its own.",
    )
    pending: list[int] = Field(
        default_factory=list, description="Not settled yet (compensation pending or running), e.g. at a deadline."
    )
    cancelled: list[int] = Field(
        default_factory=list,
        description="Not started because the request was cancelled (spec.cancel): no compensator ran for them in this "
        "request.",
    )
    already_recovered: list[int] = Field(
        default_factory=list,
        description="Already undone when the rollback looked (the precheck read matched): no compensator ran.",
    )
    expired: list[StepReason] = Field(
        default_factory=list, description="Not attempted: the compensation's windowSeconds after recordedAt had passed."
    )
    handler_unavailable: list[StepReason] = Field(
        default_factory=list,
        description="Not attempted: the compensation's runner is not in the ToolManifest, or its Job cannot be made.",
    )
    conflict: list[StepReason] = Field(
        default_factory=list,
        description="Not undone: the compensation's precondition does not hold (force it with spec.force).",
    )
    compensation_deadline_passed: list[int] = Field(
        default_factory=list,
        description="Not attempted: compensation-kind steps not started before spec.compensationDeadlineSeconds.",
    )
    forced: list[StepReason] = Field(
        default_factory=list,
        description="Steps undone although their precondition did not hold: forced by <actor>. Not a bucket of its "
        "own.",
    )
    foreign: list[StepReason] = Field(
        default_factory=list,
        description="RunSteps named after this run that are not part of its record (another principal, another Run of "
        "the same name, or a copy of the Run that disagrees with it), with the rule each broke: never undone. Not a "
        "bucket of the run's steps.",
    )
    missing: list[int] = Field(
        default_factory=list,
        description="Indices below the run's last step that no step has: no call was recorded there. Not a bucket.",
    )
    residue: list[StepResidue] = Field(
        default_factory=list,
        description="Typed residue {step, type, text}: declared lines of undone steps, and one entry per step not "
        "(surely) undone: failed, notAttempted or unknown.",
    )
    complete: bool = Field(
        default=False,
        description="True only when every residue entry is declared (failed, unrecoverable, unresolved, unmanifested, "
        "deferred, awaitingApproval, unverified, pending, expired, handlerUnavailable, conflict, "
        "compensationDeadlinePassed and cancelled are all empty). For a run with child runs: also every run "
        "section is complete.",
    )
    runs: list[RunSection] = Field(
        default_factory=list,
        max_length=MAX_SECTIONS,
        description="For a run with child runs (nested runs): a section per run, the request's run first, then each "
        "run below it in the order it is rolled back. The buckets above are the request's own run's.",
    )


class RecordedRunner(Runner):
    """A runner as the ToolManifest gave it when the request took the Run's lock: every Job the
    request starts (compensator, reader, check) is built from this copy, never from the live
    ToolManifest. Literal ``env`` values are copied as they are (whoever reads the ToolManifest
    reads them already: keep secrets in ``valueFrom.secretKeyRef`` or ``envFrom``); ``valueFrom``
    and ``envFrom`` entries are copied as references, never resolved."""

    model_config = ConfigDict(extra="ignore")

    read_back_tools: list[ToolName] = Field(
        default_factory=list,
        max_length=MAX_TOOLS,
        description="Read-back tools this runner reads for because the ToolManifest gave it to them at the lock "
        "(the step's own reader runner was not defined then): a re-verify or a reader of this request uses it for "
        "them.",
    )


class RollbackRequestStatus(StatusModel):
    """Observed state of a RollbackRequest."""

    observed_generation: int | None = Field(default=None, ge=0, description="metadata.generation last processed.")
    phase: Phase | None = Field(
        default=None,
        description="Pending, Waiting, Planned, Running, AwaitingApproval, Succeeded, Incomplete or Failed (the "
        "request is invalid).",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="Planned, Running, AwaitingApproval, Complete, Invalid; Ready (True when Succeeded or Planned), "
        "Reconciling (True while work is in progress), Stalled (True when a person must act: Incomplete, Failed).",
        json_schema_extra=list_map("type"),
    )
    plan: Plan | None = Field(default=None, description="The plan (also the whole answer of a dry run).")
    run_steps: int | None = Field(
        default=None,
        ge=0,
        description="Steps of the Run when this request took its lock: only steps 0..runSteps-1 are planned and "
        "undone.",
    )
    runners: list[RecordedRunner] | None = Field(
        default=None,
        max_length=MAX_RUNNERS,
        description="The runners this request uses, recorded from the ToolManifest when it took the Run's lock (only "
        "those its plan needs: compensators, readers, the verifyCommand check). Every Job it starts is built from "
        "them until it ends; a later ToolManifest change affects the next request. Unset before the lock and in a dry "
        "run.",
    )
    tree_runs: list[TreeRun] | None = Field(
        default=None,
        max_length=MAX_SECTIONS,
        description="Nested runs: every Run below this request's run, locked with it when it took the lock (one lock "
        "over the whole tree, released together at the end). Unset before the lock; empty for a run with no children.",
    )
    steps: list[StepStatus] = Field(
        default_factory=list,
        description="One entry per compensate or defer action.",
        json_schema_extra=list_map("step"),
    )
    report: Report | None = Field(default=None, description="The verdict (docs/concepts.md#the-report).")
    progress: str | None = Field(default=None, description='Settled compensations of all, e.g. "3/7".')
    start_time: datetime | None = Field(default=None, description="When work on the run started.")
    completion_time: datetime | None = Field(default=None, description="When the request reached a final phase.")


class RollbackRequest(ReversiModel):
    """A whole RollbackRequest object (apiVersion, kind, metadata, spec, status)."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["reversi.dev/v1alpha1"] = Field(default="reversi.dev/v1alpha1", description="API version.")
    kind: Literal["RollbackRequest"] = Field(default="RollbackRequest", description="Kind.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Object metadata.")
    spec: RollbackRequestSpec = Field(description="What to undo and how.")
    status: RollbackRequestStatus | None = Field(default=None, description="Observed state.")


CRD = CrdInfo(
    kind="RollbackRequest",
    plural="rollbackrequests",
    singular="rollbackrequest",
    short_names=["rbr"],
    description="Asks for a Run to be undone (or only planned: dryRun) and reports what was undone, checked, and not.",
    spec_model=RollbackRequestSpec,
    status_model=RollbackRequestStatus,
    printer_columns=[
        {"name": "Run", "type": "string", "jsonPath": ".spec.runRef.name"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Progress", "type": "string", "jsonPath": ".status.progress"},
        {"name": "Complete", "type": "boolean", "jsonPath": ".status.report.complete"},
        {"name": "Dry Run", "type": "boolean", "jsonPath": ".spec.dryRun", "priority": 1},
        ready_column(),
        age_column(),
    ],
)
