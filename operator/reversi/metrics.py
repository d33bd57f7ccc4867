"""Prometheus metrics of the operator (docs/operations.md#metrics), prefix ``reversi_``.

Labels are ``namespace`` and ``tool`` (and a small closed set such as ``verdict``, ``bucket``,
``reason``) — never a run or step name, so cardinality stays bounded.

=========================================== ======= ==========================================
metric                                      type    meaning
=========================================== ======= ==========================================
reversi_rollbacks_total                     counter finished requests by ``verdict``: complete,
                                                    incomplete, cancelled, invalid, dryRun
reversi_rollback_steps_total                counter steps of finished rollbacks by report
                                                    ``bucket`` and ``tool``
reversi_incomplete_rollbacks                gauge   Runs whose last rollback is incomplete
                                                    (Run condition RolledBack=False), now,
                                                    unless acknowledged (reversi.dev/acknowledged)
reversi_standing_undos                      gauge   steps of those Runs whose undo, in the Run's
                                                    last rollback, ended ``failed`` or
                                                    ``unverified`` (label ``state``), by tool:
                                                    what is still wrong, until a later request
                                                    undoes it or the Run is acknowledged
reversi_compensation_duration_seconds       hist.   compensator start to its verdict, by tool
reversi_verification_duration_seconds       hist.   first read-back to the verification verdict
reversi_active_halts                        gauge   Halts (namespace) and ClusterHalts
                                                    (``namespace=""``) in force
reversi_refused_calls_total                 counter steps refused at admission, by ``reason``
                                                    (exported by each reversi-admission replica:
                                                    :class:`AdmissionMetrics`)
reversi_crd_schema_outdated                 gauge   1 while an installed CRD is missing or older
                                                    than the operator (it then reconciles
                                                    nothing), else 0
reversi_crd_schema_version                  gauge   schema version of each installed CRD, by
                                                    ``crd`` (0: no annotation); and the
                                                    operator's own, ``crd="operator"``
=========================================== ======= ==========================================

Gauges are recomputed from the API at start-up and every ``refresh`` so they stay right across
operator restarts; counters restart at zero, as Prometheus expects (use ``increase()``). Alerts on
what still stands read the gauges (docs/operations.md#alerts): a counter says that something
happened, a gauge that it is still so.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .engine import acknowledgement

log = logging.getLogger("reversi.metrics")

#: The annotation of earlier versions that acknowledged a Run (still honoured: see
#: :mod:`reversi.engine.acknowledgement`; ``kubectl reversi acknowledge`` replaces it).
ACKNOWLEDGED = acknowledgement.LEGACY_ANNOTATION


def incomplete_run(run: dict) -> bool:
    """Whether a Run counts in ``reversi_incomplete_rollbacks``: its last rollback is incomplete
    (``RolledBack=False``) and no acknowledgement of it counts
    (:func:`reversi.engine.acknowledgement.acknowledged`)."""
    return acknowledgement.incomplete(run)


BUCKETS = ("compensated", "failed", "unverified", "unrecoverable", "unresolved", "unmanifested",
           "deferred", "awaiting_approval", "pending", "cancelled", "skipped", "already_recovered", "expired",
           "handler_unavailable", "conflict", "compensation_deadline_passed")
DURATION_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
#: The ``state`` label of ``reversi_standing_undos``: report buckets that leave an effect in place
#: although a compensation was tried.
STANDING_STATES = ("failed", "unverified")

Standing = dict[tuple[str, str], int]  # (tool, state) -> steps
#: The ``tool`` label of a standing undo whose tool the request's status does not name (a step an
#: earlier request left unverified, read back by a resync after an operator restart).
UNKNOWN_TOOL = "unknown"


def standing_undos(request: dict) -> Standing:
    """The steps of a finished RollbackRequest's report whose undo ended ``failed`` or
    ``unverified``, counted by ``(tool, state)`` (tools from ``status.steps``;
    :data:`UNKNOWN_TOOL` when a step has none there). Empty for a request with no report."""
    status = request.get("status") or {}
    report = status.get("report") or {}
    tools = {s.get("step"): s.get("tool") for s in status.get("steps") or [] if isinstance(s, dict)}
    counts: Standing = {}
    for state in STANDING_STATES:
        for item in report.get(state) or []:
            step = item.get("step") if isinstance(item, dict) else item
            key = (tools.get(step) or UNKNOWN_TOOL, state)
            counts[key] = counts.get(key, 0) + 1
    return counts


def _keep_known_tools(listed: Standing, known: Standing | None) -> Standing:
    """The standing undos a resync read (``listed``), unless some step's tool was not in the
    request's status (a step left unverified by an earlier request is planned as a skip, which
    the status does not list: tool ``unknown``) and the finished request's own report counted
    the same steps per state with their tools (``known``, from :meth:`Metrics.request_finished`):
    then that one."""
    if known is None or not any(tool == UNKNOWN_TOOL for tool, _ in listed):
        return listed

    def per_state(standing: Standing) -> dict[str, int]:
        out: dict[str, int] = {}
        for (_, state), n in standing.items():
            out[state] = out.get(state, 0) + n
        return out

    return known if per_state(known) == per_state(listed) else listed


def _last_rollback(request: dict) -> tuple[str, str, str, Standing] | None:
    """``(namespace, run, completionTime, standing undos)`` of a finished, real (not dry-run)
    RollbackRequest, else None: what a resync keeps of each request."""
    status = request.get("status") or {}
    spec = request.get("spec") or {}
    done = status.get("completionTime")
    run = (spec.get("runRef") or {}).get("name")
    if not done or spec.get("dryRun") or not isinstance(run, str) or status.get("report") is None:
        return None
    return request["metadata"]["namespace"], run, str(done), standing_undos(request)


def _incomplete_key(run: dict) -> tuple[str, str] | None:
    """``(namespace, name)`` of a Run that :func:`incomplete_run` counts, else ``None``."""
    return (run["metadata"]["namespace"], run["metadata"]["name"]) if incomplete_run(run) else None


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
        self.incomplete = Gauge("reversi_incomplete_rollbacks",
                                "Runs whose last rollback is incomplete (RolledBack=False).", ["namespace"], registry=r)
        self.compensation_seconds = Histogram("reversi_compensation_duration_seconds",
                                              "Compensator start to its verdict.", ["namespace", "tool"],
                                              buckets=DURATION_BUCKETS, registry=r)
        self.verification_seconds = Histogram("reversi_verification_duration_seconds",
                                              "First read-back to the verification verdict.", ["namespace", "tool"],
                                              buckets=DURATION_BUCKETS, registry=r)
        self.standing = Gauge("reversi_standing_undos",
                              "Steps whose undo failed or is unverified, in the last rollback of Runs not fully rolled "
                              "back and not acknowledged.", ["namespace", "tool", "state"], registry=r)
        self.halts = Gauge("reversi_active_halts", "Halts and ClusterHalts in force (ClusterHalts: namespace=\"\").",
                           ["namespace"], registry=r)
        self.schema_outdated = Gauge("reversi_crd_schema_outdated",
                                     "1 while an installed CRD is missing or older than the operator.", registry=r)
        self.schema_version = Gauge("reversi_crd_schema_version",
                                    "Schema version of each installed CRD (crd=\"operator\": the operator's own).",
                                    ["crd"], registry=r)
        self._known_incomplete: set[str] = set()
        self._incomplete_runs: dict[str, set[str]] = {}  # namespace -> names of incomplete, unacknowledged Runs
        #: Run watch events that came in while a resync listed the Runs, (namespace, name) -> counted:
        #: newer than the list, they are laid over it; None while no resync lists
        self._changes_while_listing: dict[tuple[str, str], bool] | None = None
        #: False until the first resync: a watch event alone (the operator just started) knows one
        #: Run of a namespace, not the others, and a 0 it exported would clear a firing alert
        self._synced = False
        self._known_halts: set[str] = set()
        #: (namespace, run) -> the standing undos of the Run's last finished rollback (Runs with none
        #: are left out, so setting the gauge costs what stands, not the number of Runs)
        self._standing_by_run: dict[tuple[str, str], Standing] = {}
        self._known_standing: set[tuple[str, str, str]] = set()  # label sets ever exported: zeroed, never removed
        self._lock = threading.Lock()

    # ----- events from the reconciler ------------------------------------------------------

    def request_finished(self, namespace: str, verdict: str, report: Any = None, plan: Any = None,
                         run: str | None = None) -> None:
        """Count a finished request and, with its report, each step by bucket and tool; with
        ``run`` too, its failed and unverified steps become the Run's standing undos (a later
        request's report replaces them)."""
        self.rollbacks.labels(namespace, verdict).inc()
        if report is None or plan is None:
            return
        standing: Standing = {}
        for bucket in BUCKETS:
            for item in getattr(report, bucket):
                step = item if isinstance(item, int) else item.step
                tool = plan.actions[step].tool
                self.steps.labels(namespace, tool, bucket).inc()
                if bucket in STANDING_STATES:
                    standing[(tool, bucket)] = standing.get((tool, bucket), 0) + 1
        if run is not None:
            with self._lock:
                if standing:
                    self._standing_by_run[(namespace, run)] = standing
                else:
                    self._standing_by_run.pop((namespace, run), None)
                self._export_standing()

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
        """Recompute every gauge from the API."""
        self.refresh_runs(kube)
        self.refresh_standing(kube)
        self.refresh_halts(kube)

    def refresh_standing(self, kube: Any) -> None:
        """Recompute ``reversi_standing_undos`` from a paged list of the RollbackRequests: each
        Run's last finished request (by ``completionTime``) gives its standing undos."""
        last: dict[tuple[str, str], tuple[str, Standing]] = {}
        for found in self._list(kube, "rollbackrequests", keep=_last_rollback):
            if found is None:
                continue
            namespace, run, done, standing = found
            if (namespace, run) not in last or last[(namespace, run)][0] <= done:
                last[(namespace, run)] = (done, standing)
        with self._lock:
            self._standing_by_run = {key: _keep_known_tools(standing, self._standing_by_run.get(key))
                                     for key, (_, standing) in last.items() if standing}
            self._export_standing()

    def _export_standing(self) -> None:
        """Set ``reversi_standing_undos`` from the standing undos of the Runs counted incomplete
        (call with the lock held). A label set that falls to nothing is set to 0, not removed: a
        series that disappears and comes back at 1 looks unchanged to ``increase()``. Nothing is
        exported before the first resync of the Runs (:meth:`refresh_runs`)."""
        if not self._synced:
            return
        totals: dict[tuple[str, str, str], int] = {}
        for (namespace, run), standing in self._standing_by_run.items():
            if run not in self._incomplete_runs.get(namespace, ()):
                continue  # complete, acknowledged or deleted: nothing stands
            for (tool, state), n in standing.items():
                totals[(namespace, tool, state)] = totals.get((namespace, tool, state), 0) + n
        for labels in self._known_standing | set(totals):
            self.standing.labels(*labels).set(totals.get(labels, 0))
        self._known_standing |= set(totals)

    def refresh_runs(self, kube: Any) -> None:
        """Recompute ``reversi_incomplete_rollbacks`` from a paged list of the Runs (the periodic
        resync; between resyncs :meth:`run_observed` keeps it from the Runs' watch events). A
        watch event that comes in while the list is read is newer than the list: it is laid over
        it. The first resync is also the first time the gauges are exported (a namespace's count,
        or a 0, is never exported from the events of a freshly started operator alone)."""
        with self._lock:
            self._changes_while_listing = {}
        try:
            found: dict[str, set[str]] = {}
            for namespace, name in self._list(kube, "runs", keep=_incomplete_key):
                found.setdefault(namespace, set()).add(name)
        except BaseException:
            with self._lock:
                self._changes_while_listing = None
            raise
        with self._lock:
            for (namespace, name), counted in (self._changes_while_listing or {}).items():
                names = found.setdefault(namespace, set())
                if counted:
                    names.add(name)
                else:
                    names.discard(name)
            self._changes_while_listing = None
            self._incomplete_runs = found
            self._synced = True
            for ns in self._known_incomplete | set(found):
                self.incomplete.labels(ns).set(len(found.get(ns, ())))
            self._known_incomplete |= set(found)
            self._export_standing()

    def run_observed(self, namespace: str, name: str, run: dict | None) -> None:
        """Keep ``reversi_incomplete_rollbacks`` from one watch event of a Run (``run``: the
        object, ``None`` when it was deleted): O(1), no API call; exported once the Runs were
        resynced at least once (:meth:`refresh_runs`)."""
        counted = run is not None and incomplete_run(run)
        with self._lock:
            if self._changes_while_listing is not None:
                self._changes_while_listing[(namespace, name)] = counted
            names = self._incomplete_runs.setdefault(namespace, set())
            if run is None:
                self._standing_by_run.pop((namespace, name), None)
            if (name in names) == counted and namespace in self._known_incomplete:
                return
            if counted:
                names.add(name)
            else:
                names.discard(name)
            if not self._synced:
                return
            self.incomplete.labels(namespace).set(len(names))
            self._known_incomplete.add(namespace)
            self._export_standing()

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
