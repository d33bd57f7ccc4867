"""The plan (rules 1, 2, 6, 7 of docs/concepts.md#rollback-rules): one action per step, and ``fullyReversible``.

Kinds, decided per step in this order:

1. resolutions apply first (rule 7): a resolved step is planned as if it had the resolution's
   outcome and result (the resolution's result, else the recorded one);
2. outcome ``failed`` (not standing): **skip**;
3. no snapshot (inline ``snapshot`` or ``snapshotId`` into ``spec.snapshots``): **unmanifested** (recorded in
   observe mode; Reversi cannot undo it);
4. effect ``read`` / ``idempotent``: **skip**;
5. effect ``irreversible``: **unrecoverable**, the reason states the residue;
6. already ``compensated`` in the run's undo state: **skip** (rule 6);
7. outcome ``intended`` / ``uncertain`` (unresolved): **unresolved** (Reversi will not guess);
8. ``write``: **compensate** with resolved args, or **unrecoverable** when an argument template
   names a missing value (or the snapshot has no compensation); a compensate step whose
   ``compensation.windowSeconds`` after its ``recordedAt`` had passed at ``now`` is **expired**, and
   one whose compensator (or precondition reader) runner is not among ``handlers`` is
   **handlerUnavailable** (neither is attempted; the rest of the rollback proceeds);
9. then, newest first: a compensate step with a standing dependent that will not be undone in this
   rollback (unrecoverable, unresolved, unmanifested or defer: transitively) becomes **defer**
   with ``blockedBy``. A dependent that will be compensated is an ordering constraint for the
   schedule, not a blocker.

``fullyReversible``: every standing step is compensate or skip (residue does not matter).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC
from typing import Any, Final

from ..models.rollbackrequest import Plan, PlanAction
from ..models.run import RunSpec, RunStatus, Step, StepUndo
from ..models.toolmanifest import ToolSpec
from .gcpause import no_cyclic_gc
from .graph import MAX_BLOCKED_BY, DependentIndex, Graph, build_graph
from .keys import compensation_key
from .templates import MissingValue, resolve

COMPENSATE: Final = "compensate"
SKIP: Final = "skip"
UNRECOVERABLE: Final = "unrecoverable"
UNRESOLVED: Final = "unresolved"
UNMANIFESTED: Final = "unmanifested"
DEFER: Final = "defer"
EXPIRED: Final = "expired"
HANDLER_UNAVAILABLE: Final = "handlerUnavailable"
KINDS = (COMPENSATE, SKIP, UNRECOVERABLE, UNRESOLVED, UNMANIFESTED, DEFER, EXPIRED, HANDLER_UNAVAILABLE)
# standing steps of these kinds stay as they are: their dependencies cannot be undone
BLOCKING_KINDS = frozenset({UNRECOVERABLE, UNRESOLVED, UNMANIFESTED, DEFER, EXPIRED, HANDLER_UNAVAILABLE})
REASON_BLOCKERS = 3  # blockers named in a defer reason (all, up to MAX_BLOCKED_BY, are in blockedBy)

UndoStateInput = RunStatus | Mapping[int, StepUndo] | Iterable[StepUndo] | None


def undo_by_step(undo_state: UndoStateInput) -> dict[int, StepUndo]:
    """Normalise the run's undo state (``RunStatus``, a mapping or a list of ``StepUndo``) to a dict."""
    if undo_state is None:
        return {}
    if isinstance(undo_state, RunStatus):
        return undo_state.undo_by_step()
    if isinstance(undo_state, Mapping):
        return dict(undo_state)
    return {entry.step: entry for entry in undo_state}


def effective_outcome(step: Step, resolution: Any | None) -> tuple[str, dict[str, Any] | None]:
    """The outcome and result a step is planned with (rule 7): the resolution's when resolved."""
    if resolution is None:
        return step.outcome, step.result
    result = resolution.result if resolution.result is not None else step.result
    return resolution.status, result


def build_plan(
    run_spec: RunSpec,
    undo_state: UndoStateInput = None,
    *,
    run_id: str,
    graph: Graph | None = None,
    runner_names: Iterable[str] | None = None,
    readers: Mapping[str, str] | None = None,
    handlers: Iterable[str] | None = None,
    now: float | None = None,
) -> Plan:
    """Plan the rollback of a run (rule 2).

    ``run_spec``: the Run's spec; ``undo_state``: its ``status.undo`` (or ``RunStatus``, or a
    ``{step: StepUndo}`` mapping); ``run_id``: the Run's ``metadata.uid`` (compensation keys are
    derived from it); ``graph``: a prebuilt :func:`build_graph` of the same spec (optional);
    ``runner_names``: the runners the ToolManifest defines now, when known: a compensate action
    is ``verified`` only when its reader runner is among them (``None``: only that one is named),
    or when ``readers`` (``{read-back tool: runner}`` that the ToolManifest gives now, each among
    ``runner_names``) has a runner for its read-back tool.

    Returns a :class:`~reversi.models.Plan` with one action per step, in step order
    (``plan.actions[i].step == i``). Raises :class:`~reversi.engine.graph.InvalidRun` for broken
    indices, dependencies or resolutions. O(n + edges) for n steps.
    """
    with no_cyclic_gc():  # tens of thousands of new acyclic objects at 10,000 steps (see gcpause)
        return _build_plan(run_spec, undo_state, run_id, graph, runner_names, readers, handlers, now)


