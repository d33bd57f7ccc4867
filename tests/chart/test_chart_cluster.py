"""The chart on the local control plane: its objects pass the API server's validation, and an
installed release runs the operator as a pod (its ServiceAccount, RBAC, certificate, Service and
webhooks) that carries out a rollback end to end."""

from __future__ import annotations

import base64
import copy
import json
import re
import subprocess
import time
import uuid

import pytest
import yaml

from tests.chart.chartkit import ALL_FEATURES, HERE, permission_errors, run, undo_an_order
from tests.helpers import wait_for
from tests.integration.conftest import RV

pytestmark = pytest.mark.cluster


# -------------------------------------------------------------------- server-side dry run

@pytest.fixture(scope="module")
def schemas(cluster, crds, kubectl):
    """The CRDs the rendered objects need: Reversi's (crds fixture) and stand-ins for the
    Prometheus Operator's and cert-manager's (stub-crds.yaml)."""
    kc = cluster.paths.admin_kubeconfig
    run([kubectl, "--kubeconfig", kc, "apply", "-f", HERE / "stub-crds.yaml"])
    run([kubectl, "--kubeconfig", kc, "wait", "--for=condition=Established", "--timeout=60s",
         "crd/servicemonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com",
         "crd/certificates.cert-manager.io", "crd/issuers.cert-manager.io"])
    return kc


def _dry_run(kubectl, kubeconfig, manifest: str) -> str:
    return run([kubectl, "--kubeconfig", kubeconfig, "apply", "--dry-run=server", "--validate=strict", "-f", "-"],
               input=manifest).stdout


