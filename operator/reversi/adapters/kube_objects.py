"""Reads and writes of any namespaced Kubernetes object, for the built-in Kubernetes family
(docs/concepts.md#built-in-kubernetes-compensation): the SDK's ``rec.kube`` records an agent's
writes with them, and ``reversi-kube-runner`` undoes and reads them back.

An object is named by its reference ``{"apiVersion", "kind", "namespace", "name"}``
(:func:`reversi.engine.kube.object_ref`). The kubernetes client's dynamic client finds its
resource by discovery; every request it sends, discovery too, carries
:data:`~reversi.adapters.apicalls.TIMEOUT` and goes through :func:`~reversi.adapters.apicalls.call`
(reads and preconditioned writes retried on transient errors, others only when unsent).

Errors: ``ApiException`` (the dynamic client's subclasses) for the server's verdicts;
:class:`~reversi.adapters.apicalls.Conflict` when a write with a precondition (a
``resourceVersion`` or a ``uid``) lost a race; :class:`UnknownKind` when the API server serves
no such kind.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from . import apicalls

#: the content type of a server-side apply
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"


class UnknownKind(Exception):
    """The API server serves no such kind (a CRD not installed, a misspelt apiVersion or kind)."""


class _TimedDynamicClient(DynamicClient):
    """The dynamic client with :data:`apicalls.TIMEOUT` on every request it sends (discovery too)."""

    def request(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        params.setdefault("_request_timeout", apicalls.TIMEOUT)
        return super().request(method, path, body, **params)


class Objects:
    """Namespaced objects of any kind through one API client ``api`` (``kubernetes.client.ApiClient``),
    every write under the field manager ``field_manager`` (server-side apply's owner of the fields it
    sets: one name for all of a writer's writes, so its own apply never conflicts with its patches).
    Discovery runs on first use and is kept for the process (thread-safe)."""

    def __init__(self, api: client.ApiClient, field_manager: str):
        self.api = api
        self.field_manager = field_manager
        self._dynamic: DynamicClient | None = None
        self._lock = threading.Lock()

    def _resource(self, ref: Mapping[str, Any]) -> Any:
        with self._lock:
            if self._dynamic is None:
                # discovery: its requests carry the timeout (the class above), the policy retries them
                self._dynamic = apicalls.call(lambda **_: _TimedDynamicClient(self.api))
        try:
            if "kind" not in ref and "resource" in ref:  # named by its resource (a subresource's parent)
                resource = self._dynamic.resources.get(api_version=ref["apiVersion"], name=ref["resource"])
            else:
                resource = self._dynamic.resources.get(api_version=ref["apiVersion"], kind=ref["kind"])
        except ResourceNotFoundError as err:
            raise UnknownKind(f"the API server serves no {ref.get('kind') or ref.get('resource')} in "
                              f"{ref['apiVersion']}: check the apiVersion "
                              "and kind (a custom resource needs its CRD installed)") from err
        if not resource.namespaced:
            raise UnknownKind(f"{ref.get('kind') or ref.get('resource')} is cluster-scoped: the built-in "
                              "Kubernetes family records namespaced objects only")
        return resource

    def allowed(self, user: str, groups: list[str], verb: str, ref: Mapping[str, Any]) -> bool:
        """Whether ``user`` (with ``groups``) may ``verb`` the object ``ref``: a
        LocalSubjectAccessReview in the object's namespace (the RBAC verb ``create`` on
        ``localsubjectaccessreviews`` there, nothing cluster-wide)."""
        resource = self._resource(ref)
        group = ref["apiVersion"].rpartition("/")[0]
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview",
                  "metadata": {"namespace": ref["namespace"]},
                  "spec": {"user": user, "groups": groups, "resourceAttributes": {
                      "namespace": ref["namespace"], "verb": verb, "group": group, "resource": resource.name,
                      "name": ref["name"]}}}
        answer = apicalls.call(client.AuthorizationV1Api(self.api).create_namespaced_local_subject_access_review,
                               ref["namespace"], review)
        return bool(answer.status and answer.status.allowed)

    def get(self, ref: Mapping[str, Any]) -> dict | None:
        """The object as stored (a dict), or None when it does not exist."""
        resource = self._resource(ref)
        try:
            obj = apicalls.call(resource.get, name=ref["name"], namespace=ref["namespace"])
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return obj.to_dict()

    def first_change(self, ref: Mapping[str, Any], resource_version: str, seconds: int) -> tuple[dict | None, bool]:
        """The first version of the object ``ref`` stored after ``resource_version``, waited for up to
        ``seconds`` (one WATCH from that version, narrowed to the name): ``(object, deleted)``, ``deleted``
        when that version is its deletion; ``(None, False)`` when none came. Raises ``ApiException`` (410
        when that version is no longer in the API server's window)."""
        resource = self._resource(ref)
        watcher = watch.Watch()
        try:
            for event in resource.watch(namespace=ref["namespace"], field_selector=f"metadata.name={ref['name']}",
                                        resource_version=resource_version, timeout=max(1, seconds),
                                        watcher=watcher):
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    return dict(event.get("raw_object") or {}), event["type"] == "DELETED"
        finally:
            watcher.stop()
        return None, False

    def create(self, body: Mapping[str, Any], *, repeat: apicalls.Repeat = "unsent") -> dict:
        """Create ``body`` in its namespace; returns the stored object."""
        resource = self._resource(body)
        obj = apicalls.call(resource.create, body=dict(body), namespace=body["metadata"]["namespace"], repeat=repeat,
                            field_manager=self.field_manager)
        return obj.to_dict()

    def replace(self, body: Mapping[str, Any]) -> dict:
        """Replace the object with ``body``, whose ``metadata.resourceVersion`` is the
        precondition: raises :class:`apicalls.Conflict` when the object changed since."""
        resource = self._resource(body)
        meta = body["metadata"]
        return self._preconditioned(resource.replace, body=dict(body), name=meta["name"],
                                    namespace=meta["namespace"], field_manager=self.field_manager)

    def merge_patch(self, ref: Mapping[str, Any], patch: Mapping[str, Any], resource_version: str = "", *,
                    repeat: apicalls.Repeat = "always") -> dict:
        """A JSON merge patch; with ``resource_version`` it is a precondition (:class:`apicalls.Conflict`).
        ``repeat``: ``"unsent"`` for a caller that must tell its own landed write from a lost race."""
        body = dict(patch)
        if resource_version:
            body["metadata"] = {**(body.get("metadata") or {}), "resourceVersion": resource_version}
        return self._preconditioned(self._resource(ref).patch, body=body, name=ref["name"],
                                    namespace=ref["namespace"], content_type=MERGE_PATCH, repeat=repeat,
                                    field_manager=self.field_manager)

    def apply(self, body: Mapping[str, Any], *, force: bool = False, resource_version: str = "",
              repeat: apicalls.Repeat = "always") -> dict:
        """Server-side apply of ``body`` (``force`` takes fields another manager owns), conditioned on
        ``resource_version`` when given (:class:`apicalls.Conflict`); returns the stored object."""
        resource = self._resource(body)
        meta = body["metadata"]
        sent = {**body, "metadata": {**meta, "resourceVersion": resource_version}} if resource_version else dict(body)
        return self._preconditioned(resource.server_side_apply, body=sent, name=meta["name"],
                                    namespace=meta["namespace"], field_manager=self.field_manager,
                                    force_conflicts=force,
                                    repeat=repeat)

    def delete(self, ref: Mapping[str, Any], *, uid: str = "", resource_version: str = "",
               repeat: apicalls.Repeat = "always") -> bool:
        """Delete the object (background propagation, as ``kubectl delete``), with a ``uid``
        and/or ``resource_version`` precondition (:class:`apicalls.Conflict` when it does not
        hold). False when it did not exist at the first attempt; a 404 on a repeated attempt
        (the first failed on the way) means it was deleted: True."""
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background",
                **({"preconditions": preconditions} if preconditions else {})}
        resource = self._resource(ref)
        tries = 0

        def once(**kw: Any) -> Any:
            nonlocal tries
            tries += 1
            return resource.delete(name=ref["name"], namespace=ref["namespace"], body=body, **kw)

        try:
            self._preconditioned(once, repeat=repeat)
        except ApiException as err:
            if err.status == 404:
                return tries > 1
            raise
        return True

    @staticmethod
    def _preconditioned(method: Any, repeat: apicalls.Repeat = "always", **kwargs: Any) -> dict:
        try:
            obj = apicalls.call(method, repeat=repeat, **kwargs)
        except ApiException as err:
            if apicalls.conflict(err):
                raise apicalls.Conflict(apicalls.api_message(err), err) from err
            raise
        return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj or {})
