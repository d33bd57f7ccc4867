"""Reversi installed as users install it, on the local control plane's real node: the operator by
its Helm chart with its image, the demo's downstream system as a Deployment of the demo image
behind a Service. Shared by the demo (demo/run_demo.py) and the real-node tests (tests/e2e).

Every function raises ``RuntimeError`` saying what did not come up, or ``ApiException``.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from reversi_devcluster import build, images, realnode
from reversi_devcluster.cluster import ClusterError

REPO = Path(__file__).resolve().parents[1]
G, V = "reversi.dev", "v1alpha1"
#: the namespace and release of the operator
SYSTEM_NS = "reversi-system"
RELEASE = "reversi"
#: labels of a namespace that enforces the restricted Pod Security Standard
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}
#: the demo tool's command in the demo image (the Dockerfile's demo target)
TOOL_COMMAND = ["python", "/opt/reversi/demo/tool.py"]


def recreate_namespace(api: client.ApiClient, name: str, labels: dict[str, str]) -> None:
    """Delete namespace ``name`` (and wait until it is gone), then create it with ``labels``."""
    core = client.CoreV1Api(api)
    try:
        core.delete_namespace(name)
        while True:
            core.read_namespace(name)
            time.sleep(0.5)
    except ApiException:
        pass
    core.create_namespace({"metadata": {"name": name, "labels": labels}})


def install_chart(api: client.ApiClient, kubeconfig: Path, values: dict[str, Any] | None = None) -> float:
    """Install the chart (release :data:`RELEASE`) with the operator image built here into
    :data:`SYSTEM_NS`, a namespace that enforces the restricted Pod Security Standard; ``values``
    are more values (``{"operator": {"tickSeconds": 0.5}}``). Returns the seconds it took, once
    the API server reaches the webhooks through their Service."""
    helm = build.build(["helm"])["helm"].path("helm")
    recreate_namespace(api, SYSTEM_NS, RESTRICTED)
    repository, tag = images.OPERATOR_IMAGE.rsplit(":", 1)
    started = time.monotonic()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        json.dump({"image": {"repository": repository, "tag": tag}, **(values or {})}, file)  # JSON is YAML
        file.flush()
        out = subprocess.run([str(helm), "install", RELEASE, str(REPO / "charts/reversi"), "--namespace", SYSTEM_NS,
                              "--kubeconfig", str(kubeconfig), "--values", file.name, "--wait", "--timeout", "180s"],
                             capture_output=True, text=True, timeout=240)
    if out.returncode != 0:
        raise RuntimeError(f"helm install of the chart failed: {out.stderr.strip()}")
    probe = {"apiVersion": f"{G}/{V}", "kind": "ClusterHalt", "metadata": {"name": "webhook-probe"},
             "spec": {"reason": "probe", "by": "reversi"}}
    deadline = time.monotonic() + 60
    while True:
        try:
            client.CustomObjectsApi(api).create_cluster_custom_object(G, V, "clusterhalts", probe, dry_run="All")
            return time.monotonic() - started
        except ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def upgrade_chart(kubeconfig: Path, values: dict[str, Any]) -> float:
    """``helm upgrade`` of the release with ``values`` over the ones it has (``--reuse-values``);
    returns the seconds it took, once every Deployment that changed has rolled out (``--wait``)."""
    helm = build.build(["helm"])["helm"].path("helm")
    started = time.monotonic()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        json.dump(values, file)
        file.flush()
        out = subprocess.run([str(helm), "upgrade", RELEASE, str(REPO / "charts/reversi"), "--namespace", SYSTEM_NS,
                              "--kubeconfig", str(kubeconfig), "--reuse-values", "--values", file.name, "--wait",
                              "--timeout", "180s"], capture_output=True, text=True, timeout=240)
    if out.returncode != 0:
        raise RuntimeError(f"helm upgrade of the chart failed: {out.stderr.strip()}")
    return time.monotonic() - started


def uninstall_chart(kubeconfig: Path, api: client.ApiClient) -> None:
    """Uninstall the release (its webhook configurations go with it) and delete its namespace."""
    subprocess.run([str(build.binary("helm")), "uninstall", RELEASE, "--namespace", SYSTEM_NS, "--wait",
                    "--timeout", "120s", "--kubeconfig", str(kubeconfig)], capture_output=True, timeout=180)
    try:
        client.CoreV1Api(api).delete_namespace(SYSTEM_NS)
    except ApiException:
        pass


def deploy_downstream(api: client.ApiClient, namespace: str, timeout: float = 120) -> str:
    """The downstream system (demo/downstream/server.py) in ``namespace``, as demo/downstream.yaml
    (the same file docs/operations.md applies on kind): see :func:`deploy_service`. Pods reach it
    by name: :func:`downstream_by_name`."""
    return deploy_service(api, namespace, "downstream", None, 8080, timeout)


def downstream_by_name(namespace: str) -> str:
    """The downstream's URL by its Service's DNS name (``http://downstream.<namespace>.svc:8080``),
    the way a user's runner reaches it from a pod (the cluster DNS; not from this machine)."""
    return f"http://downstream.{namespace}.svc:8080"


def deploy_mcp_shop(api: client.ApiClient, namespace: str, timeout: float = 120) -> str:
    """The MCP shop (demo/mcp_shop/server.py) in ``namespace``; returns its MCP endpoint's URL
    (from this machine; pods: :func:`mcp_shop_by_name`)."""
    url = deploy_service(api, namespace, "mcp-shop", ["python", "/opt/reversi/demo/mcp_shop.py", "--host", "0.0.0.0",
                                                      "--port", "8000"], 8000, timeout)
    return url + "/mcp"


def mcp_shop_by_name(namespace: str) -> str:
    """The MCP shop's endpoint by its Service's DNS name, for pods (``http://mcp-shop.<namespace>.svc:8000/mcp``)."""
    return f"http://mcp-shop.{namespace}.svc:8000/mcp"


def service_objects(name: str, command: list[str] | None, port: int) -> tuple[dict, dict]:
    """The Deployment and Service of demo/downstream.yaml (the demo image filled in), renamed ``name``,
    running ``command`` (None: the downstream server's own) on ``port``."""
    text = (REPO / "demo/downstream.yaml").read_text().replace("${IMAGE}", images.DEMO_IMAGE)
    deployment, service = yaml.safe_load_all(text)
    labels = {"app": name}
    deployment["metadata"]["name"] = service["metadata"]["name"] = name
    deployment["spec"]["selector"]["matchLabels"] = service["spec"]["selector"] = labels
    template = deployment["spec"]["template"]
    template["metadata"]["labels"] = labels
    (container,) = template["spec"]["containers"]
    if command is not None:
        container["command"] = command
        container["ports"] = [{"containerPort": port}]
        container["readinessProbe"]["tcpSocket"]["port"] = port
        service["spec"]["ports"] = [{"port": port, "targetPort": port}]
    return deployment, service


def deploy_service(api: client.ApiClient, namespace: str, name: str, command: list[str] | None, port: int,
                   timeout: float = 120) -> str:
    """``command`` in the demo image as Deployment ``name`` behind a Service of the same name in
    ``namespace`` (restricted; :func:`service_objects`); returns its base URL for this machine, by the
    Service's cluster IP (kube-proxy routes it; this machine does not use the cluster DNS), once its
    ``/_state`` answers. Pods reach it by name, ``http://<name>.<namespace>.svc:<port>``."""
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    deployment, service = service_objects(name, command, port)
    apps.create_namespaced_deployment(namespace, deployment)
    svc = core.create_namespaced_service(namespace, service)
    deadline = time.monotonic() + timeout
    while (apps.read_namespaced_deployment(name, namespace).status.ready_replicas or 0) < 1:
        if time.monotonic() > deadline:
            raise RuntimeError(f"Deployment {namespace}/{name} did not become ready in {timeout:.0f} s")
        time.sleep(0.5)
    url = f"http://{svc.spec.cluster_ip}:{port}"
    while True:  # kube-proxy routes the Service a moment after its endpoint is ready
        try:
            with urllib.request.urlopen(url + "/_state", timeout=2):
                return url
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Service {namespace}/{name} at {url} did not answer in {timeout:.0f} s") from None
            time.sleep(0.25)


def choose_node(wanted: str) -> bool:
    """Whether the demo runs on a real node: ``wanted`` is ``real``, ``agent`` or ``auto`` (real
    where this machine can run one: the node's Debian packages are installed first where they are
    missing and can be, in one line; else one line says why and what to run, and the node agent is
    used). Raises :class:`ClusterError` when ``real`` is asked for and cannot be had."""
    if wanted == "agent":
        print("  (on the node agent, as asked: pods run as local processes, without their images)", flush=True)
        return False
    why = realnode.make_ready(log=build.progress)
    if why is None:
        print("  (on a real node: kubelet and containerd run the pods in containers of the images built here)",
              flush=True)
        return True
    if wanted == "real":
        raise ClusterError(f"no real node on this machine: {why}")
    print(f"  (no real node here: {why}; the demo runs on the node agent instead, which --node agent chooses "
          "without trying)", flush=True)
    return False


def clock(seconds: float) -> str:
    """``4m05s`` (or ``38s``) for a duration in seconds."""
    whole = int(seconds)
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"

