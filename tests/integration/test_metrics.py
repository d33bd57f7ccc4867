"""Prometheus metrics (docs/operations.md#metrics) scraped from the running operator after real rollbacks."""

from __future__ import annotations

import urllib.request

import pytest
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import wait_for

pytestmark = pytest.mark.cluster

UNCHECKED = {"name": "payments.create_charge_unchecked", "effect": "write",
             "compensation": {"tool": "payments.refund", "kind": "compensation",
                              "args": {"charge_id": "$result.id"}, "runner": "tools"}}


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """``{(sample name, labels): value}`` from the operator's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples, name, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_after_a_rollback_with_one_failed_and_one_unverified_step(rv, operator):
    rv.apply_manifest(extra_tools=[UNCHECKED])
    ns = rv.ns
    a, b = rv.charge("o-m-a"), rv.charge("o-m-b")
    rv.run("r", [
        rv.step(0, "payments.create_charge", {"order_id": "o-m-a", "amount": 700, "customer": "cus_9"}, a),
        rv.step(1, "payments.create_charge_unchecked", {"order_id": "o-m-b"}, b),
    ])
    # newest first: step 1's refund goes through (unverified: no check declared, and the request
    # requires one), step 0's fails
    rv.downstream.post("/_faults", {"path_prefix": "/payments/refunds", "mode": "error", "skip": 1, "times": 1})
    rv.request("undo", "r", retries=1, requireVerification=True)
    req = rv.wait_phase("undo", "Incomplete")
    assert [f["step"] for f in req["status"]["report"]["failed"]] == [0]
    assert req["status"]["report"]["unverified"] == [1]

    samples = wait_for(lambda: (s := scrape(operator.metrics_port)) and
                       value(s, "reversi_rollbacks_total", namespace=ns, verdict="incomplete") == 1 and s,
                       what="the rollback counted")
    steps = {labels: v for (name, labels), v in samples.items()
             if name == "reversi_rollback_steps_total" and ("namespace", ns) in labels}
    assert steps == {
        frozenset({("namespace", ns), ("tool", "payments.create_charge"), ("bucket", "failed")}): 1.0,
        frozenset({("namespace", ns), ("tool", "payments.create_charge_unchecked"), ("bucket", "unverified")}): 1.0,
    }
    assert value(samples, "reversi_rollbacks_total", namespace=ns, verdict="complete") == 0
    # the gauge follows the Run's watch event (the release write), not a list per finished request
    wait_for(lambda: value(scrape(operator.metrics_port), "reversi_incomplete_rollbacks", namespace=ns) == 1,
             timeout=10, what="the incomplete run counted from its watch event")
    assert value(samples, "reversi_compensation_duration_seconds_count", namespace=ns,
                 tool="payments.create_charge_unchecked") == 1
    # what still stands, by tool and state: the gauges the alerts read
    standing = wait_for(lambda: (s := scrape(operator.metrics_port)) and
                        value(s, "reversi_standing_undos", namespace=ns, tool="payments.create_charge",
                              state="failed") == 1 and s, timeout=10, what="the failed undo standing")
    assert value(standing, "reversi_standing_undos", namespace=ns, tool="payments.create_charge_unchecked",
                 state="unverified") == 1
    # a later complete rollback of the same run clears the gauge (it counts runs, not requests)
    rv.request("again", "r")
    again = rv.wait_phase("again", "Succeeded", "Incomplete")
    assert again["status"]["report"]["compensated"] == [0] and again["status"]["report"]["unverified"] == [1]
    # still incomplete (step 1 stays unverified): the gauge keeps counting the run, once (the
    # counter moves just after the request's final status is written: wait for it)
    samples = wait_for(lambda: (s := scrape(operator.metrics_port)) and
                       value(s, "reversi_rollbacks_total", namespace=ns, verdict="incomplete") == 2 and s,
                       timeout=30, what="the second incomplete rollback to be counted")
    assert value(samples, "reversi_incomplete_rollbacks", namespace=ns) == 1
    # the failed undo was undone by the second request: it no longer stands (at 0, not gone); the
    # unverified one still does
    samples = wait_for(lambda: (s := scrape(operator.metrics_port)) and
                       value(s, "reversi_standing_undos", namespace=ns, tool="payments.create_charge",
                             state="failed") == 0 and s, timeout=10, what="the failed undo no longer standing")
    assert ("reversi_standing_undos", frozenset({("namespace", ns), ("tool", "payments.create_charge"),
                                                 ("state", "failed")})) in samples
    assert value(samples, "reversi_standing_undos", namespace=ns, tool="payments.create_charge_unchecked",
                 state="unverified") == 1
    run = rv.get("runs", "r")
    assert (run["status"]["standing"]["failed"], run["status"]["standing"]["unverified"]) == (0, 1)
    assert run["status"]["standing"]["request"] == "undo"  # "again" left nothing new standing

    # a Run whose status predates status.standing (an upgrade) gets it from its journal, once
    rv.custom.patch_namespaced_custom_object_status("reversi.dev", "v1alpha1", ns, "runs", "r",
                                                    {"status": {"standing": None}})
    back = wait_for(lambda: (rv.get("runs", "r")["status"].get("standing")), timeout=30,
                    what="status.standing computed again from the journal")
    assert (back["failed"], back["unverified"], back["request"]) == (0, 1, "again")
    assert back["steps"] == [{"step": 1, "tool": "payments.create_charge_unchecked", "state": "unverified",
                              "request": "undo"}]
    wait_for(lambda: value(scrape(operator.metrics_port), "reversi_standing_undos", namespace=ns,
                           tool="payments.create_charge_unchecked", state="unverified") == 1,
             timeout=10, what="the gauge from the Run again")


def test_metrics_count_active_halts_and_refused_calls(rv, operator, admin_api):
    from reversi.sdk import Halted, Recorder

    rv.apply_manifest()
    ns = rv.ns
    rv.custom.create_namespaced_custom_object("reversi.dev", "v1alpha1", ns, "halts", {
        "apiVersion": "reversi.dev/v1alpha1", "kind": "Halt", "metadata": {"name": "stop"},
        "spec": {"reason": "metrics test", "scope": {"tool": "payments.*"}}})
    wait_for(lambda: value(scrape(operator.metrics_port), "reversi_active_halts", namespace=ns) == 1,
             what="the active halt counted")
    rec = Recorder.open(ns, "r", manifest="payments", api=admin_api)
    with pytest.raises(Halted):  # refused by the API server's halts policy (its own metrics count it)
        rec.call("payments.get_customer", {"id": "cus_9"}, lambda a: a)
    from reversi.adapters.journal import step_body
    with pytest.raises(ApiException):  # a step written without the SDK's copy of its Run crosses the webhook
        rv.create("runsteps", step_body(ns, "r", rv.step(0, "payments.get_customer", {"id": "cus_9"})))
    # the admission replicas count what they refuse: the one that answered has it, the sum is 1
    refused = [value(scrape(replica.metrics_port), "reversi_refused_calls_total", namespace=ns,
                     tool="payments.get_customer", reason="halted") for replica in operator.admission.replicas]
    assert sum(v or 0 for v in refused) == 1, refused
    rv.custom.delete_namespaced_custom_object("reversi.dev", "v1alpha1", ns, "halts", "stop")
    wait_for(lambda: value(scrape(operator.metrics_port), "reversi_active_halts", namespace=ns) == 0,
             what="the lifted halt no longer counted")


def test_an_acknowledged_run_no_longer_counts_as_incomplete(rv, operator):
    rv.apply_manifest()
    rv.run("r", [rv.step(0, "email.send", {"to": "c"}, {"id": "m"})])
    rv.request("undo", "r")
    rv.wait_phase("undo", "Incomplete")
    wait_for(lambda: value(scrape(operator.metrics_port), "reversi_incomplete_rollbacks", namespace=rv.ns) == 1,
             what="the incomplete run counted")
    rv.patch("runs", "r", {"metadata": {"annotations": {
        "reversi.dev/acknowledged": "oncall: apologised to the customer for the email"}}})
    wait_for(lambda: value(scrape(operator.metrics_port), "reversi_incomplete_rollbacks", namespace=rv.ns) == 0,
             timeout=10, what="the acknowledged run left out (from the Run's watch event, not the 30 s resync)")


def test_a_failed_request_is_exported_with_its_run_and_reason_until_it_is_deleted(rv, operator):
    """reversi_rollback_request_failed leads an alert straight to the request and its run
    (docs/operations.md#reversirollbackrequestfailed); the series goes with the request."""
    rv.request("lost", "no-such-run")  # never created: RunNotFound once REVERSI_RUN_WAIT_SECONDS passed
    rv.wait_phase("lost", "Failed", timeout=60)
    labels = {"namespace": rv.ns, "request": "lost", "run": "no-such-run", "reason": "RunNotFound"}
    wait_for(lambda: value(scrape(operator.metrics_port), "reversi_rollback_request_failed", **labels) == 1,
             what="the failed request exported")
    rv.custom.delete_namespaced_custom_object("reversi.dev", "v1alpha1", rv.ns, "rollbackrequests", "lost")
    wait_for(lambda: ("reversi_rollback_request_failed", frozenset(labels.items()))
             not in scrape(operator.metrics_port), what="the series gone with the request")
