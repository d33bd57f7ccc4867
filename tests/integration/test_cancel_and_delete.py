"""Rules 13 and 14 on the local control plane: cancelling a RollbackRequest, and deleting one
mid-way. The downstream truth is the demo server's log of every refund call (replays included):
a compensator that ran is counted there, whatever the operator says."""

from __future__ import annotations

import datetime as dt
import sys

from kubernetes.client.rest import ApiException

from reversi.models.runstep import step_name
from tests.helpers import wait_for
from tests.integration.conftest import TOOL
from tests.integration.test_plugin import kr

CHARGE_ARGS = {"amount": 700, "customer": "cus_9"}


def _charge_step(rv, index: int, order: str):
    charge = rv.charge(order)
    return rv.step(index, "payments.create_charge", {"order_id": order, **CHARGE_ARGS}, {"id": charge["id"]}), charge


def _jobs(rv, role: str, step: int | None = None):
    selector = f"reversi.dev/role={role}" + (f",reversi.dev/step={step}" if step is not None else "")
    return rv.batch.list_namespaced_job(rv.ns, label_selector=selector).items


def _refund_calls(rv) -> list[dict]:
    """Every refund call the downstream received (replays too): how often a compensator really ran."""
    return [c for c in rv.downstream.state().get("calls", []) if c["path"].startswith("/payments/refunds")]


def _running_compensator(rv, step: int):
    def running():
        jobs = _jobs(rv, "compensator", step)
        return jobs if jobs and not jobs[0].status.succeeded and not jobs[0].status.failed else None
    return wait_for(running, timeout=60, what=f"the compensator Job of step {step} to run")[0]


def _run_free(rv, run: str):
    def free():
        status = rv.get("runs", run).get("status") or {}
        return status if not status.get("activeRequest") else None
    return wait_for(free, timeout=30, what=f"Run {run} to be released")


def test_cancel_mid_rollback_starts_nothing_new_records_the_running_job_and_releases_the_run(rv, cluster):
    """Cancel while step 2's refund is in flight: that Job finishes and is recorded with its true
    outcome (undone, not checked: no read-back starts after the cancel); steps 1 and 0 never
    start (cancelled, zero refunds); the Run is released; the report is final and says so."""
    rv.apply_manifest()
    steps, charges = zip(*(_charge_step(rv, i, f"o-cancel-{i}") for i in range(3)), strict=True)
    rv.run("r", list(steps))
    rv.downstream.fault("/payments/refunds", "timeout", times=1, delay_s=4)  # the refund happens, its answer is slow
    rv.request("undo", "r", retries=1)
    job = _running_compensator(rv, 2)
    proc = kr(cluster, "cancel", "undo", namespace=rv.ns)
    cancelled_at = dt.datetime.now(dt.UTC)
    assert proc.returncode == 0 and "cancelled" in proc.stdout, (proc.stdout, proc.stderr)
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", "Failed", timeout=60)
    status = req["status"]
    assert status["phase"] == "Incomplete", status
    complete = next(c for c in status["conditions"] if c["type"] == "Complete")
    assert complete["status"] == "False" and complete["reason"] == "Cancelled", complete
    assert complete["message"].startswith("cancelled by ")
    report = status["report"]
    # the running Job finished and was recorded with its real outcome: undone, its read-back never started
    assert report["unverified"] == [2] and sorted(report["cancelled"]) == [0, 1], report
    assert report["complete"] is False
    assert rv.condition(rv.step_status(req, 2), "Verified")["reason"] == "Cancelled"
    assert rv.condition(rv.step_status(req, 1), "Compensated")["reason"] == "Cancelled"
    assert {(r["step"], r["type"]) for r in report["residue"]} == {(2, "unknown"), (1, "notAttempted"),
                                                                   (0, "notAttempted")}
    # downstream truth: one refund, for step 2's charge; no Job of any kind started after the cancel
    assert [c["path"] for c in _refund_calls(rv)] == ["/payments/refunds"]
    assert rv.downstream.get(f"/payments/charges/{charges[2]['id']}")["refunded"] is True
    assert rv.downstream.get(f"/payments/charges/{charges[1]['id']}")["refunded"] is False
    assert rv.downstream.get(f"/payments/charges/{charges[0]['id']}")["refunded"] is False
    assert [j.metadata.name for j in _jobs(rv, "compensator")] == [job.metadata.name]
    assert _jobs(rv, "reader") == []
    assert all(j.metadata.creation_timestamp <= cancelled_at for j in rv.batch.list_namespaced_job(rv.ns).items)
    # the Run is released, and nothing is left compensating
    run_status = _run_free(rv, "r")
    locked = next(c for c in run_status["conditions"] if c["type"] == "Locked")
    assert locked["status"] == "False"
    undo = {u["step"]: u for u in rv.undo("r")}
    assert list(undo) == [2] and undo[2]["state"] == "compensated" and undo[2]["verification"] == "unverified"
    # cancelling a finished request is a no-op, and says so
    again = kr(cluster, "cancel", "undo", namespace=rv.ns)
    assert again.returncode == 0 and "already ended (Incomplete)" in again.stdout, again.stdout


