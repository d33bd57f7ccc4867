"""Nested runs (docs/concepts.md#nested-runs): reading a tree of Runs from the API (the rules are in
:mod:`reversi.engine.nested_runs`).

A child Run carries the labels ``reversi.dev/parent: <parent>`` and ``reversi.dev/root: <root of
its tree>``, stamped at admission, so a tree is one LIST by label; each walk up a tree is bounded by
:data:`~reversi.models.run.MAX_RUN_DEPTH` GETs.
"""

from __future__ import annotations

from typing import Any

from ..engine.nested_runs import Node
from ..models.run import LABEL_ROOT, MAX_RUN_DEPTH
from .kube import Kube

RUNS = "runs"


def parent_of(run_obj: dict | None) -> str | None:
    """The name in a Run object's ``spec.parentRef``, or None."""
    ref = ((run_obj or {}).get("spec") or {}).get("parentRef")
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) and name else None


def node_of(run_obj: dict) -> Node:
    """A Run object as a :class:`~reversi.engine.nested_runs.Node`."""
    ref = (run_obj.get("spec") or {}).get("parentRef") or {}
    opened = ref.get("step") if isinstance(ref, dict) else None
    meta = run_obj.get("metadata") or {}
    return Node(meta.get("name", ""), parent_of(run_obj), opened if isinstance(opened, int) else 0,
                meta.get("creationTimestamp") or "")


def root_of(run_obj: dict) -> str:
    """The root of a Run's tree: its ``reversi.dev/root`` label, or its own name."""
    meta = run_obj.get("metadata") or {}
    return (meta.get("labels") or {}).get(LABEL_ROOT) or meta.get("name", "")


def ancestry(kube: Kube, namespace: str, run: str, parent: str) -> list[tuple[str, str | None] | None]:
    """Walk up from ``parent`` for a new Run ``run`` whose parent is ``parent``: ``[(name, its
    parent), ...]``, ``None`` for a Run that does not exist (the walk stops), the new run itself
    met again given as ``(run, parent)`` (a cycle). At most ``MAX_RUN_DEPTH`` GETs (enough to
    refuse depth ``MAX_RUN_DEPTH + 1``)."""
    out: list[tuple[str, str | None] | None] = []
    name: str | None = parent
    seen: set[str] = set()
    while name is not None and len(out) < MAX_RUN_DEPTH:
        if name == run:
            out.append((run, parent))
            break
        if name in seen:
            out.append((name, None))
            break
        seen.add(name)
        obj = kube.get(RUNS, namespace, name)
        if obj is None:
            out.append(None)
            break
        up = parent_of(obj)
        out.append((name, up))
        name = up
    return out


def ancestors(kube: Kube, namespace: str, run_spec: Any) -> list[tuple[str, dict[str, Any]]]:
    """``[(name, spec.scope), ...]`` of a Run's ancestors, from its parent up (at most
    ``MAX_RUN_DEPTH`` GETs; a missing one ends the walk)."""
    out: list[tuple[str, dict[str, Any]]] = []
    ref = getattr(run_spec, "parent_ref", None)
    name = ref.name if ref is not None else None
    seen: set[str] = set()
    while name is not None and name not in seen and len(out) < MAX_RUN_DEPTH:
        seen.add(name)
        obj = kube.get(RUNS, namespace, name)
        if obj is None:
            break
        scope = (obj.get("spec") or {}).get("scope") or {}
        out.append((name, {k: scope.get(k) for k in ("actor", "tenant", "environment")}))
        name = parent_of(obj)
    return out


def tree_nodes(kube: Kube, namespace: str, run_obj: dict) -> list[Node]:
    """Every Run of the tree ``run_obj`` belongs to, as nodes (one LIST by the root label; the
    root itself from its own object when ``run_obj`` is the root)."""
    root = root_of(run_obj)
    items = kube.select(RUNS, namespace, f"{LABEL_ROOT}={root}")
    return [node_of(o) for o in items if not (o.get("metadata") or {}).get("deletionTimestamp")]


def count_below(kube: Kube, namespace: str, root: str) -> int:
    """The Runs below root Run ``root`` (one LIST by label)."""
    return len(kube.select(RUNS, namespace, f"{LABEL_ROOT}={root}"))
