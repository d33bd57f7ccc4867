"""Chaos: rollbacks while the operator is SIGKILLed, the control plane restarted, the node agent
lost and every watch cut, judged against downstream truth (docs/development.md#chaos).

``make e2e`` runs the short variant (8 rollbacks, every kind of fault at least once); ``make
chaos`` runs 100 (``REVERSI_CHAOS_ROLLBACKS``). Every random choice — the runs' shapes, the kind
of each fault, the gaps between faults and how long a component stays down — comes from one
seed, printed with a summary table; ``REVERSI_CHAOS_SEED=<seed>`` replays the same runs and the
same fault sequence (the exact moments a fault lands among the operator's passes depend on the
machine's timing, so a replay reproduces the schedule, not every interleaving).

Faults (one at a time, each while rollbacks are in flight):

- ``operator``: SIGKILL the operator, keep it down 0-2 s, start it again;
- ``watches``: SIGKILL kube-apiserver alone and restart it: every watch and connection of the
  operator, the controller manager and the node agent is cut;
- ``control-plane``: SIGKILL etcd and kube-apiserver, keep them down 0-3 s, restart both on the
  same etcd data;
- ``node-agent``: SIGKILL the node agent, keep it down 0-2 s, restart it on its state folder:
  pods that were running are lost (their processes killed, the pods marked Failed), so their
  Jobs fail and the operator retries them (same idempotency key).

Invariants, checked per step from the downstream server's own records (every effectful call
with its idempotency key, and whether it was a replay) and the API objects:

- **final**: every request ends (Succeeded, Incomplete or Failed) within ``FINAL_BOUND_SECONDS``
  after the last fault, and releases its Run;
- **no double execution**: one compensator Job per (step, attempt), attempts 1..n with no gap,
  no container restarted, at most one downstream call per compensator pod and at most one real
  (not replayed) effect per step. A Job whose controller started a second pod is counted and
  listed, not failed: Kubernetes may start a Job's program twice even with ``backoffLimit: 0``
  and ``restartPolicy: Never`` (the Job controller lost the answer to its pod create while the
  API server was killed); the compensator's idempotency key makes the second run a replay, and
  the one-real-effect check proves it;
- **no lost verdict**: a step's final undo state (the RunStep's ``status.undo``) matches the
  downstream — compensated and verified if and only if the charge is refunded (the reservation
  released) — and the request's report lists exactly the compensated steps;
- **no phantom compensation**: a step reported compensated has exactly one real effect in the
  downstream with its own idempotency key.
"""

from __future__ import annotations

import collections
import json
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

import pytest
from kubernetes.client.rest import ApiException

from reversi.adapters.journal import step_body
from tests.integration.conftest import manifest_body

pytestmark = pytest.mark.cluster

