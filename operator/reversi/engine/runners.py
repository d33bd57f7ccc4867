"""The runners a RollbackRequest uses, recorded when it takes the Run's lock
(docs/concepts.md#runners-are-recorded-at-the-lock).

A non-dry request copies, once, the runners its plan needs from the ToolManifest into its
``status.runners``; from then on every Job it starts (compensator, reader, ``verifyCommand``
check) is built from that record, also after an operator restart, and a ToolManifest edited in
the middle of the rollback only affects the next request. Pure: no I/O.

What is recorded (:func:`runners_needed`, :func:`record`):

- the runner of every compensate action (it also runs the ``verifyCommand`` check);
- the reader runner of every compensate action whose read-back can run (:func:`verify_plan`),
  and of every step an earlier request left compensated but unverified whose read-back can run
  now (re-verify, rule 5);
- per runner, ``readBackTools``: the read-back tools it reads for only because the ToolManifest
  gave it to them at the lock (the step's own reader runner was not defined then), so the same
  choice is made from the record (:func:`from_record`).

Each runner is copied as the ToolManifest gives it: literal ``env`` values as they are,
``valueFrom`` and ``envFrom`` as references (nothing is resolved). A manifest has at most
``MAX_RUNNERS`` (32) runners, so the record holds at most that many; its JSON must also stay
under :data:`RECORD_LIMIT_BYTES` (:func:`record_size`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..models.rollbackrequest import Plan, RecordedRunner
from ..models.run import RunSpec, StepUndo
from ..models.toolmanifest import Runner
from .executor import verify_plan
from .plan import COMPENSATE, DEFER

#: largest JSON of ``status.runners`` (bytes): the request object must stay far below etcd's
#: 1.5 MiB while it also carries the plan, the steps and the report
RECORD_LIMIT_BYTES = 256 * 1024


@dataclass(frozen=True)
class Needs:
    """Runner names a request needs, and ``{read-back tool: runner}`` for reads whose runner is the
    one the ToolManifest's other entries give that tool (not the step's own ``verification.runner``)."""

    names: frozenset[str]
    read_back: Mapping[str, str] = field(default_factory=dict)


def runners_needed(plan: Plan, run_spec: RunSpec, prior: Iterable[StepUndo],
                   runner_names: Iterable[str], readers: Mapping[str, str]) -> Needs:
    """The runners the request's plan needs, decided against the ToolManifest as it is now.

    ``plan``: the request's plan (compensate and defer actions: a deferred step is undone once
    its blockers settle); ``run_spec``: the Run's steps (snapshots, resolutions); ``prior``: undo
    states written by *other* requests (steps compensated but unverified are re-verified when a
    reader can run now); a compensation's precondition read needs its runner (the
    precondition's, else the compensation's); ``runner_names``/``readers``: what the
    ToolManifest defines now (see :func:`reversi.engine.executor.verify_plan`). Never raises; an
    action whose runner is not defined still names it (:func:`record` leaves it out, and the
    plan built from the record makes that step ``handlerUnavailable``).
    """
    names_now = frozenset(runner_names)
    steps = {s.index: s for s in run_spec.steps}
    resolutions = {r.step: r for r in run_spec.resolutions}
    names: set[str] = set()
    read_back: dict[str, str] = {}

    def reader(index: int) -> None:
        step = steps.get(index)
        if step is None:
            return
        snapshot = run_spec.snapshot_of(step)
        res = resolutions.get(index)
        result = res.result if res is not None and res.result is not None else step.result
        vp = verify_plan(snapshot, step.args, result, names_now, readers)
        if vp.mode != "reader" or vp.runner is None:
            return
        names.add(vp.runner)
        declared = snapshot.verification.runner if snapshot is not None and snapshot.verification else None
        if vp.tool and vp.runner != declared:
            read_back[vp.tool] = vp.runner

    for action in plan.actions:
        if action.kind not in (COMPENSATE, DEFER):  # a deferred step is undone once its blockers settle
            continue
        if action.runner:
            names.add(action.runner)
        reader(action.step)  # the read-back, and the precheck read (the same reader)
        step = steps.get(action.step)
        snapshot = run_spec.snapshot_of(step) if step is not None else None
        comp = snapshot.compensation if snapshot is not None else None
        if comp is not None and comp.precondition is not None:  # the precondition read (rule 16)
            names.add(comp.precondition.runner or comp.runner)
    for u in prior:
        if u.state == "compensated" and u.verification == "unverified" and u.verified_by is None:
            reader(u.step)
    return Needs(frozenset(names), read_back)


def record(runners: Mapping[str, Runner], needs: Needs) -> list[dict]:
    """``status.runners``: each needed runner that ``runners`` (the ToolManifest's, by name)
    defines, as the ToolManifest gives it plus its ``readBackTools``, sorted by name (wire form,
    camelCase). Runners ``needs`` names but ``runners`` lacks are left out: the steps that need
    them are ``handlerUnavailable`` (rule 16), the rest of the request proceeds."""
    out = []
    for name in sorted(needs.names):
        runner = runners.get(name)
        if runner is None:
            continue
        tools = sorted(t for t, r in needs.read_back.items() if r == name)
        out.append(RecordedRunner.model_validate({**runner.model_dump(), "read_back_tools": tools}).to_wire())
    return out


def record_size(entries: list[dict]) -> int:
    """Bytes of JSON the record takes in the request's status."""
    return len(json.dumps(entries, separators=(",", ":")).encode())


def from_record(entries: list[dict] | None) -> tuple[dict[str, Runner], dict[str, str]] | None:
    """The recorded runners (``{name: runner}``) and ``{read-back tool: runner}`` to plan and
    build Jobs with, or ``None`` when nothing is recorded yet (before the lock, or a dry run).
    Raises ``pydantic.ValidationError`` when an entry is not a runner."""
    if entries is None:
        return None
    runners: dict[str, Runner] = {}
    readers: dict[str, str] = {}
    for entry in entries:
        recorded = RecordedRunner.model_validate(entry)
        runners[recorded.name] = recorded
        for tool in recorded.read_back_tools:
            readers[tool] = recorded.name
    return runners, readers
