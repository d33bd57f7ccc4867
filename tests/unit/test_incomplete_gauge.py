"""reversi_incomplete_rollbacks kept from Run watch events (no API call per finished request)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from reversi.metrics import ACKNOWLEDGED, Metrics, incomplete_run


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


def test_a_resync_replaces_the_counts_unless_an_event_came_in_while_it_listed():
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.run_observed("shop", "a", _run("a", "False"))
    metrics.refresh_runs(_Kube([_run("b", "False"), _run("c", "False")]))
    assert _gauge(registry) == 2
    # an event that arrives while the list is read is newer than the list: the list is dropped
    metrics.refresh_runs(_Kube([], during=lambda: metrics.run_observed("shop", "d", _run("d", "False"))))
    assert _gauge(registry) == 3
