"""GitOps tools judge every kind in every phase right, with their own code
(docs/operations.md#gitops-kstatus-flux-argo-cd).

kstatus is computed by sigs.k8s.io/cli-utils itself (the pinned ``kstatus-check``), Argo CD
health by the chart's Lua checks run with lupa, both on objects read from the local control
plane with the operator at work: right after creation (before the operator wrote anything:
never Current), and in each phase. ``kubectl wait --for=condition=Ready`` works as the README
says. With ``REVERSI_CAPTURE_FIXTURES=1`` the objects are saved for tests/unit/test_argocd_health.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from reversi_devcluster.build import binary
from tests.gitops import FIXTURES, REPO, argocd_health, kstatus
from tests.helpers import wait_for
from tests.integration.conftest import GROUP, VERSION

pytestmark = pytest.mark.cluster

#: phase name -> (kstatus, Argo CD health)
EXPECTED = {
    "toolmanifest-created": ("InProgress", "Progressing"),
    "toolmanifest-accepted": ("Current", "Healthy"),
    "halt-created": ("InProgress", "Progressing"),
    "halt-in-force": ("Current", "Healthy"),
    "clusterhalt-created": ("InProgress", "Progressing"),
    "clusterhalt-in-force": ("Current", "Healthy"),
    "run-created": ("InProgress", "Progressing"),
    "run-recorded": ("Current", "Healthy"),
    "run-locked": ("InProgress", "Progressing"),
    "run-rolled-back": ("Current", "Healthy"),
    "run-incomplete": ("Failed", "Degraded"),
    "rollbackrequest-created": ("InProgress", "Progressing"),
    "rollbackrequest-awaiting-approval": ("InProgress", "Suspended"),
    "rollbackrequest-waiting": ("InProgress", "Progressing"),
    "rollbackrequest-running": ("InProgress", "Progressing"),
    "rollbackrequest-succeeded": ("Current", "Healthy"),
    "rollbackrequest-incomplete": ("Failed", "Degraded"),
    "rollbackrequest-run-missing": ("InProgress", "Progressing"),
    "rollbackrequest-failed": ("Failed", "Degraded"),
    "rollbackrequest-planned": ("Current", "Healthy"),
    "rollbackrequest-planned-then-edited": ("Current", "Healthy"),
    "run-acknowledged": ("Current", "Healthy"),
    "rollbackrequest-acknowledged": ("Current", "Healthy"),
}


def _cond(obj: dict, ctype: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def _observed(obj: dict) -> bool:
    return (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]


def _ready(get, *args) -> dict:
    def check():
        obj = get(*args)
        return obj if _observed(obj) and _cond(obj, "Ready").get("status") == "True" else None

    return wait_for(check, timeout=30, what=f"{args[-1]} to be Ready")


def _phase_while(rv, name: str, phase: str) -> dict:
    def check():
        obj = rv.get("rollbackrequests", name)
        return obj if (obj.get("status") or {}).get("phase") == phase and _observed(obj) else None

    return wait_for(check, timeout=60, interval=0.05, what=f"RollbackRequest {name} in phase {phase}")


def _capture(seen: dict, downstream_url: str) -> None:
    """Save the objects as fixtures of the unit test (only with REVERSI_CAPTURE_FIXTURES=1),
    without this machine's paths and ports."""
    if os.environ.get("REVERSI_CAPTURE_FIXTURES") != "1":
        return
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for phase, obj in seen.items():
        text = json.dumps(obj).replace(downstream_url, "http://downstream.shop:8080")
        text = text.replace(sys.executable, "python3").replace(str(REPO), "/app")
        obj = json.loads(text)
        meta = obj["metadata"]
        for noisy in ("managedFields", "uid", "resourceVersion", "creationTimestamp", "annotations"):
            meta.pop(noisy, None)
        if meta.get("namespace"):
            meta["namespace"] = "shop"
        ks, argo = EXPECTED[phase]
        (FIXTURES / f"{phase}.json").write_text(json.dumps({"kstatus": ks, "argocd": argo, "object": obj},
                                                           indent=1, sort_keys=True) + "\n")


