"""kopf indices: the operator's in-memory view of RunSteps, Runs and ToolManifests.

One watch per kind feeds each index (kopf fills them before any handler runs), so a reconcile
pass or an admission review reads a run's steps, its Run and its manifest from memory instead of
a LIST or GET per pass. An index lags the API by the watch's delay: where that matters (a step
just created, a Run just opened) the lookups fall back to one GET on a miss.

Indices (kopf passes each to every handler as a keyword argument named after the function):

- ``journal_steps``: ``(namespace, run, index)`` -> :class:`~reversi.engine.journal.Entry`;
- ``journal_sizes``: ``(namespace, run)`` -> the index of each of its RunSteps;
- ``manifest_specs``: ``(namespace, name)`` -> :class:`~reversi.models.toolmanifest.ToolManifestSpec`
  (``None`` when invalid).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from pydantic import ValidationError

from ..adapters import journal as jr
from ..engine.journal import Entry, Journal, assemble
from ..models.run import RunSpec, StepUndo
from ..models.runstep import step_name
from ..models.toolmanifest import ToolManifestSpec
from . import runtime

G, V = "reversi.dev", "v1alpha1"
log = logging.getLogger("reversi.indices")


@kopf.index(G, V, "runsteps")
def journal_steps(namespace: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str, int], Entry]:
    """Each RunStep, parsed once per change, keyed by its run and index."""
    spec = body.get("spec") or {}
    run, index = (spec.get("runRef") or {}).get("name"), spec.get("index")
    try:
        entry = jr.entry_of(dict(body))
    except jr.JournalError as err:  # admission refuses invalid steps; never fail the watch on one
        log.warning("%s", err)
        return {}
    return {(namespace, run, index): entry}


@kopf.index(G, V, "runsteps")
def journal_sizes(namespace: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str], int]:
    """The index of each RunStep, keyed by its run (the run's size is the highest + 1)."""
    spec = body.get("spec") or {}
    run, index = (spec.get("runRef") or {}).get("name"), spec.get("index")
    if not isinstance(run, str) or not isinstance(index, int):
        return {}
    return {(namespace, run): index}


@kopf.index(G, V, "toolmanifests")
def manifest_specs(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str], ToolManifestSpec | None]:
    """Each ToolManifest's spec, parsed once per change (``None`` when it is invalid)."""
    try:
        spec: ToolManifestSpec | None = ToolManifestSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        spec = None
    return {(namespace, name): spec}


@dataclass
class Indices:
    """The live kopf indices (see the module docstring), captured from a handler's kwargs."""

    steps: Mapping[Any, Any]
    sizes: Mapping[Any, Any]
    manifests: Mapping[Any, Any]


def capture(kwargs: Mapping[str, Any]) -> Indices | None:
    """Keep the indices kopf passed to a handler for code that runs outside handlers (workers)."""
    if "journal_steps" not in kwargs:
        return None
    found = Indices(kwargs["journal_steps"], kwargs["journal_sizes"], kwargs["manifest_specs"])
    state = runtime.state()
    if state.indices is None:
        state.indices = found
    return found


def _first(store: Any) -> Any:
    if store is None:
        return None
    return next(iter(store), None)


def step_entry(indices: Indices | None, namespace: str, run: str, index: int) -> Entry | None:
    """The RunStep of step ``index`` from the index, else from the API (one GET), else None."""
    entry = _first(indices.steps.get((namespace, run, index))) if indices is not None else None
    if entry is not None:
        return entry
    obj = runtime.state().kube.get(jr.STEPS, namespace, step_name(run, index))
    return jr.entry_of(obj) if obj is not None else None


def manifest(indices: Indices | None, namespace: str, name: str | None) -> ToolManifestSpec | None:
    """The ToolManifest's spec from the index, else from the API; None when missing or invalid."""
    if not name:
        return None
    if indices is not None and (namespace, name) in indices.manifests:
        return _first(indices.manifests.get((namespace, name)))
    obj = runtime.state().kube.get("toolmanifests", namespace, name)
    if obj is None:
        return None
    try:
        return ToolManifestSpec.model_validate(obj.get("spec") or {})
    except ValidationError:
        return None


def journal(indices: Indices, namespace: str, run: str, run_spec: RunSpec,
            legacy_undo: list[StepUndo] | None = None, overlay: Mapping[int, StepUndo] | None = None) -> Journal:
    """The run's journal from the indices (no API call): its RunSteps merged with any inline
    journal. ``overlay``: undo state this process wrote and may not have seen come back yet
    (read-your-writes for the request holding the run's lock)."""
    sizes = indices.sizes.get((namespace, run))
    top = max(sizes, default=-1) if sizes is not None else -1
    entries = []
    for i in range(top + 1):
        entry = _first(indices.steps.get((namespace, run, i)))
        if entry is None:
            continue
        if overlay and i in overlay and entry.undo != overlay[i]:
            entry = Entry(entry.spec, overlay[i])
        entries.append(entry)
    return assemble(run_spec, entries, legacy_undo or [])
