"""Reversi's alert rules: promtool's checks and unit tests (alerts_test.yaml), and the metrics
they read are the ones the operator exposes."""

from __future__ import annotations

import re

import yaml

from tests.chart.chartkit import CHART, HERE, run

RULES = CHART / "files" / "alerts" / "reversi.rules.yaml"
ALERTS = {"ReversiJournalNearQuota", "ReversiClosedRunsNearLimit", "ReversiRollbackRequestFailed",
          "ReversiRollbackAwaitingApproval", "ReversiArchiveFailing",
          "ReversiRollbackIncomplete", "ReversiCompensationFailed", "ReversiUnverifiedUndo", "ReversiOperatorDown",
          "ReversiAdmissionDown", "ReversiCRDSchemaOutdated"}


def test_promtool_check_rules(promtool):
    out = run([promtool, "check", "rules", RULES]).stdout
    assert f"SUCCESS: {len(ALERTS)} rules found" in out


def test_promtool_unit_tests(promtool):
    """Each alert fires when it should and stays quiet when it should not (alerts_test.yaml)."""
    out = run([promtool, "test", "rules", HERE / "alerts_test.yaml"])
    assert "SUCCESS" in out.stdout + out.stderr


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_every_alert_has_a_unit_test_that_fires_and_one_that_does_not():
    tests = yaml.safe_load((HERE / "alerts_test.yaml").read_text())["tests"]
    fires, quiet = set(), set()
    for case in tests:
        for check in case.get("alert_rule_test") or []:
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert {r["alert"] for r in _rules()} == ALERTS
    assert fires == ALERTS, f"no firing test for {ALERTS - fires}"
    assert quiet == ALERTS, f"no quiet test for {ALERTS - quiet}"


def test_every_alert_says_what_to_do():
    for rule in _rules():
        ann = rule["annotations"]
        assert ann.get("summary") and ann.get("description"), rule["alert"]
        assert "kubectl" in ann["description"], f"{rule['alert']}: the description should say what to run"
        assert ann.get("runbook_url", "").endswith("#" + rule["alert"].lower())
        assert rule["labels"]["severity"] in ("warning", "critical")


def test_rules_read_only_metrics_the_operator_exposes():
    """Metric names in the rules are the operator's (counters with _total), or `up`."""
    from reversi.metrics import Metrics

    exposed = set()
    metrics = Metrics()
    metrics.runs_source = lambda: []  # the gauges of what stands export once the Runs are listed
    for metric in metrics.registry.collect():
        exposed |= {metric.name, f"{metric.name}_total", f"{metric.name}_bucket"}
    for rule in _rules():
        names = set(re.findall(r"\b(reversi_[a-z_]+|up)\b", rule["expr"]))
        assert names, rule["alert"]
        assert names <= exposed | {"up"}, f"{rule['alert']} reads unknown metrics {names - exposed - {'up'}}"


def test_the_closed_runs_alert_knows_the_slices_limit():
    """ReversiClosedRunsNearLimit divides by a slice's capacity and names the slices per namespace
    as the model declares them (docs/operations.md#reversiclosedrunsnearlimit)."""
    from reversi.models.closedrunslice import SLICE_CAPACITY, SLICES

    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    rule = rules["ReversiClosedRunsNearLimit"]
    assert f"/ {SLICE_CAPACITY} > 0.8" in rule["expr"]
    assert f"of the {SLICE_CAPACITY} closed runs" in rule["annotations"]["description"]
    assert f"({SLICES} slices per namespace" in rule["annotations"]["description"]
