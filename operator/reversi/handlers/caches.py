"""The operator's own informers (:mod:`reversi.adapters.informer`): what it keeps in memory of
Runs, Namespaces and RollbackRequests, and who is told of their changes.

- ``runs``: every Run in the watched namespaces, as :class:`reversi.engine.retention.RunFacts`
  (a few hundred bytes each, not the Run);
- ``namespaces``: the retention annotation of each Namespace that carries one
  (``reversi.dev/retention-ttl-seconds``); Namespaces are cluster-scoped, so this one watch is
  cluster-wide (RBAC: get, list and watch namespaces);
- ``requests``: each RollbackRequest's run and phase.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from ..adapters import apicalls as calls
from ..adapters.informer import Informer, name_key, namespaced_key
from ..engine import retention as rules
from . import retention

G, V = calls.GROUP, calls.VERSION
#: the informers :func:`build` makes (each one WATCH per watched namespace, or one in all)
KINDS = ("runs", "namespaces", "requests")


def _custom(custom: client.CustomObjectsApi, plural: str) -> Any:
    def list_for(namespace: str | None) -> tuple[Any, tuple[Any, ...]]:
        if namespace:
            return custom.list_namespaced_custom_object, (G, V, namespace, plural)
        return custom.list_cluster_custom_object, (G, V, plural)
    return list_for


def build(api: client.ApiClient, namespaces: list[str], timeout: float = calls.TIMEOUT) -> dict[str, Informer]:
    """The informers (not started) by name: ``runs``, ``namespaces``, ``requests``."""
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    return {
        "runs": Informer(_custom(custom, "runs"), keep=rules.facts_of, key=namespaced_key, namespaces=namespaces,
                         name="runs", timeout=timeout),
        "namespaces": Informer(lambda _ns: (core.list_namespace, ()), keep=retention.namespace_setting, key=name_key,
                               name="namespaces", timeout=timeout),
        "requests": Informer(_custom(custom, "rollbackrequests"), keep=retention.request_facts, key=namespaced_key,
                             namespaces=namespaces, name="rollbackrequests", timeout=timeout),
    }


def start(informers: dict[str, Informer]) -> None:
    for informer in informers.values():
        informer.start()


def stop(informers: dict[str, Informer]) -> None:
    for informer in informers.values():
        informer.stop()


def runs_per_namespace(runs: Informer) -> dict[str, int]:
    """namespace -> how many Runs the informer of Runs holds there (namespaces with none left out)."""
    out: dict[str, int] = {}
    for (namespace, _), _facts in runs.items():
        out[namespace] = out.get(namespace, 0) + 1
    return out


def incomplete_runs(runs: Informer) -> list[tuple[str, str, dict[tuple[str, str], int]]] | None:
    """``(namespace, name, standing undos by (tool, state))`` of each Run whose last rollback left
    residue nobody acknowledged (``reversi.engine.acknowledgement.incomplete``, kept as ``RunFacts.residue``
    and ``RunFacts.standing``); None before the first LIST."""
    if not runs.synced(0):
        return None
    return [(f.namespace, f.name, dict(f.standing)) for f in runs.values() if f.residue]
