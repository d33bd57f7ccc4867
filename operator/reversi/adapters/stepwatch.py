"""Journal informers: the RunSteps of the runs being rolled back, kept from watches.

A reconcile pass reads a run's steps from memory, not with a LIST per pass. The memory is kept
per run, fed by one informer per namespace (per ``RUNS_PER_WATCH`` runs): one paged LIST of the
RunSteps of the runs it serves (label selector ``reversi.dev/run in (<runs>)``), then a WATCH
from that LIST's resourceVersion, listed again when the API server answers 410 Gone or when a
run joins (a request reads a run no informer serves: the running WATCH is interrupted, so the
new run is listed at once). A run is served from its first read (:meth:`RunJournals.entries`)
until ``idle_seconds`` without a read; an informer with no run left stops. So the operator's
threads grow with the namespaces it rolls back in, not with the runs (P5 of benchmarks/rollback_bench.py
measures them).

Why not a kopf index on RunSteps (one watch of every RunStep in the cluster)? kopf gives every
watched object its own worker. While it pre-indexes at start-up, every worker also waits on a
readiness toggle that each new object notifies. With 10,000 RunSteps in the cluster that is
quadratic: the operator spent more than 10 minutes at 100% CPU before its first handler ran.
Runs are recorded far more often than they are rolled back, so the operator watches only the
runs it works on; its memory grows with the steps of those runs, not with every run ever
recorded.

Every request has a timeout: the LIST ``TIMEOUT`` seconds per page, the WATCH
``watch_seconds`` on the server and a little more on the client. A failing LIST is retried with
exponential backoff (tenacity) while a run it serves is in use.
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


#: most runs one informer (one WATCH, one label selector) serves; more runs in a namespace start another
RUNS_PER_WATCH = 400


@dataclass
class _RunWatch:
    """One run's memory: its entries by index, whether its first LIST is in, its version."""

    namespace: str
    run: str
    entries: dict[int, Entry] = field(default_factory=dict)
    synced: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    last_read: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    version: int = 0  # bumped on every LIST and watch event (see RunJournals.versioned_entries)


@dataclass
class _Informer:
    """One LIST+WATCH of the RunSteps of up to ``RUNS_PER_WATCH`` runs of a namespace."""

    namespace: str
    runs: dict[str, _RunWatch] = field(default_factory=dict)  # guarded by RunJournals._lock
    joined: threading.Event = field(default_factory=threading.Event)  # a run joined: list again
    stopped: threading.Event = field(default_factory=threading.Event)
    stream: Any = None  # the running watch.Watch, to interrupt it when a run joins


