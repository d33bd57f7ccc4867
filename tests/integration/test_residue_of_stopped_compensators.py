"""The residue of a compensator stopped mid-call (docs/concepts.md#the-report): nobody knows whether
its call took effect, so a step that ends failed after it is residue ``unknown``, never ``failed``
or ``compensated`` (docs/guarantees.md#c-deadline). On the real control plane with real Jobs; the
downstream's own record says what really happened."""

from __future__ import annotations

import pytest

from tests.integration.conftest import manifest_body

pytestmark = pytest.mark.cluster


def test_a_compensator_killed_by_its_deadline_mid_call_leaves_the_step_unknown(rv):
    """Every refund happens downstream, but its answer comes after the compensator's 10 s deadline:
    the Job's deadline stops each attempt mid-call (the second sends the same key: a replay). The
    step fails with the deadline named, its residue is ``unknown`` (the refund may or may not have
    happened, and here it did), the journal says so (``effectUnknown``), and the downstream shows
    one refund."""
    body = manifest_body(rv.downstream.url)
    runners = body["spec"]["runners"]
    # long enough for its pod to start and call on a loaded machine, far shorter than the late answer
    # (its calls wait 120 s for an answer: only the deadline stops it, never its own timeout)
    runners.append({**runners[0], "name": "short", "deadlineSeconds": 10,
                    "env": [*runners[0]["env"], {"name": "DOWNSTREAM_TIMEOUT", "value": "120"}]})
    charge_tool = next(t for t in body["spec"]["tools"] if t["name"] == "payments.create_charge")
    charge_tool["compensation"]["runner"] = "short"
    rv.manifest = rv.create("toolmanifests", body)
    charge = rv.charge("o-stopped")
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-stopped", "amount": 700, "customer": "cus_9"},
                         charge)])
    rv.downstream.fault("/payments/refunds", "timeout", times=2, delay_s=60)  # the refund happens, its answer is late
    rv.request("undo", "r", retries=2, backoff={"baseMs": 100, "maxMs": 200})
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", "Failed", timeout=180)
    report = req["status"]["report"]
    assert req["status"]["phase"] == "Incomplete" and [f["step"] for f in report["failed"]] == [0], report
    assert "DeadlineExceeded" in report["failed"][0]["error"], report
    assert [(r["step"], r["type"]) for r in report["residue"]] == [(0, "unknown")], report["residue"]
    assert rv.step_status(req, 0)["attempts"] == 2
    (undo,) = rv.undo("r")
    assert undo["state"] == "compensationFailed" and undo.get("effectUnknown") is True, undo
    # the truth downstream: the refund happened once (the second attempt's call was a replay of its key)
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    assert len(rv.downstream.calls("/payments/refunds")) == 1