GROUP, VERSION = "reversi.dev", "v1alpha1"
SEED = int(os.environ.get("REVERSI_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
ROLLBACKS = int(os.environ.get("REVERSI_CHAOS_ROLLBACKS", "8"))
#: rollbacks in flight at once
IN_FLIGHT = int(os.environ.get("REVERSI_CHAOS_IN_FLIGHT", "8"))
#: every request is final this long after the last fault ended (the components are back)
FINAL_BOUND_SECONDS = 150.0
KINDS = ("operator", "watches", "control-plane", "node-agent")
WEIGHTS = (5, 2, 2, 2)
FINAL = ("Succeeded", "Incomplete", "Failed")
COUNTER = Path(__file__).with_name("chaos_counter.py")


@dataclass
class Step:
    index: int
    kind: str  # "charge" (refund, read back by get_charge) or "reservation" (release, get_reservation)
    object_id: str

    def effect_path(self) -> str:
        if self.kind == "charge":
            return "/payments/refunds"
        return f"/inventory/reservations/{self.object_id}/release"


@dataclass
class Rollback:
    run: str
    steps: list[Step]
    request: str = ""
    created_at: float | None = None
    final_at: float | None = None
    phase: str | None = None


@dataclass
class Fault:
    kind: str
    at: float
    down: float
    took: float = 0.0
    in_flight: int = 0


@dataclass
class Checks:
    """Invariant checks: how many ran, and every failure (with what to look at)."""

    counts: collections.Counter = field(default_factory=collections.Counter)
    failures: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: Callable[[], str]) -> None:
        self.counts[name] += 1
        if not ok:
            self.failures.append(f"{name}: {detail()}")


def retrying(what: str, fn: Callable[[], Any], timeout: float = 120) -> Any:
    """``fn()`` until it returns: while the operator (its webhooks) or the API server is down,
    writes fail; an AlreadyExists after a lost answer means the earlier try went through."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except ApiException as err:
            if err.status == 409:
                return None
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} kept failing for {timeout:.0f}s: {err.status} {err.reason}") from err
        except Exception as err:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} kept failing for {timeout:.0f}s: {err}") from err
        time.sleep(0.2)


class Monkey(threading.Thread):
    """Injects faults one at a time, from its own seeded random source, until told to stop."""

    def __init__(self, rng: random.Random, cluster, operator, in_flight: Callable[[], int], min_faults: int,
                 log: Callable[[str], None]):
        super().__init__(daemon=True, name="chaos-monkey")
        self.rng = rng
        self.cluster = cluster
        self.operator = operator
        self.in_flight = in_flight
        self.min_faults = min_faults
        self.log = log
        self.faults: list[Fault] = []
        self.error: BaseException | None = None
        self.enough = threading.Event()  # set by the driver: all requests created (or all final)
        self.halt = threading.Event()    # set by the driver: stop now
        self.t0 = time.monotonic()
        self.stopped_at: float | None = None
        self.first = list(KINDS)
        rng.shuffle(self.first)

    def next_kind(self) -> str:
        """Every kind once first (in a seeded order), then weighted draws."""
        n = len(self.faults)
        return self.first[n] if n < len(self.first) else self.rng.choices(KINDS, WEIGHTS)[0]

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                if self.enough.is_set() and len(self.faults) >= self.min_faults:
                    break
                gap = self.rng.uniform(0.5, 2.5)
                kind = self.next_kind()
                down = self.rng.uniform(0, 3.0 if kind == "control-plane" else 2.0)
                if self.halt.wait(gap):
                    break
                self.inject(Fault(kind, time.monotonic() - self.t0, down, in_flight=self.in_flight()))
        except BaseException as err:  # noqa: BLE001 - reported by the test
            self.error = err
        finally:
            self.stopped_at = time.monotonic()

    def inject(self, fault: Fault) -> None:
        started = time.monotonic()
        quiet = lambda *_: None  # noqa: E731
        if fault.kind == "operator":
            self.operator.kill()
            time.sleep(fault.down)  # the operator is down for a while (seeded, short)
            self.operator.start()
        elif fault.kind == "watches":
            self.cluster.restart(["kube-apiserver"], down_seconds=fault.down, log=quiet)
        elif fault.kind == "control-plane":
            self.cluster.restart(["etcd", "kube-apiserver"], down_seconds=fault.down, log=quiet)
        else:
            self.cluster.restart(["node-agent"], down_seconds=fault.down, log=quiet)
        fault.took = time.monotonic() - started
        self.faults.append(fault)
        self.log(f"t={fault.at:6.1f}s fault {len(self.faults):3d} {fault.kind:<13} down {fault.down:4.1f}s "
                 f"back after {fault.took:4.1f}s, {fault.in_flight} rollbacks in flight")


@pytest.fixture
def chaos_cluster(cluster, operator):
    """The cluster and operator for a chaos test; afterwards every component it killed is started
    again and waited for (etcd's data kept), and the operator is running, whatever happened."""
    yield cluster
    try:
        cluster.start_stopped(log=lambda *_: None)
    finally:
        if not operator.alive():
            operator.start()
    assert cluster.is_running(), "the control plane did not come back after the chaos test"


def apply_counting_manifest(rv, executions: Path) -> None:
    """The test ToolManifest, with compensators and readers run by ``chaos_counter.py``, which
    writes a line to ``executions`` for every execution (its Job and pod, from the downward API)."""
    body = manifest_body(rv.downstream.url)
    runner = body["spec"]["runners"][0]
    runner["command"] = [sys.executable, str(COUNTER)]
    runner["env"] += [
        {"name": "REVERSI_CHAOS_EXEC_LOG", "value": str(executions)},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "JOB_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['job-name']"}}},
    ]
    rv.manifest = rv.create("toolmanifests", body)


