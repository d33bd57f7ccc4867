"""Admission webhooks, served by ``reversi-admission`` (kopf), a process apart from the operator.

Mutating (they stamp what must come from the server, never from the client):

- ``/mutate-run``: ``spec.principal`` from the authenticated user on create (rule 10); each new
  step's ``snapshot`` from the current ToolManifest and its ``recordedAt`` (an inline journal
  given on create); each new resolution's ``actor`` and ``resolvedAt`` (rule 7); with the archive
  on (``settings.archive_enabled``), the finalizer ``reversi.dev/archive`` on create
  (docs/operations.md#a-run-deleted-by-hand).
- ``/mutate-runstep``: records a step. On create it stamps the Run as owner, the labels, the
  snapshot, ``recordedAt`` and ``principal``, then checks the journal's rules (rules 7, 9-12,
  forward duplicates, sizes): the one webhook a recorded call crosses. The outcome write crosses
  none: the API server's ValidatingAdmissionPolicy checks it (:mod:`reversi.adapters.webhooks`).
- ``/mutate-rollbackrequest``: each new approval's ``approver``/``approvedAt`` and
  ``approvedBy`` when ``approveCompensations`` is set (rule 8); each new denial's and force's
  ``actor`` and time.

Validating (each refusal says what to fix):

- ``/validate-run``: halts (rule 9, ``kill switch: <reason>``), the principal (rule 10), tools
  without a manifest entry in enforce mode, forward duplicates, resolutions of steps that are not
  intended or uncertain (rule 7), and the spec's shape;
- ``/validate-runstep``: a step's later writes that are not an outcome write (a resolution, a
  client-side apply) and its deletion;
- ``/validate-rollbackrequest``: approving needs the RBAC verb ``approve`` on
  ``rollbackrequests`` (a SubjectAccessReview for the caller), forcing a step (``spec.force``)
  the verb ``force``, and the spec's shape;
- ``/validate-toolmanifest``, ``/validate-halt``, ``/validate-clusterhalt``: the spec's shape and
  references (e.g. a compensation's runner must exist).

Whatever a CRD CEL rule checks without identity or other objects (append-only steps, immutable
mode, scope, runRef, principal) stays a CEL rule. ``failurePolicy: Fail``: when no admission
replica answers, writes of these kinds are refused rather than let through unchecked — a Halt must
hold (the SDK tries such a write again for a while: it never landed). Where each rule is enforced:
docs/operations.md#admission-where-each-rule-is-enforced.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass, field
import logging
from typing import Any, cast
from collections.abc import Callable

import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import BaseModel, ValidationError

from ..adapters import journal as jr
from ..adapters.jobs import Owner, build_job
from ..adapters import apicalls as calls
from ..adapters.kube import Kube, api_message
from ..adapters import run_tree as tree_io
from ..engine import acknowledgement
from ..engine import admission as rules
from ..engine import archive as archive_rules
from ..engine.graph import InvalidRun, build_graph
from ..engine.journal import assemble
from ..engine.keys import forward_key, snapshot_id
from ..engine.templates import MissingValue
from ..engine import nested_runs as tree_rules
from ..engine import kube as kube_rules
from ..models.halt import ClusterHaltSpec, HaltSpec
from ..models.rollbackrequest import RollbackRequestSpec
from ..models.run import LABEL_PARENT, LABEL_RECORD, LABEL_ROOT, RunSpec
from ..models.runstep import (LABEL_FORWARD_KEY, LABEL_RUN, MAX_CALL_BYTES, MAX_RUN_NAME, MAX_RUN_STEPS,
                              RunStepSpec, forward_key_label, step_name)
from ..models.toolmanifest import ToolManifestSpec, ToolSpec
from . import indices as ix
from . import runtime

log = logging.getLogger("reversi.admission")
G, V = "reversi.dev", "v1alpha1"

OPS: list[kopf.Operation] = ["CREATE", "UPDATE"]


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _user(userinfo: dict | None) -> str:
    return (userinfo or {}).get("username") or "system:anonymous"


def _parse(model: type[BaseModel], spec: Any, what: str) -> Any:
    """``spec`` validated by ``model``; a malformed spec is refused (422) with the first problems,
    each naming its field as the schema would (``spec.approvals.0.step: Input should be a valid
    integer``). Every webhook parses before it reads a field: the object is untrusted."""
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise kopf.AdmissionError(f"{what} is invalid: spec: must be an object (field: value), not "
                                  f"{type(spec).__name__}", code=422)
    try:
        return model.model_validate(spec)
    except ValidationError as err:
        problems = []
        for e in err.errors()[:3]:
            loc = ".".join(str(p) for p in e.get("loc", ()) if p != "__root__")
            msg = "unknown field: check its spelling" if e.get("type") == "extra_forbidden" else e.get("msg")
            problems.append(f"spec.{loc}: {msg}" if loc else f"spec: {msg}")
        raise kopf.AdmissionError(f"{what} is invalid: " + "; ".join(problems), code=422) from err


def untrusted(fn: Callable[..., None]) -> Callable[..., None]:
    """Run a webhook handler so that no input reaches the client as a stack trace: refusals pass
    through; an API error becomes a 503 that says what could not be read; anything else is logged
    with its traceback and answered with a message that says it is the operator's fault."""

    @functools.wraps(fn)
    def guarded(**kwargs: Any) -> None:
        try:
            fn(**kwargs)
        except kopf.AdmissionError:
            raise
        except ApiException as err:
            raise kopf.AdmissionError(f"the operator could not check this object: the API server answered "
                                      f"{err.status} ({api_message(err)}); try again", code=503) from err
        except Exception as err:  # a bug must not show the client a Python error
            log.exception("webhook %s failed", fn.__name__)
            raise kopf.AdmissionError("the operator could not check this object because of an error of its own "
                                      "(logged with its traceback by the operator); please report it",
                                      code=500) from err

    return guarded


def _manifest(parts: runtime.Parts, namespace: str, name: str | None) -> ToolManifestSpec | None:
    return ix.manifest(parts.indices, namespace, name, parts.kube)


def _raw(fn: Callable[[dict], None]) -> Callable[[kopf.RawBody], None]:
    """A patch function for ``patch.fns``: kopf calls it with the object as a plain dict (its
    ``RawBody`` type lists fewer metadata fields than these functions set, e.g. ownerReferences)."""
    return cast(Callable[[kopf.RawBody], None], fn)


# ------------------------------------------------------------------------------------- runs

