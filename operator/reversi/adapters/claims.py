"""Claims of forward idempotency keys: the rule "no repeat of a call that still stands" held by
the API server's name uniqueness (docs/concepts.md#the-journal).

A recorded call of a tool with an ``idempotencyKey`` first creates its **claim**, a Lease
(``coordination.k8s.io/v1``) named :func:`claim_name` (the run and a hash of the tool and the
key), owned by the Run and holding the step's name (``spec.holderIdentity``). A second call with
the same key in the same run finds the name taken (409): one create decides it under any race,
with no LIST, at the same cost in an empty namespace and among thousands of steps. The holder is
``<step name> <recorder id>``: two recorders about to take the same index never take each
other's claim for their own. A Lease is the
cheapest object for it: small, with a holder field meant for exactly this, acted on by no
controller unless someone runs leader election under that name, never mounted into pods (a
ConfigMap can be) and holding nothing secret; agents need ``create``, ``get``, ``patch`` and
``delete`` on ``leases`` in their namespace (:data:`reversi.rbac.RECORD`, the chart's
``<fullname>-record`` role).

A claim is released when its call no longer stands: the recorder deletes it when it records the
call ``failed``, and a later claimant deletes a claim whose step is settled ``failed``, was
compensated, or never came to be recorded (after :data:`STALE_SECONDS`), then claims again.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from types import SimpleNamespace
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from ..engine.admission import standing_after
from ..models.runstep import LABEL_RUN
from . import apicalls as calls
from .journal import owner_reference

#: seconds after which a claim whose step was never recorded (its process died between the claim
#: and the step, or the step was refused) is taken as abandoned
STALE_SECONDS = 60.0


def claim_name(run: str, tool: str, key: str) -> str:
    """The claim's name: ``<run>-k<32 hex of sha256(tool, key)>`` (at most 97 characters)."""
    digest = hashlib.sha256(f"{tool}\x00{key}".encode()).hexdigest()[:32]
    return f"{run}-k{digest}"


def _lease(namespace: str, run: str, run_uid: str, name: str, holder: str) -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    meta = {"name": name, "namespace": namespace, "labels": {LABEL_RUN: run},
            "ownerReferences": [owner_reference(run, run_uid)]}
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": holder, "acquireTime": now}}


def _holder_stands(custom: client.CustomObjectsApi, namespace: str, lease: Any) -> bool:
    """Whether the call that holds ``lease`` still stands: its step exists (or was claimed less
    than :data:`STALE_SECONDS` ago) and its effective outcome is not ``failed`` and it was not
    compensated."""
    holder = (lease.spec.holder_identity or "").split(" ", 1)[0]
    step = calls.get(custom, "runsteps", holder, namespace) if holder else None
    if step is None:
        acquired = lease.spec.acquire_time or lease.metadata.creation_timestamp
        age = (dt.datetime.now(dt.UTC) - acquired).total_seconds() if acquired else STALE_SECONDS
        return age < STALE_SECONDS
    spec = step.get("spec") or {}
    resolution = spec.get("resolution")
    undo = ((step.get("status") or {}).get("undo") or {}).get("state")
    settled = SimpleNamespace(status=resolution.get("status")) if isinstance(resolution, dict) else None
    return standing_after(spec.get("outcome", "intended"), settled, undo)


def claim(api: client.ApiClient, namespace: str, run: str, run_uid: str, name: str, holder: str) -> str | None:
    """Claim ``name`` for ``holder`` (``<step name> <recorder id>``): None when claimed, else the
    name of the step that holds it and still stands (the call is a repeat). A claim whose call no longer stands is
    released and claimed again. Raises ``ApiException`` when the API server refuses."""
    coord = client.CoordinationV1Api(api)
    custom = client.CustomObjectsApi(api)
    for _ in range(5):
        try:
            calls.call(coord.create_namespaced_lease, namespace, _lease(namespace, run, run_uid, name, holder),
                       repeat="unsent", policy=calls.RECORDING)
            return None
        except ApiException as err:
            if err.status != 409:
                raise
        try:
            lease = calls.call(coord.read_namespaced_lease, name, namespace)
        except ApiException as err:
            if err.status == 404:
                continue  # released in between: claim again
            raise
        if lease.spec.holder_identity == holder:
            return None  # ours (a create that landed, then was repeated)
        if _holder_stands(custom, namespace, lease):
            return str(lease.spec.holder_identity).split(" ", 1)[0]
        release(api, namespace, name, lease.metadata.resource_version)
    return None if _mine(coord, namespace, name, holder) else name


def _mine(coord: client.CoordinationV1Api, namespace: str, name: str, holder: str) -> bool:
    try:
        return calls.call(coord.read_namespaced_lease, name, namespace).spec.holder_identity == holder
    except ApiException:
        return False


def hand_over(api: client.ApiClient, namespace: str, name: str, holder: str) -> None:
    """Point claim ``name`` at ``holder`` (``<step name> <recorder id>``: the step took another
    index than the one it claimed with). Raises ``ApiException``."""
    coord = client.CoordinationV1Api(api)
    calls.call(coord.patch_namespaced_lease, name, namespace, {"spec": {"holderIdentity": holder}})


def release(api: client.ApiClient, namespace: str, name: str, resource_version: str | None = None) -> None:
    """Delete claim ``name`` (only that version of it, when ``resource_version`` is given); a
    claim already gone, or changed since, is left as it is."""
    coord = client.CoordinationV1Api(api)
    body = client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version=resource_version)
                                  if resource_version else None)
    try:
        calls.call(coord.delete_namespaced_lease, name, namespace, body=body)
    except ApiException as err:
        if err.status not in (404, 409):
            raise
