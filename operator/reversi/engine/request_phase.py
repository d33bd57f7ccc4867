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

from .. import conditions as cond
from . import executor as ex

Condition = tuple[str, str, str, str]  # (type, status, reason, message)


PhaseName = Literal["Pending", "Waiting", "Planned", "AwaitingApproval", "Running", "Succeeded", "Incomplete",
                   "Failed"]


@dataclass(frozen=True)
class Phase:
    """What a request says in a phase: ``phase``, ``conditions`` (``(type, status, reason,
    message)``) and ``readiness`` (reason and message of its Ready/Reconciling/Stalled, whose
    status the phase decides: :func:`reversi.conditions.request_readiness`)."""

    phase: PhaseName
    conditions: tuple[Condition, ...]
    readiness: tuple[str, str]

    def updates(self) -> list[Condition]:
        """Every condition this phase sets, its Ready/Reconciling/Stalled included: the one way a
        request's phase becomes conditions (for ``reversi.adapters.status.summary_conditions``)."""
        return [*self.conditions, *cond.request_readiness(self.phase, *self.readiness)]


Verdict = Literal["complete", "cancelled", "incomplete", "invalid", "dryRun"]


@dataclass(frozen=True)
class Ending(Phase):
    """What a request that ends says, on top of its :class:`Phase`: ``verdict`` (the one-line
    summary), ``event`` (the Event's reason, its message the verdict; None: no Event),
    ``warning`` (a Warning Event), ``outcome`` (the verdict label of
    ``reversi_rollbacks_total``)."""

    verdict: str = ""
    event: str | None = None
    outcome: Verdict = "incomplete"
    warning: bool = False


def planned(compensations: int, fully_reversible: bool) -> tuple[Condition, ...]:
    """Invalid=False and Planned=True of a request whose plan is made (``compensations``: how many
    steps it compensates)."""
    return ((cond.INVALID, cond.FALSE, cond.VALID, "the request and its Run are valid"),
            (cond.PLANNED, cond.TRUE, cond.PLAN_READY,
             f"{compensations} compensations planned; fullyReversible={str(fully_reversible).lower()}"))


def dry_run() -> Ending:
    """A dry run ends once planned: nothing is undone, the plan is its answer (no Event)."""
    return Ending("Planned", ((cond.RUNNING, cond.FALSE, cond.DRY_RUN, "dry run: nothing is undone"),
                              (cond.COMPLETE, cond.FALSE, cond.DRY_RUN, "dry run: see status.plan")),
                  (cond.PLAN_READY, "dry run: the plan is in status.plan"), verdict="dry run", outcome="dryRun")


def run_missing(message: str) -> Phase:
    """A request whose Run does not exist yet, waiting for it to be created (``Pending``,
    ``Planned=False`` reason ``RunNotFound``; Reconciling=True, so a GitOps tool waits)."""
    return Phase("Pending", ((cond.PLANNED, cond.FALSE, cond.RUN_NOT_FOUND, message),), (cond.RUN_NOT_FOUND, message))


def failed(reason: str, message: str) -> Ending:
    """A request that cannot be carried out (docs/concepts.md#the-rollbackrequests-status):
    ``Failed`` with ``Invalid=True`` (``reason``: what is wrong; ``message``: what to fix), a
    Warning Event of that reason, verdict label ``invalid``."""
    return Ending("Failed", ((cond.INVALID, cond.TRUE, reason, message),
                             (cond.RUNNING, cond.FALSE, cond.FINISHED, "the request cannot be carried out"),
                             (cond.COMPLETE, cond.FALSE, reason, message)),
                  (reason, message), verdict=message, event=reason, outcome="invalid", warning=True)


def cancelled_before_planning(cancelled_by: str | None, why: str) -> Ending:
    """A request cancelled (rule 13) before it could plan (``why``: its Run is missing): it ends
    ``Incomplete`` with ``Complete=False`` reason ``Cancelled``; nothing ran, no lock was taken."""
    message = (f"cancelled by {cancelled_by or 'an unknown user'} before anything was planned ({why}): "
               "nothing was undone")
    return Ending("Incomplete", ((cond.RUNNING, cond.FALSE, cond.FINISHED, "no compensation ran"),
                                 (cond.COMPLETE, cond.FALSE, cond.CANCELLED, message)),
                  (cond.CANCELLED, message), verdict=message, event="RollbackCancelled", outcome="cancelled",
                  warning=True)


