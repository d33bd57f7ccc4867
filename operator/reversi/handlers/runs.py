"""Run status for GitOps tools: ``observedGeneration`` and Ready/Reconciling/Stalled.

The reconciler keeps these current whenever it locks or releases a Run. Recording steps never
changes a Run (each step is a RunStep of its own), so this handler has little to do: it brings
the status up to date when a Run is created or its spec edited, once the Run has been quiet for
``run_status_quiet_seconds`` (settings): one write per burst of edits is enough for kstatus.

A de-duplicating delayed queue and one thread, not a thread per Run.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from typing import Any

import kopf

from .. import conditions as c
from ..adapters import status as st
from ..engine import acknowledgement
from ..adapters.kube import Conflict
from ..models.rollbackrequest import run_ref_name
from . import runtime

log = logging.getLogger("reversi.runs")


class Quiet:
    """Keys become due ``quiet`` seconds after their last :meth:`put`; ``work(key, value)`` runs
    for each due key, with the last value put, on one daemon thread."""

    def __init__(self, work: Any):
        self.work = work
        self._latest: dict[Any, tuple[float, Any]] = {}
        self._heap: list[tuple[float, Any]] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def put(self, key: Any, value: Any, quiet: float) -> None:
        due = time.monotonic() + quiet
        with self._cv:
            self._latest[key] = (due, value)
            heapq.heappush(self._heap, (due, key))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name="run-status")
                self._thread.start()
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._heap:
                    self._cv.wait()
                due, key = self._heap[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._cv.wait(wait)
                    continue
                heapq.heappop(self._heap)
                latest = self._latest.get(key)
                if latest is None or latest[0] != due:
                    continue  # a later put superseded this one
                del self._latest[key]
                value = latest[1]
            try:
                self.work(key, value)
            except Exception as err:  # noqa: BLE001 - a status write is retried by the next event
                log.warning("Run %s/%s: status not updated: %s", *key, err)


def _write(key: tuple[str, str], body: dict) -> None:
    if not runtime.reconciling():
        return
    ack = acknowledgement.acknowledged(body)
    update = st.run_status_update(body.get("status"), body["metadata"].get("generation"), key[1], ack)
    if update is None:
        return
    kube = runtime.state().kube
    try:
        kube.merge_status("runs", key[0], key[1], update, resource_version=body["metadata"]["resourceVersion"])
    except Conflict:
        return  # the Run changed since: its next event brings it here again
    last = (body.get("status") or {}).get("lastRequest")
    if last and (ack is not None or _was_acknowledged(body)):
        _sync_last_request(kube, key[0], last, ack, run=key[1])


def _was_acknowledged(body: dict) -> bool:
    ready = c.get_condition((body.get("status") or {}).get("conditions"), c.READY) or {}
    return ready.get("reason") == c.RESIDUE_ACKNOWLEDGED


def _sync_last_request(kube: Any, namespace: str, name: str, ack: acknowledgement.Acknowledged | None,
                       run: str) -> None:
    """The Run's last RollbackRequest says whether its residue is acknowledged (Ready) or not
    (Stalled), as the Run now does (docs/concepts.md#acknowledging-residue). A request of that
    name for another Run (the Run's own was deleted and the name used again) is left alone."""
    request = kube.get("rollbackrequests", namespace, name)
    if request is None or run_ref_name(request) != run:
        return
    update = st.request_acknowledged_update(request.get("status"), ack)
    if update is None:
        return
    try:
        kube.merge_status("rollbackrequests", namespace, name, update,
                          resource_version=request["metadata"]["resourceVersion"])
    except Conflict:
        pass  # changed since: the Run's next event brings it here again


_queue = Quiet(_write)


@kopf.on.event("reversi.dev", "v1alpha1", "runs", id="run-status")
def run_event(type: str, body: kopf.Body, namespace: str | None, name: str, **_: Any) -> None:
    assert namespace is not None  # Runs are namespaced
    if runtime.initialised() and runtime.state().metrics is not None:  # the incomplete-rollbacks gauge, from events
        runtime.state().metrics.run_observed(namespace, name, None if type == "DELETED" else dict(body))
    run_changed(type, body, namespace, name)


def run_changed(type: str, body: Any, namespace: str, name: str) -> None:
    """Queue the Run when its status is behind its generation or its conditions."""
    if type == "DELETED" or not runtime.reconciling():
        return
    meta, status = body["metadata"], body.get("status") or {}
    holder = status.get("activeRequest")
    if holder:  # a lock held by a request deleted while the operator was down is released (rule 14)
        try:
            runtime.operating()[0].lock_orphaned(namespace, name, holder)
        except Exception as err:  # noqa: BLE001 - the next event of the Run, or a new request, releases it
            log.warning("Run %s/%s: lock of RollbackRequest %s not checked: %s", namespace, name, holder, err)
    if st.run_status_update(status, meta.get("generation"), name, acknowledgement.acknowledged(body)) is not None:
        # keep only what the write needs, not the Run's steps
        annotations = meta.get("annotations") or {}
        legacy = annotations.get(acknowledgement.LEGACY_ANNOTATION)
        ack = (body.get("spec") or {}).get("acknowledgement")
        _queue.put((namespace, name), {
            "metadata": {"generation": meta.get("generation"), "resourceVersion": meta.get("resourceVersion"),
                         "annotations": {} if legacy is None else {acknowledgement.LEGACY_ANNOTATION: legacy}},
            "spec": {"acknowledgement": dict(ack)} if isinstance(ack, dict) else {},
            "status": {"observedGeneration": status.get("observedGeneration"),
                       "lastRequest": status.get("lastRequest"),
                       "conditions": [dict(cond) for cond in status.get("conditions") or []]}},
            runtime.state().settings.run_status_quiet_seconds)