def _build_plan(run_spec: RunSpec, undo_state: UndoStateInput, run_id: str, graph: Graph | None,
                runner_names: Iterable[str] | None, readers: Mapping[str, str] | None,
                handlers: Iterable[str] | None, now: float | None) -> Plan:
    graph = graph if graph is not None else build_graph(run_spec)
    undo = undo_by_step(undo_state)
    resolutions = {res.step: res for res in run_spec.resolutions}
    runners = frozenset(runner_names) if runner_names is not None else None
    can_run = frozenset(handlers) if handlers is not None else None
    actions: list[PlanAction] = [
        _availability(
            _base_action(step, graph.snapshots[step.index], resolutions.get(step.index), undo.get(step.index), run_id,
                         runners, readers or {}),
            step, graph.snapshots[step.index], can_run, now)
        for step in run_spec.steps
    ]
    # newest first: a compensate step with a blocking dependent is deferred (rule 1)
    index = DependentIndex(graph)
    for s in range(len(actions) - 1, -1, -1):
        action = actions[s]
        if action.kind == COMPENSATE and index.blocked(s):
            blockers = index.blockers(s, MAX_BLOCKED_BY)
            described = ", ".join(f"{b} ({actions[b].kind})" for b in blockers[:REASON_BLOCKERS])
            if len(blockers) > REASON_BLOCKERS:
                described += " and more (see blockedBy)"
            action.kind = DEFER
            action.blocked_by = blockers
            action.reason = f"blocked by standing dependents that will not be undone: {described}"
        if action.kind in BLOCKING_KINDS:
            index.register(s)
    fully = all(action.kind in (COMPENSATE, SKIP) for action in actions)
    return Plan.model_construct(fully_reversible=fully, actions=actions, omitted=0)


def _availability(action: PlanAction, step: Step, snapshot: ToolSpec | None, handlers: frozenset[str] | None,
                  now: float | None) -> PlanAction:
    """A compensate action whose undo window has passed becomes ``expired``; one whose runner
    cannot run now becomes ``handlerUnavailable`` (rule 2: only that step, the rest proceed)."""
    if action.kind != COMPENSATE or snapshot is None or snapshot.compensation is None:
        return action
    comp = snapshot.compensation
    if comp.window_seconds is not None and now is not None and step.recorded_at is not None:
        recorded = step.recorded_at if step.recorded_at.tzinfo else step.recorded_at.replace(tzinfo=UTC)
        until = recorded.timestamp() + comp.window_seconds
        if now > until:
            action.kind = EXPIRED
            action.reason = (f"expired: {comp.tool} can undo a call only within {comp.window_seconds}s of "
                             f"recordedAt ({step.recorded_at.isoformat()}); the window passed {now - until:.0f}s "
                             "before this rollback: not attempted, undo it by hand if it must be")
            return action
    if handlers is not None:
        wanted = [comp.runner] + ([comp.precondition.runner] if comp.precondition and comp.precondition.runner else [])
        missing = sorted({r for r in wanted if r not in handlers})
        if missing:
            action.kind = HANDLER_UNAVAILABLE
            action.reason = (f"handler unavailable: runner {', '.join(missing)} of {comp.tool} is not in the "
                             "ToolManifest's spec.runners: not attempted; add the runner back, then roll back again")
    return action


#: every field of an action at its default: _action copies it (model_copy validates nothing and
#: takes half the time of model_construct: it matters at 10,000 actions per plan)
_BLANK = PlanAction.model_construct(step=0, tool="", kind=SKIP, reason="", compensation_tool=None,
                                    compensation_kind=None, runner=None, args=None, idempotency_key=None,
                                    needs_approval=False, residue=[], verified=False, blocked_by=[])
#: the fields every action sets (all of them), as one set shared by every action of every plan
#: (pydantic's ``__pydantic_fields_set__``): a set per action is over a third of a plan's memory
_ALL_FIELDS = set(PlanAction.model_fields)


def _action(step: Step, kind: str, reason: str, **fields: Any) -> PlanAction:
    fields["step"] = step.index
    fields["tool"] = step.tool
    fields["kind"] = kind
    fields["reason"] = reason
    fields.setdefault("residue", [])  # each action its own lists (the copy is shallow)
    fields["blocked_by"] = []
    action = _BLANK.model_copy(update=fields)
    object.__setattr__(action, "__pydantic_fields_set__", _ALL_FIELDS)
    return action


