"""The Grafana dashboard: well-formed, every query parses and reads metrics the operator exposes,
and it shows what docs/operations.md#grafana-dashboard says it shows."""

from __future__ import annotations

import json
import re

import yaml

from tests.chart.chartkit import CHART, run

DASHBOARD = CHART / "files" / "dashboards" / "reversi.json"


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _queries() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in _dashboard()["panels"] for t in p.get("targets", [])]


def test_dashboard_is_well_formed():
    dash = _dashboard()
    assert dash["uid"] == "reversi-overview" and dash["title"] == "Reversi"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dash["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel.get("description"), f"panel {panel['title']!r} has no description"
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "namespace", "job"} <= variables


def test_dashboard_has_a_panel_for_each_signal_an_sre_watches():
    titles = " | ".join(title.lower() for title, _ in _queries())
    for wanted in ("by verdict", "failed and unverified", "compensation duration", "verification duration",
                   "active halts", "refused calls", "incomplete rollbacks"):
        assert wanted in titles, f"no panel for {wanted!r}"


def test_dashboard_queries_parse(promtool, tmp_path):
    """Every query, with Grafana's variables filled in, is valid PromQL (promtool checks a rules
    file made of them)."""
    subs = {"$__rate_interval": "5m", "$__range": "1h", "$namespace": ".*", "$job": "reversi-operator"}
    rules = []
    for i, (title, expr) in enumerate(_queries()):
        for var, value in subs.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, f"{title}: unknown variable in {expr}"
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run([promtool, "check", "rules", path])


def test_dashboard_reads_only_metrics_the_operator_exposes():
    """...the operator or the admission server (refused calls are counted where they are refused)."""
    from reversi.metrics import AdmissionMetrics, Metrics

    exposed = {"up"}
    metrics = Metrics()
    metrics.runs_source = lambda: []  # the gauges of what stands export once the Runs are listed
    for registry in (metrics.registry, AdmissionMetrics().registry):
        for metric in registry.collect():
            exposed |= {metric.name, f"{metric.name}_total", f"{metric.name}_bucket"}
    for title, expr in _queries():
        names = set(re.findall(r"\b(reversi_[a-z_]+|up)\b", expr))
        assert names and names <= exposed, f"{title}: unknown metrics {names - exposed}"


RULES = CHART / "files" / "alerts" / "reversi.rules.yaml"
#: the "Now" panels and the alert whose expression each reads, and the table of what stands
NOW_PANELS = {"Incomplete rollbacks": "ReversiRollbackIncomplete", "Failed undos standing": "ReversiCompensationFailed",
              "Unverified undos standing": "ReversiUnverifiedUndo"}


def _alert_exprs() -> dict[str, str]:
    return {r["alert"]: r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}


def _expr(title: str) -> str:
    return next(expr for t, expr in _queries() if t == title)


def test_no_panel_hides_a_scrape_gap_behind_a_zero():
    """A scrape gap is not a 0: no query fills missing data with ``or vector(0)``."""
    for title, expr in _queries():
        assert "vector(0)" not in expr.replace(" ", ""), f"{title}: {expr}"


def test_the_now_panels_read_the_expressions_the_alerts_read():
    """Each "Now" panel sums exactly the expression its alert compares with 0 (the namespace
    variable aside), and the table of what stands is that expression by namespace, tool and state."""
    alerts = _alert_exprs()
    for title, alert in NOW_PANELS.items():
        inner = alerts[alert].removesuffix(" > 0")
        assert _expr(title).replace(',namespace=~"$namespace"', "").replace('{namespace=~"$namespace"}', "") \
            == f"sum({inner})", title
    table = _expr("Failed and unverified undos standing now").replace('{namespace=~"$namespace"}', "")
    assert table == alerts["ReversiCompensationFailed"].replace('{state="failed"}', "").replace(
        "by (namespace, tool)", "by (namespace, tool, state)")


def test_in_a_scrape_gap_the_now_panels_show_what_the_alerts_see_then_no_data(promtool, tmp_path):
    """promtool evaluates the dashboard's queries over series with a gap (the operator's target
    down from minute 11: its series stale, ``up`` 0): at minute 12 the "Now" panels show the last
    value, as the firing alert does, the graphs show nothing (a gap, never 0) and "Operator up"
    shows 0; 15 minutes later the "Now" panels have no data, never 0."""
    subs = {"$namespace": ".*", "$job": "reversi-operator"}

    def query(title: str) -> str:
        expr = _expr(title)
        for var, value in subs.items():
            expr = expr.replace(var, value)
        return expr

    standing = '{namespace="shop",tool="payments.create_charge",state="failed",job="reversi-operator",pod="reversi-a"}'
    checks = []
    for title, want in (("Failed undos standing", 2), ("Incomplete rollbacks", 1)):
        checks.append({"expr": query(title), "eval_time": "12m", "exp_samples": [{"labels": "{}", "value": want}]})
        checks.append({"expr": query(title), "eval_time": "30m", "exp_samples": []})
    checks.append({"expr": query("Unverified undos standing"), "eval_time": "12m", "exp_samples": []})
    # what the alert compares with 0, at the same moment: the same 2
    checks.append({"expr": _alert_exprs()["ReversiCompensationFailed"], "eval_time": "12m", "exp_samples": [
        {"labels": '{namespace="shop",tool="payments.create_charge"}', "value": 2}]})
    for title in ("Failed and unverified undos standing, by tool", "Incomplete rollbacks by namespace"):
        checks.append({"expr": query(title), "eval_time": "12m", "exp_samples": []})
    checks.append({"expr": query("Operator up"), "eval_time": "12m", "exp_samples": [{"labels": "{}", "value": 0}]})
    checks.append({"expr": query("Failed and unverified undos standing now"), "eval_time": "12m", "exp_samples": [
        {"labels": '{namespace="shop",tool="payments.create_charge",state="failed"}', "value": 2}]})
    case = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{
            "name": "a scrape gap on the dashboard",
            "interval": "1m",
            "input_series": [
                # the operator's target goes down at minute 11: its series go stale, up is 0
                {"series": f"reversi_standing_undos{standing}", "values": "2x10 stale"},
                {"series": 'reversi_incomplete_rollbacks{namespace="shop",job="reversi-operator",pod="reversi-a"}',
                 "values": "1x10 stale"},
                {"series": 'up{job="reversi-operator",pod="reversi-a"}', "values": "1x10 0x30"},
            ],
            "promql_expr_test": checks,
        }],
    }
    path = tmp_path / "dashboard_gap_test.yaml"
    path.write_text(yaml.safe_dump(case))
    out = run([promtool, "test", "rules", path], check=False)
    assert out.returncode == 0 and "SUCCESS" in out.stdout + out.stderr, out.stdout + out.stderr
