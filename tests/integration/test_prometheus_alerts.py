"""The chart's alerts and dashboard against a real Prometheus (the pinned build) scraping the real
operator: exactly the rules ``helm template`` renders, evaluated every second (the rules
themselves unchanged), checked through Prometheus' HTTP API (docs/operations.md#alerts).

- a failed compensation fires ReversiCompensationFailed at once; it keeps firing through an
  operator restart (missed scrapes, the counters back at zero) and clears once a new rollback
  undoes the step;
- an irreversible step makes ReversiRollbackIncomplete pending; a restart does not start its
  15 minutes over (same ``activeAt``); acknowledging the Run clears it;
- the dashboard's queries return the real counts, including a counter series born at 1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from reversi_devcluster.build import binary
from reversi_devcluster.localop import free_port
from tests.helpers import wait_for

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "charts" / "reversi" / "files" / "dashboards" / "reversi.json"


def _tool(component: str, name: str) -> Path:
    path = binary(component, name)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{name} is not built ({path}); run `reversi-devcluster build --all` (make test does)")
    return path


def _chart_rules() -> dict:
    """The rules of the chart's PrometheusRule, exactly as ``helm template`` renders them."""
    out = subprocess.run([_tool("helm", "helm"), "template", "rv", REPO / "charts" / "reversi", "--kube-version",
                          "1.36.0", "--set", "metrics.prometheusRule.enabled=true",
                          "-s", "templates/prometheusrule.yaml"], capture_output=True, text=True, check=True).stdout
    rule = yaml.safe_load(out)
    return {"groups": rule["spec"]["groups"]}


class Prometheus:
    """A Prometheus server on loopback scraping ``target`` as job ``reversi-operator`` every
    second and evaluating ``rules`` every second."""

    def __init__(self, workdir: Path, target: str, rules: dict):
        self.port = free_port()
        (workdir / "rules.yaml").write_text(yaml.safe_dump(rules))
        (workdir / "prometheus.yaml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(workdir / "rules.yaml")],
            "scrape_configs": [{"job_name": "reversi-operator", "honor_labels": True,
                                "static_configs": [{"targets": [target]}]}]}))
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [_tool("prometheus", "prometheus"), f"--config.file={workdir / 'prometheus.yaml'}",
             f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(lambda: self._ready(), timeout=60, what="Prometheus ready")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def api(self, path: str, **params: str) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return body["data"]

    def alerts(self, name: str, namespace: str) -> list[dict]:
        return [a for a in self.api("alerts")["alerts"]
                if a["labels"].get("alertname") == name and a["labels"].get("namespace") == namespace]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture
def prometheus(operator, tmp_path):
    prom = Prometheus(tmp_path, f"127.0.0.1:{operator.metrics_port}", _chart_rules())
    yield prom
    prom.stop()


def _firing(prom: Prometheus, name: str, ns: str) -> dict | None:
    return next((a for a in prom.alerts(name, ns) if a["state"] == "firing"), None)


def _sampled(check, seconds: float) -> list[bool]:
    """What ``check`` (a bool) said, called every half second for ``seconds``."""
    seen = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        seen.append(check())
        time.sleep(0.5)
    return seen


def _restart_watching(operator, check) -> list[bool]:
    """Kill the operator, start it again, and keep calling ``check`` (a bool) every half second
    from the kill until 10 s after it is back: what ``check`` said each time."""
    seen = [check()]
    operator.kill()
    seen += _sampled(check, 4)  # a few missed scrapes (the target is down)
    operator.start()
    return seen + _sampled(check, 10)


def _dashboard_expr(title: str, rate_interval: str = "5m") -> str:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    expr = next(p["targets"][0]["expr"] for p in panels if p["title"] == title)
    return expr.replace("$__rate_interval", rate_interval).replace("$__range", "1h")


def test_a_failed_undo_fires_until_undone_through_an_operator_restart(rv, operator, prometheus):
    rv.apply_manifest()
    ns = rv.ns
    charge = rv.charge("o-prom")
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-prom", "amount": 700, "customer": "cus_9"},
                         charge)])
    rv.downstream.fault("/payments/refunds", "error", times=1)
    rv.request("undo", "r", retries=1)
    assert [f["step"] for f in rv.wait_phase("undo", "Incomplete")["status"]["report"]["failed"]] == [0]
    alert = wait_for(lambda: _firing(prometheus, "ReversiCompensationFailed", ns), timeout=90,
                     what="ReversiCompensationFailed firing")
    assert alert["labels"]["tool"] == "payments.create_charge" and alert["labels"]["severity"] == "critical"
    assert float(alert["value"]) == 1
    # the dashboard shows it: the standing gauge, and the step counter born at 1 after the start
    sel = f'namespace=~"{ns}"'
    standing = prometheus.query(_dashboard_expr("Failed undos standing").replace('namespace=~"$namespace"', sel))
    assert [float(r["value"][1]) for r in standing] == [1]
    by_bucket = _dashboard_expr("Steps by report bucket").replace('namespace=~"$namespace"', sel)

    def failed_steps() -> float | None:
        return {r["metric"]["bucket"]: float(r["value"][1]) for r in prometheus.query(by_bucket)}.get("failed")
    # the counter may reach Prometheus a scrape after the standing gauge that fired the alert
    assert wait_for(failed_steps, timeout=30, what="the failed step on the dashboard") == 1
    # an operator restart: missed scrapes and counters back at zero neither clear nor reset it
    seen = _restart_watching(operator, lambda: _firing(prometheus, "ReversiCompensationFailed", ns) is not None)
    assert all(seen), f"the alert stopped firing during the restart: {seen}"
    assert _firing(prometheus, "ReversiCompensationFailed", ns)["activeAt"] == alert["activeAt"]
    # fixed: a new rollback undoes the step, and the alert clears (no waiting out a window)
    rv.request("again", "r")
    assert rv.wait_phase("again", "Succeeded", "Incomplete")["status"]["report"]["compensated"] == [0]
    wait_for(lambda: not prometheus.alerts("ReversiCompensationFailed", ns), timeout=90,
             what="ReversiCompensationFailed cleared once the step is undone")


