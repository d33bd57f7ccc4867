"""Admission webhooks, served by the operator (kopf), where every write passes.

Mutating (they stamp what must come from the server, never from the client):

- ``/mutate-run``: ``spec.principal`` from the authenticated user on create (rule 10); each new
  step's ``snapshot`` from the current ToolManifest and its ``recordedAt`` (DESIGN §3); each new
  resolution's ``actor`` and ``resolvedAt`` (rule 7).
- ``/mutate-rollbackrequest``: each new approval's ``approver``/``approvedAt`` and
  ``approvedBy`` when ``approveCompensations`` is set (rule 8).

Validating (each refusal says what to fix):

- ``/validate-run``: halts (rule 9, ``kill switch: <reason>``), the principal (rule 10), tools
  without a manifest entry in enforce mode, forward duplicates, resolutions of steps that are not
  intended or uncertain (rule 7), and the spec's shape;
- ``/validate-rollbackrequest``: approving needs the RBAC verb ``approve`` on
  ``rollbackrequests`` (a SubjectAccessReview for the caller), and the spec's shape;
- ``/validate-toolmanifest``, ``/validate-halt``, ``/validate-clusterhalt``: the spec's shape and
  references (e.g. a compensation's runner must exist).

Whatever a CRD CEL rule checks without identity or other objects (append-only steps, immutable
mode, scope, runRef) stays a CEL rule. ``failurePolicy: Fail``: when the operator is down, writes
of these kinds are refused rather than let through unchecked — a Halt must hold.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import BaseModel, ValidationError

from ..adapters.jobs import Owner, build_job
from ..adapters.kube import api_message
from ..engine import admission as rules
from ..engine.graph import InvalidRun, build_graph
from ..engine.keys import snapshot_id
from ..models.halt import ClusterHaltSpec, HaltSpec
from ..models.rollbackrequest import RollbackRequestSpec
from ..models.run import RunSpec
from ..models.toolmanifest import ToolManifestSpec
from . import runtime

log = logging.getLogger("reversi.admission")
G, V = "reversi.dev", "v1alpha1"

#: Webhook ids: also the URL paths (``/<id>``) the chart's webhook configurations point at.
WEBHOOKS = {
    "mutate-run": ("runs", "mutating"),
    "mutate-rollbackrequest": ("rollbackrequests", "mutating"),
    "validate-run": ("runs", "validating"),
    "validate-rollbackrequest": ("rollbackrequests", "validating"),
    "validate-toolmanifest": ("toolmanifests", "validating"),
    "validate-halt": ("halts", "validating"),
    "validate-clusterhalt": ("clusterhalts", "validating"),
}
OPS = ["CREATE", "UPDATE"]


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _user(userinfo: dict | None) -> str:
    return (userinfo or {}).get("username") or "system:anonymous"


def _parse(model: type[BaseModel], spec: Any, what: str) -> Any:
    try:
        return model.model_validate(spec or {})
    except ValidationError as err:
        problems = []
        for e in err.errors()[:3]:
            loc = ".".join(str(p) for p in e.get("loc", ()) if p != "__root__")
            msg = "unknown field: check its spelling" if e.get("type") == "extra_forbidden" else e.get("msg")
            problems.append(f"spec.{loc}: {msg}" if loc else str(msg))
        raise kopf.AdmissionError(f"{what} is invalid: " + "; ".join(problems), code=422) from err


def _manifest(namespace: str, name: str | None) -> ToolManifestSpec | None:
    if not name:
        return None
    obj = runtime.state().kube.get("toolmanifests", namespace, name)
    if obj is None:
        return None
    try:
        return ToolManifestSpec.model_validate(obj.get("spec") or {})
    except ValidationError:
        return None


# ------------------------------------------------------------------------------------- runs

@kopf.on.mutate(G, V, "runs", id="mutate-run", operations=OPS, persistent=True)
def mutate_run(body: Any, old: Any, patch: kopf.Patch, userinfo: dict, operation: str, namespace: str,
               **_: Any) -> None:
    """Stamp the principal, new steps' snapshots and times, and new resolutions' actors."""
    user = _user(userinfo)
    spec = body.get("spec") or {}
    old_spec = (old or {}).get("spec") or {}
    if operation == "CREATE":
        patch.spec["principal"] = user
    elif old_spec.get("principal") and not spec.get("principal"):
        patch.spec["principal"] = old_spec["principal"]  # a client-side apply sends what it knows
    manifest_ref = spec.get("manifestRef") if isinstance(spec.get("manifestRef"), dict) else {}
    manifest = _manifest(namespace, manifest_ref.get("name"))
    old_steps = {s.get("index"): s for s in old_spec.get("steps") or [] if isinstance(s, dict)}
    old_res = {r.get("step"): r for r in old_spec.get("resolutions") or [] if isinstance(r, dict)}
    known_steps, known_res = set(old_steps), set(old_res)
    now = _now()

    def stamp(raw: dict) -> None:
        s = raw.get("spec")
        if not isinstance(s, dict):
            return
        shared = {x.get("id"): x for x in s.get("snapshots") or [] if isinstance(x, dict)}
        for step in s.get("steps") or []:
            if not isinstance(step, dict):
                continue
            if step.get("index") in known_steps:
                _carry(old_steps[step["index"]], step, ("snapshot", "snapshotId", "recordedAt"))
                continue
            entry = manifest.tool(step["tool"]) if manifest and isinstance(step.get("tool"), str) else None
            wire = entry.to_wire() if entry is not None else None
            sid = step.get("snapshotId")
            if wire is not None and sid and sid == snapshot_id(entry) and sid in shared \
                    and {k: v for k, v in shared[sid].items() if k != "id"} == wire:
                step.pop("snapshot", None)  # the shared snapshot is the manifest's entry: keep it
            else:
                step.pop("snapshotId", None)
                if wire is None:
                    step.pop("snapshot", None)  # no manifest entry: unmanifested, whatever the client said
                else:
                    step["snapshot"] = wire
            step["recordedAt"] = now  # the server's clock, not the client's
        for res in s.get("resolutions") or []:
            if not isinstance(res, dict):
                continue
            if res.get("step") in known_res:
                _carry(old_res[res["step"]], res, ("actor", "resolvedAt"))
            else:
                res["actor"] = user
                res["resolvedAt"] = now

    patch.fns.append(stamp)


def _carry(old: dict, new: dict, fields: tuple[str, ...]) -> None:
    """Keep server-stamped fields of an entry the client sent back without them (client-side
    ``kubectl apply`` sends only what is in the file)."""
    if any(f in new for f in fields):
        return
    for f in fields:
        if f in old:
            new[f] = old[f]


@kopf.on.validate(G, V, "runs", id="validate-run", operations=OPS, persistent=True, side_effects=True)
def validate_run(body: Any, old: Any, userinfo: dict, dryrun: bool, namespace: str, name: str,
                 **_: Any) -> None:
    """Refuse what rules 7, 9 and 10 forbid, and forward duplicates."""
    what = f"Run {namespace}/{name}"
    spec = _parse(RunSpec, body.get("spec"), what)
    old_spec = _parse(RunSpec, old.get("spec"), what) if old else None
    user = _user(userinfo)
    state = runtime.state()
    try:
        build_graph(spec)
    except InvalidRun as err:
        raise kopf.AdmissionError(f"{what}: {err}", code=422) from err
    refusal = rules.check_append_only(old_spec, spec) if old_spec is not None else None
    if refusal is None:
        refusal = rules.check_resolutions(old_spec, spec)
    if refusal is None and old_spec is not None:
        refusal = rules.check_principal(old_spec, spec, user, what)
    added = rules.new_steps(old_spec, spec)
    if refusal is None and added:
        halts = _halts(namespace)
        refusal = rules.check_halts(halts, namespace, spec, added)
        if refusal is None:
            manifest = _manifest(namespace, spec.manifest_ref.name)
            refusal = rules.check_tools(spec, added, manifest, f"{namespace}/{spec.manifest_ref.name}")
            if refusal is None:
                undo = (body.get("status") or {}).get("undo") or []
                compensated = {u.get("step") for u in undo if u.get("state") == "compensated"}
                refusal = rules.check_duplicates(spec, added, compensated, manifest)
    if refusal is None:
        return
    if not dryrun:
        if state.metrics:
            state.metrics.refused_call(namespace, refusal.tool, refusal.reason)
        if refusal.halt is not None:
            _count_refusal(*refusal.halt)
    log.info("%s: refused (%s) for %s: %s", what, refusal.reason, user, refusal.message)
    raise kopf.AdmissionError(refusal.message, code=403 if refusal.reason in (rules.HALTED, rules.FOREIGN_PRINCIPAL) else 422)


def _halts(namespace: str) -> list[rules.HaltView]:
    kube = runtime.state().kube
    views = []
    for obj in kube.list("halts", namespace):
        try:
            spec = HaltSpec.model_validate(obj.get("spec") or {})
        except ValidationError:
            continue
        views.append(rules.HaltView("Halt", obj["metadata"]["name"], namespace, spec.reason, spec.scope))
    for obj in kube.list("clusterhalts"):
        try:
            spec = ClusterHaltSpec.model_validate(obj.get("spec") or {})
        except ValidationError:
            continue
        views.append(rules.HaltView("ClusterHalt", obj["metadata"]["name"], None, spec.reason, spec.scope))
    return views


def _count_refusal(kind: str, namespace: str | None, name: str) -> None:
    """Add one to the halt's ``status.refusedCalls`` (optimistic concurrency, a few tries)."""
    kube = runtime.state().kube
    plural = "halts" if kind == "Halt" else "clusterhalts"
    for _ in range(5):
        try:
            obj = (kube.get(plural, namespace, name) if namespace else
                   kube.custom.get_cluster_custom_object(G, V, plural, name))
        except ApiException:
            return
        if obj is None:
            return
        count = (obj.get("status") or {}).get("refusedCalls", 0) + 1
        body = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "status": {"refusedCalls": count}}
        try:
            if namespace:
                kube.custom.patch_namespaced_custom_object_status(G, V, namespace, plural, name, body)
            else:
                kube.custom.patch_cluster_custom_object_status(G, V, plural, name, body)
            return
        except ApiException as err:
            if err.status != 409:
                log.warning("counting a refusal on %s %s: %s", kind, name, err.reason)
                return


