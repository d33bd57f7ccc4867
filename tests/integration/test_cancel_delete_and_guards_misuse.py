"""Cancel, delete, guards, force and the run boundary, used the way a hostile or careless user would.

Each test reproduces one problem such use once caused, against the real control plane. Downstream
truth is the demo server's state and its log of calls; compensator and guard Jobs are counted by
their labels.
"""

from __future__ import annotations

import os

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
    read = f"/payments/charges/{charge['id']}"
    rv.downstream.fault(read, "hold", times=1, delay_s=60)  # the read answers once released
    rv.request("a", "r")
    wait_for(lambda: _jobs(rv, "precondition", 0), timeout=60, what="A's precondition read to start")
    proc = kr(cluster, "cancel", "a", namespace=rv.ns)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    rv.downstream.post("/_release", {"path_prefix": read})  # the read says "holds" after the cancel
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
    """spec.force is "checked like approvals" (rule 16): an approval of a step that does not exist
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


def test_an_operator_killed_during_a_precondition_read_adopts_that_read_after_restart(rv, operator):
    """SIGKILL while the precondition read runs: the restarted operator finds the request's own
    read Job (by its request-uid label) instead of starting a second one, and undoes the step once."""
    tool = _witnessed("payments.capture_witnessed", {"refunded": False})
    rv.apply_manifest(extra_tools=[tool])
    charge = rv.charge("o-kill-guard")
    capture = rv.capture(charge["id"])
    rv.run("r", [rv.step(0, tool["name"], {"charge_id": charge["id"]}, capture)])
    read = f"/payments/charges/{charge['id']}"
    rv.downstream.fault(read, "hold", times=1, delay_s=60)  # the read answers once released
    since = time.time()
    rv.request("undo", "r")
    wait_for(lambda: _jobs(rv, "precondition", 0), timeout=60, what="the precondition read to start")
    operator.kill()
    try:
        rv.downstream.post("/_release", {"path_prefix": read})  # it answers while no operator runs
        operator.start()
    finally:
        assert operator.alive()
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", "Failed")
    assert req["status"]["phase"] == "Succeeded", req["status"]["report"]
    assert len(_jobs(rv, "precondition")) == 1 and len(_jobs(rv, "compensator")) == 1
    assert _voids(rv, since) == [f"/payments/captures/{capture['id']}/void"]


def test_cancel_while_awaiting_approval_then_a_late_approval_runs_nothing(rv, cluster):
    """A request waiting for an approval is cancelled; an approval arriving after that changes
    nothing: the step stays cancelled, no compensator ever runs, the Run is free."""
    rv.apply_manifest()  # payments.capture's void requires approval
    charge = rv.charge("o-appr")
    capture = rv.capture(charge["id"])
    rv.run("r", [rv.step(0, "payments.capture", {"charge_id": charge["id"]}, capture)])
    rv.request("undo", "r")
    rv.wait_phase("undo", "AwaitingApproval")
    proc = kr(cluster, "cancel", "undo", namespace=rv.ns)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    req = rv.wait_phase("undo", "Incomplete", "Succeeded", "Failed")
    assert req["status"]["report"]["cancelled"] == [0], req["status"]["report"]
    gen = rv.patch("rollbackrequests", "undo", {"spec": {"approvals": [{"step": 0}]}})["metadata"]["generation"]
    late = wait_for(lambda: (lambda o: o if o["status"].get("observedGeneration") == gen else None)(
        rv.get("rollbackrequests", "undo")), timeout=30, what="the late approval to be observed")
    assert late["status"]["phase"] == "Incomplete" and late["status"]["report"]["cancelled"] == [0]
    assert _jobs(rv, "compensator") == []
    assert not (rv.get("runs", "r").get("status") or {}).get("activeRequest")
    assert rv.downstream.get(f"/payments/captures/{capture['id']}")["status"] == "captured"


def test_deleting_a_request_during_its_precheck_read_leaves_the_run_free_and_the_next_reads_again(rv):
    """Delete the request while its precheck read runs (nothing journaled yet): the Run is
    released, nothing is left compensating, and the next request reads for itself: the step was
    undone by hand in between, so it is alreadyRecovered and no compensator ever runs."""
    tool = _tool("payments.charge_prechecked", {"tool": "payments.refund", "kind": "compensation",
                                                "args": {"charge_id": "$result.id"}, "precheck": True},
                 {"tool": "payments.get_charge", "args": {"charge_id": "$result.id"}, "expect": {"refunded": True}})
    rv.apply_manifest(extra_tools=[tool])
    charge = rv.charge("o-del-pre")
    rv.run("r", [rv.step(0, tool["name"], {"order_id": "o-del-pre", "amount": 700, "customer": "cus_9"}, charge)])
    read = f"/payments/charges/{charge['id']}"
    rv.downstream.fault(read, "hold", times=1, delay_s=60)  # the read answers once released
    rv.request("first", "r")
    wait_for(lambda: _jobs(rv, "precheck", 0), timeout=60, what="the precheck read to start")
    rv.custom.delete_namespaced_custom_object(G, V, rv.ns, "rollbackrequests", "first")
    rv.downstream.post("/_release", {"path_prefix": read})
    wait_for(lambda: not (rv.get("runs", "r").get("status") or {}).get("activeRequest"), timeout=30,
             what="the Run to be released")
    assert rv.undo("r") == []  # a read journals nothing
    since = time.time()
    rv.downstream.post("/payments/refunds", {"charge_id": charge["id"]})  # undone by hand meanwhile
    rv.request("second", "r")
    req = rv.wait_phase("second", "Succeeded", "Incomplete", "Failed")
    report = req["status"]["report"]
    assert req["status"]["phase"] == "Succeeded" and report["alreadyRecovered"] == [0], report
    assert _jobs(rv, "compensator") == [] and len(_jobs(rv, "precheck", 0)) == 2
    refunds = [c for c in rv.downstream.state()["calls"] if c["path"] == "/payments/refunds" and c["at"] >= since]
    assert len(refunds) == 1  # only the hand-made one


def test_cancelling_a_waiting_request_never_touches_the_lock_of_the_one_that_holds_the_run(rv, cluster):
    """B waits behind A; cancelling B ends B without taking or releasing the Run's lock and without
    recording runners (it used to record them, and say RunnersRecorded, although it never took the
    lock and started nothing); A goes on and undoes everything once; a new step stays refused."""
    from reversi.adapters.journal import step_body

    rv.apply_manifest()
    charges = [rv.charge(f"o-wait-{i}") for i in range(2)]
    rv.run("r", [rv.step(i, "payments.create_charge", {"order_id": f"o-wait-{i}", "amount": 700,
                                                       "customer": "cus_9"}, c) for i, c in enumerate(charges)])
    rv.downstream.fault("/payments/refunds", "timeout", times=1, delay_s=5)
    rv.request("a", "r")
    wait_for(lambda: _jobs(rv, "compensator", 1), timeout=60, what="A's first compensator")
    rv.request("b", "r")
    rv.wait_phase("b", "Waiting")
    proc = kr(cluster, "cancel", "b", namespace=rv.ns)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    b = rv.wait_phase("b", "Incomplete", "Succeeded", "Failed")
    # it never took the lock, so it recorded no runners (status.runners: "unset before the lock")
    assert b["status"].get("runSteps") is None and not b["status"].get("runners"), b["status"]
    events = rv.core.list_namespaced_event(rv.ns, field_selector="involvedObject.name=b").items
    assert "RunnersRecorded" not in {e.reason for e in events}
    assert rv.get("runs", "r")["status"]["activeRequest"] == "a"
    msg = _refused(lambda: rv.create("runsteps", step_body(rv.ns, "r", rv.step(
        2, "payments.get_customer", {"customer": "cus_9"}, {"id": "cus_9"}))))
    assert "run is being rolled back by RollbackRequest a" in msg, msg
    a = rv.wait_phase("a", "Succeeded", "Incomplete", "Failed")
    assert a["status"]["phase"] == "Succeeded", a["status"]["report"]
    assert len(_jobs(rv, "compensator")) == 2
    refunds = [c for c in rv.downstream.state()["calls"] if c["path"] == "/payments/refunds"]
    assert len(refunds) == 2 and all(rv.downstream.get(f"/payments/charges/{c['id']}")["refunded"] for c in charges)


def test_a_run_deleted_and_recreated_mid_rollback_is_never_reported_undone_by_the_old_request(rv):
    """A GitOps re-sync (delete and create) replaces the Run while its rollback runs. The request
    holds the old Run's progress (status.steps, runSteps, runners); the new Run, same name, other
    uid, has other calls that nobody undid. The request must not carry the old Run's "compensated"
    over to the new Run's steps: it fails (its Run is gone) and leaves the new Run to a new request."""
    from reversi.adapters.journal import step_body

    rv.apply_manifest()

    def steps(tag: str) -> tuple[list[dict], list[dict]]:
        charges = [rv.charge(f"o-{tag}-{i}") for i in range(2)]
        return [rv.step(i, "payments.create_charge", {"order_id": f"o-{tag}-{i}", "amount": 700, "customer": "cus_9"},
                        c) for i, c in enumerate(charges)], charges

    old_steps, _old = steps("old")
    rv.run("r", old_steps)
    old_uid = rv.get("runs", "r")["metadata"]["uid"]
    rv.downstream.post("/_faults", {"path_prefix": "/payments/refunds", "mode": "timeout", "times": 1,
                                    "delay_s": 6, "skip": 1})  # step 1's refund is quick, step 0's slow
    rv.request("undo", "r", retries=1)
    wait_for(lambda: _jobs(rv, "compensator", 0), timeout=60, what="step 0's (slow) compensator")
    rv.custom.delete_namespaced_custom_object(G, V, rv.ns, "runs", "r")
    wait_for(lambda: not rv.steps("r") and not _exists(rv, "runs", "r"), timeout=30, what="the old Run to be gone")
    new_steps, new = steps("new")
    rv.create("runs", {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": "r"},
                       "spec": {"mode": "enforce", "scope": {"actor": "test-agent"},
                                "manifestRef": {"name": "payments"}}})
    for step in new_steps:
        rv.create("runsteps", step_body(rv.ns, "r", step))
    assert rv.get("runs", "r")["metadata"]["uid"] != old_uid
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", "Failed", timeout=120)
    # it used to lock the new Run and report Succeeded, compensated [0, 1], with new step 1 never refunded
    assert req["status"]["phase"] == "Failed", req["status"]
    invalid = next(x for x in req["status"]["conditions"] if x["type"] == "Invalid")
    assert invalid["reason"] == "RunNotFound" and "was deleted" in invalid["message"], invalid
    assert not any(rv.downstream.get(f"/payments/charges/{c['id']}")["refunded"] for c in new)
    status = rv.get("runs", "r").get("status") or {}
    assert not status.get("activeRequest") and not status.get("closedBy"), status  # the new Run is untouched
    rv.request("again", "r")
    again = rv.wait_phase("again", "Succeeded", "Incomplete", "Failed")
    assert again["status"]["phase"] == "Succeeded" and again["status"]["report"]["compensated"] == [0, 1]
    assert all(rv.downstream.get(f"/payments/charges/{c['id']}")["refunded"] for c in new)


