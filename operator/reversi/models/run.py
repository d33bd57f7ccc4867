"""Run (namespaced): the identity of one automation's run, and its lock (docs/concepts.md).

The run's steps are not in the Run: each is a :class:`~reversi.models.runstep.RunStep` of its own
(named ``<run>-<index>``, owned by the Run), so recording a step costs the same at step 10 and
step 10,000. The Run holds what the whole run shares: ``spec.principal`` (stamped at admission,
immutable), ``spec.mode``, ``spec.scope`` and ``spec.manifestRef`` (immutable), and in
``status`` the lock (``activeRequest``) and conditions.

The inline journal of Reversi 0.1 (``spec.steps``, ``spec.snapshots``, ``spec.resolutions``, and
per-step undo state in ``status.undo``) is still read: the operator moves such steps into
RunSteps and records how many in ``status.movedSteps``; from then on the RunSteps are the record
and the inline lists, which admit no change, are ignored. The CRD enforces with
CEL that an inline step never changes (tool, args, dependsOn, snapshot, recordedAt; outcome only
from intended), that indices are 0..n-1 and dependencies name earlier steps; the admission
webhook refuses any new inline step.

A step with no undo state is ``standing`` (when its outcome is not ``failed``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from .common import (
    MAX_CONDITIONS,
    MAX_DEPENDS_ON,
    MAX_ERROR,
    MAX_NAME,
    Name,
    MAX_SNAPSHOT_ID,
    MAX_SNAPSHOTS,
    MAX_RUN_STEPS,
    MAX_STEPS,
    MAX_TOOLS,
    Condition,
    CrdInfo,
    JSONObject,
    ObjectRef,
    ReversiModel,
    StatusModel,
    ToolName,
    age_column,
    ready_column,
    immutable,
    list_map,
    rule,
)
from .toolmanifest import TOOL_RULES, ToolSpec

Outcome = Literal["intended", "succeeded", "failed", "uncertain"]
Mode = Literal["enforce", "observe"]
Recovery = Literal["required", "bestEffort"]
UndoState = Literal["compensating", "compensated", "compensationFailed"]
VerificationState = Literal["verified", "none", "unverified", "verificationFailed"]

STANDING_OUTCOMES = frozenset({"succeeded", "intended", "uncertain"})
UNKNOWN_OUTCOMES = frozenset({"intended", "uncertain"})
MAX_NOTE = 1024


def _same_optional(field: str) -> str:
    return f"has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field})"


_STEP_TRANSITIONS = (
    ("self.tool == oldSelf.tool", "steps are append-only: a recorded step's tool cannot change"),
    ("self.index == oldSelf.index", "steps are append-only: a recorded step's index cannot change"),
    ("oldSelf.outcome == 'intended' || self.outcome == oldSelf.outcome",
     "an outcome moves only from intended to a final value"),
    (_same_optional("args"), "steps are append-only: a recorded step's args cannot change"),
    (_same_optional("dependsOn"), "steps are append-only: a recorded step's dependsOn cannot change"),
    (_same_optional("snapshot"), "steps are append-only: a recorded step's snapshot cannot change"),
    (_same_optional("recordedAt"), "steps are append-only: a recorded step's recordedAt cannot change"),
    (f"oldSelf.outcome == 'intended' || ({_same_optional('result')})",
     "a step's result may only be set while its outcome is intended"),
    (f"oldSelf.outcome == 'intended' || ({_same_optional('error')})",
     "a step's error may only be set while its outcome is intended"),
)


class StepBase(ReversiModel):
    """The fields of one recorded call, shared by a RunStep's spec and the engine's :class:`Step`."""

    index: int = Field(
        ge=0, le=MAX_RUN_STEPS - 1, description="Position of the step in the run: 0, 1, 2, ... in order."
    )
    tool: ToolName = Field(description="Tool that was called.")
    args: JSONObject = Field(default_factory=dict, description="Arguments of the call (any JSON object).")
    result: JSONObject | None = Field(default=None, description="Result of the call (any JSON object), when known.")
    outcome: Outcome = Field(
        description="intended: recorded before the call, never confirmed; succeeded; failed; uncertain: effect unknown."
    )
    depends_on: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list,
        max_length=MAX_DEPENDS_ON,
        description="Indices of earlier steps this step depends on (in addition to the manifest's requires).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    snapshot: ToolSpec | None = Field(
        default=None,
        description="The tool's manifest entry, copied when the step was recorded; absent: unmanifested "
                    "(observe mode).",
    )
    error: str | None = Field(default=None, max_length=MAX_ERROR, description="Error of the call, when it failed.")
    recorded_at: datetime | None = Field(default=None, description="When the step was recorded.")

    @staticmethod
    def transition_rules() -> list[dict[str, Any]]:
        """The CEL rules that keep a recorded call append-only (the call never changes; the
        outcome moves only from intended; result and error only while intended) and its
        dependencies on earlier steps only."""
        return [
            rule(
                "!has(self.dependsOn) || self.dependsOn.all(d, d < self.index)",
                "dependsOn may only name earlier steps (indices below this step's index)",
                fieldPath=".dependsOn",
            ),
            *(rule(expr, message) for expr, message in _STEP_TRANSITIONS),
        ]

    @property
    def standing(self) -> bool:
        """Whether the step's effect may exist (outcome succeeded, intended or uncertain)."""
        return self.outcome in STANDING_OUTCOMES