def test_every_kind_in_every_phase_computes_to_the_expected_gitops_verdict(rv):
    seen: dict[str, dict] = {}
    custom = rv.custom

    # ToolManifest, Halt, ClusterHalt: the object the create returns is what the API holds
    # before the operator has looked at it (the halts name a manifested tool the test never
    # calls: a halt whose pattern matches no tool is Stalled, not in force as meant)
    seen["toolmanifest-created"] = rv.apply_manifest()
    seen["toolmanifest-accepted"] = _ready(rv.get, "toolmanifests", "payments")
    seen["halt-created"] = rv.create("halts", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Halt", "metadata": {"name": "freeze-inventory"},
        "spec": {"reason": "kstatus test", "by": "tests", "scope": {"tool": "inventory.*"}}})
    seen["halt-in-force"] = _ready(rv.get, "halts", "freeze-inventory")
    chalt = f"kstatus-{rv.ns}"[:63]
    seen["clusterhalt-created"] = custom.create_cluster_custom_object(GROUP, VERSION, "clusterhalts", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterHalt", "metadata": {"name": chalt},
        "spec": {"reason": "kstatus test", "by": "tests", "scope": {"namespace": rv.ns, "tool": "inventory.*"}}})
    try:
        seen["clusterhalt-in-force"] = _ready(
            lambda n: custom.get_cluster_custom_object(GROUP, VERSION, "clusterhalts", n), chalt)
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, "clusterhalts", chalt)

    # a run whose capture needs approval: request A waits for it and holds the run, B waits for A
    charge = rv.charge("o-kstatus")
    capture = rv.capture(charge["id"])
    seen["run-created"] = rv.run("r", [
        rv.step(0, "payments.create_charge", {"order_id": "o-kstatus", "amount": 700, "customer": "cus_9"}, charge),
        rv.step(1, "payments.capture", {"charge_id": charge["id"]}, capture)])
    seen["run-recorded"] = _ready(rv.get, "runs", "r")
    seen["rollbackrequest-created"] = rv.request("undo-a", "r")
    seen["rollbackrequest-awaiting-approval"] = _phase_while(rv, "undo-a", "AwaitingApproval")
    seen["run-locked"] = rv.get("runs", "r")
    rv.request("undo-b", "r")
    seen["rollbackrequest-waiting"] = _phase_while(rv, "undo-b", "Waiting")
    rv.downstream.fault("/payments/captures", "timeout", times=1, delay_s=3)  # a slow undo: Running lasts
    rv.patch("rollbackrequests", "undo-a", {"spec": {"approveCompensations": True}})
    seen["rollbackrequest-running"] = _phase_while(rv, "undo-a", "Running")
    seen["rollbackrequest-succeeded"] = rv.wait_phase("undo-a", "Succeeded", "Incomplete")
    rv.wait_phase("undo-b", "Succeeded", "Incomplete")
    seen["run-rolled-back"] = _ready(rv.get, "runs", "r")

    # incomplete: an email cannot be unsent; failed: no such run; planned: a dry run
    rv.run("r-email", [rv.step(0, "email.send", {"to": "customer"}, {"id": "msg_1"})])
    rv.request("undo-email", "r-email")
    seen["rollbackrequest-incomplete"] = rv.wait_phase("undo-email", "Incomplete")
    seen["run-incomplete"] = wait_for(lambda: (lambda r: r if _observed(r)
                                               and _cond(r, "Stalled").get("status") == "True"
                                               else None)(rv.get("runs", "r-email")), what="Run r-email Stalled")
    rv.request("undo-missing", "no-such-run")
    # waiting for its Run (a GitOps apply may create the request first): in progress, not healthy
    seen["rollbackrequest-run-missing"] = wait_for(
        lambda: (lambda r: r if _observed(r) and _cond(r, "Planned").get("reason") == "RunNotFound" else None)(
            rv.get("rollbackrequests", "undo-missing")), what="the request to wait for its Run")
    seen["rollbackrequest-failed"] = rv.wait_phase("undo-missing", "Failed")
    rv.request("plan", "r-email", dryRun=True)
    seen["rollbackrequest-planned"] = rv.wait_phase("plan", "Planned")
    # a spec change after the end is still observed (else kstatus would say InProgress forever)
    rv.patch("rollbackrequests", "plan", {"spec": {"parallelism": 2}})
    seen["rollbackrequest-planned-then-edited"] = wait_for(
        lambda: (lambda r: r if r["metadata"]["generation"] == 2 and _observed(r) else None)(
            rv.get("rollbackrequests", "plan")), what="the edit of a final request to be observed")

    # acknowledged: a person accepts what the email's rollback left (kubectl reversi acknowledge);
    # the Run and its request read as done for GitOps while their reports stay incomplete
    rv.patch("runs", "r-email", {"spec": {"acknowledgement": {"note": "apologised to the customer"}}})
    seen["run-acknowledged"] = wait_for(lambda: (lambda r: r if _observed(r) and _cond(r, "Ready").get("status")
                                                 == "True" else None)(rv.get("runs", "r-email")),
                                        what="Run r-email Ready with its residue acknowledged")
    seen["rollbackrequest-acknowledged"] = wait_for(
        lambda: (lambda r: r if _cond(r, "Ready").get("status") == "True" else None)(
            rv.get("rollbackrequests", "undo-email")), what="RollbackRequest undo-email Ready, acknowledged")
    assert seen["rollbackrequest-acknowledged"]["status"]["phase"] == "Incomplete"

    assert set(seen) == set(EXPECTED)
    verdicts = kstatus(list(seen.values()))
    got = {phase: (v["status"], argocd_health(obj)["status"])
           for (phase, obj), v in zip(seen.items(), verdicts, strict=True)}
    assert got == EXPECTED, {p: (got[p], EXPECTED[p], seen[p].get("status")) for p in got if got[p] != EXPECTED[p]}
    # Stalled says why and what to do
    assert _cond(seen["rollbackrequest-incomplete"], "Stalled")["reason"] == "Incomplete"
    assert _cond(seen["rollbackrequest-failed"], "Stalled")["reason"] == "RunNotFound"
    assert _cond(seen["rollbackrequest-awaiting-approval"], "Reconciling")["reason"] == "AwaitingApproval"
    _capture(seen, rv.downstream.url)


