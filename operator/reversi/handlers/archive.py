"""The archive before deletion (docs/operations.md#the-archive): retention writes an expired Run's
record to PostgreSQL and deletes the Run only after the write committed.

:class:`Archiver` is what :class:`reversi.handlers.retention.Retention` calls before each delete.
It reads the Run whole (one GET), its RunSteps (one GET each, by name: ``<run>-<index>`` for the
indices retention counted, then one more GET that must find nothing, so a step recorded since is
never left out) and the RollbackRequests naming the run (from the informer's index, one GET
each), builds the record (:func:`reversi.engine.archive.record`) and writes it
(:meth:`reversi.adapters.archive.Archive.write`: one transaction keyed by the Run's uid).

When the write fails (the database is down, refuses the password, its disk is full) nothing is
deleted: the Run gets the condition ``Archived=False`` (reason ``ArchiveFailed``, the error
without the connection string), a Warning Event ``ArchiveFailed`` and a count in
``reversi_archive_failures_total{reason}``, and the pass raises so the work queue retries it
with backoff (1 s doubling to 5 minutes). No record is ever lost: the Run stays until its record
is in.

A Run deleted by a person is written by the same :class:`Archiver` (:meth:`Archiver.deleted`,
reason ``deleted``), called by :class:`reversi.handlers.finalizer.ArchiveFinalizer` while the
Run's finalizer ``reversi.dev/archive`` keeps it (docs/operations.md#a-run-deleted-by-hand).
Retention takes that finalizer off itself after its write committed, just before its delete
(:meth:`Archiver.release`), so the Run it archived is not written a second time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import conditions as cond
from ..adapters import journal as jr
from ..adapters.archive import Archive, ArchiveError
from ..adapters.kube import Conflict, Kube
from ..engine import archive as records
from ..engine import retention as rules
from ..models.common import MAX_RUN_STEPS

log = logging.getLogger("reversi.archive")

#: seconds a Run retention took the finalizer off stays without it (its delete follows at once;
#: the finalizer controller does not put the finalizer back meanwhile)
RELEASE_HOLD_SECONDS = 60.0
#: Event reason on a Run written to the archive before a person's delete let it go
RUN_ARCHIVED = "RunArchived"


class RunChanged(Exception):
    """The Run or its journal changed while its record was read: decide again."""


class Archiver:
    """Writes an expired Run's record before retention deletes it (module docstring).
    ``requests_of(namespace, run)``: the names of the RollbackRequests naming the run."""

    def __init__(self, kube: Kube, archive: Archive, requests_of: Callable[[str, str], list[str]], metrics: Any = None):
        self.kube = kube
        self.archive = archive
        self.requests_of = requests_of
        self.metrics = metrics
        self._migrated = False
        self._lock = threading.Lock()
        self._released: dict[str, float] = {}  # uid -> when retention took the finalizer off (monotonic)

    def __call__(self, facts: rules.RunFacts, steps: rules.StepActivity) -> None:
        """Write an expired Run's record (applying the archive's migrations first, once); raises
        :class:`ArchiveError` (after saying so on the Run) or :class:`RunChanged` when nothing
        may be deleted."""
        self.write(self.read(facts, steps), facts)

    def deleted(self, facts: rules.RunFacts, steps: rules.StepActivity) -> dict:
        """Write the record of a Run a person deleted (``facts.deleting``; reason ``deleted``);
        returns the Run as read for it (its ``resourceVersion`` and finalizers: the finalizer is
        removed from that version only). A step missing from the count is left out, not waited
        for: the garbage collector (a foreground delete) or the namespace controller (the
        namespace's deletion) deletes steps before the Run, and nothing brings them back. Raises
        :class:`ArchiveError` (after saying so on the Run) or :class:`RunChanged`."""
        record = self.read(facts, steps, records.DELETED, partial=True)
        if len(record.steps) < steps.count:
            log.warning("Run %s/%s: %d of its %d steps were deleted before it (a foreground delete or its namespace's "
                        "deletion); its record holds the %d still there", facts.namespace, facts.name,
                        steps.count - len(record.steps), steps.count, len(record.steps))
        self.write(record, facts)
        return dict(record.run)

    def write(self, record: records.Record, facts: rules.RunFacts) -> None:
        """Write ``record`` (the migrations first, once); raises :class:`ArchiveError` after saying
        so on the Run (:meth:`_failed`)."""
        try:
            if not self._migrated:
                applied = self.archive.migrate()
                if applied:
                    log.info("the archive's schema is at version %d (applied now: %s)", applied[-1], applied)
                self._migrated = True
            writes = self.archive.write(record)
        except ArchiveError as err:
            self._failed(facts, dict(record.run), err, record.reason)
            raise
        if writes > 1:
            log.info("Run %s/%s archived again (written %d times in all: the same row, replaced)", facts.namespace,
                     facts.name, writes)
        if self.metrics is not None:
            self.metrics.run_archived(facts.namespace)
        if record.reason == records.DELETED:
            self.kube.event(_ref(dict(record.run)), RUN_ARCHIVED,
                            f"written to the archive before its deletion: {len(record.steps)} steps, "
                            f"{len(record.requests)} RollbackRequests")

    def release(self, facts: rules.RunFacts) -> str:
        """Take the finalizer ``reversi.dev/archive`` off a Run whose record retention has just
        committed, from the version retention decided on; returns the resourceVersion its delete
        must name. For :data:`RELEASE_HOLD_SECONDS` the finalizer controller does not put the
        finalizer back (:meth:`held_back`). Raises :class:`Conflict` when the Run changed since."""
        if records.FINALIZER not in facts.finalizers:
            return facts.resource_version
        with self._lock:
            self._released[facts.uid] = time.monotonic()
        written = self.kube.merge(jr.RUNS, facts.namespace, facts.name, {"metadata": {
            "resourceVersion": facts.resource_version, "finalizers": records.without_finalizer(facts.finalizers)}})
        return str((written.get("metadata") or {}).get("resourceVersion") or facts.resource_version)

    def held_back(self, uid: str) -> float:
        """Seconds during which the finalizer is not put back on the Run with ``uid`` (retention
        took it off for its delete: :meth:`release`); 0.0 when none."""
        now = time.monotonic()
        with self._lock:
            for key in [k for k, at in self._released.items() if now - at >= RELEASE_HOLD_SECONDS]:
                del self._released[key]
            at = self._released.get(uid)
        return 0.0 if at is None else RELEASE_HOLD_SECONDS - (now - at)

    def read(self, facts: rules.RunFacts, steps: rules.StepActivity, reason: str = records.EXPIRED, *,
             partial: bool = False) -> records.Record:
        """The Run's record as the API server holds it now (``reason``: ``expired`` or ``deleted``).
        Raises :class:`RunChanged` when the Run is gone or was replaced, or when more steps exist
        than were counted; a step missing from the count is one too, unless ``partial`` (the
        garbage collector is deleting the steps: the record holds those still there)."""
        ns, name = facts.namespace, facts.name
        run = self.kube.get(jr.RUNS, ns, name)
        if run is None or (run.get("metadata") or {}).get("uid") != facts.uid:
            raise RunChanged(f"Run {ns}/{name} is gone or was replaced")
        objs = []
        for index in range(steps.count):
            obj = self.kube.get(jr.STEPS, ns, jr.step_name(name, index))
            if obj is None and not partial:
                raise RunChanged(f"Run {ns}/{name}: step {index} is missing")
            if obj is not None:
                objs.append(obj)
        if steps.count < MAX_RUN_STEPS and self.kube.get(jr.STEPS, ns, jr.step_name(name, steps.count)):
            raise RunChanged(f"Run {ns}/{name}: a step was recorded since its steps were counted")
        requests = [r for r in (self.kube.get("rollbackrequests", ns, n) for n in self.requests_of(ns, name))
                    if r is not None and ((r.get("spec") or {}).get("runRef") or {}).get("name") == name]
        last = max((t for t in (facts.activity, steps.newest_at) if t is not None), default=None)
        return records.record(run, objs, requests, reason, last)

    def _failed(self, facts: rules.RunFacts, run: dict, err: ArchiveError, reason: str) -> None:
        message = records.failure_message(reason, err.kind, err.message)
        log.warning("Run %s/%s %s", facts.namespace, facts.name, message)
        if self.metrics is not None:
            self.metrics.archive_failed(facts.namespace, err.kind)
        self.kube.event(_ref(run), cond.ARCHIVE_FAILED, message, warning=True)
        status = run.get("status") or {}
        conditions = cond.set_condition(status.get("conditions"), cond.condition(
            cond.ARCHIVED, cond.FALSE, cond.ARCHIVE_FAILED, message, (run.get("metadata") or {}).get("generation")))
        try:
            self.kube.merge_status(jr.RUNS, facts.namespace, facts.name, {"conditions": conditions},
                                   resource_version=run["metadata"].get("resourceVersion"))
        except Conflict:
            pass  # changed since: the next attempt says it again
        except Exception as err2:  # noqa: BLE001 - the Event and the metric have said it already
            log.warning("Run %s/%s: the Archived condition was not written: %s", facts.namespace, facts.name, err2)


def _ref(run: dict) -> dict:
    meta = run.get("metadata") or {}
    return {"apiVersion": f"{jr.GROUP}/{jr.VERSION}", "kind": "Run",
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")}}
