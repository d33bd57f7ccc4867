"""The schema-version check at start-up and on every change of one of Reversi's CRDs.

While any installed CRD is older than the operator (``reversi.schema``), the operator logs it,
posts a Warning Event ``SchemaOutdated`` on each such CRD naming the version it needs, sets
``reversi_crd_schema_outdated`` to 1 and reconciles nothing: every handler and worker asks
:meth:`reversi.handlers.runtime.Parts.reconciling` first. When the CRDs are upgraded, the CRD watch
sees it, the Event ``SchemaCurrent`` says so, and :func:`resync` takes up every object again
(kopf does not replay objects it has already seen).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Any

import kopf
import urllib3
from kubernetes.client.rest import ApiException

from .. import conditions as cond
from .. import schema
from ..adapters import apicalls as calls
from ..adapters import status as st
from ..adapters.kube import read_crds
from ..models.rollbackrequest import TERMINAL_PHASES
from . import runtime

log = logging.getLogger("reversi.schema")


def check_now(parts: runtime.Parts) -> schema.SchemaCheck:
    """Read the CRDs, record the verdict on ``parts`` and report a change (log, Events, metric);
    when the CRDs just became current, :func:`resync`. Returns the verdict."""
    crds = read_crds(parts.kube.api, schema.CRD_NAMES)
    result = schema.check(crds)
    before = parts.schema
    parts.schema = result
    if parts.metrics:
        parts.metrics.schema_checked(result)
    if not result.ok:
        if before is None or before.problems != result.problems:
            log.error("refusing to reconcile: %s", result.summary())
            by_name = {crd["metadata"]["name"]: crd for crd in crds} if parts.acting() else {}
            for problem in result.problems:
                name = problem.split(" ", 1)[0]
                if name in by_name:
                    _crd_event(parts.kube, by_name[name], cond.SCHEMA_OUTDATED,
                               f"{problem}; the operator reconciles nothing until the CRDs are upgraded", True)
    elif before is None:
        log.info("%s", result.summary())
    elif not before.ok:
        log.info("the CRDs were upgraded: %s; reconciling again", result.summary())
        if parts.acting():  # a standby takes everything up when it gets the Lease (reversi.handlers.leader)
            for crd in crds:
                _crd_event(parts.kube, crd, cond.SCHEMA_CURRENT,
                           f"{result.summary()}; the operator reconciles again", False)
            resync(parts)
    return result


def _crd_event(kube: Any, crd: dict, reason: str, message: str, warning: bool) -> None:
    """An Event about a CRD (cluster-scoped: the Event lives in ``default``). Never raises."""
    meta = crd["metadata"]
    now = dt.datetime.now(dt.UTC)
    body = {
        "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": "default"},
        "involvedObject": {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                           "name": meta["name"], "uid": meta.get("uid")},
        "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
        "source": {"component": "reversi-operator"}, "reportingComponent": "reversi.dev/operator",
        "reportingInstance": "reversi-operator", "firstTimestamp": now, "lastTimestamp": now, "eventTime": now,
        "action": reason, "count": 1,
    }
    try:
        calls.call(kube.core.create_namespaced_event, "default", body, repeat="unsent", timeout=kube.timeout)
    except ApiException as err:
        log.warning("event %s on CRD %s not posted: %s", reason, meta["name"], err.reason)
    except (OSError, urllib3.exceptions.HTTPError) as err:  # a timeout or a broken connection
        log.warning("event %s on CRD %s not posted: %s", reason, meta["name"], err)


def resync(parts: runtime.Parts) -> None:
    """Take up every object again after the gate opened: start workers for unfinished
    RollbackRequests and bring the status of the other kinds up to date."""
    from . import halts, manifests, runs  # the handler modules import runtime, not this one

    kube = parts.kube
    namespaces: list[str | None] = [*parts.settings.namespaces] or [None]
    for ns in namespaces:
        for req in kube.list("rollbackrequests", ns):
            meta = req["metadata"]
            if (req.get("status") or {}).get("phase") in TERMINAL_PHASES:
                update = st.observed_update(req.get("status"), meta.get("generation"))
                if update is not None:
                    kube.merge_status("rollbackrequests", meta["namespace"], meta["name"], update)
            else:
                parts.operating().workers.ensure(meta["namespace"], meta["name"])
        for halt in kube.list("halts", ns):
            halts.halt_changed(parts, "MODIFIED", halt, halt["metadata"]["namespace"], halt["metadata"]["name"])
        for manifest in kube.list("toolmanifests", ns):
            manifests.tool_manifest_changed(parts, "MODIFIED", manifest, manifest["metadata"]["namespace"],
                                            manifest["metadata"]["name"])
        for run in kube.list("runs", ns):
            runs.run_changed(parts, "MODIFIED", run, run["metadata"]["namespace"], run["metadata"]["name"])
    for halt in kube.list("clusterhalts"):
        halts.cluster_halt_changed(parts, "MODIFIED", halt, halt["metadata"]["name"])


def _ours(name: str, **_: Any) -> bool:
    return name in schema.CRD_NAMES


@kopf.on.event("apiextensions.k8s.io", "v1", "customresourcedefinitions", when=_ours)
def crd_event(memo: kopf.Memo, **_: Any) -> None:
    """One of Reversi's CRDs was created, changed or deleted: check again."""
    check_now(runtime.parts(memo))
