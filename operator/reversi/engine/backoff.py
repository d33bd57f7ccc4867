"""Backoff between attempts (rules 4 and 5, docs/concepts.md#rollback-rules): exponential, capped, with jitter.

The ceiling of attempt ``n`` (1 = the wait before the first retry) is
``min(max_ms, base_ms * 2 ** (n - 1))``. Jitter spreads retries of many steps apart:

- ``full``: uniform in ``[0, ceiling]`` (AWS "full jitter");
- ``equal``: ``ceiling / 2`` plus uniform in ``[0, ceiling / 2]``;
- ``none``: exactly the ceiling (the verification read-backs: "wait backoff, doubling").
"""

from __future__ import annotations

import random
from typing import Literal, Protocol

Jitter = Literal["full", "equal", "none"]


class RandomSource(Protocol):
    """Anything with ``random() -> float`` in ``[0, 1)`` (``random.Random``, a test stub)."""

    def random(self) -> float: ...  # pragma: no cover


def ceiling_ms(attempt: int, base_ms: int, max_ms: int) -> int:
    """The un-jittered delay of ``attempt`` (>= 1) in milliseconds: ``min(max_ms, base_ms * 2**(attempt-1))``.

    Raises ``ValueError`` for ``attempt < 1``, ``base_ms < 0`` or ``max_ms < 0``.
    """
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, not {attempt}")
    if base_ms < 0 or max_ms < 0:
        raise ValueError("base_ms and max_ms must not be negative")
    # 2**63 is far above any max_ms: stop doubling early so huge attempts stay cheap
    exponent = min(attempt - 1, 63)
    return min(max_ms, base_ms * (1 << exponent))


def delay_seconds(
    attempt: int,
    base_ms: int,
    max_ms: int,
    rng: RandomSource | None = None,
    jitter: Jitter = "full",
) -> float:
    """Seconds to wait before attempt ``attempt + 1`` (``attempt`` = failures so far, >= 1).

    Always in ``[0, max_ms / 1000]``; with ``jitter="none"`` exactly the ceiling.
    ``rng`` defaults to the ``random`` module. Raises ``ValueError`` for a bad attempt or jitter.
    """
    cap = ceiling_ms(attempt, base_ms, max_ms)
    source = rng if rng is not None else random
    if jitter == "full":
        delay = source.random() * cap
    elif jitter == "equal":
        delay = cap / 2 + source.random() * (cap / 2)
    elif jitter == "none":
        delay = float(cap)
    else:
        raise ValueError(f"jitter must be full, equal or none, not {jitter!r}")
    return min(delay, float(max_ms)) / 1000.0
