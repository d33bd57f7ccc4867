"""Recording benchmark: the cost of recording a call at step 100 and at step N of one run.

    python benchmarks/record_bench.py [--steps 5000] [--window 100] [--keep-cluster]

Records one run of ``--steps`` calls through the SDK (``Recorder.call`` on a write tool with a
forward idempotency key, compensation and verification: every check admission makes), against
the local control plane with the operator and its admission webhooks, one agent, nothing else
running. Each call is timed end to end: the ``intended`` record before the call and the outcome
after it (the call itself returns at once). Printed: the median and p99 per call over the
``--window`` calls from step 100 and over the last ``--window`` calls, and their ratio (the
journal is O(1) per call when the ratio stays near 1; the run's own length is the only thing
that differs between the two windows). Then the run is checked: every step recorded, in order,
with its outcome.

Uses a running local control plane when there is one (``reversi-devcluster up``), else starts
one and stops it at the end. Exit 1 when the records are wrong.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from kubernetes import client, config  # noqa: E402

from reversi.adapters.journal import list_objects  # noqa: E402
from reversi_devcluster.cluster import Cluster  # noqa: E402
from reversi_devcluster.localop import (  # noqa: E402
    OperatorProcess, apply_crds, free_port, remove_webhook_configurations)
from reversi.sdk import Recorder  # noqa: E402

G, V = "reversi.dev", "v1alpha1"
TOOL = "orders.create"
MANIFEST = {
    "apiVersion": f"{G}/{V}", "kind": "ToolManifest", "metadata": {"name": "bench"},
    "spec": {
        "runners": [{"name": "cli", "image": "registry.example/tools:1", "command": ["true"]}],
        "tools": [{
            "name": TOOL, "effect": "write", "idempotencyKey": "$args.order_id",
            "compensation": {"tool": "orders.cancel", "kind": "inverse", "args": {"id": "$result.id"}, "runner": "cli"},
            "verification": {"tool": "orders.get", "args": {"id": "$result.id"}, "expect": {"status": "canceled"},
                             "runner": "cli"},
        }],
    },
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def record(api: client.ApiClient, namespace: str, steps: int, progress_every: int) -> list[float]:
    """Record ``steps`` calls in one run; returns the seconds each call took (intended + outcome)."""
    rec = Recorder.open(namespace, "bench-run", manifest="bench", api=api,
                        scope={"actor": "bench-agent", "environment": "bench"})
    times: list[float] = []
    started = time.perf_counter()
    for i in range(steps):
        t0 = time.perf_counter()
        rec.call(TOOL, {"order_id": f"o-{i}", "amount": i}, lambda a: {"id": f"ord-{a['order_id']}"})
        times.append(time.perf_counter() - t0)
        if progress_every and (i + 1) % progress_every == 0:
            recent = statistics.median(times[-progress_every:]) * 1000
            print(f"  {i + 1:>6} steps recorded, median of the last {progress_every}: {recent:.1f} ms/call, "
                  f"{time.perf_counter() - started:.0f} s in all", file=sys.stderr, flush=True)
    return times


def check(api: client.ApiClient, namespace: str, steps: int) -> list[str]:
    """What is wrong with the recorded run (empty: every step is there, in order, succeeded)."""
    objs = list_objects(client.CustomObjectsApi(api), namespace, "bench-run")
    problems = []
    if [o["spec"]["index"] for o in objs] != list(range(steps)):
        problems.append(f"indices are not 0..{steps - 1}: {len(objs)} RunSteps")
    bad = [o["spec"]["index"] for o in objs if o["spec"].get("outcome") != "succeeded" or not o["spec"].get("snapshot")]
    if bad:
        problems.append(f"{len(bad)} steps without outcome succeeded or without a snapshot, e.g. {bad[:5]}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5000, help="steps in the run (default 5000)")
    parser.add_argument("--window", type=int, default=100, help="calls in each measured window (default 100)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line too")
    args = parser.parse_args(argv)
    if args.steps < 100 + 2 * args.window:
        parser.error(f"--steps must be at least {100 + 2 * args.window} (two windows after step 100)")
    cluster = Cluster()
    started_cluster = not cluster.is_running()
    if started_cluster:
        cluster.up()
    api = config.new_client_from_config(config_file=str(cluster.paths.admin_kubeconfig))
    apply_crds(api)
    op = OperatorProcess(cluster.paths.admin_kubeconfig, cluster.paths.logs / "bench-operator.log",
                         metrics_port=free_port(), webhook_port=free_port())
    namespace = f"record-bench-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api)
    try:
        op.start()
        core.create_namespace({"metadata": {"name": namespace}})
        client.CustomObjectsApi(api).create_namespaced_custom_object(G, V, namespace, "toolmanifests", MANIFEST)
        time.sleep(1.0)  # the operator's manifest index sees the new manifest
        print(f"recording {args.steps} calls in one run (namespace {namespace})", file=sys.stderr)
        times = record(api, namespace, args.steps, progress_every=max(100, args.steps // 10))
        problems = check(api, namespace, args.steps)
    finally:
        op.stop()
        remove_webhook_configurations(api)
        try:
            core.delete_namespace(namespace)
        except client.ApiException:
            pass
        if started_cluster:
            cluster.down()
    early = times[100:100 + args.window]
    late = times[-args.window:]
    figures = {
        "steps": args.steps,
        "median_ms_at_100": round(statistics.median(early) * 1000, 2),
        "p99_ms_at_100": round(percentile(early, 0.99) * 1000, 2),
        f"median_ms_at_{args.steps}": round(statistics.median(late) * 1000, 2),
        f"p99_ms_at_{args.steps}": round(percentile(late, 0.99) * 1000, 2),
        "median_ms_all": round(statistics.median(times) * 1000, 2),
        "ratio": round(statistics.median(late) / statistics.median(early), 3),
        "total_s": round(sum(times), 1),
    }
    print(f"recording time per call (intended + outcome), one run of {args.steps} steps:")
    print(f"  steps 100..{100 + args.window - 1}:   median {figures['median_ms_at_100']:.1f} ms, "
          f"p99 {figures['p99_ms_at_100']:.1f} ms")
    print(f"  steps {args.steps - args.window}..{args.steps - 1}: "
          f"median {figures[f'median_ms_at_{args.steps}']:.1f} ms, "
          f"p99 {figures[f'p99_ms_at_{args.steps}']:.1f} ms")
    print(f"  ratio (late/early median): {figures['ratio']:.2f}; all calls: median {figures['median_ms_all']:.1f} ms, "
          f"total {figures['total_s']:.0f} s")
    if args.json:
        print(json.dumps(figures))
    if problems:
        print("the recorded run is wrong: " + "; ".join(problems), file=sys.stderr)
        return 1
    print(f"  check: all {args.steps} steps recorded in order, succeeded, with snapshots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
