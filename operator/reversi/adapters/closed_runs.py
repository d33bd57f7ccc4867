"""A rollback's lock as the API server enforces it (rule 11; docs/concepts.md#admission): the
namespace's ClosedRunSlices (:mod:`reversi.models.closedrunslice`) map each run a rollback has
locked to ``<run uid> <RollbackRequest>``, and the lock policy, whose params they are, refuses a
recorded call of such a run (:func:`reversi.adapters.policies.lock_policy`). The operator writes
the entry when it takes the lock (:func:`close`), and the request plans only once a dry run of the
run's next step is refused (:func:`probe`): the API servers' policy informers have the entry. An
entry goes when its Run is deleted (:func:`forget`); one left behind names a uid no Run has any
more and refuses nothing."""

from __future__ import annotations

import zlib
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from ..models.closedrunslice import SLICE_CAPACITY, SLICES
from ..models.runstep import MAX_RUN_STEPS, step_name
from . import apicalls as calls

#: the tool name of the lock's probe (a dry run: never stored, never called)
PROBE_TOOL = "reversi.dev/lock-probe"
PLURAL = "closedrunslices"
#: the label every slice carries (``kubectl get closedrunslices -l reversi.dev/closed-runs``)
LABEL = "reversi.dev/closed-runs"

#: what the lock policy's refusal says after ``Run <namespace>/<run>: ``
#: (:func:`reversi.adapters.policies.lock_policy`): the run is being rolled back (its entry names
#: the request holding it) or was (the request released it)
LOCKED = ("run is being rolled back by RollbackRequest ", "run was rolled back by RollbackRequest ")


class SliceFull(Exception):
    """The run's slice holds :data:`~reversi.models.closedrunslice.SLICE_CAPACITY` runs already:
    the API server cannot enforce this run's lock (the count before the request ends still finds
    any step recorded after it)."""


def slice_name(run: str) -> str:
    """The ClosedRunSlice that holds run ``run``: ``reversi-closed-runs-<nn>``, ``nn`` the CRC-32
    of the name modulo :data:`~reversi.models.closedrunslice.SLICES` (stable across processes and
    versions: a slice is never read to find a run)."""
    return f"reversi-closed-runs-{zlib.crc32(run.encode()) % SLICES:02d}"


def entry(uid: str, request: str, ended: bool = False) -> str:
    """The slice's value of a locked run: ``<run uid> <RollbackRequest>`` (and ``ended`` once
    the request released the lock: the run stays closed)."""
    return f"{uid} {request}" + (" ended" if ended else "")


def close(custom: client.CustomObjectsApi, namespace: str, run: str, uid: str, request: str,
          ended: bool = False) -> int:
    """Add run ``run`` (uid ``uid``) to the namespace's closed runs, locked by ``request``
    (``ended``: the request released it) (idempotent; the slice is created when missing).
    Returns how many runs the slice now holds. Raises :class:`SliceFull` when the slice is full,
    ``ApiException`` otherwise."""
    name = slice_name(run)
    patch = {"spec": {"runs": {run: entry(uid, request, ended)}}}
    try:
        return _held(_patch(custom, namespace, name, patch))
    except ApiException as err:
        if err.status != 404:
            raise
    body = {"apiVersion": f"{calls.GROUP}/{calls.VERSION}", "kind": "ClosedRunSlice",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {LABEL: "", "app.kubernetes.io/managed-by": "reversi"}},
            "spec": {"runs": {run: entry(uid, request, ended)}}}
    try:
        return _held(calls.call(custom.create_namespaced_custom_object, calls.GROUP, calls.VERSION, namespace,
                                PLURAL, body, repeat="unsent"))
    except ApiException as err:
        if err.status != 409:
            raise
    return _held(_patch(custom, namespace, name, patch))  # created in between


def _patch(custom: client.CustomObjectsApi, namespace: str, name: str, patch: dict[str, Any]) -> Any:
    try:
        return calls.call(custom.patch_namespaced_custom_object, calls.GROUP, calls.VERSION, namespace, PLURAL,
                          name, patch)
    except ApiException as err:
        if (err.status == 422 and "spec.runs" in str(err.body or "")) or err.status == 413:
            raise SliceFull(f"ClosedRunSlice {namespace}/{name} holds {SLICE_CAPACITY} closed runs already, its "
                            "limit: the API server cannot enforce this run's lock (deleting old Runs, as retention "
                            "does, frees their entries)") from err
        raise


def _held(obj: Any) -> int:
    return len(((obj or {}).get("spec") or {}).get("runs") or {})


