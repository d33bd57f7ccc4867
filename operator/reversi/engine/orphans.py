"""Settling an undo left in flight by a deleted RollbackRequest (rule 14): pure.

Compensator Jobs are owned by the Run, so deleting a request mid-way never kills a compensator
in the middle of its call. The request's journal entry (``status.undo`` of the step's RunStep)
still says ``compensating``; it is settled from the true outcome of the Job it names — the Job
whose deterministic name has the entry's run, step and attempt — by the first of:

- the handler of that Job's events, once the Job has finished and no live request works on the
  run (:func:`settle`);
- the next request that takes the Run's lock: it plans the step ``compensate`` ("a compensation
  was already started: its Job is adopted"), resumes it at the journaled attempt and adopts the
  Job by its name instead of starting another (rule 3), then reads it back as usual.

Either way the compensator never runs again when its Job succeeded. The rule:

==================== ====================================================================
Job                  entry becomes
==================== ====================================================================
running              unchanged (``compensating``: the Job will settle it)
succeeded            ``compensated``, verification ``unverified`` when the step's snapshot
                     declares a read-back (a later request runs it, never the compensator
                     again), else ``none``
failed               ``compensationFailed`` with the Job's error, and ``effectUnknown`` when the
                     compensator was stopped mid-call with no answer of its own (residue
                     ``unknown``); the next request retries it with the same idempotency key
                     and its own retries budget (rule 6)
==================== ====================================================================

An entry that is not ``compensating``, or that names another attempt or another request than
the Job's, is not touched (someone else already settled it or took it over).
"""

from __future__ import annotations

from ..models.run import StepUndo
from .executor import JobView


def settle(entry: StepUndo | None, *, request: str, attempt: int, job: JobView, readback_declared: bool,
           now: str) -> StepUndo | None:
    """The settled journal entry of a step whose compensator Job ``job`` (attempt ``attempt``,
    started by the deleted RollbackRequest ``request``) was left in flight, or None when nothing
    is to be written (see the module docstring). ``now`` is the RFC 3339 time written as
    ``updatedAt``. Never raises."""
    if entry is None or entry.state != "compensating" or entry.attempts != attempt or entry.request != request:
        return None
    if job.state == "running":
        return None
    if job.state == "succeeded":
        return _with(entry, state="compensated", verification="unverified" if readback_declared else "none",
                     last_error=None, updated_at=now)
    error = job.message or "the compensator exited non-zero"
    return _with(entry, state="compensationFailed", verification=None, updated_at=now,
                 effect_unknown=job.effect_unknown or (job.lost and entry.effect_unknown) or None,
                 last_error=f"{error} (attempt {attempt}; its RollbackRequest {request} was deleted mid-way; the next "
                            "request retries it with the same idempotency key)")


def _with(entry: StepUndo, **changes: object) -> StepUndo:
    return StepUndo.model_validate({**entry.model_dump(), **changes})
