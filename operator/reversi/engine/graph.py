"""The dependency graph of a run's steps (rule 1, docs/concepts.md#rollback-rules).

A step ``t`` depends on step ``s`` (``s`` may only be undone after ``t`` is) when ``s < t`` and

- ``s`` is in ``t.dependsOn`` (explicit), or
- ``s``'s tool is in the ``requires`` of ``t``'s snapshot (the manifest entry copied when ``t``
  was recorded): ``t`` depends on *every* earlier step of a required tool.

The ``requires`` edges can be quadratic in number (every capture depends on every earlier
charge), so they are never materialised: steps are indexed by tool and the questions the engine
asks are answered with bisection and incremental scans from the newest step to the oldest.
Building the graph is O(n + explicit edges + sum of requires).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

from ..models.run import RunSpec, Step, ToolSnapshot
from ..models.toolmanifest import ToolSpec

MAX_BLOCKED_BY = 8  # blockers listed per step, lowest first (a step is blocked when at least one exists)


class InvalidRun(ValueError):
    """The run's steps cannot be planned: the message names the step and the fix.

    ``step`` is the index of the offending step (or ``None``).
    """

    def __init__(self, message: str, step: int | None = None) -> None:
        self.step = step
        super().__init__(message)


@dataclass
class Graph:
    """Dependencies of the steps of one run (indices 0..n-1).

    ``tools[i]``: tool of step i; ``snapshots[i]``: its manifest entry (inline or from
    ``spec.snapshots``; ``None``: unmanifested); ``requires[i]``: tools its snapshot requires;
    ``depends_on[i]``: explicit earlier indices; ``steps_by_tool``: tool -> ascending step indices;
    ``requirers_by_tool``: tool T -> ascending indices of steps whose snapshot requires T;
    ``explicit_dependents``: s -> ascending indices of steps naming s in dependsOn.
    """

    tools: list[str]
    requires: list[tuple[str, ...]]
    depends_on: list[tuple[int, ...]]
    snapshots: list[ToolSpec | None] = field(default_factory=list)
    steps_by_tool: dict[str, list[int]] = field(default_factory=dict)
    requirers_by_tool: dict[str, list[int]] = field(default_factory=dict)
    explicit_dependents: dict[int, list[int]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tools)

    def dependencies(self, t: int) -> list[int]:
        """Steps ``t`` depends on (all earlier), ascending. O(deps + log n) per required tool."""
        out = set(self.depends_on[t])
        for tool in self.requires[t]:
            steps = self.steps_by_tool.get(tool, ())
            out.update(steps[: bisect_left(steps, t)])
        return sorted(out)

    def dependents(self, s: int) -> list[int]:
        """Steps that depend on ``s`` (all later), ascending."""
        out = set(self.explicit_dependents.get(s, ()))
        requirers = self.requirers_by_tool.get(self.tools[s], ())
        out.update(requirers[bisect_right(requirers, s) :])
        return sorted(out)

    def depends(self, t: int, s: int) -> bool:
        """Whether step ``t`` depends on step ``s``."""
        return s < t and (s in self.depends_on[t] or self.tools[s] in self.requires[t])


def build_graph(spec: RunSpec) -> Graph:
    """Validate the steps of ``spec`` and index their dependencies.

    Raises :class:`InvalidRun` (naming the step and the fix) when an index is duplicated or out
    of order (indices must be 0, 1, 2, ... in list order), when ``dependsOn`` names the step
    itself or a later step (a cycle), or a step that does not exist (dangling), and when a
    resolution names a step that does not exist or a step is resolved twice, and when a step's
    ``snapshotId`` is not in ``spec.snapshots``.
    """
    steps = spec.steps
    by_id = {entry.id: entry for entry in spec.snapshots}
    snapshots: list[ToolSpec | None] = []
    n = len(steps)
    tools: list[str] = []
    requires: list[tuple[str, ...]] = []
    depends_on: list[tuple[int, ...]] = []
    steps_by_tool: dict[str, list[int]] = {}
    requirers_by_tool: dict[str, list[int]] = {}
    explicit_dependents: dict[int, list[int]] = {}
    seen: set[int] = set()
    for position, step in enumerate(steps):
        index = step.index
        if index != position:
            raise _index_error(position, index, seen)
        seen.add(index)
        unique_deps = _explicit_dependencies(step, n)
        for d in unique_deps:
            explicit_dependents.setdefault(d, []).append(index)
        tools.append(step.tool)
        snap = _snapshot_of(step, by_id)
        snapshots.append(snap)
        req = tuple(snap.requires) if snap is not None else ()
        requires.append(req)
        depends_on.append(unique_deps)
        steps_by_tool.setdefault(step.tool, []).append(index)
        for tool in set(req):
            requirers_by_tool.setdefault(tool, []).append(index)
    _check_resolutions(spec, n)
    return Graph(
        tools=tools,
        requires=requires,
        depends_on=depends_on,
        snapshots=snapshots,
        steps_by_tool=steps_by_tool,
        requirers_by_tool=requirers_by_tool,
        explicit_dependents=explicit_dependents,
    )


def _index_error(position: int, index: int, seen: set[int]) -> InvalidRun:
    """The error for the step at ``position`` whose index is not ``position``: its index is used
    twice (already in ``seen``) or out of order."""
    if index in seen:
        return InvalidRun(
            f"spec.steps[{position}]: index {index} is used twice; indices must be 0, 1, 2, ... in order",
            step=index,
        )
    return InvalidRun(
        f"spec.steps[{position}]: index {index} is out of order; the step at position {position} "
        f"must have index {position} (indices are 0, 1, 2, ... in order)",
        step=index,
    )


def _explicit_dependencies(step: Step, n: int) -> tuple[int, ...]:
    """The step's ``dependsOn``, without repeats, ascending. Raises :class:`InvalidRun` when it
    names the step itself, a step outside ``0..n-1`` (dangling) or a later step (a cycle)."""
    index = step.index
    deps: list[int] = []
    for d in step.depends_on:
        if d == index:
            raise InvalidRun(
                f"step {index} ({step.tool}) depends on itself; remove {d} from its dependsOn", step=index
            )
        if d < 0 or d >= n:
            raise InvalidRun(
                f"step {index} ({step.tool}) depends on step {d}, which does not exist "
                f"(the run has steps 0..{n - 1}); fix its dependsOn",
                step=index,
            )
        if d > index:
            raise InvalidRun(
                f"step {index} ({step.tool}) depends on the later step {d}: that would be a cycle; "
                "dependsOn may only name earlier steps",
                step=index,
            )
        deps.append(d)
    return tuple(sorted(set(deps)))


def _snapshot_of(step: Step, by_id: dict[str, ToolSnapshot]) -> ToolSpec | None:
    """The step's manifest entry: its inline ``snapshot``, else the entry of ``spec.snapshots``
    its ``snapshotId`` names (``by_id``), else None (unmanifested). Raises :class:`InvalidRun`
    when ``snapshotId`` names no entry."""
    snap: ToolSpec | None = step.snapshot
    if snap is None and step.snapshot_id is not None:
        snap = by_id.get(step.snapshot_id)
        if snap is None:
            raise InvalidRun(
                f"step {step.index} ({step.tool}) names snapshot {step.snapshot_id!r}, which is not in "
                "spec.snapshots; add the snapshot or fix snapshotId",
                step=step.index,
            )
    return snap


def _check_resolutions(spec: RunSpec, n: int) -> None:
    """Return nothing when each resolution names one of the ``n`` steps and no step is resolved
    twice; raise :class:`InvalidRun` naming the first that does not."""
    resolved: set[int] = set()
    for res in spec.resolutions:
        if res.step >= n:
            raise InvalidRun(
                f"a resolution names step {res.step}, but the run has steps 0..{n - 1}; fix spec.resolutions",
                step=res.step,
            )
        if res.step in resolved:
            raise InvalidRun(f"step {res.step} has two resolutions; keep one", step=res.step)
        resolved.add(res.step)

class DependentIndex:
    """Which later steps (among those registered) depend on a step, for newest-first scans.

    Usage: visit steps from the newest to the oldest; ask :meth:`blocked` /
    :meth:`blockers` about step ``s`` before registering it; :meth:`register` the steps that
    block their dependencies (e.g. standing steps that will not be undone). Every registered step
    is then later than the step asked about, so "depends on" reduces to "its requires contain
    my tool, or its dependsOn contains my index". Each call is O(1) amortised (O(limit) for
    :meth:`blockers`).
    """

    def __init__(self, graph: Graph) -> None:
        self._graph = graph
        self._by_tool: dict[str, list[int]] = {}  # required tool -> registered steps, newest first
        self._by_step: dict[int, list[int]] = {}  # step -> registered explicit dependents, newest first
        self._last: int | None = None

    def register(self, t: int) -> None:
        """Record that step ``t`` blocks the steps it depends on. Steps must come newest first."""
        if self._last is not None and t >= self._last:
            raise ValueError(f"DependentIndex: register steps newest first ({t} after {self._last})")
        self._last = t
        for tool in self._graph.requires[t]:
            self._by_tool.setdefault(tool, []).append(t)
        for d in self._graph.depends_on[t]:
            self._by_step.setdefault(d, []).append(t)

    def blocked(self, s: int) -> bool:
        """Whether a registered step depends on ``s``."""
        return bool(self._by_step.get(s)) or bool(self._by_tool.get(self._graph.tools[s]))

    def blockers(self, s: int, limit: int = MAX_BLOCKED_BY) -> list[int]:
        """Registered steps depending on ``s``, ascending, at most ``limit`` (the lowest indices)."""
        explicit = self._by_step.get(s, [])
        by_tool = self._by_tool.get(self._graph.tools[s], [])
        # both lists are newest first: their smallest indices are at the end
        found = set(explicit[-limit:]) | set(by_tool[-limit:])
        return sorted(found)[:limit]
