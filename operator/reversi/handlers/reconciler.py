"""One reconcile pass of a RollbackRequest: read, decide (engine), act (adapters), report.

Level-triggered and restart-safe: every pass starts from what the API holds — the request, the
Run (its spec and ``status.undo``) and the Jobs — so an operator killed at any point resumes
where it was (rule 3). The pass:

1. loads the request, its Run and (until it has recorded its runners) the ToolManifest; bad input ends
   the request ``Failed`` with an ``Invalid`` condition that says what to fix (never a crash loop);
2. plans (rule 2) against the undo state left by *other* requests, so the plan is a function of
   the Run alone and can be rebuilt after a restart; a dry run stops here (``Planned``);
3. takes the Run's lock (``status.activeRequest``; rule 6) or waits (``Waiting``); with the lock it
   pins the Run's steps (``status.runSteps``) and records the runners it needs
   (``status.runners``): from then on it plans and builds every Job from that record, never from
   the live ToolManifest;
4. decides (:func:`reversi.engine.decide.decide`, pure): rebuilds each step from status and journal,
   moves every active step on and starts what the schedule allows (newest first, dependents
   first, within ``parallelism``; rule 1), with the outcomes and the report;
5. acts: carries out the effects, journal on the Run first, then Jobs, then Events;
6. when nothing can move any more, writes the report (docs/concepts.md#the-report), releases the lock and ends
   ``Succeeded`` (complete) or ``Incomplete``.

Cancel (``spec.cancel``, rule 13): no new Job starts (``Policy.stop``); the steps whose
Jobs run are advanced until those Jobs finish and their true outcome is journaled; every step not
started becomes ``cancelled``; then the report is written and the lock released as above, phase
``Incomplete`` with ``Complete=False`` reason ``Cancelled`` (``Succeeded`` only when nothing was
left to stop). A cancelled request that does not hold the lock never takes it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any
from collections.abc import Callable

from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from .. import conditions as cond
from ..adapters import closed_runs
from ..adapters import jobs as jobs_mod
from ..adapters import journal as jr
from ..adapters import status as st
from ..adapters.kube import Conflict, Kube, api_message
from ..engine import decide as dc
from ..engine import request_phase
from ..engine import standing
from ..engine import executor as ex
from ..engine import orphans
from ..engine.graph import InvalidRun, build_graph
from ..engine.journal import Journal
from ..engine import runners as rs
from ..engine.decide import epoch as _epoch
from ..engine.plan import COMPENSATE, build_plan
from ..engine.report import outcome_reason, report_message, when_run_gone
from ..engine.schedule import progress_text, ready_steps
from ..models.rollbackrequest import TERMINAL_PHASES, Plan, Report, RollbackRequestSpec, StepReason, run_ref_name
from ..models.run import RunSpec, StepUndo
from ..models.toolmanifest import Runner, ToolManifestSpec
from ..settings import OperatorSettings
from . import indices as ix
from .tree_rollback import TreePass, TreeRollback

log = logging.getLogger("reversi.rollback")

RUNS, REQUESTS, MANIFESTS = "runs", "rollbackrequests", "toolmanifests"
#: seconds between passes of a request that waits for the Run's lock or for an approval (a change
#: to the request or the end of the other request wakes it at once)
WAIT_SECONDS = 5.0
#: seconds between passes of a request waiting for another request's lock on the Run: the Run's
#: release wakes it at once (:meth:`Reconciler.lock_released`), this is only the fallback
LOCK_WAIT_SECONDS = 15.0
#: passes a request waits for a gap in the run's steps to close (the watch catching up) before it fails
GAP_PASSES = 10
#: seconds a request waits after pinning ``status.runSteps`` before it counts the steps again at
#: its end (rule 11): a step the webhook admitted while the Run was still open can be stored a
#: moment after the count; the recount finds it, and the request plans it instead of leaving it out
BOUNDARY_GRACE_SECONDS = 0.5


#: seconds between dry-run probes of a freshly taken lock, and how long they are waited for
LOCK_PROBE_SECONDS = 0.1
LOCK_PROBE_DEADLINE = 10.0


@dataclass
class PassMemory:
    """What a worker keeps between passes: finished Job views (they never change) and the
    random source for backoff jitter."""

    views: dict[str, ex.JobView] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)
    since: dict[tuple[int, str], float] = field(default_factory=dict)
    written: dict[int, StepUndo] = field(default_factory=dict)
    gap_passes: int = 0
    #: the run journal's version when it was last read (None: read by a LIST, no informer)
    journal_version: int | None = None
    #: the graph and plan of the last pass, and what they were built from (see ``_plan_key``)
    plan_key: tuple | None = None
    plan: tuple | None = None
    #: when this process pinned ``status.runSteps`` (``time.time()``): the recount at the end waits for it
    pinned_at: float | None = None
    #: since when (``time.monotonic()``) this process waits for the lock to be in force at the API
    #: server (its dry-run probe refused), before it pins the steps
    lock_probed_since: float | None = None
    #: whether this process took the request's lock itself, and so wrote its run's entry
    lock_entry_written: bool = False
    #: the uid of the Run this process found for the request: a Run seen and then deleted is not
    #: waited for as one not created yet (``RunNotFound`` at once)
    run_uid: str | None = None
    #: since when (``time.monotonic()``) the request's status has steps under way that are not
    #: written yet (see :func:`only_under_way`); None: the stored status is up to date
    unwritten_since: float | None = None


class CannotCarryOut(Exception):
    """The request cannot be carried out; ``reason`` is a condition reason, the message says
    what to fix."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Next:
    """When the next pass comes: in ``seconds``, or never (None: the request ended)."""

    seconds: float | None


@dataclass
class Loaded:
    """What a pass loaded: the request and its spec, its Run (as read after moving an inline
    journal), the journal as this request plans it, the runners it uses (``recorded`` in
    ``status.runners``, else the live ``manifest``'s), its graph and plan, and the status this
    pass writes (a copy of the stored one). ``now`` and ``started``: epoch seconds."""

    req: dict
    spec: RollbackRequestSpec
    run_obj: dict
    journal: Journal
    recorded: Any
    manifest: ToolManifestSpec | None
    runners: dict[str, Runner]
    readers: dict[str, str]
    now: float
    started: float
    graph: Any = field(init=False)
    plan: Plan = field(init=False)
    ns: str = field(init=False)
    name: str = field(init=False)
    gen: int = field(init=False)
    ref: str = field(init=False)
    run_name: str = field(init=False)
    run_uid: str = field(init=False)
    status: dict = field(init=False)
    old_entries: dict[int, dict] = field(init=False)
    mine: dict[int, StepUndo] = field(init=False)
    prior: list[StepUndo] = field(init=False)

    def __post_init__(self) -> None:
        meta = self.req["metadata"]
        self.ns, self.name, self.gen = meta["namespace"], meta["name"], meta.get("generation", 1)
        self.ref = f"RollbackRequest {self.ns}/{self.name}"
        self.run_name, self.run_uid = self.spec.run_ref.name, self.run_obj["metadata"]["uid"]
        self.status = dict(self.req.get("status") or {})
        self.old_entries = {e["step"]: e for e in self.status.get("steps") or []}
        undo = list(self.journal.undo.values())
        self.mine = {u.step: u for u in undo if u.request == self.name}  # this request's own undo
        self.prior = [u for u in undo if u.request != self.name]  # what earlier requests left


@dataclass
class Held:
    """What holding the Run gave a pass: ``cancelling`` (``spec.cancel``), the ``tree`` of runs
    below it locked with it (None: no child runs) and the ``floor`` below which steps wait for a
    child run (:mod:`reversi.engine.nested_runs`)."""

    cancelling: bool
    tree: TreePass | None
    floor: int


@dataclass
class Decided:
    """The engine's decision of a pass (``d``), the inputs it was made from, and the labels of
    the run's Jobs and the request's uid (which guard reads are this request's own)."""

    inputs: dc.PassInputs
    d: Any
    labels: list[dict]
    req_uid: str


