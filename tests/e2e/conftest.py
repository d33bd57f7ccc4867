"""The real-node tier: Reversi installed as users install it, on a real kubelet with containerd.

One local control plane with a real node (:mod:`reversi_devcluster.realnode`) serves the whole
tier: the operator runs from its image, installed by the Helm chart in a namespace that enforces
the restricted Pod Security Standard; each test gets a restricted namespace of its own with the
demo's downstream system (a Deployment of the demo image behind a Service), so what a compensator
really did is counted there (its calls, per idempotency key), not taken from the operator.

The tier is one test file (one pytest-xdist worker: a machine runs one real node). It is skipped,
with the reason, where the machine cannot run containers. Its cluster lives in
``<cache>/cluster-real`` on its own ports (``REVERSI_E2E_*``), apart from the workers' clusters;
``REVERSI_REUSE_CLUSTER=1`` reuses a running one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client, config

from demo import on_real_node
from demo.downstream.client import Client
from reversi_devcluster import build, images, realnode
from reversi_devcluster.cluster import Cluster, ClusterSettings
from tests.helpers import wait_for

G, V = "reversi.dev", "v1alpha1"


def real_settings() -> ClusterSettings:
    """The tier's cluster: its own folder, ports, bridge and pod addresses."""
    env = os.environ.get
    return ClusterSettings(
        real_node=True, cluster_dir=build.cache_root() / "cluster-real",
        apiserver_port=int(env("REVERSI_E2E_APISERVER_PORT", "16643")),
        etcd_port=int(env("REVERSI_E2E_ETCD_PORT", "12679")),
        etcd_peer_port=int(env("REVERSI_E2E_ETCD_PEER_PORT", "12680")),
        kubelet_port=int(env("REVERSI_E2E_KUBELET_PORT", "20650")),
        node_bridge="reversi-e2e", node_pod_cidr="10.244.100.0/24")


@pytest.fixture(scope="session")
def real_cluster():
    """The control plane with a real node, started for the tier and stopped after it."""
    why = realnode.unsupported()
    if why:
        pytest.skip(f"no real node on this machine: {why}")
    c = Cluster(real_settings())
    reuse = os.environ.get("REVERSI_REUSE_CLUSTER") == "1" and c.is_running()
    c.up()  # a running one gets this checkout's images
    yield c
    if not reuse:
        c.down()


@pytest.fixture(scope="session")
def real_api(real_cluster) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(real_cluster.paths.admin_kubeconfig))


