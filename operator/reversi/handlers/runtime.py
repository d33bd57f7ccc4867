"""The process's shared objects (API client, reconciler, workers, metrics), made at start-up.

``reversi-operator`` builds them all (:func:`init`); ``reversi-admission`` builds only what its
webhooks read (:func:`init_admission`: the API client, metrics and kopf's indices): it has no
reconciler and no workers.
"""

from __future__ import annotations

from concurrent.futures import Executor, ThreadPoolExecutor
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..adapters.kube import Kube
from ..adapters.stepwatch import RunJournals
from ..settings import OperatorSettings

if TYPE_CHECKING:  # types only: the start-up handler builds them (init's ``parts``)
    from .reconciler import Reconciler
    from .workers import Workers


@dataclass
class State:
    settings: OperatorSettings
    kube: Kube
    reconciler: Reconciler | None
    workers: Workers | None
    metrics: Any = None
    #: the RunSteps of the runs being worked on, one informer per run (made by :func:`init`)
    journals: RunJournals | None = None
    indices: Any = None  # the live kopf indices (reversi.handlers.indices.Indices), once a handler saw them
    #: the last schema check (``reversi.schema.SchemaCheck``); None until the first one
    schema: Any = None
    #: the admission server's threads for the reads one review makes at once (never kopf's handler
    #: threads: a review waiting on its reads holds one of those)
    reads: Executor | None = None


_state: State | None = None

#: The reads an admission review makes at once at most (a new step: its Run, the previous step,
#: the namespace's Halts and the ClusterHalts).
READS_PER_REVIEW = 4


def init(settings: OperatorSettings, kube: Kube, metrics: Any = None,
         parts: Callable[[State], tuple[Reconciler, Workers]] | None = None) -> State:
    """Build the shared objects once; handlers reach them through :func:`state`. ``parts``
    builds the reconciler and the workers from the state (``reversi-operator``'s start-up handler
    passes it: this module never imports them, so nothing they import reaches back up to them)."""
    global _state
    _state = State(settings, kube, None, None, metrics,
                   journals=RunJournals(kube.custom, idle_seconds=settings.journal_idle_seconds))
    if parts is not None:
        _state.reconciler, _state.workers = parts(_state)
    return _state


def init_admission(settings: OperatorSettings, kube: Kube, metrics: Any = None) -> State:
    """The admission server's shared objects: no reconciler, no workers, no run informers."""
    global _state
    reads = ThreadPoolExecutor(max_workers=READS_PER_REVIEW * settings.admission_threads,
                               thread_name_prefix="admission-read")
    _state = State(settings, kube, None, None, metrics, reads=reads)
    return _state


def operating() -> tuple[Reconciler, Workers]:
    """The reconciler and the workers of ``reversi-operator``. Raises ``RuntimeError`` in a
    process that has none (the admission server)."""
    state_ = state()
    if state_.reconciler is None or state_.workers is None:
        raise RuntimeError("this process does not reconcile (it is the admission server)")
    return state_.reconciler, state_.workers


def reconciling() -> bool:
    """Whether the operator may write status: only after a schema check found the installed
    CRDs current (``reversi.handlers.schema``); older CRDs would prune what it writes."""
    return _state is not None and _state.schema is not None and _state.schema.ok


def state() -> State:
    if _state is None:
        raise RuntimeError("the operator's start-up handler has not run yet")
    return _state


def initialised() -> bool:
    """Whether :func:`init` has run (the operator is up; a reconciler used on its own is not)."""
    return _state is not None