def test_a_run_found_then_deleted_while_its_request_waits_fails_the_request_at_once(rv):
    """A request that found its Run (here: waiting for another request to release it) does not wait
    for a Run deleted since as for one not created yet: RunNotFound at once, saying it was deleted.
    (A Run never found is waited for up to REVERSI_RUN_WAIT_SECONDS: 8 s in these tests, 300 s by
    default.)"""
    rv.apply_manifest()
    charge = rv.charge("o-w")
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-w", "amount": 700, "customer": "cus_9"},
                         charge)])
    rv.downstream.post("/_faults", {"path_prefix": "/payments/refunds", "mode": "timeout", "times": 1,
                                    "delay_s": 20})
    rv.request("first", "r", retries=1)
    wait_for(lambda: _jobs(rv, "compensator", 0), timeout=60, what="the first request's (slow) compensator")
    rv.request("second", "r")
    rv.wait_phase("second", "Waiting", timeout=60)
    rv.custom.delete_namespaced_custom_object(G, V, rv.ns, "runs", "r")
    req = rv.wait_phase("second", "Failed", timeout=60)
    invalid = next(x for x in req["status"]["conditions"] if x["type"] == "Invalid")
    assert invalid["reason"] == "RunNotFound", invalid
    assert "was deleted after this request found it" in invalid["message"], invalid


