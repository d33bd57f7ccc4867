"""The archived record of a Run (docs/operations.md#the-archive): what is written to PostgreSQL
before retention deletes the Run. Pure builders over the objects as dicts: no database, no
client.

A :class:`Record` holds the Run, its RunSteps and the RollbackRequests that named it, whole (as
the API server returned them: ``kubectl reversi archive show`` prints them as ``describe`` and
``export`` did), plus the columns a person searches by (name, principal, tool, time) and "who
did what": one :class:`Action` per recorded call, resolution, rollback request, approval,
denial, forced step, cancellation and acknowledgement, each with the actor the server stamped.

A Run deleted by a person is archived too (docs/operations.md#a-run-deleted-by-hand): while the
archive is on, each Run carries the finalizer :data:`FINALIZER`, which the operator removes only
after the Run's record committed. :func:`finalizer_step` is that controller's decision.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .retention import parse_time

#: the finalizer that keeps a Run deleted by hand until its record is in the archive
FINALIZER = "reversi.dev/archive"
#: ``deleted_reason`` of a Run retention deleted (its TTL passed)
EXPIRED = "expired"
#: ``deleted_reason`` of a Run a person (or a namespace's deletion) deleted
DELETED = "deleted"

#: what :func:`finalizer_step` returns
NOTHING = "Nothing"
ADD = "AddFinalizer"
REMOVE = "RemoveFinalizer"
ARCHIVE = "ArchiveThenRemove"


@dataclass(frozen=True)
class Action:
    """One thing a person or an agent did to the run: ``action`` (``recorded``, ``resolved``,
    ``requested``, ``approved``, ``denied``, ``forced``, ``cancelled``, ``acknowledged``), who
    (``actor``, as the server stamped it), when, and the step, request and note it concerns."""

    action: str
    actor: str | None
    at: dt.datetime | None
    step: int | None = None
    request: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class Record:
    """A Run's archived record: the objects whole, and what the archive's columns hold."""

    run: Mapping[str, Any]
    steps: Sequence[Mapping[str, Any]]
    requests: Sequence[Mapping[str, Any]]
    reason: str
    last_activity: dt.datetime | None
    actions: Sequence[Action] = field(default_factory=tuple)

    @property
    def uid(self) -> str:
        return str((self.run.get("metadata") or {}).get("uid") or "")

    @property
    def namespace(self) -> str:
        return str((self.run.get("metadata") or {}).get("namespace") or "")

    @property
    def name(self) -> str:
        return str((self.run.get("metadata") or {}).get("name") or "")

    def columns(self) -> dict[str, Any]:
        """The run's searchable columns (table ``reversi_runs``)."""
        meta, spec = self.run.get("metadata") or {}, self.run.get("spec") or {}
        scope = spec.get("scope") or {}
        return {"uid": self.uid, "namespace": self.namespace, "name": self.name, "principal": spec.get("principal"),
                "actor": scope.get("actor"), "tenant": scope.get("tenant"), "environment": scope.get("environment"),
                "parent": (spec.get("parentRef") or {}).get("name"),
                "created_at": parse_time(meta.get("creationTimestamp")), "last_activity": self.last_activity,
                "deleted_reason": self.reason, "steps": len(self.steps)}


def step_columns(step: Mapping[str, Any]) -> dict[str, Any]:
    """A RunStep's searchable columns (table ``reversi_steps``)."""
    spec = step.get("spec") or {}
    return {"index": int(spec.get("index", 0)), "tool": str(spec.get("tool") or ""), "outcome": spec.get("outcome"),
            "principal": spec.get("principal"), "recorded_at": parse_time(spec.get("recordedAt"))}


def request_columns(request: Mapping[str, Any]) -> dict[str, Any]:
    """A RollbackRequest's searchable columns (table ``reversi_requests``)."""
    meta, status = request.get("metadata") or {}, request.get("status") or {}
    return {"uid": str(meta.get("uid") or ""), "name": str(meta.get("name") or ""), "phase": status.get("phase"),
            "created_at": parse_time(meta.get("creationTimestamp")),
            "completed_at": parse_time(status.get("completionTime"))}


