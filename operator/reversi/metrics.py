"""Prometheus metrics of the operator (docs/operations.md#metrics), prefix ``reversi_``.

Labels are ``namespace`` and ``tool`` (and a small closed set such as ``verdict``, ``bucket``,
``reason``) — never a run or step name, so cardinality stays bounded. The exception is the two
gauges of a RollbackRequest that waits for a person (failed, or awaiting approval): they carry
``request`` and ``run`` so that an alert leads straight to them, and a series exists only while
such a request does (as kube-state-metrics exports one series per object).

=========================================== ======= ==========================================
metric                                      type    meaning
=========================================== ======= ==========================================
reversi_rollbacks_total                     counter finished requests by ``verdict``: complete,
                                                    incomplete, cancelled, invalid, dryRun
reversi_rollback_steps_total                counter steps of finished rollbacks by report
                                                    ``bucket`` and ``tool``
reversi_incomplete_rollbacks                gauge   Runs whose last rollback is incomplete
                                                    (Run condition RolledBack=False), now,
                                                    unless acknowledged (kubectl reversi
                                                    acknowledge)
reversi_standing_undos                      gauge   steps of those Runs whose undo stands
                                                    ``failed`` or ``unverified`` (label
                                                    ``state``), by tool, as each Run's
                                                    ``status.standing`` says: what is still
                                                    wrong, until a rollback undoes it or the
                                                    Run is acknowledged
reversi_compensation_duration_seconds       hist.   compensator start to its verdict, by tool
reversi_verification_duration_seconds       hist.   first read-back to the verification verdict
reversi_active_halts                        gauge   Halts (namespace) and ClusterHalts
                                                    (``namespace=""``) in force
reversi_refused_calls_total                 counter steps refused at admission, by ``reason``
                                                    (exported by each reversi-admission replica:
                                                    :class:`AdmissionMetrics`)
reversi_runs_deleted_total                  counter Runs deleted by the operator, by ``reason``
                                                    (``expired``: retention)
reversi_runs_archived_total                 counter Runs written to the archive before their delete
reversi_archive_failures_total              counter writes to the archive that failed, by ``reason``
                                                    (unreachable, auth, disk_full, schema, other):
                                                    the Run waits, nothing is lost
reversi_journal_steps                       gauge   RunSteps each namespace holds (the journal's
                                                    size; etcd's own count, one LIST of one item)
reversi_journal_runs                        gauge   Runs each namespace holds
reversi_journal_quota_steps                 gauge   the ceiling a ResourceQuota puts on a
                                                    namespace's RunSteps (count/runsteps.reversi.dev;
                                                    the lowest, when several do)
reversi_rollback_request_failed             gauge   1 for each RollbackRequest in phase Failed
                                                    (it cannot be carried out), with ``request``,
                                                    ``run`` and ``reason``, while it exists
reversi_rollback_request_awaiting_approval_since_seconds
                                            gauge   when each RollbackRequest waiting for approval
                                                    began to wait (Unix seconds), with
                                                    ``request`` and ``run``, while it waits
reversi_crd_schema_outdated                 gauge   1 while an installed CRD is missing or older
                                                    than the operator (it then reconciles
                                                    nothing), else 0
reversi_crd_schema_version                  gauge   schema version of each installed CRD, by
                                                    ``crd`` (0: no annotation); and the
                                                    operator's own, ``crd="operator"``
reversi_leader                              gauge   1 while this replica holds the operator's
                                                    Lease and acts, 0 on a standby, by
                                                    ``identity``
reversi_foreign_steps_total                 counter RunSteps a finished rollback found that
                                                    are not part of the run's record
reversi_closed_run_slice_runs               gauge   Runs each ClosedRunSlice holds, by
                                                    ``namespace`` and ``slice``
=========================================== ======= ==========================================

The admission server exports its own (``reversi_webhook_*``, e.g.
``reversi_webhook_connections_dropped_total``; docs/operations.md#metrics).

Gauges are recomputed from the API at start-up and every ``refresh`` so they stay right across
operator restarts; counters restart at zero, as Prometheus expects (use ``increase()``). Alerts on
what still stands read the gauges (docs/operations.md#alerts): a counter says that something
happened, a gauge that it is still so. The two gauges of what stands (:class:`StandingCollector`)
are computed at each scrape from the operator's informer of Runs, which keeps of each Run whether
its residue stands (``RolledBack``, the acknowledgement) and ``status.standing``
(docs/concepts.md#what-stands): never from the RollbackRequests, so a request that undid nothing
(cancelled, a dry run) changes neither, and no copy of the Runs is kept for them.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kubernetes.utils import parse_quantity
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

from .engine import acknowledgement
from .models.rollbackrequest import TERMINAL_PHASES

log = logging.getLogger("reversi.metrics")

#: The annotation of earlier versions that acknowledged a Run (still honoured: see
#: :mod:`reversi.engine.acknowledgement`; ``kubectl reversi acknowledge`` replaces it).
ACKNOWLEDGED = acknowledgement.LEGACY_ANNOTATION


BUCKETS = ("compensated", "failed", "unverified", "unrecoverable", "unresolved", "unmanifested",
           "deferred", "awaiting_approval", "pending", "cancelled", "skipped", "already_recovered", "expired",
           "handler_unavailable", "conflict", "compensation_deadline_passed")
DURATION_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

Standing = dict[tuple[str, str], int]  # (tool, state) -> steps


#: the ResourceQuota resource that counts RunSteps (object count quota of a custom resource)
RUNSTEP_QUOTA = "count/runsteps.reversi.dev"


def journal_ceilings(quotas: Any) -> dict[str, int]:
    """namespace -> the lowest ``hard`` of :data:`RUNSTEP_QUOTA` among ``quotas`` (ResourceQuota
    dicts); namespaces without one are left out."""
    out: dict[str, int] = {}
    for quota in quotas:
        hard = ((quota.get("spec") or {}).get("hard") or {}).get(RUNSTEP_QUOTA)
        try:
            ceiling = int(parse_quantity(hard)) if hard is not None else None
        except ValueError:
            ceiling = None
        if ceiling is None:
            continue
        ns = (quota.get("metadata") or {}).get("namespace") or ""
        out[ns] = min(ceiling, out.get(ns, ceiling))
    return out


class StandingCollector:
    """``reversi_incomplete_rollbacks`` and ``reversi_standing_undos``, computed at each scrape from
    ``source()`` (a custom collector: no copy of the Runs is kept here). ``source()`` gives ``(namespace,
    name, standing undos by (tool, state))`` of each Run that
    :func:`~reversi.engine.acknowledgement.incomplete` counts (the operator's informer of Runs,
    :func:`reversi.handlers.caches.incomplete_runs`), or None before that informer's first LIST: nothing is
    exported then (a freshly started operator knows one Run of a namespace, not the others, and a 0 would clear
    a firing alert). A namespace or label set once exported and now at nothing is exported as 0, never dropped:
    a series that vanishes and comes back at 1 looks unchanged to ``increase()``."""

    def __init__(self, source: Callable[[], Iterable[tuple[str, str, Standing]] | None]) -> None:
        self.source = source
        self._lock = threading.Lock()
        self._known_incomplete: set[str] = set()
        self._known_standing: set[tuple[str, str, str]] = set()

    def describe(self) -> list[Metric]:
        """The two families with no sample (registered without a first collect: the informer may not have
        listed yet)."""
        return list(self._families())

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        incomplete = GaugeMetricFamily("reversi_incomplete_rollbacks",
                                       "Runs whose last rollback is incomplete (RolledBack=False).",
                                       labels=["namespace"])
        standing_undos = GaugeMetricFamily(
            "reversi_standing_undos", "Steps whose undo failed or is unverified, in the last rollback of Runs not "
            "fully rolled back and not acknowledged.", labels=["namespace", "tool", "state"])
        return incomplete, standing_undos

    def collect(self) -> Iterator[Metric]:
        found = self.source()
        if found is None:
            return
        runs: dict[str, int] = {}
        totals: dict[tuple[str, str, str], int] = {}
        for namespace, _name, counts in found:
            runs[namespace] = runs.get(namespace, 0) + 1
            for (tool, state), n in counts.items():
                totals[(namespace, tool, state)] = totals.get((namespace, tool, state), 0) + n
        with self._lock:
            self._known_incomplete |= set(runs)
            self._known_standing |= set(totals)
            namespaces, label_sets = sorted(self._known_incomplete), sorted(self._known_standing)
        incomplete, standing_undos = self._families()
        for namespace in namespaces:
            incomplete.add_metric([namespace], runs.get(namespace, 0))
        for labels in label_sets:
            standing_undos.add_metric(list(labels), totals.get(labels, 0))
        yield incomplete
        yield standing_undos


class Metrics:
    """The operator's metrics in a registry of their own (tests make as many as they like)."""

    def __init__(self, registry: CollectorRegistry | None = None, namespaces: list[str] | None = None):
        self.registry = registry or CollectorRegistry()
        self.namespaces = list(namespaces or [])  # empty: the whole cluster
        r = self.registry
        self.rollbacks = Counter("reversi_rollbacks", "Finished RollbackRequests by verdict.",
                                 ["namespace", "verdict"], registry=r)
        self.steps = Counter("reversi_rollback_steps", "Steps of finished rollbacks by report bucket.",
                             ["namespace", "tool", "bucket"], registry=r)
        self.foreign = Counter("reversi_foreign_steps", "RunSteps found by a finished rollback that are not part of "
                               "their run's record (never undone; the report's foreign list says why).",
                               ["namespace"], registry=r)
        self.compensation_seconds = Histogram("reversi_compensation_duration_seconds",
                                              "Compensator start to its verdict.", ["namespace", "tool"],
                                              buckets=DURATION_BUCKETS, registry=r)
        self.verification_seconds = Histogram("reversi_verification_duration_seconds",
                                              "First read-back to the verification verdict.", ["namespace", "tool"],
                                              buckets=DURATION_BUCKETS, registry=r)
        self.halts = Gauge("reversi_active_halts", "Halts and ClusterHalts in force (ClusterHalts: namespace=\"\").",
                           ["namespace"], registry=r)
        self.schema_outdated = Gauge("reversi_crd_schema_outdated",
                                     "1 while an installed CRD is missing or older than the operator.", registry=r)
        self.schema_version = Gauge("reversi_crd_schema_version",
                                    "Schema version of each installed CRD (crd=\"operator\": the operator's own).",
                                    ["crd"], registry=r)
        self.runs_deleted = Counter("reversi_runs_deleted", "Runs deleted by the operator (reason expired: retention).",
                                    ["namespace", "reason"], registry=r)
        self.journal_steps = Gauge("reversi_journal_steps", "RunSteps each namespace holds (etcd's count).",
                                   ["namespace"], registry=r)
        self.journal_runs = Gauge("reversi_journal_runs", "Runs each namespace holds.", ["namespace"], registry=r)
        self.journal_quota = Gauge(
            "reversi_journal_quota_steps",
            "The ceiling of a namespace's RunSteps set by a ResourceQuota (count/runsteps.reversi.dev).",
            ["namespace"], registry=r)
        #: the namespaces whose journal is measured and their Runs (from the operator's informer of Runs):
        #: a callable giving {namespace: runs}; None: the journal is not measured
        self.journal_namespaces: Callable[[], dict[str, int]] | None = None
        #: what the gauges of what stands are computed from at each scrape (the operator's informer of
        #: Runs): ``runs_source()`` gives ``(namespace, name, standing undos)`` of each Run
        #: :func:`~reversi.engine.acknowledgement.incomplete` counts, or None while the informer has not
        #: listed yet (:class:`StandingCollector`)
        self.runs_source: Callable[[], list[tuple[str, str, Standing]] | None] | None = None
        self._known_journal: set[str] = set()
        self._known_quota: set[str] = set()
        self._person_gauges(r)
        self.runs_archived = Counter("reversi_runs_archived", "Runs written to the archive (before their delete).",
                                     ["namespace"], registry=r)
        self.archive_failures = Counter("reversi_archive_failures",
                                        "Writes to the archive that failed (the Run is kept until one succeeds).",
                                        ["namespace", "reason"], registry=r)
        self._known_halts: set[str] = set()
        self.leader = Gauge("reversi_leader",
                            "1 while this replica holds the operator's Lease and acts, 0 on a standby "
                            "(docs/operations.md#leader-election); identity: the Lease's holderIdentity it writes.",
                            ["identity"], registry=r)
        #: the gauges of what stands, computed at each scrape from runs_source (nothing before it is set)
        self.standing = StandingCollector(lambda: self.runs_source() if self.runs_source is not None else None)
        r.register(self.standing)
        self._lock = threading.Lock()

    def _person_gauges(self, r: CollectorRegistry) -> None:
        """The gauges of what waits for a person: a full ClosedRunSlice, a failed request, a
        request awaiting approval."""
        self.closed_runs = Gauge(
            "reversi_closed_run_slice_runs",
            "Runs a ClosedRunSlice holds (the lock policy's param; at most 2000 each), as the operator last wrote it.",
            ["namespace", "slice"], registry=r)
        self.request_failed = Gauge(
            "reversi_rollback_request_failed",
            "1 for each RollbackRequest in phase Failed (it cannot be carried out; reason says why), while it exists.",
            ["namespace", "request", "run", "reason"], registry=r)
        self.awaiting_approval = Gauge(
            "reversi_rollback_request_awaiting_approval_since_seconds",
            "When each RollbackRequest waiting for approval began to wait (Unix seconds), while it waits.",
            ["namespace", "request", "run"], registry=r)
        #: (namespace, request) -> the series exported for it: (gauge, label values)
        self._request_series: dict[tuple[str, str], list[tuple[Gauge, tuple[str, ...]]]] = {}

    # ----- events from the reconciler ------------------------------------------------------

    def leader_changed(self, identity: str, leading: bool) -> None:
        """This replica (``identity``) started (True) or stopped acting as the Lease's holder. A
        replica that stops acting stops exporting what only the acting one writes (how many runs
        each ClosedRunSlice holds): the new holder's values are the ones that count."""
        self.leader.labels(identity=identity).set(1 if leading else 0)
        if not leading:
            self.closed_runs.clear()

    def request_finished(self, namespace: str, verdict: str, report: Any = None, plan: Any = None) -> None:
        """Count a finished request and, with its report and plan, each step by bucket and tool.
        What stands is not taken from a request (:class:`StandingCollector` reads the Runs)."""
        self.rollbacks.labels(namespace, verdict).inc()
        if report is None or plan is None:
            return
        for bucket in BUCKETS:
            for item in getattr(report, bucket):
                step = item if isinstance(item, int) else item.step
                self.steps.labels(namespace, plan.actions[step].tool, bucket).inc()

    def request_observed(self, namespace: str, name: str, body: dict | None) -> None:
        """Keep the series of RollbackRequest ``name`` (``body``: the object; None when it was
        deleted) from one watch event: ``reversi_rollback_request_failed`` while it is Failed,
        ``..._awaiting_approval_since_seconds`` while it awaits approval (:func:`request_series`);
        its earlier series go."""
        series = [] if body is None else request_series(self, body)
        with self._lock:
            for gauge, labels in self._request_series.pop((namespace, name), []):
                if (gauge, labels) not in {(g, lv) for g, lv, _ in series}:
                    gauge.remove(*labels)
            for gauge, labels, value in series:
                gauge.labels(*labels).set(value)
            if series:
                self._request_series[(namespace, name)] = [(g, lv) for g, lv, _ in series]

    def run_deleted(self, namespace: str, reason: str) -> None:
        """Count a Run the operator deleted (``reason``: ``expired``, by retention)."""
        self.runs_deleted.labels(namespace, reason).inc()

    def run_archived(self, namespace: str) -> None:
        self.runs_archived.labels(namespace).inc()

    def archive_failed(self, namespace: str, reason: str) -> None:
        self.archive_failures.labels(namespace, reason).inc()

    def foreign_steps(self, namespace: str, count: int) -> None:
        """Count ``count`` foreign RunSteps a rollback in ``namespace`` found."""
        self.foreign.labels(namespace).inc(count)

    def observe_compensation(self, namespace: str, tool: str, seconds: float) -> None:
        self.compensation_seconds.labels(namespace, tool).observe(seconds)

    def observe_verification(self, namespace: str, tool: str, seconds: float) -> None:
        self.verification_seconds.labels(namespace, tool).observe(seconds)

    def schema_checked(self, result: Any) -> None:
        """Record a schema check (``reversi.schema.SchemaCheck``)."""
        self.schema_outdated.set(0 if result.ok else 1)
        self.schema_version.labels("operator").set(result.wanted)
        for crd, version in result.installed.items():
            if version is None:  # not installed: no series
                try:
                    self.schema_version.remove(crd)
                except KeyError:
                    pass
            else:
                self.schema_version.labels(crd).set(version)

    # ----- gauges from the API ---------------------------------------------------------------

    def refresh(self, kube: Any) -> None:
        """Recompute the gauges read from the API (what stands is computed at each scrape)."""
        self.refresh_halts(kube)
        if self.journal_namespaces is not None:
            self.refresh_journal(kube, self.journal_namespaces())

    def refresh_journal(self, kube: Any, runs: dict[str, int]) -> None:
        """Recompute the journal's gauges: for each namespace with Runs (``runs``: namespace ->
        Runs), its RunSteps counted by etcd (:meth:`reversi.adapters.kube.Kube.count`: one LIST
        of one item, never the RunSteps themselves), and the ResourceQuotas' ceiling on them (one
        paged LIST of ResourceQuotas). A namespace whose Runs are all gone is set to 0."""
        steps: dict[str, int] = {}
        for namespace in runs:
            found = kube.count("runsteps", namespace)
            if found is not None:
                steps[namespace] = found
        watched: list[str | None] = list(self.namespaces) or [None]
        ceilings = journal_ceilings(q for ns in watched for q in kube.resource_quotas(ns))
        with self._lock:
            for ns in self._known_journal | set(runs) | set(steps):
                self.journal_runs.labels(ns).set(runs.get(ns, 0))
                if ns in steps or ns not in runs:
                    self.journal_steps.labels(ns).set(steps.get(ns, 0))
            self._known_journal |= set(runs) | set(steps)
            for ns in self._known_quota - set(ceilings):
                self.journal_quota.remove(ns)
            for ns, ceiling in ceilings.items():
                self.journal_quota.labels(ns).set(ceiling)
            self._known_quota = set(ceilings)

    def refresh_halts(self, kube: Any) -> None:
        """Recompute ``reversi_active_halts`` from the Halts and ClusterHalts."""
        halts: dict[str, int] = {"": len(kube.list_paged("clusterhalts"))}
        for halt in self._list(kube, "halts"):
            ns = halt["metadata"]["namespace"]
            halts[ns] = halts.get(ns, 0) + 1
        with self._lock:
            for ns in self._known_halts - set(halts):
                self.halts.labels(ns).set(0)
            for ns, n in halts.items():
                self.halts.labels(ns).set(n)
            self._known_halts |= set(halts)

    def _list(self, kube: Any, plural: str, keep: Callable[[dict], Any] | None = None) -> list[Any]:
        """Every object of a kind in the watched namespaces (or what ``keep`` keeps of each), read
        a page at a time."""
        if not self.namespaces:
            return kube.list_paged(plural, keep=keep)
        return [obj for ns in self.namespaces for obj in kube.list_paged(plural, ns, keep=keep)]

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve ``/metrics`` on ``port`` (a daemon thread)."""
        start_http_server(port, addr=addr, registry=self.registry)
        log.info("metrics on %s:%d/metrics", addr, port)

    def refresh_forever(self, kube: Any, every: float, stop: threading.Event) -> None:
        """Refresh the gauges now and every ``every`` seconds until ``stop`` is set."""
        while True:
            try:
                self.refresh(kube)
            except Exception as err:  # noqa: BLE001 - metrics never take the operator down
                log.warning("refreshing gauges failed: %s", err)
            if stop.wait(every):
                return


class AdmissionMetrics:
    """The admission server's metrics (``reversi-admission``): the calls it refused, and the
    connections its webhook server dropped because they stalled. Each replica counts its own; sum
    over the pods (``sum by (namespace, reason) (reversi_refused_calls_total)``)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.refused = Counter("reversi_refused_calls", "Steps refused at admission, by reason.",
                               ["namespace", "tool", "reason"], registry=self.registry)
        self.dropped = Counter("reversi_webhook_connections_dropped",
                               "Webhook connections dropped because they stalled, by the stage they stalled in "
                               "(headers, idle, body).", ["reason"], registry=self.registry)
        for reason in ("headers", "idle", "body"):
            self.dropped.labels(reason)

    def dropped_connection(self, reason: str) -> None:
        """Count a webhook connection dropped for a stall in stage ``reason`` (headers, idle, body)."""
        self.dropped.labels(reason).inc()

    def refused_call(self, namespace: str, tool: str, reason: str) -> None:
        self.refused.labels(namespace, tool, reason).inc()

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve ``/metrics`` on ``port`` (a daemon thread)."""
        start_http_server(port, addr=addr, registry=self.registry)
        log.info("metrics on %s:%d/metrics", addr, port)


def request_series(metrics: Metrics, body: dict) -> list[tuple[Gauge, tuple[str, ...], float]]:
    """The series a RollbackRequest waiting for a person exports, as ``(gauge, label values,
    value)``: phase ``Failed``: ``request_failed`` 1 with the ``Invalid`` condition's reason;
    condition ``AwaitingApproval=True``: ``awaiting_approval`` at its lastTransitionTime (Unix
    seconds; the time it was read when it has none). Anything else: none."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    ns, name = meta.get("namespace") or "", meta.get("name") or ""
    run = str(((body.get("spec") or {}).get("runRef") or {}).get("name") or "")
    conds = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, dict)}
    if status.get("phase") == "Failed":
        reason = (conds.get("Invalid") or {}).get("reason") or "Unknown"
        return [(metrics.request_failed, (ns, name, run, str(reason)), 1.0)]
    waiting = conds.get("AwaitingApproval") or {}
    if waiting.get("status") == "True" and status.get("phase") not in TERMINAL_PHASES:
        return [(metrics.awaiting_approval, (ns, name, run), _epoch_seconds(waiting.get("lastTransitionTime")))]
    return []


def _epoch_seconds(stamp: Any) -> float:
    """An RFC 3339 time (``2026-12-07T15:00:00Z``) in Unix seconds; now when it is not one."""
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()