@kopf.on.mutate(G, V, "runs", id="mutate-run", operations=OPS, persistent=True)
@untrusted
def mutate_run(body: Any, old: Any, patch: kopf.Patch, userinfo: dict, operation: str, namespace: str,
               memo: kopf.Memo, name: str | None = None, **_: Any) -> None:
    """Stamp the principal, new steps' snapshots and times, and new resolutions' actors (of a
    valid spec only: a malformed one is refused here, with the field)."""
    ref = (body.get("spec") or {}).get("parentRef") if isinstance(body.get("spec"), dict) else None
    if isinstance(ref, dict) and "namespace" in ref:
        raise kopf.AdmissionError(f"Run {namespace}/{name or ''}: spec.parentRef has no namespace: a parent Run is in "
                                  "the same namespace as its child; remove spec.parentRef.namespace and name a Run of "
                                  f"namespace {namespace}", code=422)
    _parse(RunSpec, body.get("spec"), f"Run {namespace}/{name or body.get('metadata', {}).get('generateName', '')}")
    user = _user(userinfo)
    spec = body.get("spec") or {}
    old_spec = _valid_or_empty((old or {}).get("spec"))
    if operation == "CREATE":
        patch.spec["principal"] = user
    elif old_spec.get("principal") and not spec.get("principal"):
        patch.spec["principal"] = old_spec["principal"]  # a client-side apply sends what it knows
    parts = runtime.parts(memo)
    _pin_manifest(parts.kube, namespace, spec, old_spec, operation, patch)
    family = _family(parts.kube, namespace, spec, old, operation)
    manifest_ref = spec.get("manifestRef")
    manifest = _manifest(parts, namespace, manifest_ref.get("name") if isinstance(manifest_ref, dict) else None)
    old_steps = {s.get("index"): s for s in old_spec.get("steps") or [] if isinstance(s, dict)}
    old_res = {r.get("step"): r for r in old_spec.get("resolutions") or [] if isinstance(r, dict)}
    known_steps = set(old_steps)
    now = _now()
    last_request = acknowledgement.residue_request(old or {})  # the rollback whose residue stands

    def stamp(raw: dict) -> None:
        s = raw.get("spec")
        if not isinstance(s, dict):
            return
        _stamp_acknowledgement(old_spec.get("acknowledgement"), s, user, now, last_request)
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
        _stamp(s.get("resolutions"), old_res, ("actor", "resolvedAt"), user, now)
        family(raw)
        _label_recording(raw)
        if operation == "CREATE" and parts.settings.archive_enabled:
            _hold_for_archive(raw)

    patch.fns.append(_raw(stamp))


def _pin_manifest(kube: Kube, namespace: str, spec: dict, old_spec: dict, operation: str, patch: kopf.Patch) -> None:
    """``spec.pinnedManifest`` of a Run: on create, its ToolManifest as the API server holds it
    now (a consistent read: its ``metadata.generation`` and tool entries; none when the manifest
    does not exist or is invalid), whatever the client sent; on update, the pin it had (it never
    changes). A step that carries no snapshot of its own is undone by its entry here
    (docs/concepts.md#the-journal). Raises ``ApiException`` when the read fails."""
    if operation != "CREATE":
        if spec.get("pinnedManifest") != old_spec.get("pinnedManifest"):
            patch.spec["pinnedManifest"] = old_spec.get("pinnedManifest")
        return
    ref = spec.get("manifestRef")
    name = ref.get("name") if isinstance(ref, dict) else None
    obj = kube.get("toolmanifests", namespace, name) if isinstance(name, str) and name else None
    pin = None
    if obj is not None:
        try:
            manifest = ToolManifestSpec.model_validate(obj.get("spec") or {})
        except ValidationError:
            manifest = None
        if manifest is not None:
            pin = {"revision": obj["metadata"].get("generation", 1), "tools": [t.to_wire() for t in manifest.tools]}
    if pin is not None or "pinnedManifest" in spec:
        patch.spec["pinnedManifest"] = pin


def _stamp_acknowledgement(old: Any, spec: dict, user: str, now: str, last_request: str | None) -> None:
    """A new or changed ``spec.acknowledgement`` gets the authenticated user, the server's time
    and the request whose residue it accepts (the run's ``status.standing.request`` now,
    :func:`reversi.engine.acknowledgement.residue_request`); one whose
    note is unchanged keeps its stamps, whatever the client sent (docs/concepts.md#acknowledging-residue)."""
    new = spec.get("acknowledgement")
    if not isinstance(new, dict):
        return
    if acknowledgement.changed(old, new):
        new.update(actor=user, acknowledgedAt=now)
        if last_request is None:
            new.pop("request", None)
        else:
            new["request"] = last_request
    else:
        for f in ("actor", "acknowledgedAt", "request"):
            if isinstance(old, dict) and f in old:
                new[f] = old[f]
            else:
                new.pop(f, None)


def _check_acknowledgement(kube: Kube, old: dict, spec: RunSpec, old_spec: RunSpec, userinfo: dict, namespace: str,
                           name: str, what: str) -> None:
    """Setting, changing or withdrawing ``spec.acknowledgement`` needs the RBAC verb
    ``acknowledge`` on runs (a SubjectAccessReview for the caller), and setting one needs an
    incomplete rollback that has finished. Raises ``kopf.AdmissionError`` (403, 409)."""
    old_ack = old_spec.acknowledgement.model_dump(by_alias=True) if old_spec.acknowledgement else None
    new_ack = spec.acknowledgement.model_dump(by_alias=True) if spec.acknowledgement else None
    if not acknowledgement.changed(old_ack, new_ack):
        return
    if not _allowed(kube, userinfo, namespace, G, "runs", "acknowledge", name):
        raise kopf.AdmissionError(f"{what}: acknowledging a run's residue needs the RBAC verb acknowledge on runs "
                                  f"(reversi.dev), which {_user(userinfo)} does not have: bind the role "
                                  "reversi-acknowledge (docs/operations.md#rbac)", code=403)
    if new_ack is not None:
        problem = acknowledgement.problem(old, name)
        if problem is not None:
            raise kopf.AdmissionError(f"{what}: {problem}", code=409)


def _family(kube: Kube, namespace: str, spec: dict, old: Any, operation: str) -> Callable[[dict], None]:
    """What a Run's place in a tree needs from the server (nested runs, rule 17): on create,
    ``spec.parentRef.step`` = the parent's step count now (a client's value is overwritten) and the
    labels ``reversi.dev/parent`` and ``reversi.dev/root`` (a client's are dropped); on update the
    old values are kept (a client-side apply sends what it knows; a changed parent is refused by
    the CRD: parentRef is immutable)."""
    ref = spec.get("parentRef")
    parent = ref.get("name") if isinstance(ref, dict) and isinstance(ref.get("name"), str) else None
    old_obj: Any = old or {}
    old_labels = (old_obj.get("metadata") or {}).get("labels") or {}
    old_ref = (old_obj.get("spec") or {}).get("parentRef")
    labels: dict[str, str] = {}
    step: int | None = None
    if operation == "CREATE" and parent is not None:
        parent_obj = kube.get("runs", namespace, parent)
        if parent_obj is not None:  # else refused by the validating webhook
            step = jr.count_steps(kube.custom, namespace, parent)
            labels = {LABEL_PARENT: parent, LABEL_ROOT: tree_io.root_of(parent_obj)}
    elif operation != "CREATE":
        labels = {k: old_labels[k] for k in (LABEL_PARENT, LABEL_ROOT) if k in old_labels}
        if isinstance(old_ref, dict) and old_ref.get("name") == parent and isinstance(old_ref.get("step"), int):
            step = old_ref["step"]

    def apply(raw: dict) -> None:
        meta = raw.setdefault("metadata", {})
        kept = {k: v for k, v in (meta.get("labels") or {}).items() if k not in (LABEL_PARENT, LABEL_ROOT)}
        meta["labels"] = {**kept, **labels}
        s = raw.get("spec")
        if isinstance(s, dict) and isinstance(s.get("parentRef"), dict):
            if step is None:
                s["parentRef"].pop("step", None)
            else:
                s["parentRef"]["step"] = step

    return apply


