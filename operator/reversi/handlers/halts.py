"""Halt and ClusterHalt status: active, since when (refused calls are counted by the webhook).

A halt is in force from the moment it exists — the webhook reads halts from the API on every
write, so every replica sees the same halts; this handler only reports it. Lifting a halt is
deleting it.
"""

from __future__ import annotations

from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from .. import conditions as c
from . import runtime

G, V = "reversi.dev", "v1alpha1"


def _report(body: Any, plural: str, namespace: str | None, name: str) -> None:
    status = body.get("status") or {}
    meta = body["metadata"]
    gen = meta.get("generation")
    if status.get("active") is True and status.get("observedGeneration") == gen:
        return
    reason = (body.get("spec") or {}).get("reason", "")
    patch = {"status": {
        "active": True,
        "since": status.get("since") or meta.get("creationTimestamp"),
        "observedGeneration": gen,
        "conditions": c.set_condition(status.get("conditions") or [], c.condition(
            c.ACTIVE, c.TRUE, c.HALT_IN_EFFECT, f"refusing matching calls: kill switch: {reason}", gen)),
    }}
    custom = runtime.state().kube.custom
    try:
        if namespace:
            custom.patch_namespaced_custom_object_status(G, V, namespace, plural, name, patch,
                                                         _request_timeout=runtime.state().kube.timeout)
        else:
            custom.patch_cluster_custom_object_status(G, V, plural, name, patch,
                                                      _request_timeout=runtime.state().kube.timeout)
    except ApiException as err:
        if err.status != 404:  # lifted (deleted) meanwhile: nothing to report
            raise


@kopf.on.event(G, V, "halts")
def halt_event(type: str, body: Any, namespace: str, name: str, **_: Any) -> None:
    if type != "DELETED":
        _report(body, "halts", namespace, name)
    _refresh_gauges()


@kopf.on.event(G, V, "clusterhalts")
def cluster_halt_event(type: str, body: Any, name: str, **_: Any) -> None:
    if type != "DELETED":
        _report(body, "clusterhalts", None, name)
    _refresh_gauges()


def _refresh_gauges() -> None:
    state = runtime.state()
    if state.metrics:
        state.metrics.refresh_halts(state.kube)
