"""Pure builders for compensator and reader Jobs and the Secrets that carry their calls.

The Job contract (docs/concepts.md#the-job-contract) is what these functions implement; none of
them does I/O, so a unit test can check every field. The handlers create what they return.

Shapes:

- compensator call JSON: ``{"run_id", "step", "tool", "original_tool", "args",
  "idempotency_key"}``; reader call JSON: ``{"tool", "arguments"}``.
- The call reaches the container as the file ``/var/run/reversi/call.json`` (``REVERSI_CALL_FILE``)
  and the variable ``REVERSI_CALL``, both from a Secret owned, like the Job, by the Run; the
  compensation idempotency key is also in ``REVERSI_IDEMPOTENCY_KEY``. Nothing of the call is
  plain text in the Job spec.
- **Calls Secrets** (to keep API writes per step few): the operator does not create a Secret per Job. The calls of the
  steps of one *slice* (``CALLS_PER_SECRET`` consecutive step indices) share one Secret: a key
  ``<step>.<role>.json`` per call a step may need (compensator, reader, precheck, precondition) and
  ``<step>.idempotency-key``. A Job mounts only its own key (``items``), so a pod sees its call and
  nothing else. A slice larger than ``MAX_CALLS_SECRET_BYTES`` is split, in step order, into
  several Secrets. The name ends in a hash of the content, so the same calls always give the same
  name (a restarted operator creates nothing new) and changed calls (a resolution settled a result
  since) never reuse a Secret that holds the old ones; Secrets are immutable.
- Names are deterministic (≤ 63 characters) from the run's uid, the step, the attempt and the
  read-back number, so a restarted operator finds (adopts) the Job it already created instead of
  starting another (rule 3). A Job built without a :class:`CallRef` has a Secret of its own, with
  the Job's name (the SDK's reader probe, the admission dry run of a runner, the benchmark's bare
  Jobs).
- Ownership (rule 14): a Job and its Secret are owned by the **Run**, not the request, so
  deleting a RollbackRequest mid-way never garbage-collects a compensator in the middle of its
  call; the Job finishes and its outcome is journaled (by the handler of its Job events, or by the
  next request on the Run, which adopts it by its deterministic name). Deleting the Run deletes
  them. The request that started a Job is named by the annotation ``reversi.dev/request`` and the
  label ``reversi.dev/request-uid``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal
from collections.abc import Iterable, Mapping

from ..models.toolmanifest import Runner

CALL_DIR = "/var/run/reversi"
CALL_FILE = f"{CALL_DIR}/call.json"
CALL_KEY = "call.json"
KEY_KEY = "idempotency-key"
#: consecutive step indices whose calls share one Secret (a slice)
CALLS_PER_SECRET = 32
#: largest data (bytes of JSON text and keys) of one calls Secret; the API server's limit is 1 MiB,
#: and one step's calls (args and result ≤ 64 KiB each, four roles) always fit
MAX_CALLS_SECRET_BYTES = 640 * 1024

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_RUN_UID = "reversi.dev/run-uid"
LABEL_REQUEST_UID = "reversi.dev/request-uid"
LABEL_STEP = "reversi.dev/step"
LABEL_ATTEMPT = "reversi.dev/attempt"
LABEL_READ = "reversi.dev/read"
LABEL_ROLE = "reversi.dev/role"
ANNOTATION_RUN = "reversi.dev/run"
ANNOTATION_REQUEST = "reversi.dev/request"

Role = Literal["compensator", "reader", "check", "precheck", "precondition"]
_ROLE_LETTER = {"compensator": "c", "reader": "r", "check": "x", "precheck": "p", "precondition": "w"}


@dataclass(frozen=True)
class Owner:
    """An object a Job refers to: the Run that owns it (``kind="Run"``), or the RollbackRequest
    that started it (the default kind)."""

    namespace: str
    name: str
    uid: str
    api_version: str = "reversi.dev/v1alpha1"
    kind: str = "RollbackRequest"

    def reference(self) -> dict[str, Any]:
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name,
                "uid": self.uid, "controller": True, "blockOwnerDeletion": True}


@dataclass(frozen=True)
class JobSettings:
    """Operator-wide knobs for Jobs: seconds to keep a finished Job, the user id to run as."""

    ttl_seconds_after_finished: int = 3600
    run_as_user: int = 65532


def run_hash(run_uid: str) -> str:
    """Ten hex characters identifying a run (its uid) in Job names."""
    return hashlib.sha256(run_uid.encode()).hexdigest()[:10]


def job_name(run_uid: str, step: int, attempt: int, role: Role = "compensator", read: int = 0) -> str:
    """Deterministic Job (and Secret) name, at most 63 characters.

    ``rv-<run hash>-<step>-c<attempt>`` for a compensator; a reader adds ``-r<read>``, the
    extra check of ``verifyCommand`` ``-x<read>``, the precheck read ``-p<read>`` and the
    precondition read ``-w<read>`` (both before the compensator of ``attempt``). ``attempt``
    counts from 1.
    """
    name = f"rv-{run_hash(run_uid)}-{step}-c{attempt}"
    if role != "compensator":
        name += f"-{_ROLE_LETTER[role]}{read}"
    assert len(name) <= 63, name
    return name


def compensator_call(run_id: str, step: int, tool: str, original_tool: str, args: Any,
                     idempotency_key: str, forced: bool = False) -> dict[str, Any]:
    """The compensator call JSON of the Job contract (docs/concepts.md#the-job-contract), with
    ``"forced": true`` when the request forces the step (``spec.force``): a compensator that
    checks the step's precondition again itself skips that check. (The operator's own
    precondition read still runs first: a forced step whose precondition holds is not reported
    ``forced``.)"""
    call = {"run_id": run_id, "step": step, "tool": tool, "original_tool": original_tool,
            "args": args, "idempotency_key": idempotency_key}
    return {**call, "forced": True} if forced else call


def reader_call(tool: str, arguments: Any) -> dict[str, Any]:
    """The reader call JSON of the Job contract (docs/concepts.md#the-job-contract)."""
    return {"tool": tool, "arguments": arguments}


#: reads that run before a compensator (rule 16, guards); not journaled, so each request reads for itself
GUARD_ROLES = frozenset({"precheck", "precondition"})


def guard_read(job_labels: Iterable[Mapping[str, str]], request_uid: str, step: int, attempt: int, role: str) -> int:
    """The read number of request ``request_uid``'s guard Job (role ``precheck`` or
    ``precondition``) before attempt ``attempt`` of ``step``, given the labels of the run's Jobs:
    the number of its own Job, else one past the highest another request used (0 when none did).

    A guard read is not journaled (a conflict, a cancel during the read), so a later request starts
    the same attempt; with a Job name of its own it reads the state again and never adopts an
    earlier request's answer, which may be stale (a precondition that held then may not hold now).
    An operator that restarts finds the request's own Job by its ``reversi.dev/request-uid`` label.
    """
    taken = []
    for labels in job_labels:
        if (labels.get(LABEL_ROLE) != role or labels.get(LABEL_STEP) != str(step)
                or labels.get(LABEL_ATTEMPT) != str(attempt)):
            continue
        try:
            read = int(labels.get(LABEL_READ, "0"))
        except ValueError:
            continue
        if labels.get(LABEL_REQUEST_UID) == request_uid:
            return read
        taken.append(read)
    return max(taken) + 1 if taken else 0


@dataclass(frozen=True)
class CallRef:
    """Where a Job's call is: the calls Secret ``secret``, key ``call_key`` (and
    ``key_key``, the idempotency key, for a compensator and its check)."""

    secret: str
    call_key: str
    key_key: str | None = None


def call_key(step: int, role: Role) -> str:
    """The key of a step's call in its calls Secret; the ``check`` of ``verifyCommand`` gets the
    compensator's call."""
    return f"{step}.{'compensator' if role == 'check' else role}.json"


def idempotency_key_key(step: int) -> str:
    """The key of a step's compensation idempotency key in its calls Secret."""
    return f"{step}.{KEY_KEY}"


def step_calls(step: int, calls: Mapping[str, dict[str, Any] | None], idempotency_key: str | None) -> dict[str, str]:
    """The calls Secret entries of one step: ``{"<step>.<role>.json": JSON text}`` for each role in
    ``calls`` (``compensator``, ``reader``, ``precheck``, ``precondition``; None: the step has no
    such read) and ``{"<step>.idempotency-key": key}``."""
    data = {call_key(step, role): _dump(call)  # type: ignore[arg-type]
            for role, call in calls.items() if call is not None}
    if idempotency_key:
        data[idempotency_key_key(step)] = idempotency_key
    return data


def slice_of(step: int) -> int:
    """The slice (calls Secret group) of a step index."""
    return step // CALLS_PER_SECRET


def pack_calls(run_uid: str, entries: Mapping[int, Mapping[str, str]],
               max_bytes: int = MAX_CALLS_SECRET_BYTES) -> list[tuple[str, dict[str, str]]]:
    """Pack the calls of one slice's steps (``entries``: step -> :func:`step_calls`) into Secrets:
    returns ``[(name, data)]``, steps in index order, a new Secret whenever the next step would take
    the data past ``max_bytes``. ``name`` is ``rv-<run hash>-k<slice>-<content hash>``.

    Raises ``ValueError`` when the steps are not all of one slice.
    """
    slices = {slice_of(s) for s in entries}
    if len(slices) > 1:
        raise ValueError(f"steps of slices {sorted(slices)} given to one pack")
    groups: list[dict[str, str]] = []
    size = 0
    for step in sorted(entries):
        data = entries[step]
        n = sum(len(k) + len(v.encode()) for k, v in data.items())
        if not groups or size + n > max_bytes:
            groups.append({})
            size = 0
        groups[-1].update(data)
        size += n
    part = slices.pop() if slices else 0
    out = []
    for data in groups:
        digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:10]
        out.append((f"rv-{run_hash(run_uid)}-k{part}-{digest}", data))
    return out


