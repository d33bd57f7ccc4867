"""The chart's alerts and dashboard against a real Prometheus (the pinned build) scraping the real
operator: exactly the rules ``helm template`` renders, evaluated every second (the rules
themselves unchanged), checked through Prometheus' HTTP API (docs/operations.md#alerts).

- a failed compensation fires ReversiCompensationFailed at once; it keeps firing through a
  request created cancelled, a dry run and an operator restart (missed scrapes, the counters back
  at zero), and clears once a new rollback undoes the step;
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
    """A Prometheus server on loopback evaluating ``rules`` every second and scraping, every
    second, ``target`` as job ``reversi-operator`` (or the given ``scrape_configs``)."""

    def __init__(self, workdir: Path, target: str | None, rules: dict | None,
                 scrape_configs: list[dict] | None = None):
        self.port = free_port()
        (workdir / "rules.yaml").write_text(yaml.safe_dump(rules or {"groups": []}))
        if scrape_configs is None:
            scrape_configs = [{"job_name": "reversi-operator", "honor_labels": True,
                               "static_configs": [{"targets": [target]}]}]
        (workdir / "prometheus.yaml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(workdir / "rules.yaml")],
            "scrape_configs": scrape_configs}))
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


def _seen_after_counted(prom: Prometheus, ns: str, requests: int) -> None:
    """Wait until Prometheus has scraped the count of ``requests`` finished requests in ``ns``
    (the operator counts a request after writing its end, so that scrape also carries the gauges
    as they stood after it) and has evaluated the rules after that scrape."""
    def scraped_at() -> float | None:
        found = prom.query(f'sum(reversi_rollbacks_total{{namespace="{ns}"}})')
        return float(found[0]["value"][0]) if found and float(found[0]["value"][1]) >= requests else None

    def last_sample() -> float | None:
        found = prom.query(f'timestamp(reversi_rollbacks_total{{namespace="{ns}"}})')
        return max((float(r["value"][1]) for r in found), default=None)

    wait_for(scraped_at, timeout=60, what=f"{requests} finished requests counted by Prometheus")
    seen = last_sample() or time.time()

    def evaluated_since() -> bool:
        groups = prom.api("rules")["groups"]
        return all(_epoch(g["lastEvaluation"]) > seen for g in groups)

    wait_for(evaluated_since, timeout=30, what="the rules evaluated after that scrape")


def _epoch(rfc3339: str) -> float:
    """Prometheus' RFC 3339 times (nanoseconds) as epoch seconds."""
    import datetime as dt
    import re

    return dt.datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", rfc3339).replace("Z", "+00:00")).timestamp()


def _gauge(prom: Prometheus, ns: str) -> list[float]:
    return [float(r["value"][1]) for r in prom.query(
        f'reversi_standing_undos{{namespace="{ns}",tool="payments.create_charge",state="failed"}}')]


def test_a_failed_undo_fires_until_a_rollback_undoes_it_whatever_comes_between(rv, operator, prometheus):
    """One timeline (docs/operations.md#alerts): a failed undo fires ReversiCompensationFailed;
    a request created with ``cancel: true`` and a dry run, each seen by Prometheus, change
    nothing (still firing, same ``activeAt``, the gauge at 1); an operator kill and restart
    (missed scrapes, counters at zero) neither, and the dashboard's "Failed undos standing" shows
    1 all along, never 0; once the downstream answers again (the fault was one-off), a new
    rollback undoes the step and the alert clears. The timeline is printed (pytest -s)."""
    rv.apply_manifest()
    ns = rv.ns
    start = time.monotonic()
    timeline: list[tuple[float, str]] = []

    def mark(what: str) -> None:
        timeline.append((time.monotonic() - start, what))

    charge = rv.charge("o-prom")
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-prom", "amount": 700, "customer": "cus_9"},
                         charge)])
    rv.downstream.fault("/payments/refunds", "error", times=1)  # the runner's downstream fails once
    rv.request("undo", "r", retries=1)
    assert [f["step"] for f in rv.wait_phase("undo", "Incomplete")["status"]["report"]["failed"]] == [0]
    mark("undo ended Incomplete: step 0 failed")
    alert = wait_for(lambda: _firing(prometheus, "ReversiCompensationFailed", ns), timeout=90,
                     what="ReversiCompensationFailed firing")
    mark("ReversiCompensationFailed firing")
    assert alert["labels"]["tool"] == "payments.create_charge" and alert["labels"]["severity"] == "critical"
    assert float(alert["value"]) == 1
    # the dashboard shows it: the standing panel, and the step counter born at 1 after the start
    sel = f'namespace=~"{ns}"'
    standing_panel = _dashboard_expr("Failed undos standing").replace('namespace=~"$namespace"', sel)
    assert [float(r["value"][1]) for r in prometheus.query(standing_panel)] == [1]
    by_bucket = _dashboard_expr("Steps by report bucket").replace('namespace=~"$namespace"', sel)

    def failed_steps() -> float | None:
        return {r["metric"]["bucket"]: float(r["value"][1]) for r in prometheus.query(by_bucket)}.get("failed")
    # the counter may reach Prometheus a scrape after the standing gauge that fired the alert
    assert wait_for(failed_steps, timeout=30, what="the failed step on the dashboard") == 1

    # requests that undo nothing: one created cancelled, then a dry run; each counted, nothing changes
    for counted, (name, spec) in enumerate((("cancelled", {"cancel": True}), ("dry", {"dryRun": True})), start=2):
        rv.request(name, "r", **spec)
        rv.wait_phase(name, "Incomplete", "Succeeded", "Planned", "Failed")
        mark(f"request {name} ({spec}) ended")
        _seen_after_counted(prometheus, ns, counted)
        still = _firing(prometheus, "ReversiCompensationFailed", ns)
        assert still is not None and still["activeAt"] == alert["activeAt"], (name, still)
        assert _gauge(prometheus, ns) == [1], name
        mark(f"after {name}: still firing (same activeAt), gauge 1")
    run = rv.get("runs", "r")
    assert run["status"]["standing"]["failed"] == 1 and run["status"]["standing"]["request"] == "undo"

    # an operator restart: missed scrapes and counters back at zero neither clear nor reset it;
    # the dashboard's panel shows what the alert sees through the gap, never 0
    def firing_and_shown() -> bool:
        shown = [float(r["value"][1]) for r in prometheus.query(standing_panel)]
        return _firing(prometheus, "ReversiCompensationFailed", ns) is not None and shown == [1]

    mark("operator killed")
    seen = _restart_watching(operator, firing_and_shown)
    mark("operator back for 10 s")
    assert all(seen), f"the alert stopped firing, or the panel left 1, during the restart: {seen}"
    assert _firing(prometheus, "ReversiCompensationFailed", ns)["activeAt"] == alert["activeAt"]
    # fixed (the downstream answers again): a new rollback undoes the step, and the alert clears
    rv.request("again", "r")
    assert rv.wait_phase("again", "Succeeded", "Incomplete")["status"]["report"]["compensated"] == [0]
    mark("again ended Succeeded: step 0 compensated")
    wait_for(lambda: not prometheus.alerts("ReversiCompensationFailed", ns), timeout=90,
             what="ReversiCompensationFailed cleared once the step is undone")
    mark("ReversiCompensationFailed cleared")
    assert _gauge(prometheus, ns) == [0]
    print("\ntimeline (seconds since the run was recorded):\n" + "\n".join(f"  {t:6.1f}  {what}"
                                                                           for t, what in timeline))


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