def _exists(rv, plural: str, name: str) -> bool:
    from kubernetes.client.rest import ApiException

    try:
        rv.get(plural, name)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


@pytest.mark.parametrize("compensation, words", [
    ({"windowSeconds": 0}, "windowSeconds"),
    ({"windowSeconds": -5}, "windowSeconds"),
    ({"windowSeconds": 10 * 366 * 86400 + 1}, "windowSeconds"),
    ({"windowSeconds": "180d"}, "windowSeconds"),
    ({"precheck": "yes"}, "precheck"),
    ({"precondition": {"tool": "payments.get_charge", "args": {}, "expect": {"refunded": False},
                       "runner": "nobody"}}, "precondition.runner"),
    ({"precondition": {"tool": "payments.get_charge", "args": {}, "expect": [1]}}, "expect"),
    ({"precondition": {"tool": "payments.get_charge", "args": {}}}, "expect"),
])
def test_bad_guards_in_a_manifest_are_refused_with_the_field(rv, compensation, words):
    tool = _tool("payments.guarded", {**VOID, **compensation}, CAPTURE_READ)
    from tests.integration.conftest import manifest_body

    msg = _refused(lambda: rv.create("toolmanifests", manifest_body(rv.downstream.url, extra_tools=[tool])))
    assert words in msg, msg


