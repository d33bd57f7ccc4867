"""Other ways to install the chart, on the local control plane: watching some namespaces (write
access through RoleBindings) with its replicas' Lease, and without webhooks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from reversi_devcluster.localop import free_port
from tests.chart.chartkit import find, permission_errors, undo_an_order
from tests.helpers import wait_for
from tests.integration.conftest import RV

pytestmark = pytest.mark.cluster


def test_namespaced_release_with_two_replicas_undoes_a_run_in_its_namespace(installed, admin_api, namespace,
                                                                             downstream, kubectl):
    """watchNamespaces: the operator's namespaced rights come from a RoleBinding in the watched
    namespace only; its two replicas elect one through the Lease <fullname>-operator in the release
    namespace (docs/operations.md#leader-election), which names a pod. It logs no missing
    permission and undoes a run there."""
    downstream.post("/_reset", {})
    with installed(watchNamespaces=[namespace], replicaCount=2) as rel:
        sa = f"system:serviceaccount:{rel.namespace}:{rel.fullname}"
        for ns, allowed in ((namespace, "yes"), ("default", "no")):
            out = rel.kubectl_cmd("auth", "can-i", "create", "jobs.batch", "--as", sa, "-n", ns, check=False)
            assert out.stdout.strip() == allowed, f"create jobs in {ns}: {out.stdout}{out.stderr}"

        def holder() -> str | None:
            out = rel.kubectl_cmd("get", "lease", f"{rel.fullname}-operator", "-n", rel.namespace, "-o", "json",
                                  check=False)
            return (json.loads(out.stdout).get("spec") or {}).get("holderIdentity") if out.returncode == 0 else None

        pod = wait_for(holder, timeout=60, what="a replica to hold the operator's Lease")
        assert pod.startswith(rel.fullname + "-"), pod
        done, charge, _ = undo_an_order(RV(admin_api, namespace, downstream), "o-chart-ns")
        assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"], indent=1)[:3000]
        assert downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
        bad = permission_errors(rel.logs())
        assert not bad, "\n".join(bad[:20])


def test_operator_runs_with_the_environment_of_a_release_without_webhooks(render, cluster, crds):
    """webhook.enabled=false: the operator, started with exactly the chart's environment, keeps
    running and serves /metrics."""
    metrics_port, health_port = free_port(), free_port()
    objs = render({"webhook": {"enabled": False}, "metrics": {"port": metrics_port},
                   "probes": {"healthPort": health_port}})
    container = find(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert not any(name.startswith("REVERSI_WEBHOOK") for name in env)
    log = cluster.paths.logs / "operator-no-webhooks.log"
    with log.open("ab") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "reversi.entrypoints.operator",
                                 "--kubeconfig", str(cluster.paths.admin_kubeconfig)],
                                env={**os.environ, **env, "PYTHONUNBUFFERED": "1"}, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    def metrics() -> bytes | None:
        assert proc.poll() is None, f"the operator exited with {proc.returncode}; see {log}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
                return resp.read()
        except OSError:
            return None

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/healthz", timeout=5) as resp:
                return resp.status == 200
        except OSError:
            return False

    try:
        # kopf's liveness endpoint answers only once its watches and handlers run
        wait_for(healthy, timeout=60, what="the operator without webhooks to report itself alive")
        assert b"reversi_rollbacks_total" in wait_for(metrics, timeout=30, what="/metrics to answer")
        assert proc.poll() is None, f"the operator exited with {proc.returncode}; see {log}"
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)
