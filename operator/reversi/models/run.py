"""Run (namespaced): the journal of one automation's calls (DESIGN §3).

``spec.steps`` is append-only. The CRD enforces with CEL (transition rules):

- ``spec.principal`` is immutable once set; ``spec.mode``, ``spec.scope`` and
  ``spec.manifestRef`` never change;
- the steps list never shrinks; per step (a list-type map keyed by ``index``, so each step is
  compared with the old step of the same index): ``tool``, ``args``, ``dependsOn``,
  ``snapshot`` and ``recordedAt`` never change; ``outcome`` moves only from ``intended`` to a
  final value; ``result`` and ``error`` may be set only while the old outcome is ``intended``;
- indices are below the number of steps (with unique keys: exactly 0..n-1) and every
  ``dependsOn`` entry is below its step's index (so no cycle or dangling reference is admitted);
- resolutions never shrink and a resolution never changes.

Index-equals-position (the order) is checked in Python by ``reversi.engine.graph``.
A step with no entry in ``status.undo`` is ``standing`` (when its outcome is not ``failed``).

Size: a snapshot inline in every step makes a run of 10,000 steps several megabytes, beyond the
apiserver's 3 MiB request limit and etcd's 1.5 MiB default. Long runs should record each distinct
manifest entry once in ``spec.snapshots`` (id = ``reversi.engine.keys.snapshot_id(entry)``) and
name it in ``step.snapshotId``; the engine treats both forms alike.
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
    MAX_SNAPSHOT_ID,
    MAX_SNAPSHOTS,
    MAX_STEPS,
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
UndoState = Literal["compensating", "compensated", "compensationFailed"]
VerificationState = Literal["verified", "unverified", "verificationFailed"]

STANDING_OUTCOMES = frozenset({"succeeded", "intended", "uncertain"})
UNKNOWN_OUTCOMES = frozenset({"intended", "uncertain"})
MAX_NOTE = 1024


def _same_optional(field: str) -> str:
    return f"has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field})"


class Step(ReversiModel):
    """One recorded call of the automation."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                rule(
                    "!has(self.dependsOn) || self.dependsOn.all(d, d < self.index)",
                    "dependsOn may only name earlier steps (indices below this step's index)",
                    fieldPath=".dependsOn",
                ),
                rule("self.tool == oldSelf.tool", "steps are append-only: a recorded step's tool cannot change"),
                rule(
                    "oldSelf.outcome == 'intended' || self.outcome == oldSelf.outcome",
                    "an outcome moves only from intended to a final value",
                ),
                rule(_same_optional("args"), "steps are append-only: a recorded step's args cannot change"),
                rule(_same_optional("dependsOn"), "steps are append-only: a recorded step's dependsOn cannot change"),
                rule(_same_optional("snapshot"), "steps are append-only: a recorded step's snapshot cannot change"),
                rule(
                    _same_optional("snapshotId"), "steps are append-only: a recorded step's snapshotId cannot change"
                ),
                rule(
                    "!has(self.snapshot) || !has(self.snapshotId)",
                    "a step carries its snapshot inline or names one in spec.snapshots (snapshotId), not both",
                ),
                rule(
                    "!has(oldSelf.recordedAt) || (has(self.recordedAt) && self.recordedAt == oldSelf.recordedAt)",
                    "steps are append-only: a recorded step's recordedAt cannot change",
                ),
                rule(
                    f"oldSelf.outcome == 'intended' || ({_same_optional('result')})",
                    "a step's result may only be set while its outcome is intended",
                ),
                rule(
                    f"oldSelf.outcome == 'intended' || ({_same_optional('error')})",
                    "a step's error may only be set while its outcome is intended",
                ),
            ]
        }
    )

    index: int = Field(ge=0, le=MAX_STEPS - 1, description="Position of the step in the run: 0, 1, 2, ... in order.")
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
        description="The tool's manifest entry, copied when the step was recorded; absent: unmanifested (observe mode).",
    )
    snapshot_id: str | None = Field(
        default=None,
        max_length=MAX_SNAPSHOT_ID,
        pattern=r"^[a-z0-9]+$",
        description="Instead of an inline snapshot: the id of an entry of spec.snapshots (one copy per distinct manifest entry keeps long runs small).",
    )
    error: str | None = Field(default=None, max_length=MAX_ERROR, description="Error of the call, when it failed.")
    recorded_at: datetime | None = Field(default=None, description="When the step was recorded.")

    @model_validator(mode="after")
    def _one_snapshot(self) -> "Step":
        if self.snapshot is not None and self.snapshot_id is not None:
            raise ValueError(
                f"step {self.index}: set snapshot or snapshotId, not both (snapshotId names an entry of spec.snapshots)"
            )
        return self

    @property
    def standing(self) -> bool:
        """Whether the step's effect may exist (outcome succeeded, intended or uncertain)."""
        return self.outcome in STANDING_OUTCOMES


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
    """A person's settlement of an intended or uncertain step (DESIGN §4 rule 7)."""

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
        default=None, max_length=MAX_NAME * 2, description="Who settled it (stamped at admission from the authenticated user)."
    )
    resolved_at: datetime | None = Field(default=None, description="When it was settled.")


