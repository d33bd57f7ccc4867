"""The reconciling operator's leader election (docs/operations.md#leader-election): every replica
keeps its watches, kopf's indices and its informers warm; only the holder of the Lease acts.

:class:`Leader` is one candidate: :meth:`Leader.run` (an asyncio task the operator's start-up
activity starts on kopf's event loop) makes one attempt every ``retry`` seconds, each a read and
at most one write of the Lease in a worker thread (the client blocks), and decides with the pure
rules of :mod:`reversi.engine.election`. A watch of the one Lease (a thread of its own) notes each
renewal as it lands, so a standby's clock for the holder's lease starts then and not up to a
retry period later, and a standby makes its next attempt when that lease runs out or the moment
the Lease is released, not at its next retry. :meth:`Leader.acting` is what the rest of the operator
asks: the workers and retention before each pass (``paused``), the handlers before they write
(:meth:`reversi.handlers.runtime.Parts.reconciling`), and the API client's :class:`Fence` before
each request that writes. When the replica becomes the holder, ``on_started`` runs (the operator
takes up every object again: kopf does not replay what it has seen); :meth:`Leader.release` on a
graceful stop closes the fence, waits briefly for the writes in flight and hands the Lease back.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..adapters.lease import Fence, LeaseConflict, LeaseLock
from ..engine import election as el

log = logging.getLogger("reversi.leader")

#: how long a releasing holder waits for its writes in flight before it hands the Lease back (s)
DRAIN_SECONDS = 2.0


def _utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Leader:
    """One candidate for the Lease behind ``lock``, named ``identity`` (the pod's name), with
    ``timings``. ``metrics``: the operator's (``reversi_leader``), or None; ``on_started`` /
    ``on_stopped``: called (in a worker thread) when this replica starts or stops acting;
    ``clock``: monotonic seconds. Thread-safe: :meth:`acting` is called from any thread."""

    def __init__(self, lock: LeaseLock, identity: str, timings: el.Timings, *, metrics: Any = None,
                 on_started: Callable[[], None] | None = None, on_stopped: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, utc: Callable[[], dt.datetime] = _utc):
        self.lock = lock
        self.identity = identity
        self.timings = timings
        self.metrics = metrics
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.clock = clock
        self.utc = utc
        self.fence = Fence(self.acting)
        self.task: asyncio.Task | None = None
        self._halt = threading.Event()  # ends the Lease watch
        self._wake: Callable[[], None] = lambda: None  # brings the next attempt forward (set by run)
        self._mutex = threading.Lock()
        self._observed: el.Observed | None = None
        self._renewed_at: float | None = None  # when the last successful acquisition or renewal began
        self._leading = False
        self._stopping = False
        self._report(False)

    def acting(self) -> bool:
        """Whether this replica may act now: it holds the Lease and its last renewal began less
        than the renew deadline ago, and it is not stopping (:func:`reversi.engine.election.acting`)."""
        with self._mutex:
            return not self._stopping and el.acting(self._renewed_at, self.clock(), self.timings)

    def paused(self) -> bool:
        """The opposite of :meth:`acting` (the work queues' ``paused``)."""
        return not self.acting()

    def holder(self) -> str | None:
        """The holder as last read (None: none, or not read yet)."""
        with self._mutex:
            return self._observed.record.holder if self._observed is not None else None

    def seen(self, record: el.Record) -> None:
        """A version of the Lease the watch delivered (:meth:`LeaseLock.watch`): noted now, so a
        renewal's clock starts when it landed, not at the next read; a released or expiring Lease
        brings the next attempt forward. Safe from any thread."""
        with self._mutex:
            self._observed = el.observe(self._observed, record, self.clock())
        if not record.holder and not self._stopping:
            self._wake()

    def next_attempt(self) -> float:
        """Seconds until the next attempt: the retry period, or sooner when the observed holder's
        lease runs out before that (a standby then takes it at once)."""
        with self._mutex:
            observed, leading = self._observed, self._leading
        if leading or observed is None or not observed.record.holder or not observed.record.duration:
            return self.timings.retry
        left = observed.at + observed.record.duration - self.clock()
        return min(self.timings.retry, max(left, 0.0) + 0.01)

    def attempt(self) -> bool:
        """One attempt (blocking; from a worker thread): step down if the renew deadline passed,
        read the Lease, decide, and create, take or renew it. Returns whether this replica has just
        become the holder. Raises the API's errors (``ApiException``, urllib3's); a lost race
        (:class:`LeaseConflict`) is not an error."""
        began = self.clock()
        self._step_down_if_late(began)
        if self._stopping:
            return False
        read = self.lock.read()
        now = self.clock()
        with self._mutex:
            self._observed = el.observe(self._observed, read[0], now) if read is not None else None
            observed = self._observed
        action = el.decide(self.identity, observed, now)
        if action is el.Action.WAIT:
            self._step_down("the Lease is held by " + str(observed.record.holder if observed else None))
            return False
        record = el.written(self.identity, action, read[0] if read is not None else None, self.utc(), self.timings)
        try:
            if read is None:
                self.lock.create(record)
            else:
                self.lock.replace(record, read[1])
        except LeaseConflict as err:
            log.debug("%s", err)
            return False
        with self._mutex:
            if self._stopping:
                return False
            self._renewed_at = began
            self._observed = el.Observed(record, self.clock())
            started, self._leading = not self._leading, True
        if started:
            log.info("this replica (%s) holds the Lease %s/%s and acts", self.identity, self.lock.namespace,
                     self.lock.name)
            self._report(True)
        return started

    def _step_down_if_late(self, now: float) -> None:
        with self._mutex:
            late = self._leading and not el.acting(self._renewed_at, now, self.timings)
        if late:
            self._step_down(f"the Lease was not renewed within {self.timings.renew_deadline:g}s")

    def _step_down(self, why: str) -> None:
        with self._mutex:
            was, self._leading, self._renewed_at = self._leading, False, None
        if was:
            log.warning("this replica (%s) stops acting: %s", self.identity, why)
            self._report(False)
            if self.on_stopped is not None:
                self.on_stopped()

    def _report(self, leading: bool) -> None:
        if self.metrics is not None:
            self.metrics.leader_changed(self.identity, leading)

    async def run(self) -> None:
        """Attempt every ``retry`` seconds until :meth:`release` (kopf cancels it at exit). When
        this replica becomes the holder, ``on_started`` runs in the default executor (the next
        attempt does not wait for it)."""
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(woken.set)

        self._wake = wake
        # the watch blocks for minutes at a time: a thread of its own, not one of the loop's executor's
        threading.Thread(target=self.lock.watch, args=(self.seen, self._halt, self.timings.retry), daemon=True,
                         name="lease-watch").start()
        try:
            while not self._stopping:
                woken.clear()
                try:
                    if await asyncio.to_thread(self.attempt) and self.on_started is not None:
                        loop.run_in_executor(None, self.on_started)
                except Exception as err:  # noqa: BLE001 - the next attempt retries; the deadline steps down
                    log.warning("leader election: the Lease %s/%s could not be read or written: %s",
                                self.lock.namespace, self.lock.name, err)
                try:
                    await asyncio.wait_for(woken.wait(), self.next_attempt())
                except TimeoutError:
                    pass
        finally:
            self._halt.set()

    def release(self) -> None:
        """A graceful stop: stop acting at once (the fence closes), wait up to ``DRAIN_SECONDS``
        for the writes in flight, and hand the Lease back when this replica holds it (no holder,
        ``leaseDurationSeconds: 1``): a standby takes it at its next attempt. Never raises."""
        with self._mutex:
            self._stopping = True
            was = self._leading
        self._halt.set()
        self._step_down("the operator is stopping")
        if not was:
            return
        if not self.fence.drained(DRAIN_SECONDS):
            log.warning("releasing the Lease with %d write(s) still unanswered", self.fence.in_flight())
        try:
            read = self.lock.read()
            if read is not None and read[0].holder == self.identity:
                self.lock.replace(el.released(read[0], self.utc()), read[1])
                log.info("released the Lease %s/%s", self.lock.namespace, self.lock.name)
        except Exception as err:  # noqa: BLE001 - it expires after leaseDurationSeconds anyway
            log.warning("the Lease %s/%s was not released (it expires on its own): %s", self.lock.namespace,
                        self.lock.name, err)