@pytest.mark.parametrize("spec, words", [
    ({"compensationDeadlineSeconds": 0}, "compensationDeadlineSeconds"),
    ({"compensationDeadlineSeconds": -1}, "compensationDeadlineSeconds"),
    ({"compensationDeadlineSeconds": 7 * 86400 + 1}, "compensationDeadlineSeconds"),
    ({"compensationDeadlineSeconds": "1h"}, "compensationDeadlineSeconds"),
    ({"force": [{"step": -1}]}, "force"),
    ({"force": [{"step": "0"}]}, "force"),
    ({"force": [0]}, "force"),
    ({"force": [{"step": 0}, {"step": 0}]}, "force"),
    ({"cancel": "true"}, "cancel"),
    ({"cancel": 1}, "cancel"),
])
def test_bad_rollback_request_input_is_refused_with_the_field(rv, spec, words):
    rv.apply_manifest()
    msg = _refused(lambda: rv.request("bad", "r", **spec))
    assert words in msg, msg


def test_a_request_deleted_while_the_operator_is_down_does_not_leave_the_run_locked(rv, operator):
    """Rule 14 releases the lock of a deleted request, but a deletion made while the operator is
    down is never seen as an event: with no compensator Job to settle (the request waited for an
    approval), the Run named the deleted request in status.activeRequest (Locked=True) for good."""
    rv.apply_manifest()  # payments.capture's void requires approval
    charge = rv.charge("o-down")
    capture = rv.capture(charge["id"])
    rv.run("r", [rv.step(0, "payments.capture", {"charge_id": charge["id"]}, capture)])
    rv.request("undo", "r")
    rv.wait_phase("undo", "AwaitingApproval")
    assert rv.get("runs", "r")["status"]["activeRequest"] == "undo"
    operator.kill()
    try:
        rv.custom.delete_namespaced_custom_object(G, V, rv.ns, "rollbackrequests", "undo")  # no webhook on delete
    finally:
        operator.start()
    status = wait_for(lambda: (lambda s: s if not s.get("activeRequest") else None)(
        rv.get("runs", "r").get("status") or {}), timeout=40, what="the Run to be released")
    locked = next(x for x in status["conditions"] if x["type"] == "Locked")
    assert locked["status"] == "False" and locked["reason"] == "RequestDeleted", locked
    assert _jobs(rv, "compensator") == []
    assert rv.downstream.get(f"/payments/captures/{capture['id']}")["status"] == "captured"


