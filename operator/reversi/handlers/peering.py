"""kopf's peering pause, seen by the rollback workers (docs/operations.md#standby-replicas-peering).

With peering (``REVERSI_PEERING``; standby replicas), kopf pauses an operator while a peer of
higher priority is alive (and every operator while peers of the same priority are), and while its
peering object or CRD is missing: it closes its watch streams and stops its daemons until it
resumes. The rollback workers are threads of their own (:mod:`reversi.handlers.workers`), so they
ask :func:`paused` before each pass: a paused replica must not start passes next to the active one.

The answer comes from what kopf documents (docs.kopf.dev: "Daemons", termination "when ... the
operator itself is exiting or pausing", and "Peering"): kopf stops every daemon while peering
pauses the operator, and starts them again from the watch events that follow its resumption.
:func:`active` is such a daemon; the replica is active exactly while it runs. Without peering
(:func:`follow` with ``peering=False``) the replica is never paused.

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

log = logging.getLogger("reversi.peering")

#: the CRD of kopf's peering kind for an operator that watches the whole cluster
CLUSTER_PEERING_CRD = "clusterkopfpeerings.kopf.dev"
#: the CRD of kopf's peering kind for an operator that watches some namespaces
NAMESPACED_PEERING_CRD = "kopfpeerings.kopf.dev"

_lock = threading.Lock()
_followed: str | None = None  # the CRD :func:`active` runs on; None: peering is off
_running = 0  # how many :func:`active` daemons run now (one per process; a count stays right if kopf overlaps two)


def follow(*, peering: bool, clusterwide: bool = True) -> str | None:
    """Make :func:`paused` follow kopf's peering pause (``peering``), or never pause (without).

    ``clusterwide``: whether the operator watches the whole cluster (kopf then peers through
    ClusterKopfPeerings) or some namespaces (KopfPeerings). From this call until kopf runs
    :func:`active`, the replica is paused: with peering on, it is not active until kopf says so.
    Returns the name of the CRD :func:`active` runs on, or None without peering. Raises nothing."""
    global _followed
    with _lock:
        _followed = (CLUSTER_PEERING_CRD if clusterwide else NAMESPACED_PEERING_CRD) if peering else None
        return _followed


def paused() -> bool:
    """Whether the rollback workers must start no pass now: peering is on and kopf runs no
    :func:`active` daemon (before kopf first resumes the replica, while it is paused, and while it
    exits). Always False without peering. Safe from any thread."""
    with _lock:
        return _followed is not None and _running == 0


def _is_followed(name: str, **_: Any) -> bool:
    """kopf's filter for :func:`active`: only the followed peering CRD (no CRD without peering)."""
    with _lock:
        return name == _followed


def _mark(delta: int) -> None:
    global _running
    with _lock:
        _running += delta


@kopf.daemon("apiextensions.k8s.io", "v1", "customresourcedefinitions", id="peering-active", when=_is_followed)
async def active(stopped: kopf.DaemonStopped, name: str, **_: Any) -> None:
    """The replica is active while this daemon runs (see the module docstring): kopf starts it
    once it resumes the replica and stops it when it pauses (or exits, or the CRD ``name`` is
    deleted). It only waits for that stop, so it ends at once."""
    _mark(+1)
    log.info("kopf runs this replica (peering through %s): rollback workers start passes", name)
    try:
        while not stopped:
            await stopped.wait(60)
    finally:
        _mark(-1)
        log.info("kopf paused or is stopping this replica: rollback workers start no pass")