def calls_secret(name: str, owner: Owner, run_uid: str, data: Mapping[str, str]) -> dict[str, Any]:
    """A calls Secret (immutable, owned by the Run) with the entries of :func:`pack_calls`."""
    return {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": owner.namespace,
                     "labels": {LABEL_MANAGED_BY: "reversi", LABEL_RUN_UID: run_uid},
                     "ownerReferences": [owner.reference()]},
        "type": "Opaque",
        "immutable": True,
        "stringData": dict(data),
    }


#: longest call (bytes of UTF-8 JSON) a Job can take: ``REVERSI_CALL=<call>`` is one environment
#: string, and Linux refuses to start a program with a string over 128 KiB (MAX_ARG_STRLEN)
MAX_JOB_CALL_BYTES = 128 * 1024 - len("REVERSI_CALL=") - 1


class CallTooLarge(ValueError):
    """A call longer than :data:`MAX_JOB_CALL_BYTES`: its Job could never start its program."""


def check_job_call_size(text: str, what: str) -> None:
    """Raise :class:`CallTooLarge` when the call JSON ``text`` is longer than
    :data:`MAX_JOB_CALL_BYTES` (UTF-8); ``what`` names the call in the message, e.g. ``"the
    compensator call of step 3"``."""
    n = len(text.encode())
    if n > MAX_JOB_CALL_BYTES:
        raise CallTooLarge(f"{what} is {n} bytes of JSON, more than the {MAX_JOB_CALL_BYTES} a Job can take "
                           "(REVERSI_CALL is one environment variable, at most 128 KiB): declare smaller "
                           "arguments in the ToolManifest (name the fields the call needs, not $args or "
                           "$result whole)")


