"""The calls a Job receives: the calls Secrets, calls near and past their size limits, the hand-over
from a compensator to its read-back, and the check Job of ``verifyCommand``.

Each test reproduces one problem once found against the real control plane; downstream truth is
the demo server's log of calls.
"""

from __future__ import annotations

import sys

import pytest

from tests.helpers import wait_for
from tests.integration.conftest import TOOL

pytestmark = pytest.mark.cluster

#: non-ASCII text: 2 bytes of UTF-8 per character, 6 as a JSON \\u escape
TEXT = "é" * 15_800


def test_a_step_whose_calls_carry_non_ascii_text_near_the_limits_is_undone_and_verified(rv):
    """args and result near their 64 KiB (of UTF-8 JSON, as admission measures them), in non-ASCII
    text; the compensation, its precheck, its precondition and its read-back each carry half of
    each. Written with \\u escapes each call was ~190 KB: more than Linux takes in one environment
    string (128 KiB, ``REVERSI_CALL``), so no Job of the step could start its program (exit code
    127: the precheck failed, the step ended ``conflict``, nothing undone)."""
    read_args = {"charge_id": "$result.id", "memo": "$args.memo", "note": "$result.note"}
    tool = {"name": "payments.annotated_charge", "effect": "write",
            "compensation": {"tool": "payments.refund", "kind": "compensation", "runner": "tools", "precheck": True,
                             "args": {"charge_id": "$result.id", "amount": "$args.amount", "memo": "$args.memo",
                                      "note": "$result.note"},
                             "precondition": {"tool": "payments.get_charge", "args": read_args,
                                              "expect": {"refunded": False}}},
            "verification": {"tool": "payments.get_charge", "args": read_args, "expect": {"refunded": True},
                             "runner": "tools", "retries": 2, "backoffMs": 200}}
    rv.apply_manifest(extra_tools=[tool])
    charge = rv.charge("o-utf8")
    rv.run("r", [rv.step(0, tool["name"], {"order_id": "o-utf8", "amount": 700, "memo": TEXT},
                         {**charge, "note": TEXT})])
    rv.request("u", "r")
    done = rv.wait_phase("u", "Succeeded", "Incomplete", "Failed", timeout=90)
    entry = rv.step_status(done, 0)
    assert done["status"]["phase"] == "Succeeded", (entry.get("stage"), entry.get("lastError"))
    assert done["status"]["report"]["compensated"] and done["status"]["report"].get("unverified") in (None, [])
    refunds = rv.downstream.calls("/payments/refunds", since=rv.started)
    assert len(refunds) == 1, refunds


def test_operator_killed_at_the_hand_over_to_the_read_back_runs_no_compensator_or_reader_twice(rv, operator):
    """Two steps at parallelism 2: each compensator succeeds and its read-back Job starts (a slow
    reader), the request's status is not written for that hand-over. The operator is SIGKILLed
    then, the compensator Jobs are deleted (as their TTL would) and the operator restarts: it must
    follow the reader Jobs by name, never run a compensator again nor start a second reader, and
    journal both steps verified."""
    slow_reader = [sys.executable, "-c", "import os, sys, time; time.sleep(4); "
                   f"os.execv(sys.executable, [sys.executable, {str(TOOL)!r}])"]
    rv.apply_manifest(reader_command=slow_reader)
    steps = []
    for i in range(2):
        charge = rv.charge(f"o-hand-{i}")
        steps.append(rv.step(i, "payments.create_charge", {"order_id": f"o-hand-{i}", "amount": 700}, charge))
    rv.run("r", steps)
    rv.request("h", "r", parallelism=2)
    readers = lambda: rv.batch.list_namespaced_job(rv.ns, label_selector="reversi.dev/role=reader").items  # noqa: E731
    try:
        wait_for(lambda: len(readers()) == 2, timeout=60, interval=0.05, what="both read-backs started")
        stages = [e.get("stage") for e in rv.get("rollbackrequests", "h")["status"]["steps"]]
        operator.kill()
        for job in rv.batch.list_namespaced_job(rv.ns, label_selector="reversi.dev/role=compensator").items:
            rv.batch.delete_namespaced_job(job.metadata.name, rv.ns, propagation_policy="Background")
        wait_for(lambda: not rv.batch.list_namespaced_job(rv.ns, label_selector="reversi.dev/role=compensator").items,
                 timeout=30, what="the compensator Jobs gone")
        operator.start()
    finally:
        if not operator.alive():
            operator.start()
    done = rv.wait_phase("h", "Succeeded", "Incomplete", "Failed", timeout=120)
    assert done["status"]["phase"] == "Succeeded", (stages, done["status"]["report"])
    assert sorted(done["status"]["report"]["compensated"]) == [0, 1]
    assert not rv.batch.list_namespaced_job(rv.ns, label_selector="reversi.dev/role=compensator").items
    assert sorted(j.metadata.name for j in readers()) == sorted({j.metadata.name for j in readers()})
    assert len(readers()) == 2 and all(j.metadata.labels.get("reversi.dev/read") == "1" for j in readers())
    assert len(rv.downstream.calls("/payments/refunds", since=rv.started)) == 2
    undo = rv.undo("r")
    assert [(u["state"], u["attempts"], u["verification"]) for u in undo] == [("compensated", 1, "verified")] * 2


