"""Benchmark the local control plane: warm start time and cold build time.

    python benchmarks/devcluster_bench.py            # warm start (binaries already built), 3 runs
    python benchmarks/devcluster_bench.py --cold     # also a cold build of kubernetes + etcd
    python benchmarks/devcluster_bench.py --cold-all # also a cold build of all make build builds, images too
    python benchmarks/devcluster_bench.py --nodes    # the node agent next to the real node: up, Jobs, down
    python benchmarks/devcluster_bench.py --job-batch 1s,100ms --jobs 20   # Jobs on the node agent, per batch period

Warm start: from ``up`` to a Ready node (and the default service account), with binaries in
the cache, on a cluster in a temporary folder and its own ports, so a running cluster is left
alone. Cold build: kubernetes and etcd built into an empty cache with an empty Go build cache
(``GOCACHE``); the Go module download cache is kept, so network time is not measured.
``--nodes``: for each kind of node, a cluster in a temporary folder on its own ports: ``up`` (to a
Ready node; the real node also imports the images into its fresh containerd), then Jobs created one
after the other, each timed from its create to its ``Complete`` condition (a Python one-liner: the
demo image's ``python`` on the real node, this machine's on the node agent), then ``down``. The real
node needs a machine that can run it and no other real node running. ``--job-batch``: the same Jobs
on the node agent, in a cluster per Job controller batching period (``job_sync_batch_period``:
upstream's 1s against the local control plane's 100ms), with each median's ratio to the first.
Prints one line per figure, and the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reversi_devcluster.cluster import Cluster, ClusterSettings


def warm_start(runs: int) -> list[float]:
    times = []
    with tempfile.TemporaryDirectory(prefix="reversi-bench-") as tmp:
        settings = ClusterSettings(cluster_dir=Path(tmp), apiserver_port=36443, etcd_port=32379,
                                   etcd_peer_port=32380, kubelet_port=40250)
        cluster = Cluster(settings)
        for _ in range(runs):
            started = time.monotonic()
            cluster.up(log=lambda *_: None)
            times.append(time.monotonic() - started)
            cluster.down(quiet=True)
    return times


def cold_build(everything: bool = False) -> list[tuple[str, float]]:
    """Seconds of each build step into an empty cache with an empty Go build cache: the control
    plane's components (kubernetes, controller-manager, etcd), or with ``everything`` what ``make
    build`` builds (``build --all``, then the images)."""
    from reversi_devcluster.build import CONTROL_PLANE_COMPONENTS

    steps = [["build", "--all"], ["images"]] if everything else [["build", *CONTROL_PLANE_COMPONENTS]]
    figures = []
    with tempfile.TemporaryDirectory(prefix="reversi-cold-") as tmp:
        env = {**os.environ, "REVERSI_CACHE": str(Path(tmp) / "cache"), "GOCACHE": str(Path(tmp) / "gocache")}
        for step in steps:
            started = time.monotonic()
            subprocess.run([sys.executable, "-m", "reversi_devcluster.cli", *step], env=env, check=True)
            figures.append((" ".join(step), time.monotonic() - started))
        if everything:  # buildah's store holds overlay layers: let buildah remove them before the folder goes
            from reversi_devcluster.images import Store

            store = Store(Path(tmp) / "cache" / "images")
            store.buildah("rm", "--all", check=False)
            store.buildah("rmi", "--all", "--force", check=False)
    return figures


def job_seconds(api, namespace: str, image: str, jobs: int) -> list[float]:
    """Seconds from each Job's create to its Complete condition, ``jobs`` Jobs one after the other."""
    from kubernetes import client, watch

    batch = client.BatchV1Api(api)
    times = []
    for i in range(jobs):
        body = {"metadata": {"name": f"bench-{i}"}, "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                                      "command": ["python3", "-c", "print('ok')"]}]}}}}
        started = time.monotonic()
        batch.create_namespaced_job(namespace, body)
        for event in watch.Watch().stream(batch.list_namespaced_job, namespace,
                                          field_selector=f"metadata.name=bench-{i}", timeout_seconds=120):
            conditions = event["object"].status.conditions or []
            if any(c.type in ("Complete", "Failed") and c.status == "True" for c in conditions):
                assert any(c.type == "Complete" for c in conditions), f"Job bench-{i} failed: {conditions}"
                break
        times.append(time.monotonic() - started)
    return times


def nodes(jobs: int) -> None:
    """The node agent and the real node side by side: up, Job create to Complete, down."""
    from kubernetes import client, config

    from reversi_devcluster import images, realnode

    why = realnode.unsupported()
    kinds = [("node agent", False)] + ([("real node", True)] if not why else [])
    if why:
        print(f"real node: not measured ({why})")
    figures = {}
    for label, real in kinds:
        with tempfile.TemporaryDirectory(prefix="reversi-bench-node-") as tmp:
            settings = ClusterSettings(cluster_dir=Path(tmp), apiserver_port=36443, etcd_port=32379,
                                       etcd_peer_port=32380, kubelet_port=40250, real_node=real,
                                       node_bridge="reversi-bench", node_pod_cidr="10.244.120.0/24")
            cluster = Cluster(settings)
            started = time.monotonic()
            cluster.up(log=lambda *_: None)
            up = time.monotonic() - started
            try:
                api = config.new_client_from_config(config_file=str(cluster.paths.admin_kubeconfig))
                client.CoreV1Api(api).create_namespace({"metadata": {"name": "bench"}})
                times = job_seconds(api, "bench", images.DEMO_IMAGE, jobs)
            finally:
                started = time.monotonic()
                cluster.down(quiet=True)
                down = time.monotonic() - started
            figures[label] = statistics.median(times)
            print(f"{label}: up {up:.1f}s; Job create to Complete median {figures[label]:.2f}s "
                  f"(runs: {', '.join(f'{t:.2f}' for t in times)}); down {down:.1f}s")
    if len(figures) == 2:
        print(f"Job create to Complete, real node / node agent: {figures['real node'] / figures['node agent']:.2f}x")


def job_batches(periods: list[str], jobs: int) -> None:
    """Job create to Complete on the node agent, in a fresh cluster per Job controller batching
    period: one line each, with its median's ratio to the first period's."""
    from kubernetes import client, config

    from reversi_devcluster import images

    first = None
    for period in periods:
        with tempfile.TemporaryDirectory(prefix="reversi-bench-batch-") as tmp:
            cluster = Cluster(ClusterSettings(cluster_dir=Path(tmp), apiserver_port=36443, etcd_port=32379,
                                              etcd_peer_port=32380, kubelet_port=40250,
                                              job_sync_batch_period=period))
            cluster.up(log=lambda *_: None)
            try:
                api = config.new_client_from_config(config_file=str(cluster.paths.admin_kubeconfig))
                client.CoreV1Api(api).create_namespace({"metadata": {"name": "bench"}})
                times = job_seconds(api, "bench", images.DEMO_IMAGE, jobs)
            finally:
                cluster.down(quiet=True)
        median = statistics.median(times)
        first = first or median
        print(f"node agent, Job controller batching {period}: Job create to Complete median {median:.2f}s over "
              f"{jobs} Jobs ({median / first:.2f}x the first; runs: {', '.join(f'{t:.2f}' for t in times)}); "
              f"load {os.getloadavg()[0]:.2f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--cold", action="store_true", help="also measure a cold build of kubernetes + etcd (many minutes)")
    p.add_argument("--cold-all", action="store_true",
                   help="also measure a cold build of everything make build builds, images included (tens of minutes)")
    p.add_argument("--nodes", action="store_true", help="the node agent next to the real node (up, Jobs, down)")
    p.add_argument("--jobs", type=int, default=7, help="Jobs per node with --nodes or --job-batch")
    p.add_argument("--job-batch", default=None, metavar="PERIODS",
                   help="comma-separated Job controller batching periods to compare on the node agent (e.g. 1s,100ms)")
    args = p.parse_args()
    if args.job_batch:
        job_batches(args.job_batch.split(","), args.jobs)
        return
    if args.nodes:
        nodes(args.jobs)
        return
    times = warm_start(args.runs)
    print(f"warm start, up to Ready node: median {statistics.median(times):.1f}s "
          f"(runs: {', '.join(f'{t:.1f}s' for t in times)}; target <= 30s)")
    if args.cold or args.cold_all:
        figures = cold_build(everything=args.cold_all)
        for step, seconds in figures:
            print(f"cold {step} (empty cache and GOCACHE, Go module cache kept): {seconds:.0f}s "
                  f"on {os.cpu_count()} cores")
        if len(figures) > 1:
            print(f"cold, in all: {sum(s for _, s in figures):.0f}s")


if __name__ == "__main__":
    main()
