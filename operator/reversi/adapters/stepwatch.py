"""Per-run journal informers: the RunSteps of the runs being rolled back, kept from a watch.

A reconcile pass reads a run's steps from memory, not with a LIST per pass. The memory is an
informer per run: one paged LIST of the run's RunSteps (label ``reversi.dev/run=<run>``), then a
WATCH from that LIST's resourceVersion, re-listed when the API server answers 410 Gone.
It starts when a request first reads the run (:meth:`RunJournals.entries`) and stops after
``idle_seconds`` without a read.

Why not a kopf index on RunSteps (one watch of every RunStep in the cluster)? kopf gives every
watched object its own worker. While it pre-indexes at start-up, every worker also waits on a
readiness toggle that each new object notifies. With 10,000 RunSteps in the cluster that is
quadratic: the operator spent more than 10 minutes at 100% CPU before its first handler ran.
Runs are recorded far more often than they are rolled back, so the operator watches only the
runs it works on; its memory grows with the steps of those runs, not with every run ever
recorded.

Every request has a timeout: the LIST ``TIMEOUT`` seconds per page, the WATCH
``watch_seconds`` on the server and a little more on the client. A failing LIST is retried with
exponential backoff (tenacity) while the run is in use.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import tenacity
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from ..engine.journal import Entry
from ..models.runstep import LABEL_RUN
from . import journal as jr

log = logging.getLogger("reversi.stepwatch")


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


@dataclass
class _RunWatch:
    """The informer of one run: its entries by index, and whether the first LIST is in."""

    namespace: str
    run: str
    entries: dict[int, Entry] = field(default_factory=dict)
    synced: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    last_read: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    version: int = 0  # bumped on every LIST and watch event (see RunJournals.versioned_entries)


class RunJournals:
    """The journals (RunSteps) of the runs this operator works on, one informer per run.

    ``custom``: the ``CustomObjectsApi`` to list and watch with (its ``api_client`` carries the
    operator's credentials). ``idle_seconds``: an informer no request has read for this long stops
    (its memory is freed; the next read lists again). ``watch_seconds``: the server-side timeout of
    each WATCH (an idle informer notices it is idle at the latest then).
    """

    def __init__(self, custom: client.CustomObjectsApi, *, idle_seconds: float = 120.0,
                 watch_seconds: int = 30):
        self.custom = custom
        self.idle_seconds = idle_seconds
        self.watch_seconds = watch_seconds
        self._runs: dict[tuple[str, str], _RunWatch] = {}
        self._lock = threading.Lock()
        self._versions = itertools.count(1)  # shared by every informer: a version is never reused

    def versioned_entries(self, namespace: str, run: str, wait: float = 0.0) -> tuple[int, Mapping[int, Entry]] | None:
        """Like :meth:`entries`, with the journal's version: a number that changes whenever the
        informer lists the run again or sees a watch event of one of its RunSteps (bookmarks
        aside), and is never reused, also across informers of the same run. Equal versions:
        equal entries. None while the first LIST is not in."""
        found = self._informer(namespace, run)
        if not found.synced.wait(wait):
            return None
        with found.lock:
            return found.version, dict(found.entries)

    def entries(self, namespace: str, run: str, wait: float = 0.0) -> Mapping[int, Entry] | None:
        """The run's RunSteps by index, as the watch has seen them (a copy), or None while the
        first LIST has not completed within ``wait`` seconds. Starts the run's informer if none
        runs. Entries of invalid RunSteps are left out (admission refuses them; a gap shows it)."""
        found = self._informer(namespace, run)
        if not found.synced.wait(wait):
            return None
        with found.lock:
            return dict(found.entries)

    def watching(self) -> list[tuple[str, str]]:
        """``(namespace, run)`` of every informer running now."""
        with self._lock:
            return sorted(key for key, w in self._runs.items() if not w.stopped.is_set())

    def stop_all(self) -> None:
        """Stop every informer (operator shutdown); each thread ends at its next event or timeout."""
        with self._lock:
            found = list(self._runs.values())
            self._runs.clear()
        for w in found:
            w.stopped.set()

    # ---------------------------------------------------------------------------- internals

    def _informer(self, namespace: str, run: str) -> _RunWatch:
        key = (namespace, run)
        with self._lock:
            current = self._runs.get(key)
            if current is None or current.stopped.is_set():
                current = _RunWatch(namespace, run)
                self._runs[key] = current
                threading.Thread(target=self._loop, args=(current,), daemon=True,
                                 name=f"runsteps-{namespace}/{run}").start()
            current.last_read = time.monotonic()
        return current

    def _idle(self, w: _RunWatch) -> bool:
        return w.stopped.is_set() or time.monotonic() - w.last_read > self.idle_seconds

    def _loop(self, w: _RunWatch) -> None:
        try:
            while not self._idle(w):
                version = self._list_with_retries(w)
                if version is None:
                    break
                try:
                    while not self._idle(w):
                        version = self._watch(w, version)
                except _Expired:
                    log.info("RunSteps of %s/%s: watch expired, listing again", w.namespace, w.run)
                except Exception as err:  # noqa: BLE001 - a broken watch is listed again, never fatal
                    log.warning("RunSteps of %s/%s: watch failed (%s), listing again", w.namespace, w.run, err)
        finally:
            w.stopped.set()
            with self._lock:
                if self._runs.get((w.namespace, w.run)) is w:
                    del self._runs[(w.namespace, w.run)]

    def _list_with_retries(self, w: _RunWatch) -> str | None:
        """List until it works (backing off) or the informer goes idle; the LIST's resourceVersion."""
        retrying = tenacity.Retrying(
            wait=tenacity.wait_exponential_jitter(multiplier=0.5, max=30),
            stop=lambda _state: self._idle(w),
            retry=tenacity.retry_if_exception_type(Exception),
            before_sleep=lambda state: log.warning("RunSteps of %s/%s: list failed (%s); retrying", w.namespace,
                                                   w.run, state.outcome.exception() if state.outcome else None),
            reraise=False)
        try:
            return retrying(self._list, w)
        except tenacity.RetryError:
            return None

    def _list(self, w: _RunWatch) -> str:
        objs, version = jr.list_objects_and_version(self.custom, w.namespace, w.run)
        fresh: dict[int, Entry] = {}
        for obj in objs:
            entry = _parse(obj)
            if entry is not None:
                fresh[entry.spec.index] = entry
        with w.lock:
            w.entries = fresh
            w.version = next(self._versions)
        w.synced.set()
        return version

    def _watch(self, w: _RunWatch, version: str) -> str:
        """One WATCH from ``version`` until the server ends it; the last resourceVersion seen."""
        stream = watch.Watch()
        events = stream.stream(self.custom.list_namespaced_custom_object, jr.GROUP, jr.VERSION, w.namespace, jr.STEPS,
                               label_selector=f"{LABEL_RUN}={w.run}", resource_version=version,
                               allow_watch_bookmarks=True, timeout_seconds=self.watch_seconds,
                               _request_timeout=self.watch_seconds + 15)
        try:
            for event in events:
                kind, obj = event.get("type"), event.get("object") or {}
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    index = (obj.get("spec") or {}).get("index")
                    with w.lock:
                        if index is not None:
                            w.entries.pop(index, None)
                        w.version = next(self._versions)
                else:
                    entry = _parse(obj)
                    with w.lock:
                        if entry is not None:
                            w.entries[entry.spec.index] = entry
                        w.version = next(self._versions)
                if self._idle(w):
                    stream.stop()
        except ApiException as err:
            if err.status == 410:  # the client raises the server's ERROR event of a too old version
                raise _Expired() from err
            raise
        return version


def _parse(obj: dict[str, Any]) -> Entry | None:
    try:
        return jr.entry_of(obj)
    except jr.JournalError as err:  # admission refuses invalid steps; never fail the informer on one
        log.warning("%s", err)
        return None

