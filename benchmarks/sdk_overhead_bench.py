"""The SDK's own work per recorded call, apart from the API server's.

    python benchmarks/sdk_overhead_bench.py [--calls 400] [--rounds 3]

One agent, one thread, on the local control plane with the recorded call's admission policies
registered (no webhook is on a recorded call's path). Two rows of the same calls, alternating,
``--rounds`` times:

- **bare**: the two writes of a recorded call made by hand with the official client: the
  ``intended`` RunStep create (with ``spec.runAtOpen``, as the SDK sends it) and the outcome's JSON
  patch;
- **sdk**: ``Recorder.step`` on a Run with a pinned manifest (the production path: the same two
  writes, plus the SDK's checks, serialization and retry policy).

Printed for each row: the client process's CPU per call (``time.process_time``: the SDK's own work
shows here, the API server's does not) and the wall time per call, each as the median over the
rounds; then the SDK's ratio to bare. The claim is the CPU ratio: the wall time also holds the
API server's work, the same for both rows.

Uses a running local control plane when there is one (``reversi-devcluster up``), else starts one
and stops it at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from kubernetes import client, config  # noqa: E402

from reversi.adapters import webhooks  # noqa: E402
from reversi.adapters.journal import step_body  # noqa: E402
from reversi.sdk import Recorder  # noqa: E402
from reversi_devcluster.cluster import Cluster  # noqa: E402
from reversi_devcluster.localop import apply_crds  # noqa: E402

G, V = "reversi.dev", "v1alpha1"
TOOL = "orders.note"
MANIFEST = {"apiVersion": f"{G}/{V}", "kind": "ToolManifest", "metadata": {"name": "bench"}, "spec": {
    "runners": [{"name": "cli", "image": "registry.example/tools:1", "command": ["true"]}],
    "tools": [{"name": TOOL, "effect": "write",
               "compensation": {"tool": "orders.unnote", "kind": "inverse", "args": {"id": "$result.id"},
                                "runner": "cli"}}]}}


class Bench:
    """A namespace with the manifest, and a Run per row and round, each pinned to the manifest as
    admission would pin it at open."""

    def __init__(self, api: client.ApiClient):
        self.api, self.custom, self.core = api, client.CustomObjectsApi(api), client.CoreV1Api(api)
        self.ns = f"sdk-bench-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": self.ns}})
        self.custom.create_namespaced_custom_object(G, V, self.ns, "toolmanifests", MANIFEST)
        self.manifest = self.custom.get_namespaced_custom_object(G, V, self.ns, "toolmanifests", "bench")

    def run(self, name: str) -> dict:
        pin = {"revision": self.manifest["metadata"]["generation"], "tools": self.manifest["spec"]["tools"]}
        return self.custom.create_namespaced_custom_object(G, V, self.ns, "runs", {
            "apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": name},
            "spec": {"mode": "enforce", "scope": {"actor": "bench"}, "manifestRef": {"name": "bench"},
                     "pinnedManifest": pin}})

    def bare(self, name: str, calls: int) -> tuple[float, float]:
        """CPU and wall seconds per call of the two writes by hand."""
        run = self.run(name)
        at_open = {"uid": run["metadata"]["uid"], "mode": "enforce", "recovery": "bestEffort",
                   "manifestRevision": self.manifest["metadata"]["generation"], "scope": {"actor": "bench"}}
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(calls):
            body = step_body(self.ns, name, {"index": i, "tool": TOOL, "outcome": "intended",
                                             "args": {"order_id": f"o-{i}", "amount": i}, "runAtOpen": at_open})
            self.custom.create_namespaced_custom_object(G, V, self.ns, "runsteps", body)
            self.custom.patch_namespaced_custom_object(G, V, self.ns, "runsteps", body["metadata"]["name"], [
                {"op": "test", "path": "/spec/outcome", "value": "intended"},
                {"op": "replace", "path": "/spec/outcome", "value": "succeeded"},
                {"op": "add", "path": "/spec/result", "value": {"id": f"ord-{i}"}}],
                _content_type="application/json-patch+json")
        return (time.process_time() - cpu) / calls, (time.perf_counter() - wall) / calls

    def sdk(self, name: str, calls: int) -> tuple[float, float]:
        """CPU and wall seconds per call of ``Recorder.step``."""
        self.run(name)
        rec = Recorder.attach(self.ns, name, api=self.api)
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(calls):
            with rec.step(TOOL, {"order_id": f"o-{i}", "amount": i}) as step:
                step.result = {"id": f"ord-{i}"}
        return (time.process_time() - cpu) / calls, (time.perf_counter() - wall) / calls

    def close(self) -> None:
        self.core.delete_namespace(self.ns)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=400, help="calls per row and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the two rows, alternating")
    args = parser.parse_args(argv)
    cluster = Cluster()
    started = not cluster.is_running()
    if started:
        cluster.up()
    try:
        api = config.new_client_from_config(config_file=str(cluster.paths.admin_kubeconfig))
        apply_crds(api)
        webhooks.register_policies(api)
        bench = Bench(api)
        print(f"the SDK's own work per recorded call: {args.calls} calls per row, {args.rounds} rounds "
              f"(load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs)")
        rows: dict[str, list[tuple[float, float]]] = {"bare": [], "sdk": []}
        try:
            for r in range(args.rounds):
                rows["bare"].append(bench.bare(f"bare-{r}", args.calls))
                rows["sdk"].append(bench.sdk(f"sdk-{r}", args.calls))
        finally:
            bench.close()
        median = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v)) for k, v in rows.items()}
        for row, (cpu, wall) in median.items():
            print(f"  {row:<5} client CPU {cpu * 1e3:6.2f} ms/call   wall {wall * 1e3:6.2f} ms/call")
        print(f"  the SDK against the bare writes: CPU {median['sdk'][0] / median['bare'][0]:.2f}x, "
              f"wall {median['sdk'][1] / median['bare'][1]:.2f}x "
              f"(load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end)")
    finally:
        if started:
            cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
