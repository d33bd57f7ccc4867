"""Adversarial findings on cancel, delete, guards, force and the run boundary (the breaker's pass).

Each test reproduces one problem found by using the newest features the way a hostile or careless
user would, against the real control plane. Downstream truth is the demo server's state and its
log of calls; compensator and guard Jobs are counted by their labels.
"""

from __future__ import annotations

import time

import pytest

from tests.helpers import wait_for
from tests.integration.test_plugin import kr

pytestmark = pytest.mark.cluster


def _jobs(rv, role: str, step: int | None = None) -> list:
    selector = f"reversi.dev/role={role}" + (f",reversi.dev/step={step}" if step is not None else "")
    return rv.batch.list_namespaced_job(rv.ns, label_selector=selector).items


def _tool(name: str, compensation: dict, verification: dict | None = None) -> dict:
    entry = {"name": name, "effect": "write", "compensation": {"runner": "tools", **compensation}}
    if verification:
        entry["verification"] = {"runner": "tools", "retries": 2, "backoffMs": 200, **verification}
    return entry


VOID = {"tool": "payments.void_capture", "kind": "inverse", "args": {"capture_id": "$result.id"}}
CAPTURE_READ = {"tool": "payments.get_capture", "args": {"capture_id": "$result.id"}, "expect": {"status": "voided"}}


def _witnessed(name: str, expect: dict) -> dict:
    """A capture whose void is guarded by a read of its charge that must contain ``expect``."""
    return _tool(name, {**VOID, "precondition": {"tool": "payments.get_charge",
                                                  "args": {"charge_id": "$args.charge_id"}, "expect": expect}},
                 CAPTURE_READ)


def _voids(rv, since: float) -> list[str]:
    return [c["path"] for c in rv.downstream.calls("/payments/captures/", since=since) if c["path"].endswith("/void")]


def test_a_new_request_reads_the_precondition_again_instead_of_adopting_an_earlier_requests_answer(rv):
    """Request A finds the precondition broken (conflict, nothing undone). Then the state is put
    right, so the precondition holds. Request B must read it again and undo the step: a conflict
    is not journaled, so B starts the same attempt, and the guard read's deterministic Job name
    must not hand B the answer A got earlier."""
    tool = _witnessed("payments.capture_after_refund", {"refunded": True})
    rv.apply_manifest(extra_tools=[tool])
    charge = rv.charge("o-stale")
    capture = rv.capture(charge["id"])
    rv.run("r", [rv.step(0, tool["name"], {"charge_id": charge["id"]}, capture)])
    rv.request("a", "r")
    a = rv.wait_phase("a", "Incomplete", "Succeeded", "Failed")
    assert [x["step"] for x in a["status"]["report"]["conflict"]] == [0], a["status"]["report"]
    since = time.time()
    rv.downstream.post("/payments/refunds", {"charge_id": charge["id"]})  # now the precondition holds
    rv.request("b", "r")
    b = rv.wait_phase("b", "Incomplete", "Succeeded", "Failed")
    report = b["status"]["report"]
    assert report["compensated"] == [0] and report["conflict"] == [], report
    assert _voids(rv, since) == [f"/payments/captures/{capture['id']}/void"]
    assert rv.downstream.get(f"/payments/captures/{capture['id']}")["status"] == "voided"


