"""Crash safety (rule 3) and a large run, on the real control plane."""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers import wait_for

pytestmark = pytest.mark.cluster


def test_rule3_operator_killed_while_compensations_run_finishes_without_running_any_twice(rv, operator):
    rv.apply_manifest()
    steps, charges = [], []
    for i in range(6):
        charge = rv.charge(f"o-crash-{i}")
        charges.append(charge)
        steps.append(rv.step(i, "payments.create_charge",
                             {"order_id": f"o-crash-{i}", "amount": 700, "customer": "cus_9"}, charge))
    rv.run("r", steps)
    # every refund takes 2s to answer (the effect happens at once): compensations stay in flight
    rv.downstream.fault("/payments/refunds", "timeout", times=6, delay_s=2)
    rv.request("undo", "r", parallelism=3)
    try:
        for _ in range(3):
            # wait until some compensation is journaled and its Job exists, then crash the operator
            wait_for(lambda: any(u["state"] == "compensating"
                                 for u in (rv.get("runs", "r").get("status") or {}).get("undo", [])),
                     timeout=60, interval=0.1, what="a compensation in flight")
            operator.kill()
            time.sleep(1.5)  # Jobs keep running while the operator is down
            operator.start()
    finally:
        if not operator.alive():
            operator.start()
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", timeout=180)
    assert req["status"]["phase"] == "Succeeded", json.dumps(req["status"]["report"])
    assert req["status"]["report"]["compensated"] == list(range(6))
    # no compensation ran twice for one attempt: one compensator Job per step, one real refund each
    jobs = rv.batch.list_namespaced_job(rv.ns, label_selector="reversi.dev/role=compensator").items
    assert sorted(j.metadata.name for j in jobs) == sorted({j.metadata.name for j in jobs})
    assert len(jobs) == 6 and all(j.metadata.labels["reversi.dev/attempt"] == "1" for j in jobs)
    assert len(rv.downstream.calls("/payments/refunds", since=rv.started)) == 6
    for charge in charges:
        assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    undo = rv.get("runs", "r")["status"]["undo"]
    assert all(u["state"] == "compensated" and u["attempts"] == 1 for u in undo)
    assert rv.get("runs", "r")["status"].get("activeRequest") is None


def test_a_run_of_1000_steps_with_a_large_journal_plans_and_rolls_back(rv):
    rv.apply_manifest()
    steps = []
    charges = {}
    for i in range(1000):
        if i % 25 == 24:  # 40 charges to undo, each depending on the previous charge
            order = f"o-big-{i}"
            charge = rv.charge(order, amount=1 + i)
            charges[i] = charge
            prev = [i - 25] if i >= 49 else []
            steps.append(rv.step(i, "payments.create_charge", {"order_id": order, "amount": 1 + i, "customer": "cus_9"},
                                 charge, depends_on=prev))
        else:  # reads with bulky arguments: the journal is several hundred KB
            steps.append(rv.step(i, "payments.get_customer", {"id": "cus_9", "note": "x" * 200, "page": i},
                                 {"id": "cus_9", "seen": i}))
    run = rv.run("big", steps)
    size = len(json.dumps(run))
    assert size > 300_000, f"the journal is only {size} bytes"
    rv.request("plan", "big", dryRun=True)
    planned = rv.wait_phase("plan", "Planned", timeout=60)
    assert planned["status"]["plan"]["fullyReversible"] is True
    rv.request("undo", "big", parallelism=8)
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", timeout=600)
    report = req["status"]["report"]
    assert req["status"]["phase"] == "Succeeded", json.dumps(report)[:2000]
    assert report["compensated"] == sorted(charges)
    assert len(report["skipped"]) == 960
    assert len(json.dumps(req)) < 1_000_000, "the request's status stays bounded"
    refunded = [rv.downstream.get(f"/payments/charges/{c['id']}")["refunded"] for c in charges.values()]
    assert all(refunded)


def test_a_run_of_5000_steps_passes_admission_and_takes_a_resolution(rv, admin_api):
    """The webhooks see whole objects (old and new on update): megabytes for a long run."""
    rv.apply_manifest()
    steps = [rv.step(i, "payments.get_customer", {"id": "cus_9", "page": i, "pad": "p" * 80}, {"id": "cus_9"})
             for i in range(4999)]
    steps.append(rv.step(4999, "payments.create_charge", {"order_id": "o-5k", "amount": 1, "customer": "cus_9"},
                         outcome="uncertain"))
    run = rv.run("huge", steps)
    assert len(json.dumps(run)) > 1_048_576  # above aiohttp's default body limit
    resolved = rv.custom.patch_namespaced_custom_object(
        "reversi.dev", "v1alpha1", rv.ns, "runs", "huge",
        [{"op": "add", "path": "/spec/resolutions", "value": [
            {"step": 4999, "status": "failed", "note": "the payments API shows no such charge"}]}],
        _content_type="application/json-patch+json")
    assert resolved["spec"]["resolutions"][0]["actor"] == "reversi-admin"
    rv.request("plan", "huge", dryRun=True)
    planned = rv.wait_phase("plan", "Planned", timeout=120)
    assert planned["status"]["plan"]["fullyReversible"] is True
