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
from ..adapters import status as st
from . import runtime

G, V = "reversi.dev", "v1alpha1"


def halt_status(body: Any) -> dict | None:
    """The status a Halt or ClusterHalt should have (active since its creation, ``Active`` and
    ``Ready`` True, observedGeneration current), or ``None`` when it already has it (pure)."""
    status = body.get("status") or {}
    meta = body["metadata"]
    gen = meta.get("generation")
    reason = (body.get("spec") or {}).get("reason", "")
    message = f"refusing matching calls: kill switch: {reason}"
    conds = st.summary_conditions(status.get("conditions") or [], gen, [
        (c.ACTIVE, c.TRUE, c.HALT_IN_EFFECT, message),
        *st.readiness(st.READY_STATE, c.HALT_IN_EFFECT, message)])
    if status.get("active") is True and status.get("observedGeneration") == gen and st.same_conditions(
            conds, status.get("conditions") or []):
        return None
    return {"active": True, "since": status.get("since") or meta.get("creationTimestamp"),
            "observedGeneration": gen, "conditions": conds}


def _report(body: Any, plural: str, namespace: str | None, name: str) -> None:
    status = halt_status(body)
    if status is None or not runtime.reconciling():
        return
    patch = {"status": status}
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
