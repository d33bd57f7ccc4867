"""Small helpers shared by the integration tests."""

from __future__ import annotations

import time
from typing import TypeVar
from collections.abc import Callable

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float = 60.0, interval: float = 0.25,
             what: str = "condition") -> T:
    """Call ``check`` until it returns something truthy; return that value.

    Raises ``AssertionError`` naming ``what`` and the last value after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last  # type: ignore[return-value]
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}")


def recorded_steps(api, namespace: str, run: str) -> list[dict]:
    """The steps recorded in Run ``namespace/run`` (their RunSteps' specs), in index order."""
    from kubernetes import client

    from reversi.adapters.journal import list_objects

    return [o["spec"] for o in list_objects(client.CustomObjectsApi(api), namespace, run)]