class RunJournals:
    """The journals (RunSteps) of the runs this operator works on (see the module docstring).

    ``custom``: the ``CustomObjectsApi`` to list and watch with (its ``api_client`` carries the
    operator's credentials). ``idle_seconds``: a run no request has read for this long is dropped
    (its memory is freed; the next read lists it again). ``watch_seconds``: the server-side
    timeout of each WATCH (an idle run is noticed at the latest then).
    """

    def __init__(self, custom: client.CustomObjectsApi, *, idle_seconds: float = 120.0,
                 watch_seconds: int = 30):
        self.custom = custom
        self.idle_seconds = idle_seconds
        self.watch_seconds = watch_seconds
        self._informers: list[_Informer] = []
        self._lock = threading.Lock()
        self._versions = itertools.count(1)  # shared by every run: a version is never reused

    def entries(self, namespace: str, run: str, wait: float = 0.0) -> Mapping[int, Entry] | None:
        """The run's RunSteps by index, as the watch has seen them (a copy), or None while the
        first LIST has not completed within ``wait`` seconds. Starts serving the run if no
        informer does. Entries of invalid RunSteps are left out (admission refuses them; a gap
        shows it)."""
        found = self.versioned_entries(namespace, run, wait)
        return found[1] if found is not None else None

    def versioned_entries(self, namespace: str, run: str, wait: float = 0.0) -> tuple[int, Mapping[int, Entry]] | None:
        """Like :meth:`entries`, with the journal's version: a number that changes whenever the
        run is listed again or a watch event of one of its RunSteps arrives (bookmarks aside), and
        is never reused, also when the run is served again later. Equal versions: equal entries.
        None while the first LIST is not in."""
        found = self._serve(namespace, run)
        if not found.synced.wait(wait):
            return None
        with found.lock:
            return found.version, dict(found.entries)

    def watching(self) -> list[tuple[str, str]]:
        """``(namespace, run)`` of every run served now."""
        with self._lock:
            return sorted((inf.namespace, run) for inf in self._informers for run, w in inf.runs.items()
                          if not w.stopped.is_set())

    def informers(self) -> int:
        """Informers (threads, watches) running now."""
        with self._lock:
            return sum(1 for inf in self._informers if not inf.stopped.is_set())

    def stop_all(self) -> None:
        """Stop every informer (operator shutdown); each thread ends at its next event or timeout."""
        with self._lock:
            found = list(self._informers)
            self._informers.clear()
            for inf in found:
                for w in inf.runs.values():
                    w.stopped.set()
                inf.runs.clear()
                inf.stopped.set()
        for inf in found:
            _interrupt(inf)

    # ---------------------------------------------------------------------------- internals

    def _serve(self, namespace: str, run: str) -> _RunWatch:
        """The run's memory, served by an informer of its namespace (one with room, else a new one)."""
        with self._lock:
            for inf in self._informers:
                current = inf.runs.get(run) if inf.namespace == namespace else None
                if current is not None and not current.stopped.is_set():
                    current.last_read = time.monotonic()
                    return current
            room = next((i for i in self._informers if i.namespace == namespace and not i.stopped.is_set()
                         and len(i.runs) < RUNS_PER_WATCH), None)
            fresh = room is None
            if room is None:
                room = _Informer(namespace)
                self._informers.append(room)
            current = _RunWatch(namespace, run)
            room.runs[run] = current
            room.joined.set()
        if fresh:
            threading.Thread(target=self._loop, args=(room,), daemon=True, name=f"runsteps-{namespace}").start()
        else:
            _interrupt(room)  # list again now, with the new run
        return current

    def _idle(self, w: _RunWatch) -> bool:
        return w.stopped.is_set() or time.monotonic() - w.last_read > self.idle_seconds

    def _members(self, inf: _Informer) -> dict[str, _RunWatch] | None:
        """The runs the informer serves now, after dropping idle ones; None when none is left
        (the informer is then stopped and removed)."""
        with self._lock:
            for run, w in list(inf.runs.items()):
                if self._idle(w):
                    w.stopped.set()
                    del inf.runs[run]
            if not inf.runs or inf.stopped.is_set():
                inf.stopped.set()
                if inf in self._informers:
                    self._informers.remove(inf)
                for w in inf.runs.values():
                    w.stopped.set()
                return None
            return dict(inf.runs)

    def _loop(self, inf: _Informer) -> None:
        try:
            while True:
                members = self._members(inf)
                if members is None:
                    break
                inf.joined.clear()
                version = self._list_with_retries(inf, members)
                if version is None:
                    continue
                try:
                    while not inf.joined.is_set():
                        now = self._members(inf)
                        if now is None or set(now) != set(members):
                            break  # a run left: watch the others with a smaller selector (list again)
                        version = self._watch(inf, members, version)
                except _Expired:
                    log.info("RunSteps in %s: watch expired, listing again", inf.namespace)
                except Exception as err:  # noqa: BLE001 - a broken watch is listed again, never fatal
                    if not inf.joined.is_set() and not inf.stopped.is_set():
                        log.warning("RunSteps in %s: watch failed (%s), listing again", inf.namespace, err)
        finally:
            inf.stopped.set()
            with self._lock:
                if inf in self._informers:
                    self._informers.remove(inf)
                for w in inf.runs.values():
                    w.stopped.set()

    def _list_with_retries(self, inf: _Informer, members: dict[str, _RunWatch]) -> str | None:
        """List until it works (backing off) or every run goes idle; the LIST's resourceVersion."""
        retrying = tenacity.Retrying(
            wait=tenacity.wait_exponential_jitter(multiplier=0.5, max=30),
            stop=lambda _state: all(self._idle(w) for w in members.values()),
            retry=tenacity.retry_if_exception_type(Exception),
            before_sleep=lambda state: log.warning("RunSteps in %s: list failed (%s); retrying", inf.namespace,
                                                   state.outcome.exception() if state.outcome else None),
            reraise=False)
        try:
            return retrying(self._list, inf, members)
        except tenacity.RetryError:
            return None

    @staticmethod
    def _selector(members: Mapping[str, _RunWatch]) -> str:
        return f"{LABEL_RUN} in ({','.join(sorted(members))})"

    def _list(self, inf: _Informer, members: dict[str, _RunWatch]) -> str:
        objs, version = jr.list_selected_and_version(self.custom, inf.namespace, self._selector(members))
        fresh: dict[str, dict[int, Entry]] = {run: {} for run in members}
        for obj in objs:
            entry = _parse(obj)
            if entry is not None and entry.spec.run_ref.name in fresh:
                fresh[entry.spec.run_ref.name][entry.spec.index] = entry
        for run, w in members.items():
            with w.lock:
                w.entries = fresh[run]
                w.version = next(self._versions)
            w.synced.set()
        return version

    def _watch(self, inf: _Informer, members: dict[str, _RunWatch], version: str) -> str:
        """One WATCH from ``version`` until the server ends it, a run joins or every run is idle;
        the last resourceVersion seen."""
        stream = watch.Watch()
        inf.stream = stream
        if inf.joined.is_set() or inf.stopped.is_set():
            return version  # joined between the check and now: list again
        events = stream.stream(self.custom.list_namespaced_custom_object, jr.GROUP, jr.VERSION, inf.namespace, jr.STEPS,
                               label_selector=self._selector(members), resource_version=version,
                               allow_watch_bookmarks=True, timeout_seconds=self.watch_seconds,
                               _request_timeout=self.watch_seconds + 15)
        try:
            for event in events:
                kind, obj = event.get("type"), event.get("object") or {}
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if kind == "BOOKMARK":
                    continue
                run = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_RUN)
                w = members.get(run or "")
                if w is None:
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
                if inf.joined.is_set() or all(self._idle(m) for m in members.values()):
                    stream.stop()
        except ApiException as err:
            if err.status == 410:  # the client raises the server's ERROR event of a too old version
                raise _Expired() from err
            raise
        finally:
            inf.stream = None
        return version


def _interrupt(inf: _Informer, tries: int = 20) -> None:
    """End the informer's running WATCH now (a run joined, or shutdown): its thread lists again.
    urllib3 2.3+ can shut a response down from another thread; otherwise (or when the WATCH's
    response is not there after ``tries`` looks, 50 ms apart) it ends at its server timeout."""
    for _ in range(tries):
        stream = inf.stream
        if stream is None:
            return  # between two WATCHes: the loop sees ``joined`` before it starts the next
        resp = getattr(stream, "_resp", None)  # the client keeps the streaming response here
        if resp is not None:
            stream.stop()
            shutdown = getattr(resp, "shutdown", None)
            if callable(shutdown):
                try:
                    shutdown()
                except Exception:  # noqa: BLE001 - best effort: the server timeout ends it anyway
                    pass
            return
        time.sleep(0.05)  # the WATCH request is being sent: its response comes in a moment


def _parse(obj: dict[str, Any]) -> Entry | None:
    try:
        return jr.entry_of(obj)
    except jr.JournalError as err:  # admission refuses invalid steps; never fail the informer on one
        log.warning("%s", err)
        return None

