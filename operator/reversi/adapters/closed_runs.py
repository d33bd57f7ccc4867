"""A rollback's lock as the API server enforces it (rule 11; docs/concepts.md#admission): the
namespace's ConfigMap :data:`reversi.adapters.policies.CLOSED_RUNS` maps each run a rollback has
locked to ``<run uid> <RollbackRequest>``, and the lock policy refuses a recorded call of such a
run (:func:`reversi.adapters.policies.lock_policy`). The operator writes the entry when it takes
the lock (:func:`close`), and the request plans only once a dry run of the run's next step is
refused (:func:`probe`): the API servers' policy informers have the entry. An entry goes when its
Run is deleted (:func:`forget`); one left behind names a uid no Run has any more and refuses
nothing."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from ..models.runstep import MAX_RUN_STEPS, step_name
from . import apicalls as calls
from .policies import CLOSED_RUNS

#: the tool name of the lock's probe (a dry run: never stored, never called)
PROBE_TOOL = "reversi.dev/lock-probe"

#: what the lock policy's refusal says after ``Run <namespace>/<run>: ``
#: (:func:`reversi.adapters.policies.lock_policy`): the run is being rolled back (its entry names
#: the request holding it) or was (the request released it)
LOCKED = ("run is being rolled back by RollbackRequest ", "run was rolled back by RollbackRequest ")


def entry(uid: str, request: str, ended: bool = False) -> str:
    """The ConfigMap value of a locked run: ``<run uid> <RollbackRequest>`` (and ``ended`` once
    the request released the lock: the run stays closed)."""
    return f"{uid} {request}" + (" ended" if ended else "")


def close(core: client.CoreV1Api, namespace: str, run: str, uid: str, request: str, ended: bool = False) -> None:
    """Add run ``run`` (uid ``uid``) to the namespace's closed runs, locked by ``request``
    (``ended``: the request released it) (idempotent; the ConfigMap is created when missing).
    Raises ``ApiException``."""
    patch = {"data": {run: entry(uid, request, ended)}}
    try:
        calls.call(core.patch_namespaced_config_map, CLOSED_RUNS, namespace, patch)
        return
    except ApiException as err:
        if err.status != 404:
            raise
    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CLOSED_RUNS, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "reversi"}},
            "data": {run: entry(uid, request, ended)}}
    try:
        calls.call(core.create_namespaced_config_map, namespace, body, repeat="unsent")
    except ApiException as err:
        if err.status != 409:
            raise
        calls.call(core.patch_namespaced_config_map, CLOSED_RUNS, namespace, patch)  # created in between


def forget(core: client.CoreV1Api, namespace: str, run: str, uid: str) -> None:
    """Remove the entry of run ``run`` when it names ``uid`` (the Run was deleted; an entry of a
    Run re-created since under the same name is kept). Raises ``ApiException``."""
    try:
        current = calls.call(core.read_namespaced_config_map, CLOSED_RUNS, namespace)
    except ApiException as err:
        if err.status == 404:
            return
        raise
    value = (current.data or {}).get(run)
    if value is None or value.split(" ", 1)[0] != uid:
        return
    path = "/data/" + run.replace("~", "~0").replace("/", "~1")
    ops = [{"op": "test", "path": path, "value": value}, {"op": "remove", "path": path}]
    try:
        calls.call(core.patch_namespaced_config_map, CLOSED_RUNS, namespace, ops,
                   _content_type=calls.JSON_PATCH)
    except ApiException as err:
        if err.status not in (404, 422):  # gone, or changed since (422: the test failed)
            raise


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