def forget(custom: client.CustomObjectsApi, namespace: str, run: str, uid: str) -> int | None:
    """Remove the entry of run ``run`` when it names ``uid`` (the Run was deleted; an entry of a
    Run re-created since under the same name is kept); returns how many runs the slice holds
    after the removal (None: nothing was removed). Raises ``ApiException``."""
    name = slice_name(run)
    try:
        current = calls.call(custom.get_namespaced_custom_object, calls.GROUP, calls.VERSION, namespace, PLURAL,
                             name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    value = ((current.get("spec") or {}).get("runs") or {}).get(run)
    if value is None or value.split(" ", 1)[0] != uid:
        return None
    path = "/spec/runs/" + run.replace("~", "~0").replace("/", "~1")
    ops = [{"op": "test", "path": path, "value": value}, {"op": "remove", "path": path}]
    try:
        return _held(calls.call(custom.patch_namespaced_custom_object, calls.GROUP, calls.VERSION, namespace, PLURAL,
                                name, ops, _content_type=calls.JSON_PATCH))
    except ApiException as err:
        if err.status not in (404, 422):  # gone, or changed since (422: the test failed)
            raise
    return None


#: the ConfigMap that held a namespace's closed runs before ClosedRunSlices (``data``: run name ->
#: entry); :func:`carry_over` moves its entries and deletes it
EARLIER_CONFIGMAP = "reversi-closed-runs"


def carry_over(core: client.CoreV1Api, custom: client.CustomObjectsApi, namespace: str) -> int:
    """Move the entries of the namespace's :data:`EARLIER_CONFIGMAP` (written by an operator of an
    earlier version) into its ClosedRunSlices, then delete the ConfigMap; returns how many entries
    moved (0: no such ConfigMap). A run the slices already hold keeps its newer entry; one whose
    slice is full is left out. Idempotent: an interrupted move is done again. Raises
    ``ApiException``."""
    try:
        earlier = calls.call(core.read_namespaced_config_map, EARLIER_CONFIGMAP, namespace)
    except ApiException as err:
        if err.status == 404:
            return 0
        raise
    moved, held = 0, {}  # held: slice name -> its runs (read once), so a newer entry is never overwritten
    for run, value in sorted((earlier.data or {}).items()):
        uid, _, rest = value.partition(" ")
        request, _, ended = rest.partition(" ")
        name = slice_name(run)
        if name not in held:
            try:
                held[name] = (calls.call(custom.get_namespaced_custom_object, calls.GROUP, calls.VERSION, namespace,
                                         PLURAL, name).get("spec") or {}).get("runs") or {}
            except ApiException as err:
                if err.status != 404:
                    raise
                held[name] = {}
        if uid and request and run not in held[name]:
            try:
                close(custom, namespace, run, uid, request, ended=ended == "ended")
            except SliceFull:
                continue  # its run stays open to the policy; the count before a request ends finds its steps
            moved += 1
    try:
        calls.call(core.delete_namespaced_config_map, EARLIER_CONFIGMAP, namespace,
                   body=client.V1DeleteOptions(preconditions=client.V1Preconditions(
                       resource_version=earlier.metadata.resource_version)))
    except ApiException as err:
        if err.status not in (404, 409):  # gone, or changed since: moved again at the next start
            raise
    return moved


def probe_body(namespace: str, run: str, uid: str) -> dict[str, Any]:
    """The RunStep a probe sends as a dry run: a recorded call of run ``run`` (uid ``uid``) at
    the last index, in observe mode, of a tool no halt is meant for."""
    index = MAX_RUN_STEPS - 1
    return {"apiVersion": f"{calls.GROUP}/{calls.VERSION}", "kind": "RunStep",
            "metadata": {"name": step_name(run, index), "namespace": namespace},
            "spec": {"runRef": {"name": run}, "index": index, "tool": PROBE_TOOL, "args": {},
                     "outcome": "intended", "runAtOpen": {"uid": uid, "mode": "observe"}}}


def probe(custom: client.CustomObjectsApi, namespace: str, run: str, uid: str) -> bool:
    """Whether the API server refuses a new step of run ``run`` because it is closed: a dry-run
    create of :func:`probe_body` (nothing is stored) refused by the lock (:data:`LOCKED`: the run
    is being, or was, rolled back). Raises ``ApiException`` for an answer that is neither."""
    try:
        calls.call(custom.create_namespaced_custom_object, calls.GROUP, calls.VERSION, namespace, "runsteps",
                   probe_body(namespace, run, uid), dry_run="All", repeat="always")
    except ApiException as err:
        body = str(err.body or "")
        if err.status == 403 and any(f"Run {namespace}/{run}: {marker}" in body for marker in LOCKED):
            return True
        if err.status in (403, 409, 422):
            return False  # refused by something else (a halt), or the name exists: not known to be in force
        raise
    return False
