"""The rollback workers follow kopf's peering pause: the toggle set kopf hands its root tasks is
found among the running tasks, and its state is what :func:`reversi.handlers.peering.paused` says."""

from __future__ import annotations

import asyncio

from kopf._cogs.aiokits import aiotoggles  # the class kopf uses for operator_paused

from reversi.handlers import peering


async def _kopf_like_root_task(*, operator_paused: aiotoggles.ToggleSet) -> None:
    await operator_paused.wait_for(True)  # as kopf's daemon killer does


async def _guard(coro) -> None:  # kopf wraps its root tasks in a guard coroutine
    await coro


def test_finds_kopfs_pause_toggles_and_reads_them():
    async def scenario() -> list[bool]:
        toggles = aiotoggles.ToggleSet(any)
        conflict = await toggles.make_toggle(False, name="reversi@None")
        task = asyncio.create_task(_guard(_kopf_like_root_task(operator_paused=toggles)))
        await asyncio.sleep(0)  # the guard now awaits the root task's coroutine
        found = peering.find(asyncio.all_tasks())
        assert found is toggles
        peering.set_toggles(found)
        states = [peering.paused()]
        await conflict.turn_to(True)  # a peer of higher priority appeared
        states.append(peering.paused())
        await asyncio.wait_for(task, 1)
        await conflict.turn_to(False)
        states.append(peering.paused())
        return states

    try:
        assert asyncio.run(scenario()) == [False, True, False]
    finally:
        peering.set_toggles(None)


def test_not_paused_when_nothing_is_found():
    async def scenario() -> object:
        return peering.find(asyncio.all_tasks())

    assert asyncio.run(scenario()) is None
    peering.set_toggles(None)
    assert peering.paused() is False
