"""The documented contract to the letter: forward duplicates on the effective outcome,
retries per request, undos with no read-back declared, and the plugin's JSON and exit codes.

Each test reads the downstream truth (the demo's downstream server counts real calls) and counts
compensator Jobs per step, then compares the report with what happened.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from reversi.sdk import DuplicateCall, Recorder

from tests.integration.test_admission import users  # noqa: F401  (fixture: oncall, approver)
from tests.integration.test_plugin import kr

pytestmark = pytest.mark.cluster

CHARGE_ARGS = {"amount": 700, "customer": "cus_9"}


def _charge_step(rv, index, order, **kw):
    charge = rv.charge(order)
    return rv.step(index, "payments.create_charge", {"order_id": order, **CHARGE_ARGS}, charge, **kw), charge


def _jobs(rv, role, step=None):
    selector = f"reversi.dev/role={role}" + (f",reversi.dev/step={step}" if step is not None else "")
    return rv.batch.list_namespaced_job(rv.ns, label_selector=selector).items


def _charges_of(rv, order):
    return [c for c in rv.downstream.state()["charges"].values() if c["order_id"] == order]


def _timed_out(args: dict) -> dict:
    raise TimeoutError(f"the payments API did not answer for {args['order_id']}")


def test_forward_duplicate_of_a_call_settled_failed_is_admitted_and_made(rv, admin_api):
    """A call recorded uncertain (it timed out) and settled failed no longer stands: the agent's
    repeat of it is admitted and really made, once; while it was uncertain the repeat was refused."""
    rv.apply_manifest()
    rv.run("r", [])
    rec = Recorder.attach(rv.ns, "r", api=admin_api)
    # recorded by a recorder that claims its key (docs/concepts.md#the-recorded-calls-contract-rule-by-rule)
    with pytest.raises(TimeoutError):
        rec.call("payments.create_charge", {"order_id": "o-retry-fwd", **CHARGE_ARGS}, _timed_out)
    made = []
    with pytest.raises(DuplicateCall, match="like step 0, which still stands"):
        rec.call("payments.create_charge", {"order_id": "o-retry-fwd", **CHARGE_ARGS},
                 lambda a: made.append(rv.charge(a["order_id"])))
    assert not made and _charges_of(rv, "o-retry-fwd") == []
    rv.resolve("r", 0, status="failed", note="the payments API has no charge for o-retry-fwd")
    result = rec.call("payments.create_charge", {"order_id": "o-retry-fwd", **CHARGE_ARGS},
                      lambda a: rv.charge(a["order_id"]))
    [charge] = _charges_of(rv, "o-retry-fwd")
    assert result["id"] == charge["id"]
    steps = rv.steps("r")
    assert [(s["spec"]["index"], s["spec"]["outcome"]) for s in steps] == [(0, "uncertain"), (1, "succeeded")]
    # and it is the repeat, not the failed first attempt, that a rollback undoes
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete")
    assert req["status"]["phase"] == "Succeeded", req["status"]["report"]
    assert req["status"]["report"]["compensated"] == [1] and req["status"]["report"]["skipped"] == [0]
    assert len(_jobs(rv, "compensator", 1)) == 1 and _jobs(rv, "compensator", 0) == []
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True


def test_rule6_each_request_gets_its_full_retries_budget_with_the_same_key(rv):
    """The first request spends its 2 attempts; a new request gets 2 more (attempts 3 and 4, Job
    names unique), with the same key; the journal keeps the total of 4."""
    rv.apply_manifest()
    s0, charge = _charge_step(rv, 0, "o-budget")
    rv.run("r", [s0])
    rv.downstream.fault("/payments/refunds", "error", times=3)
    backoff = {"baseMs": 50, "maxMs": 100}
    rv.request("first", "r", retries=2, backoff=backoff)
    first = rv.wait_phase("first", "Incomplete")
    assert [f["step"] for f in first["status"]["report"]["failed"]] == [0]
    assert "after 2 attempts" in first["status"]["report"]["failed"][0]["error"]
    [undo] = rv.undo("r")
    assert undo["state"] == "compensationFailed" and undo["attempts"] == 2
    key = undo["idempotencyKey"]
    rv.request("second", "r", retries=2, backoff=backoff)
    second = rv.wait_phase("second", "Succeeded", "Incomplete")
    assert second["status"]["phase"] == "Succeeded", second["status"]["report"]
    entry = rv.step_status(second, 0)
    assert entry["attempts"] == 4 and entry["firstAttempt"] == 3
    [undo] = rv.undo("r")
    assert undo["attempts"] == 4 and undo["idempotencyKey"] == key and undo["request"] == "second"
    jobs = _jobs(rv, "compensator", 0)
    assert sorted(int(j.metadata.labels["reversi.dev/attempt"]) for j in jobs) == [1, 2, 3, 4]
    assert len({j.metadata.name for j in jobs}) == 4
    assert {j.metadata.annotations["reversi.dev/request"] for j in jobs
            if j.metadata.labels["reversi.dev/attempt"] in ("3", "4")} \
        == {"second"}
    keys = {rv.secret_env(j, "REVERSI_IDEMPOTENCY_KEY") for j in jobs}
    assert len(keys) == 1, "every attempt of both requests carries the same idempotency key"
    assert len(rv.downstream.calls("/payments/refunds", since=rv.started)) == 1  # one real refund
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True


NO_READ_BACK = [{"name": "inventory.hold", "effect": "write",
                 "compensation": {"tool": "inventory.release", "kind": "inverse",
                                  "args": {"reservation_id": "$result.id"}, "runner": "tools"}}]


def test_rule5_no_read_back_declared_is_compensated_complete_and_says_so(rv, cluster):
    rv.apply_manifest(extra_tools=NO_READ_BACK)
    hold = rv.reserve("o-noread")
    rv.run("r", [rv.step(0, "inventory.hold", {"sku": "sku-mug", "qty": 1}, hold)])
    plan = json.loads(kr(cluster, "plan", "r", "-o", "json", namespace=rv.ns).stdout)
    assert plan["actions"][0]["verified"] is False and "no read-back declared" in plan["actions"][0]["reason"]
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete")
    report = req["status"]["report"]
    assert req["status"]["phase"] == "Succeeded" and report["complete"] is True, report
    assert report["compensated"] == [0] and report["noReadBack"] == [0] and report.get("unverified", []) == []
    verified = rv.condition(rv.step_status(req, 0), "Verified")
    assert verified["status"] == "False" and verified["reason"] == "NoReadBackDeclared"
    [undo] = rv.undo("r")
    assert undo["state"] == "compensated" and undo["verification"] == "none"
    assert len(_jobs(rv, "compensator", 0)) == 1 and _jobs(rv, "reader") == []
    assert rv.downstream.get(f"/inventory/reservations/{hold['id']}")["status"] == "released"
    assert len(rv.downstream.calls(f"/inventory/reservations/{hold['id']}/release", since=rv.started)) == 1
    described = kr(cluster, "describe", "undo", namespace=rv.ns).stdout
    assert "step 0  inventory.hold: undone, no read-back declared" in described
    assert "Unverified" not in described


def test_rule5_require_verification_makes_an_undo_without_read_back_unverified(rv):
    rv.apply_manifest(extra_tools=NO_READ_BACK)
    hold = rv.reserve("o-required")
    rv.run("r", [rv.step(0, "inventory.hold", {"sku": "sku-mug", "qty": 1}, hold)])
    rv.request("undo", "r", requireVerification=True)
    req = rv.wait_phase("undo", "Succeeded", "Incomplete")
    report = req["status"]["report"]
    assert req["status"]["phase"] == "Incomplete" and report["unverified"] == [0], report
    assert report.get("compensated", []) == [] and report["complete"] is False
    assert rv.condition(rv.step_status(req, 0), "Verified")["reason"] == "ReadBackRequired"
    assert len(_jobs(rv, "compensator", 0)) == 1  # the undo ran once: only the verdict differs
    assert rv.downstream.get(f"/inventory/reservations/{hold['id']}")["status"] == "released"


def test_cli_rollback_json_report_and_dry_run_exit_code(rv, cluster):
    rv.apply_manifest()
    s0, charge = _charge_step(rv, 0, "o-json")
    rv.run("r", [s0, rv.step(1, "email.send", {"to": "customer"}, {"id": "msg_1"})])
    run_uid = rv.get("runs", "r")["metadata"]["uid"]
    plan = kr(cluster, "plan", "r", "-o", "json", namespace=rv.ns)
    assert plan.returncode == 2 and json.loads(plan.stdout)["runId"] == run_uid
    dry = kr(cluster, "rollback", "r", "--dry-run", "--wait", "--name", "dry", namespace=rv.ns)
    assert dry.returncode == 2, (dry.stdout, dry.stderr)  # email.send cannot be taken back
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is False
    done = kr(cluster, "rollback", "r", "--wait", "-o", "json", "--name", "real", namespace=rv.ns)
    assert done.returncode == 2, (done.stdout, done.stderr)
    report = json.loads(done.stdout)  # stdout is the report alone, with the API's names (status.report)
    for field in ("compensated", "skipped", "failed", "unrecoverable", "unresolved", "unmanifested", "deferred",
                  "awaitingApproval", "unverified", "complete"):
        assert field in report
    described = kr(cluster, "describe", "real", "-o", "yaml", namespace=rv.ns)
    assert described.returncode == 0 and yaml.safe_load(described.stdout) == report  # the same report
    assert kr(cluster, "describe", "real", "-o", "name", namespace=rv.ns).stdout == \
        "rollbackrequest.reversi.dev/real\n"
    assert report["compensated"] == [0] and [u["step"] for u in report["unrecoverable"]] == [1]
    assert report["complete"] is False and report["request"] == f"{rv.ns}/real"
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    assert len(_jobs(rv, "compensator", 0)) == 1


def test_cli_halt_lift_all_asks_first(rv, cluster):
    for name in ("h1", "h2"):
        assert kr(cluster, "halt", "add", name, "--reason", "pause", namespace=rv.ns).returncode == 0
    refused = subprocess_input(cluster, rv, "n\n")
    assert refused.returncode == 1 and "Nothing lifted" in refused.stdout
    assert sorted(h["metadata"]["name"] for h in rv.custom.list_namespaced_custom_object(
        "reversi.dev", "v1alpha1", rv.ns, "halts")["items"]) == ["h1", "h2"]
    lifted = kr(cluster, "halt", "lift", "--all", "--yes", namespace=rv.ns)
    assert lifted.returncode == 0 and "h1" in lifted.stdout and "h2" in lifted.stdout
    assert rv.custom.list_namespaced_custom_object("reversi.dev", "v1alpha1", rv.ns, "halts")["items"] == []


def subprocess_input(cluster, rv, answer: str):
    import subprocess
    import sys
    cmd = [sys.executable, "-m", "reversi.entrypoints.plugin", "--kubeconfig", str(cluster.paths.admin_kubeconfig),
           "-n", rv.ns, "halt", "lift", "--all"]
    return subprocess.run(cmd, input=answer, capture_output=True, text=True, timeout=60)


def test_rule8_a_denied_compensation_is_not_undone_and_the_request_finishes(rv, cluster):
    rv.apply_manifest()  # payments.capture requires approval; it requires the charge
    s0, charge = _charge_step(rv, 0, "o-deny")
    capture = rv.capture(charge["id"])
    rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, capture)])
    asked = time.time()
    rv.request("undo", "r")
    rv.wait_phase("undo", "AwaitingApproval")
    denied = kr(cluster, "deny", "undo", "--step", "1", "--note", "the customer keeps the goods", namespace=rv.ns)
    assert denied.returncode == 0, denied.stderr
    req = rv.wait_phase("undo", "Incomplete", "Succeeded")
    report = req["status"]["report"]
    assert req["status"]["phase"] == "Incomplete"
    assert report["awaitingApproval"] == [1]
    assert report["denied"] == [{"step": 1, "reason": "denied by reversi-admin: the customer keeps the goods"}]
    assert report["deferred"] == [{"step": 0, "blockedBy": [1]}]  # the charge stays: its capture stands
    approved = rv.condition(rv.step_status(req, 1), "Approved")
    assert approved["reason"] == "Denied" and "denied by reversi-admin" in approved["message"]
    assert [d["actor"] for d in rv.get("rollbackrequests", "undo")["spec"]["denials"]] == ["reversi-admin"]
    assert _jobs(rv, "compensator") == []
    assert rv.downstream.get(f"/payments/captures/{capture['id']}")["status"] != "voided"
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is False
    assert rv.downstream.calls("/payments/", since=asked) == [], "no undo call reached the payments API"
    described = kr(cluster, "describe", "undo", namespace=rv.ns).stdout
    assert "denied by reversi-admin: the customer keeps the goods" in described


def test_rule8_denying_needs_the_approve_permission_and_records_the_actor(rv, users, namespace):  # noqa: F811
    rv.apply_manifest()
    s0, charge = _charge_step(rv, 0, "o-deny-rbac")
    capture = rv.capture(charge["id"])
    rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, capture)])
    rv.request("undo", "r")
    rv.wait_phase("undo", "AwaitingApproval")
    deny = {"spec": {"denials": [{"step": 1, "note": "no", "actor": "someone-else"}]}}
    oncall = client.CustomObjectsApi(users["oncall"])
    with pytest.raises(ApiException) as err:
        oncall.patch_namespaced_custom_object("reversi.dev", "v1alpha1", namespace, "rollbackrequests", "undo", deny)
    assert err.value.status == 403 and "oncall may not deny step(s) [1]" in err.value.body
    approver = client.CustomObjectsApi(users["approver"])
    approver.patch_namespaced_custom_object("reversi.dev", "v1alpha1", namespace, "rollbackrequests", "undo", deny)
    req = rv.wait_phase("undo", "Incomplete", "Succeeded")
    assert req["spec"]["denials"][0]["actor"] == "approver", "the actor is stamped, never taken from the request"
    assert req["status"]["report"]["denied"] == [{"step": 1, "reason": "denied by approver: no"}]
    assert _jobs(rv, "compensator") == []


def _reconfigure(rv, **kwargs):
    """Change the ToolManifest's runners and tools now (the steps keep their snapshots)."""
    from tests.integration.conftest import manifest_body
    rv.patch("toolmanifests", "payments", {"spec": manifest_body(rv.downstream.url, **kwargs)["spec"]})