def _valid_or_empty(spec: Any) -> dict:
    """An old object's spec as a dict (it was admitted; anything else is treated as empty)."""
    return spec if isinstance(spec, dict) else {}


def _stamp(entries: list | None, old: dict, fields: tuple[str, str], user: str, now: str) -> None:
    """Stamp ``fields`` (who, when) on each entry of a list keyed by ``step`` (approvals,
    denials, forces, resolutions): a new entry gets the authenticated ``user`` and the server's
    ``now``, never what the client sent; an entry that was there before (``old``, by step) keeps
    its stamps (:func:`_carry`). Entries that are not objects are left to the schema."""
    for entry in entries or []:
        if not isinstance(entry, dict):
            continue
        if entry.get("step") in old:
            _carry(old[entry["step"]], entry, fields)
        else:
            entry[fields[0]], entry[fields[1]] = user, now


def _carry(old: dict, new: dict, fields: tuple[str, ...]) -> None:
    """Keep server-stamped fields of an entry the client sent back without them (client-side
    ``kubectl apply`` sends only what is in the file)."""
    if any(f in new for f in fields):
        return
    for f in fields:
        if f in old:
            new[f] = old[f]


def _hold_for_archive(raw: dict) -> None:
    """Put the archive's finalizer on a new Run, so a person's delete waits until its record is
    in the archive, from the Run's first moment (docs/operations.md#a-run-deleted-by-hand); the
    operator removes it, and puts it on Runs made before the archive was on."""
    meta = raw.setdefault("metadata", {})
    held = meta.get("finalizers") if isinstance(meta.get("finalizers"), list) else []
    meta["finalizers"] = archive_rules.with_finalizer([f for f in held if isinstance(f, str)])


def _label_recording(raw: dict) -> None:
    """Label a Run that records a ServiceAccount's writes (:data:`reversi.models.run.LABEL_RECORD`): the
    recording webhook watches those Runs only; a client's label on any other Run is dropped."""
    record = (raw.get("spec") or {}).get("record")
    meta = raw.setdefault("metadata", {})
    labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
    account = record.get("serviceAccount") if isinstance(record, dict) else None
    if isinstance(account, str) and account:
        meta["labels"] = {**labels, LABEL_RECORD: account if len(account) <= 63 else "long"}
    elif LABEL_RECORD in labels:
        meta["labels"] = {k: v for k, v in labels.items() if k != LABEL_RECORD}


def _check_record(kube: Kube, spec: RunSpec, userinfo: dict, namespace: str, what: str) -> None:
    """A Run that records a ServiceAccount's writes (docs/concepts.md#recording-with-no-agent-code) is
    created by that ServiceAccount or by a user who may act as it (create its tokens), and pins a
    ToolManifest with the built-in kube family; refused otherwise, with what to do."""
    if spec.record is None:
        return
    account = spec.record.service_account
    if _user(userinfo) != spec.record.username(namespace) and \
            not _allowed(kube, userinfo, namespace, "", "serviceaccounts", "create", account, subresource="token"):
        raise kopf.AdmissionError(f"{what}: spec.record names ServiceAccount {namespace}/{account}; only that "
                                  "ServiceAccount, or a user who may act as it (create its tokens), may have its "
                                  f"writes recorded, and {_user(userinfo)} is neither: create the Run as {account}, "
                                  "or get create on serviceaccounts/token for it", code=403)
    pinned = spec.pinned_manifest
    if pinned is None or pinned.tool(kube_rules.PATCH) is None:
        raise kopf.AdmissionError(f"{what}: spec.record needs ToolManifest {namespace}/{spec.manifest_ref.name} to "
                                  "exist with the built-in kube family when the run is opened (its steps are "
                                  "undone by it): add it with kubectl reversi kube-manifest -n "
                                  f"{namespace} --image <operator image> --service-account <runner's account> | "
                                  "kubectl apply -f -, then create the Run",
                                  code=422)


def _record_warnings(kube: Kube, spec: RunSpec, namespace: str, what: str, warnings: list[str]) -> None:
    """What a new Run that records a ServiceAccount's writes should know but is not refused for: the account
    does not exist (yet), so no write of it is recorded until it does (a typo records nothing, silently
    otherwise). Unreadable (no right): nothing said (docs/concepts.md#recording-with-no-agent-code)."""
    if spec.record is None:
        return
    account = spec.record.service_account
    try:
        calls.call(kube.core.read_namespaced_service_account, account, namespace)
    except ApiException as err:
        if err.status == 404:
            warnings.append(f"{what}: spec.record names ServiceAccount {namespace}/{account}, which does not exist: "
                            "no write is recorded until it does; check the name (kubectl get serviceaccounts -n "
                            f"{namespace})")
        else:
            log.info("%s: ServiceAccount %s/%s not read (%s): no warning given", what, namespace, account, err.status)


@kopf.on.validate(G, V, "runs", id="validate-run", operations=OPS, persistent=True, side_effects=True)
@untrusted
def validate_run(body: Any, old: Any, userinfo: dict, dryrun: bool, namespace: str, name: str, operation: str,
                 memo: kopf.Memo, warnings: list[str], **kwargs: Any) -> None:
    """Refuse what rules 7, 9 and 10 forbid, and forward duplicates, in an inline journal given on
    create (an import, moved into RunSteps by the operator); on update the inline journal never
    changes."""
    parts = runtime.parts(memo)
    ix.capture(parts, kwargs)
    what = f"Run {namespace}/{name}"
    if operation == "CREATE" and len(name) > MAX_RUN_NAME:
        raise kopf.AdmissionError(f"{what}: a Run name is at most {MAX_RUN_NAME} characters (it labels the run's "
                                  f"RunSteps); this one has {len(name)}: choose a shorter name", code=422)
    spec = _parse(RunSpec, body.get("spec"), what)
    old_spec = _parse(RunSpec, old.get("spec"), what) if old else None
    user = _user(userinfo)
    if old_spec is not None:
        refusal = rules.check_principal(old_spec, spec, user, what)
        if refusal is None:
            _check_inline_frozen(old_spec, spec, namespace, name, what)
            _check_acknowledgement(parts.kube, old, spec, old_spec, userinfo, namespace, name, what)
        else:
            _refuse(parts, refusal, namespace, user, what, dryrun)
        return
    if spec.acknowledgement is not None:
        raise kopf.AdmissionError(f"{what}: a new run has no rollback to acknowledge: remove spec.acknowledgement",
                                  code=422)
    if spec.parent_ref is not None:
        _check_parent(parts.kube, namespace, name, spec.parent_ref.name, what)
    _check_record(parts.kube, spec, userinfo, namespace, what)
    _record_warnings(parts.kube, spec, namespace, what, warnings)
    try:
        build_graph(spec)
    except InvalidRun as err:
        raise kopf.AdmissionError(f"{what}: {err}", code=422) from err
    refusal = rules.check_resolutions(None, spec)
    added = spec.steps
    if refusal is None and added:
        for step in added:
            refusal = refusal or rules.check_call_size(step, MAX_CALL_BYTES)
    if refusal is None and added:
        halts = _halts(parts.kube, namespace)
        refusal = rules.check_halts(halts, namespace, spec, added)
        if refusal is None:
            manifest = _manifest(parts, namespace, spec.manifest_ref.name)
            refusal = rules.check_tools(spec, added, manifest, f"{namespace}/{spec.manifest_ref.name}")
            refusal = refusal or rules.check_recovery(spec, added, manifest)
            if refusal is None:
                refusal = rules.check_duplicates(spec, added, set(), manifest)
    if refusal is not None:
        _refuse(parts, refusal, namespace, user, what, dryrun)