def make_workload(rv, rng: random.Random) -> list[Rollback]:
    """ROLLBACKS runs of 1-3 steps (charges and reservations, independent), recorded before any fault."""
    rollbacks = []
    for i in range(ROLLBACKS):
        steps, specs = [], []
        for index in range(rng.randint(1, 3)):
            order = f"o-chaos-{i}-{index}"
            if rng.random() < 0.6:
                amount = rng.randint(1, 999)
                charge = rv.charge(order, amount=amount)
                steps.append(Step(index, "charge", charge["id"]))
                specs.append(rv.step(index, "payments.create_charge",
                                     {"order_id": order, "amount": amount, "customer": "cus_9"}, charge))
            else:
                reservation = rv.reserve(order)
                steps.append(Step(index, "reservation", reservation["id"]))
                specs.append(rv.step(index, "inventory.reserve",
                                     {"sku": "sku-mug", "qty": 1, "order_id": order}, reservation))
        name = f"chaos-{i}"
        rv.run(name, [])
        for spec in specs:
            rv.custom.create_namespaced_custom_object(GROUP, VERSION, rv.ns, "runsteps", step_body(rv.ns, name, spec))
        rollbacks.append(Rollback(name, steps))
    return rollbacks


@pytest.mark.timeout(max(600, 300 + 25 * ROLLBACKS))  # 100 took 21 min on a busy 2-core machine
def test_rollbacks_survive_killed_operators_restarted_control_plane_lost_pods_and_cut_watches(rv, chaos_cluster,
                                                                                             operator):
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    log(f"chaos: seed {SEED} (replay: REVERSI_CHAOS_SEED={SEED} REVERSI_CHAOS_ROLLBACKS={ROLLBACKS}), "
        f"{ROLLBACKS} rollbacks, {IN_FLIGHT} in flight")
    started = time.monotonic()
    rng = random.Random(SEED)
    workload_rng, fault_rng = random.Random(rng.random()), random.Random(rng.random())
    rv.downstream.post("/_reset", {"stock": {"sku-mug": 10 * ROLLBACKS + 10}})
    executions = chaos_cluster.paths.root / "chaos" / f"{rv.ns}.jsonl"  # not under /tmp: pods mount their own
    executions.parent.mkdir(exist_ok=True)
    executions.unlink(missing_ok=True)
    apply_counting_manifest(rv, executions)
    rollbacks = make_workload(rv, workload_rng)
    # refunds answer after 1 s (the effect happens at once): compensations stay in flight
    rv.downstream.fault("/payments/refunds", "timeout", times=10 * ROLLBACKS, delay_s=1)
    pending = list(rollbacks)
    active: dict[str, Rollback] = {}
    monkey = Monkey(fault_rng, chaos_cluster, operator, lambda: len(active),
                    min_faults=max(len(KINDS) + 2, ROLLBACKS // 2), log=log)
    setup = time.monotonic() - started
    monkey.start()
    try:
        while pending or active:
            while pending and len(active) < IN_FLIGHT:
                r = pending.pop(0)
                r.request = f"undo-{r.run}"
                retrying(f"creating RollbackRequest {r.request}",
                         lambda r=r: rv.request(r.request, r.run, parallelism=2, retries=5,
                                                backoff={"baseMs": 200, "maxMs": 2000}))
                r.created_at = time.monotonic()
                active[r.request] = r
            if not pending:
                monkey.enough.set()
            try:
                items = rv.custom.list_namespaced_custom_object(GROUP, VERSION, rv.ns, "rollbackrequests",
                                                                _request_timeout=5)["items"]
            except Exception:  # noqa: BLE001 - the API server is down: look again
                items = []
            for item in items:
                name = item["metadata"]["name"]
                phase = (item.get("status") or {}).get("phase")
                if name in active and phase in FINAL:
                    done = active.pop(name)
                    done.phase, done.final_at = phase, time.monotonic()
            if not active and not pending:
                break
            if monkey.stopped_at is not None:
                left = FINAL_BOUND_SECONDS - (time.monotonic() - monkey.stopped_at)
                assert left > 0, (f"requests {sorted(active)} not final {FINAL_BOUND_SECONDS:.0f}s after the last "
                                  f"fault; replay with REVERSI_CHAOS_SEED={SEED}\n" + diagnose(rv, sorted(active)))
            time.sleep(0.3)
    finally:
        monkey.enough.set()
        monkey.halt.set()
        monkey.join(timeout=120)
    assert monkey.error is None, f"injecting a fault failed: {monkey.error!r}"
    faults_end = monkey.stopped_at or time.monotonic()
    after = max((r.final_at - faults_end for r in rollbacks if r.final_at), default=0.0)
    wall = time.monotonic() - started

    runs = [json.loads(line) for line in executions.read_text().splitlines()] if executions.exists() else []
    checks = check_invariants(rv, rollbacks, runs)
    summary(log, rollbacks, monkey.faults, checks, setup, wall, max(after, 0.0), runs)
    assert not checks.failures, (f"{len(checks.failures)} invariant failures (replay with REVERSI_CHAOS_SEED={SEED} "
                                 f"REVERSI_CHAOS_ROLLBACKS={ROLLBACKS}):\n" + "\n".join(checks.failures[:40]))
    kinds = collections.Counter(f.kind for f in monkey.faults if f.in_flight)
    assert all(kinds[k] for k in KINDS), f"not every kind of fault hit a rollback in flight: {dict(kinds)}"


def check_invariants(rv, rollbacks: list[Rollback], runs: list[dict]) -> Checks:
    """Check every invariant of the module docstring; ``runs`` are the counting tool's lines."""
    checks = Checks()
    state = rv.downstream.state()
    calls = collections.defaultdict(list)  # (path, key) -> [replayed?]
    for call in state.get("calls", []):
        calls[(call["path"], call["key"])].append(call["replayed"])
    ran = collections.defaultdict(collections.Counter)  # Job -> {pod: executions}
    for line in runs:
        ran[line["job"]][line["pod"]] += 1
    jobs = rv.batch.list_namespaced_job(rv.ns, label_selector="reversi.dev/role=compensator").items
    attempts = collections.defaultdict(list)  # (run uid, step) -> [attempt]
    executed = collections.Counter()  # (run uid, step) -> executions of its compensators
    pods = collections.defaultdict(list)
    for pod in rv.core.list_namespaced_pod(rv.ns).items:
        pods[(pod.metadata.labels or {}).get("job-name")].append(pod)
    for job in jobs:
        name, labels = job.metadata.name, job.metadata.labels
        step = (labels["reversi.dev/run-uid"], int(labels["reversi.dev/step"]))
        attempts[step].append(int(labels["reversi.dev/attempt"]))
        executed[step] += sum(ran[name].values())
        checks.check("no pod ran its program twice", all(n == 1 for n in ran[name].values()),
                     lambda: f"Job {name}: executions by pod {dict(ran[name])}")
        checks.check("no container restarted", all(cs.restart_count == 0 for p in pods[name]
                                                    for cs in p.status.container_statuses or []),
                     lambda: f"Job {name} has pods {[describe_pod(p) for p in pods[name]]}")
        if len(ran[name]) > 1:
            checks.twice.append(f"Job {name}: run by pods {sorted(ran[name])}; pods now "
                                f"{[describe_pod(p) for p in pods[name]]}")
    for r in rollbacks:
        req = rv.get("rollbackrequests", r.request)
        status = req.get("status") or {}
        checks.check("request final", status.get("phase") in FINAL, lambda: f"{r.request} is {status.get('phase')}")
        run = rv.get("runs", r.run)
        checks.check("run lock released", (run.get("status") or {}).get("activeRequest") is None,
                     lambda: f"Run {r.run} still held by {(run.get('status') or {}).get('activeRequest')}")
        undo = {u["step"]: u for u in rv.undo(r.run)}
        run_uid = run["metadata"]["uid"]
        compensated = []
        for s in r.steps:
            u = undo.get(s.index) or {}
            where = f"{r.run} step {s.index} ({s.kind} {s.object_id}, undo {json.dumps(u)[:300]})"
            checks.check("undo state final", u.get("state") in ("compensated", "compensationFailed"),
                         lambda: f"{where}: not final")
            if s.kind == "charge":
                undone = state["charges"][s.object_id]["refunded"]
            else:
                undone = state["reservations"][s.object_id]["status"] == "released"
            made = calls.get((s.effect_path(), u.get("idempotencyKey")), [])
            real = made.count(False)
            tried = sorted(attempts.get((run_uid, s.index), []))
            n = int(u.get("attempts") or 0)
            checks.check("one Job per attempt, attempts 1..n", tried == list(range(1, n + 1)),
                         lambda: f"{where}: compensator Jobs for attempts {tried}, journal says {n}")
            runs_of_step = executed[(run_uid, s.index)]
            checks.check("downstream calls with its key <= executions of its compensators", len(made) <= runs_of_step,
                         lambda: f"{where}: {len(made)} calls with its key, {runs_of_step} executions")
            checks.check("at most one real effect per step", real <= 1,
                         lambda: f"{where}: {real} real (not replayed) effects")
            if u.get("state") == "compensated":
                compensated.append(s.index)
                checks.check("compensated => its compensator ran (one real effect, own key)",
                             real == 1 and undone and runs_of_step >= 1,
                             lambda: f"{where}: compensated, but {real} real effects, downstream undone={undone}, "
                                     f"{runs_of_step} executions")
                checks.check("compensated => verified by its reader", u.get("verification") == "verified",
                             lambda: f"{where}: verification {u.get('verification')}")
            else:
                checks.check("not compensated => downstream not undone", not undone and real == 0,
                             lambda: f"{where}: reported {u.get('state')} but the downstream shows it undone "
                                     f"({real} real effects)")
        report = status.get("report") or {}
        checks.check("report lists exactly the compensated steps", sorted(report.get("compensated") or []) ==
                     sorted(compensated), lambda: f"{r.request}: report {report.get('compensated')}, journal {compensated}")
        expected = "Succeeded" if len(compensated) == len(r.steps) else "Incomplete"
        checks.check("phase matches the journal", status.get("phase") == expected,
                     lambda: f"{r.request} is {status.get('phase')}, journal says {expected}")
    return checks


def diagnose(rv, requests: list[str]) -> str:
    """Where unfinished requests stand: their steps' stages, their Jobs and pods."""
    out = []
    for name in requests:
        try:
            status = rv.get("rollbackrequests", name).get("status") or {}
            out.append(f"{name}: phase {status.get('phase')}, steps " + json.dumps(
                [{k: e.get(k) for k in ("step", "stage", "attempts", "reads", "lastError")}
                 for e in status.get("steps") or []]))
            uid = rv.get("runs", name.removeprefix("undo-"))["metadata"]["uid"]
            for job in rv.batch.list_namespaced_job(rv.ns, label_selector=f"reversi.dev/run-uid={uid}").items:
                conds = [(c.type, c.reason) for c in job.status.conditions or [] if c.status == "True"]
                pods = rv.core.list_namespaced_pod(rv.ns, label_selector=f"job-name={job.metadata.name}").items
                out.append(f"  Job {job.metadata.name} created {job.metadata.creation_timestamp} {conds} "
                           f"active={job.status.active} pods {[describe_pod(p) for p in pods]}")
        except Exception as err:  # noqa: BLE001 - a diagnosis never hides the failure
            out.append(f"{name}: cannot read it: {err}")
    return "\n".join(out)


def describe_pod(pod) -> str:
    """A pod in one line: name, created, phase and reason, each container's state."""
    states = []
    for cs in pod.status.container_statuses or []:
        st = cs.state.terminated or cs.state.running or cs.state.waiting
        states.append(f"{cs.name} restarts={cs.restart_count} {json.dumps(st.to_dict(), default=str) if st else None}")
    return (f"{pod.metadata.name} created {pod.metadata.creation_timestamp} phase {pod.status.phase} "
            f"reason {pod.status.reason} [{'; '.join(states)}]")


def summary(log, rollbacks: list[Rollback], faults: list[Fault], checks: Checks, setup: float, wall: float,
            after: float, runs: list[dict]) -> None:
    roles = collections.Counter(line["role"] for line in runs)
    executions = f"{roles['compensator']:>6} / {roles['reader']}"
    phases = collections.Counter(r.phase for r in rollbacks)
    kinds = collections.Counter(f.kind for f in faults)
    hit = collections.Counter(f.kind for f in faults if f.in_flight)
    steps = sum(len(r.steps) for r in rollbacks)
    durations = sorted(r.final_at - r.created_at for r in rollbacks if r.final_at and r.created_at)
    log("")
    log(f"chaos summary (seed {SEED})")
    log(f"  {'rollbacks':<58} {len(rollbacks):>6}   ({steps} steps; " +
        ", ".join(f"{k} {v}" for k, v in sorted(phases.items(), key=lambda kv: str(kv[0]))) + ")")
    if durations:
        log(f"  {'rollback duration, median / max (s)':<58} {durations[len(durations) // 2]:>6.1f} / {durations[-1]:.1f}")
    log(f"  {'faults injected (in flight)':<58} {len(faults):>6}")
    for kind in KINDS:
        log(f"    {kind:<56} {kinds[kind]:>6}   ({hit[kind]} with rollbacks in flight)")
    log(f"  {'every request final, seconds after the last fault':<58} {after:>6.1f}   (bound {FINAL_BOUND_SECONDS:.0f})")
    log(f"  {'set-up / wall time (s)':<58} {setup:>6.1f} / {wall:.1f}")
    log(f"  {'executions of compensators / readers (counting tool)':<58} {executions}")
    log(f"  {'compensator Jobs run by two pods (Kubernetes; a replay)':<58} {len(checks.twice):>6}")
    for line in checks.twice:
        log(f"    {line}")
    log("  invariant checks (passed / run):")
    failed = collections.Counter(f.split(":", 1)[0] for f in checks.failures)
    for name, count in checks.counts.items():
        log(f"    {name:<56} {count - failed[name]:>6} / {count}")