def actions(run: Mapping[str, Any], steps: Iterable[Mapping[str, Any]],
            requests: Iterable[Mapping[str, Any]]) -> list[Action]:
    """Who did what to the run, in time order: each step recorded (its principal), each
    resolution, each RollbackRequest (its approvals, denials, forced steps and cancellation:
    each with the actor admission stamped), and the acknowledgement of its residue."""
    found: list[Action] = []
    for step in steps:
        spec = step.get("spec") or {}
        index = spec.get("index")
        found.append(Action("recorded", spec.get("principal"), parse_time(spec.get("recordedAt")), index,
                            note=spec.get("tool")))
        res = spec.get("resolution")
        if isinstance(res, Mapping):
            found.append(Action("resolved", res.get("actor"), parse_time(res.get("resolvedAt")), index,
                                note=f"{res.get('status')}: {res.get('note')}"))
    for request in requests:
        found += _request_actions(request)
    ack = (run.get("spec") or {}).get("acknowledgement")
    if isinstance(ack, Mapping):
        found.append(Action("acknowledged", ack.get("actor"), parse_time(ack.get("acknowledgedAt")),
                            request=ack.get("request"), note=ack.get("note")))
    never = dt.datetime.min.replace(tzinfo=dt.UTC)
    return sorted(found, key=lambda a: (a.at or never, a.action, a.step if a.step is not None else -1))


def _request_actions(request: Mapping[str, Any]) -> list[Action]:
    meta, spec = request.get("metadata") or {}, request.get("spec") or {}
    name = meta.get("name")
    created = parse_time(meta.get("creationTimestamp"))
    kind = "dry run" if spec.get("dryRun") else "rollback"
    # the API server does not record who created an object: a request's creator is not known
    out = [Action("requested", None, created, request=name, note=kind)]
    for item in spec.get("approvals") or []:
        out.append(Action("approved", item.get("approver"), parse_time(item.get("approvedAt")), item.get("step"), name))
    if spec.get("approveCompensations"):
        out.append(Action("approved", spec.get("approvedBy"), created, request=name, note="every step"))
    for item in spec.get("denials") or []:
        out.append(Action("denied", item.get("actor"), parse_time(item.get("deniedAt")), item.get("step"), name,
                          item.get("note")))
    for item in spec.get("force") or []:
        out.append(Action("forced", item.get("actor"), parse_time(item.get("forcedAt")), item.get("step"), name))
    if spec.get("cancel"):
        out.append(Action("cancelled", spec.get("cancelledBy"), None, request=name))
    return out


def record(run: Mapping[str, Any], steps: Sequence[Mapping[str, Any]], requests: Sequence[Mapping[str, Any]],
           reason: str, last_activity: dt.datetime | None) -> Record:
    """The Run's record (steps by index), with who did what (:func:`actions`)."""
    ordered = sorted(steps, key=lambda s: (s.get("spec") or {}).get("index", 0))
    mine = sorted(requests, key=lambda r: ((r.get("metadata") or {}).get("creationTimestamp") or "",
                                           (r.get("metadata") or {}).get("name") or ""))
    return Record(run, tuple(ordered), tuple(mine), reason, last_activity, tuple(actions(run, ordered, mine)))


def finalizer_step(*, archive_on: bool, deleting: bool, finalizers: Sequence[str]) -> str:
    """What the operator does with one Run's :data:`FINALIZER` (docs/operations.md#a-run-deleted-by-hand):

    - archive on, the Run not being deleted, no finalizer: :data:`ADD` it;
    - archive on, the Run being deleted, the finalizer on it: :data:`ARCHIVE` (write the record,
      and remove the finalizer only after the write committed);
    - archive off, the finalizer on the Run (left from when it was on): :data:`REMOVE` it at once,
      being deleted or not: turning the archive off never leaves a Run undeletable;
    - else :data:`NOTHING` (a Run being deleted without the finalizer is no longer the
      operator's to keep; other finalizers are never touched).

    Retention removes the finalizer itself after its own write committed, just before its delete
    (:meth:`reversi.handlers.archive.Archiver.release`), so a Run it archived is never written twice.
    """
    held = FINALIZER in finalizers
    if not archive_on:
        return REMOVE if held else NOTHING
    if deleting:
        return ARCHIVE if held else NOTHING
    return NOTHING if held else ADD


def without_finalizer(finalizers: Sequence[str]) -> list[str]:
    """``finalizers`` without :data:`FINALIZER`, the others in their order."""
    return [f for f in finalizers if f != FINALIZER]


def with_finalizer(finalizers: Sequence[str]) -> list[str]:
    """``finalizers`` with :data:`FINALIZER` added last (once)."""
    return [*without_finalizer(finalizers), FINALIZER]


def failure_message(reason: str, kind: str, error: str) -> str:
    """What the Run's ``Archived=False`` condition and its ``ArchiveFailed`` Event say when its
    record (``reason``: :data:`EXPIRED` or :data:`DELETED`) could not be written: the error's
    ``kind`` and text, and why the Run is still there."""
    if reason == DELETED:
        return (f"not deleted yet: its record could not be written to the archive ({kind}): {error}; the finalizer "
                f"{FINALIZER} keeps the Run until the write succeeds, tried again with backoff")
    return (f"not deleted: its record could not be written to the archive ({kind}): {error}; "
            "retention tries again with backoff")
