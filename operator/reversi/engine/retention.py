"""Retention: when a Run may be deleted with its steps (docs/concepts.md#retention).

A policy is a function from the Run's facts to a verdict (cert-manager's ``policies.Chain``
shape): :func:`decide` takes what the controller read (the Run's facts, the setting that applies,
the RollbackRequests that name the run, the newest step's activity, the runs above and below
it) and returns one :class:`Verdict`: keep, with a CamelCase reason and, when the keeping ends
by itself, the moment it ends; or expire. The rules, in the order they are checked:

1. a Run being deleted is left to the API server (``BeingDeleted``);
2. a setting that cannot be read keeps the Run (``InvalidRetention``): a typo in a namespace's
   annotation never deletes earlier than meant;
3. ``keep: Forever`` (on the Run, the namespace or the default) keeps it (``KeptForever``);
4. a child run is deleted only after its parent (``ParentRunExists``): a parent's rollback
   undoes its children as units (docs/concepts.md#nested-runs);
5. a request waiting for an approval (``AwaitingApproval``), a request holding the run's lock
   (``RollbackInProgress``) or waiting for it or for the run (``RollbackPending``) keeps it;
6. residue of the last rollback that no person acknowledged keeps it (``ResidueStanding``,
   :func:`~reversi.engine.acknowledgement.incomplete`);
7. a run below it that is kept keeps it (``RunBelowKept``): the tree goes as a whole;
8. the run's own last activity (creation, a rollback taking or releasing its lock, an
   acknowledgement) less than the TTL ago keeps it (``NotExpired``, until then);
9. then the newest step's last write (recorded, outcome, resolution, undo state) less than the
   TTL ago keeps it (``Recording``, until then): an agent still recording. The controller reads
   the newest step only when rules 1-8 would let the run go (:attr:`Verdict.read_steps`);
10. otherwise the run expires (``Expired``).

Pure: no clock (``now`` is passed in), no client, no kopf. Times are aware ``datetime`` in UTC.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import acknowledgement, kube_review
from . import standing as sd

# --------------------------------------------------------------------------------- reasons
BEING_DELETED = "BeingDeleted"
INVALID_RETENTION = "InvalidRetention"
KEPT_FOREVER = "KeptForever"
PARENT_RUN_EXISTS = "ParentRunExists"
AWAITING_APPROVAL = "AwaitingApproval"
ROLLBACK_IN_PROGRESS = "RollbackInProgress"
ROLLBACK_PENDING = "RollbackPending"
RESIDUE_STANDING = "ResidueStanding"
RUN_BELOW_KEPT = "RunBelowKept"
NOT_EXPIRED = "NotExpired"
RECORDING = "Recording"
STEPS_UNREAD = "StepsUnread"
EXPIRED = "Expired"
#: every reason a verdict may carry (a closed set: metrics label and Event text use them)
REASONS = frozenset({BEING_DELETED, INVALID_RETENTION, KEPT_FOREVER, PARENT_RUN_EXISTS, AWAITING_APPROVAL,
                     ROLLBACK_IN_PROGRESS, ROLLBACK_PENDING, RESIDUE_STANDING, RUN_BELOW_KEPT, NOT_EXPIRED,
                     RECORDING, STEPS_UNREAD, EXPIRED})

#: the namespace annotation that sets the retention of the namespace's Runs: seconds, or ``Forever``
NAMESPACE_ANNOTATION = "reversi.dev/retention-ttl-seconds"
FOREVER = "Forever"
#: the longest TTL anywhere (ten years, as ``Run.spec.retention.ttlSeconds``)
MAX_TTL_SECONDS = 315_360_000
#: request phases after which a request no longer works on or waits for its run
_FINAL_PHASES = frozenset({"Planned", "Succeeded", "Incomplete", "Failed"})
#: Run conditions whose transitions are activity of the run (a rollback took or released its lock,
#: or ended); the Archived condition retention writes itself is not activity
_ACTIVITY_CONDITIONS = ("Locked", "RolledBack")


# --------------------------------------------------------------------------------- setting

@dataclass(frozen=True)
class Setting:
    """The retention that applies to one Run: ``ttl_seconds`` (None: kept forever), where it
    comes from (``source``: ``spec.retention``, ``namespace``, ``default``) and, when the
    setting cannot be read, ``error`` (the run is then kept)."""

    ttl_seconds: int | None
    source: str
    error: str | None = None

    def text(self) -> str:
        """``ttl 86400 s (namespace annotation)``."""
        where = {"spec.retention": "spec.retention", "namespace": f"namespace annotation {NAMESPACE_ANNOTATION}",
                 "default": "the operator's default"}.get(self.source, self.source)
        what = FOREVER if self.ttl_seconds is None else f"ttl {self.ttl_seconds} s"
        return f"{what} ({where})"


def parse_annotation(value: str) -> tuple[int | None, str | None]:
    """The namespace annotation's value as ``(ttl seconds, None)``, ``(None, None)`` for
    ``Forever``, or ``(None, error)`` when it is neither a whole number of seconds from 1 to
    :data:`MAX_TTL_SECONDS` nor ``Forever`` (the error says what to write)."""
    text = value.strip()
    if text == FOREVER:
        return None, None
    if text.isdigit() and 1 <= int(text) <= MAX_TTL_SECONDS:
        return int(text), None
    return None, (f"namespace annotation {NAMESPACE_ANNOTATION}={value!r} is neither a whole number of seconds from "
                  f"1 to {MAX_TTL_SECONDS} nor {FOREVER}: its Runs are kept until it is fixed")


def setting(run_retention: Mapping[str, Any] | None, namespace_value: str | None,
            default_ttl: int | None) -> Setting:
    """The retention of a Run: its ``spec.retention`` (``{ttlSeconds}`` or ``{keep: Forever}``)
    wins over the namespace's annotation value (``namespace_value``, None when unset), which
    wins over the operator's default (``default_ttl``; None: kept forever)."""
    if isinstance(run_retention, Mapping) and any(run_retention.get(k) is not None for k in ("keep", "ttlSeconds")):
        if run_retention.get("keep") == FOREVER:
            return Setting(None, "spec.retention")
        ttl = run_retention.get("ttlSeconds")
        if isinstance(ttl, int) and not isinstance(ttl, bool) and 1 <= ttl <= MAX_TTL_SECONDS:
            return Setting(ttl, "spec.retention")
        return Setting(None, "spec.retention", f"spec.retention {dict(run_retention)} is not valid: the Run is kept")
    if namespace_value is not None:
        ttl, error = parse_annotation(namespace_value)
        return Setting(ttl, "namespace", error)
    return Setting(default_ttl, "default")