class RunScope(ReversiModel):
    """Who and where the run acts for; halts match on it. Immutable."""

    actor: str | None = Field(default=None, max_length=MAX_NAME, description="The automation acting, e.g. checkout-agent.")
    tenant: str | None = Field(default=None, max_length=MAX_NAME, description="Tenant the run acts for.")
    environment: str | None = Field(default=None, max_length=MAX_NAME, description="Environment, e.g. prod.")


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
                    "!has(oldSelf.snapshots) || (has(self.snapshots) && size(self.snapshots) >= size(oldSelf.snapshots))",
                    "snapshots cannot be removed",
                    fieldPath=".snapshots",
                ),
                rule(
                    "!has(oldSelf.resolutions) || (has(self.resolutions) && size(self.resolutions) >= size(oldSelf.resolutions))",
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
        description="enforce: calls need a manifest entry; observe: calls with none are admitted (unmanifested). Immutable.",
        json_schema_extra={"x-kubernetes-validations": [immutable("spec.mode")]},
    )
    scope: RunScope = Field(default_factory=RunScope, description="actor, tenant, environment. Immutable.")
    manifest_ref: ObjectRef = Field(
        description="The ToolManifest (same namespace) the steps' snapshots come from. Immutable.",
        json_schema_extra={"x-kubernetes-validations": [immutable("spec.manifestRef")]},
    )
    steps: list[Step] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        description="The recorded calls, append-only, keyed by index.",
        json_schema_extra=list_map("index"),
    )
    snapshots: list[ToolSnapshot] = Field(
        default_factory=list,
        max_length=MAX_SNAPSHOTS,
        description="Manifest entries copied into the run, keyed by id, for steps that name them with snapshotId; never change.",
        json_schema_extra=list_map("id"),
    )
    resolutions: list[Resolution] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        description="Settlements of intended or uncertain steps, keyed by step; a resolution never changes.",
        json_schema_extra=list_map("step"),
    )

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
    def _unique_resolutions(self) -> "RunSpec":
        seen: set[int] = set()
        for res in self.resolutions:
            if res.step in seen:
                raise ValueError(f"step {res.step} has two resolutions; keep one")
            seen.add(res.step)
        return self


class StepUndo(StatusModel):
    """Undo state of one step, kept on the Run so it outlives any one request (DESIGN §4 rules 3, 6)."""

    step: int = Field(ge=0, description="Index of the step.")
    state: UndoState = Field(description="compensating (Job about to run or running), compensated or compensationFailed.")
    attempts: int = Field(default=0, ge=0, description="Compensation attempts so far.")
    idempotency_key: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="Compensation idempotency key: the same on every retry and re-run."
    )
    last_error: str | None = Field(default=None, description="Error of the last failed attempt.")
    verification: VerificationState | None = Field(
        default=None, description="verified, unverified (no check ran) or verificationFailed."
    )
    request: str | None = Field(default=None, description="RollbackRequest that last worked on the step.")
    updated_at: datetime | None = Field(default=None, description="When this entry last changed.")


class RunStatus(StatusModel):
    """Observed state of a Run: the per-step undo state and the request holding the run."""

    observed_generation: int | None = Field(default=None, ge=0, description="metadata.generation last processed.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="RolledBack, Locked; Ready (True when no rollback holds the run and its last rollback, if any, "
        "is complete), Reconciling (True while a rollback holds it), Stalled (True when its last rollback is incomplete).",
        json_schema_extra=list_map("type"),
    )
    active_request: str | None = Field(
        default=None,
        description="RollbackRequest currently working on the run (a lock: one request works at a time).",
    )
    undo: list[StepUndo] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        description="Undo state of the steps a rollback touched; a step with no entry is standing.",
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
    description="The journal of one automation's calls (steps), append-only, with the undo state of each step.",
    spec_model=RunSpec,
    status_model=RunStatus,
    printer_columns=[
        {"name": "Principal", "type": "string", "jsonPath": ".spec.principal"},
        {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
        {
            "name": "Last Step",
            "type": "integer",
            "jsonPath": ".spec.steps[-1:].index",
            "description": "Index of the newest step (steps = last step + 1).",
        },
        {"name": "Rollback", "type": "string", "jsonPath": ".status.activeRequest", "priority": 1},
        ready_column(),
        age_column(),
    ],
)
