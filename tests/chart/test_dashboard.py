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
    for registry in (Metrics().registry, AdmissionMetrics().registry):
        for metric in registry.collect():
            exposed |= {metric.name, f"{metric.name}_total", f"{metric.name}_bucket"}
    for title, expr in _queries():
        names = set(re.findall(r"\b(reversi_[a-z_]+|up)\b", expr))
        assert names and names <= exposed, f"{title}: unknown metrics {names - exposed}"