def _documented_scrape_config(namespace: str, kubeconfig: Path) -> dict:
    """The scrape config docs/operations.md#metrics gives for Prometheus without the Prometheus
    Operator, pointed at ``namespace`` of the local control plane."""
    doc = (REPO / "docs" / "operations.md").read_text()
    after = doc[doc.index("**Without the Prometheus Operator**"):]
    block = after[after.index("```yaml\n") + 8:after.index("```", after.index("```yaml\n") + 8)]
    config = yaml.safe_load(block)["scrape_configs"][0]
    for sd in config["kubernetes_sd_configs"]:
        assert sd["namespaces"]["names"] == ["reversi-system"]
        sd["namespaces"]["names"] = [namespace]
        sd["kubeconfig_file"] = str(kubeconfig)
    return config


def test_the_documented_scrape_config_gives_each_service_a_job_of_its_own(cluster, admin_api, namespace, tmp_path):
    """The chart's two Services (as helm renders them) with an endpoint each, discovered by a
    real Prometheus with the plain scrape config of docs/operations.md#metrics: the operator's
    gets job reversi-operator and the admission server's reversi-operator-admission, the jobs
    the down alerts match (their promtool cases: tests/chart/alerts_test.yaml). Nobody listens
    at the endpoints: the targets are down, their labels are what counts here."""
    from kubernetes import client

    out = subprocess.run([_tool("helm", "helm"), "template", "reversi", REPO / "charts" / "reversi", "-n", namespace,
                          "--kube-version", "1.36.0", "-s", "templates/service.yaml"],
                         capture_output=True, text=True, check=True).stdout
    services = [d for d in yaml.safe_load_all(out) if d]
    assert {s["metadata"]["name"] for s in services} == {"reversi", "reversi-operator"}
    core, discovery = client.CoreV1Api(admin_api), client.DiscoveryV1Api(admin_api)
    for i, svc in enumerate(services):
        core.create_namespaced_service(namespace, svc)
        port = next(p for p in svc["spec"]["ports"] if p["name"] == "metrics")["port"]
        discovery.create_namespaced_endpoint_slice(namespace, {
            "metadata": {"name": f"{svc['metadata']['name']}-test", "labels": {
                "kubernetes.io/service-name": svc["metadata"]["name"],
                "endpointslice.kubernetes.io/managed-by": "tests.reversi.dev"}},
            "addressType": "IPv4", "endpoints": [{"addresses": [f"192.0.2.{10 + i}"]}],
            "ports": [{"name": "metrics", "port": port, "protocol": "TCP"}]})
    prom = Prometheus(tmp_path, None, None, scrape_configs=[
        _documented_scrape_config(namespace, cluster.paths.admin_kubeconfig)])
    try:
        def jobs() -> dict[str, str] | None:
            found = prom.api("targets")["activeTargets"]
            return {t["discoveredLabels"]["__meta_kubernetes_service_name"]: t["labels"]["job"]
                    for t in found} if len(found) == 2 else None

        assert wait_for(jobs, timeout=60, what="both Services discovered") == {
            "reversi-operator": "reversi-operator", "reversi": "reversi-operator-admission"}
    finally:
        prom.stop()
