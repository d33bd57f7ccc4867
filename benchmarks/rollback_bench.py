"""Rollback benchmark: the operator's cost next to the bare work, in one run.

    python benchmarks/rollback_bench.py [--only P1,P4] [--p1-steps 20] [--p2-steps 40] ...

Against the local control plane (started when none runs, stopped again at the end), with the
operator as a process (``OperatorProcess``, admission webhooks on, the operator's default tick and
gauge settings) and the demo's downstream server: every compensator and reader is
``demo/downstream/tool.py`` run by the node agent as a Job pod, and the downstream is checked
afterwards (every charge refunded) on both sides of a ratio.

P1  rollback of ``--p1-steps`` verified steps at parallelism 1 (create -> Succeeded) vs the same
    Jobs (compensator + reader per step: the Job builder of the operator, so the same image,
    command, env, call Secret and pod) created bare in sequence: create, wait until the Job is
    Complete (a watch), next. Target <= 1.10.
P2  ``--p2-steps`` independent steps at parallelism ``--p2-parallelism`` vs the same Jobs created
    bare all at once (every step's compensator at once, each reader as soon as its compensator is
    Complete: the machine's limit). Target <= 1.15.
P3  ``build_plan`` of 10,000 steps and the 10k/1k ratio (the runs of benchmarks/plan_bench.py; no
    cluster needed). Targets <= 0.2 s and <= 11.
P4  API writes per compensated step, from kube-apiserver's ``apiserver_request_total`` (scraped with
    the admin credentials before and after one rollback of ``--p4-steps`` verified steps). The
    metric has no client label, so writes are attributed by resource: everything on reversi.dev and
    kopf.dev (minus the benchmark's own create of the request), Jobs (not jobs/status), Secrets and
    the Events the operator reported (counted from the Event objects); pods, jobs/status, leases and
    the rest are the Job controller's and the node agent's. Nothing else runs during the window.
    Target <= 6.
P5  operator RSS (VmRSS), threads and CPU (utime + stime over ``--p5-window`` seconds) with
    ``--p5-runs`` Runs in the cluster and ``--p5-requests`` active requests, each held in
    AwaitingApproval (its Run's capture needs approval, its charge waits for the capture).
    Targets: RSS <= 150 MB; threads bounded (they do not grow with the requests).
P6  ``--p6-requests`` dry-run RollbackRequests of a ``--p6-steps``-step run, one after the other,
    create -> phase Planned (seen by a watch): p50 <= 0.2 s, p99 <= 1 s.

Every figure is printed with its target and whether it is met, and the load average (the machine
may be shared). ``--json`` also prints the figures as one JSON line. Exit 1 when a check of
downstream truth or of a request's outcome fails (not when a target is missed).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from reversi.adapters import jobs as jobs_mod
from reversi.adapters.journal import step_body
from reversi_devcluster.cluster import Cluster
from reversi_devcluster.localop import (
    OperatorProcess,
    apply_crds,
    free_port,
    remove_webhook_configurations,
)
from reversi.engine.keys import compensation_key
from reversi.models.toolmanifest import Runner
from reversi.settings import OperatorSettings

from demo.downstream.client import Client as Downstream

G, V = "reversi.dev", "v1alpha1"
TOOL = ROOT / "demo" / "downstream" / "tool.py"
FINAL = ("Succeeded", "Incomplete", "Failed", "Planned")
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY")
BARE_LABEL = "reversi-bench"  # app.kubernetes.io/managed-by of the bare Jobs: the operator ignores them
ALL = ("P1", "P2", "P3", "P4", "P5", "P6")


def runner_body(downstream_url: str) -> dict:
    return {"name": "tools", "image": "registry.example/reversi-demo-tools:1",
            "command": [sys.executable, str(TOOL)],
            "env": [{"name": "DOWNSTREAM_URL", "value": downstream_url}], "deadlineSeconds": 60}


CHARGE_TOOL = {
    "name": "payments.create_charge", "effect": "write", "idempotencyKey": "$args.order_id",
    "compensation": {"tool": "payments.refund", "kind": "compensation",
                     "args": {"charge_id": "$result.id", "amount": "$args.amount"},
                     "residue": ["the charge stays visible on the customer's statement"], "runner": "tools"},
    "verification": {"tool": "payments.get_charge", "args": {"charge_id": "$result.id"},
                     "expect": {"refunded": True}, "retries": 2, "backoffMs": 200, "runner": "tools"},
}
CAPTURE_TOOL = {
    "name": "payments.capture", "effect": "write", "requires": ["payments.create_charge"],
    "compensation": {"tool": "payments.void_capture", "kind": "inverse", "args": {"capture_id": "$result.id"},
                     "requiresApproval": True, "runner": "tools"},
    "verification": {"tool": "payments.get_capture", "args": {"capture_id": "$result.id"},
                     "expect": {"status": "voided"}, "runner": "tools"},
}


def manifest(downstream_url: str) -> dict:
    return {"apiVersion": f"{G}/{V}", "kind": "ToolManifest", "metadata": {"name": "bench"},
            "spec": {"runners": [runner_body(downstream_url)], "tools": [CHARGE_TOOL, CAPTURE_TOOL]}}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


# ---------------------------------------------------------------------------------------- watches


class Watcher:
    """A watch on one kind in one namespace, in a thread: records when each object first satisfies
    ``done(obj) -> bool`` (monotonic seconds) and lets callers wait for a name."""

    def __init__(self, list_fn: Callable[..., Any], namespace: str, done: Callable[[Any], bool], **kwargs: Any):
        self.list_fn, self.namespace, self.done, self.kwargs = list_fn, namespace, done, kwargs
        self.at: dict[str, float] = {}
        self.last: dict[str, Any] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._ready = threading.Event()
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError(f"the watch on {namespace} did not start")

    @staticmethod
    def _name(obj: Any) -> str:
        return obj["metadata"]["name"] if isinstance(obj, dict) else obj.metadata.name

    def _see(self, obj: Any) -> None:
        name = self._name(obj)
        with self._cond:
            self.last[name] = obj
            if name not in self.at and self.done(obj):
                self.at[name] = time.monotonic()
                self._cond.notify_all()

    def _loop(self) -> None:
        rv = None
        while not self._stop:
            try:
                if rv is None:
                    listing = self.list_fn(self.namespace, **self.kwargs)
                    items = listing["items"] if isinstance(listing, dict) else listing.items
                    for obj in items:
                        self._see(obj)
                    rv = listing["metadata"]["resourceVersion"] if isinstance(listing, dict) \
                        else listing.metadata.resource_version
                    self._ready.set()
                self._watch = watch.Watch()
                for event in self._watch.stream(self.list_fn, self.namespace, resource_version=rv,
                                                timeout_seconds=60, **self.kwargs):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        rv = None
                        break
                    rv = obj["metadata"]["resourceVersion"] if isinstance(obj, dict) else obj.metadata.resource_version
                    if event["type"] != "DELETED":
                        self._see(obj)
                    if self._stop:
                        return
            except ApiException as err:
                if err.status == 410:
                    rv = None
                elif not self._stop:
                    time.sleep(0.2)
            except Exception:  # noqa: BLE001 - a dropped connection: watch again from rv
                if not self._stop:
                    time.sleep(0.2)

    def wait(self, name: str, timeout: float = 300) -> float:
        """Monotonic time at which ``name`` was first done; raises ``TimeoutError``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while name not in self.at:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{name} not done after {timeout:.0f}s; last seen: {str(self.last.get(name))[:600]}")
                self._cond.wait(min(left, 1.0))
            return self.at[name]

    def stop(self) -> None:
        self._stop = True
        if self._watch:
            self._watch.stop()


