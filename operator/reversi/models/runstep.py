"""RunStep (namespaced): one recorded call of a Run, stored as an object of its own
(docs/concepts.md#the-journal).

The journal is sliced the way EndpointSlices slice Endpoints: the Run is the run's identity
(principal, mode, scope, manifestRef, lock, summary) and every step is a small RunStep whose
validation and storage cost does not depend on the run's length. Recording step 10 and step
10,000 cost the same: one create of a small object, then one patch of it.

- **Name** ``<run>-<index>`` with the index zero-padded to five digits (``order-4711-00042``):
  creating a name that exists fails, so two writers never get the same index (the optimistic
  concurrency of the journal), and ``kubectl get runsteps`` lists a run's steps in order.
- **Labels** ``reversi.dev/run: <run>`` (list a run's steps: ``kubectl get runsteps -l
  reversi.dev/run=order-4711``) and, for a tool with a forward idempotency key,
  ``reversi.dev/forward-key: <hash>`` (stamped at admission; finds an earlier call with the same
  key without reading the run).
- **Owner** the Run (stamped at admission): deleting the Run deletes its steps.
- **spec** the call (``index``, ``tool``, ``args``, ``result``, ``outcome``, ``dependsOn``,
  ``snapshot``, ``error``, ``recordedAt``), who recorded it (``principal``, stamped at admission:
  the API server's own policy lets only this user write the outcome) and, once, its
  ``resolution``; CEL rules keep it
  append-only: the call never changes, ``outcome`` moves only from ``intended`` to a final value,
  ``result``/``error`` only while intended, a resolution is set once and never changes.
- **status.undo** the step's undo state, which outlives any one RollbackRequest (rules 3, 6).

Limits (refused at admission by name, never an etcd or request-size error): at most
:data:`MAX_RUN_STEPS` steps per run (indices 0..99,999) and :data:`MAX_CALL_BYTES` bytes of JSON
for a step's ``args`` and for its ``result``.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field

from .common import (
    MAX_NAME,
    MAX_RUN_STEPS,
    CrdInfo,
    Name,
    JSONObject,
    ObjectRef,
    ReversiModel,
    StatusModel,
    age_column,
    immutable,
    rule,
)
from .run import MAX_NOTE, MAX_RUN_DEPTH, Mode, Recovery, Resolution, RunScope, Step, StepBase, StepUndo

#: Digits of the zero-padded index in a RunStep's name (enough for MAX_RUN_STEPS - 1).
INDEX_DIGITS = 5
#: Longest JSON text (UTF-8 bytes) of a step's ``args`` and of its ``result`` (64 KiB each).
MAX_CALL_BYTES = 64 * 1024
#: Longest Run name that can have RunSteps: the name is a label value (at most 63 characters).
MAX_RUN_NAME = 63

LABEL_RUN = "reversi.dev/run"
LABEL_FORWARD_KEY = "reversi.dev/forward-key"


def step_name(run: str, index: int) -> str:
    """The RunStep name of step ``index`` of Run ``run``: ``<run>-<index, 5 digits>``.

    Raises ``ValueError`` for an index outside 0..MAX_RUN_STEPS-1.
    """
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_RUN_STEPS:
        raise ValueError(f"step index {index!r} is outside 0..{MAX_RUN_STEPS - 1}")
    return f"{run}-{index:0{INDEX_DIGITS}d}"


def forward_key_label(tool: str, key: str) -> str:
    """The ``reversi.dev/forward-key`` label value of a call of ``tool`` with forward key ``key``:
    40 lowercase hex characters (sha256 of tool and key; a label value holds at most 63)."""
    return hashlib.sha256(f"{tool}\x00{key}".encode()).hexdigest()[:40]


class StepResolution(ReversiModel):
    """A person's settlement of this step when its outcome is intended or uncertain (rule 7)."""

    status: Literal["succeeded", "failed"] = Field(description="What the call really did.")
    result: JSONObject | None = Field(
        default=None, description="The call's real result; without it, $result templates cannot be resolved."
    )
    note: str = Field(min_length=1, max_length=MAX_NOTE, description="Why this is known, for the record.")
    actor: str | None = Field(
        default=None, max_length=MAX_NAME * 2,
        description="Who settled it (stamped at admission from the authenticated user).",
    )
    resolved_at: datetime | None = Field(default=None, description="When it was settled (stamped at admission).")

    def for_step(self, index: int) -> Resolution:
        """The same settlement as the engine's :class:`~reversi.models.run.Resolution` of step ``index``."""
        return Resolution.model_construct(step=index, status=self.status, result=self.result, note=self.note,
                                          actor=self.actor, resolved_at=self.resolved_at)


class AncestorAtOpen(ReversiModel):
    """An ancestor of a child run, as its recorder read it at open (nested runs): its halts' scope."""

    name: Name = Field(description="The ancestor Run's name (same namespace).")
    scope: RunScope = Field(default_factory=RunScope, description="Its spec.scope.")


