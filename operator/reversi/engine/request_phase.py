"""The phase of a RollbackRequest at work and when it ends, with the reasons and messages of its
conditions (docs/concepts.md#the-rollbackrequests-status). Pure: each function takes what a pass
found and returns one value the handler writes (:class:`Phase`, :class:`Ending`).

Under way: ``AwaitingApproval`` when only steps awaiting approval are left to start (nothing runs,
no child run is being rolled back), else ``Running``. ``Running=False`` says why nothing runs:
``AwaitingApproval``, ``Idle`` (between Jobs) or ``NotStarted``.

When it ends, the rules, in the order they win:

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
class Phase:
    """What a request says in a phase that is not its end: ``phase``, ``conditions`` (``(type,
    status, reason, message)``) and ``readiness`` (reason and message of its
    Ready/Reconciling/Stalled, which the phase decides)."""

    phase: Literal["Planned", "Waiting", "Running", "AwaitingApproval"]
    conditions: tuple[Condition, ...]
    readiness: tuple[str, str]


def planned(compensations: int, fully_reversible: bool) -> tuple[Condition, ...]:
    """Invalid=False and Planned=True of a request whose plan is made (``compensations``: how many
    steps it compensates)."""
    return ((c.INVALID, c.FALSE, c.VALID, "the request and its Run are valid"),
            (c.PLANNED, c.TRUE, c.PLAN_READY,
             f"{compensations} compensations planned; fullyReversible={str(fully_reversible).lower()}"))


def dry_run() -> Phase:
    """A dry run ends once planned: nothing is undone, the plan is its answer."""
    return Phase("Planned", ((c.RUNNING, c.FALSE, c.DRY_RUN, "dry run: nothing is undone"),
                             (c.COMPLETE, c.FALSE, c.DRY_RUN, "dry run: see status.plan")),
                 (c.PLAN_READY, "dry run: the plan is in status.plan"))


def waiting(namespace: str, holder: str | None, held_run: str | None) -> Phase:
    """A request waiting for the lock of ``held_run`` (its Run, or one below it), which
    RollbackRequest ``holder`` holds (rule 6: one request works on a run at a time)."""
    message = (f"RollbackRequest {namespace}/{holder} is working on Run {namespace}/{held_run}; "
               "this one starts when it ends")
    return Phase("Waiting", ((c.RUNNING, c.FALSE, c.WAITING_FOR_RUN, message),), (c.WAITING_FOR_RUN, message))


def under_way(*, running: bool, awaiting: list[int], only_approvals_left: bool, started_any: bool,
              progress: str, active: list[int], busy_children: list[tuple[str, str | None]], verdict: str,
              approve_all: bool) -> Phase:
    """The :class:`Phase` of a request at work (Running or AwaitingApproval). ``running``: a Job of it runs;
    ``awaiting``: steps awaiting approval; ``only_approvals_left``: nothing runs, no child run is
    being rolled back and no other step can start; ``started_any``: some step got past pending;
    ``progress`` (``"2/5"``) and ``active`` (the steps at work) for the Running
    message; ``busy_children``: ``(child run, its request)`` being rolled back; ``verdict``: the
    report so far (Complete's message)."""
    phase: Literal["Running", "AwaitingApproval"] = (
        "AwaitingApproval" if awaiting and only_approvals_left else "Running")
    running_message = f"{progress} compensated; active steps: {active or 'none'}"
    running_message += "".join(f"; child Run {run} is being rolled back by RollbackRequest {request}"
                               for run, request in busy_children)
    awaiting_message = (f"steps {awaiting} wait for approval (kubectl reversi approve, "
                        "or spec.approveCompensations)" if awaiting else "no step waits for approval")
    not_running = c.AWAITING_APPROVAL if awaiting else c.IDLE if started_any else c.NOT_STARTED
    conditions: tuple[Condition, ...] = (
        (c.RUNNING, c.TRUE if running else c.FALSE, c.IN_PROGRESS if running else not_running, running_message),
        (c.AWAITING_APPROVAL, c.TRUE if awaiting else c.FALSE,
         c.AWAITING_APPROVAL if awaiting else _none_awaiting(approve_all), awaiting_message),
        (c.COMPLETE, c.FALSE, c.IN_PROGRESS, verdict),
    )
    readiness = ((c.AWAITING_APPROVAL, awaiting_message) if phase == "AwaitingApproval"
                 else (c.IN_PROGRESS, running_message))
    return Phase(phase, conditions, readiness)


def _none_awaiting(approve_all: bool) -> str:
    """AwaitingApproval=False says why no step waits: all approved at once, or each one settled."""
    return c.APPROVED_FOR_ALL if approve_all else c.NONE_AWAITING


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
    conditions: tuple[Condition, ...] = (
        (c.RUNNING, c.FALSE, c.FINISHED, "no compensation is running or can start"),
        (c.AWAITING_APPROVAL, c.FALSE, c.AWAITING_APPROVAL if awaiting else _none_awaiting(approve_all),
         unapproved if awaiting else "no step waits for approval"),
        (c.COMPLETE, c.TRUE if complete else c.FALSE, complete_reason, verdict),
    )
    outcome: Literal["complete", "cancelled", "incomplete"] = (
        "complete" if complete else "cancelled" if cancelling else "incomplete")
    event = {"complete": "RollbackComplete", "cancelled": "RollbackCancelled",
             "incomplete": "RollbackIncomplete"}[outcome]
    return Ending(phase, verdict, conditions, readiness, event, outcome, warning=not complete)
