"""``kubectl reversi plan`` of a long run on the local control plane: wall time of the command.

    python benchmarks/plugin_plan_bench.py [--steps 10000] [--repeat 3] [--threads 16]

Records a run of ``--steps`` steps (Run ``bench-<steps>`` in namespace ``reversi-bench``) by
creating its RunSteps directly with the admin client, from a thread pool, unless the run
already has them all; then runs ``kubectl-reversi plan RUN`` (and ``-o json``) ``--repeat`` times
as a subprocess and prints the median wall time (Python start-up included); then starts the
operator and times ``--dry-run-requests`` dry-run RollbackRequests from create to ``Planned``.
Target: a 10,000-step run plans in at most 3 s, both ways.

Every odd step is a charge (a write with a compensation and a read-back), every even step a
read; each RunStep carries its tool's manifest entry as its snapshot, as the SDK records it.
With the operator's webhooks installed a step is admitted only after its predecessor exists,
so a refused create is retried (the pool keeps going in index order): recording is fastest with
no operator running (10,000 steps in about 40-70 s). Uses the cluster of
``REVERSI_CLUSTER_DIR`` (``reversi-devcluster up``) and leaves the namespace for the next run
(``--clean`` deletes it first).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from reversi.adapters.journal import step_body  # noqa: E402
from reversi_devcluster.cluster import Cluster  # noqa: E402
from reversi_devcluster.localop import apply_crds  # noqa: E402

G, V = "reversi.dev", "v1alpha1"
NS = "reversi-bench"
TOOLS = [
    {"name": "payments.get_customer", "effect": "read"},
    {"name": "payments.create_charge", "effect": "write",
     "compensation": {"tool": "payments.refund", "kind": "compensation",
                      "args": {"charge_id": "$result.id", "amount": "$args.amount"},
                      "residue": ["the charge stays visible on the customer's statement"], "runner": "tools"},
     "verification": {"tool": "payments.get_charge", "args": {"charge_id": "$result.id"},
                      "expect": {"refunded": True}, "retries": 2, "backoffMs": 200, "runner": "tools"}},
]
MANIFEST = {"apiVersion": f"{G}/{V}", "kind": "ToolManifest", "metadata": {"name": "bench"},
            "spec": {"runners": [{"name": "tools", "image": "registry.example/tools:1", "command": ["tool"]}],
                     "tools": TOOLS}}


def step_spec(i: int) -> dict:
    tool = TOOLS[i % 2]
    args = {"order_id": f"o-{i}", "amount": i, "customer": "cus_9"} if i % 2 else {"id": "cus_9"}
    return {"index": i, "tool": tool["name"], "args": args, "result": {"id": f"ch_{i}"}, "outcome": "succeeded",
            "snapshot": tool}


def count_steps(custom: client.CustomObjectsApi, run: str) -> int:
    n, token = 0, None
    while True:
        page = custom.list_namespaced_custom_object(G, V, NS, "runsteps", label_selector=f"reversi.dev/run={run}",
                                                    limit=500, **({"_continue": token} if token else {}))
        n += len(page["items"])
        token = page["metadata"].get("continue")
        if not token:
            return n


def record(api: client.ApiClient, run: str, steps: int, threads: int) -> float:
    """Create the namespace, manifest, Run and its RunSteps (what is missing). Returns seconds."""
    started = time.monotonic()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    try:
        core.create_namespace({"metadata": {"name": NS}})
    except ApiException as err:
        if err.status != 409:
            raise
    for plural, body in (("toolmanifests", MANIFEST),
                         ("runs", {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": run},
                                   "spec": {"mode": "enforce", "scope": {"actor": "bench"},
                                            "manifestRef": {"name": "bench"}}})):
        try:
            custom.create_namespaced_custom_object(G, V, NS, plural, body)
        except ApiException as err:
            if err.status != 409:
                raise
    if count_steps(custom, run) >= steps:
        return 0.0

    def create(i: int) -> None:
        body = step_body(NS, run, step_spec(i))
        for attempt in range(200):
            try:
                custom.create_namespaced_custom_object(G, V, NS, "runsteps", body)
                return
            except ApiException as err:
                if err.status == 409:
                    return
                if err.status >= 500 or attempt == 199 or err.status not in (400, 403, 422, 429):
                    raise
                time.sleep(0.05)  # the webhook waits for the previous step

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, range(steps)))
    return time.monotonic() - started


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return time.monotonic() - started, proc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--clean", action="store_true", help="delete the namespace first")
    p.add_argument("--dry-run-requests", type=int, default=3,
                   help="then time this many dry-run RollbackRequests, created to Planned, with the operator running")
    args = p.parse_args()
    cluster = Cluster()
    if not cluster.is_running():
        print("the local control plane is not running: reversi-devcluster up", file=sys.stderr)
        return 2
    kubeconfig = str(cluster.paths.admin_kubeconfig)
    api = config.new_client_from_config(config_file=kubeconfig)
    api.configuration.connection_pool_maxsize = args.threads
    api.rest_client.pool_manager.connection_pool_kw["maxsize"] = args.threads
    apply_crds(api)
    if args.clean:
        core = client.CoreV1Api(api)
        try:
            core.delete_namespace(NS)
            while True:
                core.read_namespace(NS)
                time.sleep(1)
        except ApiException:
            pass
    run = f"bench-{args.steps}"
    seconds = record(api, run, args.steps, args.threads)
    print(f"run {NS}/{run}: {args.steps} RunSteps"
          + (f" recorded in {seconds:.1f}s" if seconds else " (already there)"))
    base = [sys.executable, "-m", "reversi.entrypoints.plugin", "--kubeconfig", kubeconfig, "-n", NS, "plan", run]
    for variant in ([], ["-o", "json"]):
        times = []
        for _ in range(args.repeat):
            elapsed, proc = timed(base + variant)
            if proc.returncode not in (0, 2):
                print(proc.stderr, file=sys.stderr)
                return 1
            times.append(elapsed)
        lines = proc.stdout.count("\n")
        print(f"kubectl reversi plan {run} -n {NS} {' '.join(variant)}".rstrip()
              + f": median {statistics.median(times):.2f}s of {args.repeat} "
              f"({', '.join(f'{t:.2f}' for t in times)}); {lines} lines of output")
    if args.dry_run_requests:
        dry_runs(api, cluster, run, args.dry_run_requests)
    return 0


def dry_runs(api: client.ApiClient, cluster: Cluster, run: str, count: int) -> None:
    """Start the operator, then create ``count`` + 1 dry-run RollbackRequests one after the other
    and time each from create to phase Planned. The first is reported on its own: it includes the
    operator's start and its first LIST of the run's RunSteps (the run's informer then keeps them)."""
    from reversi_devcluster.localop import OperatorProcess, free_port

    custom = client.CustomObjectsApi(api)
    op = OperatorProcess(cluster.paths.admin_kubeconfig, cluster.paths.logs / "bench-operator.log",
                         metrics_port=free_port())
    op.start()
    try:
        times = []
        first = 0.0
        for i in range(count + 1):  # the first one also waits for the operator and lists the run
            name = f"plan-{int(time.time() * 1000)}-{i}"
            started = time.monotonic()
            custom.create_namespaced_custom_object(G, V, NS, "rollbackrequests", {
                "apiVersion": f"{G}/{V}", "kind": "RollbackRequest", "metadata": {"name": name},
                "spec": {"runRef": {"name": run}, "dryRun": True}})
            while True:
                obj = custom.get_namespaced_custom_object(G, V, NS, "rollbackrequests", name)
                phase = (obj.get("status") or {}).get("phase")
                if phase in ("Planned", "Failed"):
                    break
                time.sleep(0.02)
            if phase != "Planned":
                print(f"dry run {name} ended {phase}: {obj['status']}", file=sys.stderr)
                return
            if i:
                times.append(time.monotonic() - started)
            else:
                first = time.monotonic() - started
        print(f"dry-run RollbackRequest of {run} (create to Planned): first {first:.2f}s (operator just started, "
              f"lists the run's RunSteps), then median {statistics.median(times):.2f}s of {count} "
              f"({', '.join(f'{t:.2f}' for t in times)})")
    finally:
        op.stop()


if __name__ == "__main__":
    sys.exit(main())