def test_an_imported_inline_journal_cannot_smuggle_an_irreversible_call_into_a_strict_run(rv):
    rv.apply_manifest()
    body = {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": "strict-import"},
            "spec": {"mode": "enforce", "recovery": "required", "scope": {"actor": "a"},
                     "manifestRef": {"name": "payments"},
                     "steps": [{"index": 0, "tool": "email.send", "args": {"to": "x"}, "outcome": "succeeded"}]}}
    msg = _refused(lambda: rv.create("runs", body))
    assert "recovery required" in msg and "email.send" in msg, msg


def test_cancel_then_delete_mid_call_settles_the_step_from_its_job_and_frees_the_run(rv, cluster):
    """Cancel, then delete the request while its compensator still runs: the Job is not killed,
    its outcome settles the journal (no stranded compensating), the Run is free, one refund ran."""
    rv.apply_manifest()
    charge = rv.charge("o-cd-del")
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-cd-del", "amount": 700, "customer": "cus_9"},
                         charge)])
    rv.downstream.fault("/payments/refunds", "timeout", times=1, delay_s=5)
    rv.request("undo", "r")
    wait_for(lambda: _jobs(rv, "compensator", 0), timeout=60, what="the compensator")
    assert kr(cluster, "cancel", "undo", namespace=rv.ns).returncode == 0
    rv.custom.delete_namespaced_custom_object(G, V, rv.ns, "rollbackrequests", "undo")
    wait_for(lambda: not (rv.get("runs", "r").get("status") or {}).get("activeRequest"), timeout=30,
             what="the Run to be released")
    undo = wait_for(lambda: [u for u in rv.undo("r") if u["state"] == "compensated"], timeout=60,
                    what="step 0 settled from its Job")
    assert undo[0]["verification"] == "unverified" and undo[0]["attempts"] == 1
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    assert len([c for c in rv.downstream.state()["calls"] if c["path"] == "/payments/refunds"]) == 1


def _job_done(job) -> bool:
    return bool(job.status.succeeded or job.status.failed)


CANCEL_MOMENTS = {
    "first compensator created": lambda rv: _jobs(rv, "compensator", 2),
    "first compensator finished": lambda rv: [j for j in _jobs(rv, "compensator", 2) if _job_done(j)],
    "first read-back created": lambda rv: _jobs(rv, "reader", 2),
    "second compensator created": lambda rv: _jobs(rv, "compensator", 1),
}


@pytest.mark.parametrize("moment", list(CANCEL_MOMENTS))
def test_cancel_at_each_moment_of_a_job_the_report_matches_the_downstream(rv, cluster, moment):
    """Cancel exactly when a Job appears or finishes: whatever the race, every refund the
    downstream saw is reported undone (compensated or unverified), every step reported cancelled
    had no compensator and no refund, nothing stays compensating, and the Run is free."""
    rv.apply_manifest()
    charges = [rv.charge(f"o-m-{i}") for i in range(3)]
    rv.run("r", [rv.step(i, "payments.create_charge", {"order_id": f"o-m-{i}", "amount": 700, "customer": "cus_9"}, c)
                 for i, c in enumerate(charges)])
    rv.request("undo", "r")
    wait_for(lambda: CANCEL_MOMENTS[moment](rv), timeout=60, interval=0.05, what=moment)
    assert kr(cluster, "cancel", "undo", namespace=rv.ns).returncode == 0
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", "Failed", timeout=90)
    report = req["status"]["report"]
    refunded = {i for i, c in enumerate(charges) if rv.downstream.get(f"/payments/charges/{c['id']}")["refunded"]}
    assert refunded == set(report["compensated"]) | set(report["unverified"]), (moment, refunded, report)
    for s in report["cancelled"]:
        assert _jobs(rv, "compensator", s) == [] and s not in refunded, (moment, s)
    assert set(report["compensated"]) | set(report["unverified"]) | set(report["cancelled"]) == {0, 1, 2}, report
    assert all(u["state"] != "compensating" for u in rv.undo("r"))
    assert not (rv.get("runs", "r").get("status") or {}).get("activeRequest")
    assert len([c for c in rv.downstream.state()["calls"] if c["path"] == "/payments/refunds"]) == len(refunded)


