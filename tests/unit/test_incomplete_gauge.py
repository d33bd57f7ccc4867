"""reversi_incomplete_rollbacks kept from Run watch events (no API call per finished request)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from reversi.engine.acknowledgement import incomplete as incomplete_run
from reversi.metrics import ACKNOWLEDGED, Metrics


def _run(name: str, rolled_back: str | None, acknowledged: bool = False) -> dict:
    conds = [] if rolled_back is None else [{"type": "RolledBack", "status": rolled_back}]
    meta = {"name": name, "namespace": "shop", "annotations": {ACKNOWLEDGED: "oncall"} if acknowledged else {}}
    return {"metadata": meta, "status": {"conditions": conds}}


def _gauge(registry: CollectorRegistry, ns: str = "shop") -> float | None:
    return registry.get_sample_value("reversi_incomplete_rollbacks", {"namespace": ns})


def test_incomplete_run_needs_rolled_back_false_and_no_acknowledgement():
    assert incomplete_run(_run("a", "False"))
    assert not incomplete_run(_run("a", "True"))
    assert not incomplete_run(_run("a", None))
    assert not incomplete_run(_run("a", "False", acknowledged=True))


def test_the_gauge_follows_events_counting_each_run_once():
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.refresh_runs(_Kube([]))
    metrics.run_observed("shop", "a", _run("a", None))
    assert _gauge(registry) == 0
    metrics.run_observed("shop", "a", _run("a", "False"))
    metrics.run_observed("shop", "a", _run("a", "False"))  # the same run again: still one
    metrics.run_observed("shop", "b", _run("b", "False"))
    assert _gauge(registry) == 2
    metrics.run_observed("shop", "a", _run("a", "False", acknowledged=True))
    assert _gauge(registry) == 1
    metrics.run_observed("shop", "b", None)  # deleted
    assert _gauge(registry) == 0


class _Kube:
    def __init__(self, runs: list[dict], during=None):
        self.runs, self.during = runs, during

    def list_paged(self, plural: str, namespace: str | None = None, keep=None) -> list:
        if self.during:
            self.during()
        found = self.runs if plural == "runs" else []
        return found if keep is None else [k for k in map(keep, found) if k is not None]


def test_a_resync_replaces_the_counts_and_an_event_that_came_in_while_it_listed_wins():
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.refresh_runs(_Kube([]))
    metrics.run_observed("shop", "a", _run("a", "False"))
    metrics.refresh_runs(_Kube([_run("b", "False"), _run("c", "False")]))
    assert _gauge(registry) == 2
    # events that arrive while the list is read are newer than the list: laid over it (d is new,
    # b was rolled back again in full)
    def meanwhile():
        metrics.run_observed("shop", "d", _run("d", "False"))
        metrics.run_observed("shop", "b", _run("b", "True"))
    metrics.refresh_runs(_Kube([_run("b", "False"), _run("c", "False")], during=meanwhile))
    assert _gauge(registry) == 2  # c and d


def test_a_freshly_started_operator_exports_nothing_before_its_first_resync():
    """At start-up the Runs' watch events come one Run at a time: the first event of a namespace
    (a complete Run) must not export 0 while the namespace's incomplete Runs are still unseen (a
    0 scraped then would clear a firing alert, or start the incomplete alert's 15 minutes over)."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.run_observed("shop", "done", _run("done", "True"))
    metrics.run_observed("shop", "a", _run("a", "False"))
    assert _gauge(registry) is None
    metrics.refresh_runs(_Kube([_run("a", "False"), _run("b", "False")]))
    assert _gauge(registry) == 2
