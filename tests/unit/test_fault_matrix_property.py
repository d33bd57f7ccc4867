"""The fault matrix (docs/guarantees.md) as one property: the report is true, whatever the Jobs do.

Hypothesis draws a run (a few write steps, some with a read-back, some with none, some whose call
was uncertain, some standing on others) and drives the engine's pure passes
(:func:`reversi.engine.decide.decide`) to the end of the request, as the reconciler does: journal
first, then Jobs, then the request's status (:func:`reversi.adapters.status.step_entries`), which
the next pass reads back. Each Job the engine starts meets a fault of the matrix, drawn when it
starts (docs/guarantees.md#the-compensator, #the-reader): it runs, fails, lies, hangs until its
deadline, crashes, is evicted before or after its call, is OOM-killed, never gets its image, or
its pod is lost with the node. The simulation decides what the downstream really did (a
compensator killed after its call did act) and counts effects per idempotency key, as the demo
downstream does. The operator may be killed between the journal and the Jobs, or before the status
write (docs/guarantees.md#operator), and the request may be cancelled (#cancel).

A Job is seen through the real :meth:`reversi.adapters.kube.Kube.job_view`, reading a Job and a pod
built the way Kubernetes reports that fault (Failed conditions, exit codes, ``DisruptionTarget``,
``OOMKilled``, ``ContainerStatusUnknown``, a container waiting on its image), so pod truth and lost
reads are the product's own.

The guarantee (docs/guarantees.md#the-guarantee), checked on the final report:

- a step reported ``compensated`` has its effect gone downstream, by exactly one real call with
  its own idempotency key, and its compensator Jobs ran one attempt after another (1..n, never two
  at once);
- a step reported failed or unknown says the effect may remain: it is in the residue, typed
  ``failed`` or ``unknown``; a step not attempted had no compensator run;
- a complete report means every effect is gone; an effect that stands is never reported undone.

Where a Job breaks the Job contract (docs/concepts.md#the-job-contract) the matrix says the report
can be wrong (**WRONG** cells): a compensator that exits 0 and did nothing, with no honest read-back
after it; a reader that says "undone" when the effect stands. (An evicted compensator that exits 0
and whose Job is marked Complete (docs/guarantees.md#c-evicted) is not excused: pod truth reads its pod.)
A failed step is typed ``unknown`` exactly when the last compensator of it whose program ran was
stopped mid-call with no answer of its own (docs/concepts.md#the-report). The property does not hold such a step to
the truth, only to what the matrix says of it.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kubernetes import client as k

from reversi.adapters import jobs as jobs_mod
from reversi.adapters import status as st_mod
from reversi.adapters.kube import Kube
from reversi.engine import decide as dc
from reversi.engine import executor as ex
from reversi.engine.graph import build_graph
from reversi.engine.plan import COMPENSATE, build_plan
from reversi.models.rollbackrequest import Report, RollbackRequestSpec
from reversi.models.run import RunSpec, StepUndo
from reversi_testkit import RUN_ID, run_spec, snapshot, step, tool

NOW = 1_000_000.0
NS = "shop"
DEADLINE = 30  #: the runners' deadlineSeconds (a Job's activeDeadlineSeconds)
MESSAGE_LIMIT = 300  #: the operator's default message_limit (settings.py)
MAX_PASSES = 400  #: every request ends well within this many passes (one simulated second apart)
IMAGE = "registry.example/tools:1.4"

#: the Job controller's Failed conditions (reason: message)
JOB_FAILED = {"BackoffLimitExceeded": "Job has reached the specified backoff limit",
              "DeadlineExceeded": "Job was active longer than specified deadline"}


# ------------------------------------------------------------------------------ the faults


@dataclass(frozen=True)
class Fault:
    """What one Job's program did and how Kubernetes reports it.

    ``acts``: a compensator's call took effect downstream before the program ended; ``job``: the
    Job's final condition, ``Complete`` or ``Failed`` with ``reason``; its last pod (``pod``: still
    there when the Job is read) has one container that ``exit_code`` ended (``term_reason``,
    termination ``message``; ``late``: at or after the Job's deadline, by its SIGTERM) or that is
    ``waiting`` (reason, message) and never ran; ``disrupted``: the pod's ``DisruptionTarget``
    condition (evicted). ``output``: what a reader printed (``"{answer}"`` is its honest answer).
    ``breaks_contract``: the program breaks the Job contract in a way Reversi cannot see."""

    name: str
    acts: bool = False
    job: str = "Complete"
    reason: str = ""
    exit_code: int | None = 0
    term_reason: str | None = None
    message: str | None = None
    late: bool = False
    waiting: tuple[str, str] | None = None
    disrupted: bool = False
    pod: bool = True
    output: str = "{answer}"
    breaks_contract: bool = False


def _both(name: str, **kw: Any) -> list[Fault]:
    """The fault twice: the program's call took effect before it ended, and it did not."""
    return [Fault(f"{name}, after its call", acts=True, **kw), Fault(f"{name}, before its call", **kw)]


BACKOFF = {"job": "Failed", "reason": "BackoffLimitExceeded"}
DEADLINE_KILL = {"job": "Failed", "reason": "DeadlineExceeded", "late": True}

COMPENSATOR_FAULTS: list[Fault] = [
    Fault("ok", acts=True),
    Fault("ok (kubelet restarted under it)", acts=True),
    Fault("ok, its Job marked DeadlineExceeded after an outage", acts=True, job="Failed", reason="DeadlineExceeded"),
    *_both("fails", exit_code=1, message="refund refused: HTTP 409\n", **BACKOFF),
    Fault("crashes", exit_code=139, **BACKOFF),
    Fault("lies: exits 0, did nothing", breaks_contract=True),
    *_both("hangs until its deadline, exits 143 on SIGTERM", exit_code=143, **DEADLINE_KILL),
    *_both("hangs until its deadline, exits 0 on SIGTERM", exit_code=0, **DEADLINE_KILL),
    *_both("hangs until its deadline, its pod gone", exit_code=None, pod=False, **DEADLINE_KILL),
    Fault("evicted before its container ran", exit_code=None, waiting=("ContainerCreating", ""), disrupted=True,
          **BACKOFF),
    *_both("evicted mid-call, exits 143", exit_code=143, disrupted=True, **BACKOFF),
    *_both("evicted mid-call, exits 0, its Job Failed", exit_code=0, disrupted=True, **BACKOFF),
    # docs/guarantees.md#c-evicted: the Job controller may mark the evicted pod's Job Complete; pod truth reads its pod
    *_both("evicted mid-call, exits 0, its Job Complete", exit_code=0, disrupted=True),
    *_both("OOM-killed", exit_code=137, term_reason="OOMKilled", **BACKOFF),
    Fault("image never pulled", exit_code=None, job="Failed", reason="DeadlineExceeded",
          waiting=("ErrImagePull", f'failed to pull image "{IMAGE}": not found')),
    *_both("its pod lost with the node", exit_code=137, term_reason="ContainerStatusUnknown", **BACKOFF),
]

READER_FAULTS: list[Fault] = [
    Fault("ok"),
    Fault("ok, its Job marked DeadlineExceeded after an outage", job="Failed", reason="DeadlineExceeded"),
    Fault("noise: log lines before the answer", output="reading charge\nGET /charges 200\n{answer}\n"),
    Fault("noise: a log line after the answer", output="{answer}\nclosing the connection\n"),
    Fault("noise: no JSON", output="connecting to the downstream...\nok\n"),
    Fault("errors", exit_code=1, message="HTTP 503 from the downstream\n", **BACKOFF),
    Fault("lies: says undone", output='{"gone": true}', breaks_contract=True),
    Fault("lies: says not undone", output='{"gone": false}'),
    Fault("hangs until its deadline", exit_code=143, **DEADLINE_KILL),
    Fault("evicted", exit_code=143, disrupted=True, **BACKOFF),
    Fault("OOM-killed", exit_code=137, term_reason="OOMKilled", **BACKOFF),
    Fault("image never pulled", exit_code=None, job="Failed", reason="DeadlineExceeded",
          waiting=("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"')),
    Fault("its pod lost with the node", exit_code=137, term_reason="ContainerStatusUnknown", **BACKOFF),
]


# ------------------------------------------------------------------------------ Kubernetes, as job_view reads it


def _at(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def _container(role: str) -> k.V1Container:
    return k.V1Container(name=role, image=IMAGE)


def v1_job(name: str, role: str, fault: Fault, started: float, finished: bool) -> k.V1Job:
    """The Job as the API server holds it: no condition while it runs; then ``Complete``, or
    ``Failed`` with the Job controller's reason (a deadline's at the deadline)."""
    conditions, counts = None, {}
    if finished:
        counts = {"succeeded" if fault.job == "Complete" else "failed": 1}  # the Job controller counted its pod
        end = started + (DEADLINE if fault.reason == "DeadlineExceeded" else 2)
        if fault.job == "Complete":
            conditions = [k.V1JobCondition(type="Complete", status="True", last_transition_time=_at(end))]
        else:
            conditions = [k.V1JobCondition(type="Failed", status="True", reason=fault.reason,
                                           message=JOB_FAILED[fault.reason], last_transition_time=_at(end))]
    return k.V1Job(
        metadata=k.V1ObjectMeta(name=name, namespace=NS, labels={jobs_mod.LABEL_ROLE: role}),
        spec=k.V1JobSpec(active_deadline_seconds=DEADLINE, backoff_limit=0,
                         template=k.V1PodTemplateSpec(spec=k.V1PodSpec(containers=[_container(role)]))),
        status=k.V1JobStatus(start_time=_at(started), conditions=conditions, **counts))


def v1_pod(name: str, role: str, fault: Fault, started: float) -> k.V1Pod:
    """The Job's last pod: its container ended (by itself, or by the SIGTERM of the deadline, an
    eviction, the node), or still waiting to run."""
    if fault.exit_code is not None:
        ended = started + (DEADLINE + 1 if fault.late else 1)
        reason = fault.term_reason or ("Completed" if fault.exit_code == 0 else "Error")
        state = k.V1ContainerState(terminated=k.V1ContainerStateTerminated(
            exit_code=fault.exit_code, reason=reason, message=fault.message, finished_at=_at(ended)))
    else:
        why, text = fault.waiting or ("ContainerCreating", "")
        state = k.V1ContainerState(waiting=k.V1ContainerStateWaiting(reason=why, message=text or None))
    conditions = [k.V1PodCondition(type="DisruptionTarget", status="True", reason="EvictionByEvictionAPI")] \
        if fault.disrupted else None
    return k.V1Pod(
        metadata=k.V1ObjectMeta(name=f"{name}-x7k2p", namespace=NS, creation_timestamp=_at(started)),
        spec=k.V1PodSpec(containers=[_container(role)]),
        status=k.V1PodStatus(phase="Succeeded" if fault.exit_code == 0 and not fault.late else "Failed",
                             conditions=conditions, container_statuses=[k.V1ContainerStatus(
                                 name=role, image=IMAGE, image_id="", ready=False, restart_count=0, state=state)]))


class FakeCore:
    """The three reads ``Kube.job_view`` makes: a Job's pods, a pod's log, Events (none)."""

    def __init__(self) -> None:
        self.pods: dict[str, list[k.V1Pod]] = {}
        self.logs: dict[str, str] = {}

    def list_namespaced_pod(self, namespace: str, label_selector: str = "", **_: Any) -> k.V1PodList:
        return k.V1PodList(items=list(self.pods.get(label_selector.split("=", 1)[1], [])), metadata=k.V1ListMeta())

    def read_namespaced_pod_log(self, name: str, namespace: str, **_: Any) -> SimpleNamespace:
        return SimpleNamespace(data=self.logs[name].encode())

    def list_namespaced_event(self, namespace: str, **_: Any) -> k.CoreV1EventList:
        return k.CoreV1EventList(items=[], metadata=k.V1ListMeta())


def kube_reading(core: FakeCore) -> Kube:
    """A :class:`Kube` whose reads go to ``core`` (job_view needs nothing else)."""
    kube = Kube.__new__(Kube)
    kube.core, kube.timeout = core, 1.0
    return kube


def view_of(fault: Fault, role: str = "compensator", output: str = "") -> ex.JobView:
    """What ``Kube.job_view`` says of a finished Job of ``role`` that met ``fault``."""
    core = FakeCore()
    name = "rv-job"
    if fault.pod:
        pod = v1_pod(name, role, fault, NOW)
        core.pods[name] = [pod]
        core.logs[pod.metadata.name] = output
    return kube_reading(core).job_view(v1_job(name, role, fault, NOW, finished=True), reader=role in ex.READ_ROLES)


# ------------------------------------------------------------------------------ the downstream and the Jobs


@dataclass
class Downstream:
    """Effects that stand, by step, and every compensation call with its key (a repeat of a key
    is a replay: no second effect), as demo/downstream/server.py records them."""

    standing: dict[int, bool]
    calls: list[tuple[int, str, bool]] = field(default_factory=list)  #: (step, key, real)

    def compensate(self, s: int, key: str) -> None:
        real = not any(sent == key for _, sent, _ in self.calls)
        self.calls.append((s, key, real))
        if real:
            self.standing[s] = False

    def answer(self, s: int) -> str:
        return json.dumps({"id": f"r{s}", "gone": not self.standing[s]})


@dataclass
class SimJob:
    step: int
    role: str
    attempt: int
    read: int
    fault: Fault
    started: float
    running_passes: int
    finished: bool = False
    seen: ex.JobView | None = None


@dataclass
class World:
    """The cluster and the downstream of one drawn rollback."""

    run: RunSpec
    spec: RollbackRequestSpec
    downstream: Downstream
    draw_fault: Callable[[str], tuple[Fault, int]]
    core: FakeCore = field(default_factory=FakeCore)
    jobs: dict[tuple[str, int, int, int], SimJob] = field(default_factory=dict)
    mine: dict[int, StepUndo] = field(default_factory=dict)
    entries: dict[int, dict] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.graph = build_graph(self.run)
        self.plan = build_plan(self.run, [], run_id=RUN_ID, graph=self.graph, runner_names={"cli"},
                               handlers={"cli"}, now=NOW)
        self.kube = kube_reading(self.core)

    def key(self, s: int) -> str:
        key = self.plan.actions[s].idempotency_key
        assert key is not None
        return key

    def observe(self, role: ex.Role, attempt: int, read: int, s: int) -> ex.JobView | None:
        job = self.jobs.get((role, s, attempt, read))
        if job is None:
            return None
        name = jobs_mod.job_name(RUN_ID, s, attempt, role, read)
        view = self.kube.job_view(v1_job(name, role, job.fault, job.started, job.finished),
                                  reader=role in ex.READ_ROLES)
        if job.finished:
            job.seen = view
        return view

    def start(self, e: ex.StartJob, now: float) -> None:
        """Create the Job of ``e`` (a Job of that name already there is adopted, as the API's 409)."""
        where = (e.role, e.step, e.attempt, e.read)
        if where in self.jobs:
            self.log.append(f"adopt {where}")
            return
        if e.role == "compensator":
            # rule 3: journaled compensating, at this attempt, with the step's key, before its Job
            journaled = self.mine.get(e.step)
            assert journaled is not None and journaled.state == "compensating" and journaled.attempts == e.attempt
            assert journaled.idempotency_key == self.key(e.step)
            # one attempt after another: never a second compensator of a step while one runs
            earlier = [j for (r, s, _, _), j in self.jobs.items() if r == "compensator" and s == e.step]
            assert all(j.finished for j in earlier), f"step {e.step}: attempt {e.attempt} started while one runs"
            assert sorted(j.attempt for j in earlier) == list(range(1, e.attempt)), "attempts 1..n, no gap"
        if e.role == "reader":
            comp = self.jobs.get(("compensator", e.step, e.attempt, 0))
            assert comp is not None and comp.finished and comp.seen is not None and comp.seen.state == "succeeded"
        fault, running = self.draw_fault(e.role)
        self.jobs[where] = SimJob(e.step, e.role, e.attempt, e.read, fault, now, running)
        self.log.append(f"start {where}: {fault.name}")

    def tick(self) -> None:
        """Between passes: Jobs run on; the ones whose time came end, and act as their fault says."""
        for (role, s, attempt, read), job in self.jobs.items():
            if job.finished:
                continue
            if job.running_passes > 0:
                job.running_passes -= 1
                continue
            job.finished = True
            name = jobs_mod.job_name(RUN_ID, s, attempt, role, read)
            if role == "compensator" and job.fault.acts:
                self.downstream.compensate(s, self.key(s))
            if job.fault.pod:
                pod = v1_pod(name, role, job.fault, job.started)
                self.core.pods[name] = [pod]
                self.core.logs[pod.metadata.name] = job.fault.output.replace("{answer}", self.downstream.answer(s))

    def inputs(self, now: float) -> dc.PassInputs:
        return dc.PassInputs(request="undo", spec=self.spec, plan=self.plan, graph=self.graph, run=self.run,
                             mine=dict(self.mine), prior=[], entries=dict(self.entries), now=now, started=NOW,
                             observe=self.observe, runner_names=frozenset({"cli"}))

    def one_pass(self, now: float, crash: str | None, rng: random.Random) -> dc.Decision:
        """One reconcile pass: decide, then journal, Jobs, status, in that order (rule 3). An
        operator killed ``before jobs`` wrote only the journal; ``before status``, all but the status."""
        d = dc.decide(self.inputs(now), rng)
        for e in d.effects:
            if isinstance(e, ex.Journal):
                self.mine[e.step] = dc.journal_entry(e, key=self.key(e.step), request="undo", at=st_mod.iso(now),
                                                     error=st_mod.cut(e.error, MESSAGE_LIMIT))
        if crash == "before jobs":
            return d
        for e in d.effects:
            if isinstance(e, ex.StartJob):
                self.start(e, now)
        if crash == "before status":
            return d
        end = d.ending
        keys = {s: u.idempotency_key for s, u in self.mine.items()}
        verify_tools = {s: v.tool for s, v in d.verify_plans.items()}
        entries = st_mod.step_entries(self.plan, dict(end.runs), dict(end.deferred) if end.finished else {}, keys,
                                      dict(d.approved), d.approved_all_by, 1, self.entries, verify_tools, 10_000,
                                      MESSAGE_LIMIT)
        self.entries = {e["step"]: e for e in entries}
        return d


# ------------------------------------------------------------------------------ the draw


@dataclass(frozen=True)
class Drawn:
    run: RunSpec
    standing: dict[int, bool]
    spec: dict[str, Any]
    cancel_at: int | None
    crashes: dict[int, str]


@st.composite
def rollbacks(draw: st.DrawFn) -> Drawn:
    """A run of 1-4 write steps (a read-back with a reader, or none declared; the call succeeded
    or was uncertain; a step may stand on an earlier one), the request's policy, when it is
    cancelled (if it is) and the passes after which the operator is killed."""
    n = draw(st.integers(1, 4))
    steps, standing = [], {}
    for i in range(n):
        kind = draw(st.sampled_from(["read-back", "read-back", "no read-back", "uncertain"]))
        entry = tool(f"w{i}", verify=kind != "no read-back")
        if "verification" in entry:
            entry["verification"].update(retries=draw(st.integers(1, 3)), backoffMs=100)
        outcome = "uncertain" if kind == "uncertain" else "succeeded"
        depends = draw(st.sets(st.integers(0, i - 1), max_size=1)) if i else set()
        steps.append(step(i, snapshot(entry), outcome, depends_on=sorted(depends),
                          result={"id": f"r{i}"}))
        standing[i] = True if outcome == "succeeded" else draw(st.booleans())  # did the uncertain call act?
    spec = {"runRef": {"name": "order-4711"}, "retries": draw(st.integers(1, 3)),
            "backoff": {"baseMs": 100, "maxMs": 400}, "parallelism": draw(st.integers(1, 3)),
            "requireVerification": draw(st.booleans())}
    cancel_at = draw(st.sampled_from([None, None, None, 0, 1, 2, 3, 4, 6, 8]))
    crashes = draw(st.dictionaries(st.integers(0, 10), st.sampled_from(["before jobs", "before status"]), max_size=3))
    return Drawn(run_spec(steps), standing, spec, cancel_at, crashes)


@dataclass
class Ended:
    world: World
    report: Report
    passes: int


def roll_back(drawn: Drawn, draw_fault: Callable[[str], tuple[Fault, int]]) -> Ended:
    """Drive the passes until the request ends (or fail after MAX_PASSES)."""
    world = World(run=drawn.run, spec=RollbackRequestSpec.model_validate(drawn.spec),
                  downstream=Downstream(dict(drawn.standing)), draw_fault=draw_fault)
    rng = random.Random(0)
    now = NOW
    for n in range(MAX_PASSES):
        if n == drawn.cancel_at:
            world.spec = world.spec.model_copy(update={"cancel": True, "cancelled_by": "oncall"})
        crash = drawn.crashes.get(n)
        d = world.one_pass(now, crash, rng)
        if d.ending.finished and not d.awaiting and crash is None:
            return Ended(world, d.ending.report, n + 1)
        world.tick()
        now += 1.0
    raise AssertionError(f"the request did not end in {MAX_PASSES} passes:\n" + "\n".join(world.log[-30:]))


# ------------------------------------------------------------------------------ the guarantee


def misled(world: World, s: int) -> bool:
    """Whether a Job of step ``s`` broke the Job contract in a way Reversi cannot see, so that the
    matrix allows a wrong report (docs/guarantees.md#c-lies, #c-evicted, #r-lies): a reader that
    said "undone"; a compensator counted a success although it may not have acted, with no honest
    read-back after it (a step with a declared read-back is caught by an honest reader)."""
    jobs = [j for j in world.jobs.values() if j.step == s]
    if any(j.role == "reader" and j.fault.breaks_contract for j in jobs):
        return True

    def done(j: SimJob) -> bool:
        return j.seen is not None and j.seen.state == "succeeded"

    told = any(j.role == "compensator" and j.fault.breaks_contract and done(j) for j in jobs)
    return told and not any(j.role == "reader" and done(j) for j in jobs)


#: compensator faults whose program started and was stopped with no answer of its own: its effect is unknown
KILLED_MID_CALL = ("hangs", "evicted mid-call", "OOM-killed", "its pod lost")
#: compensator faults whose program never ran
NEVER_RAN = ("evicted before", "image never pulled")


def effect_unknown(world: World, s: int) -> bool:
    """Whether the last compensator of step ``s`` whose program ran was stopped mid-call
    (docs/concepts.md#the-report: a failed step is then residue ``unknown``, else ``failed``)."""
    ran = sorted((j for j in world.jobs.values() if j.role == "compensator" and j.step == s and j.seen is not None
                  and not j.fault.name.startswith(NEVER_RAN)), key=lambda j: j.attempt)
    return bool(ran) and ran[-1].fault.name.startswith(KILLED_MID_CALL)


def check_the_report_is_true(ended: Ended) -> None:
    world, report = ended.world, ended.report
    down = world.downstream
    residue: dict[int, set[str]] = {}
    for entry in report.residue:
        residue.setdefault(entry.step, set()).add(entry.type)
    failed = {x.step for x in report.failed}
    compensate = {a.step for a in world.plan.of_kind(COMPENSATE)}
    ran = {j.step for j in world.jobs.values() if j.role == "compensator"}
    trail = "\n".join(world.log)

    # the journal is settled: no attempt is left compensating once the request has ended
    assert all(u.state in ("compensated", "compensationFailed") for u in world.mine.values()), world.mine
    for s, standing in down.standing.items():
        real = [c for c in down.calls if c[0] == s and c[2]]
        assert all(key == world.key(s) for _, key, _ in [c for c in down.calls if c[0] == s])
        assert len(real) <= 1, f"step {s}: more than one real effect"
        if s in report.compensated:
            assert s in compensate and world.mine[s].state == "compensated"
            if not misled(world, s):
                assert not standing, f"step {s} is reported compensated but its effect stands\n{trail}"
                assert len(real) == 1, f"step {s} is reported compensated but was never undone downstream"
        if s in failed:
            assert world.mine[s].state == "compensationFailed"
            assert residue.get(s, set()) & {"failed", "unknown"}, f"step {s} failed: not in the residue as such"
            if world.mine[s].verification is None:  # failed by its compensators (not by a read-back)
                want = "unknown" if effect_unknown(world, s) else "failed"
                assert residue[s] & {"failed", "unknown"} == {want}, f"step {s}: residue {residue[s]}\n{trail}"
        if s in report.unverified:
            assert "unknown" in residue.get(s, set())
        if "notAttempted" in residue.get(s, set()):
            assert s not in ran, f"step {s} is not attempted, but its compensator ran\n{trail}"
        if standing and not misled(world, s):
            assert s not in report.compensated and s not in report.already_recovered
            assert residue.get(s, set()) & {"failed", "unknown", "notAttempted"}, (
                f"step {s}: its effect stands, and the residue does not say so\n{trail}")
    if report.complete:
        assert not [s for s, standing in down.standing.items() if standing and not misled(world, s)], trail


def _fault_drawer(data: st.DataObject) -> Callable[[str], tuple[Fault, int]]:
    def draw_fault(role: str) -> tuple[Fault, int]:
        faults = COMPENSATOR_FAULTS if role == "compensator" else READER_FAULTS
        fault = data.draw(st.sampled_from(faults), label=f"{role} fault")
        return fault, data.draw(st.integers(0, 1), label="passes it runs")
    return draw_fault


PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(rollbacks(), st.data())
def test_the_report_is_true_whatever_each_job_of_the_rollback_meets(drawn, data):
    """docs/guarantees.md#the-guarantee, over every cell of the compensator's and the reader's
    rows, the uncertain call, the operator killed and the request cancelled."""
    ended = roll_back(drawn, _fault_drawer(data))
    check_the_report_is_true(ended)
    for job in ended.world.jobs.values():  # --hypothesis-show-statistics: how often each fault was met
        event(f"{job.role}: {job.fault.name}")
    event(f"complete: {ended.report.complete}")


@PROPERTY
@given(rollbacks(), st.data())
def test_with_jobs_that_keep_the_contract_nothing_is_excused_and_an_undo_that_went_well_is_compensated(drawn, data):
    """The same with the faults that keep the Job contract only: no step is excused from the
    truth, and a step whose every Job ran well (not cancelled) is reported undone: compensated, or
    unverified when the request requires a read-back the manifest does not declare."""
    honest = _fault_drawer(data)

    def draw_fault(role: str) -> tuple[Fault, int]:
        fault, running = honest(role)
        return (Fault("ok", acts=role == "compensator"), running) if fault.breaks_contract else (fault, running)

    ended = roll_back(drawn, draw_fault)
    world, report = ended.world, ended.report
    assert not any(misled(world, s) for s in world.downstream.standing)
    check_the_report_is_true(ended)
    for s in world.downstream.standing:
        jobs = [j for j in world.jobs.values() if j.step == s]
        if jobs and all(j.fault.name.startswith("ok") for j in jobs) and not world.spec.cancel:
            snap = world.run.snapshot_of(next(x for x in world.run.steps if x.index == s))
            unchecked = world.spec.require_verification and (snap is None or snap.verification is None)
            assert s in (report.unverified if unchecked else report.compensated), "\n".join(world.log)


# ------------------------------------------------------------------------------ the model is job_view's


@pytest.mark.parametrize("fault, state, lost", [
    (COMPENSATOR_FAULTS[0], "succeeded", False),
    (COMPENSATOR_FAULTS[2], "succeeded", False),  # pod truth: it exited 0 before the deadline
    *[(f, "failed", False) for f in COMPENSATOR_FAULTS if f.name.startswith(("fails", "crashes", "OOM"))],
    *[(f, "failed", True) for f in COMPENSATOR_FAULTS if f.name.startswith(("hangs", "evicted mid-call, exits 143",
                                                                           "evicted before", "image", "its pod lost"))],
    # an exit 0 that may answer the SIGTERM of an eviction is no success (pod truth, disrupted)
    *[(f, "failed", True) for f in COMPENSATOR_FAULTS if f.name.startswith("evicted mid-call, exits 0, its Job F")],
    # also when the Job controller marked its Job Complete (docs/guarantees.md#c-evicted): pod truth reads the pod
    *[(f, "failed", True) for f in COMPENSATOR_FAULTS if f.name.startswith("evicted mid-call, exits 0, its Job C")],
], ids=lambda v: v.name if isinstance(v, Fault) else str(v))
def test_a_killed_compensators_job_reads_as_the_matrix_says(fault, state, lost):
    """docs/guarantees.md#the-compensator: the simulated Jobs are read by the product's job_view;
    a compensator killed by a signal, or whose program never ran, is never taken for a done undo.
    Its effect is unknown exactly when its program started and gave no answer of its own."""
    view = view_of(fault)
    assert (view.state, view.lost) == (state, lost), view
    if state == "failed":
        assert view.message, "a failed attempt always says why"
        assert view.effect_unknown is fault.name.startswith(KILLED_MID_CALL), view


@pytest.mark.parametrize("fault, state, lost", [
    (READER_FAULTS[0], "succeeded", False),
    (READER_FAULTS[1], "succeeded", False),
    (READER_FAULTS[5], "failed", False),  # errors: a failed read is an answer
    (READER_FAULTS[8], "failed", True),  # hangs: a lost read
    (READER_FAULTS[9], "failed", True),  # evicted: no answer of its own
    (READER_FAULTS[10], "failed", False),  # OOM-killed: an answer of sorts
    (READER_FAULTS[11], "failed", True),  # its image: it never ran
    (READER_FAULTS[12], "failed", True),  # lost with the node
], ids=lambda v: v.name if isinstance(v, Fault) else str(v))
def test_a_readers_job_reads_as_the_matrix_says(fault, state, lost):
    """docs/guarantees.md#the-reader: lost reads and failed reads, as job_view tells them apart."""
    view = view_of(fault, "reader", output='{"gone": true}')
    assert (view.state, view.lost) == (state, lost), view
    if state == "succeeded":
        assert view.output == '{"gone": true}'
