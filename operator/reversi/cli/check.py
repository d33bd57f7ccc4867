"""``kubectl reversi check``: what is wrong with a cluster before Reversi is installed on it (``--pre``), or with
an install (docs/operations.md#checking-an-install).

Each check reads (:func:`gather_pre`, :func:`gather_install`: every API call with the plugin's timeout), then
judges what it read with a pure function (the ``judge_*`` functions: dicts in, :class:`Finding` out, unit-tested).
A problem is one line that says what is wrong and what to do.

Before the install (``--pre``): the Kubernetes version (:data:`MIN_KUBERNETES` or newer), the admission APIs the
chart uses served, and the rights ``helm install`` needs, asked of the API server for the user running the check
(SelfSubjectAccessReview).

After the install: the CRDs at this plugin's schema version; the operator's Lease held and renewed; the operator's
and the admission server's Deployments ready; the admission webhooks answering (a server-side dry-run create of a
RollbackRequest, which crosses them); the recorded call's admission policies and their bindings present, and in
force (a dry-run create of a recorded call with a wrong name, which only the policies refuse); the rollback lock's
binding selecting its ClosedRunSlices; and the metrics Service with a ready endpoint (and the ServiceMonitor, where
the Prometheus Operator is installed).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import click
from kubernetes import client
from kubernetes.client.rest import ApiException

from ..adapters import apicalls as calls
from ..adapters.policies import recording_policies
from ..engine.retention import parse_time
from .common import conn, global_options, now, out, output_of, output_option, print_document

if TYPE_CHECKING:
    from .api import Connection

#: the oldest Kubernetes the chart installs on (``kubeVersion`` in Chart.yaml): the recorded call is stamped by
#: a MutatingAdmissionPolicy, served as ``admissionregistration.k8s.io/v1`` from 1.36
MIN_KUBERNETES = (1, 36)
#: the API group and version of the admission objects the chart installs
ADMISSION_API = "admissionregistration.k8s.io/v1"
#: resources the chart needs served: ``group/version`` -> plural names
NEEDED_APIS: dict[str, tuple[str, ...]] = {
    ADMISSION_API: ("validatingadmissionpolicies", "validatingadmissionpolicybindings", "mutatingadmissionpolicies",
                    "mutatingadmissionpolicybindings", "validatingwebhookconfigurations",
                    "mutatingwebhookconfigurations"),
    "apiextensions.k8s.io/v1": ("customresourcedefinitions",),
    "coordination.k8s.io/v1": ("leases",),
    "batch/v1": ("jobs",),
    "authorization.k8s.io/v1": ("subjectaccessreviews",),
    "authentication.k8s.io/v1": ("tokenreviews",),
}
#: what ``helm install`` creates: ``(group, plural)``; cluster-scoped ones first, then those of the release's
#: namespace
CLUSTER_RIGHTS = (("", "namespaces"), ("apiextensions.k8s.io", "customresourcedefinitions"),
                  ("rbac.authorization.k8s.io", "clusterroles"),
                  ("rbac.authorization.k8s.io", "clusterrolebindings"),
                  ("admissionregistration.k8s.io", "validatingwebhookconfigurations"),
                  ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
                  ("admissionregistration.k8s.io", "validatingadmissionpolicies"),
                  ("admissionregistration.k8s.io", "validatingadmissionpolicybindings"),
                  ("admissionregistration.k8s.io", "mutatingadmissionpolicies"),
                  ("admissionregistration.k8s.io", "mutatingadmissionpolicybindings"),
                  ("flowcontrol.apiserver.k8s.io", "flowschemas"),
                  ("flowcontrol.apiserver.k8s.io", "prioritylevelconfigurations"))
NAMESPACED_RIGHTS = (("apps", "deployments"), ("", "services"), ("", "secrets"), ("", "serviceaccounts"),
                     ("rbac.authorization.k8s.io", "roles"), ("rbac.authorization.k8s.io", "rolebindings"),
                     ("policy", "poddisruptionbudgets"))
#: the name of the objects the probes dry-run (never stored: every probe is a server-side dry run)
PROBE_NAME = "reversi-check-probe"
#: the ClosedRunSlices kind the rollback lock's binding selects as its params
LOCK_PARAM_KIND = "ClosedRunSlice"

Status = Literal["ok", "problem", "note"]


@dataclass(frozen=True)
class Finding:
    """One check's answer: ``check`` its short name; ``status`` ``ok``, ``problem`` (the check fails) or ``note``
    (worth knowing, not a failure); ``line`` what was found, and for a problem what to do (one line)."""

    check: str
    status: Status
    line: str


def ok(check: str, line: str) -> Finding:
    return Finding(check, "ok", line)


def problem(check: str, line: str) -> Finding:
    return Finding(check, "problem", line)


# ------------------------------------------------------------------------------------------ judges (pure)


def judge_version(git_version: str) -> Finding:
    """The server's version (``gitVersion``, e.g. ``v1.36.3``) against :data:`MIN_KUBERNETES`."""
    found = re.match(r"v?(\d+)\.(\d+)", git_version or "")
    need = ".".join(map(str, MIN_KUBERNETES))
    if found is None:
        return problem("kubernetes", f"the server's version {git_version!r} cannot be read; Reversi needs Kubernetes "
                                     f"{need} or newer")
    have = (int(found[1]), int(found[2]))
    if have < MIN_KUBERNETES:
        return problem("kubernetes", f"Kubernetes {git_version} is older than {need}, which Reversi needs (the "
                                     "recorded call's MutatingAdmissionPolicy is served from it): upgrade the cluster")
    return ok("kubernetes", f"Kubernetes {git_version} ({need} or newer is needed)")