def test_a_precondition_that_held_for_a_cancelled_request_is_read_again_by_the_next_one(rv, cluster):
    """The dangerous direction: request A's precondition read says "holds", but A is cancelled
    while that read runs, so no compensator starts and nothing is journaled. Then someone changes
    the state (the precondition no longer holds). Request B, not forced, must see the conflict and
    leave the capture alone; adopting A's old answer would undo it over a conflict without force."""
    tool = _witnessed("payments.capture_witnessed", {"refunded": False})
    rv.apply_manifest(extra_tools=[tool])
    charge = rv.charge("o-cancel-guard")
    capture = rv.capture(charge["id"])
    rv.run("r", [rv.step(0, tool["name"], {"charge_id": charge["id"]}, capture)])
    rv.downstream.fault(f"/payments/charges/{charge['id']}", "timeout", times=1, delay_s=5)  # a slow read
    rv.request("a", "r")
    wait_for(lambda: _jobs(rv, "precondition", 0), timeout=60, what="A's precondition read to start")
    proc = kr(cluster, "cancel", "a", namespace=rv.ns)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    a = rv.wait_phase("a", "Incomplete", "Succeeded", "Failed", timeout=60)
    assert a["status"]["report"]["cancelled"] == [0], a["status"]["report"]
    assert _jobs(rv, "compensator") == []
    since = time.time()
    rv.downstream.post("/payments/refunds", {"charge_id": charge["id"]})  # the precondition is broken now
    rv.request("b", "r")
    b = rv.wait_phase("b", "Incomplete", "Succeeded", "Failed")
    report = b["status"]["report"]
    assert [x["step"] for x in report["conflict"]] == [0] and report["compensated"] == [], report
    assert _voids(rv, since) == [] and _jobs(rv, "compensator") == []
    assert rv.downstream.get(f"/payments/captures/{capture['id']}")["status"] == "captured"


# ---------------------------------------------------------------------------- probes that held up
G, V = "reversi.dev", "v1alpha1"


def _user_api(rv, cluster, namespace: str, user: str, verbs: list[str]):
    """A CustomObjectsApi for ``user``, who may only ``verbs`` rollbackrequests in ``namespace``."""
    from kubernetes import client, config

    rbac = client.RbacAuthorizationV1Api(rv.api)
    rules = [{"apiGroups": [G], "resources": ["rollbackrequests"], "verbs": verbs},
             {"apiGroups": [G], "resources": ["runs", "runsteps"], "verbs": ["get", "list"]}]
    rbac.create_namespaced_role(namespace, {"metadata": {"name": user}, "rules": rules})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": user}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": user},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    return client.CustomObjectsApi(config.new_client_from_config(config_file=str(cluster.kubeconfig_for(user))))


def _refused(call, status: int | None = None) -> str:
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as err:
        call()
    if status is not None:
        assert err.value.status == status, (err.value.status, err.value.body)
    return err.value.body


def test_forged_stamps_and_cancel_then_uncancel_are_refused_or_overwritten(rv, cluster, namespace):
    """Forged cancelledBy / force actor / forcedAt never stick; cancel cannot be undone; a user
    without the verb force can neither add a force by a later patch nor rewrite an admin's."""
    tool = _witnessed("payments.capture_witnessed", {"refunded": False})
    rv.apply_manifest(extra_tools=[tool])
    charge = rv.charge("o-forge")
    rv.run("r", [rv.step(0, tool["name"], {"charge_id": charge["id"]}, rv.capture(charge["id"]))])
    body = {"apiVersion": f"{G}/{V}", "kind": "RollbackRequest", "metadata": {"name": "forged"},
            "spec": {"runRef": {"name": "r"}, "dryRun": True, "cancelledBy": "mallory",
                     "force": [{"step": 0, "actor": "mallory", "forcedAt": "2000-01-01T00:00:00Z"}]}}
    made = rv.create("rollbackrequests", body)
    assert "cancelledBy" not in made["spec"] or made["spec"]["cancelledBy"] is None, made["spec"]
    force = made["spec"]["force"][0]
    assert force["actor"] != "mallory" and not force["forcedAt"].startswith("2000"), force
    oncall = _user_api(rv, cluster, namespace, "oncall", ["get", "list", "create", "patch"])
    # rewriting the admin's force entry: refused (the actor never changes); sent without it, carried over
    msg = _refused(lambda: oncall.patch_namespaced_custom_object(
        G, V, namespace, "rollbackrequests", "forged", {"spec": {"force": [{"step": 0, "actor": "oncall-fake"}]}}), 422)
    assert "actor cannot change" in msg
    patched = oncall.patch_namespaced_custom_object(G, V, namespace, "rollbackrequests", "forged",
                                                    {"spec": {"force": [{"step": 0}]}})
    assert patched["spec"]["force"][0]["actor"] == force["actor"], patched["spec"]["force"]
    # adding a force later needs the verb too
    rv.create("rollbackrequests", {**body, "metadata": {"name": "plain"}, "spec": {"runRef": {"name": "r"},
                                                                                   "dryRun": True}})
    msg = _refused(lambda: oncall.patch_namespaced_custom_object(
        G, V, namespace, "rollbackrequests", "plain", {"spec": {"force": [{"step": 0}]}}), 403)
    assert "force" in msg
    # cancel, then un-cancel; and a forged cancelledBy on the cancelling patch
    done = oncall.patch_namespaced_custom_object(G, V, namespace, "rollbackrequests", "plain",
                                                 {"spec": {"cancel": True, "cancelledBy": "someone-else"}})
    assert done["spec"]["cancelledBy"] == "oncall", done["spec"]
    msg = _refused(lambda: rv.patch("rollbackrequests", "plain", {"spec": {"cancel": False}}), 422)
    assert "cannot be undone" in msg
    again = rv.patch("rollbackrequests", "plain", {"spec": {"cancelledBy": "admin"}})
    assert again["spec"]["cancelledBy"] == "oncall", again["spec"]  # the server's word is kept


