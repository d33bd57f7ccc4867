"""Nested runs (rule 17, docs/concepts.md#nested-runs): the order in which a tree of runs is rolled back, the checks of
a new child's ancestry, and the sections of a tree's report. Pure: no I/O.

A Run may name a parent (``spec.parentRef``, same namespace, immutable). The parent's step count
when the child was created is recorded at admission (``spec.parentRef.step``: the child was
*opened* at that index). Rolling back a parent undoes, newest first:

- the parent's steps from the newest child's opening index on (newest first, by the per-run
  rules: dependencies, phases, parallelism),
- then that child **as a unit** (its own steps newest first inside it, and its own children the
  same way, recursively),
- then the parent's steps from the next child's opening index on, that child, and so on, down to
  the parent's step 0.

Children opened at the same index are undone newest-created first (then by name, descending), so
the order is total. A child opened at index ``k`` is undone after the parent's steps ``>= k``
(recorded after the child was opened) and before the parent's steps ``< k``.

Admission (:func:`ancestry_problem`): the parent exists, is not the run itself, no cycle, at most
:data:`~reversi.models.run.MAX_RUN_DEPTH` runs deep, at most
:data:`~reversi.models.run.MAX_TREE_RUNS` runs below one root.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..models.run import MAX_RUN_DEPTH, MAX_TREE_RUNS

#: a run section's outcomes that are final (the unit is done)
DONE_OUTCOMES = frozenset({"rolledBack", "incomplete", "alreadyRecovered", "cancelled"})


@dataclass(frozen=True)
class Node:
    """A run of a tree: ``name``, its ``parent`` (None for the root), the parent's step count when it
    was opened (``opened``) and its creation time (``created``, an RFC 3339 string: ties on
    ``opened`` are broken newest-created first)."""

    name: str
    parent: str | None = None
    opened: int = 0
    created: str = ""


@dataclass(frozen=True)
class Unit:
    """One unit of a run's rollback: the run's own steps ``lo <= index < hi`` (``child`` None), or
    a child run as a whole (``child`` its name, ``lo == hi`` its opening index)."""

    lo: int
    hi: int
    child: str | None = None


def children_order(children: Iterable[Node]) -> list[Node]:
    """The order in which a run's direct children are undone: latest opening index first, then
    newest created first, then by name descending (a total order)."""
    return sorted(children, key=lambda n: (n.opened, n.created, n.name), reverse=True)


def units(steps: int, children: Iterable[Node]) -> list[Unit]:
    """The units of a run with ``steps`` steps (pinned at the lock) and these direct ``children``,
    in rollback order: step segments (newest first) interleaved with the children as wholes. A
    child's opening index is clamped to ``0..steps``; empty segments are left out.

    >>> units(5, [Node("a", "p", 2), Node("b", "p", 4)])
    [Unit(lo=4, hi=5, child=None), Unit(lo=4, hi=4, child='b'), Unit(lo=2, hi=4, child=None), \
Unit(lo=2, hi=2, child='a'), Unit(lo=0, hi=2, child=None)]
    """
    if steps < 0:
        raise ValueError(f"a run has at least 0 steps, not {steps}")
    out: list[Unit] = []
    hi = steps
    for child in children_order(children):
        at = max(0, min(child.opened, hi))
        if at < hi:
            out.append(Unit(at, hi))
        out.append(Unit(at, at, child.name))
        hi = at
    if hi > 0:
        out.append(Unit(0, hi))
    return out


def floor(children: Iterable[Node], done: Iterable[str]) -> int:
    """The lowest step index of the run that may be undone now: the opening index of the first
    child (in :func:`children_order`) whose unit is not done, else 0. Steps below it wait."""
    finished = set(done)
    for child in children_order(children):
        if child.name not in finished:
            return max(0, child.opened)
    return 0


def next_child(children: Iterable[Node], done: Iterable[str]) -> Node | None:
    """The first child (in :func:`children_order`) whose unit is not done, or None."""
    finished = set(done)
    for child in children_order(children):
        if child.name not in finished:
            return child
    return None


def subtree(nodes: Iterable[Node], root: str) -> dict[str, list[Node]]:
    """``{run: [direct children]}`` of the runs below ``root`` (``root`` included as a key). Nodes
    not reachable from ``root`` are left out; a cycle is never followed twice."""
    by_parent: dict[str, list[Node]] = {}
    for n in nodes:
        if n.parent is not None and n.name != root:
            by_parent.setdefault(n.parent, []).append(n)
    out: dict[str, list[Node]] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out[name] = list(by_parent.get(name, []))
        todo.extend(c.name for c in out[name])
    return out


def descendants(tree: Mapping[str, Sequence[Node]], root: str) -> list[Node]:
    """Every run below ``root`` in ``tree`` (from :func:`subtree`), in rollback order."""
    out: list[Node] = []
    for child in children_order(tree.get(root, ())):
        out.append(child)
        out.extend(descendants(tree, child.name))
    return out


def rollback_order(tree: Mapping[str, Sequence[Node]], steps: Mapping[str, int], root: str) -> list[tuple[str, int]]:
    """The whole tree's steps in rollback order, ``[(run, step), ...]``, assuming each run's steps
    are undone newest first (no dependencies held back): the rule of this module, flattened. Used
    to document and test the order; the reconciler follows it unit by unit."""
    out: list[tuple[str, int]] = []
    for unit in units(steps.get(root, 0), tree.get(root, ())):
        if unit.child is None:
            out.extend((root, s) for s in range(unit.hi - 1, unit.lo - 1, -1))
        else:
            out.extend(rollback_order(tree, steps, unit.child))
    return out


def ancestry_problem(run: str, parent: str, chain: Sequence[tuple[str, str | None] | None],
                     tree_runs: int) -> str | None:
    """Why a Run ``run`` may not be created with parent ``parent``, or None. ``chain``: what a walk
    up from ``parent`` found, ``[(name, its parent or None), ...]`` starting with ``parent`` itself,
    a ``None`` entry for a Run that does not exist (the walk stops there), at most
    ``MAX_RUN_DEPTH + 1`` entries; ``tree_runs``: the runs already below the chain's root."""
    if parent == run:
        return f"spec.parentRef.name names the Run itself ({run}): a run cannot be its own parent"
    if not chain or chain[0] is None:
        return f"parent Run {parent} not found: create the parent first, or fix spec.parentRef.name"
    seen: list[str] = [run]
    for entry in chain:
        if entry is None:
            missing = seen[-1]
            return (f"parent Run {missing}'s own parent does not exist any more: the tree is broken, choose another "
                    "parent")
        name, up = entry
        if name in seen:
            path = " -> ".join([*seen, name])
            return f"spec.parentRef.name {parent} would make a cycle ({path}): choose a parent outside this run's tree"
        seen.append(name)
        if len(seen) > MAX_RUN_DEPTH:
            return (f"runs nest at most {MAX_RUN_DEPTH} deep: {run} under {parent} would be at depth {len(seen)} or "
                    f"more ({' -> '.join(reversed(seen))}); open it under a run higher up")
        if up is None:
            break
    if tree_runs >= MAX_TREE_RUNS:
        root = seen[-1]
        return (f"the tree of root Run {root} already has {tree_runs} runs below its root, the limit is "
                f"{MAX_TREE_RUNS}: open a new root Run for further work")
    return None


def root_of(run: str, chain: Sequence[tuple[str, str | None] | None]) -> str:
    """The root of a new run's tree from the walk of :func:`ancestry_problem` (its last entry)."""
    names = [e[0] for e in chain if e is not None]
    return names[-1] if names else run


def section_outcome(phase: str | None, complete: bool, cancelled: bool) -> str:
    """A child run's section outcome from its request's phase: ``running`` until it ends, then
    ``rolledBack`` (complete), ``cancelled`` (stopped before anything ran) or ``incomplete``."""
    if phase not in ("Succeeded", "Incomplete", "Failed"):
        return "running"
    if complete:
        return "rolledBack"
    return "cancelled" if cancelled else "incomplete"


def tree_complete(own_complete: bool, sections: Iterable[Mapping]) -> bool:
    """A tree's report is complete when its own run's report is and every section is."""
    return own_complete and all(s.get("complete") for s in sections)
