"""Small helpers shared by the integration tests."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import Any, TypeVar
from collections.abc import Callable

T = TypeVar("T")


class KeptRecords(logging.Handler):
    """A logging handler that keeps every record it gets (``records``), at every level."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def wait_for(check: Callable[[], T], timeout: float = 60.0, interval: float = 0.25,
             what: str = "condition") -> T:
    """Call ``check`` until it returns something truthy; return that value.

    Raises ``AssertionError`` naming ``what`` and the last value after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last  # type: ignore[return-value]
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}")


def recorded_steps(api, namespace: str, run: str) -> list[dict]:
    """The steps recorded in Run ``namespace/run`` (their RunSteps' specs), in index order."""
    from kubernetes import client

    from reversi.adapters.journal import list_objects

    return [o["spec"] for o in list_objects(client.CustomObjectsApi(api), namespace, run)]


def users_with_roles(cluster: Any, admin_api: Any, namespace: str, roles: dict[str, list[dict]]) -> dict[str, Any]:
    """For each ``{user: rules}``, a Role with those rules in ``namespace`` bound to that user, and
    an API client that authenticates as the user (a client certificate of the local control
    plane). Returns ``{user: ApiClient}``."""
    from kubernetes import client, config

    rbac = client.RbacAuthorizationV1Api(admin_api)
    out = {}
    for user, rules in roles.items():
        rbac.create_namespaced_role(namespace, {"metadata": {"name": user}, "rules": rules})
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": user},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
        out[user] = config.new_client_from_config(config_file=str(cluster.kubeconfig_for(user)))
        if rules:
            wait_for_role(admin_api, user, namespace, rules[0])
    return out


def wait_for_role(admin_api: Any, user: str, namespace: str, rule: dict) -> None:
    """Wait until the API server's authorizer grants ``user`` the first verb of ``rule`` (a Role
    rule) in ``namespace``: a new RoleBinding reaches the authorizer's cache a moment after it is
    stored, and a request sent in that moment is refused. Asks with SubjectAccessReviews."""
    from kubernetes import client

    authz = client.AuthorizationV1Api(admin_api)
    review = {"spec": {"user": user, "resourceAttributes": {
        "namespace": namespace, "group": (rule.get("apiGroups") or [""])[0],
        "resource": (rule.get("resources") or [""])[0], "verb": (rule.get("verbs") or [""])[0]}}}
    wait_for(lambda: authz.create_subject_access_review(review).status.allowed, timeout=30,
             what=f"{user}'s role in force in {namespace}")


async def open_stalled(port: int, context: ssl.SSLContext, stage: str,
                       path: str = "/validate-run") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the webhook server on ``127.0.0.1:port`` that stalls in ``stage``:
    ``silent`` (TCP only, no TLS handshake), ``headers`` (half a request line and headers for
    ``path``), ``body`` (headers, then one byte of a 1,000-byte body), ``idle`` (one request
    answered, then nothing). Returns its streams (a writer that is collected closes its
    connection)."""
    if stage == "silent":
        return await asyncio.open_connection("127.0.0.1", port)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="127.0.0.1")
    writer.write({"headers": f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode(),
                  "body": f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{{".encode(),
                  "idle": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"}[stage])
    await writer.drain()
    if stage == "idle":
        assert (await reader.readline()).startswith(b"HTTP/1.1 405")  # answered: now it idles
    return reader, writer


class RunsInformerStub:
    """The operator's informer of Runs as the metrics read it (``values()`` of RunFacts, ``synced()``), fed
    with Runs as dicts: :meth:`put` (a change), :meth:`delete`; ``listed``: whether its first LIST is in."""

    def __init__(self, listed: bool = True) -> None:
        self.listed = listed
        self._facts: dict[tuple[str, str], Any] = {}

    def put(self, run: dict) -> None:
        from reversi.engine.retention import facts_of

        facts = facts_of(run)
        self._facts[(facts.namespace, facts.name)] = facts

    def delete(self, namespace: str, name: str) -> None:
        self._facts.pop((namespace, name), None)

    def values(self) -> list[Any]:
        return list(self._facts.values())

    def items(self) -> list[tuple[tuple[str, str], Any]]:
        return list(self._facts.items())

    def synced(self, timeout: float | None = None) -> bool:
        return self.listed


def metrics_reading(informer: RunsInformerStub, registry: Any = None) -> Any:
    """A :class:`reversi.metrics.Metrics` whose gauges of what stands read ``informer`` at each scrape, as the
    operator's do."""
    from reversi.handlers import caches
    from reversi.metrics import Metrics

    metrics = Metrics(registry)
    metrics.runs_source = lambda: caches.incomplete_runs(informer)  # type: ignore[arg-type]
    return metrics