def _check_parent(kube: Kube, namespace: str, name: str, parent: str, what: str) -> None:
    """A new child Run (nested runs, rule 17): its parent exists in the same namespace, is
    not the run itself, makes no cycle, nests at most 8 deep, its tree stays within 64 runs below
    the root, and it is open (a parent being rolled back, or rolled back, takes no new child, as it
    takes no new step)."""
    chain = tree_io.ancestry(kube, namespace, name, parent) if parent != name else []
    root = tree_rules.root_of(name, chain)
    below = tree_io.count_below(kube, namespace, root) if chain and chain[0] is not None else 0
    problem = tree_rules.ancestry_problem(name, parent, chain, below)
    if problem is not None:
        raise kopf.AdmissionError(f"{what}: {problem}", code=422)
    parent_obj = kube.get("runs", namespace, parent) or {}
    status = parent_obj.get("status") or {}
    closed = rules.check_run_open(status.get("activeRequest"), status.get("closedBy"),
                                  f"parent Run {namespace}/{parent}")
    if closed is not None:
        raise kopf.AdmissionError(f"{what}: {closed.message.replace('new steps', 'new steps or child runs')}",
                                  code=403)


def _check_inline_frozen(old: RunSpec, new: RunSpec, namespace: str, name: str, what: str) -> None:
    """The inline journal of Reversi 0.1 takes no new steps or resolutions: it is moved into
    RunSteps by the operator and stays as it was recorded."""
    if new.steps != old.steps or new.resolutions != old.resolutions or new.snapshots != old.snapshots:
        raise kopf.AdmissionError(
            f"{what}: spec.steps, spec.snapshots and spec.resolutions are the inline journal of Reversi 0.1 and take "
            "no changes: record steps as RunSteps (the SDK does; see docs/concepts.md#the-journal) and settle a step "
            "with its RunStep's spec.resolution (kubectl reversi resolve)", code=422)


def _refuse(parts: runtime.Parts, refusal: rules.Refusal, namespace: str, user: str, what: str, dryrun: bool) -> None:
    """Count and log a refused call, then raise it as the admission answer."""
    if not dryrun:
        if parts.metrics:
            parts.metrics.refused_call(namespace, refusal.tool, refusal.reason)
        if refusal.halt is not None:
            _count_refusal(parts.kube, *refusal.halt)
    log.info("%s: refused (%s) for %s: %s", what, refusal.reason, user, refusal.message)
    codes = {rules.HALTED: 403, rules.FOREIGN_PRINCIPAL: 403, rules.RUN_CLOSED: 403}
    raise kopf.AdmissionError(refusal.message, code=codes.get(refusal.reason, 422))


# --------------------------------------------------------------------------------- runsteps

def _inline_step(moves: runtime.InlineMoves, run_obj: dict, index: int) -> dict | None:
    """The Run's inline step ``index`` (Reversi 0.1), as the RunStep spec it moves to, or None.
    The parsed inline journal is kept per Run version in ``moves`` (the process's
    ``parts.inline``) while it is being moved (each moved step is one review: parsing the whole
    run each time would make the move quadratic)."""
    inline = (run_obj.get("spec") or {}).get("steps") or []
    if not inline:
        return None
    meta = run_obj["metadata"]
    key = (meta["namespace"], meta["name"], meta["resourceVersion"])
    parsed = moves.parsed
    cached = parsed.get(key)
    if cached is None:
        try:
            run_spec = RunSpec.model_validate(run_obj.get("spec") or {})
        except ValidationError:
            return None
        cached = (run_spec, {s.index: s for s in run_spec.steps})
        with moves.lock:
            if len(parsed) >= runtime.INLINE_KEPT and key not in parsed:
                parsed.pop(next(iter(parsed)))
            parsed[key] = cached
    run_spec, by_index = cached
    step = by_index.get(index)
    return jr.inline_step_spec(run_spec, step) if step is not None else None


def _same_call(inline: dict, spec: dict) -> bool:
    """Whether a RunStep spec is the moved copy of an inline step (the same record)."""
    return {k: v for k, v in spec.items() if k != "runRef"} == inline


@kopf.on.mutate(G, V, "runsteps", id="mutate-runstep", operations=OPS, persistent=True, side_effects=True)
@untrusted
def mutate_run_step(body: Any, old: Any, patch: kopf.Patch, userinfo: dict, operation: str, namespace: str,
                    memo: kopf.Memo, dryrun: bool = False, **kwargs: Any) -> None:
    """Record one step: on create, stamp what must come from the server (the Run as owner, the run
    and forward-key labels, the tool's manifest entry as ``snapshot``, ``recordedAt``, the
    ``principal``) and check the journal's rules (:func:`_check_new_step`), so that recording a
    call crosses one webhook (the API server calls this one again if a later mutation changes the
    step). On update, put back what a client dropped and stamp a new resolution's ``actor`` and
    ``resolvedAt``. Refuses a step past the run's limit (before the schema would, so the message
    says why)."""
    parts = runtime.parts(memo)
    ix.capture(parts, kwargs)
    user = _user(userinfo)
    spec = body.get("spec")
    index = spec.get("index") if isinstance(spec, dict) else None
    run = ((spec.get("runRef") or {}) if isinstance(spec, dict) and isinstance(spec.get("runRef"), dict)
           else {}).get("name")
    if isinstance(index, int) and not isinstance(index, bool) and index >= MAX_RUN_STEPS:
        raise kopf.AdmissionError(f"Run {namespace}/{run} has reached the limit of {MAX_RUN_STEPS:,} steps "
                                  f"(step {index} refused): open a new Run for further calls", code=422)
    name = kwargs.get("name") or (body.get("metadata") or {}).get("name") or ""
    what = f"RunStep {namespace}/{name}"
    parsed = _parse(RunStepSpec, spec, what)
    assert isinstance(spec, dict) and isinstance(run, str) and isinstance(index, int)
    now = _now()
    if operation != "CREATE":
        patch.fns.append(_raw(_carry_step_stamps((old or {}).get("spec") or {}, (old or {}).get("metadata") or {},
                                                 user, now)))
        return
    reads = _read_for_new_step(parts, namespace, run, index, body)
    run_obj = reads.run
    if run_obj is None:
        raise kopf.AdmissionError(f"{what}: Run {namespace}/{run} not found: open the run before recording its steps "
                                  "(Recorder.open creates it)", code=404)
    run_spec = run_obj.get("spec") or {}
    ref = run_spec.get("manifestRef")
    manifest = _manifest(parts, namespace, ref.get("name") if isinstance(ref, dict) else None)
    tool = spec.get("tool")
    entry = manifest.tool(tool) if manifest and isinstance(tool, str) else None
    inline = _inline_step(parts.inline, run_obj, index)
    moved = inline is not None and _same_call(inline, spec)
    if not moved:
        _check_new_step(parts, parsed, name, run_obj, manifest, entry, user, namespace, dryrun, reads)
    label = _forward_key_label_of(spec, _carried_snapshot(spec) if moved else entry)
    owner = jr.owner_reference(run, run_obj["metadata"]["uid"])
    principal = run_spec.get("principal") if moved else user
    patch.fns.append(_raw(_stamp_new_step(run, owner, label, principal, moved, entry, now)))


