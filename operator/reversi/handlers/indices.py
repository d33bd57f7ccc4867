"""The operator's in-memory view of ToolManifests and of its Jobs (kopf indices), and of run journals.

One watch of ToolManifests feeds ``manifest_specs`` (kopf fills it before any handler runs), so a
reconcile pass or an admission review reads a manifest from memory instead of a GET per pass;
a miss falls back to one GET. kopf passes the index to every handler as the keyword argument
``manifest_specs``: ``(namespace, name)`` -> :class:`~reversi.models.toolmanifest.ToolManifestSpec`
(``None`` when invalid).

The project's Jobs (label ``app.kubernetes.io/managed-by=reversi``) are the index ``run_jobs``:
``(namespace, run uid)`` -> each Job's metadata and status, kept from the one watch of Jobs the
operator has anyway; a reconcile pass reads a run's Jobs from it (:func:`jobs_of_run`) instead of
a LIST per pass.

RunSteps are not a kopf index: a cluster holds far more of them than kopf's per-object workers
handle (see :mod:`reversi.adapters.stepwatch`). A run's journal comes from the operator's
per-run informer (:func:`journal`), and a single step from one GET (:func:`step_entry`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from ..adapters import journal as jr
from ..adapters.jobs import LABEL_RUN_UID
from ..engine.journal import Entry, Journal, assemble
from ..models.run import RunSpec, StepUndo
from ..models.runstep import step_name
from ..models.toolmanifest import ToolManifestSpec
from . import runtime

G, V = "reversi.dev", "v1alpha1"


@kopf.index(G, V, "toolmanifests")
def manifest_specs(namespace: str | None, name: str, body: kopf.Body,
                   **_: Any) -> dict[tuple[str, str], ToolManifestSpec | None]:
    """Each ToolManifest's spec, parsed once per change (``None`` when it is invalid)."""
    assert namespace is not None  # ToolManifests are namespaced
    try:
        spec: ToolManifestSpec | None = ToolManifestSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        spec = None
    return {(namespace, name): spec}