def waiting(namespace: str, holder: str | None, held_run: str | None) -> Phase:
    """A request waiting for the lock of ``held_run`` (its Run, or one below it), which
    RollbackRequest ``holder`` holds (rule 6: one request works on a run at a time)."""
    message = (f"RollbackRequest {namespace}/{holder} is working on Run {namespace}/{held_run}; "
               "this one starts when it ends")
    return Phase("Waiting", ((cond.RUNNING, cond.FALSE, cond.WAITING_FOR_RUN, message),),
                 (cond.WAITING_FOR_RUN, message))


def already_waiting(status: dict, generation: int, namespace: str, holder: str, run: str) -> bool:
    """Whether a request's stored ``status`` already says what :func:`waiting` would say now: phase
    ``Waiting`` for this ``generation`` of its spec, its ``Running`` condition naming ``holder``'s
    lock on ``run``. Then a pass may end before it plans (rule 6: one request works on a run at a
    time; the holder's release wakes it)."""
    if status.get("phase") != "Waiting" or status.get("observedGeneration") != generation:
        return False
    said = cond.get_condition(status.get("conditions"), cond.RUNNING) or {}
    expected = waiting(namespace, holder, run).readiness[1]
    return said.get("reason") == cond.WAITING_FOR_RUN and said.get("message") == expected


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
    not_running = cond.AWAITING_APPROVAL if awaiting else cond.IDLE if started_any else cond.NOT_STARTED
    updates: tuple[Condition, ...] = (
        (cond.RUNNING, cond.TRUE if running else cond.FALSE, cond.IN_PROGRESS if running else not_running,
         running_message),
        (cond.AWAITING_APPROVAL, cond.TRUE if awaiting else cond.FALSE,
         cond.AWAITING_APPROVAL if awaiting else _none_awaiting(approve_all), awaiting_message),
        (cond.COMPLETE, cond.FALSE, cond.IN_PROGRESS, verdict),
    )
    readiness = ((cond.AWAITING_APPROVAL, awaiting_message) if phase == "AwaitingApproval"
                 else (cond.IN_PROGRESS, running_message))
    return Phase(phase, updates, readiness)


def _none_awaiting(approve_all: bool) -> str:
    """AwaitingApproval=False says why no step waits: all approved at once, or each one settled."""
    return cond.APPROVED_FOR_ALL if approve_all else cond.NONE_AWAITING


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
    stalled_reason = (cond.ALL_COMPENSATED if complete else cond.DEADLINE_EXCEEDED if deadline_passed
                      else cond.INCOMPLETE)
    complete_reason = cond.ALL_COMPENSATED if complete else cond.PARTIAL if undone_some else cond.NOT_POSSIBLE
    if complete and compensates_nothing:
        complete_reason = stalled_reason = cond.NOTHING_TO_UNDO
    if cancelling:  # Cancelled wins over Partial/NotPossible: a person stopped it
        verdict = (f"cancelled by {cancelled_by or 'an unknown user'}"
                   + ("; nothing was left to stop: " if complete else ": ") + verdict)
        if not complete:
            complete_reason = stalled_reason = cond.CANCELLED
    unapproved = f"steps {awaiting} were not approved before the deadline"
    # stalled on approvals that came too late: say so, the rest of the verdict follows
    readiness = (cond.AWAITING_APPROVAL, f"{unapproved}; {verdict}") if awaiting else (stalled_reason, verdict)
    updates: tuple[Condition, ...] = (
        (cond.RUNNING, cond.FALSE, cond.FINISHED, "no compensation is running or can start"),
        (cond.AWAITING_APPROVAL, cond.FALSE, cond.AWAITING_APPROVAL if awaiting else _none_awaiting(approve_all),
         unapproved if awaiting else "no step waits for approval"),
        (cond.COMPLETE, cond.TRUE if complete else cond.FALSE, complete_reason, verdict),
    )
    outcome: Verdict = (
        "complete" if complete else "cancelled" if cancelling else "incomplete")
    event = {"complete": "RollbackComplete", "cancelled": "RollbackCancelled",
             "incomplete": "RollbackIncomplete"}[outcome]
    return Ending(phase, updates, readiness, verdict=verdict, event=event, outcome=outcome, warning=not complete)