def _carried_snapshot(spec: dict) -> ToolSpec | None:
    """The manifest entry a step carries in its own ``spec.snapshot`` (the moved copy of an inline
    step keeps the one it was recorded with), or None when it has none or it is malformed."""
    raw_snapshot = spec.get("snapshot")
    try:
        return ToolSpec.model_validate(raw_snapshot) if isinstance(raw_snapshot, dict) else None
    except ValidationError:
        return None


def _forward_key_label_of(spec: dict, snapshot: ToolSpec | None) -> str | None:
    """The forward-key label of a step (its tool's ``idempotencyKey`` resolved from its args, as
    :func:`forward_key_label`), or None when ``snapshot`` has no key template or the step's args
    do not give it a value."""
    tool = spec.get("tool")
    if (snapshot is None or not snapshot.idempotency_key or not isinstance(tool, str)
            or not isinstance(spec.get("args"), dict)):
        return None
    try:
        return forward_key_label(tool, forward_key(snapshot.idempotency_key, spec["args"], None))
    except (MissingValue, TypeError, ValueError):
        return None


def _stamp_new_step(run: str, owner: dict, label: str | None, principal: str | None, moved: bool,
                    entry: ToolSpec | None, now: str) -> Callable[[dict], None]:
    """The patch function that stamps a new RunStep: the labels ``reversi.dev/run`` (``run``) and,
    when ``label`` is set, the forward key; ``owner`` as its one Run owner; ``principal`` (or none);
    and unless the step is an inline step ``moved`` with its own snapshot and time, the manifest
    ``entry`` as ``snapshot`` (none: unmanifested) and ``now`` as ``recordedAt``."""

    def stamp(raw: dict) -> None:
        meta = raw.setdefault("metadata", {})
        labels = dict(meta.get("labels") or {})
        labels[LABEL_RUN] = run
        labels.pop(LABEL_FORWARD_KEY, None)
        if label:
            labels[LABEL_FORWARD_KEY] = label
        meta["labels"] = labels
        refs = [r for r in meta.get("ownerReferences") or [] if isinstance(r, dict) and r.get("kind") != "Run"]
        meta["ownerReferences"] = [*refs, owner]
        s = raw.get("spec")
        if not isinstance(s, dict):
            return
        if principal:
            s["principal"] = principal  # the authenticated user, never what the client said
        else:
            s.pop("principal", None)
        if moved:
            return  # a moved step keeps its own snapshot and time
        if entry is None:
            s.pop("snapshot", None)  # no manifest entry: unmanifested, whatever the client said
        else:
            s["snapshot"] = entry.to_wire()
        s["recordedAt"] = now  # the server's clock, not the client's

    return stamp


@dataclass(frozen=True)
class NewStepReads:
    """What checking a new step reads: its Run (None: there is none), the previous step (None:
    not recorded, or the step is the first), and the halts in force for its namespace."""

    run: dict | None
    previous: dict | None = None
    halts: list[rules.HaltView] = field(default_factory=list)


def _read_for_new_step(parts: runtime.Parts, namespace: str, run: str, index: int, body: dict) -> NewStepReads:
    """Everything :func:`_check_new_step` reads, read at once: the Run, the previous step and the
    two kinds of halt do not depend on one another, so a review waits for the slowest of these
    reads, not for their sum (the moved copy of an inline step needs its Run only, and usually
    no read at all: see :func:`_moved_run`). Raises ``ApiException`` when a read fails."""
    cached = _moved_run(parts.inline, namespace, run, index, body)
    if cached is not None:
        return NewStepReads(cached)
    kube = parts.kube

    def previous_step() -> dict | None:
        return kube.get("runsteps", namespace, step_name(run, index - 1)) if index > 0 else None

    if parts.reads is None:  # a process with no pool of its own for this: one read after the other
        return NewStepReads(_run_of_step(parts.inline, kube, namespace, run), previous_step(),
                            _halts(kube, namespace))
    run_f = parts.reads.submit(_run_of_step, parts.inline, kube, namespace, run)
    previous_f = parts.reads.submit(previous_step)
    halts_f = parts.reads.submit(_namespace_halts, kube, namespace)
    cluster_halts_f = parts.reads.submit(_cluster_halts, kube)
    return NewStepReads(run_f.result(), previous_f.result(), [*halts_f.result(), *cluster_halts_f.result()])


def _moved_run(moves: runtime.InlineMoves, namespace: str, run: str, index: int, body: dict) -> dict | None:
    """The Run as read for an earlier step of its move (kept in ``moves.runs``, the process's
    ``parts.inline``) when this step is the moved copy of its inline step ``index``, else None.
    Each moved step is one review, and such a Run is megabytes: reading it for each one made the
    move quadratic (a 3,000-step Run moved at a few steps per second). The inline journal never
    changes, so a step that is its moved copy, owned by the same Run (uid), is recognised from
    this copy with no read at all."""
    cached = moves.runs.get((namespace, run))
    if cached is None:
        return None
    inline = _inline_step(moves, cached, index)
    owners = {r.get("uid") for r in (body.get("metadata") or {}).get("ownerReferences") or []
              if isinstance(r, dict) and r.get("kind") == "Run"}
    if inline is not None and _same_call(inline, body.get("spec") or {}) and cached["metadata"]["uid"] in owners:
        return cached
    return None


def _run_of_step(moves: runtime.InlineMoves, kube: Kube, namespace: str, run: str) -> dict | None:
    """The Run a new step belongs to as the API server holds it now (a consistent read: the Run's
    lock decides rule 11), or None when it does not exist; a Run with an inline journal is kept
    in ``moves.runs`` (the process's ``parts.inline``) for the rest of its move (:func:`_moved_run`)."""
    run_obj = kube.get("runs", namespace, run)
    runs = moves.runs
    with moves.lock:
        if run_obj is not None and (run_obj.get("spec") or {}).get("steps"):
            if len(runs) >= runtime.INLINE_KEPT and (namespace, run) not in runs:
                runs.pop(next(iter(runs)))
            runs[(namespace, run)] = run_obj
        else:
            runs.pop((namespace, run), None)
    return run_obj


