"""What recording at admission costs an agent's own kubectl write (docs/concepts.md#recording-with-no-agent-code).

    python benchmarks/kube_admission_bench.py [--writes 200]

One agent, a ServiceAccount with a token, on the local control plane with the operator and its admission
replicas running. A Run records the agent's writes in one namespace and not in another. The same write, a
merge patch of one ConfigMap's data, is made ``--writes`` times in each of two rows, alternating one write of
each:

- **plain**: in the namespace the Run does not record (the API server calls no webhook for it);
- **recorded**: in the namespace it records (the recording webhook records an ``intended`` kube.patch step
  before the write is stored; its outcome is settled afterwards, off the write's path).

Two tables: the write made by the ``kubectl`` binary (``kubectl patch``, a process per write: what an agent
that shells out pays) and by the official Python client over one kept-alive connection (the bare API cost,
the strict one). Each prints its rows' median and p90 wall time per write and the recorded row's ratio to
the plain one (target: at most 2x). Then it counts, from the RunSteps, the steps recorded and their
outcomes: every recorded write must have its step, settled ``succeeded``. Prints the machine's load.
Uses a running local control plane when there is one (``reversi-devcluster up``), else starts one and
stops it at the end; starts the operator and two admission replicas itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT))

from kubernetes import client, config  # noqa: E402

from reversi.adapters.journal import list_objects  # noqa: E402
from reversi.engine import kube  # noqa: E402
from reversi_devcluster.build import binary  # noqa: E402
from reversi_devcluster.cluster import Cluster  # noqa: E402
from reversi_devcluster.localop import OperatorProcess, apply_crds, remove_webhook_configurations  # noqa: E402
from tests.helpers import wait_for  # noqa: E402

G, V = "reversi.dev", "v1alpha1"
RULES = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]}]


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _agent(api: client.ApiClient, namespaces: list[str]) -> str:
    """The ServiceAccount ``agent`` of ``namespaces[0]``, with :data:`RULES` in each namespace; its token."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(namespaces[0], {"metadata": {"name": "agent"}})
    for ns in namespaces:
        rbac.create_namespaced_role(ns, {"metadata": {"name": "agent"}, "rules": RULES})
        rbac.create_namespaced_role_binding(ns, {
            "metadata": {"name": "agent"}, "subjects": [{"kind": "ServiceAccount", "name": "agent",
                                                         "namespace": namespaces[0]}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agent"}})
    return core.create_namespaced_service_account_token("agent", namespaces[0], {
        "spec": {"expirationSeconds": 7200}}).status.token


def _token_client(admin: client.ApiClient, token: str) -> client.ApiClient:
    conf = client.Configuration()
    conf.host, conf.ssl_ca_cert = admin.configuration.host, admin.configuration.ssl_ca_cert
    conf.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(conf)


def _kubeconfig(admin: client.ApiClient, token: str, folder: Path) -> Path:
    path = folder / "agent.kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "agent",
        "clusters": [{"name": "local", "cluster": {"server": admin.configuration.host,
                                                   "certificate-authority": admin.configuration.ssl_ca_cert}}],
        "users": [{"name": "agent", "user": {"token": token}}],
        "contexts": [{"name": "agent", "context": {"cluster": "local", "user": "agent"}}]}))
    return path


def _rows(write_plain, write_recorded, writes: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"plain": [], "recorded": []}
    for i in range(writes):
        for row, write in (("plain", write_plain), ("recorded", write_recorded)):
            t = time.perf_counter()
            write(i)
            times[row].append(time.perf_counter() - t)
    return times


def _print(title: str, times: dict[str, list[float]]) -> None:
    median = {row: statistics.median(t) for row, t in times.items()}
    print(title)
    for row, t in times.items():
        print(f"  {row:<8} median {median[row] * 1e3:7.2f} ms   p90 {statistics.quantiles(t, n=10)[-1] * 1e3:7.2f} ms")
    print(f"  recorded / plain, median: {median['recorded'] / median['plain']:.2f}x (target <= 2x; load average "
          f"{_load()})")