def test_kubectl_wait_for_ready_waits_for_a_rollback_request(rv):
    """README: ``kubectl wait --for=condition=Ready rollbackrequest/NAME`` returns once the
    request is Ready, and times out for one that ended Incomplete."""
    kubectl = binary("kubernetes", "kubectl")
    rv.apply_manifest()
    charge = rv.charge("o-wait")
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-wait", "amount": 700, "customer": "cus_9"},
                         charge)])
    rv.request("undo", "r")
    done = subprocess.run([kubectl, "wait", "--for=condition=Ready", "rollbackrequest/undo", "-n", rv.ns,
                           "--timeout=120s"], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr
    assert rv.get("rollbackrequests", "undo")["status"]["phase"] == "Succeeded"
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    rv.run("r-email", [rv.step(0, "email.send", {"to": "customer"}, {"id": "msg_1"})])
    rv.request("undo-email", "r-email")
    rv.wait_phase("undo-email", "Incomplete")
    stuck = subprocess.run([kubectl, "wait", "--for=condition=Ready", "rollbackrequest/undo-email", "-n", rv.ns,
                            "--timeout=2s"], capture_output=True, text=True, timeout=30)
    assert stuck.returncode != 0
    stalled = subprocess.run([kubectl, "wait", "--for=condition=Stalled", "rollbackrequest/undo-email", "-n", rv.ns,
                              "--timeout=10s"], capture_output=True, text=True, timeout=30)
    assert stalled.returncode == 0, stalled.stderr


def test_a_request_awaiting_approval_past_its_deadline_is_stalled(rv):
    """Stalled=True when it cannot progress without a person, here an approval that did
    not come before spec.deadlineSeconds; kstatus Failed, Argo CD Degraded."""
    rv.apply_manifest(capture_needs_approval=True)
    charge = rv.charge("o-late")
    capture = rv.capture(charge["id"])
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-late", "amount": 700, "customer": "cus_9"},
                         charge),
                 rv.step(1, "payments.capture", {"charge_id": charge["id"]}, capture)])
    rv.request("undo", "r", deadlineSeconds=2)
    req = rv.wait_phase("undo", "Incomplete", timeout=60)
    stalled = _cond(req, "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "AwaitingApproval", stalled
    assert "not approved before the deadline" in stalled["message"]
    assert _cond(req, "Ready")["status"] == "False"
    assert kstatus([req])[0]["status"] == "Failed"
    assert argocd_health(req)["status"] == "Degraded"