# ---------------------------------------------------------------------------- rollbackrequests

@kopf.on.mutate(G, V, "rollbackrequests", id="mutate-rollbackrequest", operations=OPS, persistent=True)
def mutate_rollback_request(body: Any, old: Any, patch: kopf.Patch, userinfo: dict, **_: Any) -> None:
    """Stamp who approved: new approvals' approver and time, approvedBy for approveCompensations."""
    user = _user(userinfo)
    spec = body.get("spec") or {}
    old_spec = (old or {}).get("spec") or {}
    steps, all_now = rules.new_approvals(old_spec, spec)
    if old_spec.get("approvedBy"):
        patch.spec["approvedBy"] = old_spec["approvedBy"]
    elif all_now:
        patch.spec["approvedBy"] = user
    elif "approvedBy" in spec:
        patch.spec["approvedBy"] = None  # only the server says who approved
    now = _now()
    old = {a.get("step"): a for a in old_spec.get("approvals") or [] if isinstance(a, dict)}

    def stamp(raw: dict) -> None:
        for approval in (raw.get("spec") or {}).get("approvals") or []:
            if not isinstance(approval, dict):
                continue
            if approval.get("step") in old:
                _carry(old[approval["step"]], approval, ("approver", "approvedAt"))
            else:
                approval["approver"] = user
                approval["approvedAt"] = now

    patch.fns.append(stamp)