def job_done(job: Any) -> bool:
    return any(c.type in ("Complete", "Failed") and c.status == "True" for c in (job.status.conditions or []))


def job_ok(job: Any) -> bool:
    return any(c.type == "Complete" and c.status == "True" for c in (job.status.conditions or []))


def request_final(obj: dict) -> bool:
    return (obj.get("status") or {}).get("phase") in FINAL


# ---------------------------------------------------------------------------------------- the bench


class Bench:
    def __init__(self, api: client.ApiClient, downstream_url: str):
        self.api = api
        self.core, self.batch = client.CoreV1Api(api), client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.ds_url = downstream_url
        self.ds = Downstream(downstream_url)
        self.runner = Runner.model_validate(runner_body(downstream_url))
        self.namespaces: list[str] = []
        self.problems: list[str] = []

    # -- setup helpers
    def namespace(self, tag: str) -> str:
        ns = f"rb-{tag}-{uuid.uuid4().hex[:5]}"
        self.core.create_namespace({"metadata": {"name": ns, "labels": {"reversi.dev/bench": "rollback"}}})
        self.namespaces.append(ns)
        self.custom.create_namespaced_custom_object(G, V, ns, "toolmanifests", manifest(self.ds_url))
        return ns

    def charges(self, tag: str, n: int) -> list[dict]:
        return [self.ds.create_charge(f"{tag}-{i}", 700, "cus_9") for i in range(n)]

    def run(self, ns: str, name: str, charges: list[dict], extra: list[dict] | None = None) -> dict:
        run = self.custom.create_namespaced_custom_object(G, V, ns, "runs", {
            "apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": name},
            "spec": {"mode": "enforce", "scope": {"actor": "bench-agent"}, "manifestRef": {"name": "bench"}}})
        steps = [{"index": i, "tool": CHARGE_TOOL["name"], "outcome": "succeeded", "snapshot": CHARGE_TOOL,
                  "args": {"order_id": c["order_id"], "amount": c["amount"], "customer": "cus_9"},
                  "result": {"id": c["id"]}} for i, c in enumerate(charges)]
        for step in steps + [dict(s, index=len(steps) + k) for k, s in enumerate(extra or [])]:
            self._create_step(ns, name, step)
        return run

    def _create_step(self, ns: str, run: str, step: dict) -> None:
        for attempt in range(100):
            try:
                self.custom.create_namespaced_custom_object(G, V, ns, "runsteps", step_body(ns, run, step))
                return
            except ApiException as err:  # the webhook admits a step once the watch has its predecessor
                if err.status == 409:
                    return
                if err.status not in (400, 403, 422, 429) or attempt == 99:
                    raise
                time.sleep(0.05)

    def request(self, ns: str, name: str, run: str, **spec: Any) -> None:
        self.custom.create_namespaced_custom_object(G, V, ns, "rollbackrequests", {
            "apiVersion": f"{G}/{V}", "kind": "RollbackRequest", "metadata": {"name": name},
            "spec": {"runRef": {"name": run}, **spec}})

    def request_watcher(self, ns: str, done: Callable[[dict], bool] = request_final) -> Watcher:
        def lister(namespace: str, **kw: Any) -> Any:
            return self.custom.list_namespaced_custom_object(G, V, namespace, "rollbackrequests", **kw)
        return Watcher(lister, ns, done)

    def check_refunded(self, what: str, charges: list[dict]) -> None:
        bad = [c["id"] for c in charges if not self.ds.get_charge(c["id"])["refunded"]]
        if bad:
            self.problems.append(f"{what}: {len(bad)} of {len(charges)} charges not refunded downstream, e.g. {bad[:3]}")

    def check_request(self, what: str, obj: dict, steps: int) -> None:
        status = obj.get("status") or {}
        compensated = (status.get("report") or {}).get("compensated") or []
        if status.get("phase") != "Succeeded" or len(compensated) != steps:
            self.problems.append(f"{what}: phase {status.get('phase')}, {len(compensated)} of {steps} compensated: "
                                 f"{json.dumps(status.get('report'))[:400]}")

    def operator_jobs(self, ns: str) -> int:
        return len(self.batch.list_namespaced_job(ns, label_selector=f"{jobs_mod.LABEL_MANAGED_BY}=reversi").items)

    # -- the operator side of P1/P2
    def operator_rollback(self, tag: str, steps: int, parallelism: int) -> tuple[float, list[dict], str]:
        ns = self.namespace(tag)
        charges = self.charges(f"{ns}-op", steps)
        self.run(ns, "r", charges)
        requests = self.request_watcher(ns)
        try:
            started = time.monotonic()
            self.request(ns, "undo", "r", parallelism=parallelism)
            ended = requests.wait("undo", timeout=600)
            self.check_request(f"{tag} operator", requests.last["undo"], steps)
        finally:
            requests.stop()
        self.check_refunded(f"{tag} operator", charges)
        return ended - started, charges, ns

    # -- the bare side of P1/P2
    def bare_jobs(self, ns: str, owner: jobs_mod.Owner, run_uid: str, step: int, charge: dict) -> list[tuple[dict, dict]]:
        """(secret, job) of the compensator and of the reader of one step, as the operator builds them."""
        args = {"charge_id": charge["id"], "amount": charge["amount"]}
        key = compensation_key(run_uid, step, "payments.refund")
        built = [
            jobs_mod.build_job(owner=owner, run_name="bare", run_uid=run_uid, step=step, attempt=1, runner=self.runner,
                               call=jobs_mod.compensator_call(run_uid, step, "payments.refund",
                                                              "payments.create_charge", args, key),
                               idempotency_key=key),
            jobs_mod.build_job(owner=owner, run_name="bare", run_uid=run_uid, step=step, attempt=1, runner=self.runner,
                               call=jobs_mod.reader_call("payments.get_charge", {"charge_id": charge["id"]}),
                               role="reader", read=1),
        ]
        for secret, job in built:
            for meta in (secret["metadata"], job["metadata"], job["spec"]["template"]["metadata"]):
                meta["labels"] = dict(meta["labels"], **{jobs_mod.LABEL_MANAGED_BY: BARE_LABEL})
                meta.pop("annotations", None)
        return built

    def bare_setup(self, tag: str, steps: int) -> tuple[str, list[dict], list[list[tuple[dict, dict]]], Watcher]:
        ns = self.namespace(tag)
        charges = self.charges(f"{ns}-bare", steps)
        cm = self.core.create_namespaced_config_map(ns, {"metadata": {"name": "bare-owner"}})
        owner = jobs_mod.Owner(ns, "bare-owner", cm.metadata.uid, api_version="v1", kind="ConfigMap")
        run_uid = str(uuid.uuid4())
        plan = [self.bare_jobs(ns, owner, run_uid, i, c) for i, c in enumerate(charges)]
        jobs = Watcher(self.batch.list_namespaced_job, ns, job_done,
                       label_selector=f"{jobs_mod.LABEL_MANAGED_BY}={BARE_LABEL}")
        return ns, charges, plan, jobs

    def bare_one(self, ns: str, secret: dict, job: dict, jobs: Watcher) -> None:
        self.core.create_namespaced_secret(ns, secret)
        self.batch.create_namespaced_job(ns, job)
        jobs.wait(job["metadata"]["name"], timeout=300)
        if not job_ok(jobs.last[job["metadata"]["name"]]):
            self.problems.append(f"bare Job {ns}/{job['metadata']['name']} failed")

    def bare_sequence(self, tag: str, steps: int) -> float:
        ns, charges, plan, jobs = self.bare_setup(tag, steps)
        try:
            started = time.monotonic()
            for pair in plan:
                for secret, job in pair:
                    self.bare_one(ns, secret, job, jobs)
            elapsed = time.monotonic() - started
        finally:
            jobs.stop()
        self.check_refunded(f"{tag} bare", charges)
        return elapsed

    def bare_all_at_once(self, tag: str, steps: int) -> float:
        ns, charges, plan, jobs = self.bare_setup(tag, steps)

        def chain(pair: list[tuple[dict, dict]]) -> None:
            for secret, job in pair:
                self.bare_one(ns, secret, job, jobs)

        try:
            started = time.monotonic()
            with ThreadPoolExecutor(steps) as pool:
                list(pool.map(chain, plan))
            elapsed = time.monotonic() - started
        finally:
            jobs.stop()
        self.check_refunded(f"{tag} bare", charges)
        return elapsed


