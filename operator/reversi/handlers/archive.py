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
"""

from __future__ import annotations

import logging
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

    def __call__(self, facts: rules.RunFacts, steps: rules.StepActivity) -> None:
        """Write the Run's record (applying the archive's migrations first, once); raises
        :class:`ArchiveError` (after saying so on the Run) or :class:`RunChanged` when nothing
        may be deleted."""
        record = self.read(facts, steps)
        try:
            if not self._migrated:
                applied = self.archive.migrate()
                if applied:
                    log.info("the archive's schema is at version %d (applied now: %s)", applied[-1], applied)
                self._migrated = True
            writes = self.archive.write(record)
        except ArchiveError as err:
            self._failed(facts, dict(record.run), err)
            raise
        if writes > 1:
            log.info("Run %s/%s archived again (written %d times in all: the same row, replaced)", facts.namespace,
                     facts.name, writes)
        if self.metrics is not None:
            self.metrics.run_archived(facts.namespace)

    def read(self, facts: rules.RunFacts, steps: rules.StepActivity) -> records.Record:
        """The Run's record as the API server holds it now. Raises :class:`RunChanged` when the
        Run is gone or was replaced, or when more steps exist than retention counted."""
        ns, name = facts.namespace, facts.name
        run = self.kube.get(jr.RUNS, ns, name)
        if run is None or (run.get("metadata") or {}).get("uid") != facts.uid:
            raise RunChanged(f"Run {ns}/{name} is gone or was replaced")
        objs = []
        for index in range(steps.count):
            obj = self.kube.get(jr.STEPS, ns, jr.step_name(name, index))
            if obj is None:
                raise RunChanged(f"Run {ns}/{name}: step {index} is missing")
            objs.append(obj)
        if steps.count < MAX_RUN_STEPS and self.kube.get(jr.STEPS, ns, jr.step_name(name, steps.count)):
            raise RunChanged(f"Run {ns}/{name}: a step was recorded since its steps were counted")
        requests = [r for r in (self.kube.get("rollbackrequests", ns, n) for n in self.requests_of(ns, name))
                    if r is not None and ((r.get("spec") or {}).get("runRef") or {}).get("name") == name]
        last = max((t for t in (facts.activity, steps.newest_at) if t is not None), default=None)
        return records.record(run, objs, requests, "expired", last)

    def _failed(self, facts: rules.RunFacts, run: dict, err: ArchiveError) -> None:
        message = (f"not deleted: its record could not be written to the archive ({err.kind}): {err.message}; "
                   "retention tries again with backoff")
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