# --------------------------------------------------------------------------------- facts

def parse_time(value: Any) -> dt.datetime | None:
    """A Kubernetes timestamp (``2026-01-01T00:00:00Z``, fractions allowed) as an aware UTC
    ``datetime``; None for anything else."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def run_activity(run: Mapping[str, Any]) -> dt.datetime | None:
    """The Run's own last activity: the latest of its creation, the last transition of its
    ``Locked`` and ``RolledBack`` conditions (a rollback took or released the lock, or ended)
    and its acknowledgement; None when the Run carries none of them (not yet stored)."""
    meta = run.get("metadata") or {}
    times = [parse_time(meta.get("creationTimestamp"))]
    for item in (run.get("status") or {}).get("conditions") or []:
        if isinstance(item, Mapping) and item.get("type") in _ACTIVITY_CONDITIONS:
            times.append(parse_time(item.get("lastTransitionTime")))
    ack = (run.get("spec") or {}).get("acknowledgement")
    if isinstance(ack, Mapping):
        times.append(parse_time(ack.get("acknowledgedAt")))
    found = [t for t in times if t is not None]
    return max(found) if found else None


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What retention needs of one Run (a few hundred bytes, kept per Run in memory):
    its identity, whether it is being deleted, its parent, its ``spec.retention``, the request
    holding its lock, whether residue stands (:func:`~reversi.engine.acknowledgement.incomplete`)
    and its own last activity (:func:`run_activity`)."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    deleting: bool
    parent: str | None
    retention: Mapping[str, Any] | None
    active_request: str | None
    residue: bool
    activity: dt.datetime | None
    #: the undos that stand on the Run (``status.standing``) as ``((tool, state), steps)`` pairs, for
    #: the gauges of what stands (docs/concepts.md#what-stands); empty when none stands
    standing: tuple[tuple[tuple[str, str], int], ...] = ()
    #: whose writes the Run records while it is open, as ``(user, namespaces)``
    #: (:func:`reversi.engine.kube_review.recorded_by`); None when it records none, or is being deleted
    recording: tuple[str, tuple[str, ...]] | None = None
    #: ``metadata.finalizers`` (the archive's own, docs/operations.md#a-run-deleted-by-hand, is the one
    #: the operator reads; empty on almost every Run)
    finalizers: tuple[str, ...] = ()
    #: the RollbackRequest whose residue stands on the Run (:func:`~reversi.engine.acknowledgement.residue_request`)
    residue_request: str | None = None


def facts_of(run: Mapping[str, Any]) -> RunFacts:
    """:class:`RunFacts` of a Run as a dict (what the API server returns)."""
    meta = run.get("metadata") or {}
    spec = run.get("spec") or {}
    status = run.get("status") or {}
    parent = (spec.get("parentRef") or {}).get("name") if isinstance(spec.get("parentRef"), Mapping) else None
    retention = spec.get("retention")
    return RunFacts(
        namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""), uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""), deleting=bool(meta.get("deletionTimestamp")),
        parent=parent if isinstance(parent, str) and parent else None,
        retention=dict(retention) if isinstance(retention, Mapping) else None,
        active_request=status.get("activeRequest") or None, residue=acknowledgement.incomplete(run),
        activity=run_activity(run), standing=tuple(sorted(sd.by_tool(status.get("standing")).items())),
        recording=kube_review.recorded_by(run),
        finalizers=tuple(sys.intern(f) for f in meta.get("finalizers") or [] if isinstance(f, str)),
        residue_request=acknowledgement.residue_request(run))


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """A RollbackRequest that names the run: its name and phase (None: not reconciled yet), and the reason of
    its Ready condition (None: none yet)."""

    name: str
    phase: str | None
    ready_reason: str | None = None


@dataclass(frozen=True, slots=True)
class StepActivity:
    """The run's journal as far as retention reads it: ``count`` steps (indices 0..count-1),
    and the newest step's last write (``newest_at``: the latest of its creation and the times
    of its managed fields) and outcome; ``newest_at`` None when the run has no step."""

    count: int
    newest_at: dt.datetime | None = None
    newest_outcome: str | None = None


# --------------------------------------------------------------------------------- verdict

@dataclass(frozen=True)
class Verdict:
    """What retention does with a Run: ``expire`` it or keep it, with ``reason`` (one of
    :data:`REASONS`) and ``message`` for a person. ``until``: when a kept Run's keeping ends by
    itself (NotExpired, Recording), else None (it ends with an event: a request finishing, an
    acknowledgement). ``read_steps``: rules 1-8 let the Run go; read its newest step and decide
    again (rule 9)."""

    expire: bool
    reason: str
    message: str
    until: dt.datetime | None = None
    read_steps: bool = False

    def seconds_left(self, now: dt.datetime) -> float | None:
        """Seconds from ``now`` until :attr:`until` (0 when passed), or None without one."""
        return None if self.until is None else max((self.until - now).total_seconds(), 0.0)


def _keep(reason: str, message: str, until: dt.datetime | None = None) -> Verdict:
    return Verdict(False, reason, message, until)


def _requests(run: RunFacts, requests: Sequence[RequestFacts]) -> Verdict | None:
    """Rule 5: the requests that keep the run, most specific first."""
    waiting = sorted(r.name for r in requests if r.phase == "AwaitingApproval")
    if waiting:
        return _keep(AWAITING_APPROVAL, f"RollbackRequest {waiting[0]} waits for an approval "
                     f"(kubectl reversi approve {waiting[0]} or deny it)")
    if run.active_request:
        return _keep(ROLLBACK_IN_PROGRESS, f"RollbackRequest {run.active_request} holds the run's lock")
    pending = sorted(r.name for r in requests if r.phase not in _FINAL_PHASES)
    if pending:
        return _keep(ROLLBACK_PENDING,
                     f"RollbackRequest {pending[0]} has not finished (waiting for the run or its lock)")
    return None


def decide(run: RunFacts, applies: Setting, now: dt.datetime, *, requests: Sequence[RequestFacts] = (),
           steps: StepActivity | None = None, parent_exists: bool = False,
           below: Sequence[tuple[str, Verdict]] = ()) -> Verdict:
    """The verdict on ``run`` at ``now`` under the setting that ``applies`` (the rules in the
    module docstring, in order). ``requests``: the RollbackRequests naming the run;
    ``steps``: its newest step's activity, None when not read (then a run that rules 1-8 let go
    gets ``read_steps``); ``parent_exists``: its parent Run exists; ``below``: ``(run name,
    verdict)`` of each run directly below it, decided on their own (without rule 4)."""
    if run.deleting:
        return _keep(BEING_DELETED, "the Run is being deleted")
    if applies.error:
        return _keep(INVALID_RETENTION, applies.error)
    if applies.ttl_seconds is None:
        return _keep(KEPT_FOREVER, f"kept forever: {applies.text()}")
    if parent_exists and run.parent:
        return _keep(PARENT_RUN_EXISTS, f"a child run is deleted after its parent Run {run.parent}")
    found = _requests(run, requests)
    if found is not None:
        return found
    if run.residue:
        return _keep(RESIDUE_STANDING, "its last rollback left residue that no person has acknowledged "
                     "(kubectl reversi acknowledge)")
    kept_below = sorted((name, v) for name, v in below if not v.expire)
    if kept_below:
        name, why = kept_below[0]
        return _keep(RUN_BELOW_KEPT, f"Run {name} below it is kept ({why.reason}: {why.message})", why.until)
    ttl = dt.timedelta(seconds=applies.ttl_seconds)
    if run.activity is None or run.activity + ttl > now:
        until = None if run.activity is None else run.activity + ttl
        return _keep(NOT_EXPIRED, f"last activity of the Run at {_text(run.activity)}; {applies.text()}", until)
    if steps is None:
        return Verdict(False, STEPS_UNREAD, "the Run is due: its newest step is read next", read_steps=True)
    if steps.newest_at is not None and steps.newest_at + ttl > now:
        return _keep(RECORDING, f"step {steps.count - 1} was last written at {_text(steps.newest_at)} "
                     f"({steps.newest_outcome or 'no outcome'}); {applies.text()}", steps.newest_at + ttl)
    last = max(t for t in (run.activity, steps.newest_at) if t is not None)
    return Verdict(True, EXPIRED, f"no activity since {_text(last)}, {applies.text()}; {steps.count} steps")


def _text(moment: dt.datetime | None) -> str:
    return "an unknown time" if moment is None else moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def step_activity(count: int, newest: Mapping[str, Any] | None) -> StepActivity:
    """:class:`StepActivity` from the step count and the newest step's object (whole, or its
    metadata only: ``PartialObjectMetadata``, with ``spec`` missing): its last write is the
    latest of its ``creationTimestamp``, ``spec.recordedAt`` and each ``managedFields`` entry's
    ``time`` (every write: the outcome, a resolution, the undo state in its status)."""
    if count <= 0 or newest is None:
        return StepActivity(max(count, 0))
    meta = newest.get("metadata") or newest
    spec = newest.get("spec") or {}
    times = [parse_time(meta.get("creationTimestamp")), parse_time(spec.get("recordedAt"))]
    times += [parse_time(entry.get("time")) for entry in meta.get("managedFields") or [] if isinstance(entry, Mapping)]
    found = [t for t in times if t is not None]
    outcome = spec.get("outcome")
    return StepActivity(count, max(found) if found else None, outcome if isinstance(outcome, str) else None)
