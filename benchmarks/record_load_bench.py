"""Recording under load: many agents recording at once, next to the same API server's plain writes.

    python benchmarks/record_load_bench.py [--agents 1,4,16,32] [--seconds 10] [--only load,gap] [--breakdown] [--apf]

Every figure is printed next to a baseline measured in the same run on the same local control
plane, so the ratio, not the absolute rate, is the claim:

- **load**: for each number of agents, each agent records calls through the SDK as fast as it can
  (``Recorder.step``: the ``intended`` RunStep create, then the outcome write) for ``--seconds``
  (with one agent, also calls of a tool with an idempotency key, which claim it); then, with no
  webhook and no policy registered, the same agents make the same two writes on plain ConfigMaps
  (a create, then a merge patch) and on bare RunSteps (the **floor**) with the same client.
  Printed: the floor next to the plain writes, and each recorded row next to the floor (calls/s
  ratio, median per call).
  Agents are threads spread over worker processes (``--processes``), each agent with its own Run
  and its own API client.
- **gap**: 4 agents record for 15 s while the operator process is SIGKILLed a third of the way
  in and started again 5 s later; then the same while one admission replica is; then while every
  admission replica is, for ``--admission-down`` seconds (60), with a Halt of a tool no agent calls
  applied halfway through and a fifth agent calling that tool until it is refused. Printed: calls
  the SDK refused (``RecordingRefused``), the longest time with no call recorded anywhere, and the
  Halt's time to its first refusal.
- **interference**: a 10-step rollback at parallelism 1 (compensators that exit 0 at once) on an
  idle operator, then while 16 agents record as fast as they can. Printed: both durations (first
  pass to the final phase) and their ratio. On the local control plane every process uses the
  admin's kubeconfig, which API Priority and Fairness exempts (group system:masters), so nothing
  tells the operator's requests from the agents'. With ``--apf`` they are told apart as on a real
  cluster: the chart's PriorityLevelConfiguration and FlowSchemas (``helm template`` of
  templates/flowcontrol.yaml, release ``bench`` in a namespace of its own) are created, and the
  operator, the admission replicas and the agents each use a kubeconfig of a ServiceAccount
  (``bench-reversi``, ``bench-reversi-admission``, ``bench-agent``; TokenRequest tokens, bound to
  cluster-admin for the run: their rights are not what is measured), so the agents' requests fall
  into the built-in workload-low and the operator's into ``bench-reversi-operator``
  (docs/operations.md#api-priority-and-fairness). Every scenario then runs so; all of it is deleted
  at the end.
- **floor** (first, before the admission server starts, in a namespace of its own deleted
  before the other scenarios; the operator runs): what each layer of a recorded call
  costs, for the first and the last ``--agents`` count, each next to the plain writes of the same
  run: RunSteps written bare (no admission, no SDK, no ``snapshot``), RunSteps with the
  ``snapshot`` the server stamps, the SDK with no admission at all, and the SDK behind a webhook
  that admits every review at once without reading anything (a few lines of aiohttp: the least
  any webhook on the create can cost). Reversi's own admission is the **load** row.
- **move**: a Run of Reversi 0.1 with 3,000 inline steps is created; printed: the seconds until
  the operator moved them into RunSteps, and until a dry-run RollbackRequest of it is Planned.
- **crowd** (only when asked, ``--only crowd``; the other scenarios may run with it): one agent
  records calls of a tool with an idempotency key in a namespace of its own, then the same after
  20,000 RunSteps of other runs were written into that namespace (with the webhooks off, so that
  filling it takes seconds). Printed: both medians per call and their ratio. A keyed call claims
  its key with one create (no LIST), so the namespace's size should not show.
- **rolling** (only when asked, ``--only rolling``; a machine that runs the real node): the chart
  is installed with its image on a control plane with a real node (its own folder and ports), and
  4 agents record while ``helm upgrade`` rolls the operator and every admission replica (a new
  pod annotation). Printed: calls refused, the longest time with no call recorded, the upgrade's
  seconds.

Targets (the recording path's own, see docs/operations.md#admission-where-each-rule-is-enforced):
32 agents' rate at least 0.85 of the floor's; one agent's median per call at most 1.25 times the
floor's (a keyed call 1.7 times); with the operator, one or every admission replica killed (every
one for ``--admission-down`` s, a Halt applied meanwhile): 0 refused calls, no window over 1 s, the
Halt refusing within 1 s; the keyed call among 20,000 other steps at most 1.1 times its time in an
empty namespace; the rollback under load at most 1.2 times its idle time; the 3,000-step move and
its dry run within 30 s.

Uses a running local control plane when there is one (``reversi-devcluster up``), else starts
one and stops it at the end. Exit 1 when a recorded run is wrong (a step missing or out of order).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from collections.abc import Iterator
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

import yaml  # noqa: E402
from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from reversi.adapters.journal import list_objects, step_body  # noqa: E402
from reversi.models import ToolManifestSpec  # noqa: E402
from reversi_devcluster.build import binary  # noqa: E402
from reversi_devcluster.cluster import Cluster  # noqa: E402
from reversi_devcluster.localop import AdmissionPool, OperatorProcess, apply_crds, free_port  # noqa: E402
from reversi_devcluster.localop import remove_webhook_configurations  # noqa: E402
from reversi.sdk import OutcomeNotRecorded, Recorder, RecordingRefused  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from record_bench import MANIFEST, TOOL  # noqa: E402 - the same tool as the one-agent benchmark

G, V = "reversi.dev", "v1alpha1"
#: the tool of the load rows: a write with a compensation and no idempotency key (the keyed one,
#: TOOL, is measured on its own: a keyed call also claims its key)
PLAIN_TOOL = "orders.note"
#: the tool a Halt refuses in the gap scenario (no agent calls it)
HALTED_TOOL = "orders.halted"
LOAD_MANIFEST = {**MANIFEST, "spec": {**MANIFEST["spec"], "tools": [
    *MANIFEST["spec"]["tools"],
    *({k: v for k, v in MANIFEST["spec"]["tools"][0].items() if k != "idempotencyKey"} | {"name": name}
      for name in (PLAIN_TOOL, HALTED_TOOL))]}}
UNDO_MANIFEST = {
    "apiVersion": f"{G}/{V}", "kind": "ToolManifest", "metadata": {"name": "undo"},
    "spec": {
        "runners": [{"name": "ok", "image": "registry.example/tools:1", "command": ["true"], "deadlineSeconds": 60}],
        "tools": [{"name": "box.put", "effect": "write",
                   "compensation": {"tool": "box.remove", "kind": "inverse", "args": {}, "runner": "ok"}}],
    },
}


# ----------------------------------------------------------------------------- one agent

def _recording_agent(kubeconfig: str, namespace: str, run: str, until: float, out: list,
                     tool: str = PLAIN_TOOL) -> None:
    """Record calls of ``tool`` in Run ``run`` until ``until`` (time.time()); append (end time,
    seconds, refused)."""
    api = config.new_client_from_config(config_file=kubeconfig)
    rec = Recorder.open(namespace, run, manifest="bench", api=api, scope={"actor": "bench-agent"})
    i = 0
    while time.time() < until:
        t0 = time.perf_counter()
        try:
            with rec.step(tool, {"order_id": f"{run}-{i}", "amount": i}) as step:
                step.result = {"id": f"ord-{run}-{i}"}
            out.append((time.time(), time.perf_counter() - t0, False))
        except (RecordingRefused, OutcomeNotRecorded):  # the call refused, or its outcome not recorded
            out.append((time.time(), time.perf_counter() - t0, True))
            time.sleep(0.1)  # a refused agent does not hammer the API server: it moves on, as an agent would
        i += 1


def _plain_agent(kubeconfig: str, namespace: str, run: str, until: float, out: list) -> None:
    """The same two writes on plain ConfigMaps: a create, then a merge patch of the outcome."""
    api = config.new_client_from_config(config_file=kubeconfig)
    core = client.CoreV1Api(api)
    i = 0
    while time.time() < until:
        t0 = time.perf_counter()
        name = f"{run}-{i:05d}"
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name, "labels": {"bench": run}},
                                                      "data": {"tool": TOOL, "outcome": "intended",
                                                               "args": f'{{"order_id": "{run}-{i}", "amount": {i}}}'}})
        core.patch_namespaced_config_map(name, namespace, {"data": {"outcome": "succeeded",
                                                                    "result": f'{{"id": "ord-{run}-{i}"}}'}})
        out.append((time.time(), time.perf_counter() - t0, False))
        i += 1


def _bare_agent(kubeconfig: str, namespace: str, run: str, until: float, out: list, snapshot: bool = False) -> None:
    """The two writes of a recorded call made on RunSteps by hand, with no SDK: the ``intended``
    create (with the tool's manifest entry as ``snapshot`` when ``snapshot``, as the server stamps
    it), then the outcome's JSON patch."""
    api = config.new_client_from_config(config_file=kubeconfig)
    custom = client.CustomObjectsApi(api)
    Recorder.open(namespace, run, manifest="bench", api=api, scope={"actor": "bench-agent"})
    entry = ToolManifestSpec.model_validate(MANIFEST["spec"]).tool(TOOL)
    extra = {"snapshot": entry.to_wire()} if snapshot and entry is not None else {}
    i = 0
    while time.time() < until:
        t0 = time.perf_counter()
        body = step_body(namespace, run, {"index": i, "tool": TOOL, "outcome": "intended",
                                          "args": {"order_id": f"{run}-{i}", "amount": i}, **extra})
        custom.create_namespaced_custom_object(G, V, namespace, "runsteps", body)
        custom.patch_namespaced_custom_object(G, V, namespace, "runsteps", body["metadata"]["name"], [
            {"op": "test", "path": "/spec/outcome", "value": "intended"},
            {"op": "replace", "path": "/spec/outcome", "value": "succeeded"},
            {"op": "add", "path": "/spec/result", "value": {"id": f"ord-{run}-{i}"}}],
            _content_type="application/json-patch+json")
        out.append((time.time(), time.perf_counter() - t0, False))
        i += 1


