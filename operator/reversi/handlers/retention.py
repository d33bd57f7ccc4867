"""Retention: Runs deleted with their steps a set time after their last activity, once nothing
about them is unfinished (docs/concepts.md#retention, docs/operations.md#retention-and-archive).

One controller shaped like the rest of the operator (client-go's workqueue and informers): the
operator's informers of Runs, Namespaces and RollbackRequests (:mod:`reversi.adapters.informer`)
put a Run's key on a keyed :class:`reversi.workqueue.WorkQueue`; ``settings.retention_workers``
threads take the keys that are due and run one pass each. A pass reads from those caches,
decides with the pure rules of :mod:`reversi.engine.retention`, acts, and says when to look
again: when the Run's keeping ends by itself (the TTL after its last activity), else never (an
event brings it back). No timer per Run, no LIST per pass.

Reading the newest step (rule 9) is the one read a pass makes of the API before it decides,
and only for a Run that every other rule lets go: metadata-only GETs of ``<run>-<index>``
(:func:`reversi.adapters.journal.newest_step`), two when the step count a pass saw before is
still right, about ``2 * log2(steps)`` the first time. The operator never watches RunSteps for
this.

Acting: the Run is deleted in the background with preconditions (its uid, and the
resourceVersion the pass decided on: a Run changed in between is decided again), so the garbage
collector deletes its RunSteps, Jobs and call Secrets. Deletes are paced
(``settings.retention_deletes_per_second``) so that agents recording at the same time keep
their API server. Each deleted Run leaves an Event ``RunDeleted`` (the Run is gone, the Event
names it) and counts in ``reversi_runs_deleted_total{reason="expired"}``. With the archive on,
the Run's record is written first and the Run is deleted only after the write committed
(:mod:`reversi.handlers.archive`); the finalizer that keeps a Run deleted by hand until it is
archived (:mod:`reversi.handlers.finalizer`) is taken off just before the delete (``release``),
so the Run is not written twice.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import conditions as cond
from ..adapters import journal as jr
from ..adapters.informer import Informer
from ..adapters.kube import Conflict, Kube
from ..engine import retention as rules
from ..workqueue import Backoff, WorkQueue

log = logging.getLogger("reversi.retention")

RunKey = tuple[str, str]  # (namespace, name)
#: a kept Run is looked at again after this long at the latest, whatever its verdict said
RECHECK_SECONDS = 86_400.0
#: seconds after the moment a verdict names before the pass that acts on it (timestamps have
#: whole seconds: the moment itself may still be "not yet")
SLACK_SECONDS = 1.0
#: a pass that raised is retried after 1 s, doubling to this (seconds)
MAX_BACKOFF_SECONDS = 300.0
#: Event reason on a Run deleted by retention
RUN_DELETED = "RunDeleted"


class Pacer:
    """A token bucket: at most ``rate`` deletes per second on average, ``burst`` at once. Safe
    from any thread; ``clock`` is injected for tests."""

    def __init__(self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.burst = max(burst if burst is not None else rate, 1.0)
        self.clock = clock
        self._tokens = self.burst
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        """Take one token: 0.0 when taken, else the seconds until one is there (nothing taken)."""
        with self._lock:
            now = self.clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return 0.0
            return (1.0 - self._tokens) / self.rate


class RequestsByRun:
    """The RollbackRequests naming each run, from the informer of RollbackRequests (a
    subscriber): ``(namespace, run)`` -> ``{request name: RequestFacts}``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_run: dict[RunKey, dict[str, rules.RequestFacts]] = {}

    def changed(self, key: RunKey, old: tuple[Any, ...] | None, new: tuple[Any, ...] | None) -> list[RunKey]:
        """Keep the index; the runs whose requests changed."""
        touched = []
        with self._lock:
            if old is not None:
                runs = self._by_run.get((key[0], old[0]))
                if runs is not None:
                    runs.pop(key[1], None)
                    if not runs:
                        del self._by_run[(key[0], old[0])]
                touched.append((key[0], old[0]))
            if new is not None:
                self._by_run.setdefault((key[0], new[0]), {})[key[1]] = new[1]
                touched.append((key[0], new[0]))
        return sorted(set(touched))

    def of(self, namespace: str, run: str) -> list[rules.RequestFacts]:
        with self._lock:
            return list((self._by_run.get((namespace, run)) or {}).values())