VALUE_SETS = {
    "default": {},
    "webhooks-off": {"webhook": {"enabled": False}},
    "metrics-off": {"metrics": {"enabled": False}},
    "all-features": ALL_FEATURES,
    "cert-manager-own-issuer": {"webhook": {"certManager": {"enabled": True, "issuerRef": {
        "name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}}},
}


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_rendered_objects_pass_server_side_validation(name, schemas, namespace, render, kubectl):
    """Every rendered object is accepted by the real API server (its schemas, and strict field
    validation: no unknown or duplicate field), with the CRDs installed."""
    values = copy.deepcopy(VALUE_SETS[name])
    if values.get("watchNamespaces"):
        values["watchNamespaces"] = [namespace]
    if values.get("journalQuota"):  # its ResourceQuotas go into namespaces that exist
        values["journalQuota"]["namespaces"] = [namespace]
    manifest = render.text(values, namespace=namespace, release=f"dry-{name}"[:30])
    out = _dry_run(kubectl, schemas, manifest)
    kinds = {o["kind"] for o in yaml.safe_load_all(manifest) if o}
    assert out.count("(server dry run)") == sum(1 for o in yaml.safe_load_all(manifest) if o), out
    assert "Deployment" in kinds


def test_server_side_validation_catches_a_bad_object(schemas, namespace, render, kubectl):
    """The dry run is a real check: a misspelt field in a stand-in CRD's object is refused."""
    manifest = render.text({"metrics": {"serviceMonitor": {"enabled": True}}}, namespace=namespace)
    broken = manifest.replace("jobLabel:", "jobLabell:")
    assert broken != manifest
    proc = subprocess.run([str(kubectl), "--kubeconfig", str(schemas), "apply", "--dry-run=server",
                           "--validate=strict", "-f", "-"], input=broken, capture_output=True, text=True)
    assert proc.returncode != 0 and "jobLabell" in proc.stderr


# ----------------------------------------------------------------- the installed operator

def test_operator_runs_as_a_pod_with_the_charts_service_account(release):
    """...in a namespace that enforces the restricted Pod Security Standard."""
    ns = json.loads(release.kubectl_cmd("get", "namespace", release.namespace, "-o", "json").stdout)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pod = release.pod()
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["serviceAccountName"] == release.fullname
    (status,) = pod["status"]["containerStatuses"]
    assert status["restartCount"] == 0, release.logs()[-3000:]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["REVERSI_METRICS_PORT"] == str(release.metrics_port)
    admission = release.admission_pods()
    assert len(admission) == 2 and all(p["status"]["phase"] == "Running" for p in admission)
    for apod in admission:
        assert apod["spec"]["serviceAccountName"] == f"{release.fullname}-admission"
        env = {e["name"]: e.get("value") for e in apod["spec"]["containers"][0]["env"]}
        assert env["REVERSI_WEBHOOK_PORT"] == str(release.webhook_port)


@pytest.fixture(scope="module")
def undone(release, admin_api, downstream):
    """One rollback through the installed operator, in a namespace of its own: (rv, request,
    charge, reservation). The metrics test reads what it counted."""
    from kubernetes import client

    ns = f"chart-e2e-{uuid.uuid4().hex[:5]}"
    core = client.CoreV1Api(admin_api)
    core.create_namespace({"metadata": {"name": ns, "labels": {"reversi.dev/test": "true"}}})
    downstream.post("/_reset", {})
    rv = RV(admin_api, ns, downstream)
    try:
        yield (rv, *undo_an_order(rv, "o-chart-1"))
    finally:
        core.delete_namespace(ns, propagation_policy="Background")


def test_rollback_end_to_end_through_the_installed_operator(undone, downstream):
    """A charge and a reservation are undone by compensator Jobs the installed operator creates
    with its own ServiceAccount; both are verified by reader Jobs; the request Succeeds."""
    rv, done, charge, reservation = undone
    assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"], indent=1)[:3000]
    report = done["status"]["report"]
    assert sorted(report["compensated"]) == [1, 2] and report["complete"] is True
    assert downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    assert downstream.get(f"/inventory/reservations/{reservation['id']}")["status"] == "released"
    # the mutating webhook, reached through the chart's Service, stamped the principal
    assert rv.get("runs", "run-o-chart-1")["spec"]["principal"] == "reversi-admin"
    # compensator and reader Jobs, owned by the Run and annotated with the request that started
    # them (the owner reference with blockOwnerDeletion needs runs/finalizers update)
    jobs = rv.batch.list_namespaced_job(rv.ns).items
    roles = sorted(j.metadata.labels["reversi.dev/role"] for j in jobs)
    assert roles.count("compensator") == 2 and "reader" in roles, roles
    assert all(j.metadata.owner_references[0].kind == "Run" and j.metadata.owner_references[0].name == "run-o-chart-1"
               for j in jobs)
    assert all(j.metadata.annotations["reversi.dev/request"] == "undo-o-chart-1" for j in jobs)


def test_validating_webhook_refuses_a_halted_call(release, admin_api, namespace, downstream):
    """A Halt in force refuses a new step (rule 9), through the chart's validating webhook."""
    rv = RV(admin_api, namespace, downstream)
    rv.apply_manifest()
    rv.create("halts", {"apiVersion": "reversi.dev/v1alpha1", "kind": "Halt", "metadata": {"name": "stop-charges"},
                        "spec": {"reason": "chart test", "by": "tests", "scope": {"tool": "payments.*"}}})
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as err:
        rv.run("order-halted", [rv.step(0, "payments.create_charge", {"order_id": "o-h", "amount": 1},
                                        {"id": "ch_x"})])
    assert "kill switch: chart test" in err.value.body


def test_operator_log_shows_no_permission_error(release, undone):
    """The chart's RBAC is enough: after a rollback (Jobs, Secrets, pods, logs, events, status)
    kopf and the operator logged no 403 / Forbidden / missing permission (kopf logs 'Not enough
    permissions' when it must fall back)."""
    for log in (release.logs(), release.admission_logs()):  # the operator, then the admission server
        assert "Activity 'configure' succeeded" in log, log[-3000:]
        bad = permission_errors(log)
        assert not bad, "\n".join(bad[:20])


@pytest.mark.parametrize("verb, resource, allowed", [
    ("create", "jobs.batch", True),
    ("watch", "jobs.batch", True),
    ("create", "secrets", True),
    ("get", "pods/log", True),
    ("patch", "runs.reversi.dev/status", True),
    ("patch", "clusterhalts.reversi.dev/status", True),
    ("update", "runs.reversi.dev/finalizers", True),
    ("update", "rollbackrequests.reversi.dev/finalizers", False),
    ("create", "subjectaccessreviews.authorization.k8s.io", False),  # the admission server asks, below
    ("get", "secrets", False),
    ("list", "secrets", False),
    ("delete", "jobs.batch", False),
    ("create", "pods", False),
    ("update", "runs.reversi.dev", False),
    ("patch", "runs.reversi.dev", True),  # its finalizers only (docs/operations.md#a-run-deleted-by-hand)
    ("delete", "rollbackrequests.reversi.dev", False),
    ("approve", "rollbackrequests.reversi.dev", False),
    ("create", "validatingwebhookconfigurations.admissionregistration.k8s.io", False),
])
def test_service_account_has_least_privilege(release, verb, resource, allowed):
    _check_can_i(release, release.fullname, verb, resource, allowed)


def _check_can_i(release, account: str, verb: str, resource: str, allowed: bool) -> None:
    """``kubectl auth can-i`` as the release's ServiceAccount ``account`` answers ``allowed``."""
    sa = f"system:serviceaccount:{release.namespace}:{account}"
    resource, _, sub = resource.partition("/")
    args = [f"--subresource={sub}"] if sub else []
    out = release.kubectl_cmd("auth", "can-i", verb, resource, *args, "--as", sa, "-n", "default", check=False)
    assert out.stdout.strip() == ("yes" if allowed else "no"), f"{sa} {verb} {resource}: {out.stdout}{out.stderr}"


@pytest.mark.parametrize("verb, resource, allowed", [
    ("create", "subjectaccessreviews.authorization.k8s.io", True),
    ("list", "runsteps.reversi.dev", True),
    ("list", "halts.reversi.dev", True),
    ("watch", "toolmanifests.reversi.dev", True),
    ("patch", "halts.reversi.dev/status", True),
    ("create", "jobs.batch", True),  # only ever a dry run of a runner's Job
    ("patch", "runs.reversi.dev/status", False),
    ("patch", "runsteps.reversi.dev/status", False),
    # the recording webhook records a recorded user's write as a step, and settles it
    # (docs/concepts.md#recording-with-no-agent-code)
    ("create", "runsteps.reversi.dev", True),
    ("watch", "runs.reversi.dev", True),
    ("get", "serviceaccounts", True),  # a Run recording an account that does not exist is warned
    ("list", "serviceaccounts", False),
    ("create", "secrets", False),
    ("get", "secrets", False),
    ("get", "pods/log", False),
    ("patch", "rollbackrequests.reversi.dev", False),
])
def test_admission_service_account_has_least_privilege(release, verb, resource, allowed):
    """The admission server reads what its checks need and writes only a halt's refusal count."""
    _check_can_i(release, f"{release.fullname}-admission", verb, resource, allowed)


def test_metrics_of_the_installed_operator_pass_promtool(release, undone, promtool):
    """The operator's real /metrics (after a rollback: counters and histograms have samples)
    passes `promtool check metrics`, and has every metric the alerts and dashboard read."""
    # the operator counts a request just after writing its final phase: wait for the count
    complete = re.compile(r'reversi_rollbacks_total\{namespace="[^"]+",verdict="complete"\} [1-9]')

    def counted() -> str | None:
        text = release.metrics_text()
        return text if complete.search(text) else None

    text = wait_for(counted, timeout=20, what="reversi_rollbacks_total to count the complete rollback")
    run([promtool, "check", "metrics"], input=text)
    for family in ("reversi_rollbacks_total", "reversi_rollback_steps_total", "reversi_incomplete_rollbacks",
                   "reversi_compensation_duration_seconds", "reversi_verification_duration_seconds",
                   "reversi_active_halts"):  # reversi_refused_calls_total: the admission server's (test_metrics.py)
        assert f"# TYPE {family} " in text, family


def test_upgrade_keeps_the_webhook_certificate_and_the_pod(release):
    """`helm upgrade` reuses the certificate (lookup of the Secret): same CA in the webhook
    configurations, same checksum, so the operator is not restarted and webhooks keep working."""
    def secret() -> dict:
        out = release.kubectl_cmd("get", "secret", "-n", release.namespace, f"{release.fullname}-webhook-tls", "-o",
                                  "json")
        return json.loads(out.stdout)["data"]

    def ca_bundles() -> set[str]:
        bundles = set()
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            conf = json.loads(release.kubectl_cmd("get", kind, release.fullname, "-o", "json").stdout)
            bundles |= {h["clientConfig"]["caBundle"] for h in conf["webhooks"]}
        return bundles

    def admission_uids() -> set[str]:
        return {p["metadata"]["uid"] for p in release.admission_pods()}

    before, pod_before, admission_before = secret(), release.pod()["metadata"]["uid"], admission_uids()
    assert ca_bundles() == {before["ca.crt"]}
    release.install(upgrade=True)
    after = secret()
    assert after == before
    assert ca_bundles() == {before["ca.crt"]}
    time.sleep(2)
    assert release.pod()["metadata"]["uid"] == pod_before, "the upgrade restarted the operator"
    assert admission_uids() == admission_before, "the upgrade rolled the admission server"
    assert base64.b64decode(after["tls.crt"]).startswith(b"-----BEGIN CERTIFICATE-----")


def test_notes_tell_how_to_check_the_operator(release):
    notes = release.helm_cmd("get", "notes", release.name, "--namespace", release.namespace).stdout
    assert f"rollout status deploy/{release.fullname}" in notes
    assert "failurePolicy Fail" in notes