def _base_action(
    step: Step, snapshot: ToolSpec | None, resolution: Any | None, undo: StepUndo | None, run_id: str,
    runners: frozenset[str] | None = None,
    readers: Mapping[str, str] | None = None,
) -> PlanAction:
    outcome, result = effective_outcome(step, resolution)
    settled = ""
    if resolution is not None:
        who = f" by {resolution.actor}" if resolution.actor else ""
        settled = f" (resolved as {resolution.status}{who}: {resolution.note})"
        if step.outcome in ("succeeded", "failed") and step.outcome != resolution.status:
            # the agent's late answer contradicts the person's resolution: Reversi will not choose
            return _action(step, UNRESOLVED, f"conflict: the call was recorded {step.outcome} after it was "
                           f"resolved as {resolution.status}{who}; find out what really happened and undo it by hand "
                           "if it stands")
    if outcome == "failed":
        return _action(step, SKIP, f"outcome failed: the call had no effect{settled}")
    if snapshot is None:
        return _action(
            step,
            UNMANIFESTED,
            f"no manifest entry for {step.tool} (recorded in observe mode): Reversi cannot undo it{settled}",
        )
    if snapshot.effect in ("read", "idempotent"):
        return _action(step, SKIP, f"{snapshot.effect}: nothing to undo{settled}")
    if snapshot.effect == "irreversible":
        residue = list(snapshot.residue)
        stated = "; ".join(residue) if residue else "no residue stated in the manifest"
        return _action(step, UNRECOVERABLE, f"irreversible: {stated}", residue=residue)
    if undo is not None and undo.state == "compensated":
        check: str = undo.verification or "unverified"
        by = f" by {undo.request}" if undo.request else ""
        residue = list(snapshot.compensation.residue) if snapshot.compensation else []
        return _action(step, SKIP, f"already compensated{by} ({check})", residue=residue)
    if outcome in ("intended", "uncertain"):
        return _action(
            step,
            UNRESOLVED,
            f"outcome {outcome}: Reversi will not guess; settle it with a resolution "
            "(spec.resolutions: status succeeded or failed, result, note)",
        )
    compensation = snapshot.compensation
    if compensation is None:
        return _action(step, UNRECOVERABLE, f"{step.tool} is a write tool with no compensation in its snapshot")
    try:
        args = resolve(compensation.args, step.args, result)
    except MissingValue as missing:
        return _action(
            step,
            UNRECOVERABLE,
            f"compensation arguments missing: {missing}{settled}",
            compensation_tool=compensation.tool,
            compensation_kind=compensation.kind,
            runner=compensation.runner,
            residue=list(compensation.residue),
        )
    verification = snapshot.verification
    verified = verification is not None and (
        (verification.runner is not None and (runners is None or verification.runner in runners))
        or verification.tool in (readers or {}))
    return _action(
        step,
        COMPENSATE,
        f"undo with {compensation.tool} ({compensation.kind}); {_check_text(verification, verified)}"
        f"{_retry_text(undo)}{settled}",
        compensation_tool=compensation.tool,
        compensation_kind=compensation.kind,
        runner=compensation.runner,
        args=args,
        idempotency_key=compensation_key(run_id, step.index, compensation.tool),
        needs_approval=compensation.requires_approval,
        residue=list(compensation.residue),
        verified=verified,
    )


def _check_text(verification: Any, verified: bool) -> str:
    """How a planned undo will be checked: by its reader, not at all (none declared), or not
    (no reader runner: it will be unverified)."""
    if verification is None:
        return "no read-back declared: the undo will not be checked (verification none)"
    if verified:
        return f"checked with {verification.tool}"
    if verification.runner is None:
        return "no reader runner configured: the undo will be unverified"
    return f"reader runner {verification.runner!r} is not defined in the ToolManifest: the undo will be unverified"


def _retry_text(undo: StepUndo | None) -> str:
    """What an earlier request left: failed attempts retried with the same key, or a Job adopted."""
    if undo is not None and undo.state == "compensationFailed":
        return f"; retrying after {undo.attempts} failed attempt(s) with the same key"
    if undo is not None and undo.state == "compensating":
        return "; a compensation was already started: its Job is adopted"
    return ""


def compact_plan(plan: Plan, max_actions: int = 1000) -> Plan:
    """A copy of ``plan`` small enough for a status: at most ``max_actions`` actions.

    Skip actions go first (they need nothing), then, if still too many, the oldest actions of
    the rest; ``omitted`` counts what was left out (the report still lists every step).
    ``fullyReversible`` is unchanged. Raises ``ValueError`` for ``max_actions < 0``.
    """
    if max_actions < 0:
        raise ValueError("max_actions must not be negative")
    if len(plan.actions) <= max_actions:
        return plan
    kept = [a for a in plan.actions if a.kind != SKIP]
    if len(kept) > max_actions:
        kept = kept[len(kept) - max_actions :] if max_actions else []
    return Plan.model_construct(
        fully_reversible=plan.fully_reversible,
        actions=kept,
        omitted=len(plan.actions) - len(kept) + plan.omitted,
    )
