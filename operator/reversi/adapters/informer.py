"""A small informer of the project's own: one kind's objects, listed then watched, each kept as
the little the operator needs of it (client-go's informer with a transform function).

Why not kopf for these kinds? kopf keeps machinery per watched object (a worker, its queue and
state): about 17 KB per Run, so 50,000 Runs cost the operator some 850 MB before it does
anything (benchmarks/journal_bench.py measures it). An :class:`Informer` keeps per object only
what ``keep`` makes of it (a few hundred bytes for a Run, see
:class:`reversi.engine.retention.RunFacts`) and tells its subscribers of each change from one
thread per watched namespace (one for the whole cluster): the threads do not grow with the
objects.

The rules:

- **LIST, then WATCH** from the LIST's resourceVersion (paged: :func:`reversi.adapters.apicalls.list_all`,
  bookmarks asked for), listed again when the API server answers 410 Gone, when a watch breaks,
  and every ``watch_seconds`` at the latest (the server ends each WATCH then; the next WATCH goes
  on from the last resourceVersion seen, so a relist happens only on 410 or an error).
- **A relist is a diff**: a key kept before and missing from the new LIST is reported deleted;
  a key whose kept value changed is reported changed; an equal one is not reported again.
- **keep** returns what to store of an object, or None: then the object is not stored (as if
  it did not exist; a change that makes ``keep`` return None is reported as a deletion).
- **Subscribers** (``on_change(key, old, new)``) run on the informer's thread: they must be
  quick (put a key on a work queue) and never raise (what they raise is logged).
- **Observers** (``observe(kind, key, obj)``) see every object as it comes, whole (each watch
  event, each object of a LIST, and a deletion a relist found, with None), on the same thread and
  under the same rules; the informer keeps nothing of it for them.
- Every request has a timeout: each LIST page ``timeout``, the WATCH ``watch_seconds`` on the
  server and 15 s more on the client. A failing LIST or WATCH is retried with exponential
  backoff (1 s doubling to 30 s) until :meth:`Informer.stop`.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, TypeVar

from kubernetes import watch
from kubernetes.client.rest import ApiException

from . import apicalls as calls

log = logging.getLogger("reversi.informer")

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
#: a subscriber: the key, what was kept before (None: new) and what is kept now (None: gone)
Subscriber = Callable[[Any, Any, Any], None]
#: an observer: the event's kind (``ADDED``, ``MODIFIED``, ``DELETED``; ``LISTED`` for an object of a
#: LIST), the key and the whole object (None for a deletion a relist found), never kept
Observer = Callable[[str, Any, Any], None]


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


def namespaced_key(obj: dict) -> tuple[str, str] | None:
    """``(namespace, name)`` of an object (namespace interned: shared by every key of it)."""
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    return (sys.intern(meta.get("namespace") or ""), name) if name else None


def name_key(obj: dict) -> str | None:
    """``name`` of a cluster-scoped object."""
    return (obj.get("metadata") or {}).get("name") or None


class Informer(Generic[K, T]):
    """The objects one LIST method returns, kept as ``keep(obj)`` by ``key(obj)``.

    ``list_for(namespace)``: ``(method, args)`` of the LIST for one namespace (None: the whole
    cluster or a cluster-scoped kind); ``namespaces``: the namespaces to watch, each on a thread of
    its own (empty: one LIST and WATCH for all); ``label_selector`` and ``field_selector`` narrow every
    LIST and WATCH (``metadata.name=<name>``: one object, which RBAC's resourceNames can grant alone).
    ``name``: the threads' name and the logs'."""

    def __init__(self, list_for: Callable[[str | None], tuple[Callable[..., Any], tuple[Any, ...]]], *,
                 keep: Callable[[dict], T | None], key: Callable[[dict], K | None],
                 namespaces: list[str] | None = None, name: str = "informer", label_selector: str | None = None,
                 watch_seconds: int = 300, timeout: float = calls.TIMEOUT, field_selector: str | None = None):
        self.list_for = list_for
        self.keep = keep
        self.key = key
        self.namespaces: list[str | None] = list(namespaces or []) or [None]
        self.name = name
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.watch_seconds = watch_seconds
        self.timeout = timeout
        self._store: dict[K, T] = {}
        self._sources: dict[str | None, set[K]] = {ns: set() for ns in self.namespaces}
        self._lock = threading.Lock()
        self._subscribers: list[Subscriber] = []
        self._observers: list[Observer] = []
        self._stopped = threading.Event()
        self._synced = {ns: threading.Event() for ns in self.namespaces}
        self._threads: list[threading.Thread] = []
        self._streams: dict[str | None, Any] = {}

    # ------------------------------------------------------------------------------ public

    def subscribe(self, on_change: Subscriber) -> None:
        """Call ``on_change(key, old, new)`` for every change from now on (before :meth:`start`:
        also for every object of the first LIST, with ``old`` None)."""
        self._subscribers.append(on_change)

    def observe(self, observer: Observer) -> None:
        """Call ``observer(kind, key, obj)`` for every object as it comes (module docstring)."""
        self._observers.append(observer)

    def start(self) -> None:
        """Start the threads (once)."""
        if self._threads:
            return
        self._threads = [threading.Thread(target=self._loop, args=(ns,), daemon=True,
                                          name=f"{self.name}-{ns or 'all'}") for ns in self.namespaces]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop every thread (each ends at its next event or WATCH timeout; its WATCH is closed now)."""
        self._stopped.set()
        for stream in list(self._streams.values()):
            _close(stream)

    def synced(self, timeout: float | None = None) -> bool:
        """Whether every namespace's first LIST is in (waiting up to ``timeout`` seconds)."""
        return all(event.wait(timeout) for event in self._synced.values())

    def get(self, key: K) -> T | None:
        with self._lock:
            return self._store.get(key)

    def items(self) -> list[tuple[K, T]]:
        """A copy of every ``(key, kept)``."""
        with self._lock:
            return list(self._store.items())

    def values(self) -> Iterator[T]:
        """The kept values (a copy taken now)."""
        with self._lock:
            found = list(self._store.values())
        return iter(found)

    def __len__(self) -> int:
        with self._lock:
            return len(self._store)

    # ------------------------------------------------------------------------------ internals

    def _loop(self, namespace: str | None) -> None:
        failures = 0
        while not self._stopped.is_set():
            try:
                version = self._list(namespace)
                failures = 0
                while not self._stopped.is_set():
                    version = self._watch(namespace, version)
            except _Expired:
                log.info("%s in %s: watch expired, listing again", self.name, namespace or "every namespace")
            except Exception as err:  # noqa: BLE001 - an informer never dies: it lists again after a backoff
                if self._stopped.is_set():
                    return
                failures += 1
                wait = min(2.0 ** min(failures - 1, 5), 30.0)
                log.warning("%s in %s: %s; listing again in %.0f s", self.name, namespace or "every namespace",
                            calls.api_message(err) if isinstance(err, ApiException) else err, wait)
                self._stopped.wait(wait)

    def _kwargs(self) -> dict[str, Any]:
        out = {"label_selector": self.label_selector} if self.label_selector else {}
        return {**out, "field_selector": self.field_selector} if self.field_selector else out

    def _list(self, namespace: str | None) -> str:
        method, args = self.list_for(namespace)
        fresh: dict[K, T] = {}

        def keep(obj: dict) -> None:
            key = self.key(obj)
            kept = self.keep(obj) if key is not None else None
            if key is not None and kept is not None:
                fresh[key] = kept
            if key is not None:
                self._show("LISTED", key, obj)

        _, version = calls.list_all(method, *args, timeout=self.timeout, keep=keep, _preload_content=False,
                                    **self._kwargs())
        changes: list[tuple[K, T | None, T | None]] = []
        with self._lock:
            mine = self._sources[namespace]
            gone = mine - fresh.keys()
            for key in gone:
                changes.append((key, self._store.pop(key, None), None))
            for key, kept in fresh.items():
                old = self._store.get(key)
                if old != kept:
                    changes.append((key, old, kept))
                self._store[key] = kept
            self._sources[namespace] = set(fresh)
        for key in gone:
            self._show("DELETED", key, None)
        self._tell(changes)
        self._synced[namespace].set()
        return version

    def _watch(self, namespace: str | None, version: str) -> str:
        """One WATCH from ``version`` until the server ends it; the last resourceVersion seen."""
        method, args = self.list_for(namespace)
        stream = watch.Watch()
        self._streams[namespace] = stream
        try:
            for event in stream.stream(method, *args, resource_version=version, allow_watch_bookmarks=True,
                                       timeout_seconds=self.watch_seconds,
                                       _request_timeout=self.watch_seconds + 15, **self._kwargs()):
                if self._stopped.is_set():
                    break
                kind = event.get("type")
                obj = event.get("raw_object") or event.get("object") or {}
                if not isinstance(obj, dict):
                    continue
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if kind in ("BOOKMARK", "ERROR"):
                    continue
                self._apply(namespace, kind, obj)
        except ApiException as err:
            if err.status == 410:  # the client raises the server's ERROR event of a too old version
                raise _Expired() from err
            raise
        finally:
            self._streams.pop(namespace, None)
        return version

    def _apply(self, namespace: str | None, kind: str | None, obj: dict) -> None:
        key = self.key(obj)
        if key is None:
            return
        self._show(kind or "MODIFIED", key, obj)
        kept = None if kind == "DELETED" else self.keep(obj)
        with self._lock:
            old = self._store.get(key)
            if kept is None:
                self._store.pop(key, None)
                self._sources[namespace].discard(key)
            else:
                self._store[key] = kept
                self._sources[namespace].add(key)
        if old != kept:
            self._tell([(key, old, kept)])

    def _show(self, kind: str, key: Any, obj: dict | None) -> None:
        for observer in self._observers:
            try:
                observer(kind, key, obj)
            except Exception:  # an observer's bug never stops the informer
                log.exception("%s: an observer failed on %s", self.name, key)

    def _tell(self, changes: list[tuple[K, T | None, T | None]]) -> None:
        for key, old, new in changes:
            for subscriber in self._subscribers:
                try:
                    subscriber(key, old, new)
                except Exception:  # a subscriber's bug never stops the informer
                    log.exception("%s: a subscriber failed on %s", self.name, key)


def _close(stream: Any) -> None:
    """End a running WATCH now (stop): urllib3 2.3+ can shut its response down from another thread."""
    stream.stop()
    resp = getattr(stream, "_resp", None)
    shutdown = getattr(resp, "shutdown", None)
    if callable(shutdown):
        try:
            shutdown()
        except Exception:  # noqa: BLE001 - best effort: the server timeout ends it anyway
            pass