def judge_apis(served: Mapping[str, Iterable[str]]) -> list[Finding]:
    """``served``: ``group/version`` -> the plural names it serves (discovery; a version absent is not served).
    One finding per API of :data:`NEEDED_APIS`."""
    out = []
    for api, plurals in NEEDED_APIS.items():
        missing = sorted(set(plurals) - set(served.get(api, ())))
        if missing:
            out.append(problem("apis", f"{api} does not serve {', '.join(missing)}: Reversi's admission and Jobs "
                                       "need it (Kubernetes 1.36 or newer serves it by default; check the API "
                                       "server's --runtime-config)"))
        else:
            out.append(ok("apis", f"{api} serves {', '.join(plurals)}"))
    return out


def judge_rights(denied: Iterable[str], user: str, namespace: str) -> Finding:
    """``denied``: ``verb resource`` the user may not do (SelfSubjectAccessReview); empty: may install."""
    missing = sorted(denied)
    who = user or "you"
    if missing:
        return problem("rights", f"{who} may not {'; '.join(missing)} (namespace {namespace} for the namespaced "
                                 "ones): helm install needs them; ask a cluster admin to install, or to grant them")
    return ok("rights", f"{who} may create everything the chart installs (cluster-wide, and in namespace {namespace})")


def judge_crds(summary: str, current: bool) -> Finding:
    """The CRDs against this plugin's schema version (:func:`reversi.schema.check`'s ``summary`` and ``ok``)."""
    if current:
        return ok("crds", summary)
    return problem("crds", f"{summary}: install this version's CRDs (helm upgrade with the chart of this version, "
                           "or kubectl apply -f crds/)")


