"""reversi_incomplete_rollbacks, computed at each scrape from the operator's informer of Runs (no API call,
no copy of the Runs)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from reversi.engine.acknowledgement import incomplete as incomplete_run
from reversi.metrics import ACKNOWLEDGED
from tests.helpers import RunsInformerStub, metrics_reading


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


def test_the_gauge_counts_each_incomplete_unacknowledged_run_once_at_each_scrape():
    registry, runs = CollectorRegistry(), RunsInformerStub()
    metrics_reading(runs, registry)
    runs.put(_run("a", None))
    assert _gauge(registry) is None  # no Run of the namespace has been counted yet
    runs.put(_run("a", "False"))
    runs.put(_run("a", "False"))  # the same run again: still one
    runs.put(_run("b", "False"))
    assert _gauge(registry) == 2
    runs.put(_run("a", "False", acknowledged=True))
    assert _gauge(registry) == 1
    runs.delete("shop", "b")
    assert _gauge(registry) == 0, "a namespace once exported stays, at 0 (a series that vanishes looks unchanged)"


def test_a_freshly_started_operator_exports_nothing_before_its_informer_listed_the_runs():
    """At start-up the Runs come one at a time: before the informer's first LIST is in, no 0 is exported while
    the namespace's incomplete Runs are still unseen (a 0 scraped then would clear a firing alert, or start the
    incomplete alert's 15 minutes over)."""
    registry, runs = CollectorRegistry(), RunsInformerStub(listed=False)
    metrics_reading(runs, registry)
    runs.put(_run("done", "True"))
    runs.put(_run("a", "False"))
    assert _gauge(registry) is None
    runs.put(_run("b", "False"))
    runs.listed = True
    assert _gauge(registry) == 2
