"""Whether a Halt or ClusterHalt is in force at the API server (docs/concepts.md#admission): a dry
run of a recorded call it matches is refused by the halts policy
(:func:`reversi.adapters.policies.halt_policy`) with its name. Nothing is stored and no call is
made; the operator sets the halt's ``InForce`` condition from the answer, and ``kubectl reversi
halt add --wait`` waits for it."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from ..models.runstep import MAX_RUN_STEPS, step_name
from . import apicalls as calls
from .policies import glob_instance

PROBE_RUN = "reversi-halt-probe"
PROBE_TOOL = "reversi.dev/halt-probe"


def probe_body(namespace: str, scope: dict[str, Any] | None) -> dict[str, Any]:
    """The RunStep a halt's probe sends as a dry run: a call of a tool and a run scope the
    halt's ``scope`` matches (each glob's :func:`glob_instance`), in observe mode."""
    scope = scope or {}
    tool = glob_instance(scope["tool"]) if isinstance(scope.get("tool"), str) else PROBE_TOOL
    run_scope = {f: glob_instance(scope[f]) for f in ("actor", "tenant", "environment")
                 if isinstance(scope.get(f), str)}
    index = MAX_RUN_STEPS - 1
    at_open: dict[str, Any] = {"uid": "halt-probe", "mode": "observe"}
    if run_scope:
        at_open["scope"] = run_scope
    return {"apiVersion": f"{calls.GROUP}/{calls.VERSION}", "kind": "RunStep",
            "metadata": {"name": step_name(PROBE_RUN, index), "namespace": namespace},
            "spec": {"runRef": {"name": PROBE_RUN}, "index": index, "tool": tool, "args": {},
                     "outcome": "intended", "runAtOpen": at_open}}


def in_force(custom: client.CustomObjectsApi, namespace: str, scope: dict[str, Any] | None, where: str,
             seconds: float = 2.0) -> bool:
    """Whether the API server refuses, naming ``where`` (``Halt ns/name`` or ``ClusterHalt
    name``), a dry run of a call in ``namespace`` that ``scope`` matches; probed until
    ``seconds`` have passed (the policy's informer lag). Raises ``ApiException`` for an answer
    that is not an admission's."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            calls.call(custom.create_namespaced_custom_object, calls.GROUP, calls.VERSION, namespace, "runsteps",
                       probe_body(namespace, scope), dry_run="All")
        except ApiException as err:
            if err.status == 403 and f"({where} refuses" in str(err.body or ""):
                return True
            if err.status not in (403, 409, 422):
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
