"""Shared model pieces: base configuration, bounded string types, Condition, ObjectRef, Backoff.

Wire names are camelCase (``manifestRef``), Python names snake_case (``manifest_ref``); both are
accepted on input. ``to_wire()`` gives the dict to send to the API (camelCase, no ``None``).

Spec models forbid unknown fields (a typo is an error, not a silent default); status models
ignore them (the API may carry fields a newer operator wrote, or kopf's own bookkeeping).

Schema extras that the CRD generator (``reversi.crdgen``) copies into the OpenAPI schema are set
with ``json_schema_extra``: ``x-kubernetes-validations`` (CEL), ``x-kubernetes-list-type``,
``x-kubernetes-list-map-keys``. Every string that a CEL rule touches has a ``maxLength`` and every
list a ``maxItems``, so the apiserver's cost estimate stays within its budget.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

# Bounds shared by the kinds (the CRD schema carries them as maxLength / maxItems).
MAX_NAME = 253  # a Kubernetes object name, a tool name
MAX_LABEL = 63  # a DNS label: runner names
MAX_TEXT = 4096  # notes, reasons, residue lines
MAX_ERROR = 512  # an error message kept in a step (CEL compares it: keep the cost down)
MAX_STEPS = 20000  # steps of the inline journal of Reversi 0.1 (Run.spec.steps; migrated to RunSteps)
MAX_RUN_STEPS = 100_000  # steps in a run (RunSteps, indices 0..99,999): the documented limit
MAX_DEPENDS_ON = 32  # explicit dependencies of one step (CEL walks them: keep the cost down)
MAX_REQUIRES = 32  # tools one tool requires
MAX_RESIDUE = 16  # residue lines of one compensation or tool
MAX_TOOLS = 256  # tools in one manifest
MAX_RUNNERS = 32  # runners in one manifest
MAX_CONDITIONS = 16
MAX_SNAPSHOTS = 256  # distinct manifest entries copied into one run (spec.snapshots)
MAX_SNAPSHOT_ID = 16  # length of a snapshot id

#: a Kubernetes object name (DNS subdomain: lowercase letters, digits, '-' and '.')
Name = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME,
          pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"),
]
ToolName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$"),
]
RunnerName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_LABEL, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
]
Text = Annotated[str, Field(max_length=MAX_TEXT)]
ResidueLine = Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
JSONObject = dict[str, Any]

PRESERVE = {"x-kubernetes-preserve-unknown-fields": True}

#: Version of the CRD schemas these models generate, carried by every CRD in the annotation
#: :data:`SCHEMA_VERSION_ANNOTATION`. Raise it whenever a generated CRD changes (a unit test
#: compares the CRDs with the digest recorded for this version). The operator refuses to
#: reconcile against older CRDs: the API server would prune the status fields it writes.
#: 1: before the annotation existed. 2: Ready/Reconciling/Stalled, status defaults (kstatus).
#: 3: the sliced journal (RunSteps; Run.status.movedSteps; object names in references are DNS names),
#:    closed runs (Run.status.closedBy, RollbackRequest.status.runSteps), Run.spec.recovery, denials,
#:    requireVerification, per-request attempts and re-verify fields.
#: 4: RollbackRequest.status.steps[].lostReads (read-backs that gave no answer); Run's Closed-By column.
#: 5: RunStep.spec.principal (who recorded the step; the outcome write is checked in the API server).
#: 6: Run.spec.acknowledgement and Run.status.lastRequest (acknowledging residue); the Run's Acknowledged-By column.
#: 7: effectUnknown on RunStep.status.undo, Run.status.undo[] and RollbackRequest.status.steps[] (a failed undo
#:    whose effect nobody knows: residue unknown, not failed).
#: 8: Run.status.standing (the undos a run's rollbacks left failed or unverified, by tool and state); the Run's
#:    Acknowledged-By column reads status.standing.acknowledgedBy.
#: 9: Run.spec.retention (ttlSeconds or keep: Forever: how long retention keeps the Run).
#: 10: the recorded call at the API server's floor: Run.spec.pinnedManifest (the ToolManifest pinned at open);
#:    RunStep.spec.runAtOpen (the recorder's copy of its Run: uid, principal, mode, recovery, manifest revision,
#:    scope, ancestors; immutable, never added or removed); a step's recordedAt can no more be added than changed;
#:    RollbackRequest.status.report.foreign (steps not part of the run's record, with the rule each broke) and
#:    report.missing (indices no step has).
#: 11: ClosedRunSlice (the lock policy's params: the runs a rollback has closed, sliced by a hash of the run's
#:     name), in place of the ConfigMap reversi-closed-runs.
#: 12: Run.spec.record (a ServiceAccount whose own writes the run records at admission, and its namespaces);
#:     RunStep.spec.runAtOpen.recordedAtAdmission (the recording webhook's own mark).
SCHEMA_VERSION = 12
SCHEMA_VERSION_ANNOTATION = "reversi.dev/schema-version"


def rule(expr: str, message: str, **extra: Any) -> dict[str, Any]:
    """One CEL validation rule for ``x-kubernetes-validations`` (``rule``, ``message`` and e.g.
    ``fieldPath``/``reason``)."""
    out: dict[str, Any] = {"rule": expr, "message": message}
    out.update(extra)
    return out


def immutable(what: str) -> dict[str, Any]:
    """A transition rule on the field itself: it may not change once set (``self == oldSelf``)."""
    return rule("self == oldSelf", f"{what} is immutable")


def list_map(*keys: str) -> dict[str, Any]:
    """``json_schema_extra`` for a list keyed by ``keys`` (server-side merge, unique keys)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