def test_rule5_a_later_request_reverifies_an_unverified_undo_without_undoing_it_again(rv):
    rv.apply_manifest(reader=False)  # a read-back is declared, but no reader runner
    s0, _charge = _charge_step(rv, 0, "o-reverify")
    s1, _other = _charge_step(rv, 1, "o-reverify-bad")
    rv.run("r", [s0, s1])
    rv.request("first", "r")
    first = rv.wait_phase("first", "Incomplete")
    assert first["status"]["report"]["unverified"] == [0, 1]
    assert _jobs(rv, "reader") == [] and len(_jobs(rv, "compensator")) == 2
    _reconfigure(rv)  # a reader runner is configured now
    rv.request("second", "r")
    second = rv.wait_phase("second", "Succeeded", "Incomplete")
    assert second["status"]["phase"] == "Succeeded", json.dumps([second["status"]["report"], second["status"]["steps"],
                                                                 rv.undo("r")])
    assert second["status"]["report"]["compensated"] == [0, 1] and second["status"]["report"].get("unverified",
                                                                                                  []) == []
    assert len(_jobs(rv, "compensator")) == 2, "no compensator ran again"
    readers = _jobs(rv, "reader")
    assert sorted(int(j.metadata.labels["reversi.dev/step"]) for j in readers) == [0, 1]
    assert {j.metadata.annotations["reversi.dev/request"] for j in readers} == {"second"}
    assert len(rv.downstream.calls("/payments/refunds", since=rv.started)) == 2  # one refund per charge, ever
    undo = {u["step"]: u for u in rv.undo("r")}
    assert undo[0]["verification"] == "verified" and undo[0]["request"] == "first"
    assert undo[0]["verifiedBy"] == "second" and undo[0]["verifiedAt"]
    assert rv.get("rollbackrequests", "first")["status"]["report"]["unverified"] == [0, 1], "never rewritten"
    assert rv.condition(rv.step_status(second, 0), "Verified")["reason"] == "Verified"


def test_rule5_a_reverify_that_fails_is_journaled_as_verification_failed(rv):
    rv.apply_manifest(reader=False)
    s0, charge = _charge_step(rv, 0, "o-reverify-fail")
    rv.run("r", [s0])
    rv.request("first", "r")
    assert rv.wait_phase("first", "Incomplete")["status"]["report"]["unverified"] == [0]
    _reconfigure(rv, reader_command=["sh", "-c", "echo this is not json"])
    rv.request("second", "r")
    second = rv.wait_phase("second", "Succeeded", "Incomplete")
    report = second["status"]["report"]
    assert second["status"]["phase"] == "Incomplete" and [f["step"] for f in report["failed"]] == [0], report
    assert "read failed" in report["failed"][0]["error"]
    [undo] = rv.undo("r")
    assert undo["state"] == "compensationFailed" and undo["verification"] == "verificationFailed"
    assert undo["verifiedBy"] == "second" and undo["request"] == "first"
    assert len(_jobs(rv, "compensator")) == 1, "a re-verify never runs the compensator"
    assert len(_jobs(rv, "reader")) == 2  # the declared retries: 2 read-backs
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True

