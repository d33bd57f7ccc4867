"""Benchmark the local control plane: warm start time and cold build time.

    python benchmarks/devcluster_bench.py            # warm start (binaries already built), 3 runs
    python benchmarks/devcluster_bench.py --cold     # also a cold build of kubernetes + etcd

Warm start: from ``up`` to a Ready node (and the default service account), with binaries in
the cache, on a cluster in a temporary folder and its own ports, so a running cluster is left
alone. Cold build: kubernetes and etcd built into an empty cache with an empty Go build cache
(``GOCACHE``); the Go module download cache is kept, so network time is not measured.
Prints one line per figure.
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


def cold_build() -> float:
    with tempfile.TemporaryDirectory(prefix="reversi-cold-") as tmp:
        env = {**os.environ, "REVERSI_CACHE": str(Path(tmp) / "cache"), "GOCACHE": str(Path(tmp) / "gocache")}
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "reversi_devcluster.cli", "build", "kubernetes", "etcd"],
                       env=env, check=True)
        return time.monotonic() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--cold", action="store_true", help="also measure a cold build (many minutes)")
    args = p.parse_args()
    times = warm_start(args.runs)
    print(f"warm start, up to Ready node: median {statistics.median(times):.1f}s "
          f"(runs: {', '.join(f'{t:.1f}s' for t in times)}; target <= 30s)")
    if args.cold:
        print(f"cold build of kubernetes + etcd (empty GOCACHE, module cache kept): {cold_build():.0f}s "
              f"on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
