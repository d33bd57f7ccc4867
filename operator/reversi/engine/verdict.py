"""How a RollbackRequest ends: its final phase, the reasons and messages of its conditions, its
Event and the verdict its metric counts (docs/concepts.md#the-rollbackrequests-status). Pure: it
takes what the pass found and returns one :class:`Ending`; the handler writes it.

The rules, in the order they win:

- ``Succeeded`` when the report is complete, else ``Incomplete``.
- ``Complete=False`` says ``Partial`` (something was undone) or ``NotPossible`` (nothing could
  be); ``Complete=True`` says ``AllCompensated``, or ``NothingToUndo`` when the plan compensates
  nothing (and no child run was rolled back).
- ``Stalled`` says ``Incomplete``, or ``DeadlineExceeded`` when ``spec.deadlineSeconds`` passed.
- A cancelled request (rule 13) says ``Cancelled`` in both, whatever else is true, and its
  verdict starts with who cancelled it.
- Steps still awaiting approval when it ended (the deadline passed first) make ``Ready``/
  ``Stalled`` say ``AwaitingApproval``, with the steps, before the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .. import conditions as c

Condition = tuple[str, str, str, str]  # (type, status, reason, message)


@dataclass(frozen=True)
class Ending:
    """What a request that ends says. ``conditions``: Running, AwaitingApproval and Complete
    (``(type, status, reason, message)``); ``readiness``: the reason and message of its
    Ready/Reconciling/Stalled for ``phase``; ``event``: the Event's reason (its message is
    ``verdict``; a Warning unless complete); ``outcome``: the verdict label of
    ``reversi_rollbacks_total``."""

    phase: Literal["Succeeded", "Incomplete"]
    verdict: str
    conditions: tuple[Condition, ...]
    readiness: tuple[str, str]
    event: str
    outcome: Literal["complete", "cancelled", "incomplete"]
    warning: bool


def ending(*, complete: bool, verdict: str, undone_some: bool, compensates_nothing: bool,
           deadline_passed: bool, cancelled_by: str | None, cancelling: bool, awaiting: list[int],
           approve_all: bool) -> Ending:
    """The :class:`Ending` of a request whose report is ``complete`` (or not) with the one-line
    summary ``verdict``. ``undone_some``: a step was undone (compensated, unverified, already
    recovered); ``compensates_nothing``: the plan has no compensation and no child run;
    ``cancelling``: ``spec.cancel`` is set (by ``cancelled_by``); ``awaiting``: steps still
    awaiting approval; ``approve_all``: ``spec.approveCompensations`` (the reason
    AwaitingApproval=False gives when none waits)."""
    phase: Literal["Succeeded", "Incomplete"] = "Succeeded" if complete else "Incomplete"
    stalled_reason = c.ALL_COMPENSATED if complete else c.DEADLINE_EXCEEDED if deadline_passed else c.INCOMPLETE
    complete_reason = c.ALL_COMPENSATED if complete else c.PARTIAL if undone_some else c.NOT_POSSIBLE
    if complete and compensates_nothing:
        complete_reason = stalled_reason = c.NOTHING_TO_UNDO
    if cancelling:  # Cancelled wins over Partial/NotPossible: a person stopped it
        verdict = (f"cancelled by {cancelled_by or 'an unknown user'}"
                   + ("; nothing was left to stop: " if complete else ": ") + verdict)
        if not complete:
            complete_reason = stalled_reason = c.CANCELLED
    unapproved = f"steps {awaiting} were not approved before the deadline"
    # stalled on approvals that came too late: say so, the rest of the verdict follows
    readiness = (c.AWAITING_APPROVAL, f"{unapproved}; {verdict}") if awaiting else (stalled_reason, verdict)
    none_awaiting = c.APPROVED_FOR_ALL if approve_all else c.NONE_AWAITING
    conditions: tuple[Condition, ...] = (
        (c.RUNNING, c.FALSE, c.FINISHED, "no compensation is running or can start"),
        (c.AWAITING_APPROVAL, c.FALSE, c.AWAITING_APPROVAL if awaiting else none_awaiting,
         unapproved if awaiting else "no step waits for approval"),
        (c.COMPLETE, c.TRUE if complete else c.FALSE, complete_reason, verdict),
    )
    outcome: Literal["complete", "cancelled", "incomplete"] = (
        "complete" if complete else "cancelled" if cancelling else "incomplete")
    event = {"complete": "RollbackComplete", "cancelled": "RollbackCancelled",
             "incomplete": "RollbackIncomplete"}[outcome]
    return Ending(phase, verdict, conditions, readiness, event, outcome, warning=not complete)
