"""reversi_standing_undos: the failed and unverified undos that still stand, by namespace, tool
and state (docs/operations.md#alerts). They stand while the Run's last rollback is incomplete and
nobody acknowledged it; a later request's report replaces them; a resync rebuilds them from the
RollbackRequests."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from reversi.metrics import ACKNOWLEDGED, Metrics, standing_undos

CHARGE, RESERVE = "payments.create_charge", "inventory.reserve"


def _run(name: str, rolled_back: str | None, acknowledged: bool = False) -> dict:
    conds = [] if rolled_back is None else [{"type": "RolledBack", "status": rolled_back}]
    meta = {"name": name, "namespace": "shop", "annotations": {ACKNOWLEDGED: "oncall: refunded"} if acknowledged
            else {}}
    return {"metadata": meta, "status": {"conditions": conds}}


def _report(failed=(), unverified=(), compensated=()) -> SimpleNamespace:
    buckets = {b: [] for b in ("compensated", "failed", "unverified", "unrecoverable", "unresolved", "unmanifested",
                               "deferred", "awaiting_approval", "pending", "cancelled", "skipped",
                               "already_recovered", "expired", "handler_unavailable", "conflict",
                               "compensation_deadline_passed")}
    buckets["failed"] = [SimpleNamespace(step=i) for i in failed]
    buckets["unverified"] = list(unverified)
    buckets["compensated"] = list(compensated)
    return SimpleNamespace(**buckets)


PLAN = SimpleNamespace(actions={0: SimpleNamespace(tool=CHARGE), 1: SimpleNamespace(tool=CHARGE),
                                2: SimpleNamespace(tool=RESERVE)})


class _NoRuns:
    def list_paged(self, plural: str, namespace: str | None = None, keep=None) -> list:
        return []


def _resynced(registry: CollectorRegistry) -> Metrics:
    """The operator's metrics after its first resync of the Runs (before it, nothing is exported)."""
    metrics = Metrics(registry)
    metrics.refresh_runs(_NoRuns())
    return metrics


def _standing(registry: CollectorRegistry, tool: str = CHARGE, state: str = "failed") -> float | None:
    return registry.get_sample_value("reversi_standing_undos", {"namespace": "shop", "tool": tool, "state": state})


def test_a_failed_undo_stands_until_a_later_request_undoes_it():
    registry = CollectorRegistry()
    metrics = _resynced(registry)
    metrics.request_finished("shop", "incomplete", _report(failed=[0, 1], unverified=[2]), PLAN, run="r")
    metrics.run_observed("shop", "r", _run("r", "False"))
    assert _standing(registry) == 2
    assert _standing(registry, RESERVE, "unverified") == 1
    # the Run watch event may come before the request is counted: the same result
    metrics.run_observed("shop", "r", _run("r", "True"))
    metrics.request_finished("shop", "complete", _report(compensated=[0, 1, 2]), PLAN, run="r")
    assert _standing(registry) == 0, "fixed: the series stays, at 0 (a series that vanishes looks unchanged)"
    assert _standing(registry, RESERVE, "unverified") == 0


def test_acknowledging_the_run_clears_what_stands_and_deleting_it_too():
    registry = CollectorRegistry()
    metrics = _resynced(registry)
    metrics.run_observed("shop", "r", _run("r", "False"))
    metrics.request_finished("shop", "incomplete", _report(failed=[0]), PLAN, run="r")
    assert _standing(registry) == 1
    metrics.run_observed("shop", "r", _run("r", "False", acknowledged=True))
    assert _standing(registry) == 0
    metrics.run_observed("shop", "r", _run("r", "False"))  # the acknowledgement removed: it stands again
    assert _standing(registry) == 1
    metrics.run_observed("shop", "r", None)
    assert _standing(registry) == 0


def test_a_dry_run_or_a_request_without_a_run_changes_nothing():
    registry = CollectorRegistry()
    metrics = _resynced(registry)
    metrics.run_observed("shop", "r", _run("r", "False"))
    metrics.request_finished("shop", "incomplete", _report(failed=[0]), PLAN, run="r")
    metrics.request_finished("shop", "dryRun")
    metrics.request_finished("shop", "incomplete", _report(failed=[0, 1]), PLAN)
    assert _standing(registry) == 1


