"""reversi_standing_undos: the failed and unverified undos that still stand, by namespace, tool
and state (docs/operations.md#alerts), read from each Run's ``status.standing`` as the operator's
informer of Runs keeps it, at each scrape (docs/concepts.md#what-stands). They count while the Run
is not rolled back in full and nobody acknowledged what stands; a finished RollbackRequest alone, of
whatever verdict, changes nothing."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from reversi.engine import standing as sd
from reversi.metrics import ACKNOWLEDGED, Metrics
from tests.helpers import RunsInformerStub, metrics_reading

CHARGE, RESERVE = "payments.create_charge", "inventory.reserve"
TOOLS = {0: CHARGE, 1: CHARGE, 2: RESERVE}


def _standing_of(failed=(), unverified=(), request: str = "undo") -> dict:
    steps = [sd.StandingUndo(i, TOOLS[i], "failed", request) for i in failed]
    steps += [sd.StandingUndo(i, TOOLS[i], "unverified", request) for i in unverified]
    return sd.summary(steps, request)


def _run(name: str, rolled_back: str | None, acknowledged: bool = False, failed=(), unverified=()) -> dict:
    conds = [] if rolled_back is None else [{"type": "RolledBack", "status": rolled_back}]
    meta = {"name": name, "namespace": "shop", "annotations": {ACKNOWLEDGED: "oncall: refunded"} if acknowledged
            else {}}
    status: dict = {"conditions": conds}
    if rolled_back is not None:
        status["standing"] = _standing_of(failed, unverified)
    return {"metadata": meta, "status": status}


def _report(failed=(), unverified=(), compensated=(), cancelled=()) -> SimpleNamespace:
    buckets = {b: [] for b in ("compensated", "failed", "unverified", "unrecoverable", "unresolved", "unmanifested",
                               "deferred", "awaiting_approval", "pending", "cancelled", "skipped",
                               "already_recovered", "expired", "handler_unavailable", "conflict",
                               "compensation_deadline_passed")}
    buckets["failed"] = [SimpleNamespace(step=i) for i in failed]
    buckets["unverified"] = list(unverified)
    buckets["compensated"] = list(compensated)
    buckets["cancelled"] = list(cancelled)
    return SimpleNamespace(**buckets)


PLAN = SimpleNamespace(actions={i: SimpleNamespace(tool=t) for i, t in TOOLS.items()})


def _reading(registry: CollectorRegistry) -> tuple[Metrics, RunsInformerStub]:
    """The operator's metrics reading an informer of Runs that has listed them (before it, nothing is exported)."""
    runs = RunsInformerStub()
    return metrics_reading(runs, registry), runs


def _standing(registry: CollectorRegistry, tool: str = CHARGE, state: str = "failed") -> float | None:
    return registry.get_sample_value("reversi_standing_undos", {"namespace": "shop", "tool": tool, "state": state})


def test_a_failed_undo_stands_while_the_run_says_so():
    registry = CollectorRegistry()
    _metrics, runs = _reading(registry)
    runs.put(_run("r", "False", failed=[0, 1], unverified=[2]))
    assert _standing(registry) == 2
    assert _standing(registry, RESERVE, "unverified") == 1
    runs.put(_run("r", "True"))
    assert _standing(registry) == 0, "fixed: the series stays, at 0 (a series that vanishes looks unchanged)"
    assert _standing(registry, RESERVE, "unverified") == 0


def test_a_request_that_ends_changes_nothing_that_stands_only_the_run_does():
    """A request created cancelled, a dry run, an invalid one: counted by verdict, and what
    stands is what the Run says (the bug: the last finished request's report, whatever it did)."""
    registry = CollectorRegistry()
    metrics, runs = _reading(registry)
    runs.put(_run("r", "False", failed=[0, 1]))
    metrics.request_finished("shop", "cancelled", _report(cancelled=[0, 1]), PLAN)
    metrics.request_finished("shop", "dryRun")
    metrics.request_finished("shop", "invalid")
    metrics.request_finished("shop", "complete", _report(compensated=[0, 1]), PLAN)
    assert _standing(registry) == 2
    assert registry.get_sample_value("reversi_rollbacks_total", {"namespace": "shop", "verdict": "cancelled"}) == 1
    assert registry.get_sample_value("reversi_rollback_steps_total",
                                     {"namespace": "shop", "tool": CHARGE, "bucket": "cancelled"}) == 2


def test_acknowledging_the_run_clears_what_stands_and_deleting_it_too():
    registry = CollectorRegistry()
    _metrics, runs = _reading(registry)
    runs.put(_run("r", "False", failed=[0]))
    assert _standing(registry) == 1
    runs.put(_run("r", "False", acknowledged=True, failed=[0]))
    assert _standing(registry) == 0
    runs.put(_run("r", "False", failed=[0]))  # the acknowledgement removed: it stands again
    assert _standing(registry) == 1
    runs.delete("shop", "r")
    assert _standing(registry) == 0


def test_only_the_runs_count_and_nothing_is_exported_before_the_informer_listed_them():
    registry = CollectorRegistry()
    runs = RunsInformerStub(listed=False)
    metrics_reading(runs, registry)
    for run in (_run("r", "False", failed=[1], unverified=[2]), _run("ok", "True"),
                _run("acked", "False", acknowledged=True, failed=[0, 1]), _run("new", None)):
        runs.put(run)
    assert _standing(registry) is None  # one event of a freshly started operator: not the whole namespace
    runs.listed = True
    assert _standing(registry) == 1
    assert _standing(registry, RESERVE, "unverified") == 1


def test_a_standing_of_many_tools_counts_the_rest_under_other_tools():
    from reversi.models.run import MAX_STANDING_TOOLS, OTHER_TOOLS

    steps = [sd.StandingUndo(i, f"t{i:03d}", "failed", "undo") for i in range(MAX_STANDING_TOOLS + 5)]
    summary = sd.summary(steps, "undo")
    assert len(summary["tools"]) == MAX_STANDING_TOOLS + 1 and summary["failed"] == MAX_STANDING_TOOLS + 5
    assert sum(sd.by_tool(summary).values()) == MAX_STANDING_TOOLS + 5
    assert sd.by_tool(summary)[(OTHER_TOOLS, "failed")] == 5


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sets(st.sampled_from([0, 1, 2])),
                          st.sampled_from(["True", "False", None]), st.booleans()), max_size=12))
def test_the_gauge_always_sums_what_each_incomplete_unacknowledged_run_says(events):
    """Whatever order Runs change in, the gauge is the sum, over the Runs now incomplete and not
    acknowledged, of the failed steps their ``status.standing`` counts."""
    registry = CollectorRegistry()
    _metrics, runs = _reading(registry)
    now: dict[str, dict] = {}
    for run, failed, rolled_back, acknowledged in events:
        obj = _run(run, rolled_back, acknowledged, failed=sorted(failed))
        runs.put(obj)
        now[run] = obj
    counted = [r for r, obj in now.items() if obj["status"]["conditions"]
               and obj["status"]["conditions"][0]["status"] == "False" and not obj["metadata"]["annotations"]]
    expected_charge = sum(now[r]["status"]["standing"]["failed"] - sum(
        1 for s in now[r]["status"]["standing"]["steps"] if s["tool"] == RESERVE) for r in counted)
    expected_reserve = sum(1 for r in counted for s in now[r]["status"]["standing"]["steps"] if s["tool"] == RESERVE)
    assert (_standing(registry) or 0) == expected_charge
    assert (_standing(registry, RESERVE) or 0) == expected_reserve
