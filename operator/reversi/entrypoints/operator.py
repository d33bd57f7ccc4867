"""``reversi-operator``: run the Reversi operator (kopf): it reconciles RollbackRequests, Runs,
Halts and ToolManifests. The admission webhooks are another process, ``reversi-admission``
(:mod:`reversi.entrypoints.admission`), so recording never waits on reconciling and a stopped
operator stops no agent.

    reversi-operator [--namespace NS ...] [--metrics-port 8080] [--kubeconfig PATH]

Settings come from ``REVERSI_*`` environment variables (:class:`reversi.settings.OperatorSettings`);
flags override them. In a pod the in-cluster service account is used, elsewhere ``--kubeconfig`` or
``$KUBECONFIG``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import kopf

from ..adapters import apicalls as calls
from ..adapters.kube import Kube
from ..adapters.journal import MOVE_WORKERS
from ..adapters.lease import LeaseLock
from ..engine.election import Timings
from . import common
from ..handlers import halts as _halt_handlers  # noqa: F401 - registers the handlers
from ..handlers import indices as _indices  # noqa: F401 - registers the kopf indices
from ..handlers import manifests as _manifest_handlers  # noqa: F401
from ..handlers import rollback as _rollback_handlers  # noqa: F401
from ..handlers import runs as _run_handlers
from ..handlers import caches
from ..handlers import runtime
from ..adapters.archive import Archive
from ..handlers.archive import Archiver
from ..handlers.finalizer import ArchiveFinalizer
from ..handlers.superseded import SupersededRequests
from ..handlers.recording import RecordedUsers
from ..handlers.retention import Retention
from ..handlers.reconciler import Reconciler
from ..handlers.runs import RunStatusWriter
from ..handlers.workers import Workers
from ..handlers.leader import Leader
from ..handlers import schema as schema_handlers
from ..metrics import Metrics

log = logging.getLogger("reversi.operator")
#: the pod's namespace, as its service account sees it (the Lease's default namespace)
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """kopf settings (progress in annotations, never in status) and the operator's parts, put on
    ``memo`` for every handler (:mod:`reversi.handlers.runtime`)."""
    ours = runtime.settings_of(memo)
    common.configure_kopf(settings, ours)
    # every replica watches (kopf's indices and our informers stay warm); the Lease says who acts
    settings.peering.standalone = True
    parts = runtime.built(memo)  # a retry of this activity: the port and threads are there already
    if parts is None:
        # a connection for each thread that calls the API at once: reconcile workers, kopf's handler
        # threads, an inline journal's move, the gauges' refresh, retention's workers and the informers' watches
        informer_watches = len(caches.KINDS) * max(len(ours.namespaces), 1)
        connections = ours.workers + ours.handler_threads + MOVE_WORKERS + 1 + ours.retention_workers + informer_watches
        metrics = Metrics(namespaces=ours.namespaces)
        if ours.metrics_port:
            metrics.serve(ours.metrics_port)
        # on the parts before the workers start: they stay paused until this replica holds the Lease
        leader = _leader(ours, metrics)
        api = common.api_client(os.environ.get("REVERSI_KUBECONFIG"), connections)
        # the field manager the API server records for each write (the user agent up to its "/") names the
        # replica: managedFields say which replica wrote what, and when (docs/operations.md#leader-election)
        api.user_agent = f"reversi-operator-{leader.identity}/operator"
        kube = Kube(leader.fence.wrap(api), timeout=ours.api_timeout_seconds)
        parts = runtime.build(ours, kube, metrics, operating=_operating, leader=leader)
        leader.on_started = lambda: _took_over(parts)
        memo[runtime.MEMO_KEY] = parts
        _start_retention(parts)
        threading.Thread(target=metrics.refresh_forever, args=(kube, ours.gauge_refresh_seconds, parts.stopping),
                         daemon=True, name="metrics-refresh").start()
    # kopf resolves what it watches once, after this activity: not before the API server serves it
    while missing := calls.wait_until_served(parts.kube.custom, 30):
        log.warning("the API server does not serve %s yet; kopf resolves the kinds it watches once, at its start: "
                    "waiting (are Reversi's CRDs installed? kubectl get crd | grep reversi.dev)", ", ".join(missing))
        if parts.stopping.is_set():
            break
    # before any handler writes: refuse to reconcile against CRDs older than this operator. While
    # the API server cannot answer, nothing reconciles (parts.schema stays unset) and the check is
    # made again on the CRDs' watch events, which kopf lists as soon as it reaches the API server
    try:
        schema_handlers.check_now(parts)
    except Exception as err:  # noqa: BLE001 - the CRD events check again; never a start that cannot finish
        log.warning("the installed CRDs could not be read yet (%s); the check is made again when kopf lists them",
                    err)
    # after the check: the informers' first LIST is handled as kopf's first events were, with the
    # verdict known (a Run whose lock names a request deleted while the operator was down is released)
    caches.start(parts.informers)


def _leader(ours: Any, metrics: Metrics) -> Leader:
    """This replica's candidate for the Lease (docs/operations.md#leader-election), on an API
    client of its own (a renewal never waits for a connection the workers hold)."""
    namespace = ours.lease_namespace or (POD_NAMESPACE_FILE.read_text().strip() if POD_NAMESPACE_FILE.exists()
                                         else "default")
    identity = ours.leader_identity or f"{platform.node() or 'reversi'}_{os.getpid()}"
    timings = Timings(ours.lease_seconds, ours.renew_deadline_seconds, ours.retry_period_seconds)
    api = common.api_client(os.environ.get("REVERSI_KUBECONFIG"), 2)
    lock = LeaseLock(api, namespace, ours.lease_name, timeout=max(timings.retry, timings.renew_deadline / 2))
    return Leader(lock, identity, timings, metrics=metrics)


def _took_over(parts: runtime.Parts) -> None:
    """This replica now holds the Lease: take up every object again (a standby's handlers did
    nothing, and kopf does not replay what it has seen) and post what the schema check found."""
    if parts.operating_parts is not None:
        parts.operating_parts.workers.forget_memories()  # remembered before it lost the Lease: maybe stale
    try:
        if parts.schema is not None and not parts.schema.ok:
            parts.schema = None  # checked again: the Events SchemaOutdated are posted by the holder
            schema_handlers.check_now(parts)
        elif parts.reconciling():
            schema_handlers.resync(parts)
    except Exception as err:  # noqa: BLE001 - events and the requests' own Jobs take them up too
        log.warning("taking up every object after getting the Lease failed: %s", err)


@kopf.on.startup(id="leader-election")
async def elect(memo: kopf.Memo, **_: Any) -> None:
    """Start this replica's candidate for the Lease on kopf's event loop (after ``configure``,
    registered after it; kopf cancels the task at exit, after ``cleanup`` released the Lease)."""
    parts = runtime.built(memo)
    if parts is not None and parts.leader is not None and parts.leader.task is None:
        parts.leader.task = asyncio.create_task(parts.leader.run(), name="reversi-leader-election")


def _operating(parts: runtime.Parts) -> runtime.Operating:
    """The reconciler (reading kopf's indices and the run informers from ``parts``), the workers,
    a fixed pool started now (the threads do not grow with the requests) that starts no pass
    while this replica does not hold the Lease, and the Run status writer (one thread)."""
    ours = parts.settings
    reconciler = Reconciler(parts.kube, ours, parts.metrics, allowed=parts.reconciling, shared=parts)
    workers = Workers(reconciler, ours.tick_seconds, size=ours.workers, paused=parts.paused)
    workers.start()
    run_status = RunStatusWriter(parts.kube, ours.run_status_quiet_seconds, parts.reconciling)
    return runtime.Operating(reconciler, workers, run_status)


def _start_retention(parts: runtime.Parts) -> None:
    """The operator's own informers and the retention controller on them (docs/concepts.md#retention),
    started now: the informers list while kopf starts its own watches."""
    ours = parts.settings
    parts.informers = caches.build(parts.kube.api, ours.namespaces, timeout=ours.api_timeout_seconds)
    parts.retention = Retention(
        parts.kube, parts.informers["runs"], parts.informers["namespaces"], parts.informers["requests"],
        default_ttl=ours.retention_ttl_seconds, deletes_per_second=ours.retention_deletes_per_second,
        workers=ours.retention_workers, metrics=parts.metrics, reconciling=parts.reconciling,
        paused=parts.paused)
    archiver = None
    if ours.archive_dsn is not None:  # the record is written before each delete (docs/operations.md#the-archive)
        retention = parts.retention
        archiver = Archiver(parts.kube, Archive(ours.archive_dsn.get_secret_value()), metrics=parts.metrics,
                            requests_of=lambda ns, run: [r.name for r in retention.requests.of(ns, run)])
        parts.retention.archive, parts.retention.release = archiver, archiver.release
    parts.retention.start()
    # the finalizer that keeps a Run deleted by hand until it is archived; with the archive off, it
    # only takes that finalizer off the Runs that still carry it (docs/operations.md#a-run-deleted-by-hand)
    parts.finalizer = ArchiveFinalizer(parts.kube, parts.informers["runs"], archiver,
                                       writes_per_second=ours.retention_deletes_per_second,
                                       reconciling=parts.reconciling, paused=parts.paused)
    parts.finalizer.start()
    # the users the recording webhook is called for (docs/concepts.md#recording-with-no-agent-code)
    parts.recorded_users = RecordedUsers(parts.kube.api, parts.informers["runs"], ours.record_webhook,
                                         paused=parts.paused)
    parts.recorded_users.start()
    # an Incomplete request whose residue a later rollback superseded is Ready (docs/concepts.md#acknowledging-residue)
    superseded = SupersededRequests(parts.kube, parts.informers["runs"], parts.retention.requests.of,
                                    paused=parts.paused)
    parts.informers["requests"].subscribe(lambda key, old, new: superseded.request_changed(
        {(key[0], facts[0]) for facts in (old, new) if facts is not None}))
    parts.superseded = superseded
    superseded.start()
    # Runs are watched here, not by kopf (a kopf worker per Run costs ~10 KB each): the Run status,
    # the requests a Run wakes and moving an inline journal
    parts.informers["runs"].observe(_run_handlers.observer(parts, ThreadPoolExecutor(2, thread_name_prefix="runs")))
    if parts.metrics is not None:  # the gauges read the informers (what stands: at each scrape), never a LIST
        parts.metrics.journal_namespaces = lambda: caches.runs_per_namespace(parts.informers["runs"])
        parts.metrics.runs_source = lambda: caches.incomplete_runs(parts.informers["runs"])


kopf.on.login()(common.login)


@kopf.on.probe(id="rollbacks")
def rollbacks_probe(memo: kopf.Memo, **_: Any) -> int:
    """Liveness detail: how many RollbackRequests are queued or in a pass (kopf answers /healthz
    only while its watches and handlers run; this adds what the operator is doing)."""
    parts = runtime.built(memo)
    return parts.operating().workers.count() if parts is not None else 0


@kopf.on.cleanup()
def cleanup(memo: kopf.Memo, **_: Any) -> None:
    parts = runtime.built(memo)
    if parts is None:
        return
    if parts.leader is not None:  # first: no write leaves from here on, and the standby starts at once
        parts.leader.release()
    parts.stopping.set()
    operating = parts.operating()
    operating.workers.stop_all()
    operating.run_status.stop()
    if parts.journals is not None:
        parts.journals.stop_all()
    if parts.retention is not None:
        parts.retention.stop()
    if parts.finalizer is not None:
        parts.finalizer.stop()
    if parts.recorded_users is not None:
        parts.recorded_users.stop()
    if parts.superseded is not None:
        parts.superseded.stop()
    caches.stop(parts.informers)


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--namespace", "namespaces", multiple=True, help="Namespace to watch (repeatable); default: all.")
@click.option("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster or $KUBECONFIG).")
@click.option("--metrics-port", type=int, default=None, help="Prometheus /metrics port (0: off).")
@click.option("--verbose", is_flag=True, help="Debug logging.")
def main(namespaces: tuple[str, ...], kubeconfig: str | None, metrics_port: int | None, verbose: bool) -> None:
    ours = common.settings_from_flags(namespaces, kubeconfig, metrics_port, verbose)
    kopf.run(clusterwide=not ours.namespaces, namespaces=ours.namespaces,
             standalone=True, liveness_endpoint=common.liveness_endpoint(ours),
             identity=common.identity(), memo=kopf.Memo({runtime.SETTINGS_KEY: ours}))

if __name__ == "__main__":
    main()