def kubectl_reversi(real_cluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``kubectl reversi ARGS`` (as ``python -m reversi.entrypoints.plugin``) with the admin kubeconfig."""
    return subprocess.run([sys.executable, "-m", "reversi.entrypoints.plugin", "--kubeconfig",
                           str(real_cluster.paths.admin_kubeconfig), *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="session")
def pre_check(real_cluster) -> subprocess.CompletedProcess:
    """``kubectl reversi check --pre`` as it ran on the cluster before the chart's install (``release`` asks
    for it first)."""
    return kubectl_reversi(real_cluster, "check", "--pre")


@pytest.fixture(scope="session")
def release(real_cluster, real_api, pre_check):
    """The operator installed by its chart with its image (fast ticks for the tests), once ``kubectl reversi check
    --pre`` has checked the cluster (``pre_check``)."""
    on_real_node.install_chart(real_api, real_cluster.paths.admin_kubeconfig, {"operator": {"tickSeconds": 0.5}})
    yield on_real_node.RELEASE
    if os.environ.get("REVERSI_REUSE_CLUSTER") == "1":
        on_real_node.uninstall_chart(real_cluster.paths.admin_kubeconfig, real_api)


@dataclass
class Shop:
    """One test's restricted namespace with its downstream system, and how to use it."""

    namespace: str
    url: str
    api: client.ApiClient

    @property
    def by_name(self) -> str:
        """The downstream's URL by its Service's DNS name: how the runners (in pods) reach it."""
        return on_real_node.downstream_by_name(self.namespace)

    @property
    def downstream(self) -> Client:
        return Client(self.url, timeout=10)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def runner(self, name: str = "shop", **extra: Any) -> dict:
        """A runner of the demo image that runs the demo tool against this downstream, reached by
        its Service's name through the cluster DNS (as users write their runners)."""
        return {"name": name, "image": images.DEMO_IMAGE, "command": on_real_node.TOOL_COMMAND,
                "env": [{"name": "DOWNSTREAM_URL", "value": self.by_name}], "deadlineSeconds": 60, **extra}

    def manifest(self, runners: list[dict], compensator: str = "shop", reader: str | None = "shop") -> None:
        """ToolManifest ``tools``: a charge undone by a refund (``compensator``), checked by a
        read of the charge (``reader``; None: no read-back declared)."""
        charge: dict[str, Any] = {
            "name": "payments.create_charge", "effect": "write", "idempotencyKey": "$args.order_id",
            "compensation": {"tool": "payments.refund", "kind": "compensation",
                             "args": {"charge_id": "$result.id", "amount": "$args.amount"}, "runner": compensator}}
        if reader is not None:
            charge["verification"] = {"tool": "payments.get_charge", "args": {"charge_id": "$result.id"},
                                      "expect": {"refunded": True}, "runner": reader}
        body = {"apiVersion": f"{G}/{V}", "kind": "ToolManifest", "metadata": {"name": "tools"}, "spec": {
            "runners": runners, "tools": [charge]}}
        self.custom.create_namespaced_custom_object(G, V, self.namespace, "toolmanifests", body)

    def charge_in_a_run(self, run: str, order: str, amount: int = 700) -> dict:
        """A real charge, recorded through the SDK as step 0 of Run ``run``; returns the charge."""
        from reversi.sdk import Recorder

        rec = Recorder.open(self.namespace, run, manifest="tools", api=self.api)
        return rec.call("payments.create_charge", {"order_id": order, "amount": amount, "customer": "cus_9"},
                        lambda a: self.downstream.create_charge(a["order_id"], a["amount"], a["customer"],
                                                               idempotency_key=a["order_id"]))

    def roll_back(self, run: str, **spec: Any) -> str:
        name = f"undo-{run}"
        self.custom.create_namespaced_custom_object(G, V, self.namespace, "rollbackrequests", {
            "apiVersion": f"{G}/{V}", "kind": "RollbackRequest", "metadata": {"name": name},
            "spec": {"runRef": {"name": run}, **spec}})
        return name

    def request(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(G, V, self.namespace, "rollbackrequests", name)

    def wait_final(self, name: str, timeout: float = 180) -> dict:
        final = ("Succeeded", "Incomplete", "Failed")
        wait_for(lambda: (self.request(name).get("status") or {}).get("phase") in final, timeout=timeout,
                 what=f"RollbackRequest {self.namespace}/{name} to finish")
        return self.request(name)

    def step_status(self, name: str, step: int) -> dict:
        return next(s for s in self.request(name)["status"].get("steps") or [] if s["step"] == step)

    def refunds(self, charge_id: str) -> list[dict]:
        """The refunds the downstream really made of ``charge_id`` (never a replay)."""
        state = self.downstream.state()
        return [r for r in state["refunds"].values() if r["charge_id"] == charge_id]

    def pods(self, **labels: str) -> list[Any]:
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        return client.CoreV1Api(self.api).list_namespaced_pod(self.namespace, label_selector=selector).items


@pytest.fixture
def shop(request, real_api, release) -> Shop:
    """A fresh restricted namespace with the downstream system (deleted after the test)."""
    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    on_real_node.recreate_namespace(real_api, name, on_real_node.RESTRICTED)
    url = on_real_node.deploy_downstream(real_api, name)
    yield Shop(name, url, real_api)
    client.CoreV1Api(real_api).delete_namespace(name, propagation_policy="Background")


def describe(shop: Shop, name: str) -> str:
    """What the request says, for an assertion's message."""
    return json.dumps((shop.request(name).get("status") or {}), indent=1, default=str)[:4000]


