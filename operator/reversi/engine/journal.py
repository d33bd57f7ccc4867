"""The run's journal as the engine sees it, assembled from its RunSteps (docs/concepts.md#the-journal): pure.

A Run's steps live in RunStep objects (one per step); a Run recorded by Reversi 0.1 may still
carry an inline journal (``spec.steps``) until the operator has moved it. :func:`assemble`
merges both into one :class:`Journal`: a :class:`~reversi.models.run.RunSpec` whose ``steps``
and ``resolutions`` are the whole run in index order (what :func:`~reversi.engine.plan.build_plan`
and :func:`~reversi.engine.graph.build_graph` take), and the undo state of every step.

Indices must be 0..n-1 with no gap. Admission makes a step wait for its predecessor, so a gap
seen by a reader means the reader's view is behind (a watch not yet caught up) or a step was
deleted: :attr:`Journal.missing` names the first missing indices and the caller decides
(a reconciler waits a moment and then fails the request with that message).
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

    @property
    def size(self) -> int:
        """Number of steps (the highest index + 1 when there is no gap)."""
        return len(self.spec.steps)

    def upto(self, count: int) -> Journal:
        """The journal as it stood with ``count`` steps: steps ``0..count-1`` with their
        resolutions and undo state (rule 11, a rollback closes the run: a request plans the Run as it
        stood when it took the lock, never a step that arrived later). ``missing`` also names the
        indices below ``count`` not (yet) read."""
        steps = [s for s in self.spec.steps if s.index < count]
        spec = self.spec.model_copy(update={"steps": steps,
                                            "resolutions": [r for r in self.spec.resolutions if r.step < count]})
        have = {s.index for s in steps}
        missing = [] if len(have) == count else [i for i in range(count) if i not in have][:MISSING_NAMED]
        return Journal(spec=spec, undo={i: u for i, u in self.undo.items() if i < count}, missing=missing)

    def gap_message(self, run: str) -> str:
        """What to say about :attr:`missing`: ``Run ns/x: step 4 is missing ...``."""
        named = ", ".join(str(i) for i in self.missing)
        return (f"Run {run}: step(s) {named} are missing while later steps exist (a RunStep was deleted?); "
                "a run's steps are 0, 1, 2, ... with no gap")


def assemble(run_spec: RunSpec, entries: Iterable[Entry], legacy_undo: Iterable[StepUndo] = ()) -> Journal:
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
    for entry in entries:
        index = entry.spec.index
        steps[index] = entry.spec.as_step()
        if entry.spec.resolution is not None:
            resolutions[index] = entry.spec.resolution.for_step(index)
        if entry.undo is not None:
            undo[index] = entry.undo
    ordered = [steps[i] for i in sorted(steps)]
    missing: list[int] = []
    if ordered and ordered[-1].index != len(ordered) - 1:
        have = set(steps)
        for i in range(ordered[-1].index):
            if i not in have:
                missing.append(i)
                if len(missing) == MISSING_NAMED:
                    break
    spec = RunSpec.model_construct(
        principal=run_spec.principal, mode=run_spec.mode, recovery=run_spec.recovery, scope=run_spec.scope,
        manifest_ref=run_spec.manifest_ref,
        steps=ordered, snapshots=[], resolutions=[resolutions[i] for i in sorted(resolutions)])
    return Journal(spec=spec, undo=undo, missing=missing)
