"""The run's journal as the engine sees it, assembled from its RunSteps (docs/concepts.md#the-journal): pure.

A Run's steps live in RunStep objects (one per step); a Run recorded by Reversi 0.1 may still
carry an inline journal (``spec.steps``) until the operator has moved it. :func:`assemble`
merges both into one :class:`Journal`: a :class:`~reversi.models.run.RunSpec` whose ``steps``
and ``resolutions`` are the whole run in index order (what :func:`~reversi.engine.plan.build_plan`
and :func:`~reversi.engine.graph.build_graph` take), and the undo state of every step.

A step's name keeps its index unique, and the recorder takes the first free one; a gap means a
call was never recorded there (or the reader's view is behind: a watch not yet caught up).
:attr:`Journal.missing` names the missing indices and the caller decides (a reconciler waits a
moment for its watch, then plans the steps there are and names the missing indices in the report).

A step recorded with ``spec.runAtOpen`` (its recorder's copy of the Run) is checked against the Run
(:func:`foreign_rule`): a step of another principal, of another Run of the same name, or whose copy
of the Run's mode, recovery or scope disagrees with the Run is **foreign**: left out of the
journal (never undone) and named in :attr:`Journal.foreign` with the rule it broke. Such a step
that carries no snapshot of its own is undone by its Run's pinned manifest entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..models.run import Resolution, RunSpec, Step, StepUndo
from ..models.runstep import RunStepSpec

MISSING_NAMED = 5  # missing indices named in a message


@dataclass(frozen=True)
class Entry:
    """One RunStep as read: its spec and its ``status.undo`` (``None`` when untouched)."""

    spec: RunStepSpec
    undo: StepUndo | None = None


@dataclass
class Journal:
    """A run's journal: ``spec`` (the Run's spec with ``steps`` and ``resolutions`` filled in, in
    index order, inline snapshots resolved), ``undo`` (undo state per step index), and
    ``missing`` (up to :data:`MISSING_NAMED` indices below the highest one that no step has)."""

    spec: RunSpec
    undo: dict[int, StepUndo] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)
    #: steps left out because they are not of this run's record: index -> the rule they broke
    foreign: dict[int, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """The highest index any step has, plus one (foreign steps and gaps included): the count of
        names a run's steps take, as :func:`reversi.adapters.journal.count_steps` counts them."""
        last = max([s.index for s in self.spec.steps] + list(self.foreign), default=-1)
        return max(last + 1, len(self.spec.steps) + len(self.missing))

    def upto(self, count: int) -> Journal:
        """The journal as it stood with ``count`` steps: steps ``0..count-1`` with their
        resolutions and undo state (rule 11, a rollback closes the run: a request plans the Run as it
        stood when it took the lock, never a step that arrived later). ``missing`` also names the
        indices below ``count`` not (yet) read."""
        steps = [s for s in self.spec.steps if s.index < count]
        spec = self.spec.model_copy(update={"steps": steps,
                                            "resolutions": [r for r in self.spec.resolutions if r.step < count]})
        have = {s.index for s in steps} | set(self.foreign)
        missing = [] if len(have) >= count else [i for i in range(count) if i not in have][:MISSING_NAMED]
        missing = [i for i in missing if i not in self.foreign]
        return Journal(spec=spec, undo={i: u for i, u in self.undo.items() if i < count}, missing=missing,
                       foreign={i: r for i, r in self.foreign.items() if i < count})

    def gap_message(self, run: str) -> str:
        """What to say about :attr:`missing`: ``Run ns/x: step 4 is missing ...``."""
        named = ", ".join(str(i) for i in self.missing)
        return (f"Run {run}: step(s) {named} are missing while later steps exist (a RunStep was deleted?); "
                "a run's steps are 0, 1, 2, ... with no gap")


