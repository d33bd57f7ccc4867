"""Crash safety (rule 3) and a large run, on the real control plane."""

from __future__ import annotations

import json
import os
import time

import pytest

from reversi.adapters.journal import step_body
from reversi.sdk import DuplicateCall, Recorder
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
            wait_for(lambda: any(u["state"] == "compensating" for u in rv.undo("r")),
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
    undo = rv.undo("r")
    assert len(undo) == 6 and all(u["state"] == "compensated" and u["attempts"] == 1 for u in undo)
    assert rv.get("runs", "r")["status"].get("activeRequest") is None


#: steps of the big rollback below: 2,000 in ``make test-long`` (at parallelism 8), 400 in ``make test`` (16 charges)
BIG_RUN = int(os.environ.get("REVERSI_BIG_RUN_STEPS", "400"))


def test_a_big_run_with_a_large_journal_plans_and_rolls_back_at_parallelism_8(rv):
    rv.apply_manifest()
    steps = []
    charges = {}
    for i in range(BIG_RUN):
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
    record(rv, "big", steps)
    objects = rv.steps("big")
    assert [o["spec"]["index"] for o in objects] == list(range(BIG_RUN))
    size = sum(len(json.dumps(o)) for o in objects)
    assert size > 300_000, f"the journal is only {size} bytes"
    rv.request("plan", "big", dryRun=True)
    planned = rv.wait_phase("plan", "Planned", timeout=60)
    assert planned["status"]["plan"]["fullyReversible"] is True
    rv.request("undo", "big", parallelism=8)
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", timeout=600)
    report = req["status"]["report"]
    assert req["status"]["phase"] == "Succeeded", json.dumps(report)[:2000]
    assert report["compensated"] == sorted(charges)
    assert len(report["skipped"]) == BIG_RUN - len(charges)
    assert len(json.dumps(req)) < 1_000_000, "the request's status stays bounded"
    refunded = [rv.downstream.get(f"/payments/charges/{c['id']}")["refunded"] for c in charges.values()]
    assert all(refunded)


#: Steps of the long run below: 5,000 in ``make test-long``, fewer in ``make test``. Each is one
#: create through both webhooks, in order (admission takes a step only once its predecessor
#: exists): 5,000 took 513 s on a busy 2-core machine.
LONG_RUN = int(os.environ.get("REVERSI_LONG_RUN_STEPS", "300"))


def test_a_long_run_passes_admission_finds_a_forward_duplicate_and_takes_a_resolution(rv, admin_api):
    """A long run's steps are admitted, deduplicated and settled one small RunStep at a time."""
    rv.apply_manifest()
    last = LONG_RUN - 1
    steps = [rv.step(i, "payments.get_customer", {"id": "cus_9", "page": i, "pad": "p" * 80}, {"id": "cus_9"})
             for i in range(last)]
    record(rv, "huge", steps)
    rec = Recorder.attach(rv.ns, "huge", api=admin_api)
    args = {"order_id": "o-5k", "amount": 1, "customer": "cus_9"}

    def timed_out(_: dict) -> dict:
        raise TimeoutError("the payments API did not answer")

    with pytest.raises(TimeoutError):  # recorded uncertain by a recorder that claims its key
        rec.call("payments.create_charge", args, timed_out)
    assert len(rv.steps("huge")) == LONG_RUN
    # the forward duplicate of the last step is found (by its claim) while that call stands
    made = []
    with pytest.raises(DuplicateCall) as err:
        rec.call("payments.create_charge", args, lambda a: made.append(a))
    assert made == [] and f"like step {last}, which still stands" in str(err.value)
    resolved = rv.resolve("huge", last, status="failed", note="the payments API shows no such charge")
    assert resolved["spec"]["resolution"]["actor"] == "reversi-admin"
    # settled as failed, it no longer stands: the call may be made again, as the next step
    charge = rec.call("payments.create_charge", args, lambda a: rv.charge("o-5k", amount=1))
    newest = rv.steps("huge")[-1]["spec"]
    assert newest["index"] == LONG_RUN and newest["result"] == charge
    rv.request("plan", "huge", dryRun=True)
    planned = rv.wait_phase("plan", "Planned", timeout=120)
    assert planned["status"]["plan"]["fullyReversible"] is True
    actions = {a["step"]: a for a in planned["status"]["plan"]["actions"]}
    assert actions[LONG_RUN]["kind"] == "compensate"
    assert last not in actions or actions[last]["kind"] == "skip"  # settled as failed: nothing to undo


def record(rv, run: str, steps: list[dict]) -> None:
    """Open ``run`` and record ``steps`` (indices 0..n-1) as its RunSteps, each through admission.

    In order, one create at a time: admission takes step i only once step i-1 exists (no gaps),
    so the creates form a chain. A thread pool does not shorten it: sending step i while step
    i-1 is in flight gets i refused and sent again (measured on 300 steps: 1 worker 30.8 s,
    4 workers 35.9 s and 8 workers 33.1 s, each with ~300 refused creates).
    """
    rv.run(run, [])
    for step in steps:
        rv.custom.create_namespaced_custom_object("reversi.dev", "v1alpha1", rv.ns, "runsteps",
                                                  step_body(rv.ns, run, step), _request_timeout=60)
