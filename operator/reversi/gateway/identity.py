"""Who the agent is, and API clients that act as the agent.

Over HTTP the agent sends its Kubernetes service-account token as ``Authorization: Bearer``.
:class:`TokenReviewer` asks the API server (TokenReview) who it is; :func:`impersonating` gives an
``ApiClient`` that writes as that user (``Impersonate-User``), so the Run's principal, halts and
RBAC are the agent's own, never the gateway's. The gateway's own identity needs only
``create tokenreviews`` and ``impersonate serviceaccounts`` (see the chart).
"""

from __future__ import annotations

import copy
import hashlib
import threading
import time
from dataclasses import dataclass

from kubernetes import client, config
from kubernetes.client import rest
from urllib3 import HTTPHeaderDict

from ..adapters import apicalls


class Unauthenticated(Exception):
    """The agent's token is missing or the API server does not accept it (HTTP 401)."""


@dataclass(frozen=True)
class Agent:
    """An authenticated caller: its user name (the Run's principal), uid and groups."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()


def gateway_configuration(kubeconfig: str | None) -> client.Configuration:
    """The gateway's own connection: ``kubeconfig``, else in-cluster, else ``$KUBECONFIG``."""
    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        return cfg
    try:
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException:
        config.load_kube_config(client_configuration=cfg)
    return cfg


def impersonating(cfg: client.Configuration, agent: Agent | None) -> client.ApiClient:
    """An ``ApiClient`` on ``cfg`` that acts as ``agent`` (``None``: as the gateway itself).

    Only the user is impersonated: for a service account the API server adds its groups
    (``system:serviceaccounts``, ``system:serviceaccounts:<ns>``) itself.
    """
    api = client.ApiClient(copy.copy(cfg))
    if agent is not None:
        api.set_default_header("Impersonate-User", agent.username)
    return api


class TokenReviewer:
    """Checks bearer tokens with TokenReview; answers are kept ``ttl`` seconds (by token hash)."""

    def __init__(self, api: client.ApiClient, audiences: list[str] | None = None, ttl: float = 60.0):
        self.auth = client.AuthenticationV1Api(api)
        self.audiences = list(audiences or [])
        self.ttl = ttl
        self._cache: dict[str, tuple[float, Agent]] = {}
        self._lock = threading.Lock()

    def cached(self, authorization: str | None) -> Agent | None:
        """The agent of a token reviewed less than ``ttl`` seconds ago, else None (no I/O)."""
        _, _, token = (authorization or "").partition(" ")
        if not token.strip():
            return None
        key = hashlib.sha256(token.strip().encode()).hexdigest()
        with self._lock:
            hit = self._cache.get(key)
        return hit[1] if hit and hit[0] > time.monotonic() else None

    def review(self, authorization: str | None) -> Agent:
        """The agent behind an ``Authorization`` header value; raises :class:`Unauthenticated`."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("send your service-account token as 'Authorization: Bearer <token>'")
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        hit = self.cached(authorization)
        if hit is not None:
            return hit
        spec: dict = {"token": token}
        if self.audiences:
            spec["audiences"] = self.audiences
        review = apicalls.call(self.auth.create_token_review,  # a review changes nothing: safe to repeat
                               {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec})
        status = review.status
        if not status or not status.authenticated or not status.user or not status.user.username:
            why = (status.error if status and status.error else "the API server did not authenticate it")
            raise Unauthenticated(f"token refused: {why}")
        agent = Agent(status.user.username, status.user.uid or "", tuple(status.user.groups or ()))
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = (now + self.ttl, agent)
        return agent


class _GroupImpersonation(rest.RESTClientObject):
    """The client's REST layer, sending one ``Impersonate-Group`` header per group (the
    generated client keeps headers in a dict, which holds one value per name)."""

    def __init__(self, cfg: client.Configuration, groups: tuple[str, ...]):
        super().__init__(cfg)
        self.groups = groups

    def request(self, method, url, *args, headers=None, **kwargs):
        merged = HTTPHeaderDict(headers or {})
        for group in self.groups:
            merged.add("Impersonate-Group", group)
        return super().request(method, url, *args, headers=merged, **kwargs)


def impersonating_with_groups(cfg: client.Configuration, agent: Agent) -> client.ApiClient:
    """Like :func:`impersonating`, and also every group of ``agent`` (for users that are not
    service accounts, whose RBAC often comes from groups). Needs ``impersonate groups``."""
    api = impersonating(cfg, agent)
    groups = tuple(g for g in agent.groups if g != "system:authenticated")
    if groups:
        api.rest_client = _GroupImpersonation(api.configuration, groups)
    return api