# ---------------------------------------------------------------------------------------- P1, P2


def ratio_bench(bench: Bench, key: str, steps: int, parallelism: int, rounds: int, target: float) -> dict:
    bare_fn = bench.bare_sequence if parallelism == 1 else bench.bare_all_at_once
    bare_how = "bare in sequence" if parallelism == 1 else "bare all at once"
    bare_t, op_t = [], []
    for r in range(rounds):  # alternate, so a change in the machine's load hits both sides
        bare_t.append(bare_fn(f"{key.lower()}b{r}", steps))
        seconds, _, ns = bench.operator_rollback(f"{key.lower()}o{r}", steps, parallelism)
        op_t.append(seconds)
        made = bench.operator_jobs(ns)
        if made != 2 * steps:
            print(f"  note: the operator ran {made} Jobs for {steps} steps (the bare side ran {2 * steps})")
        print(f"  round {r + 1}: bare {bare_t[-1]:.2f} s, operator {op_t[-1]:.2f} s ({load()})", file=sys.stderr)
    ratio = sum(op_t) / sum(bare_t)
    print(f"{key}  rollback of {steps} verified steps at parallelism {parallelism}: operator "
          f"{statistics.median(op_t):.2f} s vs the same {2 * steps} Jobs {bare_how} {statistics.median(bare_t):.2f} s "
          f"(median of {rounds}) = {ratio:.3f}x  [target <= {target:.2f}: {verdict(ratio <= target)}]")
    return {"steps": steps, "parallelism": parallelism, "operator_s": op_t, "bare_s": bare_t,
            "ratio": round(ratio, 3), "target": target, "met": ratio <= target}