# ------------------------------------------------------------------------------ the pass's end

def ends(*, finished: bool, awaiting: list[int], deadline_passed: bool) -> bool:
    """Whether a request ends in this pass: nothing can move any more (``finished``), unless steps
    still await approval (``awaiting``) and its deadline has not passed: a person may still
    approve them, so it stays ``AwaitingApproval``."""
    return finished and not (awaiting and not deadline_passed)


def next_pass(phase: PhaseName, *, tick_seconds: float, wait_seconds: float, late: float | None = None) -> float:
    """Seconds until the next pass of a request under way in ``phase``: ``late`` when a recount of
    the run boundary asked for it (rule 11), ``wait_seconds`` while it awaits an approval (the
    approval itself wakes it), else ``tick_seconds``."""
    if late is not None:
        return late
    return wait_seconds if phase == "AwaitingApproval" else tick_seconds


#: the longest a request's status may go unwritten while it only has steps under way (see
#: :func:`only_under_way`): a step started or handed over shows in status within this time, in seconds
STATUS_DEFER_SECONDS = 5.0


def may_defer_write(old: dict, new: dict, unwritten_since: float | None, now: float) -> bool:
    """Whether the write of request status ``new`` (the stored one is ``old``) may wait: it only
    has steps under way (:func:`only_under_way`) and the status has gone unwritten for less than
    :data:`STATUS_DEFER_SECONDS` (``unwritten_since`` and ``now``: monotonic seconds; None: the
    stored status is up to date)."""
    return only_under_way(old, new) and (unwritten_since is None or now - unwritten_since < STATUS_DEFER_SECONDS)


def only_under_way(old: dict, new: dict) -> bool:
    """Whether request status ``new`` differs from the stored ``old`` only in steps under way:
    started (``pending`` -> a stage that holds a parallelism slot, :data:`executor.SLOT_STAGES`)
    or handed over from their compensator to its check or first read-back (``compensating`` ->
    ``checking`` or ``verifying``, same attempt), and in what those change in the summary (the
    conditions' messages, the report). Such a status is not written at once (to keep API writes few: a
    step's status is written when it ends, with the starts since; at the latest after
    :data:`STATUS_DEFER_SECONDS`). It is what a crash between a Job's creation and the status
    write leaves: a pass that rebuilds from the older status finds each step's journal entry
    (rule 3: written before its Job) and adopts its Jobs by their names (``executor._handed_over``).
    A phase, an outcome, an approval, a retry, pinned RunSteps or runners are written at once."""
    before = {e.get("step"): e for e in old.get("steps") or []}
    after = new.get("steps") or []
    if not before or len(after) != len(before):
        return False
    for entry in after:
        was = before.get(entry.get("step"))
        if was is None:
            return False
        if was != entry and not (_handed_over(was, entry) or _started(was, entry)):
            return False
    return _summary(new) == _summary(old)


def _handed_over(was: dict, entry: dict) -> bool:
    return (was.get("stage") in ("compensating", "checking") and entry.get("stage") in ("checking", "verifying")
            and entry.get("attempts") == was.get("attempts") and entry.get("reads", 0) <= 1)


def _started(was: dict, entry: dict) -> bool:
    return was.get("stage") == "pending" and entry.get("stage") in ex.SLOT_STAGES


def _summary(status: dict) -> dict:
    """A status without its steps, its report and its conditions' messages."""
    rest = {k: v for k, v in status.items() if k not in ("steps", "conditions", "report")}
    rest["conditions"] = sorted(tuple(sorted((k, str(v)) for k, v in item.items() if k != "message"))
                                for item in status.get("conditions") or [])
    return rest
