"""Thin kopf handlers for RollbackRequests and their Jobs, and what a Run's event wakes (from the
operator's informer of Runs: :func:`run_seen`): they queue reconcile passes.

The work happens in :mod:`reversi.handlers.reconciler`, driven by :mod:`reversi.handlers.workers`.
"""

from __future__ import annotations

import logging
from concurrent.futures import Executor
from typing import Any

import kopf

from ..adapters import journal as jr
from ..adapters import status as st
from ..adapters.jobs import ANNOTATION_REQUEST, LABEL_MANAGED_BY, LABEL_ROLE
from ..models.rollbackrequest import TERMINAL_PHASES, run_ref_name
from . import indices as ix
from . import runtime

log = logging.getLogger("reversi.rollback")


@kopf.on.event("reversi.dev", "v1alpha1", "rollbackrequests")
def rollback_request_event(type: str, body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo,
                           **kwargs: Any) -> None:
    """Start a worker for an unfinished request (also on operator start: kopf lists them all)."""
    assert namespace is not None  # RollbackRequests are namespaced
    parts = runtime.parts(memo)
    ix.capture(parts, kwargs)
    if parts.metrics is not None:  # every replica: a new leader's series are already right
        parts.metrics.request_observed(namespace, name, None if type == "DELETED" else dict(body))
    reconciler, workers, _ = parts.operating()
    if type == "DELETED":
        workers.stop(namespace, name)
        if parts.reconciling():  # deleted mid-way: release the Run, settle what its Jobs did (rule 14)
            run_name = run_ref_name(body)
            try:
                reconciler.request_deleted(namespace, name, run_name)
            except Exception as err:  # noqa: BLE001 - the next request, or the Job's event, settles it
                log.warning("RollbackRequest %s/%s deleted: Run %s not settled now: %s", namespace, name, run_name, err)
        return
    if not parts.reconciling():
        return
    status = body.get("status") or {}
    if status.get("phase") in TERMINAL_PHASES:
        # a final request does no more work, but a spec change is still observed (kstatus)
        update = st.observed_update(status, body["metadata"].get("generation"))
        if update is not None:
            parts.kube.merge_status("rollbackrequests", namespace, name, update)
        return
    workers.ensure(namespace, name)


#: the project's Jobs by (namespace, run uid): kopf's index over the same watch as the handler below
run_jobs = kopf.index("batch", "v1", "jobs", labels={LABEL_MANAGED_BY: "reversi"})(ix.run_jobs)


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_MANAGED_BY: "reversi"})
def rollback_job_event(body: kopf.Body, namespace: str | None, memo: kopf.Memo, type: str = "",
                       **kwargs: Any) -> None:
    """A compensator or reader Job finished or was deleted: wake its request's worker at once (a
    Job that only started, or whose pod changed, does not: nothing in a pass would change, and
    the pass of a request's Jobs runs one at a time). A compensator that finished after its
    request was deleted is settled here (the Job is the Run's)."""
    assert namespace is not None  # Jobs are namespaced
    parts = runtime.parts(memo)
    ix.capture(parts, kwargs)
    finished = any(cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True"
                   for cond in (body.get("status") or {}).get("conditions") or [])
    request = (body.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_REQUEST)
    if request and (finished or type in (None, "DELETED")):  # None: listed when the watch (re)starts
        parts.operating().workers.ensure(namespace, request)
    labels = body.get("metadata", {}).get("labels") or {}
    if finished and labels.get(LABEL_ROLE) == "compensator" and type != "DELETED" and parts.reconciling():
        parts.operating().reconciler.job_finished(namespace, dict(body))


def run_seen(parts: runtime.Parts, type: str, body: dict, slow: Executor) -> None:
    """A Run was created, changed or deleted (an event of the operator's informer of Runs,
    :func:`reversi.handlers.runs.observer`): wake the requests waiting for it to exist, and those
    waiting for its lock once ``status.activeRequest`` is empty (no polling).
    A Run recorded by Reversi 0.1 carries its steps inline: move them into RunSteps at once (on
    ``slow``), so every reader and writer sees one layout (idempotent; a request does it too
    before it plans)."""
    if parts.operating_parts is None:
        return
    reconciler, workers, _ = parts.operating()
    meta = body["metadata"]
    if type != "DELETED":  # a request may wait for this Run to be created (phase Pending, RunNotFound)
        for request in reconciler.waiting_for(meta.get("namespace", ""), meta.get("name", "")):
            workers.ensure(meta["namespace"], request)
    if type == "DELETED" or not (body.get("status") or {}).get("activeRequest"):
        # the lock is free, or the Run is gone: wake the requests waiting for its lock
        for request in reconciler.lock_released(meta.get("namespace", ""), meta.get("name", "")):
            workers.ensure(meta["namespace"], request)
    if type == "DELETED" or jr.inline_moved(dict(body)) or meta.get("deletionTimestamp"):
        return
    if not parts.reconciling():  # older CRDs (no RunStep kind yet): wait for the upgrade
        return
    slow.submit(_move_inline, parts, dict(body))


def _move_inline(parts: runtime.Parts, body: dict) -> None:
    meta = body["metadata"]
    try:
        jr.migrate_inline(parts.kube.custom, body)
    except Exception as err:  # noqa: BLE001 - the Run's next event, or a request that plans it, moves it
        log.error("Run %s/%s: its inline journal was not moved: %s", meta.get("namespace"), meta.get("name"), err)