def test_delete_then_at_once_a_new_request_adopts_the_running_compensator_and_reads_it_back(rv):
    """Delete the request mid-call and create the next one at once: the new request adopts the
    running Job by its name (no second compensator, one refund), and its read-back verifies it; the
    deleted request's settling never overwrites the new request's journal entry."""
    rv.apply_manifest()
    charge = rv.charge("o-adopt")
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-adopt", "amount": 700, "customer": "cus_9"},
                         charge)])
    rv.downstream.fault("/payments/refunds", "timeout", times=1, delay_s=5)
    rv.request("first", "r")
    wait_for(lambda: [u for u in rv.undo("r") if u["state"] == "compensating"], timeout=60, what="journaled")
    rv.custom.delete_namespaced_custom_object(G, V, rv.ns, "rollbackrequests", "first")
    rv.request("second", "r")
    req = rv.wait_phase("second", "Succeeded", "Incomplete", "Failed", timeout=90)
    assert req["status"]["phase"] == "Succeeded" and req["status"]["report"]["compensated"] == [0], req["status"]
    [undo] = rv.undo("r")
    assert undo["state"] == "compensated" and undo["verification"] == "verified", undo
    assert len(_jobs(rv, "compensator")) == 1
    assert len([c for c in rv.downstream.state()["calls"] if c["path"] == "/payments/refunds"]) == 1


def test_the_cancel_command_fails_cleanly_for_a_missing_request_and_a_user_without_patch(rv, cluster, namespace):
    from tests.integration.test_plugin import one_line_error

    rv.apply_manifest()
    err = one_line_error(kr(cluster, "cancel", "no-such-request", namespace=rv.ns))
    assert "no-such-request" in err, err
    charge = rv.charge("o-viewer")
    rv.run("r", [rv.step(0, "payments.capture", {"charge_id": charge["id"]}, rv.capture(charge["id"]))])
    rv.request("undo", "r")
    rv.wait_phase("undo", "AwaitingApproval")
    _user_api(rv, cluster, namespace, "viewer", ["get", "list"])
    err = one_line_error(kr(cluster, "cancel", "undo", namespace=rv.ns, kubeconfig=cluster.kubeconfig_for("viewer")))
    assert "patch" in err, err
    assert not rv.get("rollbackrequests", "undo")["spec"].get("cancel")


def test_removing_the_cancel_field_or_cancelled_by_is_refused_too(rv):
    rv.apply_manifest()
    rv.request("undo", "nope", cancel=True)
    stored = rv.get("rollbackrequests", "undo")
    assert stored["spec"]["cancel"] is True and stored["spec"]["cancelledBy"], stored["spec"]
    for path in ("/spec/cancel", "/spec/cancelledBy"):
        body = [{"op": "remove", "path": path}]
        from kubernetes.client.rest import ApiException

        try:
            after = rv.patch("rollbackrequests", "undo", body)  # a list: sent as a JSON patch
        except ApiException as err:  # refused: fine
            assert err.status in (400, 422), err
            continue
        assert after["spec"].get("cancel") is True and after["spec"].get("cancelledBy") == stored["spec"]["cancelledBy"]
    final = rv.get("rollbackrequests", "undo")
    assert final["spec"]["cancel"] is True and final["spec"]["cancelledBy"] == stored["spec"]["cancelledBy"]


