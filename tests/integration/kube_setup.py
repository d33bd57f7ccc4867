"""What the built-in Kubernetes family's cluster tests share (docs/concepts.md#built-in-kubernetes-compensation):
the runner's ServiceAccount and rights, the family's ToolManifest, and the objects the agents change."""

from __future__ import annotations

import sys
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from reversi.engine import kube

G, V = "reversi.dev", "v1alpha1"
RUNNER_SA = "kube-undo"
#: the rights the namespace's owner grants the runner: what it restores, nothing cluster-wide
RUNNER_RULES = [
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "create", "update", "delete"]},
    {"apiGroups": [""], "resources": ["configmaps", "services"], "verbs": ["get", "create", "update", "delete"]},
    # whose run and step it restores, and whether that principal may make the write itself
    {"apiGroups": ["reversi.dev"], "resources": ["runs", "runsteps"], "verbs": ["get"]},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["localsubjectaccessreviews"], "verbs": ["create"]},
]


def bind(api: client.ApiClient, namespace: str, name: str, rules: list[dict], subject: dict) -> None:
    """A Role ``name`` with ``rules`` in ``namespace``, bound to ``subject``."""
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": name}, "subjects": [subject],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}})


def install_family(rv: Any) -> None:
    """The runner's ServiceAccount with :data:`RUNNER_RULES`, and the family's ToolManifest ``kube`` whose
    runner is this checkout's module (on the node agent the image is ignored)."""
    client.CoreV1Api(rv.api).create_namespaced_service_account(rv.ns, {"metadata": {"name": RUNNER_SA}})
    bind(rv.api, rv.ns, RUNNER_SA, RUNNER_RULES, {"kind": "ServiceAccount", "name": RUNNER_SA, "namespace": rv.ns})
    runner = kube.runner_entry("registry.example/reversi:1", RUNNER_SA,
                               command=[sys.executable, "-m", "reversi.entrypoints.kube_runner"], deadline_seconds=60)
    rv.create("toolmanifests", {"apiVersion": f"{G}/{V}", "kind": "ToolManifest", "metadata": {"name": "kube"},
                                "spec": {"runners": [runner], "tools": kube.manifest_tools()}})


def deployment(ns: str, replicas: int) -> dict:
    labels = {"app": "web"}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": ns},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "web", "image": "registry.example/web:1",
                                                           "command": ["sleep", "600"]}]}}}}


def gone(read: Any, *args: Any) -> bool:
    """Whether ``read(*args)`` answers 404."""
    try:
        read(*args)
    except ApiException as err:
        return err.status == 404
    return False