def test_recovery_required_cannot_be_relaxed_and_refuses_each_kind_of_unundoable_call(rv):
    """A strict run stays strict, and every call it could not undo is refused before it is made."""
    from reversi.adapters.journal import step_body

    rv.apply_manifest()
    rv.create("runs", {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": "strict"},
                       "spec": {"mode": "observe", "recovery": "required", "scope": {"actor": "a"},
                                "manifestRef": {"name": "payments"}}})
    msg = _refused(lambda: rv.patch("runs", "strict", {"spec": {"recovery": "bestEffort"}}), 422)
    assert "recovery" in msg
    for i, tool in enumerate(["email.send", "tool.not_in_manifest"]):
        msg = _refused(lambda tool=tool: rv.create("runsteps", step_body(
            rv.ns, "strict", {"index": 0, "tool": tool, "args": {}, "outcome": "intended"})))
        assert "recovery required" in msg and tool in msg, (i, msg)
    # a forged snapshot that claims an undo does not help: the server's manifest decides
    forged = {"index": 0, "tool": "email.send", "args": {}, "outcome": "intended",
              "snapshot": {"name": "email.send", "effect": "write",
                           "compensation": {"tool": "email.unsend", "kind": "inverse", "args": {},
                                            "runner": "tools"}}}
    msg = _refused(lambda: rv.create("runsteps", step_body(rv.ns, "strict", forged)))
    assert "recovery required" in msg
    assert rv.steps("strict") == []


def test_forcing_a_step_the_run_lacks_or_one_without_a_precondition_is_refused_like_an_approval(rv):
    """spec.force is "checked like approvals" (issue 9): an approval of a step that does not exist
    or needs no approval is refused with the reason; a force of step 7 of a one-step run, or of a
    step whose compensation has no precondition, was admitted and silently did nothing (a typo in
    the step number left the real conflict standing, with no word why)."""
    tool = _witnessed("payments.capture_witnessed", {"refunded": False})
    rv.apply_manifest(extra_tools=[tool])
    charge = rv.charge("o-force-typo")
    held = rv.reserve("o-force-typo")
    rv.run("r", [rv.step(0, tool["name"], {"charge_id": charge["id"]}, rv.capture(charge["id"])),
                 rv.step(1, "inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-force-typo"}, held)])

    def request(name: str, step: int) -> dict:
        return rv.create("rollbackrequests", {"apiVersion": f"{G}/{V}", "kind": "RollbackRequest",
                                              "metadata": {"name": name},
                                              "spec": {"runRef": {"name": "r"}, "dryRun": True,
                                                       "force": [{"step": step}]}})

    msg = _refused(lambda: request("typo", 7), 422)
    assert "force of step 7: the run has no such step" in msg, msg
    msg = _refused(lambda: request("no-precondition", 1), 422)
    assert "force of step 1: its compensation has no precondition" in msg, msg
    assert request("right", 0)["spec"]["force"][0]["step"] == 0
