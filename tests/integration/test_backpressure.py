"""Backpressure before etcd fills (docs/operations.md#backpressure-a-ceiling-per-namespace), on the
real API server with a real ResourceQuota: once a namespace's journal reaches its ceiling the next
recorded call is refused before it is made, the SDK says what to do, and the journal's gauges
show the size and the ceiling."""

from __future__ import annotations

import os

import pytest
from kubernetes import client

from reversi.sdk import JournalFull, Recorder
from tests.helpers import recorded_steps, wait_for
from tests.integration.test_metrics import scrape, value

pytestmark = pytest.mark.cluster
CEILING = 3


def journal_quota(api: client.ApiClient, namespace: str, steps: int) -> None:
    """A ResourceQuota of ``steps`` RunSteps in ``namespace``, once the quota controller has
    computed its usage (until then the API server refuses every RunStep there)."""
    core = client.CoreV1Api(api)
    core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "reversi-journal"},
                                                      "spec": {"hard": {"count/runsteps.reversi.dev": str(steps)}}})
    wait_for(lambda: (core.read_namespaced_resource_quota("reversi-journal", namespace).status.used or {})
             .get("count/runsteps.reversi.dev") is not None, what="the quota's usage computed")


def test_a_full_journal_refuses_the_next_call_before_it_is_made_and_says_what_to_do(rv, admin_api, operator):
    rv.apply_manifest()
    journal_quota(admin_api, rv.ns, CEILING)
    rec = Recorder.open(rv.ns, "busy", manifest="payments", api=admin_api, scope={"actor": "test-agent"})
    made = []
    for i in range(CEILING):
        rec.call("payments.get_customer", {"id": f"c{i}"}, lambda a: made.append(a) or {"id": a["id"]})
    with pytest.raises(JournalFull) as refused:
        rec.call("payments.get_customer", {"id": "one too many"}, lambda a: made.append(a) or {"id": a["id"]})
    message = refused.value.message
    assert "exceeded quota: reversi-journal" in message and "count/runsteps.reversi.dev" in message
    assert "wait for retention to delete expired runs" in message and "ask for a larger quota" in message
    assert "kubectl delete run NAME" in message
    assert len(made) == CEILING, "the refused call was never made"
    assert len(recorded_steps(admin_api, rv.ns, "busy")) == CEILING
    # the gauges: the namespace's steps (etcd's count) and its ceiling
    port = int(os.environ.get("REVERSI_TEST_METRICS_PORT", "18089"))
    wait_for(lambda: (s := scrape(port)) and value(s, "reversi_journal_steps", namespace=rv.ns) == CEILING
             and value(s, "reversi_journal_quota_steps", namespace=rv.ns) == CEILING
             and value(s, "reversi_journal_runs", namespace=rv.ns) == 1,
             what="the journal's gauges to show 3 of 3 steps")
    # deleting the run frees the journal: the agent records again in a new run
    client.CustomObjectsApi(admin_api).delete_namespaced_custom_object("reversi.dev", "v1alpha1", rv.ns, "runs", "busy")
    again = Recorder.open(rv.ns, "next", manifest="payments", api=admin_api, scope={"actor": "test-agent"})
    wait_for(lambda: _records(again), what="a call admitted once the old run's steps are gone")


def _records(rec: Recorder) -> bool:
    try:
        rec.call("payments.get_customer", {"id": "again"}, lambda a: {"id": a["id"]})
        return True
    except JournalFull:
        return False