def test_an_incomplete_rollback_stays_pending_through_a_restart_and_clears_when_acknowledged(
        rv, operator, prometheus):
    rv.apply_manifest()
    ns = rv.ns
    rv.run("r", [rv.step(0, "email.send", {"to": "c@example.com"}, {"id": "m-1"})])
    rv.request("undo", "r")
    rv.wait_phase("undo", "Incomplete")
    pending = wait_for(lambda: next(iter(prometheus.alerts("ReversiRollbackIncomplete", ns)), None), timeout=90,
                       what="ReversiRollbackIncomplete pending")
    assert pending["state"] == "pending" and pending["labels"]["severity"] == "warning"
    # its 15 minutes (the rule's own `for`) are not started over by a restart
    seen = _restart_watching(operator, lambda: bool(prometheus.alerts("ReversiRollbackIncomplete", ns)))
    assert all(seen), f"the pending alert went away during the restart: {seen}"
    assert prometheus.alerts("ReversiRollbackIncomplete", ns)[0]["activeAt"] == pending["activeAt"]
    rv.patch("runs", "r", {"spec": {"acknowledgement": {"note": "apologised to the customer"}}})
    wait_for(lambda: not prometheus.alerts("ReversiRollbackIncomplete", ns), timeout=90,
             what="ReversiRollbackIncomplete cleared by the acknowledgement")
    assert prometheus.query(f'reversi_incomplete_rollbacks{{namespace="{ns}"}}')[0]["value"][1] == "0"


def _paused_watching(operator, check, seconds: float = 4) -> list[bool]:
    """SIGSTOP the operator for ``seconds`` (its /metrics stops answering: missed scrapes with no
    restart, no counter reset), then SIGCONT it; what ``check`` said every half second meanwhile
    and for 5 s after."""
    seen = [check()]
    os.kill(operator.proc.pid, signal.SIGSTOP)
    try:
        seen += _sampled(check, seconds)
    finally:
        os.kill(operator.proc.pid, signal.SIGCONT)
    return seen + _sampled(check, 5)