def bench(api: client.ApiClient, writes: int, kubectl: str) -> int:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    suffix = uuid.uuid4().hex[:6]
    recorded_ns, plain_ns = f"rec-{suffix}", f"plain-{suffix}"
    for ns in (recorded_ns, plain_ns):
        core.create_namespace({"metadata": {"name": ns}})
    folder = Path(tempfile.mkdtemp(prefix="kube-admission-bench-"))
    try:
        token = _agent(api, [recorded_ns, plain_ns])
        custom.create_namespaced_custom_object(G, V, recorded_ns, "toolmanifests", {
            "apiVersion": f"{G}/{V}", "kind": "ToolManifest", "metadata": {"name": "kube"},
            "spec": {"runners": [kube.runner_entry("registry.example/reversi:1", "kube-undo")],
                     "tools": kube.manifest_tools()}})
        for ns in (recorded_ns, plain_ns):
            core.create_namespaced_config_map(ns, {"metadata": {"name": "settings"}, "data": {"n": "0"}})
        custom.create_namespaced_custom_object(G, V, recorded_ns, "runs", {
            "apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": "bench"},
            "spec": {"manifestRef": {"name": "kube"}, "record": {"serviceAccount": "agent"}}})
        agent = client.CoreV1Api(_token_client(api, token))

        def patch(ns: str):
            return lambda i: agent.patch_namespaced_config_map("settings", ns, {"data": {"n": str(i)}})

        wait_for(lambda: (patch(recorded_ns)("warm-up"), list_objects(custom, recorded_ns, "bench"))[1], 30,
                 what="the agent's writes sent to the recording webhook")
        patch(plain_ns)("warm-up")
        print(f"an agent's write to a ConfigMap, recorded at admission against plain: {writes} writes per row "
              f"(load average {_load()}, {os.cpu_count()} CPUs)")
        _print("  the official Python client, one kept-alive connection:",
               _rows(patch(plain_ns), patch(recorded_ns), writes))
        kubeconfig = _kubeconfig(api, token, folder)

        def kubectl_patch(ns: str):
            return lambda i: subprocess.run(
                [kubectl, "--kubeconfig", str(kubeconfig), "-n", ns, "patch", "configmap", "settings", "--type",
                 "merge", "-p", json.dumps({"data": {"n": f"k{i}"}})], check=True, capture_output=True)

        _print("  kubectl patch, a process per write (what an agent that shells out pays):",
               _rows(kubectl_patch(plain_ns), kubectl_patch(recorded_ns), writes))
        expected = 2 * writes + 1  # and the warm-up write(s) before
        steps = wait_for(lambda: (lambda s: s if len(s) >= expected and all(x["spec"]["outcome"] != "intended"
                                                                          for x in s) else None)(
            list_objects(custom, recorded_ns, "bench")), 60, what="every recorded write settled")
        outcomes = Counter(s["spec"]["outcome"] for s in steps)
        print(f"  the Run's steps: {len(steps)} for {expected} recorded writes (with the warm-up ones); outcomes "
              f"{dict(outcomes)}")
        return 0 if outcomes.get("succeeded") == len(steps) and len(steps) >= expected else 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        for ns in (recorded_ns, plain_ns):
            core.delete_namespace(ns)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=200, help="writes per row")
    args = parser.parse_args(argv)
    cluster = Cluster()
    started = not cluster.is_running()
    if started:
        cluster.up()
    op = OperatorProcess(cluster.paths.admin_kubeconfig, cluster.paths.logs / "bench-operator.log",
                         webhook_port=19443)
    try:
        api = config.new_client_from_config(config_file=str(cluster.paths.admin_kubeconfig))
        apply_crds(api)
        op.start(timeout=90)
        kubectl = str(binary("kubernetes", "kubectl"))
        return bench(api, args.writes, kubectl)
    finally:
        op.stop()
        remove_webhook_configurations(config.new_client_from_config(config_file=str(cluster.paths.admin_kubeconfig)))
        if started:
            cluster.down()


if __name__ == "__main__":
    sys.exit(main())
