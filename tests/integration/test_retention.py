"""Retention on the real control plane (docs/concepts.md#retention): a quiet Run is deleted with
its steps a TTL after its last activity, with an Event and a metric; a Run is kept while its
agent records, while a rollback waits for an approval, while residue nobody acknowledged stands,
and for good when it says ``keep: Forever``.

Each test's namespace sets a TTL of 2 s (annotation ``reversi.dev/retention-ttl-seconds``). That a
Run is *kept* is shown against a witness: a plain Run made at the moment the kept one became due
(same TTL, nothing unfinished) is deleted first, and the kept one must still be there then."""

from __future__ import annotations

import os
import threading
import time

import pytest
from kubernetes import client

from reversi.adapters.journal import step_body
from reversi.engine.retention import NAMESPACE_ANNOTATION
from tests.helpers import wait_for
from tests.integration.test_metrics import scrape, value

pytestmark = pytest.mark.cluster
G, V = "reversi.dev", "v1alpha1"
TTL = 2


@pytest.fixture
def short_ttl(rv, admin_api):
    """The test namespace's Runs expire 2 s after their last activity."""
    client.CoreV1Api(admin_api).patch_namespace(rv.ns, {"metadata": {"annotations": {NAMESPACE_ANNOTATION: str(TTL)}}})
    rv.apply_manifest()
    return rv


def _exists(rv, plural: str, name: str) -> bool:
    try:
        rv.get(plural, name)
        return True
    except client.ApiException as err:
        if err.status == 404:
            return False
        raise


def _gone(rv, run: str, timeout: float = 30) -> None:
    wait_for(lambda: not _exists(rv, "runs", run), timeout=timeout, what=f"Run {run} deleted by retention")


def _witness(rv, name: str) -> None:
    """A plain Run due at the same moment as the run under test: once it is gone, that run's
    TTL has passed too."""
    rv.run(name, [rv.step(0, "payments.get_customer", {"id": "cus_9"}, {"id": "cus_9"})])
    _gone(rv, name)


def _events(rv, run: str) -> list:
    return [e for e in client.CoreV1Api(rv.api).list_namespaced_event(rv.ns).items
            if e.involved_object.name == run and e.involved_object.kind == "Run" and e.reason == "RunDeleted"]


def test_a_quiet_run_is_deleted_with_its_steps_an_event_and_a_metric(short_ttl, operator):
    rv = short_ttl
    rv.run("quiet", [rv.step(0, "payments.get_customer", {"id": "cus_9"}, {"id": "cus_9"}),
                     rv.step(1, "email.send", {"to": "c@example.com"}, {"id": "m-1"})])
    created = time.time()
    _gone(rv, "quiet")
    assert time.time() - created >= TTL - 1, "not before its TTL"
    wait_for(lambda: rv.steps("quiet") == [], what="its RunSteps deleted by the garbage collector")
    event = wait_for(lambda: _events(rv, "quiet"), what="the RunDeleted Event")[0]
    assert "deleted by retention: no activity since" in event.message and f"ttl {TTL} s" in event.message
    port = int(os.environ.get("REVERSI_TEST_METRICS_PORT", "18089"))
    wait_for(lambda: value(scrape(port), "reversi_runs_deleted_total", namespace=rv.ns, reason="expired") >= 1,
             what="reversi_runs_deleted_total{reason=expired}")


def test_a_run_is_kept_while_its_agent_records_and_deleted_once_it_stops(short_ttl, operator):
    rv = short_ttl
    rv.run("agent", [])
    stop = time.time() + 3 * TTL
    index = 0
    while time.time() < stop:  # an agent recording a call every 0.4 s, longer than the TTL
        rv.create("runsteps", step_body(rv.ns, "agent", rv.step(index, "payments.get_customer", {"id": f"c{index}"},
                                                                 {"id": f"c{index}"})))
        index += 1
        threading.Event().wait(0.4)
    assert _exists(rv, "runs", "agent") and len(rv.steps("agent")) == index
    _gone(rv, "agent")


def test_a_run_whose_rollback_waits_for_an_approval_is_kept_and_its_residue_until_acknowledged(short_ttl, operator):
    rv = short_ttl
    charge = rv.charge("o-ret-1")
    rv.run("held", [rv.step(0, "payments.create_charge", {"order_id": "o-ret-1", "amount": 700, "customer": "cus_9"},
                            charge),
                    rv.step(1, "payments.capture", {"charge_id": charge["id"]}, {"id": "cap_1"}, depends_on=[0])])
    rv.request("undo", "held")
    rv.wait_phase("undo", "AwaitingApproval")
    _witness(rv, "witness-approval")
    assert _exists(rv, "runs", "held"), "kept while a rollback waits for an approval"
    # denied: the capture stays in place and so does the charge it stands on (residue); kept for it
    rv.patch("rollbackrequests", "undo", {"spec": {"denials": [{"step": 1, "note": "the customer wants it"}]}})
    rv.wait_phase("undo", "Incomplete")
    _witness(rv, "witness-residue")
    assert _exists(rv, "runs", "held"), "kept while residue nobody acknowledged stands"
    rv.patch("runs", "held", {"spec": {"acknowledgement": {"note": "the customer keeps the capture"}}})
    _gone(rv, "held")
    assert _exists(rv, "rollbackrequests", "undo"), "a RollbackRequest is not the Run's: it stays"


def test_a_run_kept_forever_on_purpose_stays(short_ttl, operator):
    rv = short_ttl
    body = {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": "evidence"},
            "spec": {"scope": {"actor": "test-agent"}, "manifestRef": {"name": "payments"},
                     "retention": {"keep": "Forever"}}}
    rv.create("runs", body)
    _witness(rv, "witness-forever")
    assert _exists(rv, "runs", "evidence")
    # and a Run's own TTL wins over the namespace's
    rv.patch("runs", "evidence", {"spec": {"retention": {"keep": None, "ttlSeconds": 1}}})
    _gone(rv, "evidence")