def _bare_snapshot_agent(kubeconfig: str, namespace: str, run: str, until: float, out: list) -> None:
    _bare_agent(kubeconfig, namespace, run, until, out, snapshot=True)


def _keyed_agent(kubeconfig: str, namespace: str, run: str, until: float, out: list) -> None:
    _recording_agent(kubeconfig, namespace, run, until, out, tool=TOOL)


AGENTS = {"recorded": _recording_agent, "plain": _plain_agent, "bare": _bare_agent,
          "snapshot": _bare_snapshot_agent, "keyed": _keyed_agent}


def _process(kind: str, kubeconfig: str, namespace: str, runs: list[str], clock: Any, queue: Any) -> None:
    """One worker process: says it is ready (its imports done: on a loaded machine they take
    seconds), waits for the clock's end time, then runs one thread per agent; puts every agent's
    records on ``queue``."""
    ready, go, end = clock
    ready.put(True)
    go.wait()
    until = end.value
    def target(*args: Any) -> None:
        try:
            AGENTS[kind](*args)
        except Exception as err:  # noqa: BLE001 - an agent that dies says why (its calls stop counting)
            print(f"{kind} agent {args[2]} stopped: {err!r}"[:2000], file=sys.stderr, flush=True)

    results: dict[str, list] = {run: [] for run in runs}
    threads = [threading.Thread(target=target, args=(kubeconfig, namespace, run, until, results[run]), daemon=True)
               for run in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue.put(results)


def drive(kind: str, kubeconfig: str, namespace: str, agents: int, seconds: float, processes: int,
          during: Any = None, window: list[float] | None = None) -> dict[str, list]:
    """Run ``agents`` agents of ``kind`` for ``seconds``; ``during(start)`` runs in this process
    meanwhile (the fault of the gap scenario). Returns each agent's records by run name; the
    measured window's (start, end) are appended to ``window``."""
    tag = uuid.uuid4().hex[:5]
    runs = [f"{kind[:3]}-{tag}-{a}" for a in range(agents)]
    groups = [runs[p::processes] for p in range(min(processes, agents))]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    clock = (ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0))
    procs = [ctx.Process(target=_process, args=(kind, kubeconfig, namespace, g, clock, queue)) for g in groups]
    for p in procs:
        p.start()
    for _ in procs:  # every process imported what it needs before the clock is set
        clock[0].get(timeout=300)
    # every agent has its client and its Run before the clock starts (a second per agent a process
    # runs: on a loaded machine, making a client and a Run takes that long)
    start = time.time() + 3.0 + max(len(g) for g in groups)
    until = start + seconds
    clock[2].value = until
    clock[1].set()
    if window is not None:
        window += [start, until]
    if during is not None:
        during(start)
    merged: dict[str, list] = {}
    for _ in procs:
        merged.update(queue.get(timeout=seconds + 120))
    for p in procs:
        p.join(timeout=30)
    # the first seconds include each agent's Run create: count only the window [start, until]
    return {run: [r for r in recs if start <= r[0] - r[1] and r[0] <= until] for run, recs in merged.items()}