def test_the_run_boundary_holds_against_an_agent_recording_as_fast_as_it_can(rv):
    """An agent records steps in a tight loop while a rollback takes the lock (the runaway agent a
    rollback is for): every step that was admitted must be in the rollback's status.runSteps, and
    the first step refused is the first one past it. The race is hit in about a third of the
    attempts here; 3 attempts are made (REVERSI_BOUNDARY_ATTEMPTS; `make test-long` makes 25: the same
    race through the recorded call's path has 3 more in test_recording_policies.py), the test stops at
    the first one that breaks the rule."""
    import threading

    from kubernetes.client.rest import ApiException

    from reversi.adapters.journal import step_body

    rv.apply_manifest()
    for attempt in range(int(os.environ.get("REVERSI_BOUNDARY_ATTEMPTS", "3"))):
        name = f"r{attempt}"
        rv.run(name, [rv.step(0, "payments.get_customer", {"customer": "cus_9"}, {"id": "cus_9"})])
        written: list[int] = [1]
        refused: list[tuple[int, int, str]] = []

        def writer(name: str = name, written: list = written, refused: list = refused) -> None:
            while written[0] < 400:
                step = rv.step(written[0], "payments.get_customer", {"customer": "cus_9"}, {"id": "cus_9"})
                try:
                    rv.create("runsteps", step_body(rv.ns, name, step))
                except ApiException as err:
                    refused.append((written[0], err.status, str(err.body)))
                    return
                written[0] += 1

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        wait_for(lambda written=written, attempt=attempt: written[0] >= 5 + 3 * (attempt % 5), timeout=60,
                 interval=0.01, what="the agent to be recording")
        rv.request(f"undo-{attempt}", name)
        thread.join(120)
        req = rv.wait_phase(f"undo-{attempt}", "Succeeded", "Incomplete", "Failed")
        pinned = req["status"]["runSteps"]
        recorded = len(rv.steps(name))
        assert recorded == pinned, (f"attempt {attempt}: step(s) {list(range(pinned, recorded))} recorded (admitted) "
                                    f"but not in the rollback's runSteps={pinned}", refused)
        assert refused and refused[0][0] == pinned and "rolled back by RollbackRequest" in refused[0][2], refused


def test_a_precheck_whose_read_back_expects_nothing_is_refused_since_it_would_skip_every_undo(rv):
    """compensation.precheck reads the verification first and skips the compensator when the answer
    contains ``expect``. With ``expect: {}`` every answer contains it: each step would be reported
    alreadyRecovered (complete, Succeeded) and never undone. Such a manifest is refused."""
    from tests.integration.conftest import manifest_body

    tool = _tool("payments.charge_prechecked", {"tool": "payments.refund", "kind": "compensation",
                                                "args": {"charge_id": "$result.id"}, "precheck": True},
                 {"tool": "payments.get_charge", "args": {"charge_id": "$result.id"}, "expect": {}})
    msg = _refused(lambda: rv.create("toolmanifests", manifest_body(rv.downstream.url, extra_tools=[tool])), 422)
    assert "precheck" in msg and "expect" in msg, msg


def test_an_agent_cannot_make_its_call_expire_by_forging_recorded_at(rv):
    """windowSeconds is judged from recordedAt: a step sent with a recordedAt years ago would be
    expired at once and never undone. The server stamps recordedAt; the step is undone."""
    from reversi.adapters.journal import step_body

    tool = _tool("payments.charge_180d", {"tool": "payments.refund", "kind": "compensation",
                                          "args": {"charge_id": "$result.id"}, "windowSeconds": 180 * 86400},
                 {"tool": "payments.get_charge", "args": {"charge_id": "$result.id"}, "expect": {"refunded": True}})
    rv.apply_manifest(extra_tools=[tool])
    charge = rv.charge("o-forge-at")
    rv.create("runs", {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": "r"},
                       "spec": {"mode": "enforce", "scope": {"actor": "a"}, "manifestRef": {"name": "payments"}}})
    step = rv.step(0, tool["name"], {"order_id": "o-forge-at", "amount": 700, "customer": "cus_9"}, charge)
    body = step_body(rv.ns, "r", step)
    body["spec"]["recordedAt"] = "2000-01-01T00:00:00Z"
    made = rv.create("runsteps", body)
    assert not made["spec"]["recordedAt"].startswith("2000"), made["spec"]
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", "Failed")
    assert req["status"]["report"]["compensated"] == [0], req["status"]["report"]
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True


