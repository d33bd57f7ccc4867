"""The gauges of a RollbackRequest that waits for a person (docs/operations.md#metrics): a series
while it is Failed or awaits approval, labelled with the request and its run, gone once it no
longer waits or is deleted."""

from __future__ import annotations

from reversi.metrics import Metrics


def _request(phase: str, *conditions: dict) -> dict:
    return {"metadata": {"namespace": "shop", "name": "undo-1"}, "spec": {"runRef": {"name": "order-4711"}},
            "status": {"phase": phase, "conditions": list(conditions)}}


def _samples(m: Metrics, name: str) -> dict[tuple, float]:
    return {tuple(sorted(s.labels.items())): s.value for fam in m.registry.collect() for s in fam.samples
            if s.name == name}


FAILED = "reversi_rollback_request_failed"
WAITING = "reversi_rollback_request_awaiting_approval_since_seconds"
LABELS = (("namespace", "shop"), ("request", "undo-1"), ("run", "order-4711"))


def test_a_request_awaiting_approval_says_since_when_and_its_series_goes_once_approved():
    m = Metrics()
    m.request_observed("shop", "undo-1", _request("AwaitingApproval", {
        "type": "AwaitingApproval", "status": "True", "reason": "AwaitingApproval",
        "lastTransitionTime": "2026-12-07T15:00:00Z"}))
    assert _samples(m, WAITING) == {LABELS: 1796655600.0}
    m.request_observed("shop", "undo-1", _request("Running", {"type": "AwaitingApproval", "status": "False"}))
    assert _samples(m, WAITING) == {} and _samples(m, FAILED) == {}


def test_a_failed_request_counts_with_its_reason_until_it_is_deleted():
    m = Metrics()
    m.request_observed("shop", "undo-1", _request("Failed", {"type": "Invalid", "status": "True",
                                                             "reason": "RunNotFound"}))
    assert _samples(m, FAILED) == {(LABELS[0], ("reason", "RunNotFound"), *LABELS[1:]): 1.0}
    m.request_observed("shop", "undo-1", _request("Failed", {"type": "Invalid", "status": "True",
                                                             "reason": "RunNotFound"}))  # the same again
    assert len(_samples(m, FAILED)) == 1
    m.request_observed("shop", "undo-1", None)
    assert _samples(m, FAILED) == {}


def test_a_request_at_work_or_done_exports_nothing():
    m = Metrics()
    for phase in ("Pending", "Running", "Succeeded", "Incomplete", "Planned"):
        m.request_observed("shop", "undo-1", _request(phase))
    assert _samples(m, FAILED) == {} and _samples(m, WAITING) == {}


def test_a_replica_that_stops_acting_stops_exporting_the_slices_it_wrote():
    """reversi_closed_run_slice_runs comes from the acting replica's writes: a standby's old values
    would keep ReversiClosedRunsNearLimit firing after the new holder's writes lowered them."""
    m = Metrics()
    m.closed_runs.labels("shop", "reversi-closed-runs-03").set(1900)
    m.leader_changed("operator-a", True)
    assert _samples(m, "reversi_closed_run_slice_runs")
    m.leader_changed("operator-a", False)
    assert _samples(m, "reversi_closed_run_slice_runs") == {}