@kopf.on.validate(G, V, "rollbackrequests", id="validate-rollbackrequest", operations=OPS, persistent=True)
def validate_rollback_request(body: Any, old: Any, userinfo: dict, namespace: str, name: str, **_: Any) -> None:
    """Approving compensations is a permission of its own: RBAC verb ``approve`` (rule 8)."""
    what = f"RollbackRequest {namespace}/{name}"
    spec = _parse(RollbackRequestSpec, body.get("spec"), what)
    steps, all_now = rules.new_approvals((old or {}).get("spec"), body.get("spec") or {})
    if not steps and not all_now:
        return
    if steps:
        run = runtime.state().kube.get("runs", namespace, spec.run_ref.name)
        if run is not None:
            refusal = rules.check_approvals(_parse(RunSpec, run.get("spec"), f"Run {namespace}/{spec.run_ref.name}"),
                                            steps)
            if refusal is not None:
                raise kopf.AdmissionError(f"{what}: {refusal.message}", code=422)
    if not _may_approve(userinfo, namespace, name):
        which = "all compensations (approveCompensations)" if all_now else f"step(s) {steps}"
        raise kopf.AdmissionError(
            f"{_user(userinfo)} may not approve {which} of {what}: approving needs the RBAC verb \"approve\" "
            f"on rollbackrequests.reversi.dev in namespace {namespace}; ask for a Role granting it", code=403)


def _may_approve(userinfo: dict, namespace: str, name: str) -> bool:
    """A SubjectAccessReview for the caller: verb approve on rollbackrequests."""
    return _allowed(userinfo, namespace, G, "rollbackrequests", "approve", name)


def _allowed(userinfo: dict, namespace: str, group: str, resource: str, verb: str, name: str | None) -> bool:
    """Whether the caller may ``verb`` ``resource`` (a SubjectAccessReview with their identity)."""
    info = userinfo or {}
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=info.get("username"), groups=info.get("groups"), uid=info.get("uid"), extra=info.get("extra"),
        resource_attributes=client.V1ResourceAttributes(
            group=group, resource=resource, verb=verb, namespace=namespace, name=name)))
    result = client.AuthorizationV1Api(runtime.state().kube.api).create_subject_access_review(review)
    return bool(result.status and result.status.allowed)