def foreign_rule(run_spec: RunSpec, run_uid: str | None, step: RunStepSpec) -> str | None:
    """Why a step recorded with ``spec.runAtOpen`` is not part of its Run's record (None: it is):
    another principal than the Run's (rule 10), a copy of another Run of the same name (its
    ``uid``), or a copy of the Run's mode, recovery or scope that disagrees with the Run. A step
    recorded without the copy was checked against the Run by the admission webhook."""
    copy = step.run_at_open
    if copy is None:
        return None
    if run_spec.principal and step.principal != run_spec.principal:
        return (f"recorded by {step.principal or 'no principal'}, not by the Run's principal {run_spec.principal} "
                "(rule 10: only the principal that created a run records its calls)")
    if copy.principal is not None and copy.principal != run_spec.principal:
        return f"its copy of the Run's principal ({copy.principal}) is not the Run's ({run_spec.principal})"
    if run_uid is not None and copy.uid != run_uid:
        return (f"recorded for another Run of the same name (uid {copy.uid}, this Run is {run_uid}): the Run was "
                "deleted and created again after its recorder opened it")
    for name, theirs, ours in (("mode", copy.mode, run_spec.mode), ("recovery", copy.recovery, run_spec.recovery),
                               ("scope", copy.scope.model_dump(), run_spec.scope.model_dump())):
        if theirs != ours:
            return f"its copy of the Run's {name} ({theirs}) is not the Run's ({ours})"
    return None


def assemble(run_spec: RunSpec, entries: Iterable[Entry], legacy_undo: Iterable[StepUndo] = (),
             run_uid: str | None = None) -> Journal:
    """Merge the Run's inline journal (Reversi 0.1) and its RunSteps into one :class:`Journal`.

    ``run_spec``: the Run's spec (its ``steps``, ``snapshots``, ``resolutions`` are the inline
    journal, usually empty); ``entries``: the run's RunSteps in any order; ``legacy_undo``: the
    Run's ``status.undo``. A RunStep wins over an inline step of the same index (it is the moved
    copy). O(n log n) for n steps; never raises.
    """
    steps: dict[int, Step] = {}
    resolutions: dict[int, Resolution] = {}
    undo: dict[int, StepUndo] = {}
    if run_spec.steps:
        for step in run_spec.steps:
            snapshot = run_spec.snapshot_of(step)
            steps[step.index] = step if step.snapshot_id is None else step.model_copy(
                update={"snapshot": snapshot, "snapshot_id": None})
        for res in run_spec.resolutions:
            resolutions[res.step] = res
        for legacy in legacy_undo:
            undo[legacy.step] = legacy
    foreign: dict[int, str] = {}
    pinned = run_spec.pinned_manifest
    for entry in entries:
        index = entry.spec.index
        rule = foreign_rule(run_spec, run_uid, entry.spec)
        if rule is not None:
            foreign[index] = rule
            steps.pop(index, None)
            continue
        step = entry.spec.as_step()
        if step.snapshot is None and entry.spec.run_at_open is not None and pinned is not None:
            step = step.model_copy(update={"snapshot": pinned.tool(step.tool)})  # the entry pinned at open
        steps[index] = step
        if entry.spec.resolution is not None:
            resolutions[index] = entry.spec.resolution.for_step(index)
        if entry.undo is not None:
            undo[index] = entry.undo
    ordered = [steps[i] for i in sorted(steps)]
    missing: list[int] = []
    if ordered and ordered[-1].index != len(ordered) - 1 + sum(1 for i in foreign if i < ordered[-1].index):
        have = set(steps) | set(foreign)
        for i in range(ordered[-1].index):
            if i not in have:
                missing.append(i)
                if len(missing) == MISSING_NAMED:
                    break
    spec = RunSpec.model_construct(
        principal=run_spec.principal, mode=run_spec.mode, recovery=run_spec.recovery, scope=run_spec.scope,
        manifest_ref=run_spec.manifest_ref, pinned_manifest=pinned,
        steps=ordered, snapshots=[], resolutions=[resolutions[i] for i in sorted(resolutions) if i not in foreign])
    return Journal(spec=spec, undo=undo, missing=missing, foreign=foreign)