class Reconciler(TreeRollback):
    """Reconciles RollbackRequests; one instance serves every worker thread. A run with child
    runs is rolled back as a tree (:mod:`reversi.handlers.tree_rollback`, rule 17)."""

    def __init__(self, kube: Kube, settings: OperatorSettings, metrics: Any = None,
                 allowed: Callable[[], bool] = lambda: True, shared: Any = None):
        """``shared``: the process's shared objects (``reversi.handlers.runtime.Parts``), read for
        kopf's indices (ToolManifests, each run's Jobs) and the runs' RunStep informers; None (a
        reconciler on its own, e.g. in a test) reads all of it from the API."""
        self.kube = kube
        self.shared = shared
        self.allowed = allowed  # False while the installed CRDs are older than the operator
        self.settings = settings
        self.metrics = metrics
        self.job_settings = jobs_mod.JobSettings(settings.job_ttl_seconds, settings.job_run_as_user)
        self._run_waiters: dict[tuple[str, str], set[str]] = {}
        self._lock_waiters: dict[tuple[str, str], set[str]] = {}  # requests in phase Waiting, by Run
        self._waiters_lock = threading.Lock()

    def _indices(self) -> ix.Indices | None:
        """kopf's live indices, once a handler has seen them; None before, or on its own."""
        return self.shared.indices if self.shared is not None else None

    def waiting_for(self, namespace: str, run: str) -> list[str]:
        """Requests waiting for Run ``namespace/run`` to be created (woken by its creation)."""
        with self._waiters_lock:
            return sorted(self._run_waiters.get((namespace, run), ()))

    def lock_released(self, namespace: str, run: str) -> list[str]:
        """Requests that waited for Run ``namespace/run``'s lock (phase ``Waiting``), forgotten
        here: the Run's release wakes them (a request still waiting registers again)."""
        with self._waiters_lock:
            return sorted(self._lock_waiters.pop((namespace, run), ()))

    def _wait_for_lock(self, namespace: str, run: str, request: str) -> None:
        with self._waiters_lock:
            self._lock_waiters.setdefault((namespace, run), set()).add(request)

    def _wait_for_run(self, namespace: str, run: str, request: str, waiting: bool) -> None:
        with self._waiters_lock:
            names = self._run_waiters.setdefault((namespace, run), set())
            (names.add if waiting else names.discard)(request)
            if not names:
                del self._run_waiters[(namespace, run)]

    # ------------------------------------------------------------------------------ entry

    def reconcile(self, namespace: str, name: str, memory: PassMemory) -> float | None:
        """Run one pass. Returns the seconds until the next pass, or None when the request is
        final (or gone), or while reconciling is not allowed (the installed CRDs are older than
        the operator: a schema check restarts the workers once they are upgraded)."""
        if not self.allowed():
            return None
        req = self.kube.get(REQUESTS, namespace, name)
        if req is None or req["metadata"].get("deletionTimestamp"):
            return None
        status = req.get("status") or {}
        if status.get("phase") in TERMINAL_PHASES:
            return None
        try:
            return self._reconcile(req, memory)
        except CannotCarryOut as bad:
            self._fail(req, bad.reason, bad.message)
            return None

    def report_error(self, namespace: str, name: str, error: str) -> None:
        """Say on the request that passes keep failing (condition ``Running``, reason
        ``ReconcileError``, and a Warning Event) — a request is never stuck without saying why."""
        req = self.kube.get(REQUESTS, namespace, name)
        if req is None:
            return
        status = req.get("status") or {}
        gen = req["metadata"].get("generation", 1)
        message = ("the operator keeps failing on this request and retries: "
                   f"{st.cut(error, self.settings.message_limit)}")
        current = cond.get_condition(status.get("conditions"), cond.RUNNING) or {}
        if current.get("reason") == cond.RECONCILE_ERROR and current.get("message") == message:
            return
        conds = st.summary_conditions(status.get("conditions") or [], gen,
                                      [(cond.RUNNING, cond.UNKNOWN, cond.RECONCILE_ERROR, message),
                                       *st.readiness(st.PROGRESSING, cond.RECONCILE_ERROR, message)])
        self.kube.merge_status(REQUESTS, namespace, name, {"conditions": conds})
        self.kube.event(req, cond.RECONCILE_ERROR, message, warning=True)

    # --------------------------------------------------------------------------- the pass

    def _reconcile(self, req: dict, memory: PassMemory) -> float | None:
        """One pass: load, decide, act (the module docstring has the steps). Returns the seconds
        until the next pass, or None when the request ended. Raises :class:`CannotCarryOut` for a
        request that cannot be carried out, ``ApiException`` for a transient API error."""
        loaded = self._load(req, memory)
        if isinstance(loaded, Next):
            return loaded.seconds
        if loaded.spec.dry_run:
            loaded.status.update(progress=progress_text(loaded.plan, {}))
            loaded.status.pop("report", None)
            self._end(loaded, request_phase.dry_run())
            return None
        held = self._hold(loaded, memory)
        if isinstance(held, Next):
            return held.seconds
        decided = self._decide(loaded, held, memory)
        self._act(loaded, decided, memory)
        return self._report(loaded, held, decided, memory)

    # ------------------------------------------------------------------------------- load

    def _load(self, req: dict, memory: PassMemory) -> Loaded | Next:
        """The request's spec, its Run, the journal as it plans it, its runners and its plan (rule
        2: against the undo left by other requests), with the status this pass starts from; or
        when to come back (the Run missing or settling, the lock held by another, the journal
        still being read). Raises :class:`CannotCarryOut`."""
        meta = req["metadata"]
        ns, name = meta["namespace"], meta["name"]
        ref = f"RollbackRequest {ns}/{name}"
        try:
            spec = RollbackRequestSpec.model_validate(req.get("spec") or {})
        except ValidationError as err:
            raise CannotCarryOut(cond.INVALID_SPEC,
                                 f"{ref}: spec is invalid: {_first_error(err)}; fix the spec") from err
        run_obj = self._run_of(req, spec)
        if run_obj is None:
            if not spec.cancel and (memory.run_uid or (req.get("status") or {}).get("startTime")):
                raise CannotCarryOut(cond.RUN_NOT_FOUND,
                    f"{ref}: Run {ns}/{spec.run_ref.name} was deleted after this request found it, before it "
                    "undid anything; look at what the Run's calls left, and create a new request for a Run that "
                    "exists")
            return Next(self._no_run(req, spec))
        if memory.run_uid not in (None, run_obj["metadata"]["uid"]) and not spec.cancel:
            raise CannotCarryOut(cond.RUN_NOT_FOUND,
                f"{ref}: Run {ns}/{spec.run_ref.name} was deleted and created again after this request found it; "
                "nothing this request did applies to the new Run: create a new request for it")
        memory.run_uid = run_obj["metadata"]["uid"]
        settle = self._run_settling(req, run_obj)
        if settle:
            return Next(settle)
        if self._still_waiting(req, spec, run_obj):
            return Next(LOCK_WAIT_SECONDS)  # the Run's release wakes it; no plan is built while another request works
        run_obj, journal = self._journal_of(req, spec, run_obj, memory)
        if journal is None:
            return Next(self.settings.tick_seconds)  # the RunSteps are still being listed, or their watch catches up
        recorded, manifest, runners, readers = self._runners_of(req, ref, ns, journal.spec)
        now = time.time()
        loaded = Loaded(req, spec, run_obj, journal, recorded, manifest, runners, readers, now=now,
                        started=_epoch((req.get("status") or {}).get("startTime")) or now)
        loaded.graph, loaded.plan = self._plan(loaded, memory)
        status = loaded.status
        status.setdefault("startTime", st.iso(loaded.started))
        status["plan"] = st.plan_status(loaded.plan, self.settings.status_detail_limit)
        status["observedGeneration"] = loaded.gen
        status["conditions"] = st.summary_conditions(status.get("conditions") or [], loaded.gen, request_phase.planned(
            len(loaded.plan.of_kind(COMPENSATE)), loaded.plan.fully_reversible))
        return loaded

    def _run_of(self, req: dict, spec: RollbackRequestSpec) -> dict | None:
        """The request's Run, or None while it does not exist. Raises :class:`CannotCarryOut` when the Run
        this request locked was deleted (and maybe created again): its progress is not the new Run's."""
        meta = req["metadata"]
        ns, run = meta["namespace"], spec.run_ref.name
        run_obj = self.kube.get(RUNS, ns, run)
        gone = run_gone(req.get("status") or {}, run_obj)
        if gone:
            raise CannotCarryOut(cond.RUN_NOT_FOUND,
                f"RollbackRequest {ns}/{meta['name']}: Run {ns}/{run} {gone} after this "
                "request took its lock; its compensator Jobs went with it, and nothing this request did "
                "applies to another Run: look at what the old Run's calls left, and create a new request "
                "for the Run as it is now")
        self._wait_for_run(ns, run, meta["name"], run_obj is None)
        return run_obj

    def _no_run(self, req: dict, spec: RollbackRequestSpec) -> float | None:
        """A pass of a request whose Run does not exist: cancelled, it ends; else it waits."""
        if not spec.cancel:
            return self._run_missing(req, spec.run_ref.name)
        meta = req["metadata"]
        self._wait_for_run(meta["namespace"], spec.run_ref.name, meta["name"], False)
        said = request_phase.cancelled_before_planning(
            spec.cancelled_by, f"its Run {meta['namespace']}/{spec.run_ref.name} does not exist")
        status = dict(req.get("status") or {})
        status["observedGeneration"] = meta.get("generation", 1)
        self._end_with(req, status, said)
        return None

    def _plan(self, loaded: Loaded, memory: PassMemory) -> tuple[Any, Plan]:
        """The graph and plan of the request's Run, built again only when what they are built
        from changed (:func:`_plan_key`). Steps this request re-verified (rule 5) are planned as
        they were when it started: undone, unverified. Raises :class:`CannotCarryOut`."""
        run_spec, names = loaded.journal.spec, set(loaded.runners)
        handlers_known = loaded.recorded is not None or loaded.manifest is not None
        key = _plan_key(loaded.run_obj, loaded.req, memory, loaded.started, names, loaded.readers, handlers_known)
        if key is not None and memory.plan is not None and memory.plan_key == key:
            return memory.plan  # nothing it is built from changed since the last pass
        prior = [u.model_copy(update={"state": "compensated", "verification": "unverified"})
                 if u.verified_by == loaded.name else u for u in loaded.prior]
        try:
            graph = build_graph(run_spec)
            # verified: a reader exists; a step whose runner is not there (not in the manifest, not
            # recorded) is handlerUnavailable; unknown while the manifest is gone and nothing is recorded
            plan = build_plan(run_spec, prior, run_id=loaded.run_uid, graph=graph, runner_names=names,
                              readers=loaded.readers, handlers=names if handlers_known else None,
                              now=loaded.started)  # undo windows are judged when the request started
        except InvalidRun as err:
            raise CannotCarryOut(cond.INVALID_DEPENDENCIES,
                          f"{loaded.ref}: Run {loaded.ns}/{loaded.run_name} cannot be planned: {err}") from err
        memory.plan_key, memory.plan = key, (graph, plan)
        return graph, plan

    # ------------------------------------------------------------------------ hold the Run

    def _hold(self, loaded: Loaded, memory: PassMemory) -> Held | Next:
        """Take the Run's lock and its children's (rule 6), or wait for it (``Waiting``); with the
        lock, pin the Run's steps (rule 11) and record the runners this request uses. A request
        cancelled before it took the lock never takes it. Raises :class:`CannotCarryOut`."""
        spec, run_spec, status = loaded.spec, loaded.journal.spec, loaded.status
        needed = {a.runner for a in loaded.plan.of_kind(COMPENSATE) if a.runner}
        if needed and loaded.manifest is None and loaded.recorded is None:
            raise CannotCarryOut(cond.MANIFEST_NOT_FOUND,
                f"{loaded.ref}: ToolManifest {loaded.ns}/{run_spec.manifest_ref.name} "
                "not found; its runners are needed to run compensators: create it again (a Run's manifestRef "
                "cannot change), then create a new RollbackRequest")
        # (a runner missing from the manifest made only its steps handlerUnavailable: the plan says so)
        holding = (loaded.run_obj.get("status") or {}).get("activeRequest") == loaded.name \
            or self._held_for(loaded.req, loaded.run_obj)
        idle = spec.cancel and not holding  # cancelled before it took the lock: nothing runs, it never takes it
        if not idle and (blocked := self._lock_tree(loaded.req, loaded.run_obj, status)) is not None:
            held_run, holder = blocked
            self._say(loaded.req, status, request_phase.waiting(loaded.ns, holder, held_run))
            self._write(loaded.req, status)
            self._wait_for_lock(loaded.ns, held_run or loaded.run_name, loaded.name)  # its release wakes it
            # later passes check the lock before planning (_still_waiting); no holder: the Run changed under us
            return Next(WAIT_SECONDS if holder else self.settings.tick_seconds)
        if not idle and not holding:
            memory.lock_entry_written = True  # _lock_tree took the lock now, and wrote the run's entry
        if status.get("runSteps") is None and not idle:
            if not self._lock_in_force(loaded, memory):
                return Next(LOCK_PROBE_SECONDS)  # the API server does not refuse the run's steps yet
            if self._pin(loaded, memory):
                return Next(self.settings.tick_seconds)  # plan again, with exactly the steps pinned
        tree = self._tree_pass(loaded.req, status)  # the runs below this one, locked with it (None: no child runs)
        if loaded.recorded is None and not idle:
            # record the runners this request uses before any Job starts: it uses only those until it ends
            loaded.runners, loaded.readers = self._record_runners(loaded.req, status, loaded.plan, run_spec,
                                                                  loaded.prior, loaded.runners, loaded.readers)
        return Held(cancelling=spec.cancel, tree=tree, floor=tree.floor if tree is not None else 0)

    def _lock_in_force(self, loaded: Loaded, memory: PassMemory) -> bool:
        """Whether the Run's lock is in force at the API server (rule 11): its entry in its
        ClosedRunSlice is written (taking the lock wrote it; a process that did not take the lock
        itself writes it once more before its first probe, for a lock taken by a process that
        stopped before it wrote the entry)
        and a dry run of the run's next step is refused (:func:`reversi.adapters.closed_runs.probe`). After
        ``LOCK_PROBE_DEADLINE`` seconds of probes that are not refused (a halt refused the
        probe, or the policy is not installed) the request goes on, and the count before it ends
        finds any step recorded after the lock. Raises ``ApiException``."""
        if memory.lock_probed_since is None and not memory.lock_entry_written and \
                not self._close(loaded.ns, loaded.run_name, loaded.run_uid, loaded.name):
            return True  # its slice is full: no policy can refuse its steps (the count before the end finds them)
        if closed_runs.probe(self.kube.custom, loaded.ns, loaded.run_name, loaded.run_uid):
            memory.lock_probed_since = None
            return True
        now = time.monotonic()
        if memory.lock_probed_since is None:
            memory.lock_probed_since = now
        if now - memory.lock_probed_since < LOCK_PROBE_DEADLINE:
            return False
        log.warning("%s: the API server still admits steps of Run %s/%s %.0f s after the lock was taken (is the lock "
                    "policy installed?); planning anyway: steps recorded after the lock are found before the request "
                    "ends", loaded.ref, loaded.ns, loaded.run_name, LOCK_PROBE_DEADLINE)
        memory.lock_probed_since = None
        return True

    def _pin(self, loaded: Loaded, memory: PassMemory) -> bool:
        """Pin the steps the Run has now (``status.runSteps``): the Run is closed from now on, and
        the plan never takes a later step (rule 11). True when the count differs from the
        journal this pass planned (plan again first)."""
        status, size = loaded.status, loaded.journal.size
        status["runSteps"] = jr.count_steps(self.kube.custom, loaded.ns, loaded.run_name, size)
        memory.pinned_at = time.time()
        if status["runSteps"] != size or loaded.recorded is not None:
            self.kube.merge_status(REQUESTS, loaded.ns, loaded.name, {"runSteps": status["runSteps"]})
            return status["runSteps"] != size
        # else it is written with the runners, before any Job starts (a crash before that pins
        # again: the Run is closed, and the count before the end catches a late step)
        return False

    # ----------------------------------------------------------------------------- decide

    def _decide(self, loaded: Loaded, held: Held, memory: PassMemory) -> Decided:
        """What the engine decides from the request's status, the journal and its Jobs
        (:func:`reversi.engine.decide.decide`, pure): each step moved on, the Jobs to start, the
        journal entries and Events, and the report so far."""
        jobs = ix.jobs_of_run(self._indices(), self.kube, loaded.ns, loaded.run_uid)
        labels = jobs.labels() if isinstance(jobs, ix.RunJobs) else [j.metadata.labels or {} for j in jobs.values()]
        req_uid = loaded.req["metadata"].get("uid", "")

        def observe(role: ex.Role, attempt: int, read: int, step: int) -> ex.JobView | None:
            if role in jobs_mod.GUARD_ROLES:  # this request's own guard read, never an earlier request's answer
                read = jobs_mod.guard_read(labels, req_uid, step, attempt, role)
            jname = jobs_mod.job_name(loaded.run_uid, step, attempt, role, read)
            if jname in memory.views:
                return memory.views[jname]
            job = jobs.get(jname)
            if job is None:
                return None
            view = self.kube.job_view(job, reader=(role in ex.READ_ROLES))
            if view.state != "running":
                memory.views[jname] = view  # a finished Job's view never changes
            return view

        inputs = dc.PassInputs(request=loaded.name, spec=loaded.spec, plan=loaded.plan, graph=loaded.graph,
                               run=loaded.journal.spec, mine=loaded.mine, prior=loaded.prior,
                               entries=loaded.old_entries, now=loaded.now, started=loaded.started, observe=observe,
                               floor=held.floor, runner_names=frozenset(loaded.runners), readers=loaded.readers)
        d = dc.decide(inputs, memory.rng)
        first_reads = {e.step for e in d.effects if isinstance(e, ex.StartJob) and e.role == "reader" and e.read == 1}
        for old, new in d.moves:
            self._durations(loaded.ns, loaded.plan.actions[new.step].tool, old, new, memory, loaded.now,
                            new.step in first_reads)
        return Decided(inputs, d, labels, req_uid)

    # -------------------------------------------------------------------------------- act

    def _act(self, loaded: Loaded, decided: Decided, memory: PassMemory) -> None:
        """Carry out the decision: the journal on the Run first, then the Jobs, then the Events
        (rule 3). A Job the API server refuses for good fails only its own step: a compensator's
        step is failed by the engine (:func:`reversi.engine.decide.refused`), a read is a failed
        read. Raises ``ApiException`` for a transient error (the next pass tries again)."""
        d = decided.d
        effects = list(d.effects)
        self._journal(loaded.ns, loaded.run_name, loaded.name, [e for e in effects if isinstance(e, ex.Journal)],
                      loaded.plan, memory, reverified={u.step: u for u in loaded.prior if u.step in d.reverify})
        steps = {s.index: s for s in loaded.journal.spec.steps}
        verify_plans, guards = d.verify_plans, dict(d.guards)
        for e in effects:
            if not isinstance(e, ex.StartJob):
                continue
            if e.role in jobs_mod.GUARD_ROLES:
                e = replace(e, read=jobs_mod.guard_read(decided.labels, decided.req_uid, e.step, e.attempt, e.role))
            try:
                self._start_job(loaded.req, loaded.run_obj, loaded.plan, steps, verify_plans, loaded.runners,
                                loaded.spec, e, guards)
            except (ApiException, ValidationError, jobs_mod.CallTooLarge) as err:
                why = _refusal(err)  # raises again a transient error
                if e.role == "compensator" and e.step in d.runs:  # its handler cannot run: only this step fails
                    d, more = dc.refused(decided.inputs, d, e.step, f"cannot create the compensator Job: {why}")
                    self._journal(loaded.ns, loaded.run_name, loaded.name,
                                  [x for x in more if isinstance(x, ex.Journal)], loaded.plan, memory)
                    effects += [x for x in more if isinstance(x, ex.Note)]
                    continue
                jname = jobs_mod.job_name(loaded.run_uid, e.step, e.attempt, e.role, e.read)
                memory.views[jname] = ex.JobView("failed", f"cannot create the {e.role} Job: {why}")
        for e in effects:
            if isinstance(e, ex.Note):
                self.kube.event(loaded.req, e.reason, e.message, e.warning)
        decided.d = d

    # ----------------------------------------------------------------------------- report

    def _report(self, loaded: Loaded, held: Held, decided: Decided, memory: PassMemory) -> float | None:
        """Write what the pass found: the steps, the report and the phase
        (:mod:`reversi.engine.request_phase`, pure). When nothing can move any more the request
        ends (after a last count of the run boundary, rule 11): the Run is released, then the
        status written, then the Event. Returns the seconds until the next pass, or None."""
        d, tree, status = decided.d, held.tree, loaded.status
        end = d.ending
        if tree is not None:  # child runs: the next one as a unit once the steps above it are settled
            children_left = tree.next is not None
            self._drive_tree(loaded.req, loaded.spec, tree, d.settled, dc.stop_reason(loaded.spec) or (
                dc.deadline_text(loaded.spec) if d.deadline_passed else None))
            end = dc.conclude(decided.inputs, d, children_left=children_left or tree.next is not None)
        report, own_complete = self._status_of_steps(loaded, held, decided, end)
        verdict = report_message(report)
        if tree is not None:
            verdict += "; runs below: " + ", ".join(f"{x['run']} {x['outcome']}" for x in tree.ordered())
        ending = request_phase.ends(finished=end.finished, awaiting=d.awaiting, deadline_passed=d.deadline_passed)
        # a step stored just after the lock was counted: wait for it, or plan it (the pass goes on as Running)
        late = self._count_again(loaded.req, loaded.run_name, status, memory, loaded.now) if ending else None
        if ending and late is None:
            if report.foreign:
                self._tell_foreign(loaded.req, loaded.ns, loaded.run_name, report)
            said = request_phase.ending(
                complete=report.complete, verdict=verdict, undone_some=outcome_reason(report) == "Partial",
                compensates_nothing=not loaded.plan.of_kind(COMPENSATE) and tree is None,
                deadline_passed=d.deadline_passed, cancelled_by=loaded.spec.cancelled_by, cancelling=held.cancelling,
                awaiting=d.awaiting, approve_all=loaded.spec.approve_compensations)
            self._end(loaded, said, released_complete=own_complete, report=report, memory=memory,
                      stopped=held.cancelling or d.deadline_passed)
            return None
        child_busy = [x for x in (tree.ordered() if tree is not None else []) if x.get("outcome") == "running"]
        runs, progress = dict(end.runs), dict(end.progress)
        way = request_phase.under_way(
            running=bool(d.running), awaiting=d.awaiting, only_approvals_left=not d.running and not child_busy and not
            ready_steps(loaded.plan, loaded.graph, progress, loaded.spec.parallelism, floor=held.floor,
                        holding=ex.holding_slots(runs)),
            started_any=any(r.stage not in ("pending", "awaitingApproval", "deferred") for r in runs.values()),
            progress=status["progress"], active=st.active(runs),
            busy_children=[(x["run"], x.get("request")) for x in child_busy], verdict=verdict,
            approve_all=loaded.spec.approve_compensations)
        self._say(loaded.req, status, way)
        now = time.monotonic()
        if request_phase.may_defer_write(loaded.req.get("status") or {}, status, memory.unwritten_since, now):
            if memory.unwritten_since is None:
                memory.unwritten_since = now
        else:
            self._write(loaded.req, status)
            memory.unwritten_since = None
        return request_phase.next_pass(way.phase, tick_seconds=self.settings.tick_seconds, wait_seconds=WAIT_SECONDS,
                                       late=late)

    def _status_of_steps(self, loaded: Loaded, held: Held, decided: Decided, end: Any) -> tuple[Report, bool]:
        """Put each step's entry, the progress and the report in the pass's status; returns the
        report (complete only when every run of the tree is) and whether the request's own steps
        are complete."""
        d, tree, status, gen = decided.d, held.tree, loaded.status, loaded.gen
        limit, mlimit = self.settings.status_detail_limit, self.settings.message_limit
        report = end.report
        journal = loaded.journal
        if journal.foreign or journal.missing:  # not the run's steps: named, never undone
            report = report.model_copy(update={
                "foreign": [StepReason(step=i, reason=why) for i, why in sorted(journal.foreign.items())],
                "missing": list(journal.missing)})
        own_complete = report.complete
        if tree is not None:
            report = report.model_copy(update={"complete": own_complete and tree.complete()})
        keys = {s: u.idempotency_key for s, u in loaded.mine.items()}
        verify_tools = {s: v.tool for s, v in d.verify_plans.items()}
        status["steps"] = st.step_entries(loaded.plan, dict(end.runs), dict(end.deferred) if end.finished else {},
                                          keys, dict(d.approved), d.approved_all_by, gen, loaded.old_entries,
                                          verify_tools, limit, mlimit)
        if d.reverify:
            reread = st.reverify_entries(loaded.plan, dict(d.reverify), verify_tools, gen, loaded.old_entries, mlimit)
            status["steps"] = sorted(status["steps"] + reread, key=lambda e: e["step"])
        status["progress"] = progress_text(loaded.plan, dict(end.progress))
        status["report"] = st.report_status(report, mlimit)
        if tree is not None:
            status["report"]["runs"] = self._tree_sections(tree, report, own_complete, end.finished, held.cancelling)
        return report, own_complete

    def _tell_foreign(self, req: dict, ns: str, run: str, report: Report) -> None:
        """An Event (Warning ``ForeignSteps``) naming each RunStep that is not part of the run's
        record and the rule it broke; the metric ``reversi_foreign_steps`` counts them."""
        named = "; ".join(f"{jr.step_name(run, f.step)}: {f.reason}" for f in report.foreign[:5])
        more = f" (and {len(report.foreign) - 5} more)" if len(report.foreign) > 5 else ""
        self.kube.event(req, "ForeignSteps", f"{len(report.foreign)} RunStep(s) of Run {ns}/{run} are not part of its "
                        f"record and were not undone: {named}{more}", True)
        if self.metrics:
            self.metrics.foreign_steps(ns, len(report.foreign))

    def _say(self, req: dict, status: dict, said: request_phase.Phase) -> None:
        """Put phase ``said`` in ``status``: its phase and its conditions, readiness included."""
        gen = req["metadata"].get("generation", 1)
        status.update(phase=said.phase, conditions=st.summary_conditions(status.get("conditions") or [], gen,
                                                                         said.updates()))

    def _end(self, loaded: Loaded, said: request_phase.Ending, released_complete: bool | None = None,
             report: Report | None = None, memory: PassMemory | None = None, stopped: bool = False) -> None:
        """End a request that planned (``said``): release the Run first (``released_complete``;
        None: it never held it), saying what stands from the journal with what this request
        wrote (``memory``) and its report (``stopped``: cancelled or past its deadline), so whoever
        sees the final phase finds the Run free and its standing current (a crash in between only
        means the next pass ends the request again, from the journal)."""
        memory = memory or PassMemory()
        if released_complete is not None:
            undo = {**loaded.journal.undo, **memory.written}  # with what this pass wrote
            tools = {s.index: s.tool for s in loaded.journal.spec.steps}
            undone = frozenset(report.compensated) | frozenset(report.already_recovered) if report is not None \
                else frozenset()
            self._release(loaded.ns, loaded.run_name, loaded.name, released_complete, stopped=stopped,
                          undone=undone, journal=(undo, tools))
            self._release_tree(loaded.ns, loaded.name, loaded.status, stopped=stopped)
        self._end_with(loaded.req, loaded.status, said, report=report, plan=loaded.plan)

    def _end_with(self, req: dict, status: dict, said: request_phase.Ending, report: Report | None = None,
                  plan: Plan | None = None) -> None:
        """Write the end ``said`` (phase, conditions, ``completionTime``), then its Event and the
        ``reversi_rollbacks_total`` verdict: the one way every request ends."""
        ns = req["metadata"]["namespace"]
        self._say(req, status, said)
        status["completionTime"] = st.iso(time.time())
        self._write(req, status)
        if said.event:
            self.kube.event(req, said.event, said.verdict, warning=said.warning)
        if self.metrics:
            self.metrics.request_finished(ns, said.outcome, report, plan)


    # --------------------------------------------------------------------------- loading

    def _journal_of(self, req: dict, spec: RollbackRequestSpec, run_obj: dict,
                    memory: PassMemory) -> tuple[dict, Journal | None]:
        """The Run (read again after moving an inline journal of Reversi 0.1 into RunSteps) and
        its journal as this request plans it: the steps pinned at the lock (rule 11), or None
        while the RunSteps are still being listed or their watch has not caught up with a gap
        (at most ``GAP_PASSES`` passes; a gap that stays is a call never recorded there, named in the
        report). Raises :class:`CannotCarryOut` for a journal that cannot be read."""
        meta = req["metadata"]
        ns, ref = meta["namespace"], f"RollbackRequest {meta['namespace']}/{meta['name']}"
        try:
            if not jr.inline_moved(run_obj):
                jr.migrate_inline(self.kube.custom, run_obj)  # a Run of Reversi 0.1: its steps become RunSteps
                run_obj = self.kube.get(RUNS, ns, spec.run_ref.name) or run_obj
            journal = self._load_journal(run_obj, memory)
        except jr.JournalError as err:
            raise CannotCarryOut(cond.INVALID_SPEC, f"{ref}: {err}") from err
        if journal is None:
            log.info("%s: the RunSteps of Run %s/%s are still being listed", ref, ns, spec.run_ref.name)
            return run_obj, None
        if (req.get("status") or {}).get("runSteps") is not None:  # the Run as it stood at the lock (rule 11)
            journal = journal.upto(req["status"]["runSteps"])
        if journal.missing:
            memory.gap_passes += 1
            if memory.gap_passes <= GAP_PASSES:
                return run_obj, None  # the watch of RunSteps may not have caught up yet
            if memory.gap_passes == GAP_PASSES + 1:  # no call was recorded there: the report names them
                log.info("%s: %s", ref, journal.gap_message(f"{ns}/{spec.run_ref.name}"))
            return run_obj, journal
        memory.gap_passes = 0
        return run_obj, journal

    def _runners_of(self, req: dict, ref: str, ns: str, run_spec: Any) -> tuple[Any, Any, dict, Any]:
        """``(recorded, manifest, runners by name, readers)``: the runners recorded when this
        request took the lock (then the live ToolManifest is not read), else the live manifest's
        (``manifest`` None when it is gone). Raises :class:`CannotCarryOut` for a recorded list that is
        not one."""
        try:
            recorded = rs.from_record((req.get("status") or {}).get("runners"))
        except ValidationError as err:
            raise CannotCarryOut(cond.INVALID_SPEC,
                f"{ref}: status.runners is not a list of runners: {_first_error(err)}; "
                "create a new RollbackRequest") from err
        manifest = None
        if recorded is None:
            manifest = self._live_manifest(ref, ns, run_spec.manifest_ref.name)
        runners, readers_now = recorded or ({r.name: r for r in manifest.runners} if manifest else {},
                                            current_readers(manifest))
        return recorded, manifest, runners, readers_now

    # --------------------------------------------------------------------------- helpers

    def _durations(self, ns: str, tool: str, old: ex.StepRun, new: ex.StepRun, memory: PassMemory, now: float,
                   first_read: bool = False) -> None:
        """Time compensator attempts and verifications (histograms; in-memory start times, so a
        step in flight across an operator restart is not timed).

        A verification is timed from the pass that starts its first read-back (``first_read``: the
        pass starts the step's reader Job of read 1) to the pass that sees its verdict, whatever stage that pass
        rebuilt the step from: a hand-over from the compensator to its first read-back is not
        written to the request's status (:func:`reversi.engine.request_phase.only_under_way`), so
        the pass that sees the verdict often starts again from ``compensating``. Read-backs of an
        earlier request's undo (rule 5) are timed the same way."""
        s = new.step
        if new.stage == "compensating" and (old.stage != "compensating" or old.attempts != new.attempts):
            memory.since[(s, "compensation")] = now
        if first_read:
            memory.since.setdefault((s, "verification"), now)
        if old.stage == "compensating" and new.stage != "compensating":
            started = memory.since.pop((s, "compensation"), None)
            if started is not None and self.metrics:
                self.metrics.observe_compensation(ns, tool, now - started)
        if new.stage in ("compensated", "failed") and old.stage not in ("compensated", "failed"):
            started = memory.since.pop((s, "verification"), None)
            if started is not None and self.metrics:
                self.metrics.observe_verification(ns, tool, now - started)

    def _count_again(self, req: dict, run: str, status: dict, memory: PassMemory, now: float) -> float | None:
        """The last check of the run boundary (rule 11) before a request that took the lock ends.

        The step webhook admits a step when it reads the Run open, and the API server stores the
        step a moment later; a lock taken in between counts the steps (``status.runSteps``)
        without it, although its call was made. So, once ``BOUNDARY_GRACE_SECONDS`` have passed
        since this process pinned the count, the steps are counted again (consistent GETs): more
        steps are pinned (an Event ``StepsAdmittedAtLock`` says which) and the request plans them
        like any other. Returns the seconds to wait before the next pass, or ``None`` to finish
        now. Raises ``ApiException``."""
        pinned = status.get("runSteps")
        if pinned is None:
            return None  # never took the lock (a dry run, cancelled while waiting)
        if memory.pinned_at is not None and now < memory.pinned_at + BOUNDARY_GRACE_SECONDS:
            return memory.pinned_at + BOUNDARY_GRACE_SECONDS - now
        meta = req["metadata"]
        found = jr.count_steps(self.kube.custom, meta["namespace"], run, pinned)
        if found <= pinned:
            return None
        status["runSteps"] = found
        self.kube.merge_status(REQUESTS, meta["namespace"], meta["name"], {"runSteps": found})
        memory.pinned_at = now
        self.kube.event(req, "StepsAdmittedAtLock",
                        f"step(s) {pinned}..{found - 1} of Run {meta['namespace']}/{run} were admitted as the lock was "
                        f"taken and stored after the steps were counted: they are part of this rollback", True)
        return self.settings.tick_seconds

    def _still_waiting(self, req: dict, spec: RollbackRequestSpec, run_obj: dict) -> bool:
        """Whether the request, already ``Waiting`` for the lock (same generation, same holder),
        still must wait: then the pass ends before it reads the journal or plans (a 10,000-step
        plan is not rebuilt every pass while another request works on the Run). The request is
        registered for the Run's release first and the Run read again, so a release in between
        is never missed. Raises ``ApiException``."""
        meta = req["metadata"]
        ns, name = meta["namespace"], meta["name"]
        status = req.get("status") or {}
        holder = (run_obj.get("status") or {}).get("activeRequest")
        if not holder or holder == name or spec.cancel or spec.dry_run:
            return False
        if not request_phase.already_waiting(status, meta.get("generation", 1), ns, holder, spec.run_ref.name):
            return False  # not Waiting, edited since, or waiting for another holder (or a run below): a full pass says
        self._wait_for_lock(ns, spec.run_ref.name, name)
        fresh = self.kube.get(RUNS, ns, spec.run_ref.name)
        if fresh is None or (fresh.get("status") or {}).get("activeRequest") != holder:
            return False
        other = self.kube.get(REQUESTS, ns, holder)
        return other is not None and (other.get("status") or {}).get("phase") not in TERMINAL_PHASES \
            and not other["metadata"].get("deletionTimestamp")

    def _lock(self, run_obj: dict, name: str, ns: str) -> bool:
        """Take the Run's lock for request ``name`` (optimistic concurrency), or report that
        another live request holds it."""
        run_status = run_obj.get("status") or {}
        holder = run_status.get("activeRequest")
        if holder == name:
            return True
        if holder:
            other = self.kube.get(REQUESTS, ns, holder)
            if other is not None and (other.get("status") or {}).get("phase") not in TERMINAL_PHASES \
                    and not other["metadata"].get("deletionTimestamp"):
                return False
        run_gen = run_obj["metadata"].get("generation")
        conds = cond.set_condition(run_status.get("conditions") or [], cond.condition(
            cond.LOCKED, cond.TRUE, cond.HELD_BY_REQUEST, f"RollbackRequest {name} is undoing this run", run_gen))
        conds = st.summary_conditions(conds, run_gen, st.run_readiness(conds, run_obj["metadata"]["name"]))
        # taking the lock closes the run to new steps for good (rule 11): closedBy is never cleared
        closed = {"closedBy": run_status.get("closedBy") or name}
        try:
            self.kube.merge_status(RUNS, ns, run_obj["metadata"]["name"],
                                   {"activeRequest": name, "lastRequest": name, "conditions": conds,
                                    "observedGeneration": run_gen, **closed},
                                   resource_version=run_obj["metadata"]["resourceVersion"])
        except Conflict:
            return False  # someone else changed the run: look again next pass
        # the API server's lock policy refuses the run's recorded calls from now on (its informer lag)
        self._close(ns, run_obj["metadata"]["name"], run_obj["metadata"]["uid"], run_status.get("closedBy") or name)
        return True

    def _close(self, ns: str, run: str, uid: str, request: str, ended: bool = False) -> bool:
        """Write Run ``run``'s entry in its ClosedRunSlice (:func:`reversi.adapters.closed_runs.close`)
        and export how many runs the slice holds; False (logged) when the slice is full: the API
        server then cannot refuse the run's steps, and the count before the request ends finds
        any recorded after the lock. Raises ``ApiException``."""
        try:
            held = closed_runs.close(self.kube.custom, ns, run, uid, request, ended=ended)
        except closed_runs.SliceFull as err:
            log.warning("Run %s/%s: %s", ns, run, err)
            return False
        if self.metrics:
            self.metrics.closed_runs.labels(ns, closed_runs.slice_name(run)).set(held)
        return True

    def _release(self, ns: str, run_name: str, name: str, complete: bool, deleted: bool = False, *,
                 stopped: bool = False, writers: frozenset[str] = frozenset(), undone: frozenset[int] = frozenset(),
                 journal: tuple[dict[int, StepUndo], dict[int, str]] | None = None, settling: bool = False) -> None:
        """Release Run ``run_name``'s lock as request ``name`` ends, when it still holds it, and
        say what stands (docs/concepts.md#what-stands): ``RolledBack`` and ``status.standing`` as
        :func:`reversi.engine.standing.after_rollback` makes them from the run's journal
        (``journal``: ``(undo by step, tool by step)`` as the request last saw it; None: read now),
        ``complete`` (the report's verdict for this run), ``stopped`` (cancelled, past its
        deadline, failed), ``deleted``, ``writers`` (besides ``name``, requests whose undo entries
        are this rollback's: a child run's request) and ``undone`` (steps its report found undone).
        A request that undid nothing leaves what stands as it was. ``settling``: the undo entries
        a request deleted mid-way left were settled after its lock was released: say what stands
        again, while no other request holds the run. Raises ``ApiException``."""
        run_obj = self.kube.get(RUNS, ns, run_name)
        if run_obj is None or (run_obj.get("status") or {}).get("activeRequest") != (None if settling else name):
            return
        if journal is None:
            journal = self._journal_now(run_obj)
        settled = None
        if journal is not None:
            status = run_obj.get("status") or {}
            rolled = (cond.get_condition(status.get("conditions"), cond.ROLLED_BACK) or {}).get("status")
            ending = standing.Ending(name, frozenset({name}) | writers, complete, stopped=stopped or deleted,
                                     undone=undone)
            settled = standing.after_rollback(rolled, status.get("standing"), journal[0], journal[1], ending)
        update = st.run_release_update(run_obj, name, settled, complete=complete, deleted=deleted,
                                       now=st.iso(time.time()))
        try:
            self.kube.merge_status(RUNS, ns, run_name, update, resource_version=run_obj["metadata"]["resourceVersion"])
        except Conflict:
            self._release(ns, run_name, name, complete, deleted, stopped=stopped, writers=writers, undone=undone,
                          journal=journal, settling=settling)
            return
        if not settling:  # the run stays closed (rule 11): its entry now says the rollback ended, for the refusal
            closed_by = (run_obj.get("status") or {}).get("closedBy") or name
            self._close(ns, run_name, run_obj["metadata"]["uid"], closed_by, ended=True)

    def _journal_now(self, run_obj: dict) -> tuple[dict[int, StepUndo], dict[int, str]] | None:
        """``(undo by step, tool by step)`` of a run's journal as it is now (its informer, else a
        paged LIST), or None when it cannot be read (logged): what stands is then left as it was."""
        meta = run_obj["metadata"]
        try:
            journal = self._load_journal(run_obj, PassMemory())
        except (jr.JournalError, ApiException) as err:
            log.warning("Run %s/%s: journal not read, what stands is left as it was: %s", meta["namespace"],
                        meta["name"], err)
            return None
        if journal is None:
            log.warning("Run %s/%s: journal still being listed, what stands is left as it was", meta["namespace"],
                        meta["name"])
            return None
        return dict(journal.undo), {s.index: s.tool for s in journal.spec.steps}

    # ------------------------------------------------------------------ a request deleted mid-way

    def request_deleted(self, namespace: str, name: str, run_name: str | None) -> None:
        """RollbackRequest ``namespace/name`` of Run ``run_name`` is gone (rule 14): its
        compensator Jobs, owned by the Run, keep running; every ``compensating`` entry it left
        whose Job has finished is settled from the Job's true outcome
        (:func:`reversi.engine.orphans.settle`), and the Run's lock is released if it still names
        the request (``Locked=False`` reason ``RequestDeleted``). Entries whose Job still runs are
        settled when it finishes (:meth:`job_finished`). Idempotent; raises ``ApiException``."""
        if not run_name:
            return
        run_obj = self.kube.get(RUNS, namespace, run_name)
        if run_obj is None:
            return
        settled = self._settle_orphans(run_obj, name)
        holder = (run_obj.get("status") or {}).get("activeRequest")
        if holder == name:
            self._release(namespace, run_name, name, complete=False, deleted=True, journal=settled)
            self._release_tree_of(run_obj, name)  # the runs below it, locked with it (nested runs)
        elif settled is not None and not holder:  # a compensator it left finished after the lock was released
            self._release(namespace, run_name, name, complete=False, deleted=True, journal=settled, settling=True)

    def lock_orphaned(self, namespace: str, run_name: str, holder: str) -> None:
        """Run ``namespace/run_name`` names ``holder`` in ``status.activeRequest``: when that
        RollbackRequest no longer exists (deleted while the operator was down, so its deletion was
        never seen), do what its deletion does (:meth:`request_deleted`): settle what it left and
        release the lock. One GET of the request; raises ``ApiException``."""
        if self.kube.get(REQUESTS, namespace, holder) is None:
            log.info("Run %s/%s is locked by RollbackRequest %s, which no longer exists: releasing it",
                     namespace, run_name, holder)
            self.request_deleted(namespace, holder, run_name)

    def job_finished(self, namespace: str, job: dict) -> None:
        """A compensator Job finished: when the request that started it no longer exists (deleted
        mid-way, also while the operator was down), settle what it left (:meth:`request_deleted`)."""
        meta = job.get("metadata") or {}
        request = (meta.get("annotations") or {}).get(jobs_mod.ANNOTATION_REQUEST)
        run_name = (meta.get("annotations") or {}).get(jobs_mod.ANNOTATION_RUN)
        if not request or not run_name:
            return
        req = self.kube.get(REQUESTS, namespace, request)
        started_by = (meta.get("labels") or {}).get(jobs_mod.LABEL_REQUEST_UID)
        meta_now = (req or {}).get("metadata") or {}
        if req is not None and not meta_now.get("deletionTimestamp") and meta_now.get("uid") == started_by:
            return  # its request lives: its worker records the outcome
        self.request_deleted(namespace, request, run_name)

    def _settle_orphans(self, run_obj: dict,
                        request: str) -> tuple[dict[int, StepUndo], dict[int, str]] | None:
        """Settle the ``compensating`` entries ``request`` left whose Jobs have finished; when it
        wrote one, the journal with them (``(undo by step, tool by step)``), else None."""
        meta = run_obj["metadata"]
        ns, run_name, run_uid = meta["namespace"], meta["name"], meta["uid"]
        try:
            journal = self._load_journal(run_obj, PassMemory())
        except jr.JournalError as err:
            log.warning("Run %s/%s: cannot read its journal to settle what %s left: %s", ns, run_name, request, err)
            return None
        if journal is None:
            return None  # its informer is still listing: the Job's next event, or the next request, settles them
        left = [u for u in journal.undo.values() if u.state == "compensating" and u.request == request]
        if not left:
            return None
        jobs = self.kube.list_jobs(ns, f"{jobs_mod.LABEL_RUN_UID}={run_uid},{jobs_mod.LABEL_ROLE}=compensator")
        steps = {s.index: s for s in journal.spec.steps}
        undo = dict(journal.undo)
        wrote = False
        for entry in left:
            job = jobs.get(jobs_mod.job_name(run_uid, entry.step, entry.attempts))
            if job is None:
                continue  # never created (or gone): the next request adopts or creates it (rule 3)
            step = steps.get(entry.step)
            snapshot = journal.spec.snapshot_of(step) if step is not None else None
            settled = orphans.settle(entry, request=request, attempt=entry.attempts,
                                     job=self.kube.job_view(job, reader=False),
                                     readback_declared=snapshot is not None and snapshot.verification is not None,
                                     now=st.iso(time.time()) or "")
            if settled is not None:
                jr.write_undo(self.kube.custom, ns, run_name, settled)
                undo[entry.step], wrote = settled, True
                log.info("Run %s/%s: step %d left compensating by deleted RollbackRequest %s settled %s from Job %s",
                         ns, run_name, entry.step, request, settled.state, job.metadata.name)
        return (undo, {s.index: s.tool for s in journal.spec.steps}) if wrote else None

    def _journal(self, ns: str, run_name: str, request: str, entries: list[ex.Journal], plan,
                 memory: PassMemory | None = None, reverified: dict[int, StepUndo] | None = None) -> None:
        """Write each step's undo state on its RunStep (status) before any Job starts (rule 3).
        Only the request holding the Run's lock writes undo state, so no write can race another;
        ``memory.written`` keeps what was written until the watch brings it back."""
        for j in entries:
            value = dc.journal_entry(j, key=plan.actions[j.step].idempotency_key, request=request,
                                     at=st.iso(time.time()), error=st.cut(j.error, self.settings.message_limit),
                                     earlier=(reverified or {}).get(j.step))
            try:
                jr.write_undo(self.kube.custom, ns, run_name, value)
            except ApiException as err:
                if err.status == 404:
                    raise CannotCarryOut(cond.RUN_NOT_FOUND,
                        f"step {j.step} of Run {ns}/{run_name} was deleted during the "
                        "rollback") from err
                raise
            if memory is not None:
                memory.written[j.step] = value

    def _load_journal(self, run_obj: dict, memory: PassMemory):
        """The run's journal: from the run's informer when the operator runs (no API call after
        its first LIST; None while that LIST is not in), else one paged LIST (a reconciler used on
        its own, e.g. in a test)."""
        meta = run_obj["metadata"]
        journals = self.shared.journals if self.shared is not None else None
        memory.journal_version = None
        if journals is None:
            return jr.load(self.kube.custom, run_obj)
        found = journals.versioned_entries(meta["namespace"], meta["name"], wait=self.settings.journal_sync_seconds)
        if found is None:
            return None
        memory.journal_version, entries = found
        spec, legacy = jr.inline_journal(run_obj)
        return ix.journal(entries, spec, legacy, overlay=memory.written, run_uid=meta["uid"])

    def _live_manifest(self, ref: str, ns: str, name: str) -> ToolManifestSpec | None:
        """The ToolManifest as it is now (kopf's index, else the API); None when missing. Raises
        :class:`CannotCarryOut` when it is invalid."""
        indices = self._indices()
        if indices is not None and (ns, name) in indices.manifests:
            manifest = ix.manifest(indices, ns, name, self.kube)
            if manifest is None:
                raise CannotCarryOut(cond.MANIFEST_INVALID, f"{ref}: ToolManifest {ns}/{name} is invalid; "
                              "fix it (kubectl apply shows what is wrong)")
            return manifest
        return self._manifest(ref, ns, name)

    def _record_runners(self, req: dict, status: dict, plan, run_spec: RunSpec, prior: list[StepUndo],
                        runners: dict[str, Runner],
                        readers: dict[str, str]) -> tuple[dict[str, Runner], dict[str, str]]:
        """Write ``status.runners`` (the runners the plan needs, as the ToolManifest gives them
        now) and say so in an Event; return them as :func:`reversi.engine.runners.from_record`
        reads them back. Raises :class:`CannotCarryOut` (``RunnersTooLarge``) when they are too big to keep."""
        meta = req["metadata"]
        ns, name = meta["namespace"], meta["name"]
        entries = rs.record(runners, rs.runners_needed(plan, run_spec, prior, runners, readers))
        size = rs.record_size(entries)
        if size > rs.RECORD_LIMIT_BYTES:
            raise CannotCarryOut(cond.RUNNERS_TOO_LARGE,
                f"RollbackRequest {ns}/{name}: the runners it needs take {size} bytes "
                f"of JSON, more than the limit of {rs.RECORD_LIMIT_BYTES}; keep runners small (long "
                "configuration belongs in a ConfigMap named by envFrom), then create a new RollbackRequest")
        status["runners"] = entries
        # with the step count pinned in this pass (one write)
        pinned = {"runSteps": status["runSteps"]} if status.get("runSteps") is not None else {}
        self.kube.merge_status(REQUESTS, ns, name, {"runners": entries, **pinned})
        manifest = run_spec.manifest_ref.name
        used = ", ".join(f"{e['name']} ({e['image']})" for e in entries)
        self.kube.event(req, "RunnersRecorded", (
            f"uses runners {used} as ToolManifest {ns}/{manifest} gave them now (status.runners) until it ends; a "
            "later change to the ToolManifest affects the next request") if used else (
            "needs no runner: no step of the run is left to undo or read back (earlier requests settled them; "
            "see the report)"))
        return rs.from_record(entries) or ({}, {})

    def _manifest(self, ref: str, ns: str, name: str) -> ToolManifestSpec | None:
        manifest_obj = self.kube.get(MANIFESTS, ns, name)
        if manifest_obj is None:
            return None
        try:
            return ToolManifestSpec.model_validate(manifest_obj.get("spec") or {})
        except ValidationError as err:
            raise CannotCarryOut(cond.MANIFEST_INVALID,
                          f"{ref}: ToolManifest {ns}/{name} is invalid: {_first_error(err)}") from err

    def _start_job(self, req: dict, run_obj: dict, plan, steps_by_index, verify_plans, runners: dict[str, Runner],
                   spec: RollbackRequestSpec, e: ex.StartJob, guards: dict[int, ex.Guards] | None = None) -> None:
        """Create (or adopt) the Job of one effect, with the Secret carrying its call (the Job contract).
        ``runners``: the request's recorded runners (``status.runners``), never the live ToolManifest's;
        ``guards``: each step's precheck and precondition reads (role ``precheck``/``precondition``)."""
        meta = req["metadata"]
        run_meta = run_obj["metadata"]
        # owned by the Run: deleting the request never kills a compensator mid-call (rule 14)
        owner = jobs_mod.Owner(meta["namespace"], run_meta["name"], run_meta["uid"], kind="Run")
        action = plan.actions[e.step]
        common = dict(owner=owner, run_name=run_meta["name"], run_uid=run_meta["uid"], step=e.step, attempt=e.attempt,
                      deadline_seconds=spec.deadline_seconds, settings=self.job_settings,
                      request=jobs_mod.Owner(meta["namespace"], meta["name"], meta["uid"]))
        gs = (guards or {}).get(e.step) or ex.NO_GUARDS
        vp = {"reader": verify_plans.get(e.step), "precheck": gs.precheck, "precondition": gs.precondition,
              "compensator": None, "check": None}[e.role]
        # the plan made a step whose runners are missing handlerUnavailable: its runner is there
        runner = runners[vp.runner] if vp is not None and vp.runner else runners[action.runner]
        command = list(spec.verify_command or []) if e.role == "check" else None
        ref: jobs_mod.CallRef | None = None  # None: the Job's own Secret
        if action.kind == COMPENSATE and action.runner:
            # a step of this request's plan reads its call from its slice's calls Secret
            secret, ref = self._calls_secret(run_obj, plan, steps_by_index, verify_plans, guards or {}, e, owner)
            job = jobs_mod.job_for(runner=runner, call_ref=ref, role=e.role, read=e.read, command=command, **common)
        else:  # the read-back of an earlier request's undo (re-verify, rule 5): a Secret of its own
            assert vp is not None and vp.tool is not None, f"step {e.step}: a {e.role} Job without a read"
            secret, job = jobs_mod.build_job(runner=runner, call=jobs_mod.reader_call(vp.tool, vp.args),
                                             role=e.role, read=e.read, **common)
        # a call too long for REVERSI_CALL: no Job, which could never start its program
        jobs_mod.check_job_call_size(secret["stringData"][ref.call_key if ref is not None else jobs_mod.CALL_KEY],
                                 f"the {e.role} call of step {e.step}")
        created = self.kube.create_job(secret, job)
        if not created:
            log.info("adopted existing Job %s/%s", meta["namespace"], job["metadata"]["name"])

    def _calls_secret(self, run_obj: dict, plan, steps_by_index, verify_plans, guards: dict[int, ex.Guards],
                      e: ex.StartJob, owner: jobs_mod.Owner) -> tuple[dict, jobs_mod.CallRef]:
        """The calls Secret of the slice of ``e.step`` (every call the plan's compensations of that
        slice may need; adapters/jobs.py) and where ``e``'s call is in it."""
        run_meta = run_obj["metadata"]
        part = jobs_mod.slice_of(e.step)
        entries: dict[int, dict[str, str]] = {}
        first = part * jobs_mod.CALLS_PER_SECRET  # plan.actions[s] is step s's action
        for a in plan.actions[first:first + jobs_mod.CALLS_PER_SECRET]:
            if a.kind != COMPENSATE or not a.runner:
                continue
            gs = guards.get(a.step) or ex.NO_GUARDS
            reads = {"reader": verify_plans.get(a.step), "precheck": gs.precheck, "precondition": gs.precondition}
            calls = {"compensator": _compensator_call(run_meta, a, steps_by_index[a.step], bool(gs.forced_by)),
                     **{role: jobs_mod.reader_call(r.tool, r.args) if r is not None and r.mode == "reader" and r.tool
                        else None for role, r in reads.items()}}
            entries[a.step] = jobs_mod.step_calls(a.step, calls, a.idempotency_key)
        key = jobs_mod.call_key(e.step, e.role)
        for name, data in jobs_mod.pack_calls(run_meta["uid"], entries):
            if key in data:
                ref = jobs_mod.CallRef(name, key, jobs_mod.idempotency_key_key(e.step)
                                       if e.role in ("compensator", "check") else None)
                return jobs_mod.calls_secret(name, owner, run_meta["uid"], data), ref
        raise AssertionError(f"the {e.role} call of step {e.step} is not in the calls of its slice")

    def _run_missing(self, req: dict, run: str) -> float:
        """The Run does not exist (yet), and the request never found it (one it found and that was
        deleted since fails at once, :meth:`_load`): wait for it, phase ``Pending`` with ``Planned=False``
        reason ``RunNotFound``, up to ``run_wait_seconds`` after the request was created (a GitOps
        apply may create both at once, in any order); the Run's creation wakes the request
        (:func:`reversi.handlers.rollback.run_seen`). Then fail ``RunNotFound``."""
        meta = req["metadata"]
        ns, name, gen = meta["namespace"], meta["name"], meta.get("generation", 1)
        limit = self.settings.run_wait_seconds
        created = _epoch(meta.get("creationTimestamp")) or time.time()
        left = created + limit - time.time()
        where = f"RollbackRequest {ns}/{name}: Run {ns}/{run}"
        if left <= 0:
            self._wait_for_run(ns, run, name, False)
            raise CannotCarryOut(cond.RUN_NOT_FOUND, f"{where} not found (waited {limit:g}s for it to be created); "
                          "create the Run and a new request, or fix spec.runRef.name")
        status = dict(req.get("status") or {})
        message = (f"{where} not found; waiting for it to be created (up to {limit:g}s after the request, until "
                   f"{st.iso(created + limit)}), then the request fails; check spec.runRef.name")
        said = request_phase.run_missing(message)
        conds = st.summary_conditions(status.get("conditions") or [], gen, said.updates())
        if status.get("phase") != said.phase or conds != status.get("conditions"):
            status.update(phase=said.phase, conditions=conds, observedGeneration=gen)
            self._write(req, status)
            if (req.get("status") or {}).get("phase") != said.phase:
                self.kube.event(req, cond.RUN_NOT_FOUND, message)
        return max(min(left, WAIT_SECONDS * 12), 0.1)

    def _run_settling(self, req: dict, run_obj: dict) -> float | None:
        """A request that waited for its Run (``RunNotFound``) gives the steps applied with the Run
        (the same GitOps commit, a script creating both) ``run_settle_seconds`` after the Run's
        creation to arrive before it plans; the seconds left, or None."""
        planned = cond.get_condition((req.get("status") or {}).get("conditions"), cond.PLANNED) or {}
        if planned.get("reason") != cond.RUN_NOT_FOUND:
            return None
        created = _epoch(run_obj["metadata"].get("creationTimestamp")) or 0
        left = created + self.settings.run_settle_seconds - time.time()
        return left if left > 0 else None

    def _write(self, req: dict, status: dict) -> None:
        meta = req["metadata"]
        if status == (req.get("status") or {}):
            return
        self.kube.merge_status(REQUESTS, meta["namespace"], meta["name"], status)

    def _fail(self, req: dict, reason: str, message: str) -> None:
        """End the request ``Failed`` with an ``Invalid`` condition that says what to fix
        (:func:`reversi.engine.request_phase.failed`); a Run it held is released and marked not
        rolled back."""
        meta = req["metadata"]
        status = dict(req.get("status") or {})
        status["observedGeneration"] = meta.get("generation", 1)
        if reason == cond.RUN_NOT_FOUND and status.get("report"):  # the Run went mid-way: what ran is unknown
            started = {e["step"] for e in status.get("steps") or [] if (e.get("attempts") or 0) > 0}
            report = when_run_gone(Report.model_validate(status["report"]), started)
            status["report"] = st.report_status(report, self.settings.message_limit)
        run_name = run_ref_name(req)
        if run_name:
            self._release(meta["namespace"], run_name, meta["name"], complete=False, stopped=True)
            self._release_tree(meta["namespace"], meta["name"], status, stopped=True)
        self._end_with(req, status, request_phase.failed(reason, message))