class Step(StepBase):
    """One recorded call of the automation, as the engine sees it (and as the inline journal of
    Reversi 0.1 stored it in ``Run.spec.steps``)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                *StepBase.transition_rules(),
                rule(
                    _same_optional("snapshotId"), "steps are append-only: a recorded step's snapshotId cannot change"
                ),
                rule(
                    "!has(self.snapshot) || !has(self.snapshotId)",
                    "a step carries its snapshot inline or names one in spec.snapshots (snapshotId), not both",
                ),
            ]
        }
    )

    snapshot_id: str | None = Field(
        default=None,
        max_length=MAX_SNAPSHOT_ID,
        pattern=r"^[a-z0-9]+$",
        description="Instead of an inline snapshot: the id of an entry of spec.snapshots (inline journal only).",
    )

    @model_validator(mode="after")
    def _one_snapshot(self) -> Step:
        if self.snapshot is not None and self.snapshot_id is not None:
            raise ValueError(
                f"step {self.index}: set snapshot or snapshotId, not both (snapshotId names an entry of spec.snapshots)"
            )
        return self


class ToolSnapshot(ToolSpec):
    """A manifest entry copied into the run once, named by ``id``; steps refer to it with ``snapshotId``."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [*TOOL_RULES, rule("self == oldSelf", "a snapshot cannot be changed")]
        }
    )

    id: str = Field(
        min_length=1,
        max_length=MAX_SNAPSHOT_ID,
        pattern=r"^[a-z0-9]+$",
        description="Id of the snapshot (reversi.engine.keys.snapshot_id: a hash of the entry).",
    )


class Resolution(ReversiModel):
    """A person's settlement of an intended or uncertain step (rule 7 of docs/concepts.md#rollback-rules)."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [rule("self == oldSelf", "a resolution cannot be changed")]}
    )

    step: int = Field(ge=0, le=MAX_STEPS - 1, description="Index of the step being settled.")
    status: Literal["succeeded", "failed"] = Field(description="What the call really did.")
    result: JSONObject | None = Field(
        default=None, description="The call's real result; without it, $result templates cannot be resolved."
    )
    note: str = Field(min_length=1, max_length=MAX_NOTE, description="Why this is known, for the record.")
    actor: str | None = Field(
        default=None, max_length=MAX_NAME * 2,
        description="Who settled it (stamped at admission from the authenticated user)."
    )
    resolved_at: datetime | None = Field(default=None, description="When it was settled.")


class Acknowledgement(ReversiModel):
    """A person's acceptance of what the Run's rollbacks could not undo (what stands, the
    residue): the Run counts as settled for alerts and GitOps health; its report stays incomplete. Set with
    ``kubectl reversi acknowledge``; needs the RBAC verb ``acknowledge`` on runs. See
    docs/concepts.md#acknowledging-residue."""

    note: str = Field(min_length=1, max_length=MAX_NOTE,
                      description="What was done about the residue (told whom, refunded by hand, ...).")
    actor: str | None = Field(default=None, max_length=MAX_NAME * 2,
                              description="Who acknowledged (stamped at admission from the authenticated user).")
    acknowledged_at: datetime | None = Field(default=None, description="When (stamped at admission).")
    request: str | None = Field(
        default=None, max_length=MAX_NAME,
        description="The RollbackRequest whose residue is accepted (stamped at admission: the run's "
                    "status.standing.request then). A later rollback that leaves a step standing that was not before "
                    "is not covered: acknowledge again after it; one that undid nothing, or only undid more, is.")