def rate(records: dict[str, list], seconds: float) -> tuple[float, float]:
    """(calls per second over all agents, median seconds per call) of the accepted calls."""
    calls = [r for recs in records.values() for r in recs if not r[2]]
    return len(calls) / seconds, statistics.median([r[1] for r in calls]) if calls else float("nan")


def check_runs(api: client.ApiClient, namespace: str, runs: list[str]) -> list[str]:
    """Each recorded run's steps are 0..n-1 with an outcome (a step left intended is reported)."""
    custom = client.CustomObjectsApi(api)
    problems = []
    for run in runs:
        objs = list_objects(custom, namespace, run)
        indices = [o["spec"]["index"] for o in objs]
        if indices != list(range(len(indices))):
            problems.append(f"run {run}: indices are not 0..{len(indices) - 1}")
        left = [o["spec"]["index"] for o in objs if o["spec"].get("outcome") == "intended"]
        if len(left) > 1:  # the one under way when the clock stopped may stay intended
            problems.append(f"run {run}: {len(left)} steps left intended: {left[:5]}")
    return problems


# ----------------------------------------------------------------------------- scenarios

def apiserver_counters(api: client.ApiClient) -> dict[str, float]:
    """The API server's request counts by ``VERB resource[/subresource]`` (Reversi's group and
    ConfigMaps) and its time in each admission webhook (``webhook <name>`` and ``webhook <name>
    count``), from its /metrics."""
    resp = api.call_api("GET", api.configuration.host + "/metrics")
    resp.read()
    out: dict[str, float] = {}
    for line in resp.data.decode().splitlines():
        if line.startswith("apiserver_request_total{") and ('group="reversi.dev"' in line
                                                           or 'resource="configmaps"' in line):
            labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.index("}")].split(","))
            sub = labels["subresource"].strip('"')
            key = f"{labels['verb'].strip(chr(34))} {labels['resource'].strip(chr(34))}" + (f"/{sub}" if sub else "")
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("apiserver_admission_webhook_admission_duration_seconds_"):
            metric, rest = line.split("{", 1)
            name = rest.split('name="', 1)[1].split('"', 1)[0]
            key = f"webhook {name}" + (" count" if metric.endswith("_count") else "")
            if metric.endswith(("_sum", "_count")):
                out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def flowcontrol_waits(api: client.ApiClient) -> dict[str, list[float]]:
    """Per API Priority and Fairness level: [requests dispatched, seconds they waited for a seat in
    all, the level's nominal seats], from the API server's /metrics."""
    resp = api.call_api("GET", api.configuration.host + "/metrics")
    resp.read()
    out: dict[str, list[float]] = {}
    for line in resp.data.decode().splitlines():
        metric = line.split("{", 1)[0]
        if metric not in ("apiserver_flowcontrol_request_wait_duration_seconds_count",
                          "apiserver_flowcontrol_request_wait_duration_seconds_sum",
                          "apiserver_flowcontrol_nominal_limit_seats") or 'execute="false"' in line:
            continue
        level = line.split('priority_level="', 1)[1].split('"', 1)[0]
        row = out.setdefault(level, [0.0, 0.0, 0.0])
        row[("_count" not in metric) + ("seats" in metric)] += float(line.rsplit(" ", 1)[1])
    return out


def print_breakdown(before: dict[str, float], after: dict[str, float]) -> None:
    """What each recorded call cost the API server: requests by verb and resource, and the mean
    time of each webhook review (the difference of two :func:`apiserver_counters`; a recorded
    call is one RunStep create)."""
    diff = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}
    calls = diff.get("POST runsteps", 0.0)
    if not calls:
        return
    requests = {k: v for k, v in diff.items() if not k.startswith("webhook ") and "configmaps" not in k}
    print(f"      per recorded call: {sum(requests.values()) / calls:.2f} API requests ("
          + ", ".join(f"{k} {v / calls:.2f}" for k, v in sorted(requests.items(), key=lambda kv: -kv[1]))
          + ")", flush=True)
    for key, total in sorted(diff.items()):
        if key.startswith("webhook ") and not key.endswith(" count") and diff.get(f"{key} count"):
            count = diff[f"{key} count"]
            print(f"      {key[8:]}: {count / calls:.2f} reviews per call, mean {total / count * 1000:.1f} ms",
                  flush=True)


def _registered(api: client.ApiClient, admission: Any) -> Any:
    """The webhooks and policies of ``admission``'s first replica registered again (after a row
    measured with none)."""
    from reversi.adapters import webhooks

    replica = admission.replicas[0]
    webhooks.register(api, webhooks.url_client_config(f"https://127.0.0.1:{replica.webhook_port}",
                                                      (replica.cert_dir / "ca.crt").read_bytes()))