# ---------------------------------------------------------------------------------------- P3


def p3(steps: int, repeat: int) -> dict:
    import plan_bench  # benchmarks/plan_bench.py: the same runs
    from reversi.engine import build_plan
    from reversi.models import RunSpec

    times = {}
    for n in (steps // 10, steps):
        spec = RunSpec.model_validate(plan_bench.make_run(n))
        gc.collect()
        times[n] = plan_bench.median_seconds(lambda spec=spec: build_plan(spec, None, run_id="bench-uid"), repeat)
    ratio = times[steps] / times[steps // 10]
    ok_t, ok_r = times[steps] <= 0.2, ratio <= 11
    print(f"P3  build_plan of {steps} steps: {times[steps] * 1000:.0f} ms (median of {repeat}) "
          f"[target <= 200 ms: {verdict(ok_t)}]; {steps // 10} steps {times[steps // 10] * 1000:.1f} ms; "
          f"ratio {ratio:.1f} [target <= 11: {verdict(ok_r)}]")
    return {"steps": steps, "plan_ms": round(times[steps] * 1000, 1), "plan_ms_small": round(times[steps // 10] * 1000, 1),
            "ratio": round(ratio, 2), "met": ok_t and ok_r}


# ---------------------------------------------------------------------------------------- P4

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def api_writes(api: client.ApiClient) -> dict[tuple[str, str, str, str], float]:
    """kube-apiserver's write counters (``apiserver_request_total``), keyed by (verb, group,
    resource, subresource), summed over codes and scopes."""
    resp = api.rest_client.pool_manager.request("GET", api.configuration.host + "/metrics", preload_content=True)
    if resp.status != 200:
        raise RuntimeError(f"GET /metrics of the API server answered {resp.status}")
    counts: dict[tuple[str, str, str, str], float] = {}
    for line in resp.data.decode().splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, _, value = line.rpartition("} ")
        labels = dict(_LABEL.findall(labels_text))
        if labels.get("verb") not in WRITE_VERBS:
            continue
        k = (labels["verb"], labels.get("group", ""), labels.get("resource", ""), labels.get("subresource", ""))
        counts[k] = counts.get(k, 0.0) + float(value)
    return counts


def p4(bench: Bench, steps: int, target: float) -> dict:
    ns = bench.namespace("p4")
    charges = bench.charges(f"{ns}-op", steps)
    bench.run(ns, "r", charges)
    requests = bench.request_watcher(ns)
    time.sleep(2.0)  # let the operator's step watch and the webhook writes of the setup finish before the window
    before = api_writes(bench.api)
    try:
        bench.request(ns, "undo", "r", parallelism=1)
        requests.wait("undo", timeout=600)
        bench.check_request("P4", requests.last["undo"], steps)
        # the operator's last writes (lock release, run status) may follow the final phase: wait until
        # its counters stop moving for three scrapes in a row
        last, still = None, 0
        deadline = time.monotonic() + 60
        while still < 3 and time.monotonic() < deadline:
            time.sleep(1.0)
            now = api_writes(bench.api)
            ours = sum(v for k, v in now.items() if k[1] in (G, "kopf.dev") or (k[2] in ("jobs", "secrets") and not k[3]))
            still = still + 1 if ours == last else 0
            last = ours
        after = now
    finally:
        requests.stop()
    bench.check_refunded("P4", charges)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    delta = {k: v for k, v in delta.items() if v}
    events = bench.core.list_namespaced_event(ns).items
    op_events = sum(1 for e in events if e.reporting_component == "reversi.dev/operator"
                    or (e.source and e.source.component in ("kopf", "reversi-operator")))
    rows, operator, others = [], 0.0, 0.0
    for (verb, group, resource, sub), n in sorted(delta.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3], kv[0][0])):
        mine = n if (group in (G, "kopf.dev") or (resource in ("jobs", "secrets") and not sub)) else 0.0
        if group == G and resource == "rollbackrequests" and not sub and verb == "POST":
            mine -= 1  # the benchmark's own create of the request
        if resource == "events" and not sub:
            mine = 0.0
        operator += mine
        others += n - mine
        rows.append(f"      {verb:<7} {(group or 'core') + '/' + resource + ('/' + sub if sub else ''):<40} {n:>5.0f}")
    event_writes = sum(n for (verb, g, r, s), n in delta.items() if r == "events" and verb == "POST")
    operator += op_events
    others -= op_events
    per_step = operator / steps
    print(f"P4  API writes per compensated step: {per_step:.2f} ({operator:.0f} operator writes for {steps} verified "
          f"steps) [target <= {target:.0f}: {verdict(per_step <= target)}]")
    print(f"      kube-apiserver write counters during the window (all clients; {others:.0f} not the operator's: "
          f"Job controller, node agent, leases; {op_events:.0f} of {event_writes:.0f} Event creates are the operator's):")
    print("\n".join(rows))
    return {"steps": steps, "operator_writes": operator, "per_step": round(per_step, 2), "met": per_step <= target,
            "delta": {"/".join(k): v for k, v in delta.items()}}


# ---------------------------------------------------------------------------------------- P5


def proc_figures(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
    hwm_kb = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime (fields 14, 15)
    return {"rss_mb": rss_kb / 1024, "hwm_mb": hwm_kb / 1024, "threads": threads, "cpu_s": cpu}


def sample(pid: int, seconds: float) -> dict:
    """RSS max and CPU share over ``seconds``, sampled every second."""
    first = proc_figures(pid)
    started = time.monotonic()
    peak_rss, peak_threads = first["rss_mb"], first["threads"]
    while time.monotonic() - started < seconds:
        time.sleep(1.0)
        now = proc_figures(pid)
        peak_rss, peak_threads = max(peak_rss, now["rss_mb"]), max(peak_threads, now["threads"])
    wall = time.monotonic() - started
    return {**now, "rss_max_mb": peak_rss, "threads_max": peak_threads,
            "cpu_pct": 100 * (now["cpu_s"] - first["cpu_s"]) / wall, "window_s": wall}


def pool_bound() -> tuple[int, str]:
    for name, field in OperatorSettings.model_fields.items():
        if "worker" in name and isinstance(field.default, int):
            return field.default, f"the pool setting {name}"
    return 16, "no pool setting yet: 16 assumed"


def p5(bench: Bench, op: OperatorProcess, runs: int, requests: int, window: float, idle: dict) -> dict:
    pid = op.proc.pid
    ns = bench.namespace("p5")
    before = proc_figures(pid)
    capture_step = {"tool": CAPTURE_TOOL["name"], "outcome": "succeeded", "snapshot": CAPTURE_TOOL,
                    "args": {"charge_id": "ch_x"}, "result": {"id": "cap_x"}}

    def make(i: int) -> None:
        charge = {"order_id": f"p5-{i}", "amount": 700, "id": f"ch_p5_{i}"}
        bench.run(ns, f"run-{i:05d}", [charge], extra=[capture_step] if i < requests else None)

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(make, range(runs)))
    print(f"  {runs} Runs ({runs + requests} RunSteps) created in {time.monotonic() - started:.0f} s ({load()})",
          file=sys.stderr)
    with_runs = sample(pid, window)
    watcher = bench.request_watcher(ns, lambda o: (o.get("status") or {}).get("phase") in ("AwaitingApproval",) + FINAL)
    try:
        started = time.monotonic()
        for i in range(requests):
            bench.request(ns, f"undo-{i:05d}", f"run-{i:05d}")
        for i in range(requests):
            watcher.wait(f"undo-{i:05d}", timeout=900)
        held = time.monotonic() - started
        wrong = [n for n, o in watcher.last.items() if (o.get("status") or {}).get("phase") != "AwaitingApproval"]
        if wrong:
            bench.problems.append(f"P5: {len(wrong)} requests not AwaitingApproval, e.g. {wrong[:3]}")
        active = sample(pid, window)
    finally:
        watcher.stop()
    bound, why = pool_bound()
    grew = active["threads_max"] - with_runs["threads"]
    ok_rss = active["rss_max_mb"] <= 150 and with_runs["rss_max_mb"] <= 150
    ok_threads = grew <= bound
    print(f"P5  operator with {runs} Runs and {requests} active requests (AwaitingApproval; all held after {held:.0f} s): "
          f"RSS {active['rss_mb']:.0f} MB (max {active['rss_max_mb']:.0f} MB in {window:.0f} s) "
          f"[target <= 150 MB: {verdict(ok_rss)}]; threads {active['threads']} (+{grew} for the requests; "
          f"bound {bound}, {why}) [bounded: {verdict(ok_threads)}]; CPU {active['cpu_pct']:.1f}% of a core")
    print(f"      idle (operator just started): RSS {idle['rss_mb']:.0f} MB, {idle['threads']} threads; "
          f"before P5: RSS {before['rss_mb']:.0f} MB, {before['threads']} threads; with {runs} Runs and no request: "
          f"RSS {with_runs['rss_mb']:.0f} MB (max {with_runs['rss_max_mb']:.0f}), {with_runs['threads']} threads, "
          f"CPU {with_runs['cpu_pct']:.1f}%; peak RSS of the process (VmHWM) {active['hwm_mb']:.0f} MB")
    return {"runs": runs, "requests": requests, "idle": idle, "before": before, "with_runs": with_runs,
            "active": active, "threads_added": grew, "met": ok_rss and ok_threads}


# ---------------------------------------------------------------------------------------- P6


def p6(bench: Bench, steps: int, count: int) -> dict:
    ns = bench.namespace("p6")
    bench.run(ns, "r", [{"order_id": f"p6-{i}", "amount": 700, "id": f"ch_p6_{i}"} for i in range(steps)])
    watcher = bench.request_watcher(ns)
    times = []
    try:
        for i in range(count + 1):  # the first one warms the operator's watch of the run: reported apart
            name = f"plan-{i:04d}"
            started = time.monotonic()
            bench.request(ns, name, "r", dryRun=True)
            times.append(watcher.wait(name, timeout=120) - started)
            phase = (watcher.last[name].get("status") or {}).get("phase")
            if phase != "Planned":
                bench.problems.append(f"P6: {name} ended {phase}")
                break
    finally:
        watcher.stop()
    first, rest = times[0], times[1:]
    p50, p99 = statistics.median(rest), percentile(rest, 0.99)
    ok = p50 <= 0.2 and p99 <= 1.0
    print(f"P6  dry-run RollbackRequest of a {steps}-step run, create -> Planned: p50 {p50 * 1000:.0f} ms, "
          f"p99 {p99 * 1000:.0f} ms over {len(rest)} (first {first * 1000:.0f} ms, not counted) "
          f"[target p50 <= 200 ms, p99 <= 1000 ms: {verdict(ok)}]")
    return {"steps": steps, "count": len(rest), "p50_ms": round(p50 * 1000, 1), "p99_ms": round(p99 * 1000, 1),
            "first_ms": round(first * 1000, 1), "met": ok}


# ---------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(ALL), help="comma-separated subset of P1..P6 (default: all)")
    p.add_argument("--p1-steps", type=int, default=20)
    p.add_argument("--p2-steps", type=int, default=40)
    p.add_argument("--p2-parallelism", type=int, default=8)
    p.add_argument("--rounds", type=int, default=1, help="P1/P2: bare/operator rounds, alternated (default 1)")
    p.add_argument("--p3-steps", type=int, default=10_000)
    p.add_argument("--p3-repeat", type=int, default=7)
    p.add_argument("--p4-steps", type=int, default=10)
    p.add_argument("--p5-runs", type=int, default=2000)
    p.add_argument("--p5-requests", type=int, default=200)
    p.add_argument("--p5-window", type=float, default=30.0, help="P5: seconds of each RSS/CPU sample (default 30)")
    p.add_argument("--p6-steps", type=int, default=20)
    p.add_argument("--p6-requests", type=int, default=50)
    p.add_argument("--tick", type=float, default=OperatorSettings.model_fields["tick_seconds"].default,
                   help="the operator's REVERSI_TICK_SECONDS (default: the operator's own default)")
    p.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    args = p.parse_args(argv)
    only = [s.strip().upper() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in ALL]
    if unknown:
        p.error(f"--only: unknown {', '.join(unknown)}; choose from {', '.join(ALL)}")
    if args.p5_requests > args.p5_runs:
        p.error("--p5-requests must not exceed --p5-runs (one request per Run)")
    figures: dict[str, Any] = {"load_start": os.getloadavg()}
    print(f"rollback benchmark: {', '.join(only)} ({load()}, {os.cpu_count()} CPUs)")
    if "P3" in only:
        figures["P3"] = p3(args.p3_steps, args.p3_repeat)
    cluster_parts = [s for s in only if s != "P3"]
    rc = 0
    if cluster_parts:
        rc = cluster_benchmarks(args, cluster_parts, figures)
    figures["load_end"] = os.getloadavg()
    missed = [k for k in ALL if k in figures and not figures[k]["met"]]
    print(f"targets met: {len([k for k in ALL if k in figures]) - len(missed)} of {len([k for k in ALL if k in figures])}"
          + (f" (missed: {', '.join(missed)})" if missed else "") + f"; {load()} at the end")
    if args.json:
        print(json.dumps(figures, default=str))
    return rc


def cluster_benchmarks(args: argparse.Namespace, parts: list[str], figures: dict) -> int:
    cluster = Cluster()
    started_cluster = not cluster.is_running()
    if started_cluster:
        print("starting the local control plane", file=sys.stderr)
        cluster.up()
    api = config.new_client_from_config(config_file=str(cluster.paths.admin_kubeconfig))
    api.configuration.connection_pool_maxsize = 64
    api.rest_client.pool_manager.connection_pool_kw["maxsize"] = 64
    apply_crds(api)
    os.environ.setdefault("REVERSI_GAUGE_REFRESH_SECONDS",
                          str(OperatorSettings.model_fields["gauge_refresh_seconds"].default))
    op = OperatorProcess(cluster.paths.admin_kubeconfig, cluster.paths.logs / "rollback-bench-operator.log",
                         metrics_port=free_port(), webhook_port=free_port(), tick_seconds=args.tick)
    state = Path(cluster.paths.logs) / f"rollback-bench-downstream-{uuid.uuid4().hex[:6]}.json"
    ds_proc = subprocess.Popen([sys.executable, str(ROOT / "demo" / "downstream" / "server.py"), "--port", "0",
                                "--state", str(state), "--quiet"], stdout=subprocess.PIPE, text=True)
    bench = None
    try:
        line = ds_proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            raise RuntimeError(f"the downstream server did not start: {line!r}")
        bench = Bench(api, line.split()[-1])
        op.start()
        idle = proc_figures(op.proc.pid)
        print(f"operator pid {op.proc.pid}: tick {args.tick} s, gauge refresh "
              f"{os.environ['REVERSI_GAUGE_REFRESH_SECONDS']} s, webhooks on; RSS {idle['rss_mb']:.0f} MB, "
              f"{idle['threads']} threads", file=sys.stderr)
        if "P6" in parts:
            figures["P6"] = p6(bench, args.p6_steps, args.p6_requests)
        if "P4" in parts:
            figures["P4"] = p4(bench, args.p4_steps, 6)
        if "P1" in parts:
            figures["P1"] = ratio_bench(bench, "P1", args.p1_steps, 1, args.rounds, 1.10)
        if "P2" in parts:
            figures["P2"] = ratio_bench(bench, "P2", args.p2_steps, args.p2_parallelism, args.rounds, 1.15)
        if "P5" in parts:
            figures["P5"] = p5(bench, op, args.p5_runs, args.p5_requests, args.p5_window, idle)
    finally:
        op.stop()
        remove_webhook_configurations(api)
        ds_proc.terminate()
        ds_proc.wait(timeout=10)
        state.unlink(missing_ok=True)
        for ns in bench.namespaces if bench else []:
            try:
                client.CoreV1Api(api).delete_namespace(ns, propagation_policy="Background")
            except ApiException:
                pass
        if started_cluster:
            cluster.down()
    if bench and bench.problems:
        print("checks failed:\n  " + "\n  ".join(bench.problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
