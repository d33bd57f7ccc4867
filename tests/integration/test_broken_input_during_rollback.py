"""Hostile or broken input during a rollback: the request always ends, says why, and leaks nothing."""

from __future__ import annotations

import datetime as dt
import sys

import pytest

from tests.helpers import wait_for

pytestmark = pytest.mark.cluster
PY = sys.executable


def _charge_run(rv, order="o-h"):
    charge = rv.charge(order)
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": order, "amount": 700, "customer": "cus_9"}, charge)])
    return charge


def test_reader_log_lines_before_the_answer_do_not_fail_the_check(rv):
    reader = [PY, "-c", "import sys; print('debug: reading the charge', file=sys.stderr); print('note: ok');"
              "print('{\"refunded\": true}')"]
    rv.apply_manifest(reader_command=reader)
    _charge_run(rv)
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete")
    assert req["status"]["report"]["compensated"] == [0], req["status"]["report"]


def test_reader_printing_invalid_utf8_is_a_failed_read_not_a_stuck_request(rv):
    reader = [PY, "-c", "import sys; sys.stdout.buffer.write(b'\\xff\\xfe garbage')"]
    rv.apply_manifest(reader_command=reader)
    _charge_run(rv)
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Incomplete", timeout=90)
    assert "read failed: the reader printed no JSON" in req["status"]["report"]["failed"][0]["error"]
    assert rv.get("runs", "r")["status"].get("activeRequest") is None


