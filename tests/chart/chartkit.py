"""Helpers of the chart tests: rendering the chart, and a release on the local control plane.

See conftest.py for the fixtures and for how a release is made to work on the local control plane.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "reversi"
HERE = Path(__file__).resolve().parent
KUBE_VERSION = "1.36.3"


def run(cmd: list[Any], *, input: str | None = None, check: bool = True, timeout: float = 300,
        env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a command; on failure the assertion shows the command and its output."""
    proc = subprocess.run([str(c) for c in cmd], input=input, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if check:
        assert proc.returncode == 0, (f"`{' '.join(str(c) for c in cmd)}` exited {proc.returncode}\n"
                                      f"stdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-6000:]}")
    return proc


def write_values(tmp_path: Path, values: dict, name: str = "values.yaml") -> Path:
    path = tmp_path / f"{uuid.uuid4().hex[:6]}-{name}"
    path.write_text(yaml.safe_dump(values))
    return path


class Renderer:
    """``helm template`` of the chart; returns the rendered objects."""

    def __init__(self, helm: Path, tmp_path: Path):
        self.helm = helm
        self.tmp_path = tmp_path

    def text(self, values: dict | None = None, *, release: str = "rv", namespace: str = "reversi-system",
             extra: list[str] | None = None) -> str:
        cmd = [self.helm, "template", release, CHART, "--namespace", namespace, "--kube-version", KUBE_VERSION,
               *(extra or [])]
        if values:
            cmd += ["--values", write_values(self.tmp_path, values)]
        return run(cmd).stdout

    def __call__(self, values: dict | None = None, **kwargs: Any) -> list[dict]:
        return [d for d in yaml.safe_load_all(self.text(values, **kwargs)) if d]

    def errors(self, values: dict) -> str:
        """Render values the chart must refuse; return helm's error text."""
        proc = run([self.helm, "template", "rv", CHART, "--kube-version", KUBE_VERSION,
                    "--values", write_values(self.tmp_path, values)], check=False)
        assert proc.returncode != 0, f"helm accepted values it should refuse: {values}"
        return proc.stderr


def find(objs: list[dict], kind: str, name: str | None = None) -> dict:
    hits = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in hits]}"
    return hits[0]


#: values that turn every optional feature of the chart on
ALL_FEATURES: dict[str, Any] = {
    "replicaCount": 2,
    "leaderElection": {"leaseSeconds": 20, "renewDeadlineSeconds": 12, "retryPeriodSeconds": 3},
    "watchNamespaces": ["shop", "billing"],
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
                "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"},
                                   "alertLabels": {"team": "payments"}}},
    "dashboard": {"enabled": True, "annotations": {"grafana_folder": "Reversi"}},
    "webhook": {"certManager": {"enabled": True}, "namespaceSelector": {
        "matchExpressions": [{"key": "reversi.dev/webhooks", "operator": "NotIn", "values": ["off"]}]}},
    "operator": {"verbose": True, "extraEnv": [{"name": "REVERSI_TICK_SECONDS", "value": "2"}]},
    "podAnnotations": {"example.com/team": "payments"},
    "journalQuota": {"namespaces": ["shop"], "runsteps": 5000},
    "priorityClassName": "system-cluster-critical",
}


# --------------------------------------------------------------------------- the live release