def _carry_step_stamps(old_spec: dict, old_meta: dict, user: str, now: str) -> Callable[[dict], None]:
    """An update of a RunStep keeps what the server stamped (a client-side apply sends only what
    its file has): snapshot, recordedAt, principal, the run and forward-key labels, the Run as
    owner (dropped or changed: put back); a new resolution gets the authenticated user and the
    server's time."""

    def carry(raw: dict) -> None:
        s = raw.get("spec")
        if isinstance(s, dict):
            for f in ("snapshot", "recordedAt", "principal"):
                if f not in s and f in old_spec:
                    s[f] = old_spec[f]
            res = s.get("resolution")
            if isinstance(res, dict):
                if isinstance(old_spec.get("resolution"), dict):
                    _carry(old_spec["resolution"], res, ("actor", "resolvedAt"))
                else:
                    res["actor"], res["resolvedAt"] = user, now
        labels = raw.setdefault("metadata", {}).setdefault("labels", {}) or {}
        for key in (LABEL_RUN, LABEL_FORWARD_KEY):
            if key in (old_meta.get("labels") or {}):
                labels[key] = old_meta["labels"][key]
        raw["metadata"]["labels"] = labels
        # the Run's owner reference is the server's: dropped or changed, it is put back as stamped
        # (a step must follow its Run, and only its Run, when the Run is deleted)
        old_owner = [r for r in old_meta.get("ownerReferences") or [] if isinstance(r, dict) and r.get("kind") == "Run"]
        if old_owner:
            others = [r for r in raw["metadata"].get("ownerReferences") or []
                      if isinstance(r, dict) and r.get("kind") != "Run"]
            raw["metadata"]["ownerReferences"] = [*others, *old_owner]

    return carry


def _check_new_step(parts: runtime.Parts, spec: RunStepSpec, name: str, run_obj: dict,
                    manifest: ToolManifestSpec | None, entry: ToolSpec | None, user: str, namespace: str, dryrun: bool,
                    reads: NewStepReads) -> None:
    """The journal's rules for a new step, at a cost that does not depend on the run's length:
    the name ``<run>-<index>``, the Run's principal (rule 10) and lock (rule 11), steps in order
    with no gap, size limits, halts (rule 9), tools with no manifest entry in enforce mode, strict
    recovery, forward duplicates (found by their key label); a step is recorded without a
    resolution. ``reads``: the previous step and the halts (:func:`_read_for_new_step`); only a
    forward key and a child run's ancestors are read here. Raises ``kopf.AdmissionError`` with
    what to fix."""
    kube = parts.kube
    what = f"RunStep {namespace}/{name}"
    run = spec.run_ref.name
    run_ref = f"Run {namespace}/{run}"
    expected = step_name(run, spec.index)
    if name != expected:
        raise kopf.AdmissionError(f"{what}: step {spec.index} of {run_ref} must be named {expected} "
                                  "(<run>-<index in five digits>)", code=422)
    if len(run) > MAX_RUN_NAME:
        raise kopf.AdmissionError(f"{what}: {run_ref} has a name longer than {MAX_RUN_NAME} characters, which "
                                  "cannot label its steps: record into a Run with a shorter name", code=422)
    if spec.resolution is not None:
        raise kopf.AdmissionError(f"{what}: a step is recorded without spec.resolution; settle it afterwards "
                                  "(kubectl reversi resolve)", code=422)
    principal = (run_obj.get("spec") or {}).get("principal")
    refusal = rules.check_step_principal(principal, user, run_ref, spec.tool)
    run_status = run_obj.get("status") or {}
    refusal = refusal or rules.check_run_open(run_status.get("activeRequest"), run_status.get("closedBy"), run_ref,
                                              spec.tool)
    if refusal is not None:
        _refuse(parts, refusal, namespace, user, run_ref, dryrun)
    previous = reads.previous
    if spec.index > 0 and previous is None and _inline_step(parts.inline, run_obj, spec.index - 1) is None:
        raise kopf.AdmissionError(f"{what}: step {spec.index - 1} of {run_ref} is not recorded: a run's steps are "
                                  "recorded in order 0, 1, 2, ... (record the previous step first)", code=422)
    step = spec.model_copy(update={"snapshot": entry}).as_step()  # checked as stamped: the server's manifest decides
    try:
        run_spec = RunSpec.model_validate({k: v for k, v in (run_obj.get("spec") or {}).items()
                                           if k not in ("steps", "snapshots", "resolutions")})
    except ValidationError as err:
        raise kopf.AdmissionError(f"{what}: {run_ref} is invalid: {_validation_message(err)}", code=422) from err
    refusal = rules.check_call_size(step, MAX_CALL_BYTES)
    if refusal is None:
        halts = reads.halts
        refusal = rules.check_halts(halts, namespace, run_spec, [step])
        if refusal is None and halts and run_spec.parent_ref is not None:  # a child: its ancestors' scopes too
            refusal = rules.check_halts(halts, namespace, run_spec, [step],
                                        tree_io.ancestors(kube, namespace, run_spec))
    if refusal is None:
        refusal = rules.check_tools(run_spec, [step], manifest, f"{namespace}/{run_spec.manifest_ref.name}")
        refusal = refusal or rules.check_recovery(run_spec, [step], manifest)
    if refusal is None and entry is not None and entry.idempotency_key:
        refusal = _forward_duplicate(kube, namespace, run, step, entry.idempotency_key)
    if refusal is not None:
        _refuse(parts, refusal, namespace, user, run_ref, dryrun)


@kopf.on.validate(G, V, "runsteps", id="validate-runstep", operations=["UPDATE", "DELETE"], persistent=True)
@untrusted
def validate_run_step(body: Any, old: Any, userinfo: dict, dryrun: bool, namespace: str, name: str,
                      operation: str, memo: kopf.Memo, **kwargs: Any) -> None:
    """A recorded step's later writes (its create is checked by :func:`mutate_run_step`): only the
    Run's principal changes the call's outcome (rule 10; an outcome write of a step that carries
    its principal is checked by the API server's own policy and never reaches this webhook),
    size limits, a resolution with a note (rule 7). A RunStep is deleted only with its Run (the
    garbage collector's and the namespace controller's deletes never reach this webhook:
    :data:`reversi.adapters.webhooks.CLEANUP_MATCH`)."""
    parts = runtime.parts(memo)
    ix.capture(parts, kwargs)
    what = f"RunStep {namespace}/{name}"
    kube = parts.kube
    if operation == "DELETE":
        run = (((old or body).get("spec") or {}).get("runRef") or {}).get("name")
        run_obj = kube.get("runs", namespace, run) if isinstance(run, str) else None
        if run_obj is None or run_obj["metadata"].get("deletionTimestamp"):
            return
        raise kopf.AdmissionError(f"{what} is part of the record of Run {namespace}/{run}: a run's steps are "
                                  "deleted with the Run (delete the Run)", code=403)
    spec = _parse(RunStepSpec, body.get("spec"), what)
    old_spec = _parse(RunStepSpec, old.get("spec"), what)
    run_ref = f"Run {namespace}/{spec.run_ref.name}"
    user = _user(userinfo)
    call_changed = (spec.outcome, spec.result, spec.error) != (old_spec.outcome, old_spec.result, old_spec.error)
    refusal = None
    if call_changed:
        principal = old_spec.principal
        if principal is None:  # recorded before steps carried their principal: the Run's
            run_obj = kube.get("runs", namespace, spec.run_ref.name)
            principal = ((run_obj or {}).get("spec") or {}).get("principal")
        refusal = rules.check_step_principal(principal, user, run_ref, spec.tool)
    refusal = refusal or rules.check_call_size(spec, MAX_CALL_BYTES)
    if refusal is not None:
        _refuse(parts, refusal, namespace, user, run_ref, dryrun)
    if spec.resolution is not None and old_spec.resolution is None and not spec.resolution.note.strip():
        raise kopf.AdmissionError(f"{what}: spec.resolution.note: a note is required (say how you know)", code=422)