def test_delete_mid_rollback_never_kills_the_compensator_and_the_next_request_settles_without_rerunning(rv):
    """Delete the request while step 1's refund is in flight: the Job (owned by the Run) is not
    garbage-collected and finishes; the Run is released at once; the step's journal entry is
    settled from the Job's outcome (no stranded compensating); the next request undoes step 0,
    reads step 1 back and never runs its compensator again: one refund per charge, ever."""
    rv.apply_manifest()
    (s0, c0), (s1, c1) = _charge_step(rv, 0, "o-del-0"), _charge_step(rv, 1, "o-del-1")
    rv.run("r", [s0, s1])
    rv.downstream.fault("/payments/refunds", "timeout", times=1, delay_s=4)
    rv.request("first", "r", retries=1)
    job = _running_compensator(rv, 1)
    assert job.metadata.owner_references[0].kind == "Run" and job.metadata.annotations["reversi.dev/request"] == "first"
    wait_for(lambda: any(u["state"] == "compensating" for u in rv.undo("r")), timeout=30, what="step 1 journaled")
    rv.custom.delete_namespaced_custom_object("reversi.dev", "v1alpha1", rv.ns, "rollbackrequests", "first")
    run_status = _run_free(rv, "r")  # released by the deletion, not when the Job ends
    locked = next(c for c in run_status["conditions"] if c["type"] == "Locked")
    assert locked["status"] == "False" and locked["reason"] == "RequestDeleted", locked

    def settled():
        undo = {u["step"]: u for u in rv.undo("r")}
        return undo if undo.get(1, {}).get("state") == "compensated" else None

    undo = wait_for(settled, timeout=60, what="step 1 settled from its Job's outcome")
    assert undo[1]["request"] == "first" and undo[1]["verification"] == "unverified" and undo[1]["attempts"] == 1
    assert all(u["state"] != "compensating" for u in undo.values())
    finished = rv.batch.read_namespaced_job(job.metadata.name, rv.ns)
    assert finished.status.succeeded == 1 and finished.metadata.uid == job.metadata.uid  # the same Job, never killed
    assert len(_refund_calls(rv)) == 1

    rv.request("second", "r")
    req = rv.wait_phase("second", "Succeeded", "Incomplete", "Failed")
    report = req["status"]["report"]
    assert req["status"]["phase"] == "Succeeded", report
    assert sorted(report["compensated"]) == [0, 1] and report["complete"] is True
    assert {(r["step"], r["type"]) for r in report["residue"]} == {(0, "declared"), (1, "declared")}
    assert len(_jobs(rv, "compensator", 1)) == 1, "step 1's compensator never ran again"
    assert len(_refund_calls(rv)) == 2  # one refund per charge, ever (replays would count too)
    for charge in (c0, c1):
        assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    undo = {u["step"]: u for u in rv.undo("r")}
    assert undo[1]["verification"] == "verified" and undo[1]["verifiedBy"] == "second"
    try:
        rv.custom.get_namespaced_custom_object("reversi.dev", "v1alpha1", rv.ns, "runsteps", step_name("r", 1))
    except ApiException as err:  # pragma: no cover - the journal must outlive the request
        raise AssertionError("the RunStep of step 1 is gone") from err
    assert not (rv.get("runs", "r").get("status") or {}).get("activeRequest")


def test_cancel_while_a_lost_read_back_waits_leaves_the_undo_unverified_and_the_next_request_reads_it(rv):
    """The read-back hangs (its GET answers after 30 s) until its runner's 4 s
    deadline ends it, a lost read; the request is cancelled while it waits 30 s to read again.
    No read answered, and the refund happened: compensated but unverified, not failed. The next
    request reads it back and never runs the compensator again."""
    rv.apply_manifest(reader_command=[sys.executable, str(TOOL)], reader_deadline_seconds=4,
                      charge_read_backoff_ms=30000)
    step, charge = _charge_step(rv, 0, "o-cancel-lost")
    rv.run("r", [step])
    rv.downstream.fault(f"/payments/charges/{charge['id']}", "timeout", times=1, delay_s=30)
    rv.request("undo", "r")
    wait_for(lambda: any(e.reason == "ReadBackLost" for e in rv.core.list_namespaced_event(
        rv.ns, field_selector="involvedObject.name=undo").items), timeout=90, what="a lost read-back")
    rv.patch("rollbackrequests", "undo", {"spec": {"cancel": True}})
    req = rv.wait_phase("undo", "Incomplete", "Succeeded", "Failed", timeout=60)
    report = req["status"]["report"]
    assert report["unverified"] == [0] and report["failed"] == [], report
    assert rv.condition(rv.step_status(req, 0), "Verified")["reason"] == "Cancelled"
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    _run_free(rv, "r")
    rv.request("again", "r")
    again = rv.wait_phase("again", "Succeeded", "Incomplete", timeout=90)
    assert again["status"]["phase"] == "Succeeded", again["status"]["report"]
    assert len(_jobs(rv, "compensator")) == 1, "the compensator ran again"
    assert len([c for c in _refund_calls(rv) if c["at"] >= rv.started]) == 1