def run_jobs(namespace: str | None, name: str, body: kopf.Body, labels: kopf.Labels,
             **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """The project's Jobs (compensators and readers) by ``(namespace, run uid)``: each Job's
    metadata and status, and of its pod template only each container's name and image (the rest
    is left out to keep memory small; the image names a container that never ran). It shares the one
    watch of Jobs with :func:`reversi.handlers.rollback.rollback_job_event`, which registers it (the
    admission server, which imports this module, watches no Jobs)."""
    assert namespace is not None  # Jobs are namespaced
    meta = body.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "labels", "annotations", "creationTimestamp",
                                 "resourceVersion") if k in meta}
    containers = [{"name": c.get("name"), "image": c.get("image")}
                  for c in ((body.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
                  if isinstance(c, dict)]
    return {(namespace, labels.get(LABEL_RUN_UID, "")): {"metadata": kept, "status": dict(body.get("status") or {}),
                                                         "spec": {"template": {"spec": {"containers": containers}}}}}


#: seconds after which a run's Jobs are LISTed once instead of read from the index: kopf does not
#: drop from its index a Job deleted while its watch was down long enough to be listed again
RESYNC_SECONDS = 60.0


class Listings:
    """When each run's Jobs were last LISTed (:func:`jobs_of_run`), by ``(namespace, run uid)``:
    one per process, with its live indices (:class:`Indices`). Safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: ``time.monotonic()`` of each run's last LIST
        self.last: dict[tuple[str, str], float] = {}

    def due(self, namespace: str, run_uid: str) -> bool:
        """Whether the run's Jobs are to be LISTed now (never yet, or ``RESYNC_SECONDS`` ago at
        least); if so, counts them as LISTed now."""
        now = time.monotonic()
        with self._lock:
            if len(self.last) > 10_000:  # forget runs not read for a while
                for key in [k for k, at in self.last.items() if now - at > RESYNC_SECONDS]:
                    del self.last[key]
            last = self.last.get((namespace, run_uid))
            if last is not None and now - last < RESYNC_SECONDS:
                return False
            self.last[(namespace, run_uid)] = now
            return True


@dataclass
class Indices:
    """The live kopf indices (see the module docstring), captured from a handler's kwargs, and
    when each run's Jobs were last LISTed instead of read from them (``listings``)."""

    manifests: Mapping[Any, Any]
    jobs: Mapping[Any, Any] | None = None
    listings: Listings = field(default_factory=Listings)


def capture(parts: runtime.Parts, kwargs: Mapping[str, Any]) -> Indices | None:
    """Keep the indices kopf passed to a handler (its ``kwargs``) on the process's ``parts``, for
    code that runs outside handlers (workers). The first one kept stays for the process's life
    (``parts.indices``: kopf's indices are live mappings), and with it its ``listings``."""
    if "manifest_specs" not in kwargs:
        return None
    found = Indices(kwargs["manifest_specs"], kwargs.get("run_jobs"))
    if parts.indices is None:
        parts.indices = found
    return found


def _first(store: Any) -> Any:
    if store is None:
        return None
    return next(iter(store), None)


def step_entry(kube: Any, namespace: str, run: str, index: int) -> Entry | None:
    """The RunStep of step ``index`` from the API (one GET with ``kube``, a
    :class:`reversi.adapters.kube.Kube`), or None when it does not exist."""
    obj = kube.get(jr.STEPS, namespace, step_name(run, index))
    return jr.entry_of(obj) if obj is not None else None


def manifest(indices: Indices | None, namespace: str, name: str | None, kube: Any) -> ToolManifestSpec | None:
    """The ToolManifest's spec from the index, else from the API (``kube``, a
    :class:`reversi.adapters.kube.Kube`); None when missing or invalid."""
    if not name:
        return None
    if indices is not None and (namespace, name) in indices.manifests:
        return _first(indices.manifests.get((namespace, name)))
    obj = kube.get("toolmanifests", namespace, name)
    if obj is None:
        return None
    try:
        return ToolManifestSpec.model_validate(obj.get("spec") or {})
    except ValidationError:
        return None


#: seconds a Job this process created is taken as running while the watch has not brought it back
CREATED_GRACE_SECONDS = 60.0


class RunJobs:
    """A run's Jobs by name, from kopf's index (:func:`run_jobs`): ``get(name)`` gives the Job as
    a ``V1Job`` or None. A Job this process created that the watch has not brought back yet is a
    Job without status (running), so a pass right after the create does not create it again."""

    def __init__(self, kube: Any, namespace: str, bodies: list[dict[str, Any]]):
        self.kube = kube
        self.namespace = namespace
        self.bodies = {(b.get("metadata") or {}).get("name"): b for b in bodies}

    def labels(self) -> list[dict[str, str]]:
        """The labels of each Job of the run the index holds (see ``adapters.jobs.guard_read``)."""
        return [dict((b.get("metadata") or {}).get("labels") or {}) for b in self.bodies.values()]

    def get(self, name: str) -> Any:
        body = self.bodies.get(name)
        if body is not None:
            self.kube.seen(self.namespace, name)
            return self.kube.job_object(body)
        if self.kube.created_recently(self.namespace, name, CREATED_GRACE_SECONDS):
            return self.kube.job_object({"metadata": {"name": name, "namespace": self.namespace}, "status": {}})
        return None


def jobs_of_run(indices: Indices | None, kube: Any, namespace: str, run_uid: str) -> Mapping[str, Any] | RunJobs:
    """The Jobs of the run with uid ``run_uid``, by name: from kopf's index once a handler has
    seen it (kopf fills indices before any handler runs), else one LIST (right after start-up).
    A run's Jobs are also LISTed once every ``RESYNC_SECONDS`` (the first read of a run
    included; ``indices.listings`` keeps when), so a Job deleted while kopf's watch was away is
    not taken as alive for long."""
    if indices is None or indices.jobs is None or indices.listings.due(namespace, run_uid):
        return kube.list_jobs(namespace, f"{LABEL_RUN_UID}={run_uid}")
    for _ in range(5):
        try:  # kopf updates the index from its event loop while this thread reads it
            return RunJobs(kube, namespace, list(indices.jobs.get((namespace, run_uid), ())))
        except RuntimeError:
            continue
    return kube.list_jobs(namespace, f"{LABEL_RUN_UID}={run_uid}")


def journal(entries: Mapping[int, Entry], run_spec: RunSpec, legacy_undo: list[StepUndo] | None = None,
            overlay: Mapping[int, StepUndo] | None = None, run_uid: str | None = None) -> Journal:
    """The run's journal from its RunSteps by index (a run informer's view, see
    :class:`reversi.adapters.stepwatch.RunJournals`) merged with any inline journal.
    ``overlay``: undo state this process wrote and may not have seen come back yet
    (read-your-writes for the request holding the run's lock); ``run_uid``: the Run's uid, which
    a step's copy of it must name (:func:`reversi.engine.journal.foreign_rule`)."""
    merged = []
    for i in sorted(entries):
        entry = entries[i]
        if overlay and i in overlay and entry.undo != overlay[i]:
            entry = Entry(entry.spec, overlay[i])
        merged.append(entry)
    return assemble(run_spec, merged, legacy_undo or [], run_uid)