def test_steps_across_a_slice_boundary_each_get_their_own_call_from_two_stable_calls_secrets(rv):
    """34 steps (slices 0 and 1 of the calls Secrets, boundary 31/32) with a read-back each, at
    parallelism 8: every refund goes to its own charge, once, and the Run has one calls Secret
    per slice (the content, hence the name, is the same in every pass)."""
    rv.apply_manifest()
    steps, charges = [], []
    for i in range(34):
        charge = rv.charge(f"o-slice-{i}", amount=100 + i)
        charges.append(charge)
        steps.append(rv.step(i, "payments.create_charge", {"order_id": f"o-slice-{i}", "amount": 100 + i}, charge))
    run = rv.run("r", steps)
    rv.request("s", "r", parallelism=8)
    done = rv.wait_phase("s", "Succeeded", "Incomplete", "Failed", timeout=240)
    assert done["status"]["phase"] == "Succeeded", done["status"]["report"]
    refunds = rv.downstream.calls("/payments/refunds", since=rv.started)
    assert len(refunds) == 34  # one each: all 34 charges are refunded
    assert all(rv.downstream.get(f"/payments/charges/{ch['id']}")["refunded"] is True for ch in charges)
    secrets = rv.core.list_namespaced_secret(rv.ns, label_selector=f"reversi.dev/run-uid={run['metadata']['uid']}")
    names = sorted(s.metadata.name for s in secrets.items)
    assert len(names) == 2 and [n.split("-")[2] for n in names] == ["k0", "k1"], names


def test_verify_command_runs_once_per_undo_with_the_compensators_call_from_the_calls_secret(rv):
    """No integration test ran spec.verifyCommand: its check Job must get the compensator's call
    (key ``<step>.compensator.json`` of the calls Secret) and the idempotency key, run once, and
    the read-back follows it."""
    check = [sys.executable, "-c", "import json, os; c = json.load(open(os.environ['REVERSI_CALL_FILE'])); "
             "assert c['tool'] == 'payments.refund' and c['args']['charge_id'], c; "
             "assert os.environ['REVERSI_IDEMPOTENCY_KEY'] == c['idempotency_key']"]
    rv.apply_manifest()
    charge = rv.charge("o-check")
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-check", "amount": 700}, charge)])
    rv.request("c", "r", verifyCommand=check)
    done = rv.wait_phase("c", "Succeeded", "Incomplete", "Failed", timeout=90)
    entry = rv.step_status(done, 0)
    assert done["status"]["phase"] == "Succeeded", (entry.get("stage"), entry.get("lastError"))
    assert [u["verification"] for u in rv.undo("r")] == ["verified"]
    checks = rv.batch.list_namespaced_job(rv.ns, label_selector="reversi.dev/role=check").items
    assert len(checks) == 1 and checks[0].status.succeeded == 1
    assert len(rv.downstream.calls("/payments/refunds", since=rv.started)) == 1


def test_a_call_too_long_for_its_job_is_refused_by_name_and_starts_no_job(rv):
    """A compensation whose declared arguments repeat ``$args`` makes a call of ~190 KB: more than
    one environment string can hold (``REVERSI_CALL``, 128 KiB), so its Job could never start its
    program. The operator creates no Job: the step is ``handlerUnavailable`` with a message that
    says what to fix, the other step is undone, and nothing reaches the downstream for it."""
    tool = {"name": "payments.bulky_charge", "effect": "write",
            "compensation": {"tool": "payments.refund", "kind": "compensation", "runner": "tools",
                             "args": {"charge_id": "$result.id", "copy": "$args", "again": "$args", "more": "$args"}}}
    rv.apply_manifest(extra_tools=[tool])
    big, small = rv.charge("o-big"), rv.charge("o-small")
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-small", "amount": 700}, small),
                 rv.step(1, tool["name"], {"order_id": "o-big", "amount": 700, "memo": "x" * 60_000}, big)])
    rv.request("u", "r")
    done = rv.wait_phase("u", "Succeeded", "Incomplete", "Failed", timeout=90)
    entry = rv.step_status(done, 1)
    assert done["status"]["phase"] == "Incomplete" and entry["stage"] == "handlerUnavailable", entry
    assert "bytes of JSON, more than the" in entry["lastError"] and "REVERSI_CALL" in entry["lastError"]
    assert done["status"]["report"]["compensated"] == [0]
    jobs = rv.batch.list_namespaced_job(rv.ns, label_selector="reversi.dev/role=compensator,reversi.dev/step=1")
    assert jobs.items == []
    assert len(rv.downstream.calls("/payments/refunds", since=rv.started)) == 1
    assert rv.downstream.get(f"/payments/charges/{small['id']}")["refunded"] is True
    assert rv.downstream.get(f"/payments/charges/{big['id']}")["refunded"] is False