def _request(run: str, done: str | None, failed=(), unverified=(), dry_run: bool = False) -> dict:
    steps = [{"step": 0, "tool": CHARGE}, {"step": 1, "tool": CHARGE}, {"step": 2, "tool": RESERVE}]
    status = {"steps": steps, "report": {"failed": [{"step": i, "error": "boom"} for i in failed],
                                          "unverified": list(unverified)}}
    if done:
        status["completionTime"] = done
    return {"metadata": {"namespace": "shop", "name": f"undo-{run}-{done}"},
            "spec": {"runRef": {"name": run}, "dryRun": dry_run}, "status": status}


class _Kube:
    def __init__(self, runs: list[dict], requests: list[dict]):
        self.objects = {"runs": runs, "rollbackrequests": requests}

    def list_paged(self, plural: str, namespace: str | None = None, keep=None) -> list:
        found = self.objects.get(plural, [])
        return found if keep is None else [k for k in map(keep, found) if k is not None]


def test_a_resync_takes_each_runs_last_finished_request():
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    kube = _Kube([_run("r", "False"), _run("ok", "True")], [
        _request("r", "2026-12-01T10:00:00Z", failed=[0, 1]),
        _request("r", "2026-12-01T11:00:00Z", failed=[1], unverified=[2]),  # the last one: it decides
        _request("r", None, failed=[0, 1, 2]),  # still running: no verdict yet
        _request("r", "2026-12-01T12:00:00Z", failed=[0, 1, 2], dry_run=True),
        _request("ok", "2026-12-01T11:00:00Z", failed=[0]),  # its run is no longer incomplete
    ])
    metrics.refresh(kube)
    assert _standing(registry) == 1
    assert _standing(registry, RESERVE, "unverified") == 1


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sets(st.sampled_from([0, 1, 2])),
                          st.booleans(), st.booleans()), max_size=12))
def test_the_gauge_always_sums_the_last_report_of_each_incomplete_unacknowledged_run(events):
    """Whatever order requests finish and Runs change in, the gauge is the sum, over the Runs now
    incomplete and not acknowledged, of the failed steps of each one's last report."""
    registry = CollectorRegistry()
    metrics = _resynced(registry)
    last: dict[str, set[int]] = {}
    incomplete: dict[str, bool] = {}
    for run, failed, is_incomplete, acknowledged in events:
        metrics.request_finished("shop", "incomplete", _report(failed=sorted(failed)), PLAN, run=run)
        last[run] = failed
        metrics.run_observed("shop", run, _run(run, "False" if is_incomplete else "True", acknowledged))
        incomplete[run] = is_incomplete and not acknowledged
    expected_charge = sum(len({i for i in last[r] if i < 2}) for r in last if incomplete[r])
    expected_reserve = sum(1 for r in last if incomplete[r] and 2 in last[r])
    assert (_standing(registry) or 0) == expected_charge
    assert (_standing(registry, RESERVE) or 0) == expected_reserve


def test_standing_undos_of_a_request_count_by_tool_and_state():
    assert standing_undos(_request("r", "t", failed=[0, 1], unverified=[2])) == {
        (CHARGE, "failed"): 2, (RESERVE, "unverified"): 1}
    assert standing_undos({"status": {}}) == {}


def test_a_resync_keeps_the_tool_the_finished_request_named_when_its_status_does_not():
    """A step an earlier request left unverified is planned as a skip, which the status does not
    list: the resync cannot name its tool, and keeps the one the finished request's report gave."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.run_observed("shop", "r", _run("r", "False"))
    metrics.request_finished("shop", "incomplete", _report(unverified=[2]), PLAN, run="r")
    later = _request("r", "2026-12-01T11:00:00Z", unverified=[2])
    later["status"]["steps"] = []  # the carried-over step is not in status.steps
    metrics.refresh(_Kube([_run("r", "False")], [later]))
    assert _standing(registry, RESERVE, "unverified") == 1
    assert _standing(registry, "unknown", "unverified") in (None, 0)
    # after an operator restart nothing named it: the resync says unknown, rather than nothing
    fresh = CollectorRegistry()
    restarted = Metrics(fresh)
    restarted.refresh(_Kube([_run("r", "False")], [later]))
    assert _standing(fresh, "unknown", "unverified") == 1
