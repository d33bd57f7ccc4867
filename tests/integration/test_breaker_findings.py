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