#: the longest retention a Run (or a namespace, or the chart) can ask for in seconds: ten years;
#: ``keep: Forever`` keeps a Run for good (docs/concepts.md#retention)
MAX_RETENTION_SECONDS = 315_360_000


class Retention(ReversiModel):
    """How long the Run is kept once nothing about it is unfinished (docs/concepts.md#retention):
    ``ttlSeconds`` after its last activity, or ``keep: Forever``. Set neither to follow the
    namespace's annotation ``reversi.dev/retention-ttl-seconds`` or the operator's default."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                rule("has(self.ttlSeconds) != has(self.keep)",
                     "spec.retention takes exactly one of ttlSeconds (seconds after the run's last activity) and "
                     "keep: Forever"),
            ]
        }
    )

    ttl_seconds: int | None = Field(
        default=None, ge=1, le=MAX_RETENTION_SECONDS,
        description="Delete the Run (with its steps) this many seconds after its last activity, once nothing about "
                    "it is unfinished. At most 315360000 (ten years); use keep: Forever for longer.")
    keep: Literal["Forever"] | None = Field(
        default=None, description="Forever: retention never deletes this Run (delete it yourself when done).")

    @model_validator(mode="after")
    def _one_of(self) -> Retention:
        if (self.ttl_seconds is None) == (self.keep is None):
            raise ValueError("spec.retention takes exactly one of ttlSeconds (seconds after the run's last activity) "
                             "and keep: Forever")
        return self


class RunScope(ReversiModel):
    """Who and where the run acts for; halts match on it. Immutable."""

    actor: str | None = Field(default=None, max_length=MAX_NAME,
                              description="The automation acting, e.g. checkout-agent.")
    tenant: str | None = Field(default=None, max_length=MAX_NAME, description="Tenant the run acts for.")
    environment: str | None = Field(default=None, max_length=MAX_NAME, description="Environment, e.g. prod.")


#: the deepest nesting of runs: a run with 8 ancestors (depth 9) is refused (docs/concepts.md#nested-runs)
MAX_RUN_DEPTH = 8
#: runs below one root run (the whole tree but the root): more are refused at admission
MAX_TREE_RUNS = 64
#: label of a child Run naming its parent (stamped at admission), and of every run of a tree naming its root
LABEL_PARENT = "reversi.dev/parent"
LABEL_ROOT = "reversi.dev/root"
#: label of a Run with ``spec.record`` (stamped at admission; its value the ServiceAccount's name, or ``long``
#: past a label value's 63 characters): the recording webhook watches only the Runs that carry it
LABEL_RECORD = "reversi.dev/record"


class ParentRef(ReversiModel):
    """The run this run is a child of (docs/concepts.md#nested-runs): same namespace, immutable.

    ``step`` is stamped at admission from the server: the parent's step count when the child was
    created (the parent step index at which it was opened); a client's value is overwritten. A
    rollback of the parent undoes the child as one unit, after the parent's steps from ``step`` on
    and before the parent's earlier steps."""

    name: Name = Field(description="Name of the parent Run, in the same namespace.")
    step: int | None = Field(
        default=None, ge=0, le=MAX_RUN_STEPS,
        description="The parent's step count when this run was created (stamped at admission; a client's value is "
                    "ignored): the child is rolled back after the parent's steps from this index on.",
    )


#: namespaces one Run may record writes in (``spec.record.namespaces``): the recording webhook's match
#: condition names each, so the set stays small (docs/concepts.md#recording-with-no-agent-code)
MAX_RECORD_NAMESPACES = 16
#: a namespace name (DNS label)
Namespace = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]


