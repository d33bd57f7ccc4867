"""What recording costs an agent's write to a Kubernetes object (the built-in Kubernetes family).

    python benchmarks/kube_record_bench.py [--writes 200]

One agent, one thread, on the local control plane with the recorded call's admission policies
registered. The same write, a JSON merge patch of one ConfigMap's data, made ``--writes`` times
in each of two rows, alternating one write of each:

- **plain**: the patch with the official client, unrecorded;
- **recorded**: ``rec.kube.patch`` on a Run with a pinned manifest of the family (the object read
  for its prior state, the ``intended`` RunStep, the patch conditioned on the prior's
  resourceVersion, the outcome with the post state).

Prints each row's median and p90 wall time per write, the recorded row's ratio to the plain one
(target: at most 2x, docs/concepts.md#built-in-kubernetes-compensation), and the machine's load.
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
from reversi.engine import kube  # noqa: E402
from reversi.sdk import Recorder  # noqa: E402
from reversi_devcluster.cluster import Cluster  # noqa: E402
from reversi_devcluster.localop import apply_crds  # noqa: E402

G, V = "reversi.dev", "v1alpha1"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def bench(api: client.ApiClient, writes: int) -> dict[str, list[float]]:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    ns = f"kube-bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        custom.create_namespaced_custom_object(G, V, ns, "toolmanifests", {
            "apiVersion": f"{G}/{V}", "kind": "ToolManifest", "metadata": {"name": "kube"},
            "spec": {"runners": [kube.runner_entry("registry.example/reversi:1", "kube-undo")],
                     "tools": kube.manifest_tools()}})
        for name in ("plain", "recorded"):
            core.create_namespaced_config_map(ns, {"metadata": {"name": name}, "data": {"n": "0"}})
        rec = Recorder.open(ns, "bench", manifest="kube", api=api)
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "namespace": ns, "name": "recorded"}
        rec.kube.patch(ref, {"data": {"n": "warm-up"}})
        core.patch_namespaced_config_map("plain", ns, {"data": {"n": "warm-up"}})
        times: dict[str, list[float]] = {"plain": [], "recorded": []}
        for i in range(writes):
            t = time.perf_counter()
            core.patch_namespaced_config_map("plain", ns, {"data": {"n": str(i)}})
            times["plain"].append(time.perf_counter() - t)
            t = time.perf_counter()
            rec.kube.patch(ref, {"data": {"n": str(i)}})
            times["recorded"].append(time.perf_counter() - t)
        return times
    finally:
        core.delete_namespace(ns)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=200, help="writes per row")
    args = parser.parse_args(argv)
    cluster = Cluster()
    started = not cluster.is_running()
    if started:
        cluster.up()
    try:
        api = config.new_client_from_config(config_file=str(cluster.paths.admin_kubeconfig))
        apply_crds(api)
        webhooks.register_policies(api)
        print(f"an agent's write to a ConfigMap, recorded against plain: {args.writes} writes per row "
              f"(load average {_load()}, {os.cpu_count()} CPUs)")
        times = bench(api, args.writes)
        median = {row: statistics.median(t) for row, t in times.items()}
        for row, t in times.items():
            p90 = statistics.quantiles(t, n=10)[-1]
            print(f"  {row:<8} median {median[row] * 1e3:6.2f} ms   p90 {p90 * 1e3:6.2f} ms")
        print(f"  recorded / plain, median: {median['recorded'] / median['plain']:.2f}x (target <= 2x; "
              f"load average {_load()} at the end)")
    finally:
        if started:
            cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
