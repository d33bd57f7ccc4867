"""kopf's peering pause, seen by the rollback workers (docs/operations.md#standby-replicas-peering).

With peering (``REVERSI_PEERING``; standby replicas), kopf pauses an operator while a peer of
higher priority is alive (and every operator while peers of the same priority are), and while its
peering object or CRD is missing: it closes its watch streams and stops its daemons until it
resumes. The rollback workers are threads of their own (:mod:`reversi.handlers.workers`), so they
ask :meth:`Peering.paused` before each pass: a paused replica must not start passes next to the
active one. The process has one :class:`Peering`, on its parts (``runtime.Parts.peering``): the
start-up handler builds it with the parts and hands its ``paused`` to the workers; the daemon and
its filter find it on kopf's ``memo``.

The answer comes from what kopf documents (docs.kopf.dev: "Daemons", termination "when ... the
operator itself is exiting or pausing", and "Peering"): kopf stops every daemon while peering
pauses the operator, and starts them again from the watch events that follow its resumption.
:func:`active` is such a daemon; the replica is active exactly while it runs. Without peering
(``Peering(peering=False)``) the replica is never paused.

Every kopf daemon holds kopf's finalizer on its object while it runs (kopf's docs, "Deletion
prevention"). The object :func:`active` runs on is therefore the CustomResourceDefinition of the
peering kind kopf uses (``clusterkopfpeerings.kopf.dev`` cluster-wide, ``kopfpeerings.kopf.dev``
for watched namespaces), not the peering object itself: ``helm uninstall`` deletes the release's
RBAC before the peering object (helm deletes kinds it does not know last), so no replica could
lift a finalizer from it and it would stay Terminating; the CRD lives in the chart's ``crds/``
folder, which helm never deletes, and in no user's namespace. The operator needs ``patch`` on that
one CRD (the chart grants it by name with ``peering.enabled``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import kopf

from . import runtime

log = logging.getLogger("reversi.peering")

#: the CRD of kopf's peering kind for an operator that watches the whole cluster
CLUSTER_PEERING_CRD = "clusterkopfpeerings.kopf.dev"
#: the CRD of kopf's peering kind for an operator that watches some namespaces
NAMESPACED_PEERING_CRD = "kopfpeerings.kopf.dev"


class Peering:
    """Whether kopf's peering lets this replica work (see the module docstring); one per process.

    ``peering``: whether kopf's peering is on (else :meth:`paused` is always False);
    ``clusterwide``: whether the operator watches the whole cluster (kopf then peers through
    ClusterKopfPeerings) or some namespaces (KopfPeerings). From its construction until kopf runs
    :func:`active`, the replica is paused: with peering on, it is not active until kopf says so."""

    def __init__(self, *, peering: bool, clusterwide: bool = True) -> None:
        #: the name of the CRD :func:`active` runs on; None without peering
        self.followed: str | None = None
        if peering:
            self.followed = CLUSTER_PEERING_CRD if clusterwide else NAMESPACED_PEERING_CRD
        self._lock = threading.Lock()
        self._running = 0  # how many :func:`active` daemons run now (one; a count stays right if kopf overlaps two)

    def paused(self) -> bool:
        """Whether the rollback workers must start no pass now: peering is on and kopf runs no
        :func:`active` daemon (before kopf first resumes the replica, while it is paused, and while
        it exits). Always False without peering. Safe from any thread."""
        with self._lock:
            return self.followed is not None and self._running == 0

    def follows(self, name: str) -> bool:
        """Whether ``name`` is the peering CRD :func:`active` runs on (none without peering)."""
        return name == self.followed

    def mark(self, delta: int) -> None:
        """Count an :func:`active` daemon that starts (``+1``) or ends (``-1``)."""
        with self._lock:
            self._running += delta


def of(memo: Any) -> Peering | None:
    """The process's :class:`Peering` on kopf's ``memo`` (``runtime.Parts.peering``), or None
    before the start-up handler built the parts, or in a process without one."""
    parts = runtime.built(memo)
    return parts.peering if parts is not None else None


def _is_followed(name: str, memo: Any = None, **_: Any) -> bool:
    """kopf's filter for :func:`active`: only the followed peering CRD (no CRD without peering)."""
    peering = of(memo)
    return peering is not None and peering.follows(name)


@kopf.daemon("apiextensions.k8s.io", "v1", "customresourcedefinitions", id="peering-active", when=_is_followed)
async def active(stopped: kopf.DaemonStopped, name: str, memo: kopf.Memo, **_: Any) -> None:
    """The replica is active while this daemon runs (see the module docstring): kopf starts it
    once it resumes the replica and stops it when it pauses (or exits, or the CRD ``name`` is
    deleted). It only waits for that stop, so it ends at once. Raises ``RuntimeError`` when
    ``memo`` holds no :class:`Peering` (its filter never lets kopf run it then)."""
    peering = of(memo)
    if peering is None:
        raise RuntimeError("the operator's start-up handler has not built its peering state")
    peering.mark(+1)
    log.info("kopf runs this replica (peering through %s): rollback workers start passes", name)
    try:
        while not stopped:
            await stopped.wait(60)
    finally:
        peering.mark(-1)
        log.info("kopf paused or is stopping this replica: rollback workers start no pass")