def _secrets_named(runner: Any) -> list[str]:
    """Secrets a runner's container reads: env secretKeyRef and envFrom secretRef."""
    names = []
    for env in runner.env:
        ref = ((env.get("valueFrom") or {}) if isinstance(env, dict) else {}).get("secretKeyRef") or {}
        if isinstance(ref, dict) and ref.get("name"):
            names.append(ref["name"])
    for src in runner.env_from:
        ref = (src.get("secretRef") or {}) if isinstance(src, dict) else {}
        if isinstance(ref, dict) and ref.get("name"):
            names.append(ref["name"])
    return sorted(set(names))


def _validation_message(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg')}"


# ------------------------------------------------------------------ manifests and halts: shape

@kopf.on.validate(G, V, "toolmanifests", id="validate-toolmanifest", operations=OPS, persistent=True)
def validate_tool_manifest(body: Any, namespace: str, name: str, userinfo: dict, warnings: list[str],
                           **_: Any) -> None:
    """Shape, templates, runners the API server would accept as Job containers, and permission:
    a runner runs with the namespace's Secrets and service accounts, so its author must be allowed
    to create Jobs there and to read every Secret it names."""
    what = f"ToolManifest {namespace}/{name}"
    spec = _parse(ToolManifestSpec, body.get("spec"), what)
    refusal = rules.check_templates(spec)
    if refusal is not None:
        raise kopf.AdmissionError(f"{what}: {refusal.message}", code=422)
    state = runtime.state()
    for runner in spec.runners:
        texts = [runner.image, *runner.command, *runner.args,
                 *[str(e.get("value", "")) for e in runner.env if isinstance(e, dict)]]
        if any("${" in t for t in texts):
            warnings.append(f"runner {runner.name!r} has a ${{...}} placeholder in its image, command, args or "
                            "env: Kubernetes does not fill those in (only $(VAR) from the container's env)")
        needs = [("batch", "jobs", "create", None)]
        needs += [("", "secrets", "get", secret) for secret in _secrets_named(runner)]
        for group, resource, verb, obj in needs:
            if not _allowed(userinfo, namespace, group, resource, verb, obj):
                target = f"secret {obj!r}" if obj else "jobs"
                raise kopf.AdmissionError(
                    f"{what}: runner {runner.name!r} would run with {target}, but {_user(userinfo)} may not "
                    f"{verb} {target} in namespace {namespace}; a runner cannot grant more than its author has",
                    code=403)
        _, job = build_job(owner=Owner(namespace, "dry-run", "00000000-0000-0000-0000-000000000000"),
                           run_name="dry-run", run_uid="dry-run", step=0, attempt=1, runner=runner,
                           call={}, idempotency_key="0" * 64)
        job["metadata"]["ownerReferences"] = []
        try:
            client.BatchV1Api(state.kube.api).create_namespaced_job(namespace, job, dry_run="All")
        except (ApiException, ValidationError) as err:
            # the API server's validation, or the client's own (it checks shapes before sending)
            message = _validation_message(err) if isinstance(err, ValidationError) else api_message(err)
            raise kopf.AdmissionError(f"{what}: runner {runner.name!r} would not make a valid Job: {message}",
                                      code=422) from err


@kopf.on.validate(G, V, "halts", id="validate-halt", operations=OPS, persistent=True)
def validate_halt(body: Any, namespace: str, name: str, warnings: list[str], **_: Any) -> None:
    spec = _parse(HaltSpec, body.get("spec"), f"Halt {namespace}/{name}")
    _glob_warnings(spec, warnings)


@kopf.on.validate(G, V, "clusterhalts", id="validate-clusterhalt", operations=OPS, persistent=True)
def validate_cluster_halt(body: Any, name: str, warnings: list[str], **_: Any) -> None:
    spec = _parse(ClusterHaltSpec, body.get("spec"), f"ClusterHalt {name}")
    _glob_warnings(spec, warnings)


def _glob_warnings(spec: Any, warnings: list[str]) -> None:
    """Halt globs have ``*``, ``?`` and ``\\`` only: say so when a pattern looks like it expects more."""
    for field, pattern in (spec.scope.model_dump(exclude_none=True) if spec.scope else {}).items():
        if any(ch in pattern for ch in "[]{}"):
            warnings.append(f"scope.{field} {pattern!r}: halt globs have no [...] or {{...}}; those characters "
                            "match only themselves (only * and ? are special)")