class Release:
    """A release of the chart on the local control plane."""

    def __init__(self, helm: Path, kubectl: Path, kubeconfig: Path, tmp_path: Path, name: str, namespace: str,
                 values: dict, chart: Path = CHART):
        self.helm, self.kubectl, self.kubeconfig = helm, kubectl, kubeconfig
        self.chart = chart
        self.tmp_path, self.name, self.namespace = tmp_path, name, namespace
        self.values = values
        self.fullname = name if "reversi" in name else f"{name}-reversi"
        self.metrics_port = values["metrics"]["port"]
        self.webhook_port = values["webhook"]["port"]

    def helm_cmd(self, *args: Any, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        return run([self.helm, *args, "--kubeconfig", self.kubeconfig], timeout=timeout, check=check)

    def kubectl_cmd(self, *args: Any, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return run([self.kubectl, "--kubeconfig", self.kubeconfig, *args], check=check, input=input)

    def install(self, *, upgrade: bool = False) -> None:
        if not upgrade:
            # the operator's namespace enforces the restricted Pod Security Standard: its pod is
            # admitted only if the chart's security contexts meet it
            ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace, "labels": {
                "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}}}
            self.kubectl_cmd("apply", "-f", "-", input=json.dumps(ns))
        verb = ["upgrade", "--install"] if upgrade else ["install"]
        self.helm_cmd(*verb, self.name, self.chart, "--namespace", self.namespace,
                      "--values", write_values(self.tmp_path, self.values), "--wait", "--timeout", "180s",
                      timeout=240)
        self.wait_ready()

    def uninstall(self, check: bool = True) -> None:
        self.helm_cmd("uninstall", self.name, "--namespace", self.namespace, "--wait", "--timeout", "120s",
                      check=check)

    def operator_pods(self) -> list[dict]:
        """The operator's pods (every replica), not being deleted."""
        out = self.kubectl_cmd("get", "pods", "-n", self.namespace, "-o", "json", "-l",
                               f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component=operator")
        return [p for p in json.loads(out.stdout)["items"] if not p["metadata"].get("deletionTimestamp")]

    def pod(self) -> dict:
        """The operator pod at work: the only one, or the one named by the release's Lease
        (docs/operations.md#leader-election); waits up to 60 s for a replica to hold it."""
        def at_work() -> dict | None:
            pods = self.operator_pods()
            if len(pods) == 1:
                return pods[0]
            holder = self.kubectl_cmd("get", "lease", "-n", self.namespace, f"{self.fullname}-operator", "-o",
                                      "jsonpath={.spec.holderIdentity}", check=False).stdout.strip()
            return next((p for p in pods if p["metadata"]["name"] == holder), None)
        return wait_for(at_work, timeout=60, what=f"an operator pod of {self.name} holding its Lease")

    def logs(self) -> str:
        """The logs of every operator replica, one after the other (the one at work and the standbys)."""
        return "\n".join(self.kubectl_cmd("logs", "-n", self.namespace, p["metadata"]["name"], check=False).stdout
                         for p in self.operator_pods())

    def admission_pods(self) -> list[dict]:
        """The admission server's pods (reversi-admission), not being deleted."""
        out = self.kubectl_cmd("get", "pods", "-n", self.namespace, "-o", "json", "-l",
                               f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component=admission")
        return [p for p in json.loads(out.stdout)["items"] if not p["metadata"].get("deletionTimestamp")]

    def admission_logs(self) -> str:
        return "".join(self.kubectl_cmd("logs", "-n", self.namespace, pod["metadata"]["name"], check=False).stdout
                       for pod in self.admission_pods())

    def metrics_text(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return resp.read().decode()

    def wait_ready(self) -> None:
        def ready() -> bool:
            try:
                self.metrics_text()
            except (OSError, http.client.HTTPException):
                return False
            if self.values["webhook"]["enabled"]:
                try:
                    with socket.create_connection(("127.0.0.1", self.webhook_port), timeout=1):
                        pass
                except OSError:
                    return False
            return True

        try:
            wait_for(ready, timeout=90, what=f"the operator and admission pods of release {self.name} to serve")
        except AssertionError as err:
            raise AssertionError(f"{err}\n--- operator log ---\n{self.logs()[-4000:]}\n--- admission log ---\n"
                                 f"{self.admission_logs()[-4000:]}") from None
        if self.values["webhook"]["enabled"]:
            # the API server reaches the webhook through the Service: a dry-run create goes through it
            probe = {"apiVersion": "reversi.dev/v1alpha1", "kind": "ClusterHalt",
                     "metadata": {"name": "chart-test-webhook-probe"},
                     "spec": {"reason": "probe", "by": "chart tests"}}

            def webhooks_answer() -> bool:
                out = self.kubectl_cmd("create", "--dry-run=server", "-f", "-", check=False, input=json.dumps(probe))
                return out.returncode == 0

            wait_for(webhooks_answer, timeout=60, what="the API server to reach the admission server's webhooks")


def release_values(**overrides: Any) -> dict:
    """Values of the live release: test ports and fast ticks; everything else as shipped."""
    values: dict[str, Any] = {
        "metrics": {"port": int(os.environ.get("REVERSI_TEST_CHART_METRICS_PORT", "28180"))},
        "webhook": {"enabled": True, "port": int(os.environ.get("REVERSI_TEST_CHART_WEBHOOK_PORT", "28443"))},
        "operator": {"tickSeconds": 0.5},
        # pods share the host's network here: the admission replicas share the webhook port
        # (SO_REUSEPORT), and leave the metrics and health ports to the operator's pod
        "admission": {"metricsPort": 0, "healthPort": 0},
        "probes": {"healthPort": int(os.environ.get("REVERSI_TEST_CHART_HEALTH_PORT", "28181"))},
        # the tests' CRDs come from crds/ (the crds fixture), shared with the integration tests;
        # test_chart_upgrade.py installs them with the release
        "crds": {"enabled": False},
    }
    for key, value in overrides.items():
        if isinstance(value, dict):
            values.setdefault(key, {}).update(value)
        else:
            values[key] = value
    return values


def undo_an_order(rv: Any, order: str) -> tuple[dict, dict, dict]:
    """Charge and reserve for ``order`` (real downstream calls), record them in a Run, request
    its rollback and wait for the end. Returns (finished request, charge, reservation)."""
    rv.apply_manifest()
    charge = rv.charge(order)
    reservation = rv.reserve(order)
    rv.run(f"run-{order}", [
        rv.step(0, "payments.get_customer", {"id": "cus_9"}, {"id": "cus_9"}),
        rv.step(1, "payments.create_charge", {"order_id": order, "amount": 700, "customer": "cus_9"}, charge),
        rv.step(2, "inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": order}, reservation),
    ])
    rv.request(f"undo-{order}", f"run-{order}")
    done = rv.wait_phase(f"undo-{order}", "Succeeded", "Incomplete", "Failed", timeout=180)
    return done, charge, reservation


PERMISSION_ERROR = re.compile(r"forbidden|(?<![,.:])\b403\b|not enough permissions|"
                              r"cannot (list|watch|get|create|patch)", re.I)


def permission_errors(log: str) -> list[str]:
    """Lines of an operator log that say a permission was missing (kopf logs 'Not enough
    permissions' when it falls back, and every APIForbiddenError)."""
    return [line for line in log.splitlines() if PERMISSION_ERROR.search(line)]
