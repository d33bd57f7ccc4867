"""The rollback workers follow kopf's peering pause through a kopf daemon
(reversi.handlers.peering; docs/operations.md#standby-replicas-peering): without peering a replica
is never paused; with peering it is paused until kopf runs the daemon, and again once kopf stops it.
tests/integration/test_standby_pause.py shows the same with kopf pausing and resuming real replicas."""

from __future__ import annotations

import asyncio

import pytest

from reversi.handlers import peering


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


@pytest.fixture(autouse=True)
def standalone_afterwards():
    yield
    peering.follow(peering=False)


def test_without_peering_a_replica_is_never_paused():
    assert peering.follow(peering=False) is None
    assert peering.paused() is False
    assert not peering._is_followed(name=peering.CLUSTER_PEERING_CRD)  # the daemon runs on no CRD


@pytest.mark.parametrize(("clusterwide", "crd"), [(True, "clusterkopfpeerings.kopf.dev"),
                                                 (False, "kopfpeerings.kopf.dev")])
def test_the_daemon_runs_on_the_crd_of_the_peering_kind_kopf_uses(clusterwide, crd):
    assert peering.follow(peering=True, clusterwide=clusterwide) == crd
    assert peering._is_followed(name=crd)
    assert not peering._is_followed(name="runs.reversi.dev")
    assert not peering._is_followed(name=({peering.CLUSTER_PEERING_CRD, peering.NAMESPACED_PEERING_CRD} - {crd}).pop())


def test_with_peering_a_replica_works_only_while_kopf_runs_the_daemon():
    """Paused until kopf starts the daemon (kopf resumed the replica), active while it runs,
    paused again as soon as kopf stops it (kopf paused the replica, or it exits)."""

    async def scenario() -> list[bool]:
        peering.follow(peering=True, clusterwide=True)
        states = [peering.paused()]
        stopped = _Stopped()
        daemon = asyncio.create_task(peering.active(stopped=stopped, name=peering.CLUSTER_PEERING_CRD))
        await asyncio.sleep(0)  # the daemon runs up to its wait
        states.append(peering.paused())
        stopped.set()
        await asyncio.wait_for(daemon, 5)
        states.append(peering.paused())
        return states

    assert asyncio.run(scenario()) == [True, False, True]


def test_a_daemon_that_fails_leaves_the_replica_paused():
    """However the daemon ends (here: cancelled by kopf at exit), the replica counts as paused."""

    async def scenario() -> bool:
        peering.follow(peering=True, clusterwide=False)
        daemon = asyncio.create_task(peering.active(stopped=_Stopped(), name=peering.NAMESPACED_PEERING_CRD))
        await asyncio.sleep(0)
        assert peering.paused() is False
        daemon.cancel()
        with pytest.raises(asyncio.CancelledError):
            await daemon
        return peering.paused()

    assert asyncio.run(scenario()) is True
