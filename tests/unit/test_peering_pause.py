"""The rollback workers follow kopf's peering pause through a kopf daemon
(reversi.handlers.peering; docs/operations.md#standby-replicas-peering): without peering a replica
is never paused; with peering it is paused until kopf runs the daemon, and again once kopf stops it.
The state is the process's own (``Parts.peering``, built by the start-up handler with the parts):
the daemon finds it on kopf's memo, the workers are handed it.
tests/integration/test_standby_pause.py shows the same with kopf pausing and resuming real replicas."""

from __future__ import annotations

import asyncio
import copy

import kopf
import pytest
from kubernetes import client

from reversi.adapters.kube import Kube
from reversi.entrypoints import operator as operator_entry
from reversi.handlers import peering, runtime
from reversi.settings import OperatorSettings


class _Stopped:
    """A stand-in for kopf's ``stopped`` flag of an async daemon (false until set; awaitable wait)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def __bool__(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()

    async def wait(self, timeout: float | None = None) -> _Stopped:
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            pass
        return self


def _memo(*, peering_on: bool, clusterwide: bool = True) -> kopf.Memo:
    """kopf's memo of one CRD as the operator's start-up handler leaves it (reversi.entrypoints.
    operator.configure): the parts, built with the process's Peering; kopf gives each resource a
    shallow copy of the operator's memo."""
    kube = Kube(client.ApiClient(client.Configuration()))
    built = runtime.build(OperatorSettings(), kube,
                          peering=peering.Peering(peering=peering_on, clusterwide=clusterwide))
    return copy.copy(kopf.Memo({runtime.MEMO_KEY: built}))


def _state(memo: kopf.Memo) -> peering.Peering:
    found = runtime.parts(memo).peering
    assert found is not None
    return found


def test_without_peering_a_replica_is_never_paused():
    memo = _memo(peering_on=False)
    assert _state(memo).followed is None
    assert _state(memo).paused() is False
    assert not peering._is_followed(name=peering.CLUSTER_PEERING_CRD, memo=memo)  # the daemon runs on no CRD


def test_before_the_start_up_handler_the_daemon_runs_on_no_crd():
    for name in (peering.CLUSTER_PEERING_CRD, peering.NAMESPACED_PEERING_CRD):
        assert not peering._is_followed(name=name, memo=kopf.Memo())


@pytest.mark.parametrize(("clusterwide", "crd"), [(True, "clusterkopfpeerings.kopf.dev"),
                                                 (False, "kopfpeerings.kopf.dev")])
def test_the_daemon_runs_on_the_crd_of_the_peering_kind_kopf_uses(clusterwide, crd):
    memo = _memo(peering_on=True, clusterwide=clusterwide)
    assert _state(memo).followed == crd
    assert peering._is_followed(name=crd, memo=memo)
    assert not peering._is_followed(name="runs.reversi.dev", memo=memo)
    assert not peering._is_followed(name=({peering.CLUSTER_PEERING_CRD, peering.NAMESPACED_PEERING_CRD} - {crd}).pop(),
                                    memo=memo)


def test_with_peering_a_replica_works_only_while_kopf_runs_the_daemon():
    """Paused until kopf starts the daemon (kopf resumed the replica), active while it runs,
    paused again as soon as kopf stops it (kopf paused the replica, or it exits)."""
    memo = _memo(peering_on=True, clusterwide=True)
    state = _state(memo)

    async def scenario() -> list[bool]:
        states = [state.paused()]
        stopped = _Stopped()
        daemon = asyncio.create_task(peering.active(stopped=stopped, name=peering.CLUSTER_PEERING_CRD, memo=memo))
        await asyncio.sleep(0)  # the daemon runs up to its wait
        states.append(state.paused())
        stopped.set()
        await asyncio.wait_for(daemon, 5)
        states.append(state.paused())
        return states

    assert asyncio.run(scenario()) == [True, False, True]


def test_a_daemon_that_fails_leaves_the_replica_paused():
    """However the daemon ends (here: cancelled by kopf at exit), the replica counts as paused."""
    memo = _memo(peering_on=True, clusterwide=False)
    state = _state(memo)

    async def scenario() -> bool:
        daemon = asyncio.create_task(peering.active(stopped=_Stopped(), name=peering.NAMESPACED_PEERING_CRD, memo=memo))
        await asyncio.sleep(0)
        assert state.paused() is False
        daemon.cancel()
        with pytest.raises(asyncio.CancelledError):
            await daemon
        return state.paused()

    assert asyncio.run(scenario()) is True


def test_each_process_follows_its_own_peering():
    """Two operators in one process (kopf started again, or two tests) share no peering state:
    the daemon of one makes only that one active."""
    first, second = _memo(peering_on=True), _memo(peering_on=True)

    async def scenario() -> tuple[bool, bool]:
        stopped = _Stopped()
        daemon = asyncio.create_task(peering.active(stopped=stopped, name=peering.CLUSTER_PEERING_CRD, memo=first))
        await asyncio.sleep(0)
        states = (_state(first).paused(), _state(second).paused())
        stopped.set()
        await asyncio.wait_for(daemon, 5)
        return states

    assert asyncio.run(scenario()) == (False, True)


def test_the_workers_the_start_up_handler_builds_follow_the_parts_peering():
    """reversi-operator's workers are handed the parts' Peering (no pass while it is paused)."""
    memo = _memo(peering_on=True)
    parts = runtime.parts(memo)
    operating = operator_entry._operating(parts)
    try:
        assert operating.workers.queue.paused() is True
        _state(memo).mark(+1)  # as the daemon does while kopf runs it
        assert operating.workers.queue.paused() is False
    finally:
        operating.workers.stop_all()
        operating.run_status.stop()