class RunRecord(ReversiModel):
    """Whose writes the run records with no code of theirs (docs/concepts.md#recording-with-no-agent-code):
    the writes of ``serviceAccount`` (of the Run's namespace) to namespaced objects of ``namespaces``, sent by
    the API server to admission while the run is open. Immutable."""

    service_account: Name = Field(description="ServiceAccount of the Run's namespace whose writes are recorded. "
                                              "Whoever creates the Run must be that ServiceAccount, or may create "
                                              "tokens for it (act as it).")
    namespaces: list[Namespace] = Field(
        default_factory=list, max_length=MAX_RECORD_NAMESPACES,
        description=f"Namespaces whose objects' writes are recorded (at most {MAX_RECORD_NAMESPACES}); empty: the "
                    "Run's own.",
        json_schema_extra={"x-kubernetes-list-type": "set"})

    def username(self, namespace: str) -> str:
        """The authenticated user name of the recorded ServiceAccount of a Run in ``namespace``."""
        return f"system:serviceaccount:{namespace}:{self.service_account}"

    def recorded_namespaces(self, namespace: str) -> list[str]:
        """``namespaces``, or ``[namespace]`` (the Run's own) when empty."""
        return list(self.namespaces) or [namespace]


class PinnedManifest(ReversiModel):
    """The run's ToolManifest as it stood when the run was opened (stamped at admission): the
    entries that the run's steps are undone by when they carry no snapshot of their own
    (docs/concepts.md#the-journal). A manifest edit applies to runs opened after it."""

    revision: int = Field(ge=0, description="The ToolManifest's metadata.generation at open.")
    tools: list[ToolSpec] = Field(default_factory=list, max_length=MAX_TOOLS,
                                  description="Its tool entries at that revision.")

    def tool(self, name: str) -> ToolSpec | None:
        """The entry for ``name``, or None when the pinned manifest has none."""
        return next((t for t in self.tools if t.name == name), None)