def _forward_duplicate(kube: Kube, namespace: str, run: str, step: Any, template: Any) -> rules.Refusal | None:
    """The earlier calls with the same forward key, found by their label (one LIST answering the
    few steps that carry it; the API server's watch cache indexes no label, so it filters every
    RunStep of the namespace to find them: the cost grows with the namespace, see
    docs/operations.md#admission-where-each-rule-is-enforced). The LIST is a consistent read (the
    API server serves it from its watch cache once that cache holds etcd's current revision): an
    earlier step settled ``failed`` a moment ago no longer stands, and its repeat is admitted."""
    try:
        key = forward_key(template, step.args, None)
    except MissingValue:
        return None
    label = forward_key_label(step.tool, key)
    found = calls.list_objects(kube.custom, "runsteps", namespace,
                               label_selector=f"{LABEL_RUN}={run},{LABEL_FORWARD_KEY}={label}")
    earlier = []
    for obj in found:
        try:
            entry = jr.entry_of(obj)
        except jr.JournalError:
            continue
        earlier.append((entry.spec.index, entry.spec.tool, entry.spec.outcome, entry.spec.resolution,
                        entry.undo.state if entry.undo else None))
    return rules.check_forward_duplicate(step, key, earlier)


def _halts(kube: Kube, namespace: str) -> list[rules.HaltView]:
    """The halts in force for ``namespace``: its Halts and every ClusterHalt, read from the API
    server's watch cache (``resourceVersion=0``, no read of etcd): a halt is in force on every
    replica within milliseconds of being stored (a watch of this process's own would add its
    delivery to that, and the kill switch is the one rule that must not wait)."""
    return [*_namespace_halts(kube, namespace), *_cluster_halts(kube)]


def _namespace_halts(kube: Kube, namespace: str) -> list[rules.HaltView]:
    """The Halts of ``namespace`` (see :func:`_halts`)."""
    views = []
    for obj in kube.list("halts", namespace, cached=True):
        try:
            spec = HaltSpec.model_validate(obj.get("spec") or {})
        except ValidationError:
            continue
        views.append(rules.HaltView("Halt", obj["metadata"]["name"], namespace, spec.reason, spec.scope))
    return views


def _cluster_halts(kube: Kube) -> list[rules.HaltView]:
    """Every ClusterHalt (see :func:`_halts`)."""
    views = []
    for obj in kube.list("clusterhalts", cached=True):
        try:
            cspec = ClusterHaltSpec.model_validate(obj.get("spec") or {})
        except ValidationError:
            continue
        views.append(rules.HaltView("ClusterHalt", obj["metadata"]["name"], None, cspec.reason, cspec.scope))
    return views


def _count_refusal(kube: Kube, kind: str, namespace: str | None, name: str) -> None:
    """Add one to the halt's ``status.refusedCalls`` (optimistic concurrency, a few tries)."""
    plural = "halts" if kind == "Halt" else "clusterhalts"
    for _ in range(5):
        try:
            obj = calls.get(kube.custom, plural, name, namespace, timeout=kube.timeout)
        except ApiException:
            return
        if obj is None:
            return
        count = (obj.get("status") or {}).get("refusedCalls", 0) + 1
        body = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "status": {"refusedCalls": count}}
        try:
            # a count: a repeated +1 that had landed would count twice, so only an unsent one is repeated
            calls.patch(kube.custom, plural, name, body, namespace, status=True, repeat="unsent", timeout=kube.timeout)
            return
        except calls.Conflict:
            continue
        except ApiException as err:
            log.warning("counting a refusal on %s %s: %s", kind, name, err.reason)
            return


# ---------------------------------------------------------------------------- rollbackrequests

@kopf.on.mutate(G, V, "rollbackrequests", id="mutate-rollbackrequest", operations=OPS, persistent=True)
@untrusted
def mutate_rollback_request(body: Any, old: Any, patch: kopf.Patch, userinfo: dict, namespace: str,
                            name: str | None = None, **_: Any) -> None:
    """Stamp who approved: new approvals' approver and time, approvedBy for approveCompensations,
    cancelledBy when spec.cancel is set (of a valid spec only: a malformed one is refused here, with the field)."""
    _parse(RollbackRequestSpec, body.get("spec"),
           f"RollbackRequest {namespace}/{name or body.get('metadata', {}).get('generateName', '')}")
    user = _user(userinfo)
    spec = body.get("spec") or {}
    old_spec = _valid_or_empty((old or {}).get("spec"))
    _steps, all_now = rules.new_approvals(old_spec, spec)
    if old_spec.get("approvedBy"):
        patch.spec["approvedBy"] = old_spec["approvedBy"]
    elif all_now:
        patch.spec["approvedBy"] = user
    elif "approvedBy" in spec:
        patch.spec["approvedBy"] = None  # only the server says who approved
    if old_spec.get("cancelledBy"):
        patch.spec["cancelledBy"] = old_spec["cancelledBy"]
    elif spec.get("cancel") and not old_spec.get("cancel"):
        patch.spec["cancelledBy"] = user  # who cancelled, for the record (rule 13, cancel)
    elif "cancelledBy" in spec:
        patch.spec["cancelledBy"] = None  # only the server says who cancelled
    now = _now()
    old = {a.get("step"): a for a in old_spec.get("approvals") or [] if isinstance(a, dict)}
    old_denials = {d.get("step"): d for d in old_spec.get("denials") or [] if isinstance(d, dict)}
    old_forces = {f.get("step"): f for f in old_spec.get("force") or [] if isinstance(f, dict)}

    def stamp(raw: dict) -> None:
        new_spec = raw.get("spec") or {}
        _stamp(new_spec.get("approvals"), old, ("approver", "approvedAt"), user, now)
        _stamp(new_spec.get("denials"), old_denials, ("actor", "deniedAt"), user, now)
        _stamp(new_spec.get("force"), old_forces, ("actor", "forcedAt"), user, now)  # who forced: the server's word

    patch.fns.append(_raw(stamp))