def _refusal(err: Exception) -> str:
    """What a refused Job creation says: the API server's message, the first validation error,
    or the size check's. Raises ``err`` again when it is transient (a 5xx or 429: the next pass
    tries again)."""
    if isinstance(err, ApiException):
        if err.status >= 500 or err.status == 429:
            raise err
        return api_message(err)
    return _first_error(err) if isinstance(err, ValidationError) else str(err)


def _compensator_call(run_meta: dict, action, step, forced: bool) -> dict:
    return jobs_mod.compensator_call(f"{run_meta['namespace']}/{run_meta['name']}", action.step,
                                     action.compensation_tool, step.tool, action.args, action.idempotency_key,
                                     forced)


def run_gone(status: dict, run_obj: dict | None) -> str | None:
    """Why the Run a request locked is no longer there, or None. A request that pinned
    ``status.runSteps`` took the Run's lock, which set the Run's ``status.closedBy`` (never
    cleared). If the Run is now missing, or has no ``closedBy`` (a new Run under the same name:
    deleted and created again, e.g. by a GitOps re-sync), the request's progress
    (``status.steps``, ``runSteps``, ``runners``) belongs to a Run that no longer exists and must
    never be reported as the new Run's. Uses no clock (the operator's and the API server's may differ)."""
    if status.get("runSteps") is None:
        return None
    if run_obj is None:
        return "was deleted"
    if not (run_obj.get("status") or {}).get("closedBy"):
        return "was deleted and created again"
    return None


def _plan_key(run_obj: dict, req: dict, memory: PassMemory, started: float, runner_names: set[str],
              readers: dict[str, str], handlers_known: bool) -> tuple | None:
    """What a request's plan is built from: the Run (its resourceVersion), its journal (the
    informer's version, and the undo this process wrote but has not seen come back), the steps
    pinned at the lock, the start time and the runners. Equal keys give equal plans, so the plan
    is rebuilt only when one of them changed. None (never cached) without an informer."""
    if memory.journal_version is None:
        return None
    written = tuple((s, u.state, u.attempts, u.verification, u.verified_by, u.request)
                    for s, u in sorted(memory.written.items()))
    return (run_obj["metadata"].get("resourceVersion"), memory.journal_version, written,
            (req.get("status") or {}).get("runSteps"), started, tuple(sorted(runner_names)),
            tuple(sorted(readers.items())), handlers_known)


def current_readers(manifest: ToolManifestSpec | None) -> dict[str, str]:
    """``{read-back tool: runner}`` the ToolManifest gives now (runners it defines)."""
    if manifest is None:
        return {}
    names = {r.name for r in manifest.runners}
    return {t.verification.tool: t.verification.runner for t in manifest.tools
            if t.verification is not None and t.verification.runner in names}


def _first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
