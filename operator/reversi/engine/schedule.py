"""Which compensations may start now (DESIGN §4 rules 1, 8; ``parallelism``).

Progress is a mapping ``{step: state}`` for the plan's compensate actions (a missing entry is
``pending``):

- ``pending``: not started; ``running``: its compensator (or reader) Job runs, or it waits for the
  backoff between attempts; ``compensated``: undone (checked or not); ``failed``: retries used up,
  or verification failed (final); ``awaitingApproval``: needs approval it does not have (rule 8);
  ``deferred``: finally blocked (set by the caller from :func:`deferred_steps` at the end);
  ``cancelled``: never started because the request was cancelled (final).

A step is *unsettled* while it stands and is not compensated: a compensate action in any state but
``compensated``, and every standing step the plan will not undo (unrecoverable, unresolved,
unmanifested, defer). A step never starts while any step that depends on it is unsettled.
Newest first; at most ``parallelism`` running at once. Every function takes the full plan of
``build_plan`` (``plan.actions[i].step == i``) and the graph it was built from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..models.rollbackrequest import Plan
from .graph import MAX_BLOCKED_BY, DependentIndex, Graph
from .plan import BLOCKING_KINDS, COMPENSATE

PENDING = "pending"
RUNNING = "running"
COMPENSATED = "compensated"
FAILED = "failed"
AWAITING_APPROVAL = "awaitingApproval"
DEFERRED = "deferred"
CANCELLED = "cancelled"  # not started: the request was cancelled (issue 9 point 6)
STATES = frozenset({PENDING, RUNNING, COMPENSATED, FAILED, AWAITING_APPROVAL, DEFERRED, CANCELLED})

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
        return state != COMPENSATED
    return kind in BLOCKING_KINDS


def ready_steps(plan: Plan, graph: Graph, progress: Progress, parallelism: int) -> list[int]:
    """Steps that may start now, newest first, at most ``parallelism`` minus those ``running``.

    A pending compensate step is ready when no step depending on it is unsettled. O(n).
    Raises ``ValueError`` for ``parallelism < 1`` or an unknown state.
    """
    if parallelism < 1:
        raise ValueError(f"parallelism must be at least 1, not {parallelism}")
    _check_full(plan)
    _check_states(progress)
    running = sum(1 for state in progress.values() if state == RUNNING)
    slots = parallelism - running
    if slots <= 0:
        return []
    ready: list[int] = []
    index = DependentIndex(graph)
    actions = plan.actions
    for s in range(len(actions) - 1, -1, -1):
        kind = actions[s].kind
        state = progress.get(s, PENDING) if kind == COMPENSATE else None
        if kind == COMPENSATE and state == PENDING and not index.blocked(s):
            ready.append(s)
            if len(ready) == slots:
                break
        if _unsettled(kind, state):
            index.register(s)
    return ready


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


def is_finished(plan: Plan, graph: Graph, progress: Progress) -> bool:
    """True when nothing is running and nothing more can start (the rollback can be reported)."""
    if any(state == RUNNING for state in progress.values()):
        return False
    return not ready_steps(plan, graph, progress, parallelism=1)


def progress_text(plan: Plan, progress: Progress) -> str:
    """``"<compensated>/<compensate + defer actions>"``, e.g. ``"3/7"`` (status.progress)."""
    total = sum(1 for a in plan.actions if a.kind in (COMPENSATE, "defer"))
    done = sum(1 for a in plan.actions if a.kind == COMPENSATE and progress.get(a.step) == COMPENSATED)
    return f"{done}/{total}"


def _check_full(plan: Plan) -> None:
    if plan.omitted:
        raise ValueError("the schedule needs the full plan from build_plan, not a compact_plan")


def _check_states(progress: Progress) -> None:
    for step, state in progress.items():
        if state not in STATES:
            raise ValueError(f"step {step}: unknown progress state {state!r}; use one of {sorted(STATES)}")
