"""A RollbackRequest uses the runners it recorded when it took the Run's lock
(docs/concepts.md#runners-are-recorded-at-the-lock).

The ToolManifest's runner is edited in the middle of a rollback (and the operator restarted, so
nothing is left in its memory): the request's remaining Jobs still run the recorded runner, and
the downstream really receives its undo calls; a request made after the edit runs the edited
runner. Secret values are never copied: the record holds the reference only.
"""

from __future__ import annotations

import copy
import json

import pytest

from tests.integration.conftest import manifest_body
from tests.integration.test_contract import _charge_step, _jobs

pytestmark = pytest.mark.cluster

SECRET_VALUE = "tok-3f9a-never-in-status"
TOKEN_ENV = {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "payments-api", "key": "token"}}}
DEAD_URL = "http://127.0.0.1:9"  # nothing listens: a compensator using it fails and changes nothing


def _container(job) -> dict:
    c = job.spec.template.spec.containers[0]
    return {"image": c.image, "command": c.command,
            "env": {e.name: (e.value if e.value is not None else "<ref>") for e in c.env or []}}


def _owned(rv, role: str, request: str) -> list:
    """Jobs of ``role`` started by ``request`` (Jobs are owned by the Run; the request is an annotation)."""
    return [j for j in _jobs(rv, role) if (j.metadata.annotations or {}).get("reversi.dev/request") == request]


def test_a_toolmanifest_edited_mid_rollback_changes_nothing_until_the_next_request(rv, operator):
    rv.core.create_namespaced_secret(rv.ns, {"metadata": {"name": "payments-api"},
                                             "stringData": {"token": SECRET_VALUE}})
    body = manifest_body(rv.downstream.url)
    body["spec"]["runners"][0]["env"].append(TOKEN_ENV)
    rv.manifest = rv.create("toolmanifests", body)
    first = copy.deepcopy(body["spec"]["runners"][0])
    s0, charge = _charge_step(rv, 0, "o-record")
    capture = rv.capture(charge["id"])
    rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, capture)])
    rv.request("undo", "r")
    # the capture's void waits for approval; the charge's refund waits for it (dependents first)
    req = rv.wait_phase("undo", "AwaitingApproval")
    assert _jobs(rv, "compensator") == []
    [recorded] = req["status"]["runners"]
    assert recorded == {**first, "args": [], "envFrom": [], "readBackTools": []}, recorded
    assert recorded["env"][-1] == TOKEN_ENV  # a reference, never the value
    assert SECRET_VALUE not in json.dumps(req) and "token" in json.dumps(recorded["env"])
    events = rv.core.list_namespaced_event(rv.ns, field_selector="involvedObject.name=undo").items
    assert any(e.reason == "RunnersRecorded" and "affects the next request" in e.message for e in events)

    # the runner is edited: another image, command and downstream; then the operator restarts
    edited = {**first, "image": "registry.example/reversi-demo-tools:2", "command": [first["command"][0], "-u",
                                                                                   *first["command"][1:]],
              "env": [{"name": "DOWNSTREAM_URL", "value": DEAD_URL}, {"name": "EDITION", "value": "2"}, TOKEN_ENV]}
    rv.patch("toolmanifests", "payments", {"spec": {"runners": [edited]}})
    assert rv.get("toolmanifests", "payments")["spec"]["runners"][0]["env"][0]["value"] == DEAD_URL
    operator.kill()
    operator.start()
    rv.patch("rollbackrequests", "undo", {"spec": {"approvals": [{"step": 1}]}})
    req = rv.wait_phase("undo", "Succeeded", "Incomplete")
    report = req["status"]["report"]
    assert req["status"]["phase"] == "Succeeded" and report["compensated"] == [0, 1], report
    assert req["status"]["runners"] == [recorded]  # unchanged by the edit
    # downstream truth: the recorded runner reached the real downstream, once per undo
    assert rv.downstream.get(f"/payments/captures/{capture['id']}")["status"] == "voided"
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    assert len(rv.downstream.calls(f"/payments/captures/{capture['id']}/void", since=rv.started)) == 1
    assert len(rv.downstream.calls("/payments/refunds", since=rv.started)) == 1
    # every Job of the request (compensators and readers, all started after the edit) runs the recorded runner
    jobs = _owned(rv, "compensator", "undo") + _owned(rv, "reader", "undo")
    assert len(_owned(rv, "compensator", "undo")) == 2 and len(_owned(rv, "reader", "undo")) == 2
    for job in jobs:
        seen = _container(job)
        assert seen["image"] == first["image"] and seen["command"] == first["command"], seen
        assert seen["env"]["DOWNSTREAM_URL"] == rv.downstream.url and "EDITION" not in seen["env"], seen
        assert seen["env"]["API_TOKEN"] == "<ref>"

    # a request made after the edit records and runs the edited runner: its refund goes nowhere
    s0b, charge_b = _charge_step(rv, 0, "o-record-after")
    rv.run("r2", [s0b])
    rv.request("after", "r2", retries=1)
    after = rv.wait_phase("after", "Succeeded", "Incomplete")
    assert after["status"]["phase"] == "Incomplete" and [f["step"] for f in after["status"]["report"]["failed"]] == [0]
    [recorded_after] = after["status"]["runners"]
    assert recorded_after["image"].endswith(":2") and recorded_after["env"][0]["value"] == DEAD_URL
    [job] = _owned(rv, "compensator", "after")
    seen = _container(job)
    assert seen["image"].endswith(":2") and seen["command"] == edited["command"], seen
    assert seen["env"]["DOWNSTREAM_URL"] == DEAD_URL and seen["env"]["EDITION"] == "2", seen
    assert rv.downstream.get(f"/payments/charges/{charge_b['id']}")["refunded"] is False
    assert len(rv.downstream.calls("/payments/refunds", since=rv.started)) == 1  # still only the first request's
    assert SECRET_VALUE not in json.dumps(after)


def test_a_dry_run_records_no_runners(rv):
    rv.apply_manifest()
    s0, _ = _charge_step(rv, 0, "o-record-dry")
    rv.run("r", [s0])
    rv.request("plan", "r", dryRun=True)
    req = rv.wait_phase("plan", "Planned")
    assert "runners" not in req["status"] and req["status"]["plan"]["actions"][0]["verified"] is True
    assert _jobs(rv, "compensator") == []