def request_facts(obj: dict) -> tuple[str, rules.RequestFacts] | None:
    """What the operator keeps of a RollbackRequest: ``(its run's name, RequestFacts)``."""
    spec = obj.get("spec") or {}
    run = (spec.get("runRef") or {}).get("name") if isinstance(spec.get("runRef"), dict) else None
    name = (obj.get("metadata") or {}).get("name")
    if not isinstance(run, str) or not name:
        return None
    status = obj.get("status") or {}
    ready = cond.get_condition(status.get("conditions"), cond.READY) or {}
    return run, rules.RequestFacts(name, status.get("phase"), ready.get("reason"))


def namespace_setting(obj: dict) -> str | None:
    """What retention keeps of a Namespace: its annotation :data:`rules.NAMESPACE_ANNOTATION`
    (None: not kept)."""
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(rules.NAMESPACE_ANNOTATION)
    return value if isinstance(value, str) else None


class Retention:
    """The retention controller (module docstring).

    ``runs``: the informer of Runs (values :class:`rules.RunFacts`); ``namespaces``: the informer
    of Namespaces carrying the annotation (values its text); ``requests``: the informer of
    RollbackRequests (values from :func:`request_facts`). ``default_ttl``: seconds, None to keep
    forever. ``archive(facts, steps)``: writes the Run's record before the delete and raises when
    it could not (None: no archive); ``release(facts)``: after that write, takes the archive's
    finalizer off the Run and returns the resourceVersion the delete names (None: no archive).
    ``reconciling``: whether the operator may act now; ``paused``: true while this replica does
    not hold the Lease. ``metrics``: the operator's :class:`reversi.metrics.Metrics` or None."""

    def __init__(self, kube: Kube, runs: Informer[RunKey, rules.RunFacts], namespaces: Informer[str, str],
                 requests: Informer[RunKey, tuple[Any, ...]], *, default_ttl: int | None,
                 deletes_per_second: float = 20.0, workers: int = 2, metrics: Any = None,
                 archive: Callable[[rules.RunFacts, rules.StepActivity], None] | None = None,
                 release: Callable[[rules.RunFacts], str] | None = None,
                 reconciling: Callable[[], bool] = lambda: True, paused: Callable[[], bool] = lambda: False,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)):
        self.kube = kube
        self.runs = runs
        self.namespaces = namespaces
        self.default_ttl = default_ttl
        self.metrics = metrics
        self.archive = archive
        self.release = release
        self.reconciling = reconciling
        self.clock = clock
        self.pacer = Pacer(deletes_per_second)
        self.requests = RequestsByRun()
        self._lock = threading.Lock()
        self._children: dict[RunKey, set[str]] = {}  # (namespace, parent) -> names of the runs below it
        self._counts: dict[str, int] = {}  # run uid -> its step count when last read (the next read's hint)
        self.queue: WorkQueue[RunKey] = WorkQueue(
            self._pass, workers=workers, backoff=Backoff(1.0, MAX_BACKOFF_SECONDS), failed=self._failed,
            paused=paused, name="retention")
        runs.subscribe(self._run_changed)
        namespaces.subscribe(self._namespace_changed)
        requests.subscribe(self._request_changed)

    def start(self) -> None:
        self.queue.start()

    def stop(self) -> None:
        self.queue.stop()

    # ----------------------------------------------------------------------------- events

    def _run_changed(self, key: RunKey, old: rules.RunFacts | None, new: rules.RunFacts | None) -> None:
        parent_before = old.parent if old is not None else None
        parent_now = new.parent if new is not None else None
        with self._lock:
            if parent_before and parent_before != parent_now:
                below = self._children.get((key[0], parent_before))
                if below is not None:
                    below.discard(key[1])
                    if not below:
                        del self._children[(key[0], parent_before)]
            if parent_now:
                self._children.setdefault((key[0], parent_now), set()).add(key[1])
            children = sorted(self._children.get(key, ())) if new is None else []
            if new is None and old is not None:
                self._counts.pop(old.uid, None)
        if new is None:
            self.queue.forget(key)
            for child in children:  # their parent is gone: rule 4 no longer holds them
                self.queue.add((key[0], child))
        else:
            self.queue.add(key)
        for parent in {p for p in (parent_before, parent_now) if p}:
            self.queue.add((key[0], parent))  # a run below it changed (rule 7)

    def _namespace_changed(self, name: str, old: str | None, new: str | None) -> None:
        for key, _ in self.runs.items():
            if key[0] == name:
                self.queue.add(key)

    def _request_changed(self, key: RunKey, old: Any, new: Any) -> None:
        for run in self.requests.changed(key, old, new):
            self.queue.add(run)

    # ----------------------------------------------------------------------------- a pass

    def verdict(self, facts: rules.RunFacts, now: dt.datetime, *, own: bool = False, depth: int = 0,
                read: bool = True) -> tuple[rules.Verdict, rules.StepActivity | None]:
        """The verdict on a Run and the step activity read for it (None when not read). ``own``:
        without rule 4 (how a run below a parent is judged for rule 7); ``read``: read the newest
        step when the other rules let the run go (else the verdict says ``read_steps``)."""
        ns = facts.namespace
        applies = rules.setting(facts.retention, self.namespaces.get(ns), self.default_ttl)
        parent_exists = not own and facts.parent is not None and self.runs.get((ns, facts.parent)) is not None
        requests = self.requests.of(ns, facts.name)
        found = rules.decide(facts, applies, now, requests=requests, parent_exists=parent_exists)
        if not found.read_steps or not read:
            return found, None
        steps = self._steps(facts)
        found = rules.decide(facts, applies, now, requests=requests, parent_exists=parent_exists, steps=steps)
        with self._lock:
            children = sorted(self._children.get((ns, facts.name), ()))
        if not found.expire or not children or depth > 8:
            return found, steps
        below = []
        for child in children:
            child_facts = self.runs.get((ns, child))
            if child_facts is not None:
                below.append((child, self.verdict(child_facts, now, own=True, depth=depth + 1)[0]))
        return rules.decide(facts, applies, now, requests=requests, parent_exists=parent_exists, steps=steps,
                            below=below), steps

    def _steps(self, facts: rules.RunFacts) -> rules.StepActivity:
        with self._lock:
            hint = self._counts.get(facts.uid, 0)
        count, newest = jr.newest_step(self.kube.custom, facts.namespace, facts.name, hint)
        with self._lock:
            self._counts[facts.uid] = count
        return rules.step_activity(count, newest)

    def _pass(self, key: RunKey) -> float | None:
        """One pass over a Run: the seconds until the next one, or None (an event brings it back)."""
        facts = self.runs.get(key)
        if facts is None:
            return None
        if not self.reconciling():
            return 30.0
        now = self.clock()
        found, steps = self.verdict(facts, now, read=False)
        if found.read_steps:  # due by everything else: its steps' reads and its delete are paced together
            wait = self.pacer.take()
            if wait > 0:
                return wait
            found, steps = self.verdict(facts, now)
        if not found.expire:
            left = found.seconds_left(now)
            return None if left is None else min(left + SLACK_SECONDS, RECHECK_SECONDS)
        assert steps is not None  # an expired verdict read the steps
        if self.archive is not None:
            self.archive(facts, steps)  # raises when the record is not committed: the Run stays
        return self._delete(facts, found)

    def _delete(self, facts: rules.RunFacts, found: rules.Verdict) -> float | None:
        try:
            version = self.release(facts) if self.release is not None else facts.resource_version
            deleted = self.kube.delete(jr.RUNS, facts.namespace, facts.name, uid=facts.uid,
                                       resource_version=version)
        except Conflict:
            return SLACK_SECONDS  # changed since the pass read it: decide again on what the watch brings
        if not deleted:
            return None
        log.info("Run %s/%s deleted by retention: %s", facts.namespace, facts.name, found.message)
        self.kube.event(_run_ref(facts), RUN_DELETED, f"deleted by retention: {found.message}")
        if self.metrics is not None:
            self.metrics.run_deleted(facts.namespace, "expired")
        return None

    def _failed(self, key: RunKey, err: Exception, failures: int) -> None:
        log.warning("Run %s/%s: retention pass failed (%d in a row): %s; retrying", *key, failures, err)


def _run_ref(facts: rules.RunFacts) -> dict[str, Any]:
    """The Run as an Event's involved object."""
    return {"apiVersion": f"{jr.GROUP}/{jr.VERSION}", "kind": "Run",
            "metadata": {"name": facts.name, "namespace": facts.namespace, "uid": facts.uid}}