def test_failed_and_unverified_undos_fire_through_missed_scrapes_until_the_run_is_acknowledged(
        rv, operator, prometheus):
    """One rollback leaves a failed undo (critical) and an unverified one (warning): both alerts
    fire at once, the dashboard's standing panels and table count them, a paused operator (missed
    scrapes, no restart) neither clears nor resets them, and acknowledging the Run's residue
    clears both, with no new rollback."""
    from tests.integration.test_metrics import UNCHECKED

    rv.apply_manifest(extra_tools=[UNCHECKED])
    ns = rv.ns
    a, b = rv.charge("o-prom-a"), rv.charge("o-prom-b")
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-prom-a", "amount": 700, "customer": "cus_9"}, a),
                 rv.step(1, "payments.create_charge_unchecked", {"order_id": "o-prom-b"}, b)])
    # newest first: step 1's refund goes through (unverified: the request requires a check and the
    # tool declares none), step 0's fails
    rv.downstream.post("/_faults", {"path_prefix": "/payments/refunds", "mode": "error", "skip": 1, "times": 1})
    rv.request("undo", "r", retries=1, requireVerification=True)
    report = rv.wait_phase("undo", "Incomplete")["status"]["report"]
    assert [f["step"] for f in report["failed"]] == [0] and report["unverified"] == [1]
    failed = wait_for(lambda: _firing(prometheus, "ReversiCompensationFailed", ns), timeout=90,
                      what="ReversiCompensationFailed firing")
    unverified = wait_for(lambda: _firing(prometheus, "ReversiUnverifiedUndo", ns), timeout=90,
                          what="ReversiUnverifiedUndo firing")
    assert unverified["labels"]["tool"] == "payments.create_charge_unchecked"
    assert unverified["labels"]["severity"] == "warning" and failed["labels"]["severity"] == "critical"
    sel = f'namespace=~"{ns}"'
    for title, want in (("Failed undos standing", [1]), ("Unverified undos standing", [1]),
                        ("Incomplete rollbacks", [1])):
        got = [float(r["value"][1]) for r in prometheus.query(_dashboard_expr(title).replace(
            'namespace=~"$namespace"', sel))]
        assert got == want, (title, got)
    table = prometheus.query(_dashboard_expr("Failed and unverified undos standing now").replace(
        'namespace=~"$namespace"', sel))
    assert {(r["metric"]["tool"], r["metric"]["state"]) for r in table} == {
        ("payments.create_charge", "failed"), ("payments.create_charge_unchecked", "unverified")}
    verdicts = prometheus.query(_dashboard_expr("Rollbacks by verdict").replace('namespace=~"$namespace"', sel))
    assert {r["metric"]["verdict"]: float(r["value"][1]) for r in verdicts}.get("incomplete") == 1
    # missed scrapes with no restart: the operator paused, its target down, then back
    both = lambda: (_firing(prometheus, "ReversiCompensationFailed", ns) is not None  # noqa: E731
                    and _firing(prometheus, "ReversiUnverifiedUndo", ns) is not None)
    seen = _paused_watching(operator, both)
    assert all(seen), f"an alert stopped firing while scrapes were missed: {seen}"
    assert _firing(prometheus, "ReversiCompensationFailed", ns)["activeAt"] == failed["activeAt"]
    # a person accepts the residue: both clear, and the standing gauges fall to 0
    rv.patch("runs", "r", {"spec": {"acknowledgement": {"note": "refunded by hand in the payments console"}}})
    wait_for(lambda: not prometheus.alerts("ReversiCompensationFailed", ns)
             and not prometheus.alerts("ReversiUnverifiedUndo", ns), timeout=90,
             what="both alerts cleared by the acknowledgement")
    standing = prometheus.query(f'reversi_standing_undos{{namespace="{ns}"}}')
    assert standing and all(r["value"][1] == "0" for r in standing), standing
