"""Failover of the reconciling operator (docs/operations.md#leader-election): two operator
processes on the local control plane, a 20-step rollback at parallelism 2 whose refunds each take
2 s to answer, and the active operator SIGKILLed (a crash) or SIGTERMed (a rolling update) mid-way.

Printed per round: the seconds from the signal to the standby's next compensator Job (the Job's
ADDED event on a watch of the namespace, made by the standby: its field manager in the Job's
managedFields), and whether every charge was refunded exactly once (the downstream server's own
record of the refunds it made, replays left out).

The election is the coordination.k8s.io Lease (15 s lease, 10 s renew deadline, 2 s retry).
Targets: SIGKILL <= 15 s (a crash: the standby waits out the Lease), SIGTERM <= 3 s (a rolling
update: the leaving replica releases the Lease). The kopf peering it replaced is gone from the
tree, and with it the baseline this benchmark once measured it against: the targets are absolute.

    python benchmarks/failover_bench.py --rounds 1 [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from kubernetes import client, config, watch  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402
from reversi_devcluster.cluster import Cluster  # noqa: E402
from reversi_devcluster.localop import OperatorProcess, apply_crds, free_port, remove_webhook_configurations  # noqa: E402

from rollback_bench import Bench  # noqa: E402

TARGETS = {"kill": 15.0, "term": 3.0}


def job_adds(api: client.ApiClient, ns: str, seen: list[tuple[float, str, list[str]]], stop: threading.Event) -> None:
    """Record (local time, name, field managers) of every compensator Job ADDED in ``ns``."""
    batch = client.BatchV1Api(api)
    while not stop.is_set():
        w = watch.Watch()
        try:
            for ev in w.stream(batch.list_namespaced_job, ns, label_selector="reversi.dev/role=compensator",
                               timeout_seconds=5, _request_timeout=10):
                if ev["type"] == "ADDED":
                    job = ev["object"]
                    managers = [f.manager for f in job.metadata.managed_fields or []]
                    seen.append((time.time(), job.metadata.name, managers))
                if stop.is_set():
                    break
        except Exception:  # noqa: BLE001 - a cut watch is opened again
            time.sleep(0.1)


def refunds_since(ds_url: str, since: float) -> list[dict]:
    with urllib.request.urlopen(ds_url + "/_state", timeout=10) as resp:
        calls = json.load(resp).get("calls", [])
    return [c for c in calls if c["path"].startswith("/payments/refunds") and not c["replayed"] and c["at"] >= since]


class Pair:
    """Two operator processes of one election mode; ``active`` is the one at work."""

    def __init__(self, mode: str, cluster: Cluster, env: dict[str, str], webhook_port: int):
        self.mode, self.env = mode, env
        logs = cluster.paths.logs
        self.procs = {n: OperatorProcess(cluster.paths.admin_kubeconfig, logs / f"failover-bench-{mode}-{n}.log",
                                         webhook_port=webhook_port if n == "a" else 0, tick_seconds=1.0,
                                         identity=f"bench-{mode}-{n}-{uuid.uuid4().hex[:4]}")
                      for n in "ab"}

    def start(self, name: str) -> None:
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            self.procs[name].start(timeout=60)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.stop()


def lease_holder(api: client.ApiClient, ns: str) -> str | None:
    try:
        return client.CoordinationV1Api(api).read_namespaced_lease("reversi-operator", ns).spec.holder_identity
    except ApiException:
        return None


def wait(cond: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def one_round(bench: Bench, pair: Pair, active: str, how: str, steps: int, parallelism: int,
              lease_ns: str | None) -> dict:
    """One rollback with a failover of ``active`` by ``how`` (kill or term); the figures."""
    api = bench.api
    ns = bench.namespace(f"fo-{pair.mode}-{how}")
    since = time.time()
    charges = bench.charges(f"{ns}-c", steps)
    bench.run(ns, "r", charges)
    bench.ds.request("POST", "/_faults", {"path_prefix": "/payments/refunds", "mode": "timeout", "times": steps,
                                         "delay_s": 2})
    seen: list[tuple[float, str, list[str]]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=job_adds, args=(api, ns, seen, stop), daemon=True)
    watcher.start()
    bench.request(ns, "undo", "r", parallelism=parallelism)
    wait(lambda: len(seen) >= 6, 120, "6 compensator Jobs before the failover")
    standby = "b" if active == "a" else "a"
    victim = pair.procs[active]
    os.killpg(victim.proc.pid, signal.SIGKILL if how == "kill" else signal.SIGTERM)
    signalled = time.time()
    victim.proc.wait(timeout=30)
    mark = f"reversi-operator-{pair.procs[standby].identity}"

    def next_job() -> tuple | None:
        after = [s for s in seen if s[0] > signalled and (pair.mode != "lease" or mark in s[2])]
        return after[0] if after else None

    first = wait(next_job, 240, "the standby's next Job", interval=0.02)
    took = first[0] - signalled

    def final() -> dict | None:
        obj = bench.custom.get_namespaced_custom_object("reversi.dev", "v1alpha1", ns, "rollbackrequests", "undo")
        return obj if (obj.get("status") or {}).get("phase") in ("Succeeded", "Incomplete", "Failed") else None

    done = wait(final, 300, "the rollback to end", interval=0.5)
    stop.set()
    refunds = refunds_since(bench.ds_url, since)  # rounds run one after another: these are this round's
    keys = [call.get("key") for call in refunds]
    once = len(refunds) == steps and len(set(keys)) == steps
    refunded = sum(1 for c in charges if bench.ds.get_charge(c["id"])["refunded"])
    pair.start(active)  # back as the standby for the next round
    new_active = standby
    if lease_ns is not None:
        wait(lambda: lease_holder(api, lease_ns) is not None, 30, "a Lease holder")
    return {"mode": pair.mode, "signal": "SIGKILL" if how == "kill" else "SIGTERM", "seconds": round(took, 2),
            "target": TARGETS[how] if pair.mode == "lease" else None, "phase": done["status"]["phase"],
            "refunded": f"{refunded}/{steps}", "refunds_made": len(refunds), "each_once": once,
            "next_active": new_active}


def run_mode(mode: str, bench: Bench, cluster: Cluster, args: argparse.Namespace) -> list[dict]:
    lease_ns = bench.namespace("fo-lease")
    env = {"REVERSI_LEASE_NAMESPACE": lease_ns}
    pair = Pair(mode, cluster, env, free_port())
    results = []
    try:
        pair.start("a")
        wait(lambda: lease_holder(bench.api, lease_ns) == pair.procs["a"].identity, 60, "a to hold the Lease")
        pair.start("b")
        time.sleep(3)
        active = "a"
        for how in ("kill", "term"):
            for _ in range(args.rounds):
                holder = lease_holder(bench.api, lease_ns)
                active = next(n for n, p in pair.procs.items() if p.identity == holder)
                figures = one_round(bench, pair, active, how, args.steps, args.parallelism, lease_ns)
                active = figures.pop("next_active")
                print(json.dumps(figures), flush=True)
                results.append(figures)
                time.sleep(3)
    finally:
        pair.stop()
        remove_webhook_configurations(bench.api)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="failovers of each kind per election (default 1)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args(argv)
    cluster = Cluster()
    started = not cluster.is_running()
    if started:
        cluster.up()
    api = config.new_client_from_config(config_file=str(cluster.paths.admin_kubeconfig))
    apply_crds(api)
    state = Path(cluster.paths.logs) / f"failover-bench-downstream-{uuid.uuid4().hex[:6]}.json"
    ds_proc = subprocess.Popen([sys.executable, str(ROOT / "demo" / "downstream" / "server.py"), "--port", "0",
                                "--state", str(state), "--quiet"], stdout=subprocess.PIPE, text=True)
    results: list[dict] = []
    bench = None
    try:
        line = ds_proc.stdout.readline().strip() if ds_proc.stdout else ""
        bench = Bench(api, line.split()[-1])
        results += run_mode("lease", bench, cluster, args)
    finally:
        ds_proc.terminate()
        ds_proc.wait(timeout=10)
        state.unlink(missing_ok=True)
        for ns in bench.namespaces if bench else []:
            try:
                client.CoreV1Api(api).delete_namespace(ns, propagation_policy="Background")
            except ApiException:
                pass
        if started:
            cluster.down()
    print(f"\n{'election':<9} {'signal':<8} {'to next Job (s)':>16} {'target':>7}  refunded  each once")
    ok = True
    for r in results:
        target = f"<= {r['target']:g}" if r["target"] else "-"
        met = r["target"] is None or r["seconds"] <= r["target"]
        ok = ok and met and r["each_once"] and r["phase"] == "Succeeded"
        print(f"{r['mode']:<9} {r['signal']:<8} {r['seconds']:>16.2f} {target:>7}  {r['refunded']:>8}  "
              f"{'yes' if r['each_once'] else 'NO'} ({r['refunds_made']} refunds, {r['phase']})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
