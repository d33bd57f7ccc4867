"""kopf's peering pause, seen by the rollback workers.

With peering (``REVERSI_PEERING``; standby replicas), kopf pauses an operator while a peer of
higher priority is alive (and every operator while peers of the same priority are): it closes its
watch streams and stops its daemons, and turns its pause toggles on until the peer is gone.
The rollback workers are threads of their own (:mod:`reversi.handlers.workers`), so they must ask:
a paused replica must not start reconcile passes next to the active one.

kopf (1.37 to 1.45 at least) has no public accessor for that state. It keeps it in one
``ToggleSet`` (``any`` of its toggles: one per peering object, plus "peering CRD is missing")
that it hands, as the keyword argument ``operator_paused``, to its own root tasks (the daemon
killer, every resource watcher). :func:`capture` finds that object among the running asyncio
tasks once, at start-up, and :func:`paused` reads it. When it is not found (a kopf that renamed
it), the operator logs a warning at start-up and, with peering on, treats itself as not paused:
the Run's lock (``status.activeRequest``, optimistic concurrency) still keeps two replicas from
undoing one run twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import kopf

log = logging.getLogger("reversi.peering")

#: the keyword kopf passes its pause toggle set under
KWARG = "operator_paused"
_toggles: Any = None


def _looks_like_toggles(value: Any) -> bool:
    return callable(getattr(value, "is_on", None)) and callable(getattr(value, "wait_for", None)) \
        and isinstance(value, Iterable)


def find(tasks: Iterable[asyncio.Task[Any]], depth: int = 6) -> Any:
    """The object passed as ``operator_paused`` to a coroutine of ``tasks`` (looked up through
    the coroutines they await or hold, ``depth`` levels deep), or None."""
    seen: set[int] = set()
    todo = [(task.get_coro(), 0) for task in tasks]
    while todo:
        coro, level = todo.pop()
        if coro is None or id(coro) in seen or level > depth:
            continue
        seen.add(id(coro))
        frame = getattr(coro, "cr_frame", None)
        if frame is not None:
            found = frame.f_locals.get(KWARG)
            if found is not None and _looks_like_toggles(found):
                return found
            todo += [(v, level + 1) for v in frame.f_locals.values() if asyncio.iscoroutine(v)]
        awaited = getattr(coro, "cr_await", None)
        if asyncio.iscoroutine(awaited):
            todo.append((awaited, level + 1))
    return None


def paused() -> bool:
    """Whether kopf's peering pauses the operator now (False when unknown or without peering)."""
    toggles = _toggles
    if toggles is None:
        return False
    for _ in range(3):
        try:
            return bool(toggles.is_on())
        except RuntimeError:  # the set changed size while read (kopf added a toggle): read again
            continue
    return True


def set_toggles(toggles: Any) -> None:
    """Use ``toggles`` (an object with ``is_on()``) as the pause state; None forgets it."""
    global _toggles
    _toggles = toggles


@kopf.on.startup(id="peering-pause")
async def capture(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Find kopf's pause toggles among its running tasks (see the module docstring)."""
    found = find(asyncio.all_tasks())
    set_toggles(found)
    if found is None and not settings.peering.standalone:
        log.warning("kopf's peering pause state was not found: rollback workers do not stop while a standby "
                    "replica is paused (the Run's lock still keeps two replicas from undoing one run)")
    elif found is not None:
        log.info("rollback workers follow kopf's peering pause (%d toggles now)", len(found))
