"""Run status for GitOps tools: ``observedGeneration`` and Ready/Reconciling/Stalled.

The reconciler keeps these current whenever it locks or releases a Run. Recording steps never
changes a Run (each step is a RunStep of its own), so this handler has little to do: it brings
the status up to date when a Run is created or its spec edited (an acknowledgement set or
withdrawn: Ready and ``status.standing.acknowledgedBy``), once the Run has been quiet for
``run_status_quiet_seconds`` (settings): one write per burst of edits is enough for kstatus. A
Run written before ``status.standing`` existed gets it once, computed from its journal
(docs/concepts.md#what-stands).

The operator watches Runs with an informer of its own (:mod:`reversi.adapters.informer`, see
:func:`observer`), not kopf, which keeps a worker per watched object.

The :class:`RunStatusWriter` debounces each Run's key on the operator's work queue
(:mod:`reversi.workqueue`), served by one thread, not a thread per Run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any


from .. import conditions as cond
from ..adapters import closed_runs
from ..adapters import journal as jr
from ..adapters import status as st
from ..engine import acknowledgement, standing
from ..adapters.kube import Conflict, Kube
from ..models.rollbackrequest import run_ref_name
from ..workqueue import WorkQueue
from . import runtime

log = logging.getLogger("reversi.runs")

RunKey = tuple[str, str]  # (namespace, name)


class RunStatusWriter:
    """Writes a Run's status ``quiet_seconds`` after the last :meth:`changed` of it, from the last
    body given, on one daemon thread; a write that fails is logged and left to the Run's next
    event. ``reconciling``: whether status may be written now (:meth:`runtime.Parts.reconciling`)."""

    def __init__(self, kube: Kube, quiet_seconds: float, reconciling: Callable[[], bool]):
        self.kube = kube
        self.quiet = quiet_seconds
        self.reconciling = reconciling
        self.queue: WorkQueue[RunKey] = WorkQueue(self._write_latest, workers=1, name="run-status")
        self._lock = threading.Lock()
        self._latest: dict[RunKey, dict] = {}  # the last body given for each queued Run

    def changed(self, namespace: str, name: str, body: dict) -> None:
        """The Run's status may be behind ``body`` (what the write needs of the Run: metadata's
        generation, resourceVersion and annotations, spec.acknowledgement, status)."""
        key = (namespace, name)
        with self._lock:
            self._latest[key] = body
        self.queue.start()
        self.queue.debounce(key, self.quiet)

    def stop(self) -> None:
        self.queue.stop()

    def _write_latest(self, key: RunKey) -> None:
        with self._lock:
            body = self._latest.pop(key, None)
        if body is None:
            return  # written with an earlier pass
        try:
            _write(self.kube, self.reconciling, key, body)
        except Exception as err:  # noqa: BLE001 - a status write is retried by the next event
            log.warning("Run %s/%s: status not updated: %s", *key, err)


def _check_lock(operating: runtime.Operating, namespace: str, name: str, holder: str) -> None:
    try:
        operating.reconciler.lock_orphaned(namespace, name, holder)
    except Exception as err:  # noqa: BLE001 - the next event of the Run, or a new request, releases it
        log.warning("Run %s/%s: lock of RollbackRequest %s not checked: %s", namespace, name, holder, err)


def _forget_closed(parts: runtime.Parts, namespace: str, name: str, uid: str) -> None:
    try:
        held = closed_runs.forget(parts.kube.custom, namespace, name, uid)
    except Exception as err:  # noqa: BLE001 - an entry left behind names a uid no Run has: it refuses nothing
        log.warning("Run %s/%s: its closed-runs entry not removed: %s", namespace, name, err)
        return
    if held is not None and parts.metrics is not None:
        parts.metrics.closed_runs.labels(namespace, closed_runs.slice_name(name)).set(held)


class CarryOver:
    """The namespaces whose closed runs this process has moved out of the ConfigMap of an earlier
    version into ClosedRunSlices (:func:`reversi.adapters.closed_runs.carry_over`): once per
    namespace that has a closed Run, at the first event of such a Run."""

    def __init__(self) -> None:
        self._done: set[str] = set()
        self._lock = threading.Lock()

    def needed(self, namespace: str) -> bool:
        """Whether ``namespace`` is still to be done; it is then taken (:meth:`failed` gives it back)."""
        with self._lock:
            if namespace in self._done:
                return False
            self._done.add(namespace)
            return True

    def failed(self, namespace: str) -> None:
        with self._lock:
            self._done.discard(namespace)


CARRIED = CarryOver()


def _carry_over(kube: Kube, namespace: str) -> None:
    try:
        moved = closed_runs.carry_over(kube.core, kube.custom, namespace)
    except Exception as err:  # noqa: BLE001 - tried again at the next event of a closed Run
        CARRIED.failed(namespace)
        log.warning("namespace %s: closed runs not moved to ClosedRunSlices: %s", namespace, err)
        return
    if moved:
        log.info("namespace %s: %d closed runs moved from ConfigMap %s to ClosedRunSlices", namespace, moved,
                 closed_runs.EARLIER_CONFIGMAP)


def _write(kube: Kube, reconciling: Callable[[], bool], key: RunKey, body: dict) -> None:
    if not reconciling():
        return
    ack = acknowledgement.acknowledged(body)
    update = st.run_status_update(body.get("status"), body["metadata"].get("generation"), key[1], ack)
    if st.needs_standing(body.get("status")):
        standing = _standing_from_journal(kube, key)
        if standing is not None:
            ack = acknowledgement.acknowledged({**body, "status": {**(body.get("status") or {}), "standing": standing}})
            standing["acknowledgedBy"] = acknowledgement.acknowledged_by(ack)
            update = st.run_status_update({**(body.get("status") or {}), "standing": standing},
                                          body["metadata"].get("generation"), key[1], ack) or {}
            update = {"observedGeneration": body["metadata"].get("generation"), **update, "standing": standing}
    if update is None:
        return
    try:
        kube.merge_status("runs", key[0], key[1], update, resource_version=body["metadata"]["resourceVersion"])
    except Conflict:
        return  # the Run changed since: its next event brings it here again
    status = body.get("status") or {}
    written = {**status, **update}
    if isinstance(status.get("standing"), dict) and isinstance(update.get("standing"), dict):
        written["standing"] = {**status["standing"], **update["standing"]}  # a merge patch
    last = acknowledgement.residue_request({**body, "status": written})
    if last and (ack is not None or _was_acknowledged(body)):
        _sync_last_request(kube, key[0], last, ack, run=key[1])


def _standing_from_journal(kube: Kube, key: RunKey) -> dict | None:
    """What stands on a Run written before ``status.standing`` existed, from its journal (one
    GET of the Run, a paged LIST of its RunSteps) and the report of its last request (the steps
    that report found undone): ``status.standing`` (wire) naming ``status.lastRequest``, or None
    when the Run is gone, locked since, or its journal cannot be read (logged; its next event
    tries again)."""
    run_obj = kube.get("runs", *key)
    status = (run_obj or {}).get("status") or {}
    if run_obj is None or not st.needs_standing(status):
        return None
    try:
        journal = jr.load(kube.custom, run_obj)
    except Exception as err:  # noqa: BLE001 - a bad or unreadable journal leaves the Run as it is
        log.warning("Run %s/%s: what stands not computed from its journal: %s", *key, err)
        return None
    last = status.get("lastRequest")
    report = (((kube.get("rollbackrequests", key[0], last) or {}).get("status") or {}).get("report") or {}) \
        if last else {}
    undone = frozenset(s for s in report.get("compensated") or [] if isinstance(s, int)) | frozenset(
        s for s in report.get("alreadyRecovered") or [] if isinstance(s, int))
    tools = {s.index: s.tool for s in journal.spec.steps}
    rolled = (cond.get_condition(status.get("conditions"), cond.ROLLED_BACK) or {}).get("status")
    steps = standing.standing_undos(journal.undo, tools, undone) if rolled == cond.FALSE else []
    return {**standing.summary(steps, last), "updatedAt": st.iso(time.time())}


def _was_acknowledged(body: dict) -> bool:
    ready = cond.get_condition((body.get("status") or {}).get("conditions"), cond.READY) or {}
    return ready.get("reason") == cond.RESIDUE_ACKNOWLEDGED


def _sync_last_request(kube: Any, namespace: str, name: str, ack: acknowledgement.Acknowledged | None,
                       run: str) -> None:
    """The RollbackRequest whose residue stands on the Run says whether that residue is
    acknowledged (Ready) or not (Stalled), as the Run now does
    (docs/concepts.md#acknowledging-residue). A request of that name for another Run (the Run's
    own was deleted and the name used again) is left alone."""
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


def observer(parts: runtime.Parts, slow: Executor) -> Callable[[str, Any, Any], None]:
    """What the operator does with each event of its informer of Runs (it watches Runs itself,
    not through kopf, which would keep a worker per Run: docs/operations.md, "The ceiling"):
    the Run's status (:func:`run_changed`), and waking the requests that wait for the Run
    (:func:`reversi.handlers.rollback.run_seen`). What may call the API (a lock's holder read
    back, an inline journal moved) runs on ``slow``, never on the informer's thread."""
    def observe(kind: str, key: tuple[str, str], obj: dict | None) -> None:
        namespace, name = key
        kind = "DELETED" if kind == "DELETED" or obj is None else kind
        body: dict = obj or {"metadata": {"namespace": namespace, "name": name}}
        run_changed(parts, kind, body, namespace, name, slow=slow)
        from . import rollback  # rollback imports this module

        rollback.run_seen(parts, kind, body, slow)

    return observe