def _dump(call: dict[str, Any]) -> str:
    """The call's JSON text as the container gets it: UTF-8 kept, as admission measured ``args``
    and ``result`` (``\\u`` escapes would make non-ASCII text up to 3 times larger: a step's calls
    past the API server's 1 MiB per Secret, one call past Linux's 128 KiB per environment string)."""
    return json.dumps(call, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _labels(owner: Owner, run_uid: str, step: int, attempt: int, role: Role, read: int) -> dict[str, str]:
    labels = {
        LABEL_MANAGED_BY: "reversi",
        LABEL_RUN_UID: run_uid,
        LABEL_REQUEST_UID: owner.uid,
        LABEL_STEP: str(step),
        LABEL_ATTEMPT: str(attempt),
        LABEL_ROLE: role,
    }
    if role != "compensator":
        labels[LABEL_READ] = str(read)
    return labels


def call_secret(name: str, owner: Owner, labels: dict[str, str], call: dict[str, Any],
                idempotency_key: str | None) -> dict[str, Any]:
    """The Secret carrying a call: ``call.json`` and, for compensators, the idempotency key."""
    data = {CALL_KEY: _dump(call)}
    if idempotency_key:
        data[KEY_KEY] = idempotency_key
    return {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": owner.namespace, "labels": labels,
                     "ownerReferences": [owner.reference()]},
        "type": "Opaque",
        "immutable": True,
        "stringData": data,
    }


