"""The journal's ceiling: what one recorded call costs in etcd, what the operator costs per Run it
watches, how retention deletes while agents record, and the archive under a database outage.

    python benchmarks/journal_bench.py [--only bytes,startup,retention,archive] [--runs 0,10000,50000]
        [--calls 2000] [--expired 10000] [--steps 20] [--archived 10000] [--outage 60] [--seconds 20]

- **bytes**: ``--calls`` calls recorded through the SDK (behind Reversi's admission), each a
  RunStep, in runs of 100; etcd's own ``etcd_mvcc_db_total_size_in_use_in_bytes`` before and
  after, first as it is (object and history), then after a compaction to the current revision
  and a defragmentation (the objects alone). Printed: bytes per recorded call, both ways, and the
  calls one etcd holds at its default 2 GiB quota.
- **startup**: for each ``--runs`` count, that many Runs in the cluster (created bare, with the
  webhooks off, so that making them takes seconds); the operator started (no admission server:
  nothing is admitted) with a dry-run RollbackRequest of a 3-step run waiting; printed: the time
  from its start to that dry run ``Planned``, and its RSS (VmRSS) 30 s after start and its peak
  (VmHWM), each next to the figure with no Run. Targets at the largest count: RSS at most 2x,
  the dry run within 30 s.
- **retention**: ``--expired`` Runs of ``--steps`` steps (bare, webhooks off) in a namespace kept
  forever; 4 agents record through the SDK for ``--seconds`` (the baseline rate); then the
  namespace's TTL is set to 1 s and the same agents record again while retention deletes the
  Runs. Printed: the agents' rate in both and the ratio (target at least 0.8), and the seconds
  until every expired Run and every one of its steps is gone.
- **archive**: a real PostgreSQL server (Debian's package, as the tests start it) and the operator
  with the archive on; ``--archived`` Runs of 3 steps expire; ``--outage`` seconds after the first
  Run is archived PostgreSQL is stopped, then started again ``--outage`` seconds later. Printed:
  the seconds until every Run is gone, Runs archived, Runs lost (gone from the cluster, not in the
  archive), Runs written twice (rows per uid above 1), and Runs whose record in the archive
  differs from what ``kubectl reversi export`` read from the cluster before (targets: 0, 0, 0).

Every figure is next to a baseline measured in the same run. Uses a running local control plane
(``reversi-devcluster up``), else starts one and stops it at the end. The integration tests'
operator must not run on it (the bench starts its own).
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures as cf
import json
import os
import re
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT))

from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from reversi.cli import views  # noqa: E402
from reversi.engine.retention import NAMESPACE_ANNOTATION  # noqa: E402
from reversi.sdk import Recorder  # noqa: E402
from reversi_devcluster.cluster import Cluster  # noqa: E402
from reversi_devcluster.localop import OperatorProcess, apply_crds, free_port, remove_webhook_configurations  # noqa: E402

G, V = "reversi.dev", "v1alpha1"
QUOTA = 2 * 1024**3
MANIFEST = {"apiVersion": f"{G}/{V}", "kind": "ToolManifest", "metadata": {"name": "bench"},
            "spec": {"tools": [{"name": "crm.lookup", "effect": "read"}]}}
CREATE_THREADS = 16


# ------------------------------------------------------------------------------ helpers

def etcd(cluster: Cluster, path: str, body: dict | None = None) -> Any:
    url = f"http://127.0.0.1:{cluster.settings.etcd_port}{path}"
    data = json.dumps(body).encode() if body is not None else None
    with urllib.request.urlopen(urllib.request.Request(url, data=data, method="POST" if data else "GET"),
                                timeout=300) as resp:
        text = resp.read().decode()
    return json.loads(text) if body is not None else text


def db_in_use(cluster: Cluster) -> int:
    text = etcd(cluster, "/metrics")
    return int(float(re.search(r"^etcd_mvcc_db_total_size_in_use_in_bytes (\S+)$", text, re.M).group(1)))


def compact_and_defrag(cluster: Cluster) -> None:
    rev = int(etcd(cluster, "/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
    try:
        etcd(cluster, "/v3/kv/compaction", {"revision": str(rev), "physical": True})
    except urllib.error.HTTPError as err:  # already compacted to it
        if err.code != 400:
            raise
    etcd(cluster, "/v3/maintenance/defragment", {})


def namespace(api: client.ApiClient, name: str, annotations: dict | None = None) -> str:
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name, "annotations": annotations or {}}})
    client.CustomObjectsApi(api).create_namespaced_custom_object(G, V, name, "toolmanifests", MANIFEST)
    return name


def delete_namespace(api: client.ApiClient, name: str, wait: float = 600) -> None:
    core = client.CoreV1Api(api)
    try:
        core.delete_namespace(name)
    except ApiException as err:
        if err.status != 404:
            raise
    end = time.monotonic() + wait
    while time.monotonic() < end:
        try:
            core.read_namespace(name)
        except ApiException as err:
            if err.status == 404:
                return
        time.sleep(1)


def run_body(name: str, principal: str = "bench-agent") -> dict:
    return {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": name},
            "spec": {"principal": principal, "scope": {"actor": "bench"}, "manifestRef": {"name": "bench"}}}


def step_body_of(run: str, uid: str, index: int) -> dict:
    return {"apiVersion": f"{G}/{V}", "kind": "RunStep",
            "metadata": {"name": f"{run}-{index:05d}", "labels": {"reversi.dev/run": run},
                         "ownerReferences": [{"apiVersion": f"{G}/{V}", "kind": "Run", "name": run, "uid": uid}]},
            "spec": {"runRef": {"name": run}, "index": index, "tool": "crm.lookup", "args": {"id": f"c-{index}"},
                     "result": {"id": f"c-{index}", "name": "Ada"}, "outcome": "succeeded",
                     "principal": "bench-agent", "recordedAt": "2026-01-01T00:00:00Z"}}


def fill(api: client.ApiClient, ns: str, runs: int, steps: int, prefix: str = "r") -> list[str]:
    """``runs`` Runs of ``steps`` steps each, created bare (the caller turned the webhooks off)."""
    custom = client.CustomObjectsApi(api)

    def one(i: int) -> str:
        name = f"{prefix}-{i:06d}"
        uid = custom.create_namespaced_custom_object(G, V, ns, "runs", run_body(name))["metadata"]["uid"]
        for index in range(steps):
            custom.create_namespaced_custom_object(G, V, ns, "runsteps", step_body_of(name, uid, index))
        return name

    with cf.ThreadPoolExecutor(CREATE_THREADS) as pool:
        return list(pool.map(one, range(runs)))


def rss(pid: int) -> tuple[float, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    return (int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024,
            int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024)


def wait(check, timeout: float, what: str, every: float = 0.5):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def line(label: str, value: str, note: str = "") -> None:
    print(f"  {label:<58} {value:>14}  {note}", flush=True)


# ------------------------------------------------------------------------------ scenarios

def bytes_per_call(cluster: Cluster, api: client.ApiClient, kubeconfig: str, calls: int) -> None:
    print(f"bytes: {calls} calls recorded through the SDK, etcd's own size", flush=True)
    ns = namespace(api, f"bench-bytes-{uuid.uuid4().hex[:5]}")
    op = OperatorProcess(Path(kubeconfig), cluster.paths.logs / "bench-operator.log", metrics_port=free_port(),
                         webhook_port=free_port())
    op.start(timeout=120)
    try:
        compact_and_defrag(cluster)
        before = db_in_use(cluster)
        per_run = 100

        def agent(a: int) -> None:
            for r in range(a, calls // per_run, 4):
                rec = Recorder.open(ns, f"bytes-{r:04d}", manifest="bench", api=api, scope={"actor": "bench"})
                for i in range(per_run):
                    rec.call("crm.lookup", {"id": f"c-{i}"}, lambda args: {"id": args["id"], "name": "Ada"})

        with cf.ThreadPoolExecutor(4) as pool:
            list(pool.map(agent, range(4)))
        recorded = (calls // per_run) * per_run
        with_history = db_in_use(cluster) - before
        compact_and_defrag(cluster)
        objects = db_in_use(cluster) - before
        line("bytes per recorded call, object and history", f"{with_history / recorded:,.0f}")
        line("bytes per recorded call, after compaction and defrag", f"{objects / recorded:,.0f}",
             f"({recorded} calls in {recorded // per_run} runs)")
        line("recorded calls one etcd holds at its 2 GiB quota", f"{QUOTA / (objects / recorded):,.0f}",
             "(objects alone; history until the API server compacts, every 5 min)")
    finally:
        op.stop()
        remove_webhook_configurations(api)
        delete_namespace(api, ns)


def startup(cluster: Cluster, api: client.ApiClient, kubeconfig: str, counts: list[int]) -> None:
    print(f"startup: the operator with {', '.join(f'{c:,}' for c in counts)} Runs in the cluster", flush=True)
    remove_webhook_configurations(api)
    ns = namespace(api, f"bench-start-{uuid.uuid4().hex[:5]}")
    custom = client.CustomObjectsApi(api)
    made = 0
    base: tuple[float, float, float] | None = None
    try:
        for count in counts:
            t0 = time.monotonic()
            fill(api, ns, count - made, 0, prefix=f"s{made}")
            if count > made:
                print(f"  ({count - made:,} Runs created in {time.monotonic() - t0:.0f} s)", flush=True)
            made = count
            probe = f"probe-{uuid.uuid4().hex[:5]}"
            uid = custom.create_namespaced_custom_object(G, V, ns, "runs", run_body(probe))["metadata"]["uid"]
            for i in range(3):
                custom.create_namespaced_custom_object(G, V, ns, "runsteps", step_body_of(probe, uid, i))
            custom.create_namespaced_custom_object(G, V, ns, "rollbackrequests", {
                "apiVersion": f"{G}/{V}", "kind": "RollbackRequest", "metadata": {"name": probe},
                "spec": {"runRef": {"name": probe}, "dryRun": True}})
            op = OperatorProcess(Path(kubeconfig), cluster.paths.logs / "bench-operator.log", metrics_port=free_port())
            started = time.monotonic()
            op.start(timeout=300)
            wait(lambda probe=probe: (custom.get_namespaced_custom_object(G, V, ns, "rollbackrequests", probe)
                                      .get("status") or {}).get("phase") == "Planned", 300, "the dry run", every=0.1)
            planned = time.monotonic() - started
            time.sleep(max(0.0, 30 - (time.monotonic() - started)))
            now, peak = rss(op.proc.pid)
            op.stop()
            if base is None:
                base = (planned, now, peak)
            line(f"{count:>6,} Runs: first dry run planned after start", f"{planned:.2f} s",
                 f"({planned / base[0]:.2f}x the figure with {counts[0]:,})")
            line(f"{count:>6,} Runs: RSS 30 s after start / peak", f"{now:.0f} / {peak:.0f} MB",
                 f"({now / base[1]:.2f}x / {peak / base[2]:.2f}x; target at most 2x)")
            if count:
                line(f"{count:>6,} Runs: memory per Run", f"{(now - base[1]) * 1024 / count:.1f} KB")
    finally:
        delete_namespace(api, ns, wait=1800)


def _agents(api: client.ApiClient, ns: str, seconds: float, tag: str) -> float:
    """4 agents recording through the SDK for ``seconds``; their calls per second."""
    done = [0] * 4
    until = time.monotonic() + seconds

    def agent(a: int) -> None:
        rec = Recorder.open(ns, f"agent-{tag}-{a}", manifest="bench", api=api, scope={"actor": "bench"})
        while time.monotonic() < until:
            rec.call("crm.lookup", {"id": f"c-{done[a]}"}, lambda args: {"id": args["id"]})
            done[a] += 1

    with cf.ThreadPoolExecutor(4) as pool:
        list(pool.map(agent, range(4)))
    return sum(done) / seconds


def retention(cluster: Cluster, api: client.ApiClient, kubeconfig: str, expired: int, steps: int,
              seconds: float) -> None:
    print(f"retention: {expired:,} expired Runs of {steps} steps deleted while 4 agents record", flush=True)
    remove_webhook_configurations(api)
    old = namespace(api, f"bench-old-{uuid.uuid4().hex[:5]}", {NAMESPACE_ANNOTATION: "Forever"})
    live = namespace(api, f"bench-live-{uuid.uuid4().hex[:5]}", {NAMESPACE_ANNOTATION: "Forever"})
    t0 = time.monotonic()
    fill(api, old, expired, steps)
    print(f"  ({expired:,} Runs of {steps} steps created in {time.monotonic() - t0:.0f} s)", flush=True)
    op = OperatorProcess(Path(kubeconfig), cluster.paths.logs / "bench-operator.log", metrics_port=free_port(),
                         webhook_port=free_port())
    op.start(timeout=300)
    custom = client.CustomObjectsApi(api)
    try:
        baseline = _agents(api, live, seconds, "base")
        client.CoreV1Api(api).patch_namespace(old, {"metadata": {"annotations": {NAMESPACE_ANNOTATION: "1"}}})
        started = time.monotonic()
        loaded = _agents(api, live, seconds, "load")
        left = lambda: len(custom.list_namespaced_custom_object(G, V, old, "runs", limit=1)["items"])  # noqa: E731
        wait(lambda: left() == 0, 7200, "every expired Run deleted", every=2)
        runs_gone = time.monotonic() - started
        steps_gone = None
        if steps:
            from reversi.adapters.kube import Kube
            kube = Kube(api)
            wait(lambda: kube.count("runsteps", old) == 0, 7200, "every step deleted", every=2)
            steps_gone = time.monotonic() - started
        line("agents' calls/s with no deletion (baseline)", f"{baseline:.1f}")
        line("agents' calls/s while retention deletes", f"{loaded:.1f}",
             f"({loaded / baseline:.2f}x; target at least 0.8x)")
        line(f"{expired:,} expired Runs deleted in", f"{runs_gone:.0f} s", f"({expired / runs_gone:.1f} Runs/s)")
        if steps_gone is not None:
            line(f"... and their {expired * steps:,} steps (garbage collector) in", f"{steps_gone:.0f} s")
    finally:
        op.stop()
        remove_webhook_configurations(api)
        delete_namespace(api, old, wait=1800)
        delete_namespace(api, live)


def archive(cluster: Cluster, api: client.ApiClient, kubeconfig: str, count: int, outage: float) -> None:
    from reversi.adapters.archive import Archive
    from tests.postgres import Postgres

    print(f"archive: {count:,} Runs of 3 steps archived and deleted, PostgreSQL stopped {outage:.0f} s mid-way",
          flush=True)
    remove_webhook_configurations(api)
    ns = namespace(api, f"bench-arch-{uuid.uuid4().hex[:5]}", {NAMESPACE_ANNOTATION: "Forever"})
    pg = Postgres(disk_bytes=4 * 1024**3)  # room for the records: the tests fill a small one on purpose
    pg.init()
    try:
        t0 = time.monotonic()
        fill(api, ns, count, 3)
        print(f"  ({count:,} Runs created in {time.monotonic() - t0:.0f} s)", flush=True)
        expected = _exports(api, ns)
        store = Archive(pg.dsn())
        os.environ["REVERSI_ARCHIVE_DSN"] = pg.dsn()
        op = OperatorProcess(Path(kubeconfig), cluster.paths.logs / "bench-operator.log", metrics_port=free_port())
        try:
            op.start(timeout=300)
        finally:
            del os.environ["REVERSI_ARCHIVE_DSN"]
        try:
            client.CoreV1Api(api).patch_namespace(ns, {"metadata": {"annotations": {NAMESPACE_ANNOTATION: "1"}}})
            started = time.monotonic()
            wait(lambda: _archived(pg) > 0, 600, "the first Run archived")
            time.sleep(min(outage, 10))
            pg.stop()
            down = time.monotonic()
            time.sleep(outage)
            pg.start()
            print(f"  (PostgreSQL was down {time.monotonic() - down:.0f} s)", flush=True)
            custom = client.CustomObjectsApi(api)
            wait(lambda: not custom.list_namespaced_custom_object(G, V, ns, "runs", limit=1)["items"], 7200,
                 "every Run deleted", every=2)
            took = time.monotonic() - started
        finally:
            op.stop()
        uids = {u for u, _ in expected.items()}
        twice = int(pg.sql("SELECT count(*) FROM (SELECT uid FROM reversi_runs GROUP BY uid HAVING count(*) > 1) t",
                           database="reversi"))
        rewritten = int(pg.sql("SELECT count(*) FROM reversi_runs WHERE writes > 1", database="reversi"))
        differ, lost = 0, 0
        for uid in uids:
            record = store.record(uid)
            if record is None:
                lost += 1
                continue
            # compared as JSON values: PostgreSQL's jsonb keeps an object's keys in an order of its own
            got = [json.loads(views.json_line(r)) for r in views.export_records(record.run, record.steps, [],
                                                                                inline=False)]
            differ += got != [json.loads(x) for x in expected[uid]]
        line(f"{count:,} Runs archived and deleted in", f"{took:.0f} s", f"({count / took:.1f} Runs/s)")
        line("Runs lost (gone from the cluster, not in the archive)", f"{lost}", "(target 0)")
        line("Runs written twice (rows per uid above 1)", f"{twice}", f"(target 0; {rewritten} rewritten in place)")
        line("Runs whose archived record differs from the cluster's", f"{differ}", "(target 0)")
    finally:
        pg.destroy()
        delete_namespace(api, ns, wait=1800)


def _archived(pg: Any) -> int:
    try:
        return int(pg.sql("SELECT count(*) FROM reversi_runs", database="reversi") or 0)
    except Exception:  # noqa: BLE001 - the schema is not there before the first write
        return 0


def _exports(api: client.ApiClient, ns: str) -> dict[str, list[str]]:
    """``kubectl reversi export``'s lines of every Run of ``ns`` (two paged LISTs), by uid."""
    from reversi.adapters import apicalls as calls

    custom = client.CustomObjectsApi(api)
    runs = calls.list_objects(custom, "runs", ns)
    steps: dict[str, list[dict]] = {}
    for step in calls.list_objects(custom, "runsteps", ns):
        steps.setdefault(step["spec"]["runRef"]["name"], []).append(step)
    return {r["metadata"]["uid"]: [views.json_line(x) for x in views.export_records(
        r, steps.get(r["metadata"]["name"], []), [], inline=False)] for r in runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="bytes,startup,retention,archive")
    parser.add_argument("--runs", default="0,10000,50000")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--expired", type=int, default=10000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--archived", type=int, default=10000)
    parser.add_argument("--outage", type=float, default=60)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    only = set(args.only.split(","))
    cluster = Cluster()
    started = not cluster.is_running()
    if started:
        cluster.up()
    kubeconfig = str(cluster.paths.admin_kubeconfig)
    api = config.new_client_from_config(config_file=kubeconfig)
    apply_crds(api)
    print(f"load average at start: {os.getloadavg()[0]:.2f} (the machine may be shared)", flush=True)
    began = time.monotonic()
    try:
        if "bytes" in only:
            bytes_per_call(cluster, api, kubeconfig, args.calls)
        if "startup" in only:
            startup(cluster, api, kubeconfig, [int(x) for x in args.runs.split(",")])
        if "retention" in only:
            retention(cluster, api, kubeconfig, args.expired, args.steps, args.seconds)
        if "archive" in only:
            archive(cluster, api, kubeconfig, args.archived, args.outage)
    finally:
        print(f"the bench took {time.monotonic() - began:.0f} s; load average now {os.getloadavg()[0]:.2f}")
        if started:
            cluster.down()


if __name__ == "__main__":
    main()
