"""Which compensations may start now (rules 1 and 8; ``parallelism``).

Progress is a mapping ``{step: state}`` for the plan's compensate actions (a missing entry is
``pending``):

- ``pending``: not started; ``running``: its compensator (or reader) Job runs, or it waits for the
  backoff between attempts; ``compensated``: undone (checked or not); ``failed``: retries used up,
  or verification failed (final); ``awaitingApproval``: needs approval it does not have (rule 8);
  ``deferred``: finally blocked (set by the caller from :func:`deferred_steps` at the end);
- ``cancelled``: never started because the request was cancelled (final);
- ``alreadyRecovered``: the precheck read showed it undone (settled, no compensator ran);
- ``conflict``, ``handlerUnavailable``, ``compensationDeadlinePassed``: final, not undone (standing).

Two phases (rule 15, inverses first): among the steps the dependency rules allow, compensations of kind
``inverse`` start first; a step of kind ``compensation`` starts only while no inverse-kind step
is running or ready (pending and not blocked), and only while compensations are open (the
caller closes them when ``spec.compensationDeadlineSeconds`` has passed). Dependencies always win:
an inverse step whose dependent is a compensation-kind step waits for that step (it is not ready,
so it does not hold the compensation phase back).

A step is *unsettled* while it stands and is not compensated: a compensate action in any state but
``compensated``, and every standing step the plan will not undo (unrecoverable, unresolved,
unmanifested, defer). A step never starts while any step that depends on it is unsettled.
Newest first; at most ``parallelism`` compensations under way at once (a step whose undo is done and
is being read back holds no slot, :data:`~reversi.engine.executor.SLOT_STAGES`). Every function takes the full plan of
``build_plan`` (``plan.actions[i].step == i``) and the graph it was built from.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from ..models.rollbackrequest import Plan
from .graph import MAX_BLOCKED_BY, DependentIndex, Graph
from .plan import BLOCKING_KINDS, COMPENSATE

PENDING = "pending"
RUNNING = "running"
COMPENSATED = "compensated"
FAILED = "failed"
AWAITING_APPROVAL = "awaitingApproval"
DEFERRED = "deferred"
CANCELLED = "cancelled"  # not started: the request was cancelled (rule 13)
ALREADY_RECOVERED = "alreadyRecovered"
CONFLICT = "conflict"
HANDLER_UNAVAILABLE = "handlerUnavailable"
DEADLINE_PASSED = "compensationDeadlinePassed"
STATES = frozenset({PENDING, RUNNING, COMPENSATED, FAILED, AWAITING_APPROVAL, DEFERRED, CANCELLED, ALREADY_RECOVERED,
                    CONFLICT, HANDLER_UNAVAILABLE, DEADLINE_PASSED})
#: states in which a step stands no more (undone, or found undone)
SETTLED = frozenset({COMPENSATED, ALREADY_RECOVERED})
INVERSE = "inverse"

Progress = Mapping[int, str]


def initial_progress(
    plan: Plan,
    *,
    approved: Iterable[int] = (),
    approve_all: bool = False,
    compensated: Iterable[int] = (),
) -> dict[int, str]:
    """Progress at the start of a rollback: every compensate action ``pending``, or
    ``awaitingApproval`` when it needs approval (rule 8) and is neither in ``approved`` (per-step
    approvals) nor covered by ``approve_all`` (``spec.approveCompensations``); steps in
    ``compensated`` start ``compensated``."""
    approved_set = set(approved)
    done = set(compensated)
    progress: dict[int, str] = {}
    for action in plan.actions:
        if action.kind != COMPENSATE:
            continue
        if action.step in done:
            progress[action.step] = COMPENSATED
        elif action.needs_approval and not (approve_all or action.step in approved_set):
            progress[action.step] = AWAITING_APPROVAL
        else:
            progress[action.step] = PENDING
    return progress


def _unsettled(kind: str, state: str | None) -> bool:
    if kind == COMPENSATE:
        return state not in SETTLED
    return kind in BLOCKING_KINDS


def allowed_steps(plan: Plan, graph: Graph, progress: Progress, *, floor: int = 0) -> tuple[list[int], list[int]]:
    """Pending compensate steps that no unsettled dependent blocks, newest first, split by phase:
    ``(inverse-kind, compensation-kind)``. Steps below ``floor`` are held back (nested runs: they
    wait until the child runs opened above them are undone, :mod:`reversi.engine.nested_runs`). O(n).
    Raises ``ValueError`` for an unknown state."""
    _check_full(plan)
    _check_states(progress)
    inverse: list[int] = []
    amends: list[int] = []
    index = DependentIndex(graph)
    actions = plan.actions
    for s in range(len(actions) - 1, -1, -1):
        kind = actions[s].kind
        state = progress.get(s, PENDING) if kind == COMPENSATE else None
        if kind == COMPENSATE and state == PENDING and s >= floor and not index.blocked(s):
            (inverse if actions[s].compensation_kind == INVERSE else amends).append(s)
        if _unsettled(kind, state):
            index.register(s)
    return inverse, amends


def ready_steps(plan: Plan, graph: Graph, progress: Progress, parallelism: int, *,
                compensations_open: bool = True, floor: int = 0,
                holding: Collection[int] | None = None) -> list[int]:
    """Steps that may start now, newest first, at most ``parallelism`` minus the steps holding a
    slot: ``holding`` (the steps whose compensation is under way; the executor's
    :data:`~reversi.engine.executor.SLOT_STAGES`), by default every ``running`` step.

    A pending compensate step is allowed when no step depending on it is unsettled. Allowed
    inverse-kind steps are ready first; compensation-kind steps are ready only when no inverse-kind
    step is allowed or running (a running one may be holding no slot: its read-back runs), and
    ``compensations_open`` (``spec.compensationDeadlineSeconds`` not passed). Steps below ``floor``
    never start (nested runs). O(n). Raises ``ValueError`` for ``parallelism < 1`` or an unknown
    state.
    """
    if parallelism < 1:
        raise ValueError(f"parallelism must be at least 1, not {parallelism}")
    inverse, amends = allowed_steps(plan, graph, progress, floor=floor)
    running = [s for s, state in progress.items() if state == RUNNING]
    slots = parallelism - (len(running) if holding is None else len(holding))
    if slots <= 0:
        return []
    if inverse:
        return inverse[:slots]
    if not compensations_open or any(plan.actions[s].compensation_kind == INVERSE for s in running):
        return []
    return amends[:slots]


def closed_steps(plan: Plan, graph: Graph, progress: Progress) -> list[int]:
    """Compensation-kind steps that could start but for the closed compensation phase
    (``spec.compensationDeadlineSeconds`` passed), ascending: once the rollback is finished they
    are ``compensationDeadlinePassed`` (not attempted)."""
    return sorted(allowed_steps(plan, graph, progress)[1])


def deferred_steps(plan: Plan, graph: Graph, progress: Progress, limit: int = MAX_BLOCKED_BY) -> dict[int, list[int]]:
    """Pending (or deferred) compensate steps that an unsettled dependent blocks: ``{step: blockedBy}``.

    ``blockedBy`` lists the unsettled direct dependents (ascending, at most ``limit``). Once
    :func:`is_finished` is true these are final: the report lists them as deferred (rule 1: a
    dependent whose compensation failed, or that awaits approval, keeps them standing).
    """
    _check_full(plan)
    _check_states(progress)
    out: dict[int, list[int]] = {}
    index = DependentIndex(graph)
    actions = plan.actions
    for s in range(len(actions) - 1, -1, -1):
        kind = actions[s].kind
        state = progress.get(s, PENDING) if kind == COMPENSATE else None
        if kind == COMPENSATE and state in (PENDING, DEFERRED) and index.blocked(s):
            out[s] = index.blockers(s, limit)
        if _unsettled(kind, state):
            index.register(s)
    return dict(sorted(out.items()))


def is_finished(plan: Plan, graph: Graph, progress: Progress, *, compensations_open: bool = True,
                floor: int = 0) -> bool:
    """True when nothing is running and nothing more can start (the rollback can be reported);
    with ``floor``: nothing at or above it can start (the segment above a child run is done)."""
    if any(state == RUNNING for state in progress.values()):
        return False
    return not ready_steps(plan, graph, progress, parallelism=1, compensations_open=compensations_open, floor=floor)


def progress_text(plan: Plan, progress: Progress) -> str:
    """``"<settled>/<compensate + defer + expired + handlerUnavailable actions>"``, e.g. ``"3/7"``
    (status.progress); settled: compensated or alreadyRecovered."""
    total = sum(1 for a in plan.actions if a.kind in (COMPENSATE, "defer", "expired", "handlerUnavailable"))
    done = sum(1 for a in plan.actions if a.kind == COMPENSATE and progress.get(a.step) in SETTLED)
    return f"{done}/{total}"


def _check_full(plan: Plan) -> None:
    if plan.omitted:
        raise ValueError("the schedule needs the full plan from build_plan, not a compact_plan")


def _check_states(progress: Progress) -> None:
    for step, state in progress.items():
        if state not in STATES:
            raise ValueError(f"step {step}: unknown progress state {state!r}; use one of {sorted(STATES)}")
