"""Leader election over a ``coordination.k8s.io`` Lease: the decisions, with no I/O and no clock
of their own (docs/operations.md#leader-election).

The rules are client-go's (``k8s.io/client-go/tools/leaderelection``), which controller-runtime
uses too:

- **Observe, do not trust other clocks.** A candidate notes *on its own monotonic clock* when it
  first saw the Lease's current record (:func:`observe`). The holder's lease is valid until that
  moment plus the record's ``leaseDurationSeconds``; the ``renewTime`` written by another host
  is never compared with this host's clock.
- **Decide** (:func:`decide`): no Lease → create it; the record names this candidate → renew;
  no holder (released) or a lease not renewed for ``leaseDurationSeconds`` → take it; otherwise
  wait ``retry`` seconds and look again.
- **Stop acting before another can start** (:func:`acting`): the holder acts only while its last
  successful renewal *began* less than ``renew_deadline`` seconds ago. Another candidate can take
  the Lease only ``lease`` seconds after it saw that renewal land, which is later than it began;
  so with ``renew_deadline < lease`` the holder has stopped acting at least ``lease -
  renew_deadline`` seconds (5 s by default) before anyone else may start.
- **Release on a graceful stop** (:func:`released`): the record keeps the holder's times but names
  no holder and a ``leaseDurationSeconds`` of 1, so a standby takes it at its next look.

Times here are floats in seconds: ``now`` and the observation times on one monotonic clock.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from enum import Enum

#: client-go's and controller-runtime's defaults (seconds)
LEASE_SECONDS = 15.0
RENEW_DEADLINE_SECONDS = 10.0
RETRY_PERIOD_SECONDS = 2.0
#: the ``leaseDurationSeconds`` a released Lease carries (client-go's ``release``)
RELEASED_LEASE_SECONDS = 1


@dataclass(frozen=True)
class Timings:
    """Election timings in seconds: ``lease`` (how long a holder's Lease is valid after its last
    renewal was seen), ``renew_deadline`` (how long the holder keeps acting without a successful
    renewal) and ``retry`` (the period of every attempt). Raises ``ValueError`` unless
    ``0 < retry < renew_deadline < lease``."""

    lease: float = LEASE_SECONDS
    renew_deadline: float = RENEW_DEADLINE_SECONDS
    retry: float = RETRY_PERIOD_SECONDS

    def __post_init__(self) -> None:
        if not 0 < self.retry < self.renew_deadline < self.lease:
            raise ValueError(f"leader election needs 0 < retry ({self.retry}) < renew deadline "
                             f"({self.renew_deadline}) < lease ({self.lease})")


@dataclass(frozen=True)
class Record:
    """What a Lease's spec says: ``holder`` (``holderIdentity``; None or "" when released),
    ``duration`` (``leaseDurationSeconds``), ``acquired``/``renewed`` (``acquireTime``/``renewTime``,
    aware UTC datetimes or None) and ``transitions`` (``leaseTransitions``)."""

    holder: str | None = None
    duration: int | None = None
    acquired: dt.datetime | None = None
    renewed: dt.datetime | None = None
    transitions: int = 0


@dataclass(frozen=True)
class Observed:
    """A Lease record and ``at``: when this candidate first saw it unchanged (monotonic seconds)."""

    record: Record
    at: float


class Action(Enum):
    """What a candidate does on one attempt (:func:`decide`)."""

    CREATE = "create"  # no Lease yet: create it, naming this candidate
    RENEW = "renew"  # this candidate holds it: write a new renewTime
    TAKE = "take"  # released or expired: write this candidate as the holder
    WAIT = "wait"  # another holds a valid lease: look again after ``retry`` seconds


def observe(previous: Observed | None, record: Record, now: float) -> Observed:
    """The observation after reading ``record`` at ``now``: the earlier one when the record is
    the same (its clock keeps running), else a new one starting now."""
    if previous is not None and previous.record == record:
        return previous
    return Observed(record, now)


def expired(observed: Observed, now: float) -> bool:
    """Whether the observed holder's lease ran out: no holder, no duration, or ``duration``
    seconds passed since the record was first seen."""
    record = observed.record
    if not record.holder or not record.duration:
        return True
    return now >= observed.at + record.duration


def decide(identity: str, observed: Observed | None, now: float) -> Action:
    """The action of candidate ``identity`` given the Lease as last observed (None: there is no
    Lease) at ``now`` (see the module docstring)."""
    if observed is None:
        return Action.CREATE
    if observed.record.holder == identity:
        return Action.RENEW
    if expired(observed, now):
        return Action.TAKE
    return Action.WAIT


def acting(renewed_at: float | None, now: float, timings: Timings) -> bool:
    """Whether the holder may still act (write, create a Job) at ``now``: its last successful
    acquisition or renewal began at ``renewed_at`` (None: it holds nothing) less than
    ``renew_deadline`` seconds ago. A clock that went backwards (``now < renewed_at``) is not
    trusted: False."""
    if renewed_at is None:
        return False
    return renewed_at <= now < renewed_at + timings.renew_deadline


def written(identity: str, action: Action, current: Record | None, now_utc: dt.datetime,
            timings: Timings) -> Record:
    """The record to write for ``action`` (CREATE, RENEW or TAKE; Raises ``ValueError`` for WAIT):
    this candidate as holder, ``lease`` seconds (rounded up), renewed ``now_utc``; the acquire
    time kept on a renewal, and ``transitions`` counted up when an existing Lease changes hands."""
    if action is Action.WAIT:
        raise ValueError("a candidate that waits writes nothing")
    duration = int(-(-timings.lease // 1))
    base = current or Record()
    if action is Action.RENEW and base.holder == identity:
        return replace(base, duration=duration, renewed=now_utc, acquired=base.acquired or now_utc)
    changed = current is not None and base.holder != identity
    return Record(holder=identity, duration=duration, acquired=now_utc, renewed=now_utc,
                  transitions=base.transitions + (1 if changed else 0))


def released(current: Record, now_utc: dt.datetime) -> Record:
    """The record a holder writes on a graceful stop: no holder, ``RELEASED_LEASE_SECONDS``, the
    renew time ``now_utc`` (client-go's release); a standby takes it at its next look."""
    return replace(current, holder=None, duration=RELEASED_LEASE_SECONDS, renewed=now_utc)
