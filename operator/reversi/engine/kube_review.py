"""Recording an agent's own Kubernetes writes at admission (docs/concepts.md#recording-with-no-agent-code): the
pure rules that turn one admission review of a recorded user's write into a step of the built-in Kubernetes
family (:mod:`reversi.engine.kube`), and that settle the step's outcome from what the API server then stored.
Dicts in, decisions out: no client, no I/O.

**What a review records** (:func:`written`). The API server sends the admission webhook ``record-write`` the
writes of the users that Runs record (``spec.record``), before they are stored:

- a ``CREATE`` is ``kube.create``: the prior state is absent, the expected post state is ``object``;
- an ``UPDATE`` of the object itself (a ``kubectl apply``, ``edit``, ``patch``, ``label``, ``annotate``,
  ``set image``...) is ``kube.patch``: the prior state is ``oldObject``, the expected post state ``object``;
- an ``UPDATE`` of its ``scale`` subresource (``kubectl scale``) is ``kube.scale``: the review carries only
  the Scale, so the prior state is the parent object as read (``parent``) and the expected post state is
  that object with ``spec.replicas`` from the Scale;
- a ``DELETE`` is ``kube.delete``: the prior state is ``oldObject``, the expected post state absent;
- the ``DELETE`` of a recorded **namespace** is refused (:class:`reversi.engine.kube.OutOfScope`): its objects
  would all go with no record of any.

The family's classification applies unchanged: a Secret's content never enters the journal, the delete of a
PersistentVolumeClaim, of a Pod or of a Job is irreversible, a state over the journal's limit is
``kube.unjournaled``. A dry run, another subresource, and Reversi's own kinds are not recorded (``None``).

**Settling the outcome** (:func:`settle_change`, :func:`settle_create`). Admission answers before the write is
stored, and the write can still fail after it: a ResourceQuota, another webhook, a lost race. Writes of one
object are stored one after the other, each with a new ``resourceVersion``, and a write that loses a race
is admitted again (a new review, a step of its own) before it is retried. So the **first version stored
after the prior one** is the recorded write's, if it landed:

- it equals the expected post state: ``succeeded``, with ``{uid, resourceVersion, post}`` as the SDK records;
- it differs (another writer's version came first), or no version came before the deadline: ``failed``, a
  write the API server refused after admission; its undo is a verified no-op, since the object still holds
  what the next step (or the present) recorded;
- an update that changes nothing the user controls is ``succeeded`` even when nothing was stored;
- a scale of a custom resource is ``uncertain``: it scales at the path its CRD names, which the review does
  not carry, so the expected post state is not known.

A create has no prior version: the object the review named by uid is there (``succeeded``) or, by the
deadline, is not (``failed``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import kube

#: the subresource whose writes are recorded besides the object's own (``kubectl scale``)
SCALE_SUBRESOURCE = "scale"
#: API groups whose writes are never recorded: Reversi's own kinds (the journal itself), and what no agent
#: "changes" (events, leases, reviews); the recording webhook's match condition is made from these too
#: (:func:`reversi.adapters.webhooks.recorded_users`)
UNRECORDED_GROUPS = frozenset({"reversi.dev", "events.k8s.io", "coordination.k8s.io", "authorization.k8s.io",
                               "authentication.k8s.io"})
#: core resources never recorded (the same reasons)
UNRECORDED_CORE = frozenset({"events", "bindings"})

_OPERATIONS = {"CREATE": "create", "UPDATE": "patch", "DELETE": "delete"}
#: the kinds whose scale is ``spec.replicas`` (``(group, kind)``); a custom resource scales at the path its
#: CRD names (``specReplicasPath``), which a review does not carry
REPLICAS_KINDS = frozenset({("apps", "Deployment"), ("apps", "StatefulSet"), ("apps", "ReplicaSet"),
                            ("", "ReplicationController")})


@dataclass(frozen=True)
class Written:
    """One recorded user's write as admission saw it.

    ``ref`` the object (:func:`reversi.engine.kube.object_ref`); ``verb`` one of ``create``, ``patch``, ``scale``,
    ``delete``; ``tool`` and ``args`` the step to record (:func:`reversi.engine.kube.recorded_args`); ``expected``
    the post state the write produces if it lands (``{"absent": true}`` for a delete); ``uid`` the object's uid
    (a create's is given before admission); ``prior_version`` the ``resourceVersion`` before the write (empty for
    a create); ``user`` the authenticated user who wrote.
    """

    ref: dict[str, str]
    verb: str
    tool: str
    args: dict[str, Any]
    expected: dict[str, Any]
    uid: str
    prior_version: str
    user: str

    @property
    def changes_nothing(self) -> bool:
        """True for an update whose post state equals its prior state (nothing to store, nothing to undo)."""
        prior = self.args.get("prior")
        return self.verb in ("patch", "scale") and isinstance(prior, Mapping) and kube.matches(prior, self.expected)


@dataclass(frozen=True)
class Settlement:
    """A recorded write's outcome: ``outcome`` (``succeeded`` or ``failed``), its ``result`` (succeeded) or
    ``error`` (failed)."""

    outcome: str
    result: dict[str, Any] | None = None
    error: str | None = None


def written(request: Mapping[str, Any], parent: Mapping[str, Any] | None = None) -> Written | None:
    """The recorded write of an admission review's ``request`` (``AdmissionReview.request``), or ``None`` when
    it records nothing: a dry run, a subresource other than ``scale``, a kind of :data:`UNRECORDED_GROUPS` or
    :data:`UNRECORDED_CORE`. ``parent`` is the object a ``scale`` write scales, as read just before (required
    for it).

    Raises :class:`reversi.engine.kube.OutOfScope` for an object with no namespace or name, ``ValueError`` for
    a malformed review or a scale with no ``parent`` (docs/concepts.md#recording-with-no-agent-code).
    """
    if request.get("dryRun"):
        return None
    resource = request.get("resource") or {}
    group, plural = str(resource.get("group") or ""), str(resource.get("resource") or "")
    if group in UNRECORDED_GROUPS or (not group and plural in UNRECORDED_CORE):
        return None
    subresource = str(request.get("subResource") or "")
    if subresource not in ("", SCALE_SUBRESOURCE):
        return None
    verb = _OPERATIONS.get(str(request.get("operation") or ""))
    if not group and plural == "namespaces":
        raise kube.OutOfScope(f"deleting namespace {request.get('name')}, whose objects' writes are recorded, would "
                              "delete them all with no record of any: refused; close the Run first (a rollback "
                              "closes it), or delete the namespace as another user")
    if verb is None:
        raise ValueError(f"operation {request.get('operation')!r} is not a write the family records")
    old, new = _object(request, "oldObject"), _object(request, "object")
    if subresource == SCALE_SUBRESOURCE:
        if verb != "patch" or parent is None:
            raise ValueError("a scale write is recorded as an update of the object it scales, read as parent")
        verb, old = "scale", dict(parent)
        new = _scaled(parent, (new or {}).get("spec") or {})
    subject = new if verb == "create" else old
    if subject is None:
        raise ValueError(f"the review of a {request.get('operation')} carries no object")
    ref = kube.object_ref(subject)
    prior = None if verb == "create" else old
    post = None if verb == "delete" else new
    tool, args = kube.recorded_args(verb, ref, prior, post)
    meta = subject.get("metadata") or {}
    version = "" if prior is None else str((prior.get("metadata") or {}).get("resourceVersion") or "")
    return Written(ref=ref, verb=verb, tool=tool, args=args,
                   expected=kube.user_state(post) if tool not in kube.IRREVERSIBLE else dict(kube.ABSENT),
                   uid=str(meta.get("uid") or ""),
                   prior_version=version,
                   user=str((request.get("userInfo") or {}).get("username") or ""))


def settle_change(write: Written, first: Mapping[str, Any] | None, *, deleted: bool = False) -> Settlement:
    """The outcome of an update or a delete from the **first version stored after** ``write.prior_version``:
    ``first`` (``None``: none by the deadline), ``deleted`` when that version is the object's deletion.

    An update that changes nothing the user controls is ``succeeded``; a first version equal to the expected
    post state (for a delete: the deletion, or a deletionTimestamp set) is ``succeeded``; anything else is
    ``failed``: the API server refused the write after admission; the scale of a kind outside
    :data:`REPLICAS_KINDS` is ``uncertain`` (docs/concepts.md#recording-with-no-agent-code).
    """
    if write.verb == "scale" and _group_kind(write.ref) not in REPLICAS_KINDS:
        return Settlement("uncertain", error=f"{_what(write)}: a custom resource scales at the path its CRD names "
                                             "(specReplicasPath), which the review does not carry, so whether the "
                                             "version stored next is this write's cannot be told; settle it with a "
                                             "resolution (kubectl reversi resolve)")
    if write.changes_nothing and first is None:
        return Settlement("succeeded", _result(write, None))
    if write.verb == "delete":
        going = deleted or bool(first is not None and (first.get("metadata") or {}).get("deletionTimestamp"))
        if going:
            return Settlement("succeeded", _result(write, first))
        return _not_stored(write, first)
    if first is not None and not deleted and _is_expected(write, first):
        return Settlement("succeeded", _result(write, first))
    return _not_stored(write, first)


def settle_create(write: Written, live: Mapping[str, Any] | None) -> Settlement | None:
    """The outcome of a create from the object read by name after it (``None``: absent): the object with the
    review's uid is ``succeeded``; another object, or none, gives ``None`` (read again until the deadline,
    then :func:`not_created`)."""
    uid = str(((live or {}).get("metadata") or {}).get("uid") or "")
    if live is not None and (uid == write.uid or not write.uid):
        return Settlement("succeeded", _result(write, live))
    return None


def not_created(write: Written) -> Settlement:
    """A create whose object never appeared by the deadline: ``failed`` (refused after admission)."""
    return Settlement("failed", error=f"{_what(write)} was admitted, then not stored by the API server (refused after "
                                      "admission: a quota, another webhook, a lost race); nothing to undo")


def claimed_by_another(write: Written, step: int) -> Settlement:
    """The outcome of an attempt whose stored version another step of the run already settled to: ``failed``.
    A write that loses a race is admitted again (a review, a step of its own); when both reviews start from
    the same prior version, both would find the one version stored, which is one write, not two
    (docs/concepts.md#recording-with-no-agent-code)."""
    return Settlement("failed", error=f"{_what(write)} was admitted again after losing a race; the version stored is "
                                      f"another write's, step {step}'s; nothing to undo here")


def _not_stored(write: Written, first: Mapping[str, Any] | None) -> Settlement:
    if first is None:
        why = "no new version was stored"
    else:
        why = "the next version stored is another write's"
    return Settlement("failed", error=f"{_what(write)} was admitted, then not stored by the API server ({why}: refused "
                                      "after admission, e.g. by a quota or another webhook); nothing to undo")


def _is_expected(write: Written, stored: Mapping[str, Any]) -> bool:
    if write.tool in kube.IRREVERSIBLE:  # no state kept: its version came first, and it is the only writer's
        return True
    return kube.matches(write.expected, kube.user_state(stored))


def _result(write: Written, stored: Mapping[str, Any] | None) -> dict[str, Any]:
    """The step's ``result`` as :func:`reversi.engine.kube.recorded_result` gives it for the stored version; a
    delete's, or an update's that stored nothing, from what admission saw."""
    if stored is not None and write.verb != "delete":
        return kube.recorded_result(write.tool, stored)
    out: dict[str, Any] = {"uid": write.uid, "resourceVersion": "" if write.verb == "delete" else write.prior_version}
    if write.tool in kube.IRREVERSIBLE:
        return out
    size = kube.state_size(write.expected)
    return {**out, "postBytes": size} if size > kube.MAX_STATE_BYTES else {**out, "post": write.expected}


def _group_kind(ref: Mapping[str, str]) -> tuple[str, str]:
    group = ref["apiVersion"].rpartition("/")[0]
    return group, ref["kind"]


def _what(write: Written) -> str:
    ref = write.ref
    return f"the {write.verb} of {ref['kind']} {ref['namespace']}/{ref['name']}"


def _object(request: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    value = request.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"the review's {key} is not an object")
    return dict(value)


def _scaled(parent: Mapping[str, Any], scale_spec: Mapping[str, Any]) -> dict[str, Any]:
    """``parent`` with ``spec.replicas`` from a Scale's spec (the rest unchanged; the input is not modified). A
    Scale leaves out ``replicas: 0`` (``omitempty``): a missing count is 0."""
    replicas = scale_spec.get("replicas", 0)
    spec = dict(parent.get("spec") or {})
    if isinstance(replicas, int) and not isinstance(replicas, bool):
        spec["replicas"] = replicas
    return {**parent, "spec": spec}


def recorded_by(run: Mapping[str, Any]) -> tuple[str, tuple[str, ...]] | None:
    """Whose writes the Run ``run`` (a dict, as the API server returns it) holds: ``(user, namespaces)`` as its
    ``spec.record`` names them, or ``None`` when it records none or is being deleted. A Run a rollback closed
    (``status.closedBy``) still holds them: its user's writes there are refused until a newer Run records
    them or the Run is deleted, as the SDK's calls of a closed run are (rule 11;
    docs/concepts.md#recording-with-no-agent-code)."""
    meta, spec = run.get("metadata") or {}, run.get("spec") or {}
    record = spec.get("record")
    if not isinstance(record, Mapping) or meta.get("deletionTimestamp"):
        return None
    account, namespace = record.get("serviceAccount"), meta.get("namespace")
    if not isinstance(account, str) or not account or not isinstance(namespace, str) or not namespace:
        return None
    namespaces = [n for n in record.get("namespaces") or [] if isinstance(n, str) and n] or [namespace]
    return f"system:serviceaccount:{namespace}:{account}", tuple(sorted(set(namespaces)))


def recorders(recordings: Iterable[tuple[str, tuple[str, ...]] | None]) -> dict[str, tuple[str, ...]]:
    """The users recorded now, each with the namespaces any Run records it in (sorted, no repeats):
    what the recording webhook's match condition names (docs/concepts.md#recording-with-no-agent-code)."""
    out: dict[str, set[str]] = {}
    for recording in recordings:
        if recording is not None:
            out.setdefault(recording[0], set()).update(recording[1])
    return {user: tuple(sorted(namespaces)) for user, namespaces in sorted(out.items())}