def build_job(
    *,
    owner: Owner,
    run_name: str,
    run_uid: str,
    step: int,
    attempt: int,
    runner: Runner,
    call: dict[str, Any],
    role: Role = "compensator",
    read: int = 0,
    idempotency_key: str | None = None,
    command: list[str] | None = None,
    deadline_seconds: int | None = None,
    settings: JobSettings = JobSettings(),
    request: Owner | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(secret, job)`` for one compensator, reader or check run whose call is in a Secret
    of its own (the Job's name): :func:`job_for` with that Secret. Same parameters."""
    name = job_name(run_uid, step, attempt, role, read)
    secret = call_secret(name, owner, _labels(request or owner, run_uid, step, attempt, role, read), call,
                         idempotency_key)
    return secret, job_for(owner=owner, run_name=run_name, run_uid=run_uid, step=step, attempt=attempt,
                           runner=runner, role=role, read=read, command=command, deadline_seconds=deadline_seconds,
                           settings=settings, request=request,
                           call_ref=CallRef(name, CALL_KEY, KEY_KEY if idempotency_key else None))


def job_for(
    *,
    owner: Owner,
    run_name: str,
    run_uid: str,
    step: int,
    attempt: int,
    runner: Runner,
    call_ref: CallRef,
    role: Role = "compensator",
    read: int = 0,
    command: list[str] | None = None,
    deadline_seconds: int | None = None,
    settings: JobSettings = JobSettings(),
    request: Owner | None = None,
) -> dict[str, Any]:
    """The Job of one compensator, reader or check run, reading its call from ``call_ref`` (a
    calls Secret built by :func:`pack_calls` and :func:`calls_secret`, or the Job's own).

    ``runner`` gives image, command, args, env, envFrom, service account, resources and the
    deadline (``deadline_seconds`` overrides it when smaller: the request's own deadline).
    ``command`` replaces the runner's command and args (``verifyCommand``). The Job has
    ``backoffLimit: 0`` (Reversi owns retries, rule 4), ``activeDeadlineSeconds``,
    ``ttlSecondsAfterFinished``, an owner reference to ``owner`` (the Run: a deleted request never
    takes a running compensator with it), and a pod that meets the ``restricted`` Pod Security
    Standard. ``request`` (the RollbackRequest that starts it; default ``owner``) is named in the
    annotation ``reversi.dev/request`` and the label ``reversi.dev/request-uid``.
    """
    request = request or owner
    name = job_name(run_uid, step, attempt, role, read)
    labels = _labels(request, run_uid, step, attempt, role, read)
    annotations = {ANNOTATION_RUN: run_name, ANNOTATION_REQUEST: request.name}
    container = _job_container(runner, call_ref, role, command)
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": owner.namespace, "labels": labels,
                     "annotations": annotations, "ownerReferences": [owner.reference()]},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": _job_deadline(runner, deadline_seconds),
            "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
            "template": {"metadata": {"labels": labels, "annotations": annotations},
                         "spec": _job_pod_spec(container, runner, call_ref, settings)},
        },
    }