def load(kubeconfig: str, api: client.ApiClient, namespace: str, agent_counts: list[int], seconds: float,
         processes: int, admission: Any, breakdown: bool = False) -> tuple[list[dict], list[str]]:
    """For each agent count: the SDK's recorded calls (and, for one agent, calls of a tool with an
    idempotency key) with Reversi's admission, then with no webhook and no policy registered the
    plain ConfigMap writes and the bare RunSteps (the floor), each printed next to the floor."""
    rows, problems = [], []
    for agents in agent_counts:
        before = apiserver_counters(api) if breakdown else {}
        rec = drive("recorded", kubeconfig, namespace, agents, seconds, processes)
        if breakdown:
            print_breakdown(before, apiserver_counters(api))
        keyed = drive("keyed", kubeconfig, namespace, 1, seconds, 1) if agents == 1 else None
        remove_webhook_configurations(api)
        try:
            plain = drive("plain", kubeconfig, namespace, agents, seconds, processes)
            bare = drive("bare", kubeconfig, namespace, agents, seconds, processes)
        finally:
            _registered(api, admission)
        problems += check_runs(api, namespace, list(rec))
        (r_rate, r_p50), (p_rate, p_p50) = rate(rec, seconds), rate(plain, seconds)
        b_rate, b_p50 = rate(bare, seconds)
        if not (r_rate and p_rate and b_rate):
            print(f"  {agents:>3} agents: a row recorded no call in its window (recorded {r_rate:.1f}, plain "
                  f"{p_rate:.1f}, floor {b_rate:.1f} calls/s): the machine is too loaded to measure", flush=True)
            continue
        row = {"agents": agents, "recorded": r_rate, "plain": p_rate, "floor": b_rate, "ratio": r_rate / b_rate,
               "floor_ratio": b_rate / p_rate, "p50_recorded_ms": r_p50 * 1000, "p50_plain_ms": p_p50 * 1000,
               "p50_floor_ms": b_p50 * 1000, "p50_factor": r_p50 / b_p50}
        print(f"  {agents:>3} agents: floor (bare RunSteps) {b_rate:7.1f} calls/s, p50 {b_p50 * 1000:.1f} ms; its "
              f"ratio to plain ConfigMaps {row['floor_ratio']:.2f} ({p_rate:.1f} calls/s, p50 {p_p50 * 1000:.1f} ms)",
              flush=True)
        print(f"       recorded by the SDK: {r_rate:7.1f} calls/s = {row['ratio']:.2f}x the floor, p50 "
              f"{r_p50 * 1000:.1f} ms = {row['p50_factor']:.2f}x the floor's", flush=True)
        if keyed is not None:
            k_p50 = rate(keyed, seconds)[1]
            row["p50_keyed_factor"] = k_p50 / b_p50
            print(f"       a call with an idempotency key (claims it): p50 {k_p50 * 1000:.1f} ms = "
                  f"{row['p50_keyed_factor']:.2f}x the floor's", flush=True)
        rows.append(row)
    return rows, problems


def _admit_all(port: int, cert: str, key: str) -> None:
    """Serve, on 127.0.0.1:``port`` over TLS, a webhook that admits every review at once."""
    import ssl

    from aiohttp import web

    async def review(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": {"uid": body["request"]["uid"], "allowed": True}})

    app = web.Application(client_max_size=8 << 20)
    app.router.add_post("/{path:.*}", review)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=ctx, access_log=None, print=None)


def _serve_admit_all(api: client.ApiClient, folder: Path) -> Any:
    """Start :func:`_admit_all` in a process of its own and register it in place of Reversi's
    webhooks (same configurations, paths and match conditions); returns the process."""
    from reversi import certs
    from reversi.adapters import webhooks

    ca = certs.make_ca(folder)
    pair = certs.issue(ca, folder, "admit-all", "127.0.0.1", ip_addresses=("127.0.0.1",), server=True)
    port = free_port()
    proc = mp.get_context("spawn").Process(target=_admit_all, args=(port, str(pair.cert), str(pair.key)), daemon=True)
    proc.start()
    _wait(lambda: _answers(port), 30, "the admit-all webhook")
    webhooks.register(api, webhooks.url_client_config(f"https://127.0.0.1:{port}", ca.cert.read_bytes()))
    return proc


def _answers(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


FLOOR_ROWS = (("bare", "RunSteps, no admission, no SDK"),
              ("snapshot", "the same with the stamped snapshot"),
              ("recorded", "the SDK, no admission at all"),
              ("admit-all", "the SDK, a webhook that admits at once"))


@contextlib.contextmanager
def _own_namespace(api: client.ApiClient, name: str) -> Iterator[str]:
    """The namespace ``name`` with the benchmark's ToolManifest for the body; deleted after it, and
    waited for until it is gone (its RunSteps would slow the scenarios measured after it)."""
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name}})
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(G, V, name, "toolmanifests", LOAD_MANIFEST)
        yield name
    finally:
        core.delete_namespace(name)
        _wait(lambda: not _exists(core, name), 300, f"namespace {name} deleted")


def floor(kubeconfig: str, api: client.ApiClient, namespace: str, agent_counts: list[int], seconds: float,
          processes: int, folder: Path) -> None:
    """Print, for each count of ``agent_counts``, the rows of :data:`FLOOR_ROWS` next to the plain
    writes measured right before them (no Reversi webhook is registered while this runs). They
    run in a namespace of their own (``<namespace>-floor``), deleted before this returns: the
    admission webhook's forward-key LIST is filtered by the API server over every RunStep of the
    namespace, so the thousands of steps written here would slow the rows measured after them."""
    remove_webhook_configurations(api)
    with _own_namespace(api, f"{namespace}-floor") as own:
        for agents in agent_counts:
            plain_rate, plain_p50 = rate(drive("plain", kubeconfig, own, agents, seconds, processes), seconds)
            print(f"  {agents:>3} agents, plain writes: {plain_rate:7.1f} calls/s, p50 {plain_p50 * 1000:.1f} ms",
                  flush=True)
            for kind, what in FLOOR_ROWS:
                server = _serve_admit_all(api, folder) if kind == "admit-all" else None
                try:
                    r_rate, r_p50 = rate(drive("recorded" if server else kind, kubeconfig, own, agents, seconds,
                                               processes), seconds)
                finally:
                    if server is not None:
                        remove_webhook_configurations(api)
                        server.kill()
                print(f"      {what:<40} {r_rate:7.1f} calls/s  ratio {r_rate / plain_rate:.2f}   p50 "
                      f"{r_p50 * 1000:.1f} ms ({r_p50 / plain_p50:.2f}x)", flush=True)


