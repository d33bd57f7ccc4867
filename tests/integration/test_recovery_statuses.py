"""Rules 15 and 16 on the real control plane: two phases (inverses first) and the step
statuses alreadyRecovered, expired, handlerUnavailable and conflict (forced or not).

Every compensator and reader is ``demo/downstream/tool.py`` run as a Job; each test reads the
downstream server's state and its log of calls, and counts the compensator Jobs of each step, so
that a status is shown to match what really ran (zero compensator runs for alreadyRecovered,
expired, handlerUnavailable and an unforced conflict; one for a forced conflict).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from reversi.adapters.journal import entry_of
from tests.helpers import wait_for
from tests.integration.conftest import manifest_body

pytestmark = pytest.mark.cluster
G, V = "reversi.dev", "v1alpha1"


def _compensator_jobs(rv, step: int | None = None) -> list:
    jobs = rv.batch.list_namespaced_job(rv.ns, label_selector="reversi.dev/role=compensator").items
    return [j for j in jobs if step is None or int(j.metadata.labels["reversi.dev/step"]) == step]


def _cond(obj: dict, ctype: str) -> dict:
    return next(x for x in obj["status"]["conditions"] if x["type"] == ctype)


def _tool(name: str, compensation: dict, verification: dict | None = None, effect: str = "write") -> dict:
    entry = {"name": name, "effect": effect, "compensation": {"runner": "tools", **compensation}}
    if verification:
        entry["verification"] = {"runner": "tools", "retries": 2, "backoffMs": 200, **verification}
    return entry


REFUND = {"tool": "payments.refund", "kind": "compensation", "args": {"charge_id": "$result.id"}}
CHARGE_READ = {"tool": "payments.get_charge", "args": {"charge_id": "$result.id"}, "expect": {"refunded": True}}


def test_inverses_run_before_compensations_and_a_failed_inverse_does_not_stop_them(rv):
    rv.apply_manifest(capture_needs_approval=False)
    held = [rv.reserve(f"o-ph{i}") for i in range(2)]
    charge = rv.charge("o-ph")
    rv.run("r", [
        rv.step(0, "inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-ph0"}, held[0]),
        rv.step(1, "inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-ph1"}, held[1]),
        rv.step(2, "payments.create_charge", {"order_id": "o-ph", "amount": 700, "customer": "cus_9"}, charge),
    ])
    # the inverse of step 1 fails every time: the compensation of step 2 must still run
    rv.downstream.fault(f"/inventory/reservations/{held[1]['id']}/release", "error", times=20)
    started = time.time()
    rv.request("undo", "r", retries=1)
    req = rv.wait_phase("undo", "Incomplete", "Succeeded")
    report = req["status"]["report"]
    assert report["compensated"] == [0, 2] and [f["step"] for f in report["failed"]] == [1], report
    assert _cond(req, "Complete")["reason"] == "Partial"
    calls = [c for c in rv.downstream.state()["calls"] if c["at"] >= started and not c["replayed"]]
    order = [c["path"] for c in calls if c["path"].endswith("/release") or c["path"] == "/payments/refunds"]
    # newest first would refund (step 2) first; the inverse (step 0) runs before the compensation
    assert order == [f"/inventory/reservations/{held[0]['id']}/release", "/payments/refunds"], calls
    jobs = {int(j.metadata.labels["reversi.dev/step"]): j.metadata.creation_timestamp for j in _compensator_jobs(rv)}
    assert jobs[1] <= jobs[0] <= jobs[2], jobs  # both inverses (1 newest, then 0) started before step 2
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    assert rv.downstream.get(f"/inventory/reservations/{held[1]['id']}")["status"] == "held"


def test_already_recovered_step_runs_no_compensator_and_an_unrecovered_one_runs_once(rv):
    tool = _tool("payments.charge_prechecked", {**REFUND, "precheck": True}, CHARGE_READ)
    rv.apply_manifest(extra_tools=[tool])
    done, open_ = rv.charge("o-pre0"), rv.charge("o-pre1")
    args = {"order_id": "o-pre", "amount": 700, "customer": "cus_9"}
    rv.run("r", [rv.step(0, tool["name"], args, done), rv.step(1, tool["name"], args, open_)])
    rv.downstream.post("/payments/refunds", {"charge_id": done["id"]})  # someone undid step 0 by hand
    since = time.time()
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete")
    report = req["status"]["report"]
    assert req["status"]["phase"] == "Succeeded", report
    assert report["alreadyRecovered"] == [0] and report["compensated"] == [1], report
    assert _compensator_jobs(rv, 0) == [] and len(_compensator_jobs(rv, 1)) == 1
    refunds = rv.downstream.calls("/payments/refunds", since=since)
    assert [c for c in refunds] and len(refunds) == 1  # only step 1's refund ran
    assert rv.step_status(req, 0)["stage"] == "alreadyRecovered"
    assert rv.condition(rv.step_status(req, 0), "Compensated")["reason"] == "AlreadyRecovered"
    prechecks = rv.batch.list_namespaced_job(rv.ns, label_selector="reversi.dev/role=precheck").items
    assert sorted(int(j.metadata.labels["reversi.dev/step"]) for j in prechecks) == [0, 1]


def test_expired_step_is_not_attempted(rv):
    tool = _tool("payments.charge_180d", {**REFUND, "windowSeconds": 1}, CHARGE_READ)
    rv.apply_manifest(extra_tools=[tool])
    charge = rv.charge("o-exp")
    rv.run("r", [rv.step(0, tool["name"], {"order_id": "o-exp", "amount": 700, "customer": "cus_9"}, charge)])
    [recorded] = rv.steps("r")
    at = entry_of(recorded).spec.recorded_at.timestamp()  # a recorded call's time: its creation, the server's clock
    wait_for(lambda: time.time() > at + 2, timeout=10, what="the one-second undo window to pass")
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Incomplete", "Succeeded")
    report = req["status"]["report"]
    assert [e["step"] for e in report["expired"]] == [0] and "1s of recordedAt" in report["expired"][0]["reason"]
    assert _cond(req, "Complete")["reason"] == "NotPossible"
    assert rv.step_status(req, 0)["stage"] == "expired"
    assert _compensator_jobs(rv) == []
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is False


def test_a_missing_runner_makes_only_its_step_handler_unavailable(rv):
    body = manifest_body(rv.downstream.url, extra_tools=[{
        "name": "inventory.reserve_legacy", "effect": "write",
        "compensation": {"tool": "inventory.release", "kind": "inverse", "args": {"reservation_id": "$result.id"},
                         "runner": "legacy"}}])
    runners = body["spec"]["runners"]
    # the manifest as it stood when the calls were made: with the legacy runner
    body["spec"]["runners"] = runners + [{**runners[0], "name": "legacy"}]
    rv.manifest = rv.create("toolmanifests", body)
    charge, held = rv.charge("o-hu"), rv.reserve("o-hu")
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-hu", "amount": 700, "customer": "cus_9"}, charge),
                 rv.step(1, "inventory.reserve_legacy", {"sku": "sku-mug", "qty": 1, "order_id": "o-hu"}, held)])
    # later the legacy runner (and its tool) are removed from the manifest
    rv.patch("toolmanifests", "payments", {"spec": {"runners": runners, "tools": body["spec"]["tools"][:-1]}})
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Incomplete", "Succeeded", "Failed")
    report = req["status"]["report"]
    assert req["status"]["phase"] == "Incomplete", req["status"]
    assert [h["step"] for h in report["handlerUnavailable"]] == [1]
    assert "legacy" in report["handlerUnavailable"][0]["reason"]
    assert report["compensated"] == [0]  # the rest of the request proceeds
    assert _cond(req, "Complete")["reason"] == "Partial"
    assert rv.step_status(req, 1)["stage"] == "handlerUnavailable"
    assert _compensator_jobs(rv, 1) == [] and len(_compensator_jobs(rv, 0)) == 1
    assert rv.downstream.get(f"/inventory/reservations/{held['id']}")["status"] == "held"
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True


WITNESSED = _tool("payments.capture_witnessed",
                  {"tool": "payments.void_capture", "kind": "inverse", "args": {"capture_id": "$result.id"},
                   "precondition": {"tool": "payments.get_charge", "args": {"charge_id": "$args.charge_id"},
                                    "expect": {"refunded": False}}},
                  {"tool": "payments.get_capture", "args": {"capture_id": "$result.id"},
                   "expect": {"status": "voided"}})


def _conflicted_run(rv, name: str) -> dict:
    """A Run whose one step (a capture) has a precondition that no longer holds: the charge was refunded since."""
    charge = rv.charge(f"o-{name}")
    capture = rv.capture(charge["id"])
    rv.run(name, [rv.step(0, WITNESSED["name"], {"charge_id": charge["id"]}, capture)])
    rv.downstream.post("/payments/refunds", {"charge_id": charge["id"]})
    return capture


def test_conflict_is_not_undone_unless_forced_and_forcing_needs_the_force_verb(rv, cluster, namespace):
    rv.apply_manifest(extra_tools=[WITNESSED])
    kept, forced = _conflicted_run(rv, "kept"), _conflicted_run(rv, "forced")
    since = time.time()
    rv.request("undo-kept", "kept")
    # a user who may create requests but lacks the verb force is refused
    rbac = client.RbacAuthorizationV1Api(rv.api)
    rules = [{"apiGroups": [G], "resources": ["rollbackrequests"], "verbs": ["get", "list", "create", "patch"]},
             {"apiGroups": [G], "resources": ["runs"], "verbs": ["get", "list"]}]
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "oncall"}, "rules": rules})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "oncall"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                    "name": "oncall"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "oncall"}]})
    oncall = client.CustomObjectsApi(config.new_client_from_config(config_file=str(cluster.kubeconfig_for("oncall"))))
    body = {"apiVersion": f"{G}/{V}", "kind": "RollbackRequest", "metadata": {"name": "undo-forced"},
            "spec": {"runRef": {"name": "forced"}, "force": [{"step": 0, "actor": "someone-else"}]}}
    with pytest.raises(ApiException) as err:
        oncall.create_namespaced_custom_object(G, V, namespace, "rollbackrequests", body)
    assert err.value.status == 403 and 'needs the RBAC verb \\"force\\"' in err.value.body, err.value.body
    # the plugin's --force, as oncall: refused by name; as the admin: created (the actor is the server's word)
    plugin = [sys.executable, "-m", "reversi.entrypoints.plugin", "-n", namespace]
    refused = subprocess.run([*plugin, "--kubeconfig", str(cluster.kubeconfig_for("oncall")), "rollback", "forced",
                              "--name", "undo-forced", "--force", "0"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and 'verb "force"' in refused.stderr, refused.stderr
    created = subprocess.run([*plugin, "--kubeconfig", str(cluster.paths.admin_kubeconfig), "rollback", "forced",
                              "--name", "undo-forced", "--force", "0"], capture_output=True, text=True, timeout=60)
    assert created.returncode == 0 and created.stdout.strip() == "undo-forced", created.stderr
    kept_req = rv.wait_phase("undo-kept", "Incomplete", "Succeeded")
    report = kept_req["status"]["report"]
    assert [x["step"] for x in report["conflict"]] == [0] and "refunded" in report["conflict"][0]["reason"], report
    assert _cond(kept_req, "Complete")["reason"] == "NotPossible"
    assert rv.condition(rv.step_status(kept_req, 0), "Compensated")["reason"] == "Conflict"
    assert rv.downstream.get(f"/payments/captures/{kept['id']}")["status"] == "captured"
    forced_req = rv.wait_phase("undo-forced", "Incomplete", "Succeeded")
    report = forced_req["status"]["report"]
    assert forced_req["status"]["phase"] == "Succeeded", report
    assert report["compensated"] == [0] and report["conflict"] == []
    actor = rv.get("rollbackrequests", "undo-forced")["spec"]["force"][0]["actor"]
    assert actor != "someone-else" and report["forced"] == [{"step": 0, "reason": f"forced by {actor}"}]
    assert rv.step_status(forced_req, 0)["forcedBy"] == actor
    voids = [c for c in rv.downstream.calls("/payments/captures/", since=since) if c["path"].endswith("/void")]
    assert [c["path"] for c in voids] == [f"/payments/captures/{forced['id']}/void"]  # once, and only forced
    runs = {}
    for j in _compensator_jobs(rv):
        runs[j.metadata.labels["reversi.dev/run-uid"]] = runs.get(j.metadata.labels["reversi.dev/run-uid"], 0) + 1
    assert sorted(runs.values()) == [1] and rv.get("runs", "forced")["metadata"]["uid"] in runs
    assert json.dumps(report)  # the report is plain JSON
