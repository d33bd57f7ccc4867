"""The archived record of a Run (docs/operations.md#the-archive): what is written to PostgreSQL
before retention deletes the Run. Pure builders over the objects as dicts: no database, no
client.

A :class:`Record` holds the Run, its RunSteps and the RollbackRequests that named it, whole (as
the API server returned them: ``kubectl reversi archive show`` prints them as ``describe`` and
``export`` did), plus the columns a person searches by (name, principal, tool, time) and "who
did what": one :class:`Action` per recorded call, resolution, rollback request, approval,
denial, forced step, cancellation and acknowledgement, each with the actor the server stamped.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .retention import parse_time


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