def _exists(core: client.CoreV1Api, namespace: str) -> bool:
    try:
        core.read_namespace(namespace)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


def crowd(kubeconfig: str, api: client.ApiClient, namespace: str, admission: Any, seconds: float,
          filler: int = 20_000) -> dict[str, float]:
    """One agent's median per call (s) in an empty namespace and after ``filler`` RunSteps of other
    runs were written into it (by hand, with the webhooks off: they are registered again for the
    measure, as ``admission``'s replicas register them); the namespace is deleted at the end
    (:func:`_own_namespace`)."""
    from concurrent.futures import ThreadPoolExecutor

    from reversi.adapters import webhooks

    custom = client.CustomObjectsApi(api)
    replica = admission.replicas[0]
    ours = webhooks.url_client_config(f"https://127.0.0.1:{replica.webhook_port}",
                                      (replica.cert_dir / "ca.crt").read_bytes())
    with _own_namespace(api, f"{namespace}-crowd") as own:  # its deletion needs no review (CLEANUP_MATCH)
        time.sleep(1.0)  # the admission server's manifest index sees the new manifest
        empty = rate(drive("keyed", kubeconfig, own, 1, seconds, 1), seconds)[1]

        def fill(i: int) -> None:
            custom.create_namespaced_custom_object(G, V, own, "runsteps", step_body(own, f"filler-{i // 1000}", {
                "index": i % 1000, "tool": TOOL, "args": {"order_id": f"f-{i}"}, "outcome": "succeeded"}))

        remove_webhook_configurations(api)

        def unchecked() -> bool | None:  # the API server no longer calls the webhook (its informer saw the delete)
            try:
                custom.create_namespaced_custom_object(G, V, own, "runsteps", step_body(own, "filler-0", {
                    "index": 0, "tool": TOOL, "args": {}, "outcome": "succeeded"}), dry_run="All")
            except ApiException:
                return None
            return True

        try:
            _wait(unchecked, 30, "the webhooks to be unregistered")
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(fill, range(filler)))
        finally:
            webhooks.register(api, ours)
        crowded = rate(drive("keyed", kubeconfig, own, 1, seconds, 1), seconds)[1]
    return {"empty_s": empty, "crowded_s": crowded, "filler": filler}


def gap(kubeconfig: str, namespace: str, seconds: float, processes: int, op: Any,
        victim: str, down: float = 5.0, halt: bool = False) -> dict[str, float]:
    """4 agents record; ``victim`` (the operator, one or every admission replica) is SIGKILLed at
    a third of the time and started again ``down`` seconds later. With ``halt``, a Halt of a
    tool no agent calls is applied halfway through the outage, and a fifth agent calls that tool
    until it is refused: ``halt_s`` is the time from the Halt's create to that refusal."""
    halted: dict[str, float] = {}

    def fault(start: float) -> None:
        # the fifth agent opens its run first: opening a Run crosses the webhooks
        probe = Recorder.open(namespace, f"halt-{uuid.uuid4().hex[:5]}", manifest="bench",
                              api=config.new_client_from_config(config_file=kubeconfig)) if halt else None
        time.sleep(max(0.0, start + seconds / 3 - time.time()))
        op.kill()
        killed = time.monotonic()
        if probe is not None:
            time.sleep(down / 2)
            halted["halt_s"] = _halt_in_force_seconds(probe, namespace)
        time.sleep(max(0.0, killed + down - time.monotonic()))
        op.start()

    bounds: list[float] = []
    records = drive("recorded", kubeconfig, namespace, 4, seconds, processes, during=fault, window=bounds)
    return {**gaps(records, bounds), **halted}


def _halt_in_force_seconds(rec: Recorder, namespace: str) -> float:
    """Seconds from a Halt's create (of :data:`HALTED_TOOL`) to the first call of it ``rec``
    records refused."""
    from reversi.sdk import Halted

    api = rec.api
    client.CustomObjectsApi(api).create_namespaced_custom_object(G, V, namespace, "halts", {
        "apiVersion": f"{G}/{V}", "kind": "Halt", "metadata": {"name": "bench-halt"},
        "spec": {"reason": "bench", "scope": {"tool": HALTED_TOOL}}})
    applied = time.monotonic()
    try:
        while time.monotonic() - applied < 30:
            try:
                rec.begin(HALTED_TOOL, {"order_id": "h"})
            except Halted:
                return time.monotonic() - applied
        return float("inf")
    finally:
        client.CustomObjectsApi(api).delete_namespaced_custom_object(G, V, namespace, "halts", "bench-halt")


def gaps(records: dict[str, list], bounds: list[float]) -> dict[str, float]:
    """Of the agents' ``records`` in the window ``bounds`` (start, end): calls refused, calls
    recorded, and the longest time (s) with no call recorded by any agent (the window's edges count)."""
    calls = sorted(r for recs in records.values() for r in recs)
    ends = [bounds[0], *(r[0] for r in calls if not r[2]), bounds[1]]
    return {"refused": sum(1 for r in calls if r[2]), "recorded": len(ends) - 2,
            "longest_gap_s": max(b - a for a, b in itertools.pairwise(ends))}