def test_a_compensators_logs_never_reach_status(rv, admin_api):
    from kubernetes import client

    client.CoreV1Api(admin_api).create_namespaced_secret(rv.ns, {"metadata": {"name": "db-password"},
                                                               "stringData": {"password": "hunter2-TOP-SECRET"}})
    from tests.integration.conftest import manifest_body

    body = manifest_body(rv.downstream.url)
    body["spec"]["runners"].append({
        **body["spec"]["runners"][0], "name": "leaky",
        "command": ["sh", "-c", "echo leaked: $P; echo leaked: $P >&2; exit 1"],
        "env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "db-password", "key": "password"}}}]})
    body["spec"]["tools"].append({"name": "payments.leaky", "effect": "write", "compensation": {
        "tool": "payments.refund", "kind": "compensation", "args": {}, "runner": "leaky"}})
    rv.manifest = rv.create("toolmanifests", body)
    rv.run("r", [rv.step(0, "payments.leaky", {}, {"ok": True})])
    rv.request("undo", "r", retries=1)
    req = rv.wait_phase("undo", "Incomplete")
    text = str(req["status"])
    assert "hunter2" not in text
    assert req["status"]["report"]["failed"][0]["error"].endswith("exit code 1")
    events = rv.core.list_namespaced_event(rv.ns).items
    assert not any("hunter2" in (e.message or "") for e in events)


def test_a_job_the_api_server_refuses_makes_the_step_handler_unavailable_instead_of_hanging(rv):
    # a step's args are at most 64 KiB (MAX_CALL_BYTES), but a compensation may name them many
    # times: 20 copies of a 60 KB blob make a call of 1.2 MB, more than a Secret may carry
    extra = [{"name": "blob.write", "effect": "write",
              "compensation": {"tool": "blob.delete", "kind": "inverse",
                               "args": {f"copy{i}": "$args.blob" for i in range(20)}, "runner": "tools"}}]
    rv.apply_manifest(extra_tools=extra)
    rv.run("r", [rv.step(0, "blob.write", {"blob": "x" * 60_000}, {"ok": True})])
    rv.request("undo", "r", retries=2, backoff={"baseMs": 50, "maxMs": 100})
    req = rv.wait_phase("undo", "Incomplete", timeout=90)
    # its handler cannot run (rule 16): that step is handlerUnavailable, nothing hangs, nothing ran
    [entry] = req["status"]["report"]["handlerUnavailable"]
    assert entry["step"] == 0 and "cannot create the compensator Job" in entry["reason"]
    assert [r["type"] for r in req["status"]["report"]["residue"]] == ["notAttempted"]
    assert not rv.batch.list_namespaced_job(rv.ns, label_selector="reversi.dev/role=compensator").items
    run = rv.get("runs", "r")
    assert run["status"].get("activeRequest") is None


def test_the_deadline_stops_further_attempts(rv):
    rv.apply_manifest()
    _charge_run(rv)
    rv.downstream.fault("/payments/refunds", "error", times=50)
    rv.request("undo", "r", retries=6, backoff={"baseMs": 4000, "maxMs": 4000}, deadlineSeconds=3)
    req = rv.wait_phase("undo", "Incomplete", timeout=60)
    jobs = rv.batch.list_namespaced_job(rv.ns, label_selector="reversi.dev/role=compensator").items
    # retries are jittered (full jitter: 0-4 s), so how many fit before the deadline varies; what
    # the rule says is that none starts after it, and the six allowed by retries never all run
    started = dt.datetime.fromisoformat(req["status"]["startTime"].replace("Z", "+00:00"))
    late = [j.metadata.name for j in jobs
            if (j.metadata.creation_timestamp - started).total_seconds() > 3 + 1]  # timestamps are whole seconds
    assert not late, f"attempts started after the deadline: {late}"
    assert len(jobs) < 6, [j.metadata.name for j in jobs]
    assert "deadline" in req["status"]["report"]["failed"][0]["error"]


def test_manifest_deleted_mid_rollback_changes_nothing_for_the_request_holding_the_run(rv):
    """The request recorded its runners when it took the lock (status.runners): it finishes with
    them, the downstream really undone, and releases the Run (runners are recorded at the lock: a
    ToolManifest change affects the next request only)."""
    rv.apply_manifest(capture_needs_approval=True)
    charge = rv.charge("o-del")
    capture = rv.capture(charge["id"])
    rv.run("r",
           [rv.step(0, "payments.create_charge", {"order_id": "o-del", "amount": 700, "customer": "cus_9"}, charge),
                 rv.step(1, "payments.capture", {"charge_id": charge["id"]}, capture)])
    rv.request("undo", "r")
    assert [r["name"] for r in rv.wait_phase("undo", "AwaitingApproval")["status"]["runners"]] == ["tools"]
    assert rv.get("runs", "r")["status"]["activeRequest"] == "undo"
    rv.custom.delete_namespaced_custom_object("reversi.dev", "v1alpha1", rv.ns, "toolmanifests", "payments")
    rv.patch("rollbackrequests", "undo", {"spec": {"approvals": [{"step": 1}]}})  # wakes it
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", "Failed")
    assert req["status"]["phase"] == "Succeeded" and req["status"]["report"]["compensated"] == [0, 1], req["status"]
    assert rv.downstream.get(f"/payments/captures/{capture['id']}")["status"] == "voided"
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    run = rv.get("runs", "r")
    assert run["status"].get("activeRequest") is None
    rolled = next(c for c in run["status"]["conditions"] if c["type"] == "RolledBack")
    assert rolled["status"] == "True"


def test_a_rerun_still_reports_the_residue_of_earlier_undos(rv):
    rv.apply_manifest()
    _charge_run(rv)
    rv.request("first", "r")
    assert rv.wait_phase("first", "Succeeded", "Incomplete")["status"]["report"]["residue"]
    rv.request("second", "r")
    second = rv.wait_phase("second", "Succeeded", "Incomplete")
    assert second["status"]["report"]["compensated"] == [0]
    assert second["status"]["report"]["residue"] == [
        {"step": 0, "type": "declared", "text": "the charge stays visible on the customer's statement"}]


def test_many_waiting_requests_back_off(rv, operator):
    rv.apply_manifest(capture_needs_approval=True)
    charge = rv.charge("o-wait")
    capture = rv.capture(charge["id"])
    rv.run("r", [rv.step(0, "payments.capture", {"charge_id": charge["id"]}, capture)])
    rv.request("holder", "r")
    rv.wait_phase("holder", "AwaitingApproval")
    for i in range(5):
        rv.request(f"waiter-{i}", "r")
    for i in range(5):
        rv.wait_phase(f"waiter-{i}", "Waiting")
    waiter = rv.get("rollbackrequests", "waiter-0")
    running = next(c for c in waiter["status"]["conditions"] if c["type"] == "Running")
    assert running["reason"] == "WaitingForRun" and "holder" in running["message"]
    wait_for(lambda: operator.alive(), what="the operator alive")
