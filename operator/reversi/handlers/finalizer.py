"""A Run deleted by hand is archived before it goes (docs/operations.md#a-run-deleted-by-hand).

While the archive is on, every Run carries the finalizer ``reversi.dev/archive``. A person's
``kubectl delete run`` (or a namespace's deletion) then only marks the Run deleted; this
controller writes its record (:meth:`reversi.handlers.archive.Archiver.deleted`, the writer
retention uses) and takes the finalizer off only after the write committed, so the API server
deletes the Run, and the garbage collector its RunSteps, after that. A RunStep's owner reference
to its Run makes the garbage collector wait for the Run itself to be gone (a background delete,
kubectl's default), so the steps are all there when the record is read.

One controller shaped like retention (:mod:`reversi.handlers.retention`): the operator's informer
of Runs puts a Run's key on a keyed :class:`reversi.workqueue.WorkQueue` when the pure decision
(:func:`reversi.engine.archive.finalizer_step`) says there is something to do; a pass decides
again on what the informer holds and does it:

- add the finalizer to a Run that lacks it while the archive is on (Runs that existed when the
  archive was turned on get it too), and remove it from every Run while the archive is off (so
  turning the archive off never leaves a Run undeletable). These writes are merge patches with
  the Run's resourceVersion as precondition, paced (``settings.retention_deletes_per_second``:
  each Run waiting its turn is given its own moment, :class:`Slots`, so turning the archive on
  over 50,000 Runs queues them once instead of waking them all at each free token);
- archive a Run being deleted that carries it, then remove it. A write that fails keeps the
  finalizer: the Run says why (``Archived=False``, reason ``ArchiveFailed``, a Warning Event
  ``ArchiveFailed``), the failure counts in ``reversi_archive_failures_total`` and the pass is
  retried with the work queue's backoff (1 s doubling to 5 minutes).

Only the holder of the Lease acts (``paused``, ``reconciling``), as everywhere in the operator.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from kubernetes.client.rest import ApiException

from ..adapters import journal as jr
from ..adapters.kube import Conflict, Kube
from ..engine import archive as records
from ..engine import retention as rules
from ..workqueue import Backoff, WorkQueue
from .archive import RunChanged
from .retention import MAX_BACKOFF_SECONDS, SLACK_SECONDS

if TYPE_CHECKING:
    from ..adapters.informer import Informer
    from .archive import Archiver

log = logging.getLogger("reversi.finalizer")

RunKey = tuple[str, str]  # (namespace, name)


class Slots:
    """Paced turns, one per key: at most ``rate`` per second, each key given its own moment
    ``1/rate`` after the one before (golang's ``rate.Limiter.Reserve``), kept until that key
    comes back for it. Safe from any thread; ``clock`` (monotonic seconds) is injected for tests."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic):
        self.gap = 1.0 / rate
        self.clock = clock
        self._next = clock()
        self._held: dict[Hashable, float] = {}
        self._lock = threading.Lock()

    def wait(self, key: Hashable) -> float:
        """Seconds until ``key``'s turn: 0.0 when it is now (the turn is used), else the wait
        (the turn is kept for it)."""
        with self._lock:
            now = self.clock()
            at = self._held.get(key)
            if at is None:
                at = max(now, self._next)
                self._next = at + self.gap
            if at <= now:
                self._held.pop(key, None)
                return 0.0
            self._held[key] = at
            return at - now

    def forget(self, key: Hashable) -> None:
        """Drop ``key``'s turn (the Run is gone)."""
        with self._lock:
            self._held.pop(key, None)


class ArchiveFinalizer:
    """The controller of the finalizer ``reversi.dev/archive`` (module docstring). ``runs``: the
    informer of Runs; ``archiver``: the archive's writer, None while the archive is off (then the
    finalizer is only removed); ``writes_per_second``: the pace of adding and removing it on Runs
    not being deleted (a Run being deleted is never kept waiting by the pace)."""

    def __init__(self, kube: Kube, runs: Informer[RunKey, rules.RunFacts], archiver: Archiver | None, *,
                 writes_per_second: float = 20.0, workers: int = 1,
                 reconciling: Callable[[], bool] = lambda: True, paused: Callable[[], bool] = lambda: False):
        self.kube = kube
        self.runs = runs
        self.archiver = archiver
        self.reconciling = reconciling
        self.slots = Slots(writes_per_second)
        self._hints: dict[str, int] = {}  # run uid -> its step count when last read
        self.queue: WorkQueue[RunKey] = WorkQueue(
            self._pass, workers=workers, backoff=Backoff(1.0, MAX_BACKOFF_SECONDS), failed=self._failed,
            paused=paused, name="archive-finalizer")
        runs.subscribe(self._run_changed)

    def start(self) -> None:
        self.queue.start()

    def stop(self) -> None:
        self.queue.stop()

    def step(self, facts: rules.RunFacts) -> str:
        """What to do with the Run now (:func:`reversi.engine.archive.finalizer_step`)."""
        return records.finalizer_step(archive_on=self.archiver is not None, deleting=facts.deleting,
                                      finalizers=facts.finalizers)

    def _run_changed(self, key: RunKey, old: rules.RunFacts | None, new: rules.RunFacts | None) -> None:
        if new is None:
            self.queue.forget(key)
            self.slots.forget(key)
            if old is not None:
                self._hints.pop(old.uid, None)
        elif self.step(new) != records.NOTHING:
            self.queue.add(key)

    def _pass(self, key: RunKey) -> float | None:
        """One pass over a Run: the seconds until the next one, or None (an event brings it back).
        Raises :class:`reversi.adapters.archive.ArchiveError` when the record was not written
        (the queue retries with backoff)."""
        facts = self.runs.get(key)
        if facts is None:
            return None
        if not self.reconciling():
            return 30.0
        step = self.step(facts)
        if step == records.NOTHING:
            self.slots.forget(key)  # a turn it was given is not needed any more
            return None
        if step == records.ADD and self.archiver is not None:
            held = self.archiver.held_back(facts.uid)
            if held > 0:  # retention took it off for its delete: the Run is about to go
                return held
        if not facts.deleting:
            wait = self.slots.wait(key)
            if wait > 0:
                return wait
        version, finalizers = facts.resource_version, facts.finalizers
        if step == records.ARCHIVE:
            assert self.archiver is not None  # ARCHIVE only while the archive is on
            try:
                run = self.archiver.deleted(facts, self._steps(facts))
            except RunChanged as err:
                log.info("%s; deciding again", err)
                return SLACK_SECONDS
            meta = run.get("metadata") or {}
            version, finalizers = str(meta.get("resourceVersion") or version), tuple(meta.get("finalizers") or ())
        wanted = records.with_finalizer(finalizers) if step == records.ADD else records.without_finalizer(finalizers)
        return self._write(facts, version, wanted, step)

    def _steps(self, facts: rules.RunFacts) -> rules.StepActivity:
        count, newest = jr.newest_step(self.kube.custom, facts.namespace, facts.name, self._hints.get(facts.uid, 0))
        self._hints[facts.uid] = count
        return rules.step_activity(count, newest)

    def _write(self, facts: rules.RunFacts, version: str, finalizers: list[str], step: str) -> float | None:
        try:
            self.kube.merge(jr.RUNS, facts.namespace, facts.name,
                            {"metadata": {"resourceVersion": version, "finalizers": finalizers}})
        except Conflict:
            return SLACK_SECONDS  # changed since it was read: decide again on what the watch brings
        except ApiException as err:
            if err.status == 404:
                return None  # gone already
            raise
        if step == records.ARCHIVE:
            log.info("Run %s/%s archived before its deletion; its finalizer %s removed", facts.namespace,
                     facts.name, records.FINALIZER)
        return None

    def _failed(self, key: RunKey, err: Exception, failures: int) -> None:
        log.warning("Run %s/%s: archive finalizer pass failed (%d in a row): %s; retrying", *key, failures, err)