def _wait(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def _loadavg() -> str:
    """This machine's load (its first three figures), which the ratios are read next to."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def _rollback_seconds(api: client.ApiClient, namespace: str, tag: str, steps: int) -> float:
    """Record ``steps`` calls of box.put in a new Run, roll it back at parallelism 1 and return the
    seconds from the request's create to its final phase (every step compensated, checked)."""
    custom = client.CustomObjectsApi(api)
    rec = Recorder.open(namespace, f"undo-{tag}", manifest="undo", api=api, scope={"actor": "bench"})
    for i in range(steps):
        rec.call("box.put", {"n": i}, lambda a: {"ok": True})
    body = {"apiVersion": f"{G}/{V}", "kind": "RollbackRequest", "metadata": {"name": f"undo-{tag}"},
            "spec": {"runRef": {"name": f"undo-{tag}"}, "parallelism": 1}}
    started = time.monotonic()
    custom.create_namespaced_custom_object(G, V, namespace, "rollbackrequests", body)

    def final() -> dict | None:
        obj = custom.get_namespaced_custom_object(G, V, namespace, "rollbackrequests", f"undo-{tag}")
        return obj if (obj.get("status") or {}).get("phase") in ("Succeeded", "Incomplete", "Failed") else None

    done = _wait(final, 300, f"rollback {tag}")
    seconds = time.monotonic() - started
    if done["status"]["phase"] != "Succeeded":
        raise RuntimeError(f"rollback {tag} ended {done['status']['phase']}")
    return seconds


def interference(kubeconfig: str, api: client.ApiClient, namespace: str, processes: int) -> dict[str, Any]:
    """A 10-step parallelism-1 rollback idle, then while 16 agents record; with /proc/loadavg after each."""
    idle = _rollback_seconds(api, namespace, "idle", 10)
    box: dict[str, Any] = {"load_idle": _loadavg()}

    def during(start: float) -> None:
        time.sleep(max(0.0, start - time.time()))
        before = flowcontrol_waits(api)
        box["busy"] = _rollback_seconds(api, namespace, "busy", 10)
        box["load_busy"] = _loadavg()
        after = flowcontrol_waits(api)
        # each level's requests while the rollback ran under load, and their mean wait for a seat
        box["waits"] = {level: (n - before.get(level, [0.0])[0], (s - before.get(level, [0.0, 0.0])[1]), seats)
                        for level, (n, s, seats) in after.items() if n > before.get(level, [0.0])[0]}

    # the agents record for longer than the rollback can take; the measured run is the rollback's
    drive("recorded", kubeconfig, namespace, 16, max(30.0, 3 * idle), processes, during=during)
    return {"idle_s": idle, "busy_s": box["busy"], "ratio": box["busy"] / idle, **box}


def move(api: client.ApiClient, namespace: str, steps: int = 3000) -> dict[str, float]:
    """A Run of Reversi 0.1 with ``steps`` inline steps: seconds to moved, and to its dry run Planned."""
    custom = client.CustomObjectsApi(api)
    inline = [{"index": i, "tool": TOOL, "args": {"order_id": f"m-{i}", "amount": i}, "outcome": "succeeded",
               "result": {"id": f"ord-m-{i}"}} for i in range(steps)]
    run = {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": "legacy"},
           "spec": {"scope": {"actor": "bench"}, "manifestRef": {"name": "bench"}, "steps": inline}}
    started = time.monotonic()
    custom.create_namespaced_custom_object(G, V, namespace, "runs", run)
    _wait(lambda: (custom.get_namespaced_custom_object(G, V, namespace, "runs", "legacy").get("status") or {})
          .get("movedSteps") == steps, 300, "the inline steps moved")
    moved = time.monotonic() - started
    custom.create_namespaced_custom_object(G, V, namespace, "rollbackrequests", {
        "apiVersion": f"{G}/{V}", "kind": "RollbackRequest", "metadata": {"name": "legacy-plan"},
        "spec": {"runRef": {"name": "legacy"}, "dryRun": True}})
    _wait(lambda: (custom.get_namespaced_custom_object(G, V, namespace, "rollbackrequests", "legacy-plan")
                   .get("status") or {}).get("phase") == "Planned", 300, "the dry run planned")
    return {"moved_s": moved, "planned_s": time.monotonic() - started}


def rolling(seconds: float, processes: int) -> int:
    """The rolling scenario: a real-node control plane of its own (``<cache>/cluster-bench-real``),
    the chart installed with its image, 4 agents recording while ``helm upgrade`` rolls the
    operator and the admission replicas a third of the way in."""
    from reversi_devcluster import build, realnode
    from reversi_devcluster.cluster import ClusterSettings

    sys.path.insert(0, str(ROOT))
    from demo import on_real_node

    why = realnode.unsupported()
    if why:
        print(f"rolling: not measured, no real node on this machine ({why})")
        return 0
    cluster = Cluster(ClusterSettings(real_node=True, cluster_dir=build.cache_root() / "cluster-bench-real",
                                      apiserver_port=17643, etcd_port=13679, etcd_peer_port=13680,
                                      kubelet_port=21650, node_bridge="reversi-bench", node_pod_cidr="10.244.110.0/24"))
    cluster.up(log=lambda *_: None)
    kubeconfig = str(cluster.paths.admin_kubeconfig)
    api = config.new_client_from_config(config_file=kubeconfig)
    try:
        on_real_node.install_chart(api, cluster.paths.admin_kubeconfig)
        namespace = f"record-rolling-{uuid.uuid4().hex[:6]}"
        client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
        client.CustomObjectsApi(api).create_namespaced_custom_object(G, V, namespace, "toolmanifests", LOAD_MANIFEST)
        time.sleep(1.0)  # the admission replicas' manifest index sees the new manifest
        took: list[float] = []

        def upgrade(start: float) -> None:
            time.sleep(max(0.0, start + seconds / 3 - time.time()))
            took.append(on_real_node.upgrade_chart(cluster.paths.admin_kubeconfig,
                                                   {"podAnnotations": {"reversi.dev/rolled": str(time.time())}}))

        print(f"rolling: 4 agents record for {seconds:.0f} s; helm upgrade rolls the operator and every admission "
              "replica a third of the way in", flush=True)
        bounds: list[float] = []
        g = gaps(drive("recorded", kubeconfig, namespace, 4, seconds, processes, during=upgrade, window=bounds),
                 bounds)
        print(f"  the upgrade took {took[0] if took else float('nan'):.1f} s; refused calls {g['refused']}, recorded "
              f"{g['recorded']}, longest window without a recorded call {g['longest_gap_s']:.2f} s (target: 0 "
              "refused, <= 1 s)", flush=True)
    finally:
        cluster.down(quiet=True)
    return 0


# ----------------------------------------------------------------------------- --apf

#: the release the chart's flowcontrol objects are rendered for; its ServiceAccounts' names follow from it
APF_RELEASE = "bench"
APF_FULLNAME = f"{APF_RELEASE}-reversi"
APF_IDENTITIES = {"operator": APF_FULLNAME, "admission": f"{APF_FULLNAME}-admission", "agents": "bench-agent"}
APF_TIMEOUT = 30


def _flowcontrol_objects(api: client.ApiClient, namespace: str) -> list[dict]:
    """The chart's PriorityLevelConfiguration and FlowSchemas for release APF_RELEASE in ``namespace``,
    exactly as ``helm template`` renders them for this server (the level first: a FlowSchema names it)."""
    version = client.VersionApi(api).get_code(_request_timeout=APF_TIMEOUT).git_version
    out = subprocess.run([binary("helm", "helm"), "template", APF_RELEASE, ROOT / "charts" / "reversi",
                          "--namespace", namespace, "--kube-version", version, "-s", "templates/flowcontrol.yaml"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return sorted((o for o in yaml.safe_load_all(out) if o), key=lambda o: o["kind"] != "PriorityLevelConfiguration")


def _token_kubeconfig(admin: Path, token: str, path: Path) -> Path:
    """A kubeconfig of the admin's cluster (server, CA) that authenticates with ``token`` alone."""
    cluster = yaml.safe_load(admin.read_text())["clusters"][0]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": "sa"}}], "current-context": "sa"}))
    path.chmod(0o600)
    return path


def _priority_level(api: client.ApiClient, token: str) -> str:
    """The UID of the priority level the API server puts a request made with ``token`` in (its
    X-Kubernetes-PF-PriorityLevel-UID header; APF classifies before authorization)."""
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert = api.configuration.host, api.configuration.ssl_ca_cert
    with client.ApiClient(cfg) as bare:
        answer = bare.rest_client.request("GET", cfg.host + "/apis/batch/v1/jobs", _request_timeout=APF_TIMEOUT,
                                          headers={"Authorization": f"Bearer {token}"})
        return answer.getheader("X-Kubernetes-PF-PriorityLevel-UID") or ""


@contextlib.contextmanager
def apf_identities(api: client.ApiClient, admin: Path, folder: Path) -> Iterator[dict[str, Any]]:
    """``--apf``: the chart's flowcontrol objects created for release APF_RELEASE in a new namespace,
    and a ServiceAccount per identity of APF_IDENTITIES there, bound to cluster-admin. Yields the
    namespace and a kubeconfig path per identity, once the API server puts the operator's requests
    in the chart's level; deletes all of it afterwards."""
    namespace = f"reversi-apf-{uuid.uuid4().hex[:5]}"
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    flow = client.FlowcontrolApiserverV1Api(api)
    create = {"PriorityLevelConfiguration": flow.create_priority_level_configuration,
              "FlowSchema": flow.create_flow_schema}
    delete = {"PriorityLevelConfiguration": flow.delete_priority_level_configuration,
              "FlowSchema": flow.delete_flow_schema}
    made: list[tuple[str, str]] = []
    bindings: list[str] = []
    core.create_namespace({"metadata": {"name": namespace}}, _request_timeout=APF_TIMEOUT)
    try:
        level = ""
        for obj in _flowcontrol_objects(api, namespace):
            stored = create[obj["kind"]](obj, _request_timeout=APF_TIMEOUT)
            made.append((obj["kind"], obj["metadata"]["name"]))
            if obj["kind"] == "PriorityLevelConfiguration":
                level = stored.metadata.uid
        found: dict[str, Any] = {"namespace": namespace}
        for who, account in APF_IDENTITIES.items():
            core.create_namespaced_service_account(namespace, {"metadata": {"name": account}},
                                                   _request_timeout=APF_TIMEOUT)
            rbac.create_cluster_role_binding({
                "metadata": {"name": f"{namespace}-{who}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]},
                _request_timeout=APF_TIMEOUT)
            bindings.append(f"{namespace}-{who}")
            token = core.create_namespaced_service_account_token(account, namespace, {
                "spec": {"expirationSeconds": 6 * 3600}}, _request_timeout=APF_TIMEOUT).status.token
            found[who] = _token_kubeconfig(admin, token, folder / f"{namespace}-{who}.kubeconfig")
            found[f"{who}_token"] = token
        _wait(lambda: _priority_level(api, found["operator_token"]) == level, 30, "the chart's priority level in force")
        yield found
    finally:
        for name in bindings:
            rbac.delete_cluster_role_binding(name, _request_timeout=APF_TIMEOUT)
        for kind, name in reversed(made):
            delete[kind](name, _request_timeout=APF_TIMEOUT)
        core.delete_namespace(namespace, _request_timeout=APF_TIMEOUT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default="1,4,16,32", help="agent counts of the load scenario")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each measured window")
    parser.add_argument("--processes", type=int, default=4, help="worker processes the agents are spread over")
    parser.add_argument("--only", default="floor,load,gap,interference,move",
                        help="scenarios to run: floor, load, gap, interference, move; crowd and rolling (a real "
                             "node) when named")
    parser.add_argument("--replicas", type=int, default=2, help="admission server replicas (the chart's default: 2)")
    parser.add_argument("--gap-only", default="", help="gap: only the victim whose name starts so (e.g. every)")
    parser.add_argument("--admission-down", type=float, default=60.0,
                        help="gap: seconds every admission replica stays SIGKILLed")
    parser.add_argument("--apf", action="store_true",
                        help="the chart's FlowSchemas and priority level in force, and the operator, the admission "
                             "replicas and the agents each with a ServiceAccount's token (the admin is exempt)")
    parser.add_argument("--breakdown", action="store_true",
                        help="load: also print the API requests and webhook time of each recorded call")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    if "rolling" in only:
        rolling(max(args.seconds, 45.0), args.processes)
        only.discard("rolling")
        if not only:
            return 0
    cluster = Cluster()
    started_cluster = not cluster.is_running()
    if started_cluster:
        cluster.up()
    kubeconfig = str(cluster.paths.admin_kubeconfig)
    api = config.new_client_from_config(config_file=kubeconfig)
    apply_crds(api)
    logs = cluster.paths.logs
    identities: dict[str, Any] = {"operator": cluster.paths.admin_kubeconfig,
                                  "admission": cluster.paths.admin_kubeconfig}
    apf = contextlib.ExitStack()
    if args.apf:
        identities = apf.enter_context(apf_identities(api, cluster.paths.admin_kubeconfig, logs))
        kubeconfig = str(identities["agents"])
        os.environ["REVERSI_LEASE_NAMESPACE"] = identities["namespace"]  # as the chart's release namespace
        print(f"apf: the chart's priority level and FlowSchemas in force; the operator, the admission replicas and "
              f"the agents as ServiceAccounts of {identities['namespace']}", flush=True)
    admission = AdmissionPool(identities["admission"], logs / "bench-admission.log", webhook_port=free_port(),
                              replicas=args.replicas)
    op = OperatorProcess(identities["operator"], logs / "bench-operator.log", metrics_port=free_port())
    namespace = f"record-load-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api)
    problems: list[str] = []
    try:
        core.create_namespace({"metadata": {"name": namespace}})
        for manifest in (LOAD_MANIFEST, UNDO_MANIFEST):
            client.CustomObjectsApi(api).create_namespaced_custom_object(G, V, namespace, "toolmanifests", manifest)
        op.start()  # first: each row runs next to the operator, which writes each new Run's status once
        if "floor" in only:
            counts = [int(a) for a in args.agents.split(",")]
            print("floor: what each layer of a recorded call costs, next to the plain writes", flush=True)
            floor(kubeconfig, api, namespace, sorted({counts[0], counts[-1]}), args.seconds, args.processes,
                  logs / "bench-admit-all")
        admission.start()
        time.sleep(1.0)  # the admission server's manifest index sees the new manifest
        if "load" in only:
            print(f"load: each agent records as fast as it can for {args.seconds:.0f} s, then makes the same two "
                  "writes on plain ConfigMaps", flush=True)
            rows, problems = load(kubeconfig, api, namespace, [int(a) for a in args.agents.split(",")],
                                  args.seconds, args.processes, admission, args.breakdown)
            if not rows:
                raise SystemExit("load: no row could be measured")
            first, last = rows[0], rows[-1]
            keyed = f", keyed {first['p50_keyed_factor']:.2f}x (target <= 1.7)" if "p50_keyed_factor" in first else ""
            print(f"  {last['agents']} agents: {last['ratio']:.2f}x the floor's rate (target >= 0.85); "
                  f"{first['agents']} agent: median {first['p50_factor']:.2f}x the floor's (target <= 1.25){keyed}")
        if "gap" in only:
            victims: list[tuple[str, Any, float]] = [
                ("operator", op, 5.0), ("one admission replica", admission.replicas[0], 5.0),
                ("every admission replica", admission, args.admission_down)]
            victims = [v for v in victims if not args.gap_only or v[0].startswith(args.gap_only)]
            for victim, proc, down in victims:
                window = max(args.seconds, 15.0, down * 1.5)
                every = victim.startswith("every")
                print(f"gap: 4 agents record for {window:.0f} s; {victim} is SIGKILLed and started again {down:.0f} s "
                      "later" + (" (a Halt is applied halfway through)" if every else ""), flush=True)
                g = gap(kubeconfig, namespace, window, args.processes, proc, victim, down, halt=every)
                print(f"  refused calls {g['refused']}, recorded {g['recorded']}, longest window without a recorded "
                      f"call {g['longest_gap_s']:.2f} s (target: 0 refused, <= 1 s)"
                      + (f"; the Halt refused its first call {g['halt_s']:.2f} s after its create (target <= 1 s)"
                         if "halt_s" in g else ""), flush=True)
        if "interference" in only:
            print("interference: a 10-step rollback at parallelism 1, idle, then while 16 agents record", flush=True)
            i = interference(kubeconfig, api, namespace, args.processes)
            print(f"  idle {i['idle_s']:.1f} s, under load {i['busy_s']:.1f} s: ratio {i['ratio']:.2f} "
                  f"(target <= 1.2){' with --apf' if args.apf else ''}; /proc/loadavg after the idle one "
                  f"{i['load_idle']}, after the one under load {i['load_busy']}", flush=True)
            print("  while it ran under load, requests per priority level (API Priority and Fairness), their mean "
                  "wait for a seat, the level's nominal seats: " + ", ".join(
                      f"{level} {n:.0f} ({s / n * 1000:.2f} ms, {seats:.0f})"
                      for level, (n, s, seats) in sorted(i["waits"].items(), key=lambda kv: -kv[1][0])), flush=True)
        if "crowd" in only:
            print("crowd: one agent in an empty namespace, then among 20,000 RunSteps of other runs", flush=True)
            cr = crowd(kubeconfig, api, namespace, admission, args.seconds)
            print(f"  median per call {cr['empty_s'] * 1000:.1f} ms empty, {cr['crowded_s'] * 1000:.1f} ms among "
                  f"{cr['filler']:,} other steps: {cr['crowded_s'] / cr['empty_s']:.2f}x", flush=True)
        if "move" in only:
            print("move: a Run of Reversi 0.1 with 3,000 inline steps", flush=True)
            m = move(api, namespace)
            print(f"  moved into RunSteps after {m['moved_s']:.1f} s, its dry run Planned after {m['planned_s']:.1f} s "
                  "(target <= 30 s)", flush=True)
    finally:
        op.stop()
        admission.stop()
        remove_webhook_configurations(api)
        try:
            core.delete_namespace(namespace)
        except ApiException:
            pass
        apf.close()
        if started_cluster:
            cluster.down()
    if problems:
        print("recorded runs are wrong: " + "; ".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