class RunSpec(ReversiModel):
    """The journal: who runs, in what mode and scope, against which manifest, and its steps."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                rule(
                    "!has(oldSelf.principal) || (has(self.principal) && self.principal == oldSelf.principal)",
                    "spec.principal is immutable once set",
                    fieldPath=".principal",
                ),
                rule(_same_optional("scope"), "spec.scope is immutable", fieldPath=".scope"),
                rule(_same_optional("record"), "spec.record is immutable: open a new Run to record another "
                     "ServiceAccount or other namespaces", fieldPath=".record"),
                rule(_same_optional("parentRef"), "spec.parentRef is immutable: a run's parent is set when it is "
                     "created and never changes (open a new Run under another parent)", fieldPath=".parentRef"),
                rule(
                    "!has(oldSelf.steps) || (has(self.steps) && size(self.steps) >= size(oldSelf.steps))",
                    "steps are append-only: recorded steps cannot be removed",
                    fieldPath=".steps",
                ),
                rule(
                    "!has(self.steps) || self.steps.all(s, s.index < size(self.steps))",
                    "step indices must be 0, 1, 2, ... (an index is at least the number of steps)",
                    fieldPath=".steps",
                ),
                rule(
                    "!has(oldSelf.snapshots) || (has(self.snapshots) && size(self.snapshots) >= "
                    "size(oldSelf.snapshots))",
                    "snapshots cannot be removed",
                    fieldPath=".snapshots",
                ),
                rule(
                    "!has(oldSelf.resolutions) || (has(self.resolutions) && size(self.resolutions) >= "
                    "size(oldSelf.resolutions))",
                    "resolutions cannot be removed",
                    fieldPath=".resolutions",
                ),
            ]
        }
    )

    principal: str | None = Field(
        default=None,
        max_length=MAX_NAME * 2,
        description="User that created the run (stamped at admission); only it may add steps. Immutable once set.",
    )
    mode: Mode = Field(
        default="enforce",
        description="enforce: calls need a manifest entry; observe: calls with none are admitted (unmanifested). "
                    "Immutable.",
        json_schema_extra={"x-kubernetes-validations": [immutable("spec.mode")]},
    )
    recovery: Recovery = Field(
        default="bestEffort",
        description="required: a new step whose tool cannot be undone (irreversible, no compensation, or no manifest "
        "entry) is refused before the call is made; bestEffort (the default): any call is admitted and the "
        "report says what could not be undone. Immutable.",
        json_schema_extra={"x-kubernetes-validations": [immutable("spec.recovery")]},
    )
    scope: RunScope = Field(default_factory=RunScope, description="actor, tenant, environment. Immutable.")
    parent_ref: ParentRef | None = Field(
        default=None,
        description="The parent Run (same namespace; immutable): rolling back the parent rolls this run back as one "
                    "unit, in the order it was opened. No cycles; at most 8 deep; at most 64 runs below one root.",
    )
    manifest_ref: ObjectRef = Field(
        description="The ToolManifest (same namespace) the steps' snapshots come from. Immutable.",
        json_schema_extra={"x-kubernetes-validations": [immutable("spec.manifestRef")]},
    )
    pinned_manifest: PinnedManifest | None = Field(
        default=None,
        description="The ToolManifest as it was when the run was opened (stamped at admission; a client's value is "
                    "replaced, and it never changes): a step with no snapshot of its own is undone by its entry here.",
    )
    steps: list[Step] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        description="Inline journal of Reversi 0.1 (read on create, moved into RunSteps by the operator); new steps "
                    "are RunSteps.",
        json_schema_extra=list_map("index"),
    )
    snapshots: list[ToolSnapshot] = Field(
        default_factory=list,
        max_length=MAX_SNAPSHOTS,
        description="Inline journal of Reversi 0.1: manifest entries named by inline steps (snapshotId); moved with "
                    "the steps.",
        json_schema_extra=list_map("id"),
    )
    resolutions: list[Resolution] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        description="Inline journal of Reversi 0.1: settlements of inline steps; a RunStep carries its own "
                    "spec.resolution.",
        json_schema_extra=list_map("step"),
    )
    record: RunRecord | None = Field(
        default=None,
        description="Record a ServiceAccount's own writes to Kubernetes objects while the run is open, with no code "
                    "of the agent's (docs/concepts.md#recording-with-no-agent-code): each becomes a step of the "
                    "built-in kube family. Needs a pinned manifest with that family. Immutable.")
    retention: Retention | None = Field(
        default=None,
        description="How long retention keeps this Run after its last activity (ttlSeconds), or keep: Forever; unset: "
                    "the namespace's reversi.dev/retention-ttl-seconds annotation, else the operator's default. A Run "
                    "is never deleted while a rollback works on it or waits, or while residue nobody acknowledged "
                    "stands.")
    acknowledgement: Acknowledgement | None = Field(
        default=None,
        description="What the run's rollbacks left standing, accepted by a person (kubectl reversi acknowledge): the "
                    "run is Ready again and no longer counts as incomplete; its report still says what stands.")

    def snapshot_of(self, step: Step) -> ToolSpec | None:
        """The manifest entry of ``step``: inline, or the ``spec.snapshots`` entry it names
        (``None`` when unmanifested or when the id is not there; the engine refuses the latter)."""
        if step.snapshot is not None or step.snapshot_id is None:
            return step.snapshot
        for entry in self.snapshots:
            if entry.id == step.snapshot_id:
                return entry
        return None

    @model_validator(mode="after")
    def _unique_resolutions(self) -> RunSpec:
        seen: set[int] = set()
        for res in self.resolutions:
            if res.step in seen:
                raise ValueError(f"step {res.step} has two resolutions; keep one")
            seen.add(res.step)
        return self


class StepUndo(StatusModel):
    """Undo state of one step, kept so it outlives any one request (rules 3 and 6)."""

    step: int = Field(ge=0, description="Index of the step.")
    state: UndoState = Field(description="compensating (Job about to run or running), compensated or "
                                         "compensationFailed.")
    attempts: int = Field(default=0, ge=0, description="Compensation attempts so far.")
    idempotency_key: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="Compensation idempotency key: the same on every retry and re-run."
    )
    last_error: str | None = Field(default=None, description="Error of the last failed attempt.")
    verification: VerificationState | None = Field(
        default=None,
        description="verified, none (no read-back declared: compensated, complete), unverified (a declared read-back "
                    "did not run) or verificationFailed.",
    )
    request: str | None = Field(default=None, description="RollbackRequest that last worked on the step.")
    updated_at: datetime | None = Field(default=None, description="When this entry last changed.")
    verified_by: str | None = Field(
        default=None,
        description="A later RollbackRequest that ran the declared read-back of this unverified undo "
        "(re-verify: no compensator ran again); the result is in verification.",
    )
    verified_at: datetime | None = Field(default=None, description="When that read-back gave its result.")
    effect_unknown: bool | None = Field(
        default=None,
        description="Set on a failed undo whose effect nobody knows: its last compensator that ran gave no answer of "
        "its own (killed by its deadline, evicted, OOM-killed, lost with its node), or its last read-back failed or "
        "could not be made. A report lists such a step as residue unknown rather than failed.",
    )


StandingState = Literal["failed", "unverified"]
#: (tool, state) pairs kept in ``status.standing.tools``; beyond them the steps are counted under
#: :data:`OTHER_TOOLS`
MAX_STANDING_TOOLS = 32
#: steps listed in ``status.standing.steps`` (failed first, then unverified, by index); the counts cover all
MAX_STANDING_STEPS = 20
#: the ``tool`` of ``status.standing.tools`` that counts the steps of tools beyond :data:`MAX_STANDING_TOOLS`
OTHER_TOOLS = "(other tools)"


class StandingTool(StatusModel):
    """How many steps of one tool stand in one state."""

    tool: str = Field(max_length=MAX_NAME, description="The tool of the original call.")
    state: StandingState = Field(description="failed: the undo failed (its effect may remain, or nobody knows); "
                                             "unverified: undone but not checked.")
    steps: int = Field(ge=0, description="Steps of this tool in this state.")


class StandingStep(StatusModel):
    """One step whose undo stands failed or unverified."""

    step: int = Field(ge=0, description="Index of the step.")
    tool: str = Field(max_length=MAX_NAME, description="The tool of the original call.")
    state: StandingState = Field(description="failed or unverified.")
    request: str | None = Field(default=None, max_length=MAX_NAME,
                                description="The RollbackRequest that last worked on its undo (compensation or "
                                            "read-back).")


class Standing(StatusModel):
    """What the run's rollbacks left standing (docs/concepts.md#what-stands): the steps whose undo
    failed or is unverified, as the journal says, counted by tool and state, and the request whose
    rollback left them. Written by the operator when a rollback ends that changed what stands; a
    request that undid nothing (cancelled before it acted, a dry run, denied, or one that never
    took the run's lock) leaves it as it was. The metrics, the Run's conditions and
    ``kubectl reversi describe`` all read it."""

    request: str | None = Field(
        default=None, max_length=MAX_NAME,
        description="The RollbackRequest whose rollback left what stands now: the last one that left a step standing "
                    "that was not before (or gave the run its first verdict). An acknowledgement names it.")
    failed: int = Field(default=0, ge=0, description="Steps whose undo failed (residue failed or unknown).")
    unverified: int = Field(default=0, ge=0, description="Steps undone but not checked (residue unknown).")
    tools: list[StandingTool] = Field(
        default_factory=list, max_length=MAX_STANDING_TOOLS + 2,
        description=f"The standing steps by tool and state (at most {MAX_STANDING_TOOLS} pairs; the rest counted "
                    f"under tool {OTHER_TOOLS!r}): what reversi_standing_undos exports.")
    steps: list[StandingStep] = Field(
        default_factory=list, max_length=MAX_STANDING_STEPS,
        description=f"The first {MAX_STANDING_STEPS} standing steps, failed first, then unverified, by index.")
    acknowledged_by: str | None = Field(
        default=None, max_length=MAX_NAME * 2,
        description="Who accepted what stands now (the actor of the run's acknowledgement while it counts); absent "
                    "when no acknowledgement covers it.")
    updated_at: datetime | None = Field(default=None, description="When a rollback last changed it.")


class RunStatus(StatusModel):
    """Observed state of a Run: the per-step undo state and the request holding the run."""

    observed_generation: int | None = Field(default=None, ge=0, description="metadata.generation last processed.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="RolledBack, Locked; Ready (True when no rollback holds the run and its last rollback, if any, "
        "is complete), Reconciling (True while a rollback holds it), Stalled (True when its last rollback is "
        "incomplete).",
        json_schema_extra=list_map("type"),
    )
    active_request: str | None = Field(
        default=None,
        description="RollbackRequest currently working on the run (a lock: one request works at a time).",
    )
    last_request: str | None = Field(
        default=None, max_length=MAX_NAME,
        description="The RollbackRequest that last took the run's lock (set with the lock, kept after it ends). What "
                    "stands, and the request an acknowledgement names, are in standing.")
    closed_by: str | None = Field(
        default=None,
        description="RollbackRequest that closed the run (set with the lock, never cleared): from then on no new step "
                    "is admitted; resolutions still are.",
    )
    standing: Standing | None = Field(
        default=None,
        description="What the run's rollbacks left standing: the undos that failed or are unverified, by tool and "
                    "state, and the request that left them (absent before the first rollback).")
    moved_steps: int | None = Field(
        default=None, ge=0,
        description="Steps of the inline journal of Reversi 0.1 moved into RunSteps; when it equals their number, the "
                    "RunSteps are the record.",
    )
    undo: list[StepUndo] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        description="Inline journal of Reversi 0.1: undo state of inline steps (moved to each RunStep's status.undo).",
        json_schema_extra=list_map("step"),
    )

    def undo_by_step(self) -> dict[int, StepUndo]:
        """``status.undo`` as a dict keyed by step index."""
        return {entry.step: entry for entry in self.undo}


class Run(ReversiModel):
    """A whole Run object (apiVersion, kind, metadata, spec, status)."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["reversi.dev/v1alpha1"] = Field(default="reversi.dev/v1alpha1", description="API version.")
    kind: Literal["Run"] = Field(default="Run", description="Kind.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Object metadata.")
    spec: RunSpec = Field(description="The journal.")
    status: RunStatus | None = Field(default=None, description="Observed state.")


CRD = CrdInfo(
    kind="Run",
    plural="runs",
    singular="run",
    short_names=["rvrun"],
    description="One automation's run: its principal, mode, scope and manifest, and the lock of its rollback; its "
                "steps are RunSteps.",
    spec_model=RunSpec,
    status_model=RunStatus,
    printer_columns=[
        {"name": "Principal", "type": "string", "jsonPath": ".spec.principal"},
        {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
        {"name": "Scope", "type": "string", "jsonPath": ".spec.scope.actor", "description": "The acting automation."},
        {"name": "Rollback", "type": "string", "jsonPath": ".status.activeRequest",
         "description": "The RollbackRequest working on the run now."},
        {"name": "Closed-By", "type": "string", "jsonPath": ".status.closedBy",
         "description": "The RollbackRequest that closed the run (it stays after the rollback ends)."},
        {"name": "Acknowledged-By", "type": "string", "jsonPath": ".status.standing.acknowledgedBy",
         "description": "Who accepted what its rollbacks left standing (kubectl reversi acknowledge), while that "
                        "acknowledgement covers it."},
        ready_column(),
        age_column(),
    ],
)