def judge_lease(lease: Mapping[str, Any] | None, name: str, namespace: str, now: dt.datetime) -> Finding:
    """The operator's Lease (``spec`` of ``coordination.k8s.io/v1`` Lease as a dict, ``None``: absent): held,
    and renewed within its duration, at ``now`` (aware)."""
    where = f"Lease {namespace}/{name}"
    fix = (f"no operator replica acts, so no rollback advances: kubectl -n {namespace} get pods -l "
           "app.kubernetes.io/component=operator, and read their logs")
    if lease is None:
        return problem("operator", f"{where} does not exist: {fix}")
    spec = lease.get("spec") or {}
    holder, renewed = spec.get("holderIdentity"), parse_time(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds") or 15
    if not holder or renewed is None:
        return problem("operator", f"{where} is held by no replica: {fix}")
    age = (now - renewed).total_seconds()
    if age > duration:
        return problem("operator", f"{where} was last renewed by {holder} {age:.0f} s ago, past its "
                                   f"{duration} s: {fix}")
    return ok("operator", f"{where} held by {holder} (renewed {max(age, 0):.0f} s ago)")


def judge_deployment(deployment: Mapping[str, Any] | None, name: str, namespace: str, role: str,
                     fix: str) -> Finding:
    """A Deployment (dict; ``None``: absent) of ``role`` with at least one ready replica."""
    where = f"Deployment {namespace}/{name}"
    if deployment is None:
        return problem(role, f"{where} does not exist: {fix}")
    wanted = (deployment.get("spec") or {}).get("replicas", 1)
    ready = (deployment.get("status") or {}).get("readyReplicas") or 0
    if not ready:
        return problem(role, f"{where} has 0 of {wanted} replicas ready: {fix}")
    return ok(role, f"{where}: {ready} of {wanted} replicas ready")


def judge_webhook_probe(error: ApiException | None, returned: Mapping[str, Any] | None, release: str,
                        namespace: str) -> Finding:
    """The dry-run create of a RollbackRequest that claims ``spec.approvedBy`` (:data:`PROBE_NAME`), which the
    mutating webhook always removes (only the server says who approved): refused by a webhook's own rule, or
    admitted without the claim, means the webhooks answer; the API server's "failed calling webhook" means no
    replica answered; admitted with the claim means no webhook was called (``returned``: the object the dry run
    returned)."""
    if error is not None and calls.admission_unreachable(error):
        return problem("webhooks", f"the admission webhooks do not answer ({_short(error)}): every write of Reversi's "
                                   f"kinds is refused meanwhile; scale Deployment {namespace}/{release}-admission up "
                                   f"(kubectl -n {namespace} scale deployment {release}-admission --replicas=2) and "
                                   "see docs/operations.md#reversiadmissiondown")
    if error is not None and error.status in (401, 403) and "webhook" not in calls.api_message(error):
        return Finding("webhooks", "note", f"not probed: you may not create rollbackrequests in namespace {namespace} "
                                           "(a dry run needs the create right)")
    if error is None and ((returned or {}).get("spec") or {}).get("approvedBy") == PROBE_NAME:
        return problem("webhooks", f"no admission webhook was called for a RollbackRequest: the webhook "
                                   f"configurations {release} are missing or do not match; helm upgrade the release")
    return ok("webhooks", "the admission webhooks answer (a dry-run RollbackRequest was judged by them)")


def judge_policies(present: Iterable[str], bound: Iterable[str], expected: Iterable[str],
                   lock_binding: Mapping[str, Any] | None, lock_name: str) -> list[Finding]:
    """The recorded call's policies: each of ``expected`` (names) present and bound (``bound``: the policy names
    bindings name), and the lock's binding (dict, ``None``: absent) selecting ClosedRunSlices as params."""
    out = []
    names = sorted(expected)
    absent = [n for n in names if n not in set(present)]
    unbound = [n for n in names if n not in set(bound) and n not in absent]
    if absent or unbound:
        parts = ([f"missing {', '.join(absent)}"] if absent else []) + (
            [f"not bound: {', '.join(unbound)}"] if unbound else [])
        missing = "; ".join(parts)
        out.append(problem("policies", f"the recorded call's admission policies are not all in place ({missing}"
                                       "): recorded calls are not judged by them; helm upgrade the release to put "
                                       "them back"))
    else:
        out.append(ok("policies", f"{len(names)} admission policies of the recorded call and its outcome present "
                                  "and bound"))
    param = ((lock_binding or {}).get("spec") or {}).get("paramRef")
    if lock_binding is not None and (not isinstance(param, Mapping) or "selector" not in param):
        out.append(problem("lock", f"the binding {lock_name} selects no params: the rollback lock refuses nothing; "
                                   "helm upgrade the release to put its binding back"))
    elif lock_binding is not None:
        out.append(ok("lock", f"the rollback lock is bound to the namespace's {LOCK_PARAM_KIND}s"))
    return out


def policy_names(release: str) -> list[str]:
    """The admission policies of release ``release``: the outcome write's (``<release>-runstep-outcome``) and
    the recorded call's (:func:`reversi.adapters.policies.recording_policies`)."""
    return [f"{release}-runstep-outcome"] + [p["metadata"]["name"] for p in recording_policies(release)
                                              if not p["kind"].endswith("Binding")]


def judge_policy_probe(error: ApiException | None, refused_text: str) -> Finding:
    """The dry-run create of a recorded call with a wrong name: refused with ``refused_text`` (the policy's
    message) means the policies are in force; admitted means they judge nothing."""
    if error is None:
        return problem("policies", "a recorded call with a wrong name was admitted (dry run): the API server does not "
                                   "enforce the recorded call's policies; check that its ValidatingAdmissionPolicy "
                                   "admission plugin is on and helm upgrade the release")
    message = calls.api_message(error)
    if refused_text in message:
        return ok("policies", "the policies are in force (a dry-run recorded call with a wrong name was refused)")
    if error.status in (401, 403) and "ValidatingAdmissionPolicy" not in message:
        return Finding("policies", "note", "not probed: you may not create runsteps in the release's namespace")
    return problem("policies", f"the probe of the policies was refused for another reason ({_short(error)}): "
                               "read it, then run kubectl reversi check again")


def judge_metrics(ready_endpoints: int | None, service: str, namespace: str,
                  monitor: Literal["present", "absent", "no-crd"]) -> list[Finding]:
    """The metrics Service's ready endpoints (``None``: the Service is absent) and the ServiceMonitor."""
    out = []
    where = f"Service {namespace}/{service}"
    if ready_endpoints is None:
        out.append(problem("metrics", f"{where} does not exist: nothing can scrape the operator's metrics; helm "
                                      "upgrade the release"))
    elif not ready_endpoints:
        out.append(problem("metrics", f"{where} has no ready endpoint: the operator's metrics are not served; see "
                                      "the operator's pods"))
    else:
        out.append(ok("metrics", f"{where} serves the metrics ({ready_endpoints} ready endpoints)"))
    if monitor == "absent":
        out.append(Finding("metrics", "note", "the Prometheus Operator is installed but no ServiceMonitor selects "
                                              f"{where}: set metrics.serviceMonitor.enabled=true to have it scraped"))
    elif monitor == "no-crd":
        out.append(Finding("metrics", "note", f"no Prometheus Operator here: scrape {where} port metrics yourself "
                                              "(docs/operations.md#metrics)"))
    return out


def passed(findings: Iterable[Finding]) -> bool:
    """True when no finding is a problem and at least one check passed (notes alone prove nothing)."""
    found = list(findings)
    return all(f.status != "problem" for f in found) and any(f.status == "ok" for f in found)


def render(findings: list[Finding]) -> str:
    """One line per finding (``✔`` ok, ``✗`` problem, ``•`` note), then a summary line."""
    marks = {"ok": "✔", "problem": "✗", "note": "•"}
    lines = [f"{marks[f.status]} {f.line}" for f in findings]
    problems = sum(f.status == "problem" for f in findings)
    if problems:
        lines.append(f"{problems} problem{'s' if problems > 1 else ''} found")
    else:
        lines.append("all checks passed" if passed(findings) else "nothing could be checked (see the notes)")
    return "\n".join(lines)


def as_dicts(findings: Iterable[Finding]) -> list[dict[str, str]]:
    """``-o json``/``yaml``: ``[{check, status, message}]``."""
    return [{"check": f.check, "status": f.status, "message": f.line} for f in findings]


def _short(err: ApiException) -> str:
    return f"{err.status}: {calls.api_message(err)}".replace("\n", " ")[:300]


# ------------------------------------------------------------------------------------------ gathering (I/O)


def _dict(api: client.ApiClient, obj: Any) -> dict[str, Any]:
    return api.sanitize_for_serialization(obj)


def _maybe(read: Callable[[], Any]) -> Any:
    """``read()``, or ``None`` on 404."""
    try:
        return read()
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def gather_pre(c: Connection, namespace: str) -> list[Finding]:
    """The ``--pre`` findings for an install into ``namespace``."""
    version = calls.call(client.VersionApi(c.api).get_code)
    findings = [judge_version(version.git_version)]
    findings += judge_apis(_served(c.api))
    denied = []
    auth = client.AuthorizationV1Api(c.api)
    wanted = [(g, p, None) for g, p in CLUSTER_RIGHTS] + [(g, p, namespace) for g, p in NAMESPACED_RIGHTS]
    for group, plural, ns in wanted:
        review = {"spec": {"resourceAttributes": {"verb": "create", "group": group, "resource": plural,
                                                  **({"namespace": ns} if ns else {})}}}
        answer = calls.call(auth.create_self_subject_access_review, review)
        if not answer.status.allowed:
            denied.append(f"create {plural}{'.' + group if group else ''}")
    try:
        user = calls.whoami(c.api)
    except ApiException:
        user = ""
    findings.append(judge_rights(denied, user, namespace))
    return findings


#: the client's API class of each version :data:`NEEDED_APIS` names (its ``get_api_resources`` is discovery)
_DISCOVERY = {ADMISSION_API: client.AdmissionregistrationV1Api, "apiextensions.k8s.io/v1": client.ApiextensionsV1Api,
              "coordination.k8s.io/v1": client.CoordinationV1Api, "batch/v1": client.BatchV1Api,
              "authorization.k8s.io/v1": client.AuthorizationV1Api,
              "authentication.k8s.io/v1": client.AuthenticationV1Api}


def _served(api: client.ApiClient) -> dict[str, set[str]]:
    """``group/version`` -> plurals, for the versions :data:`NEEDED_APIS` names (discovery; a 404: not served)."""
    out: dict[str, set[str]] = {}
    for group_version, api_class in _DISCOVERY.items():
        found = _maybe(partial(calls.call, api_class(api).get_api_resources))
        if found is not None:
            out[group_version] = {r.name for r in found.resources or [] if "/" not in r.name}
    return out


def gather_install(c: Connection, release: str, namespace: str, now: dt.datetime) -> list[Finding]:
    """The findings about the release ``release`` installed in ``namespace``. A release namespace that does
    not exist is one problem (nothing is installed there); a check the user may not read is a note that says
    which right it needs, and the other checks go on."""
    core = client.CoreV1Api(c.api)
    try:
        calls.call(core.read_namespace, namespace)
    except ApiException as err:
        if err.status == 404:
            return [problem("install", f"namespace {namespace} does not exist: Reversi is not installed there; "
                                       f"install it (helm install {release} charts/reversi -n {namespace} "
                                       "--create-namespace), or name where it is with --release-namespace")]
        if err.status not in (401, 403):
            raise
    findings: list[Finding] = []
    for name, part in (("crds", _crds), ("operator", partial(_operator, release=release, now=now)),
                       ("admission", partial(_admission, release=release)),
                       ("policies", partial(_policies, release=release)),
                       ("metrics", partial(_metrics, release=release))):
        try:
            findings += part(c, namespace=namespace)
        except ApiException as err:
            if err.status not in (401, 403):
                raise
            findings.append(Finding(name, "note", f"not checked: you may not read what it needs ({_short(err)})"))
    return findings


def _crds(c: Connection, namespace: str) -> list[Finding]:
    from .. import schema
    from ..adapters.kube import read_crds

    result = schema.check(read_crds(c.api, schema.CRD_NAMES))
    return [judge_crds(result.summary(), result.ok)]


def _operator(c: Connection, namespace: str, release: str, now: dt.datetime) -> list[Finding]:
    apps, coord = client.AppsV1Api(c.api), client.CoordinationV1Api(c.api)
    lease = _maybe(lambda: calls.call(coord.read_namespaced_lease, f"{release}-operator", namespace))
    found = _maybe(partial(calls.call, apps.read_namespaced_deployment, release, namespace))
    return [judge_lease(None if lease is None else _dict(c.api, lease), f"{release}-operator", namespace, now),
            judge_deployment(None if found is None else _dict(c.api, found), release, namespace, "operator",
                             f"kubectl -n {namespace} describe deployment {release}")]


def _admission(c: Connection, namespace: str, release: str) -> list[Finding]:
    name = f"{release}-admission"
    found = _maybe(partial(calls.call, client.AppsV1Api(c.api).read_namespaced_deployment, name, namespace))
    fix = (f"every write of Reversi's kinds is refused meanwhile (failurePolicy Fail): kubectl -n {namespace} "
           f"scale deployment {name} --replicas=2, and see docs/operations.md#reversiadmissiondown")
    findings = [judge_deployment(None if found is None else _dict(c.api, found), name, namespace, "admission", fix)]
    if findings[-1].status == "ok":  # with no admission replica ready, the probe can only say the same again
        findings.append(judge_webhook_probe(*_probe_webhooks(c, namespace), release, namespace))
    return findings


def _dry_run_create(c: Connection, plural: str, body: dict[str, Any],
                    namespace: str) -> tuple[ApiException | None, dict[str, Any] | None]:
    """``(refusal, None)`` or ``(None, the object as the API server would store it)``: a server-side dry run."""
    try:
        created = calls.call(c.custom.create_namespaced_custom_object, calls.GROUP, calls.VERSION, namespace, plural,
                             body, dry_run="All", repeat="unsent")
    except ApiException as err:
        return err, None
    return None, created


def _probe_webhooks(c: Connection, namespace: str) -> tuple[ApiException | None, dict[str, Any] | None]:
    body = {"apiVersion": f"{calls.GROUP}/{calls.VERSION}", "kind": "RollbackRequest",
            "metadata": {"name": PROBE_NAME, "namespace": namespace},
            "spec": {"runRef": {"name": PROBE_NAME}, "approvedBy": PROBE_NAME}}
    return _dry_run_create(c, "rollbackrequests", body, namespace)


#: what the record policy says of a recorded call whose name is not ``<run>-<index in five digits>``
WRONG_NAME_REFUSAL = "must be named"


def _policies(c: Connection, namespace: str, release: str) -> list[Finding]:
    adm = client.AdmissionregistrationV1Api(c.api)
    expected = policy_names(release)
    present = [p.metadata.name for p in calls.list_all(adm.list_validating_admission_policy)[0]]
    present += [p["metadata"]["name"] for p in _mutating_policies(c)]
    bindings = [_dict(c.api, b) for b in calls.list_all(adm.list_validating_admission_policy_binding)[0]]
    bindings += _mutating_policies(c, "mutatingadmissionpolicybindings")
    bound = [(b.get("spec") or {}).get("policyName") for b in bindings]
    lock = f"{release}-runstep-lock"
    lock_binding = next((b for b in bindings if (b.get("metadata") or {}).get("name") == lock), None)
    findings = judge_policies(present, [b for b in bound if b], expected, lock_binding, lock)
    probe = {"apiVersion": f"{calls.GROUP}/{calls.VERSION}", "kind": "RunStep",
             "metadata": {"name": PROBE_NAME, "namespace": namespace},
             "spec": {"runRef": {"name": PROBE_NAME}, "index": 1, "tool": "reversi.check", "args": {},
                      "outcome": "intended", "runAtOpen": {"uid": "00000000-0000-0000-0000-000000000000"}}}
    findings.append(judge_policy_probe(_dry_run_create(c, "runsteps", probe, namespace)[0], WRONG_NAME_REFUSAL))
    return findings


def _mutating_policies(c: Connection, plural: str = "mutatingadmissionpolicies") -> list[dict[str, Any]]:
    """MutatingAdmissionPolicies (or their bindings) as dicts."""
    adm = client.AdmissionregistrationV1Api(c.api)
    method = (adm.list_mutating_admission_policy if plural == "mutatingadmissionpolicies"
              else adm.list_mutating_admission_policy_binding)
    return [_dict(c.api, p) for p in calls.list_all(method)[0]]


def _metrics(c: Connection, namespace: str, release: str) -> list[Finding]:
    service = f"{release}-operator"
    core, discovery = client.CoreV1Api(c.api), client.DiscoveryV1Api(c.api)
    found = _maybe(lambda: calls.call(core.read_namespaced_service, service, namespace))
    ready: int | None = None
    if found is not None:
        slices = calls.list_all(discovery.list_namespaced_endpoint_slice, namespace,
                                label_selector=f"kubernetes.io/service-name={service}")[0]
        ready = sum(1 for s in slices for e in s.endpoints or [] if e.conditions is None or e.conditions.ready)
    monitor: Literal["present", "absent", "no-crd"]
    try:
        calls.call(c.custom.get_namespaced_custom_object, "monitoring.coreos.com", "v1", namespace,
                   "servicemonitors", release)
        monitor = "present"
    except ApiException as err:
        if err.status != 404:
            raise
        monitor = "absent" if calls.not_found(err, release) else "no-crd"
    return judge_metrics(ready, service, namespace, monitor)


# ------------------------------------------------------------------------------------------ the command


@click.command(help="Check a cluster before installing Reversi (--pre: the Kubernetes version, the admission APIs, "
                    "your rights), or check an install: CRDs, the operator's Lease, the admission replicas answering, "
                    "the recorded call's policies in force, the rollback lock, the metrics. One line per check; exit 2 "
                    "when a problem is found (docs/operations.md#checking-an-install).")
@click.option("--pre", is_flag=True, help="Check the cluster before the install instead of the install.")
@click.option("--release", default="reversi", show_default=True,
              help="The release's full name (the prefix of its objects: Deployments, Lease, policies).")
@click.option("--release-namespace", default="reversi-system", show_default=True,
              help="The namespace the release is (or will be) installed in.")
@output_option("json", "yaml", what="the findings ([{check, status, message}])")
@global_options
def check(pre: bool, release: str, release_namespace: str, output: str | None) -> int:
    from .api import CliError, check_name

    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", release or "") or len(release) > 53:
        raise CliError(f"--release {release!r} is not a release name (lowercase letters, digits and '-', at most 53): "
                       "helm list -A lists them")
    check_name(release_namespace, "Namespace")
    c = conn()
    try:
        findings = gather_pre(c, release_namespace) if pre else gather_install(c, release, release_namespace, now())
    except ApiException as err:
        raise c.api_error(err, "checking the cluster") from err
    fmt = output_of(output)
    if fmt is None:
        out(render(findings))
    else:
        print_document(as_dicts(findings), fmt)
    return 0 if passed(findings) else 2