def _job_container(runner: Runner, call_ref: CallRef, role: Role, command: list[str] | None) -> dict[str, Any]:
    """The Job's one container, named after ``role``: the runner's image, its command and args
    (or ``command`` with no args), its resources, the call mounted read-only at :data:`CALL_DIR`
    and a writable ``/tmp``, under the ``restricted`` Pod Security Standard."""
    container: dict[str, Any] = {
        "name": role,
        "image": runner.image,
        "command": list(command) if command else list(runner.command),
        "args": [] if command else list(runner.args),
        "env": _container_env(runner, call_ref, role),
        "envFrom": [dict(e) for e in runner.env_from],
        "volumeMounts": [
            {"name": "call", "mountPath": CALL_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        # only what the container writes to /dev/termination-log on purpose becomes the error in
        # status: logs may hold anything (a secret from the environment), so they are never copied
        "terminationMessagePolicy": "File",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if runner.resources:
        container["resources"] = dict(runner.resources)
    return container


def _container_env(runner: Runner, call_ref: CallRef, role: Role) -> list[dict[str, Any]]:
    """The container's environment: ``REVERSI_CALL_FILE``, ``REVERSI_CALL`` (from the calls
    Secret), ``REVERSI_ROLE``, ``REVERSI_IDEMPOTENCY_KEY`` when ``call_ref`` has one, then the
    runner's own variables."""
    env: list[dict[str, Any]] = [
        {"name": "REVERSI_CALL_FILE", "value": CALL_FILE},
        {"name": "REVERSI_CALL", "valueFrom": {"secretKeyRef": {"name": call_ref.secret, "key": call_ref.call_key}}},
        {"name": "REVERSI_ROLE", "value": role},
    ]
    if call_ref.key_key:
        env.append({"name": "REVERSI_IDEMPOTENCY_KEY",
                    "valueFrom": {"secretKeyRef": {"name": call_ref.secret, "key": call_ref.key_key}}})
    env += [dict(e) for e in runner.env]
    return env


def _job_deadline(runner: Runner, deadline_seconds: int | None) -> int:
    """The Job's ``activeDeadlineSeconds``: the runner's, or ``deadline_seconds`` when smaller
    (at least 1)."""
    deadline = runner.deadline_seconds
    if deadline_seconds is not None:
        deadline = max(1, min(deadline, deadline_seconds))
    return deadline


def _job_pod_spec(container: dict[str, Any], runner: Runner, call_ref: CallRef,
                  settings: JobSettings) -> dict[str, Any]:
    """The pod spec around ``container``: never restarted, run as ``settings.run_as_user``, the
    runner's service account (its token mounted only then), and the volumes ``call`` (only the
    Job's own key of the calls Secret) and ``tmp``."""
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": bool(runner.service_account_name),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": settings.run_as_user,
            "runAsGroup": settings.run_as_user,
            "fsGroup": settings.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            # only the Job's own call: a calls Secret holds the calls of other steps too
            {"name": "call", "secret": {"secretName": call_ref.secret, "defaultMode": 0o440,
                                        "items": [{"key": call_ref.call_key, "path": CALL_KEY}]}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
        ],
    }
    if runner.service_account_name:
        pod_spec["serviceAccountName"] = runner.service_account_name
    return pod_spec
