"""Built-in Kubernetes compensation (docs/concepts.md#built-in-kubernetes-compensation): the pure rules of the
``kube.*`` tool family. Reversi records an agent's writes to namespaced Kubernetes objects (create, apply,
patch, scale, delete) with the object's state before and after, and undoes a write by putting the prior
state back. Dicts in, dicts and decisions out: no client, no I/O.

**States.** A recorded state is a JSON object, never ``null`` (a template reference that ends at ``null``
counts as missing, docs/concepts.md#vocabulary): ``{"absent": true}`` (the object did not exist) or
``{"object": <projection>}``. The *projection* (:func:`user_state`) is what the user controls:

- ``apiVersion``, ``kind`` and every other top-level field but ``status`` and ``metadata`` (``spec``,
  ``data``, ``binaryData``, ``rules``, ``subjects``, ``roleRef``, ``type``, ``immutable``, ``webhooks`` ...);
- ``metadata`` reduced to ``name``, ``namespace``, ``labels``, ``annotations`` (without
  :data:`SERVER_SET_ANNOTATIONS`; ``kubectl.kubernetes.io/last-applied-configuration`` is kept: the user's
  ``kubectl apply`` writes it), ``ownerReferences`` and ``finalizers``; empty ones are left out. ``uid``,
  ``resourceVersion``, ``generation``, ``creationTimestamp``, ``managedFields``, ``selfLink``,
  ``deletionTimestamp``, ``deletionGracePeriodSeconds`` and ``generateName`` never are in a projection;
- minus the *server-set paths* of the object's API group and kind (:data:`SERVER_SET_PATHS`; ``*`` is each
  element of a list):

  ===================================== =================================================================
  kind (group)                          server-set paths
  ===================================== =================================================================
  Service (core)                        ``spec.clusterIP``, ``spec.clusterIPs`` (both kept when ``None``:
                                        a headless Service asks for that), ``spec.healthCheckNodePort``,
                                        ``spec.ports.*.nodePort`` (``ipFamilies`` and ``ipFamilyPolicy``
                                        are kept: a dual-stack Service is created again dual-stack)
  PersistentVolumeClaim (core)          ``spec.volumeName``
  Pod (core)                            ``spec.nodeName``
  Job (batch)                           ``spec.selector``; the labels ``controller-uid``,
                                        ``batch.kubernetes.io/controller-uid``, ``job-name``,
                                        ``batch.kubernetes.io/job-name`` in ``spec.template.metadata.labels``
                                        and in ``metadata.labels`` -- unless ``spec.manualSelector`` is true
                                        (then the user wrote them)
  ===================================== =================================================================

  A map or list on the way to a server-set path that is empty then is dropped too (an empty
  ``spec.template.metadata.labels`` of a Job is the same as none), so that two reads of the same object
  compare equal; other empty maps and lists are kept (an empty ``podSelector`` means every Pod).

**Comparing.** :func:`differences` lists field-by-field differences as dotted paths, one line each
(``spec.replicas: recorded 0, live 3``); :func:`matches` is true exactly when there is none. States are
projected again before they are compared, so a server-set path never counts as a difference.

**Restoring** (:func:`decide_restore`), checked in this order: the live object equals the prior state:
``none`` (already restored, even when forced); the live object differs from the post state and the undo is
not forced: ``refuse``, with the differences; the prior state absent: ``delete`` (the live uid as
precondition); the live object absent: ``create`` the prior projection; else ``replace`` with the prior
projection, the live ``resourceVersion`` (optimistic concurrency), and the live values of the server-set
paths and annotations (an immutable field such as a Service's ``clusterIP`` keeps its value).

**Classification** (:func:`classify`): a write to a Secret is ``kube.secret`` (its content never enters the
journal), the delete of a PersistentVolumeClaim ``kube.delete-volume-claim`` (the data on its volume is not
restored), the delete of a Pod with a controller ``kube.delete-owned-pod`` (replaced, not restored), the
delete of any other Pod or of a Job ``kube.delete-run`` (created again it would run again) -- all
irreversible, matched by kind in any API group; a state over :data:`MAX_STATE_BYTES`
(:func:`too_large`) makes the call ``kube.unjournaled`` (irreversible); any other write is ``kube.<verb>``,
undone by ``kube.restore`` and read back by ``kube.matches`` (:func:`manifest_tools`, :func:`read_answer`).

A recorded call of a reversible tool carries ``args`` ``{"ref": <object_ref>, "prior": <state>, ...}`` and
``result`` ``{"post": <state>, ...}``: the manifest's templates take ``$args.ref``, ``$args.prior`` and
``$result.post`` from there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .verify import json_equal

CREATE = "kube.create"
APPLY = "kube.apply"
PATCH = "kube.patch"
SCALE = "kube.scale"
DELETE = "kube.delete"
SECRET = "kube.secret"
DELETE_VOLUME_CLAIM = "kube.delete-volume-claim"
DELETE_OWNED_POD = "kube.delete-owned-pod"
DELETE_RUN = "kube.delete-run"
UNJOURNALED = "kube.unjournaled"
RESTORE = "kube.restore"
MATCHES = "kube.matches"

VERBS = ("create", "apply", "patch", "scale", "delete")
REVERSIBLE = (CREATE, APPLY, PATCH, SCALE, DELETE)
IRREVERSIBLE = (SECRET, DELETE_VOLUME_CLAIM, DELETE_OWNED_POD, DELETE_RUN, UNJOURNALED)

RESIDUE = {
    SECRET: "The Secret stays as the agent left it (created, changed or deleted): its content never enters the "
    "journal, so Reversi cannot restore it; restore or rotate it by hand.",
    DELETE_VOLUME_CLAIM: "The deleted PersistentVolumeClaim and the data on its volume are not restored: "
    "depending on the volume's reclaim policy the data is gone or left on a Released PersistentVolume.",
    DELETE_OWNED_POD: "The deleted Pod is replaced by its controller, not restored: the replacement is a new Pod "
    "(new name, uid and IP), and what the old Pod held in memory or on emptyDir volumes is gone.",
    DELETE_RUN: "The deleted Pod or Job is not restored: created again it would be a new run, its containers "
    "started again from the beginning (a Job's work done twice), and what the old one held in memory is gone.",
    UNJOURNALED: "The write stays as the agent made it: the object's state was over the journal's 60 KiB limit "
    "for one state, so it was not recorded and cannot be restored.",
}

#: the largest state (compact JSON, UTF-8 bytes) the journal keeps: a step's ``args`` (the reference and the
#: prior state) and its ``result`` (the post state, uid, resourceVersion) are each at most 64 KiB
#: (``reversi.models.runstep.MAX_CALL_BYTES``), so a state leaves 4 KiB for the rest
MAX_STATE_BYTES = 60 * 1024
DEFAULT_LIMIT = 20
#: differences a reader's answer names: the operator shows at most 120 characters of a mismatch
MAX_ANSWER_DIFFERENCES = 5
MAX_VALUE_CHARS = 60
RUNNER_COMMAND = ("reversi-kube-runner",)
RUNNER_DEADLINE_SECONDS = 300

NONE = "none"
REFUSE = "refuse"
DELETE_ACTION = "delete"
CREATE_ACTION = "create"
REPLACE = "replace"
WAIT = "wait"
ACTIONS = (NONE, REFUSE, DELETE_ACTION, CREATE_ACTION, REPLACE, WAIT)

ABSENT: dict[str, Any] = {"absent": True}
"""The absent state (shared: copy it before changing it; :func:`user_state` returns a fresh one)."""

#: the annotation ``kube.restore`` puts on an object it creates again: the run whose rollback did it
#: (``namespace/name``). Never part of a state; it lets a later step of the same rollback recognise the
#: object as the one it restored, not one someone else created since
RESTORED_BY = "reversi.dev/restored-by"

SERVER_SET_ANNOTATIONS = frozenset({
    "deployment.kubernetes.io/revision",
    "deployment.kubernetes.io/desired-replicas",
    "deployment.kubernetes.io/max-replicas",
    "deprecated.daemonset.template.generation",
    "pv.kubernetes.io/bind-completed",
    "pv.kubernetes.io/bound-by-controller",
    "volume.beta.kubernetes.io/storage-provisioner",
    "volume.kubernetes.io/storage-provisioner",
    "volume.kubernetes.io/selected-node",
})

Path = tuple[str, ...]
GroupKind = tuple[str, str]

_JOB_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid", "job-name", "batch.kubernetes.io/job-name")
_SERVICE = ("", "Service")
_JOB = ("batch", "Job")

SERVER_SET_PATHS: dict[GroupKind, tuple[Path, ...]] = {
    _SERVICE: (
        ("spec", "clusterIP"),
        ("spec", "clusterIPs"),
        ("spec", "healthCheckNodePort"),
        ("spec", "ports", "*", "nodePort"),
    ),
    ("", "PersistentVolumeClaim"): (("spec", "volumeName"),),
    ("", "Pod"): (("spec", "nodeName"),),
    _JOB: (
        ("spec", "selector"),
        *(("spec", "template", "metadata", "labels", label) for label in _JOB_LABELS),
        *(("metadata", "labels", label) for label in _JOB_LABELS),
    ),
}
"""Per (API group, kind): the paths the server or a controller sets (``*``: each element of a list)."""

USER_VALUES: dict[GroupKind, dict[Path, tuple[Any, ...]]] = {
    _SERVICE: {("spec", "clusterIP"): ("None",), ("spec", "clusterIPs"): (["None"],)},
}
"""Values of a server-set path that the user asked for (a headless Service): kept in the projection."""

_METADATA_KEPT = ("name", "namespace", "labels", "annotations", "ownerReferences", "finalizers")
_MISSING = object()


class OutOfScope(Exception):
    """An object the built-in Kubernetes family does not record (cluster-scoped, or without a name).

    The message says why and what to do instead (docs/concepts.md#built-in-kubernetes-compensation).
    """


@dataclass(frozen=True)
class Restore:
    """What ``kube.restore`` does (:func:`decide_restore`).

    ``action`` is one of :data:`ACTIONS`; ``body`` the object to create or replace with (``create``,
    ``replace``); ``uid`` and ``resource_version`` the preconditions of a ``delete`` (the live object's:
    a change since the read is never deleted with it); ``differences`` the lines of a ``refuse`` or a
    ``wait`` (the live object is being deleted: the next attempt decides again).
    """

    action: str
    body: dict[str, Any] | None = None
    uid: str | None = None
    differences: tuple[str, ...] = ()
    resource_version: str | None = None


def user_state(obj: Mapping[str, Any] | None) -> dict[str, Any]:
    """The recorded state of a live object: ``{"absent": true}`` for ``None``, else ``{"object": <projection>}``,
    with ``"terminating": true`` for an object being deleted (``metadata.deletionTimestamp``), which
    matches no state, so that nothing is called restored, or undone, while it is still going away.

    The projection keeps what the user controls and drops status, server-set metadata, server-set
    annotations and the server-set paths of the kind (module docstring,
    docs/concepts.md#built-in-kubernetes-compensation). The input is not modified; the output shares nothing
    with it.
    """
    if obj is None:
        return dict(ABSENT)
    if _metadata_of(obj).get("deletionTimestamp"):  # going away: neither present nor absent yet
        return {"object": _projection(obj), "terminating": True}
    return {"object": _projection(obj)}


def object_ref(obj: Mapping[str, Any]) -> dict[str, str]:
    """``{"apiVersion", "kind", "namespace", "name"}`` of ``obj`` (an object, or already such a reference):
    how a recorded call names its object.

    Raises :class:`OutOfScope` when the object has no ``metadata.namespace`` (cluster-scoped objects are not
    recorded) or no ``metadata.name`` (e.g. only ``generateName``), and ``ValueError`` when it has no
    ``apiVersion`` or ``kind`` (docs/concepts.md#built-in-kubernetes-compensation).
    """
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not api_version or not isinstance(kind, str) or not kind:
        raise ValueError("a Kubernetes object needs apiVersion and kind")
    metadata = obj.get("metadata")
    if metadata is None and "name" in obj:  # already a reference
        metadata = {"name": obj.get("name"), "namespace": obj.get("namespace")}
    metadata = metadata if isinstance(metadata, Mapping) else {}
    name, namespace = metadata.get("name"), metadata.get("namespace")
    what = f"{kind} {name}" if isinstance(name, str) and name else kind
    if not isinstance(namespace, str) or not namespace:
        raise OutOfScope(
            f"{what} has no metadata.namespace: cluster-scoped objects (Namespace, ClusterRole, "
            "ClusterRoleBinding, PersistentVolume, CustomResourceDefinition ...) are out of scope of the built-in "
            "Kubernetes family: only namespaced objects are recorded. Set metadata.namespace on a namespaced "
            "object; write a cluster-scoped one with a tool of your own ToolManifest (or declare it irreversible)"
        )
    if not isinstance(name, str) or not name:
        generated = metadata.get("generateName")
        given = f" (it has only generateName {generated!r})" if generated else ""
        raise OutOfScope(
            f"{kind} in namespace {namespace} has no metadata.name{given}: a name is required, the built-in "
            "Kubernetes family records and restores objects by name. Set metadata.name instead of generateName"
        )
    if not _NAMESPACE.fullmatch(namespace) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise OutOfScope(f"{kind} {namespace}/{name}: not a Kubernetes object name (a namespace is a DNS label; a "
                         "name has no '/', '%' or '?' and is at most 253 characters)")
    return {"apiVersion": api_version, "kind": kind, "namespace": namespace, "name": name}


#: a namespace is a DNS-1123 label; a name is a path segment the API server can serve (every kind's
#: own rule is stricter or equal: it refuses the rest itself)
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NAME = re.compile(r"[^/%?#\s]{1,253}")


def check_states(ref: Mapping[str, Any], *states: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` unless every present state is the object ``ref`` names (its apiVersion,
    kind, namespace and name): a restore writes the object its state names, so a state of another
    object is refused, never written (docs/concepts.md#built-in-kubernetes-compensation)."""
    for state in states:
        obj = _present(state)
        if obj is None:
            continue
        meta = obj.get("metadata") or {}
        named = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "namespace": meta.get("namespace"),
                 "name": meta.get("name")}
        if named != dict(ref):
            raise ValueError(f"a recorded state names {named}, not the step's object {dict(ref)}")


def differences(expected: Mapping[str, Any], live: Mapping[str, Any], limit: int = DEFAULT_LIMIT) -> list[str]:
    """The differences between two states, one line each, sorted by path; empty exactly when they match.

    A line names a dotted path (list positions as numbers) and both values as compact JSON, each cut to
    about 60 characters: ``spec.replicas: recorded 0, live 3``, ``metadata.labels.team: recorded absent,
    live "x"``, ``spec.ports: recorded 1 item, live 2 items``; for a whole object ``the object: recorded
    absent, live present`` (or ``recorded present, live absent``). At most ``limit`` lines: when there are
    more, the last one says how many more (``... and 7 more differences``).

    Raises ``ValueError`` for a malformed state or a ``limit`` below 1
    (docs/concepts.md#built-in-kubernetes-compensation).
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    recorded, found = _present(expected), _present(live)
    if _terminating(expected) or _terminating(live):
        return [f"the object: recorded {'absent' if recorded is None else 'present'}, live being deleted"
                if _terminating(live) else "the object: recorded being deleted"]
    if recorded is None and found is None:
        return []
    if recorded is None:
        return ["the object: recorded absent, live present"]
    if found is None:
        return ["the object: recorded present, live absent"]
    lines: list[str] = []
    extra = 0
    for line in _walk(recorded, found, ""):
        if len(lines) < limit:
            lines.append(line)
        else:
            extra += 1
    if extra:
        lines[limit - 1:] = [f"... and {extra + 1} more differences"]
    return lines


def matches(expected: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether two states are equal (after projection): :func:`differences` is empty exactly when this is true.

    Raises ``ValueError`` for a malformed state (docs/concepts.md#built-in-kubernetes-compensation).
    """
    recorded, found = _present(expected), _present(live)
    if _terminating(expected) or _terminating(live):
        return False
    if recorded is None or found is None:
        return recorded is None and found is None
    return json_equal(recorded, found)


def _terminating(state: Mapping[str, Any]) -> bool:
    return isinstance(state, Mapping) and state.get("terminating") is True


def decide_restore(
    prior: Mapping[str, Any], post: Mapping[str, Any], live: Mapping[str, Any] | None, forced: bool,
    uid: str = "", run: str = "",
) -> Restore:
    """What ``kube.restore`` does to put the ``prior`` state back, given the state the write left (``post``)
    and the ``live`` object (``None`` when it does not exist).

    In this order: live being deleted: ``wait``; live equals prior: ``none`` (even when forced); not
    ``forced`` and the live object is another one than the call left (its uid is not ``uid``, the recorded
    post state's; empty: not checked), unless an earlier step of the same rollback created it again
    (annotation :data:`RESTORED_BY` is ``run``): ``refuse``; live differs from post and not ``forced``: ``refuse`` with
    ``differences(post, user_state(live))``; prior absent: ``delete`` with the live uid and resourceVersion as
    preconditions; live absent: ``create`` with the prior projection as body (annotated :data:`RESTORED_BY` ``run`` when
    given); else ``replace`` with the prior
    projection, the live ``metadata.resourceVersion``, the live server-set annotations and the live values of
    the kind's server-set paths. Raises ``ValueError`` for a malformed state
    (docs/concepts.md#built-in-kubernetes-compensation).
    """
    recorded = _present(prior)
    _present(post)
    now = user_state(live)
    if _terminating(now):  # neither restorable nor restored until it is gone
        return Restore(WAIT, differences=tuple(differences(prior, now)))
    if matches(prior, now):
        return Restore(NONE)
    live_meta = _metadata_of(live) if live is not None else {}
    live_uid = live_meta.get("uid") if isinstance(live_meta.get("uid"), str) else None
    restored_here = bool(run) and (live_meta.get("annotations") or {}).get(RESTORED_BY) == run
    if not forced and uid and live is not None and _present(post) is not None and live_uid != uid \
            and not restored_here:
        return Restore(REFUSE, differences=(f"metadata.uid: recorded {uid}, live {live_uid} (deleted and created "
                                            "again since)",))
    if not forced and not matches(post, now):
        return Restore(REFUSE, differences=tuple(differences(post, now)))
    if recorded is None:  # and live present: two absent states are equal
        version = live_meta.get("resourceVersion")
        return Restore(DELETE_ACTION, uid=live_uid, resource_version=version if isinstance(version, str) else None)
    if live is None:
        body = recorded if not run else {**recorded, "metadata": {**recorded.get("metadata", {}), "annotations": {
            **(recorded.get("metadata", {}).get("annotations") or {}), RESTORED_BY: run}}}
        return Restore(CREATE_ACTION, body=body)
    return Restore(REPLACE, body=_replacement(recorded, live))


def classify(verb: str, prior: Mapping[str, Any] | None, post: Mapping[str, Any] | None) -> str:
    """The tool name of a recorded write: ``verb`` (one of :data:`VERBS`) on an object that was ``prior``
    before and ``post`` after (``None``: absent).

    Any write to a Secret: ``kube.secret``; the delete of a PersistentVolumeClaim:
    ``kube.delete-volume-claim``; the delete of a Pod with an ownerReference ``controller: true``:
    ``kube.delete-owned-pod``; the delete of any other Pod or of a Job: ``kube.delete-run`` (created again
    it would run again); all irreversible; else ``kube.<verb>``. Kinds match in any API group, so a
    doubt makes the call irreversible. Raises ``ValueError`` for another verb
    (docs/concepts.md#built-in-kubernetes-compensation).
    """
    if verb not in VERBS:
        raise ValueError(f"unknown verb {verb!r}: the built-in Kubernetes family records {', '.join(VERBS)}")
    objects = [obj for obj in (prior, post) if obj is not None]
    kinds = {obj.get("kind") for obj in objects}
    if "Secret" in kinds:
        return SECRET
    if verb == "delete":
        if "PersistentVolumeClaim" in kinds:
            return DELETE_VOLUME_CLAIM
        if any(obj.get("kind") == "Pod" and _has_controller(obj) for obj in objects):
            return DELETE_OWNED_POD
        if "Pod" in kinds or "Job" in kinds:
            return DELETE_RUN
    return f"kube.{verb}"


def state_size(state: Any) -> int:
    """Bytes of ``state`` as compact JSON in UTF-8 (what the journal would hold)."""
    return len(json.dumps(state, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def too_large(prior_state: Any, post_state: Any) -> int | None:
    """The larger size of the two states when either is over :data:`MAX_STATE_BYTES`, else ``None``.

    Such a call is recorded as ``kube.unjournaled`` (irreversible), its size named (:func:`too_large_reason`;
    docs/concepts.md#built-in-kubernetes-compensation).
    """
    size = max(state_size(prior_state), state_size(post_state))
    return size if size > MAX_STATE_BYTES else None


def too_large_reason(size: int) -> str:
    """Why a call of ``size`` bytes of state is recorded as ``kube.unjournaled``: one line for its step."""
    return (f"the object's state is {size} bytes, over the journal's limit of {MAX_STATE_BYTES} bytes for one "
            f"state: recorded as {UNJOURNALED} (irreversible), not restored")


def read_answer(expected_state: Mapping[str, Any], live: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the ``kube.matches`` reader prints for ``live`` (``None``: absent) against ``expected_state``:
    ``{"matches": bool, "differences": [...]}`` (:func:`differences`, empty when it matches). The family's
    entries expect ``{"differences": []}``, so a mismatch's message (a conflict's, a failed read-back's) shows
    the differences themselves, not only that it does not match.

    Raises ``ValueError`` for a malformed state (docs/concepts.md#built-in-kubernetes-compensation).
    """
    lines = differences(expected_state, user_state(live), limit=MAX_ANSWER_DIFFERENCES)
    return {"matches": not lines, "differences": lines}


def manifest_tools(runner: str = "kube") -> list[dict[str, Any]]:
    """The ``spec.tools`` entries of the family (camelCase, as in the ToolManifest CRD), run by ``runner``.

    The reversible tools (:data:`REVERSIBLE`, effect ``write``) are undone by ``kube.restore`` (kind
    ``inverse``, with ``precheck``: a live object already equal to the prior state is alreadyRecovered), whose
    precondition ``kube.matches`` checks the live object still equals the post state, and read back by
    ``kube.matches`` against the prior state. The irreversible ones (:data:`IRREVERSIBLE`) state their residue
    (docs/concepts.md#built-in-kubernetes-compensation).
    """
    tools = [_reversible_tool(name, runner) for name in REVERSIBLE]
    tools += [{"name": name, "effect": "irreversible", "residue": [RESIDUE[name]]} for name in IRREVERSIBLE]
    return tools


def runner_entry(
    image: str,
    service_account: str,
    name: str = "kube",
    command: Sequence[str] | None = None,
    deadline_seconds: int = RUNNER_DEADLINE_SECONDS,
) -> dict[str, Any]:
    """The ``spec.runners`` entry (camelCase) that runs ``kube.restore`` and ``kube.matches``: ``image`` with
    ``command`` (default ``["reversi-kube-runner"]``) as ``service_account``, each Job for at most
    ``deadline_seconds``. Raises ``ValueError`` for an empty command.
    """
    argv = list(RUNNER_COMMAND if command is None else command)
    if not argv:
        raise ValueError("a runner needs a command")
    return {
        "name": name,
        "image": image,
        "command": argv,
        "serviceAccountName": service_account,
        "deadlineSeconds": deadline_seconds,
    }


def _reversible_tool(name: str, runner: str) -> dict[str, Any]:
    return {
        "name": name,
        "effect": "write",
        "compensation": {
            "tool": RESTORE,
            "kind": "inverse",
            "args": {"ref": "$args.ref", "prior": "$args.prior", "post": "$result.post", "uid": "$result.uid"},
            "runner": runner,
            "precheck": True,
            "precondition": {
                "tool": MATCHES,
                "args": {"ref": "$args.ref", "state": "$result.post"},
                "expect": {"differences": []},
                "runner": runner,
            },
        },
        "verification": {
            "tool": MATCHES,
            "args": {"ref": "$args.ref", "state": "$args.prior"},
            "expect": {"differences": []},
            "retries": 5,
            "backoffMs": 1000,
            "runner": runner,
        },
    }


# --- projection ---------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A deep copy of a JSON value as dicts and lists (a Mapping or a tuple of the input included)."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _metadata_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def _group_kind(obj: Mapping[str, Any]) -> GroupKind:
    api_version = obj.get("apiVersion")
    group = api_version.rpartition("/")[0] if isinstance(api_version, str) else ""
    kind = obj.get("kind")
    return group, kind if isinstance(kind, str) else ""


def _server_set_paths(obj: Mapping[str, Any]) -> tuple[GroupKind, tuple[Path, ...]]:
    """The (group, kind) of ``obj`` and its server-set paths (none for a Job with a manual selector)."""
    group_kind = _group_kind(obj)
    if group_kind == _JOB:
        spec = obj.get("spec")
        if isinstance(spec, Mapping) and spec.get("manualSelector") is True:
            return group_kind, ()
    return group_kind, SERVER_SET_PATHS.get(group_kind, ())


def _projection(obj: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        str(key): _plain(value) for key, value in obj.items() if key not in ("status", "metadata")
    }
    metadata: dict[str, Any] = {}
    for key in _METADATA_KEPT:
        value = _metadata_of(obj).get(key)
        if key == "annotations" and isinstance(value, Mapping):
            value = {k: v for k, v in value.items() if k not in SERVER_SET_ANNOTATIONS and k != RESTORED_BY}
        if value is None or (isinstance(value, (Mapping, list, tuple)) and not value):
            continue
        metadata[key] = _plain(value)
    if metadata:
        out["metadata"] = metadata
    group_kind, paths = _server_set_paths(obj)
    kept = USER_VALUES.get(group_kind, {})
    for path in paths:
        _remove(out, path, kept.get(path, ()))
    return out


def _remove(node: Any, path: Path, kept: tuple[Any, ...]) -> None:
    """Remove ``path`` from ``node`` in place unless its value is one of ``kept``, and drop the maps and lists on
    the way that are then empty (not elements of a list)."""
    head, rest = path[0], path[1:]
    if head == "*":
        for item in node if isinstance(node, list) else ():
            _remove(item, rest, kept)
        return
    if not isinstance(node, dict) or head not in node:
        return
    if rest:
        _remove(node[head], rest, kept)
        if isinstance(node[head], (dict, list)) and not node[head]:
            del node[head]
    elif not any(json_equal(node[head], value) for value in kept):
        del node[head]


def _present(state: Mapping[str, Any]) -> dict[str, Any] | None:
    """The projection of a state's object, or ``None`` for an absent state; ``ValueError`` for anything else."""
    if isinstance(state, Mapping):
        keys = set(state)
        if keys == {"absent"} and state["absent"] is True:
            return None
        if keys in ({"object"}, {"object", "terminating"}) and isinstance(state["object"], Mapping):
            return _projection(state["object"])
    raise ValueError(
        f"not a recorded state: {_show(state)}; a state is {{\"absent\": true}} or {{\"object\": {{...}}}}"
    )


# --- differences --------------------------------------------------------------------------------------------


def _walk(recorded: Any, found: Any, path: str) -> Iterator[str]:
    if isinstance(recorded, dict) and isinstance(found, dict):
        for key in sorted(set(recorded) | set(found)):
            where = f"{path}.{key}" if path else key
            yield from _walk(recorded.get(key, _MISSING), found.get(key, _MISSING), where)
    elif isinstance(recorded, list) and isinstance(found, list):
        if len(recorded) != len(found):
            yield f"{path}: recorded {_items(len(recorded))}, live {_items(len(found))}"
        for index in range(max(len(recorded), len(found))):
            yield from _walk(
                recorded[index] if index < len(recorded) else _MISSING,
                found[index] if index < len(found) else _MISSING,
                f"{path}.{index}",
            )
    elif recorded is _MISSING or found is _MISSING or not json_equal(recorded, found):
        yield f"{path}: recorded {_show(recorded)}, live {_show(found)}"


def _items(count: int) -> str:
    return "1 item" if count == 1 else f"{count} items"


def _show(value: Any) -> str:
    if value is _MISSING:
        return "absent"
    try:
        text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > MAX_VALUE_CHARS:
        text = text[: MAX_VALUE_CHARS - 1] + "…"
    return text


# --- replace ------------------------------------------------------------------------------------------------


def _replacement(recorded: dict[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """The prior projection made into a replace body against ``live`` (see :func:`decide_restore`)."""
    body = _plain(recorded)
    found = _plain(live)
    metadata = body.setdefault("metadata", {})
    live_metadata = _metadata_of(found)
    if live_metadata.get("resourceVersion") is not None:
        metadata["resourceVersion"] = live_metadata["resourceVersion"]
    live_annotations = live_metadata.get("annotations")
    if isinstance(live_annotations, Mapping):
        server_set = {k: v for k, v in live_annotations.items() if k in SERVER_SET_ANNOTATIONS}
        if server_set:
            metadata["annotations"] = {**metadata.get("annotations", {}), **server_set}
    group_kind, paths = _server_set_paths(body)
    for path in paths:
        if _copyable(group_kind, path, body):
            _copy_from(found, body, path)
    return body


def _copyable(group_kind: GroupKind, path: Path, body: Mapping[str, Any]) -> bool:
    """Whether the live value of a server-set path may go into the body: a Service's node ports only for types
    that have them, its health check port only for a LoadBalancer with a Local traffic policy, its cluster IPs
    not for an ExternalName."""
    if group_kind != _SERVICE:
        return True
    spec = body.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    service_type = spec.get("type") or "ClusterIP"
    if path[-1] == "nodePort":
        return service_type in ("NodePort", "LoadBalancer")
    if path[-1] == "healthCheckNodePort":
        return service_type == "LoadBalancer" and spec.get("externalTrafficPolicy") == "Local"
    return service_type != "ExternalName"


def _copy_from(source: Any, target: dict[str, Any], path: Path) -> None:
    """Set ``path`` of ``target`` to its value in ``source`` when ``source`` has one (missing maps on the way are
    created). Under ``*`` the elements of the two lists are paired by name, else by port and protocol."""
    if "*" in path:
        star = path.index("*")
        _copy_into_elements(_lookup(source, path[:star]), _lookup(target, path[:star]), path[star + 1:])
        return
    value = _lookup(source, path)
    if value is _MISSING:
        return
    node = target
    for segment in path[:-1]:
        child = node.get(segment)
        if child is None:
            child = node[segment] = {}
        if not isinstance(child, dict):
            return
        node = child
    node[path[-1]] = _plain(value)


def _lookup(node: Any, path: Path) -> Any:
    """The value at ``path`` of ``node`` (maps only), or ``_MISSING``."""
    for segment in path:
        if not isinstance(node, Mapping) or segment not in node:
            return _MISSING
        node = node[segment]
    return node


def _copy_into_elements(source: Any, target: Any, rest: Path) -> None:
    if not isinstance(source, list) or not isinstance(target, list):
        return
    by_key = {_element_key(item): item for item in source if isinstance(item, Mapping)}
    for item in target:
        if isinstance(item, dict) and _element_key(item) in by_key:
            _copy_from(by_key[_element_key(item)], item, rest)


def _element_key(item: Mapping[str, Any]) -> tuple[str, str]:
    name = item.get("name")
    if isinstance(name, str) and name:
        return "name", name
    return "port", json.dumps([item.get("port"), item.get("protocol") or "TCP"], sort_keys=True)


def _has_controller(obj: Mapping[str, Any]) -> bool:
    references = _metadata_of(obj).get("ownerReferences")
    if not isinstance(references, list):
        return False
    return any(isinstance(ref, Mapping) and ref.get("controller") is True for ref in references)


# --- recording -------------------------------------------------------------------------------------------------


def recorded_args(verb: str, ref: Mapping[str, str], prior: Mapping[str, Any] | None,
                  body: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The tool and ``args`` of the step that records ``verb`` (:data:`VERBS`) on the object ``ref``
    whose live object before the write is ``prior`` (``None``: absent); ``body`` is what a create or an
    apply sends. ``args`` is ``{"ref", "prior"}`` for a reversible tool; a Secret's step keeps only its
    ``ref`` (its content never enters the journal); a prior state over :data:`MAX_STATE_BYTES` gives
    ``kube.unjournaled`` with ``{"ref", "bytes", "reason"}``. Raises ``ValueError`` for an unknown verb
    (docs/concepts.md#built-in-kubernetes-compensation)."""
    tool = classify(verb, prior, body)
    if tool in IRREVERSIBLE:
        return tool, {"ref": dict(ref), "verb": verb}
    state = user_state(prior)
    size = too_large(state, ABSENT)
    if size is not None:
        return UNJOURNALED, {"ref": dict(ref), "verb": verb, "bytes": size, "reason": too_large_reason(size)}
    return tool, {"ref": dict(ref), "prior": state}


def recorded_result(tool: str, stored: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``result`` of a recorded write of ``tool`` whose API answer is ``stored`` (the object as
    stored; ``None`` or a terminating object for a delete: the post state is absent). ``{"uid",
    "resourceVersion", "post"}``; an irreversible tool keeps no state; a post state over
    :data:`MAX_STATE_BYTES` is left out with its size (``postBytes``), so its undo is unrecoverable
    (its compensation's ``$result.post`` is missing) and the plan says so before anything runs."""
    meta = _metadata_of(stored or {})
    out: dict[str, Any] = {"uid": str(meta.get("uid") or ""), "resourceVersion": str(meta.get("resourceVersion") or "")}
    if tool in IRREVERSIBLE:
        return out
    terminating = stored is None or bool(meta.get("deletionTimestamp")) or tool == DELETE
    state = dict(ABSENT) if terminating else user_state(stored)
    size = state_size(state)
    if size > MAX_STATE_BYTES:
        return {**out, "postBytes": size}
    return {**out, "post": state}