class ReversiModel(BaseModel):
    """Base of every spec model: camelCase on the wire, snake_case in Python, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        str_strip_whitespace=False,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as the API wants it: camelCase keys, ``None`` fields left out, JSON types."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class StatusModel(ReversiModel):
    """Base of status models: like :class:`ReversiModel` but unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")


class Condition(StatusModel):
    """One status condition in the Kubernetes API conventions; types and reasons are the closed
    set in ``reversi.conditions``."""

    type: str = Field(
        min_length=1, max_length=316, description="Kind of condition, e.g. Complete or Compensated."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="CamelCase reason for the last transition, from a fixed list.",
    )
    message: str = Field(
        default="", max_length=32768, description="What happened, for a person, and what to do."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was set for."
    )
    last_transition_time: datetime = Field(
        description="When the status last changed from one value to another."
    )


class ObjectRef(ReversiModel):
    """A reference to an object in the same namespace, by name."""

    name: Name = Field(description="Name of the object, in the same namespace.")


class Backoff(ReversiModel):
    """Exponential backoff with jitter between retries: base delay doubling up to a maximum."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                rule("self.maxMs >= self.baseMs", "backoff.maxMs must be at least backoff.baseMs")
            ]
        }
    )

    base_ms: int = Field(
        default=200, ge=1, le=3_600_000, description="Delay before the first retry, in milliseconds."
    )
    max_ms: int = Field(
        default=5000, ge=1, le=3_600_000, description="Longest delay between retries, in milliseconds."
    )

    @model_validator(mode="after")
    def _max_not_below_base(self) -> Backoff:
        if self.max_ms < self.base_ms:
            raise ValueError(f"backoff.maxMs ({self.max_ms}) must be at least backoff.baseMs ({self.base_ms})")
        return self


class CrdInfo(BaseModel):
    """How a kind is published as a CRD: names, scope, printer columns and root-level rules.

    Each model module defines one ``CRD`` constant of this type; ``reversi.crdgen`` reads them.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    GROUP: ClassVar[str] = "reversi.dev"
    VERSION: ClassVar[str] = "v1alpha1"

    kind: str
    plural: str
    singular: str
    short_names: list[str]
    scope: Literal["Namespaced", "Cluster"] = "Namespaced"
    description: str
    spec_model: Any
    status_model: Any
    spec_required: bool = True
    #: whether the operator reconciles the kind and reports Ready/Reconciling/Stalled (kstatus);
    #: a record such as a RunStep is not reconciled: it is Current as soon as it exists
    reconciled: bool = True
    printer_columns: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def crd_name(self) -> str:
        """``<plural>.reversi.dev``."""
        return f"{self.plural}.{self.GROUP}"


def ready_column() -> dict[str, Any]:
    """The Ready printer column: the status of the ``Ready`` condition (kstatus conventions)."""
    return {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'}


def age_column() -> dict[str, Any]:
    """The usual Age printer column."""
    return {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