@kopf.on.validate(G, V, "rollbackrequests", id="validate-rollbackrequest", operations=OPS, persistent=True)
@untrusted
def validate_rollback_request(body: Any, old: Any, userinfo: dict, namespace: str, name: str, memo: kopf.Memo,
                              **kwargs: Any) -> None:
    """Approving compensations is a permission of its own: RBAC verb ``approve`` (rule 8); so is
    forcing an undo over a failed precondition: RBAC verb ``force`` (rule 16)."""
    what = f"RollbackRequest {namespace}/{name}"
    parts = runtime.parts(memo)
    kube = parts.kube
    spec = _parse(RollbackRequestSpec, body.get("spec"), what)
    steps, all_now = rules.new_approvals((old or {}).get("spec"), body.get("spec") or {})
    denied = rules.new_denials((old or {}).get("spec"), body.get("spec") or {})
    forced = rules.new_forces((old or {}).get("spec"), body.get("spec") or {})
    if forced and not _allowed(kube, userinfo, namespace, G, "rollbackrequests", "force", name):
        raise kopf.AdmissionError(
            f"{_user(userinfo)} may not force step(s) {forced} of {what}: forcing an undo whose precondition does "
            f"not hold needs the RBAC verb \"force\" on rollbackrequests.reversi.dev in namespace {namespace}; "
            "ask for a Role granting it", code=403)
    named = [*steps, *denied, *forced]
    if named:  # one Run read: approvals and denials must name steps whose compensation asks for
        # approval, forces steps whose compensation has a precondition
        run = kube.get("runs", namespace, spec.run_ref.name)
        if run is not None:
            run_spec = _parse(RunSpec, run.get("spec"), f"Run {namespace}/{spec.run_ref.name}")
            ix.capture(parts, kwargs)
            recorded = _approved_steps(kube, namespace, spec.run_ref.name, run_spec, named)
            for group, word in ((steps, "approval"), (denied, "denial")):
                refusal = rules.check_approvals(recorded, group) if group else None
                if refusal is not None:
                    raise kopf.AdmissionError(f"{what}: {refusal.message.replace('approval of', f'{word} of')}",
                                              code=422)
            refusal = rules.check_forces(recorded, forced) if forced else None
            if refusal is not None:
                raise kopf.AdmissionError(f"{what}: {refusal.message}", code=422)
    if not steps and not all_now and not denied:
        return
    if not _may_approve(kube, userinfo, namespace, name):  # one SubjectAccessReview for both
        approving = (["all compensations (approveCompensations)"] if all_now else []) + \
                    ([f"step(s) {steps}"] if steps else [])
        doing = " and ".join(x for x in (f"approve {' and '.join(approving)}" if approving else "",
                                          f"deny step(s) {denied}" if denied else "") if x)
        needs = {(True, False): "approving needs", (False, True): "denying needs"}.get(
            (bool(approving), bool(denied)), "approving and denying need")
        raise kopf.AdmissionError(
            f"{_user(userinfo)} may not {doing} of {what}: {needs} the RBAC verb \"approve\" "
            f"on rollbackrequests.reversi.dev in namespace {namespace}; ask for a Role granting it", code=403)


def _approved_steps(kube: Kube, namespace: str, run: str, run_spec: RunSpec, steps: list[int]) -> RunSpec:
    """The run's journal with just the approved ``steps`` (their RunSteps, or inline steps of 0.1)."""
    entries = [ix.step_entry(kube, namespace, run, i) for i in steps
               if isinstance(i, int) and 0 <= i < MAX_RUN_STEPS]
    return assemble(run_spec, [e for e in entries if e is not None]).spec


def _may_approve(kube: Kube, userinfo: dict, namespace: str, name: str) -> bool:
    """A SubjectAccessReview for the caller: verb approve on rollbackrequests."""
    return _allowed(kube, userinfo, namespace, G, "rollbackrequests", "approve", name)


def _allowed(kube: Kube, userinfo: dict, namespace: str, group: str, resource: str, verb: str,
             name: str | None, subresource: str | None = None) -> bool:
    """Whether the caller may ``verb`` ``resource`` (a SubjectAccessReview with their identity)."""
    info = userinfo or {}
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=info.get("username"), groups=info.get("groups"), uid=info.get("uid"), extra=info.get("extra"),
        resource_attributes=client.V1ResourceAttributes(
            group=group, resource=resource, verb=verb, namespace=namespace, name=name, subresource=subresource)))
    result = calls.call(client.AuthorizationV1Api(kube.api).create_subject_access_review, review,  # changes nothing
                        timeout=kube.timeout)
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
@untrusted
def validate_tool_manifest(body: Any, namespace: str, name: str, userinfo: dict, warnings: list[str],
                           memo: kopf.Memo, **_: Any) -> None:
    """Shape, templates, runners the API server would accept as Job containers, and permission:
    a runner runs with the namespace's Secrets and service accounts, so its author must be allowed
    to create Jobs there and to read every Secret it names."""
    what = f"ToolManifest {namespace}/{name}"
    spec = _parse(ToolManifestSpec, body.get("spec"), what)
    refusal = rules.check_templates(spec) or rules.check_guards(spec)
    if refusal is not None:
        raise kopf.AdmissionError(f"{what}: {refusal.message}", code=422)
    kube = runtime.parts(memo).kube
    for runner in spec.runners:
        texts = [runner.image, *runner.command, *runner.args,
                 *[str(e.get("value", "")) for e in runner.env if isinstance(e, dict)]]
        if any("${" in t for t in texts):
            warnings.append(f"runner {runner.name!r} has a ${{...}} placeholder in its image, command, args or "
                            "env: Kubernetes does not fill those in (only $(VAR) from the container's env)")
        needs: list[tuple[str, str, str, str | None]] = [("batch", "jobs", "create", None)]
        needs += [("", "secrets", "get", secret) for secret in _secrets_named(runner)]
        for group, resource, verb, obj in needs:
            if not _allowed(kube, userinfo, namespace, group, resource, verb, obj):
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
            calls.call(client.BatchV1Api(kube.api).create_namespaced_job, namespace, job,  # a dry run
                       dry_run="All", timeout=kube.timeout)
        except (ApiException, ValidationError) as err:
            # the API server's validation, or the client's own (it checks shapes before sending)
            message = _validation_message(err) if isinstance(err, ValidationError) else api_message(err)
            raise kopf.AdmissionError(f"{what}: runner {runner.name!r} would not make a valid Job: {message}",
                                      code=422) from err


@kopf.on.validate(G, V, "halts", id="validate-halt", operations=OPS, persistent=True)
@untrusted
def validate_halt(body: Any, namespace: str, name: str, warnings: list[str], memo: kopf.Memo, **_: Any) -> None:
    what = f"Halt {namespace}/{name}"
    spec = _parse(HaltSpec, body.get("spec"), what)
    _check_halt(runtime.parts(memo).kube, what, spec, namespace, warnings)


@kopf.on.validate(G, V, "clusterhalts", id="validate-clusterhalt", operations=OPS, persistent=True)
@untrusted
def validate_cluster_halt(body: Any, name: str, warnings: list[str], memo: kopf.Memo, **_: Any) -> None:
    what = f"ClusterHalt {name}"
    spec = _parse(ClusterHaltSpec, body.get("spec"), what)
    _check_halt(runtime.parts(memo).kube, what, spec, None, warnings)


def _check_halt(kube: Kube, what: str, spec: Any, namespace: str | None, warnings: list[str]) -> None:
    """Refuse a pattern that can never match (one rule with the CLI and matching:
    :func:`reversi.models.halt.pattern_problem`); warn when ``scope.tool`` matches no tool of the
    ToolManifests in reach (the halt is admitted: a manifest may come later; its status says
    ``MatchesNoTool``)."""
    refusal = rules.check_halt_scope(spec.scope)
    if refusal is not None:
        raise kopf.AdmissionError(f"{what}: {refusal.message}", code=422)
    pattern = spec.scope.tool if spec.scope is not None else None
    if pattern is None:
        return
    scope = spec.scope.model_dump(exclude_none=True)
    try:
        manifests = kube.list("toolmanifests", namespace, cached=True)
    except ApiException:
        return  # cannot see the manifests in reach (a ClusterHalt, namespaced operator): no warning
    tools = rules.tools_in_reach(manifests, namespace, scope)
    if not rules.tools_matched(pattern, tools):
        warnings.append(f"{what}: " + rules.no_tool_message(pattern, rules.reach_text(namespace, scope),
                                                           len(tools)))
