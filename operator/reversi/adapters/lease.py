"""The leader election's I/O: one ``coordination.k8s.io/v1`` Lease read and written, and the
fence on every other write the operator makes (docs/operations.md#leader-election).

- :class:`LeaseLock` reads, creates and replaces the one Lease (``name`` in ``namespace``), each
  request with its own timeout and no retry (the elector's next attempt is the retry), on an API
  client of its own so that a busy operator's connection pool never delays a renewal. A replace
  carries the ``resourceVersion`` read: a candidate that lost a race gets :class:`LeaseConflict`.
- :class:`Fence` wraps an API client's REST client so that every request that is not a read
  (POST, PUT, PATCH, DELETE) first asks ``acting()`` and raises :class:`NotLeading` instead of
  sending when it says no. It is checked just before each request leaves, so it holds for every
  write whatever code path makes it: status, journal, Jobs and their Secrets, deletes, Events.

The official client's ``kubernetes.leaderelection`` is not used: it is synchronous and blocking,
reads the Lease with the process's default client (no timeout), judges expiry by its own
configured duration rather than the record's (a released Lease's ``leaseDurationSeconds: 1``
would be ignored), cannot release, and does not say when the last renewal began, which the
fence needs.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from ..engine.election import Record

#: the HTTP methods that change nothing (never fenced)
READS = frozenset({"GET", "HEAD", "OPTIONS"})


class NotLeading(Exception):
    """A write was refused before it was sent: this replica does not hold the Lease, or its last
    renewal began longer than the renew deadline ago (docs/operations.md#leader-election)."""


class LeaseConflict(Exception):
    """The Lease changed (or was created) since it was read: read it again and decide again."""


def _time(value: dt.datetime | None) -> str | None:
    """A MicroTime on the wire: RFC 3339 UTC with microseconds."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") if value is not None else None


def _parse(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def record_of(lease: dict) -> Record:
    """The election record of a Lease (a dict as the API serves it)."""
    spec = lease.get("spec") or {}
    return Record(holder=spec.get("holderIdentity") or None, duration=spec.get("leaseDurationSeconds"),
                  acquired=_parse(spec.get("acquireTime")), renewed=_parse(spec.get("renewTime")),
                  transitions=int(spec.get("leaseTransitions") or 0))


def spec_of(record: Record) -> dict:
    """A Lease's spec for ``record`` (``holderIdentity`` null when released)."""
    return {"holderIdentity": record.holder or None, "leaseDurationSeconds": record.duration,
            "acquireTime": _time(record.acquired), "renewTime": _time(record.renewed),
            "leaseTransitions": record.transitions}


class LeaseLock:
    """The one Lease ``namespace/name`` through ``api`` (a client of its own), every request
    bounded by ``timeout`` seconds."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str, timeout: float):
        self.coordination = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.timeout = timeout

    def read(self) -> tuple[Record, str] | None:
        """The Lease's record and resourceVersion, or None when there is no Lease. Raises
        ``ApiException`` (other than 404) or urllib3's errors."""
        try:
            resp = self.coordination.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                          _request_timeout=self.timeout)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        lease = json.loads(resp.data)
        return record_of(lease), lease["metadata"]["resourceVersion"]

    def create(self, record: Record) -> None:
        """Create the Lease with ``record``. Raises :class:`LeaseConflict` when it exists already."""
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec_of(record)}
        self._write(self.coordination.create_namespaced_lease, self.namespace, body)

    def replace(self, record: Record, resource_version: str) -> None:
        """Write ``record`` over the Lease read at ``resource_version``. Raises
        :class:`LeaseConflict` when it changed since (or was deleted)."""
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace, "resourceVersion": resource_version},
                "spec": spec_of(record)}
        self._write(self.coordination.replace_namespaced_lease, self.name, self.namespace, body)

    def watch(self, seen: Callable[[Record], None], stop: threading.Event, every: float) -> None:
        """Until ``stop`` is set, watch the one Lease (a field selector on its name) and call
        ``seen(record)`` with each version as it arrives, so a standby notes a renewal or a
        release the moment it lands rather than at its next read. A watch that ends or fails is
        opened again after ``every`` seconds. Blocking: run it in a thread of its own."""
        while not stop.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(self.coordination.list_namespaced_lease, self.namespace,
                                           field_selector=f"metadata.name={self.name}", timeout_seconds=60,
                                           _request_timeout=75):
                    if stop.is_set():
                        break
                    if event.get("type") in ("ADDED", "MODIFIED") and isinstance(event.get("raw_object"), dict):
                        seen(record_of(event["raw_object"]))
            except Exception:  # noqa: BLE001 - the elector's own reads go on; the watch is opened again
                stop.wait(every)
            finally:
                stream.stop()

    def _write(self, method: Callable[..., Any], *args: Any) -> None:
        try:
            method(*args, _preload_content=False, _request_timeout=self.timeout)
        except ApiException as err:
            if err.status in (404, 409):
                raise LeaseConflict(f"Lease {self.namespace}/{self.name} changed: {err.reason}") from err
            raise


class Fence:
    """Fences every write made through an API client (:meth:`wrap`): a request that is not a read
    (POST, PUT, PATCH, DELETE) first asks ``acting()`` and raises :class:`NotLeading` instead of
    being sent when it says no. It also counts the writes in flight, so a replica that stops may
    wait for them to be answered before it releases the Lease (:meth:`drained`)."""

    def __init__(self, acting: Callable[[], bool]):
        self.acting = acting
        self._cond = threading.Condition()
        self._in_flight = 0

    def wrap(self, api: client.ApiClient) -> client.ApiClient:
        """Fence ``api`` (its REST client is wrapped in place); returns ``api``."""
        api.rest_client = _FencedRest(api.rest_client, self)
        return api

    def drained(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no fenced write is in flight; whether none is."""
        with self._cond:
            return self._cond.wait_for(lambda: self._in_flight == 0, timeout)

    def in_flight(self) -> int:
        """Writes sent and not answered yet."""
        with self._cond:
            return self._in_flight

    def _begin(self, method: str, url: str) -> None:
        if not self.acting():
            raise NotLeading(f"{method} {url.split('?', 1)[0]} not sent: this replica does not hold the Lease "
                             "(or could not renew it in time)")
        with self._cond:
            self._in_flight += 1

    def _end(self) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()


class _FencedRest:
    """A REST client that asks its :class:`Fence` before each request that is not a read."""

    def __init__(self, inner: Any, fence: Fence):
        self._inner = inner
        self._fence = fence

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method.upper() in READS:
            return self._inner.request(method, url, *args, **kwargs)
        self._fence._begin(method, url)
        try:
            return self._inner.request(method, url, *args, **kwargs)
        finally:
            self._fence._end()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