def run_changed(parts: runtime.Parts, type: str, body: Any, namespace: str, name: str,
                slow: Executor | None = None) -> None:
    """Queue the Run when its status is behind its generation or its conditions; check that the
    request holding its lock still exists; a deleted Run that a rollback closed leaves the
    namespace's closed runs (its entry names its uid). What reads or writes the API runs on
    ``slow`` when given."""
    if not parts.reconciling():
        return
    if type == "DELETED":
        if (body.get("status") or {}).get("closedBy"):
            uid = body["metadata"]["uid"]
            if slow is not None:
                slow.submit(_forget_closed, parts, namespace, name, uid)
            else:
                _forget_closed(parts, namespace, name, uid)
        return
    operating = parts.operating()
    meta, status = body["metadata"], body.get("status") or {}
    if status.get("closedBy") and CARRIED.needed(namespace):  # once per namespace with a closed run
        if slow is not None:
            slow.submit(_carry_over, parts.kube, namespace)
        else:
            _carry_over(parts.kube, namespace)
    holder = status.get("activeRequest")
    if holder:  # a lock held by a request deleted while the operator was down is released (rule 14)
        if slow is not None:
            slow.submit(_check_lock, operating, namespace, name, holder)
        else:
            _check_lock(operating, namespace, name, holder)
    if st.run_status_update(status, meta.get("generation"), name, acknowledgement.acknowledged(body)) is not None \
            or st.needs_standing(status):
        # keep only what the write needs, not the Run's steps, nor what stands beyond who accepted it
        annotations = meta.get("annotations") or {}
        legacy = annotations.get(acknowledgement.LEGACY_ANNOTATION)
        ack = (body.get("spec") or {}).get("acknowledgement")
        held = status.get("standing")
        operating.run_status.changed(namespace, name, {
            "metadata": {"generation": meta.get("generation"), "resourceVersion": meta.get("resourceVersion"),
                         "annotations": {} if legacy is None else {acknowledgement.LEGACY_ANNOTATION: legacy}},
            "spec": {"acknowledgement": dict(ack)} if isinstance(ack, dict) else {},
            "status": {"observedGeneration": status.get("observedGeneration"),
                       "lastRequest": status.get("lastRequest"),
                       **({"standing": {"request": held.get("request"), "acknowledgedBy": held.get("acknowledgedBy")}}
                          if isinstance(held, dict) else {}),
                       "conditions": [dict(item) for item in status.get("conditions") or []]}})
