"""The process's parts (API client, metrics, reconciler, workers, run status writer), shared through
kopf's ``memo``.

Each entry point's start-up handler builds them once and puts them on the operator's memo as
``memo.parts`` (kopf docs, "In-memory containers": the operator's memo is populated in start-up
handlers, and each resource's memo is a shallow copy of it, so every handler's ``memo.parts`` is
this one object). Handlers read them with :func:`parts`; code that is not a handler (the worker
and writer threads, the schema check) is handed them. ``reversi-operator`` builds them all
(:func:`build`); ``reversi-admission`` builds only what its webhooks read (:func:`build_admission`:
the API client, metrics and kopf's indices): it has no reconciler and no workers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from ..adapters.kube import Kube
from ..adapters.stepwatch import RunJournals
from ..models.run import RunSpec
from ..settings import OperatorSettings

if TYPE_CHECKING:  # types only: the start-up handler builds them (build's ``operating`` and ``leader``)
    from .leader import Leader
    from .reconciler import Reconciler
    from .runs import RunStatusWriter
    from .workers import Workers

#: the key of the parts on kopf's memo (``memo.parts``)
MEMO_KEY = "parts"
#: the key of the process's settings on kopf's memo (``memo.settings``), given to ``kopf.run`` by
#: the entry point's ``main`` (the start-up handler reads them; without them, the environment's)
SETTINGS_KEY = "settings"

#: The reads an admission review makes at once at most (a new step: its Run, the previous step,
#: the namespace's Halts and the ClusterHalts).
READS_PER_REVIEW = 4
#: How many Runs :class:`InlineMoves` keeps in each of its maps.
INLINE_KEPT = 8


class Operating(NamedTuple):
    """The parts only ``reversi-operator`` has."""

    reconciler: Reconciler
    workers: Workers
    run_status: RunStatusWriter


@dataclass
class InlineMoves:
    """What the admission server keeps between the reviews that move a Reversi 0.1 Run's inline
    journal to RunSteps (``reversi.handlers.admission``): each moved step is one review, and such
    a Run is megabytes, so reading and parsing it for each one would make the move quadratic. Each
    map holds at most ``INLINE_KEPT`` Runs; the one kept longest is dropped first. Reviews run on
    several threads at once: a change to either map holds ``lock``."""

    #: the Run as last read, whole, by ``(namespace, name)``
    runs: dict[tuple[str, str], dict] = field(default_factory=dict)
    #: the Run's parsed spec and its inline steps by index, by ``(namespace, name, resourceVersion)``
    parsed: dict[tuple[str, str, str], tuple[RunSpec, dict[int, Any]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Parts:
    """What the handlers of one process share (see the module docstring)."""

    settings: OperatorSettings
    kube: Kube
    metrics: Any = None
    #: the reconciler, the rollback workers and the Run status writer (``reversi-operator`` only)
    operating_parts: Operating | None = None
    #: the RunSteps of the runs being worked on, one informer per run (``reversi-operator`` only)
    journals: RunJournals | None = None
    indices: Any = None  # the live kopf indices (reversi.handlers.indices.Indices), once a handler saw them
    #: the last schema check (``reversi.schema.SchemaCheck``); None until the first one
    schema: Any = None
    #: the admission server's threads for the reads one review makes at once (never kopf's handler
    #: threads: a review waiting on its reads holds one of those)
    reads: Executor | None = None
    #: set when the process stops: its own threads (the gauges' refresh) end
    stopping: threading.Event = field(default_factory=threading.Event)
    #: the Runs whose inline journal the admission server is moving (its webhooks only)
    inline: InlineMoves = field(default_factory=InlineMoves)
    #: the operator's own informers (Runs, Namespaces, RollbackRequests: ``reversi.adapters.informer``),
    #: by name; ``reversi-operator`` only
    informers: dict[str, Any] = field(default_factory=dict)
    #: the retention controller (``reversi.handlers.retention.Retention``; ``reversi-operator`` only)
    retention: Any = None
    #: the archive's finalizer controller (``reversi.handlers.finalizer.ArchiveFinalizer``; ``reversi-operator`` only)
    finalizer: Any = None
    #: the recording webhook's match condition (:class:`reversi.handlers.recording.RecordedUsers`)
    recorded_users: Any = None
    #: marks superseded requests Ready (:class:`reversi.handlers.superseded.SupersededRequests`)
    superseded: Any = None
    #: this replica's candidate for the Lease (``reversi.handlers.leader.Leader``; ``reversi-operator``
    #: only: its start-up handler builds it with the parts, before the workers). None: no election
    #: (the admission server, unit tests): the process always acts
    leader: Leader | None = None

    def acting(self) -> bool:
        """Whether this replica holds the Lease and may act now (docs/operations.md#leader-election);
        always True without a leader election."""
        return self.leader is None or self.leader.acting()

    def paused(self) -> bool:
        """The opposite of :meth:`acting`: the work queues start no pass while it is true."""
        return not self.acting()

    def reconciling(self) -> bool:
        """Whether the operator may write status: only after a schema check found the installed
        CRDs current (``reversi.handlers.schema``; older CRDs would prune what it writes), and only
        while this replica holds the Lease (:meth:`acting`)."""
        return self.schema is not None and self.schema.ok and self.acting()

    def operating(self) -> Operating:
        """The reconciler, the workers and the Run status writer of ``reversi-operator``. Raises
        ``RuntimeError`` in a process that has none (the admission server)."""
        if self.operating_parts is None:
            raise RuntimeError("this process does not reconcile (it is the admission server)")
        return self.operating_parts


def build(settings: OperatorSettings, kube: Kube, metrics: Any = None,
          operating: Callable[[Parts], Operating] | None = None, leader: Leader | None = None) -> Parts:
    """``reversi-operator``'s parts, with a run informer set for the journals. ``operating``
    builds the reconciler, the workers and the Run status writer from the parts (the start-up
    handler passes it: this module never imports them, so nothing they import reaches back up to
    them); ``leader`` (the start-up handler's) is on the parts before ``operating`` runs, so the
    workers it starts follow it."""
    built = Parts(settings, kube, metrics,
                  journals=RunJournals(kube.custom, idle_seconds=settings.journal_idle_seconds), leader=leader)
    if operating is not None:
        built.operating_parts = operating(built)
    return built


def build_admission(settings: OperatorSettings, kube: Kube, metrics: Any = None) -> Parts:
    """The admission server's parts: no reconciler, no workers, no run informers; a pool of
    ``READS_PER_REVIEW`` threads per handler thread for a review's reads."""
    reads = ThreadPoolExecutor(max_workers=READS_PER_REVIEW * settings.admission_threads,
                               thread_name_prefix="admission-read")
    return Parts(settings, kube, metrics, reads=reads)


def parts(memo: Any) -> Parts:
    """The parts on kopf's ``memo`` (a handler's ``memo`` kwarg, a ``kopf.Memo``). Raises
    ``RuntimeError`` when the start-up handler has not put them there."""
    found = built(memo)
    if found is None:
        raise RuntimeError("the operator's start-up handler has not built its parts yet")
    return found


def built(memo: Any) -> Parts | None:
    """The parts on kopf's ``memo``, or None before the start-up handler built them."""
    found = memo.get(MEMO_KEY) if isinstance(memo, Mapping) else None
    return found if isinstance(found, Parts) else None


def settings_of(memo: Any) -> OperatorSettings:
    """The settings ``main`` gave ``kopf.run`` on the memo, else the environment's (``REVERSI_*``)."""
    given = memo.get(SETTINGS_KEY) if isinstance(memo, Mapping) else None
    return given if isinstance(given, OperatorSettings) else OperatorSettings()