class RunAtOpen(ReversiModel):
    """What the recorder read of the step's Run when it opened it, copied into every step so the
    API server's policies can check the step without reading the Run (halt scopes, the lock), and
    the operator checks the copy against the Run before it acts on the step
    (docs/concepts.md#admission). Immutable."""

    uid: str = Field(min_length=1, max_length=64, description="The Run's metadata.uid (the step's owner).")
    principal: str | None = Field(
        default=None, max_length=MAX_NAME * 2,
        description="The Run's spec.principal: the API server refuses the step from anyone else (rule 10).")
    mode: Mode = Field(default="enforce", description="The Run's spec.mode.")
    recovery: Recovery = Field(default="bestEffort", description="The Run's spec.recovery.")
    manifest_revision: int | None = Field(
        default=None, ge=0, description="The revision of the Run's pinned manifest (spec.pinnedManifest.revision).")
    scope: RunScope = Field(default_factory=RunScope, description="The Run's spec.scope.")
    ancestors: list[AncestorAtOpen] = Field(
        default_factory=list, max_length=MAX_RUN_DEPTH,
        description="For a child run: its ancestors from the parent up, with their scopes.")
    recorded_at_admission: bool | None = Field(
        default=None,
        description="True on a step the recording webhook recorded (a Run's spec.record): its states are the API "
                    "server's own (oldObject), not a client's word. Only the admission server's user may set it "
                    "(docs/concepts.md#recording-with-no-agent-code).")


class RunStepSpec(StepBase):
    """One recorded call: the step (append-only) and, once, its resolution."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                *StepBase.transition_rules(),
                rule(
                    "!has(self.runAtOpen) || !has(self.runAtOpen.recordedAtAdmission) || "
                    "(!has(self.snapshot) && !has(self.recordedAt))",
                    "spec.runAtOpen.recordedAtAdmission is set only by the recording webhook, on a step with no "
                    "snapshot and no recordedAt",
                    fieldPath=".runAtOpen.recordedAtAdmission",
                ),
                rule(
                    "!has(oldSelf.resolution) || (has(self.resolution) && self.resolution == oldSelf.resolution)",
                    "a resolution is part of the record: once set it never changes",
                    fieldPath=".resolution",
                ),
                rule(
                    "!has(oldSelf.principal) || (has(self.principal) && self.principal == oldSelf.principal)",
                    "spec.principal is stamped when the step is recorded and never changes",
                    fieldPath=".principal",
                ),
                rule(
                    "has(self.runAtOpen) == has(oldSelf.runAtOpen)",
                    "spec.runAtOpen is written when the step is recorded and never added or removed",
                    fieldPath=".runAtOpen",
                ),
                rule(
                    "!has(self.resolution) || has(oldSelf.resolution) || oldSelf.outcome in ['intended', 'uncertain']",
                    "only a step whose outcome is intended or uncertain can be resolved",
                    fieldPath=".resolution",
                ),
            ]
        }
    )

    run_ref: ObjectRef = Field(
        description="The Run (same namespace) this step belongs to. Immutable.",
        json_schema_extra={"x-kubernetes-validations": [immutable("spec.runRef")]},
    )
    resolution: StepResolution | None = Field(
        default=None, description="Settlement of an intended or uncertain step; set once, never changed."
    )
    run_at_open: RunAtOpen | None = Field(
        default=None,
        description="What the recorder read of the Run at open (uid, mode, recovery, manifest revision, scope, "
                    "ancestors): the API server's policies check the step against it and the operator checks it "
                    "against the Run. Steps recorded without it cross the admission webhook. Immutable.",
        json_schema_extra={"x-kubernetes-validations": [immutable("spec.runAtOpen")]},
    )
    principal: str | None = Field(
        default=None, max_length=MAX_NAME * 2,
        description="Who recorded the step: the Run's principal, stamped at admission from the authenticated user "
                    "(a client's value is replaced). Only this user writes the step's outcome. Immutable.",
    )

    def as_step(self) -> Step:
        """The engine's view of the call (a :class:`~reversi.models.run.Step`, unvalidated copy)."""
        return Step.model_construct(
            index=self.index, tool=self.tool, args=self.args, result=self.result, outcome=self.outcome,
            depends_on=self.depends_on, snapshot=self.snapshot, snapshot_id=None, error=self.error,
            recorded_at=self.recorded_at)


class RunStepStatus(StatusModel):
    """Undo state of the step, kept on the step so it outlives any one request (rules 3, 6)."""

    undo: StepUndo | None = Field(default=None, description="Absent: the step was never touched by a rollback.")


class RunStep(ReversiModel):
    """A whole RunStep object (apiVersion, kind, metadata, spec, status)."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["reversi.dev/v1alpha1"] = Field(default="reversi.dev/v1alpha1", description="API version.")
    kind: Literal["RunStep"] = Field(default="RunStep", description="Kind.")
    metadata: dict = Field(default_factory=dict, description="Object metadata.")
    spec: RunStepSpec = Field(description="The call.")
    status: RunStepStatus | None = Field(default=None, description="Undo state.")


CRD = CrdInfo(
    kind="RunStep",
    plural="runsteps",
    singular="runstep",
    short_names=["rvstep"],
    description="One recorded call of a Run (its journal is sliced into one RunStep per step), append-only, with its "
                "undo state.",
    spec_model=RunStepSpec,
    status_model=RunStepStatus,
    reconciled=False,
    printer_columns=[
        {"name": "Run", "type": "string", "jsonPath": ".spec.runRef.name"},
        {"name": "Index", "type": "integer", "jsonPath": ".spec.index"},
        {"name": "Tool", "type": "string", "jsonPath": ".spec.tool"},
        {"name": "Outcome", "type": "string", "jsonPath": ".spec.outcome"},
        {"name": "Resolved", "type": "string", "jsonPath": ".spec.resolution.status"},
        {"name": "Undo", "type": "string", "jsonPath": ".status.undo.state"},
        {"name": "Verification", "type": "string", "jsonPath": ".status.undo.verification", "priority": 1},
        age_column(),
    ],
)