def test_an_imported_inline_step_cannot_carry_a_forged_recorded_at_either(rv):
    tool = _tool("payments.charge_180d", {"tool": "payments.refund", "kind": "compensation",
                                          "args": {"charge_id": "$result.id"}, "windowSeconds": 180 * 86400},
                 {"tool": "payments.get_charge", "args": {"charge_id": "$result.id"}, "expect": {"refunded": True}})
    rv.apply_manifest(extra_tools=[tool])
    charge = rv.charge("o-forge-inline")
    step = {**rv.step(0, tool["name"], {"order_id": "o-forge-inline", "amount": 700, "customer": "cus_9"}, charge),
            "recordedAt": "2000-01-01T00:00:00Z"}
    rv.inline_run("r", [step])
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", "Failed")
    [moved] = rv.steps("r")
    assert not moved["spec"]["recordedAt"].startswith("2000"), moved["spec"]
    assert req["status"]["report"]["compensated"] == [0], req["status"]["report"]
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True


def test_after_a_cancel_the_next_request_reads_the_unverified_undo_back_and_never_reruns_it(rv, cluster):
    rv.apply_manifest()
    charges = [rv.charge(f"o-cv-{i}") for i in range(2)]
    rv.run("r", [rv.step(i, "payments.create_charge", {"order_id": f"o-cv-{i}", "amount": 700, "customer": "cus_9"}, c)
                 for i, c in enumerate(charges)])
    rv.downstream.fault("/payments/refunds", "timeout", times=1, delay_s=4)
    rv.request("first", "r")
    wait_for(lambda: _jobs(rv, "compensator", 1), timeout=60, what="step 1's compensator")
    assert kr(cluster, "cancel", "first", namespace=rv.ns).returncode == 0
    first = rv.wait_phase("first", "Incomplete", "Succeeded", "Failed")
    assert first["status"]["report"]["unverified"] == [1] and first["status"]["report"]["cancelled"] == [0]
    rv.request("second", "r")
    second = rv.wait_phase("second", "Succeeded", "Incomplete", "Failed")
    report = second["status"]["report"]
    assert second["status"]["phase"] == "Succeeded" and report["compensated"] == [0, 1], report
    assert len(_jobs(rv, "compensator", 1)) == 1 and len(_jobs(rv, "compensator", 0)) == 1
    refunds = [c for c in rv.downstream.state()["calls"] if c["path"] == "/payments/refunds"]
    assert len(refunds) == 2
    undo = {u["step"]: u for u in rv.undo("r")}
    assert undo[1]["verification"] == "verified" and undo[1]["verifiedBy"] == "second" and undo[1]["request"] == "first"


def test_a_request_deleted_while_the_operator_is_down_mid_call_is_settled_from_its_job_on_restart(rv, operator):
    rv.apply_manifest()
    charge = rv.charge("o-down-call")
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-down-call", "amount": 700, "customer": "cus_9"},
                         charge)])
    rv.downstream.fault("/payments/refunds", "timeout", times=1, delay_s=4)
    rv.request("undo", "r")
    [job] = wait_for(lambda: _jobs(rv, "compensator", 0), timeout=60, what="the compensator")
    wait_for(lambda: [u for u in rv.undo("r") if u["state"] == "compensating"], timeout=30, what="journaled")
    operator.kill()
    try:
        rv.custom.delete_namespaced_custom_object(G, V, rv.ns, "rollbackrequests", "undo")
        wait_for(lambda: _job_done(rv.batch.read_namespaced_job(job.metadata.name, rv.ns)), timeout=60,
                 what="the compensator to finish while the operator is down")
    finally:
        operator.start()
    wait_for(lambda: not (rv.get("runs", "r").get("status") or {}).get("activeRequest"), timeout=40,
             what="the Run to be released")
    [undo] = wait_for(lambda: [u for u in rv.undo("r") if u["state"] == "compensated"], timeout=40,
                      what="step 0 settled from its Job")
    assert undo["verification"] == "unverified" and undo["attempts"] == 1
    assert len([c for c in rv.downstream.state()["calls"] if c["path"] == "/payments/refunds"]) == 1
