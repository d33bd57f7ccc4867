"""Where each write of Reversi's kinds is checked: the admission webhooks, and the admission policy
the API server evaluates itself. Pure builders of the registration objects, and their apply.

The table :data:`HOOKS` is the one list of webhooks: the admission server
(:mod:`reversi.handlers.admission`) serves each at ``/<path>``, the local control plane registers
them from here (:func:`register`), and the Helm chart's ``reversi.webhooks`` table renders the same
rules and match conditions (a chart test holds the two equal).

The recording hot path (docs/operations.md#admission-where-each-rule-is-enforced):

- a **RunStep create** (the ``intended`` record) crosses one webhook, ``mutate-runstep``, which
  stamps what comes from the server and checks every rule that needs other objects (the Run, its
  principal and lock, the previous step, halts, the manifest, forward duplicates);
- a **RunStep outcome write** crosses none: :data:`OUTCOME_MATCH` keeps both RunStep webhooks out of
  it, and the ValidatingAdmissionPolicy :func:`outcome_policy` (CEL in the API server) checks it:
  only the step's principal (``spec.principal``, stamped at create and immutable) may write it,
  and its ``result`` stays within :data:`reversi.models.runstep.MAX_CALL_BYTES`. A write that
  changes anything else (a resolution, a stamp a client dropped) still goes to the webhooks.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from ..engine.kube_review import UNRECORDED_CORE, UNRECORDED_GROUPS
from ..models.runstep import MAX_CALL_BYTES
from . import apicalls as calls
from . import policies

GROUP, VERSION = "reversi.dev", "v1alpha1"
#: name of the local webhook configurations (both kinds) and prefix of the policies' names
NAME = "reversi.dev"

#: A RunStep update that is only an outcome write by a step that carries its principal: the
#: webhooks are not called for it (the API server's policy checks it). Everything else is:
#: creates, deletes, an update of a step recorded before steps carried their principal, a new
#: resolution (its actor and time are stamped), or a write that drops a stamp or a label.
OUTCOME_MATCH = (
    "request.operation != 'UPDATE' || !has(oldObject.spec.principal) || "
    "has(object.spec.resolution) != has(oldObject.spec.resolution) || "
    "!has(object.spec.principal) || "
    "has(object.spec.snapshot) != has(oldObject.spec.snapshot) || "
    "has(object.spec.recordedAt) != has(oldObject.spec.recordedAt) || "
    "(has(object.metadata.labels) ? object.metadata.labels : {}) != "
    "(has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}) || "
    "(has(object.metadata.ownerReferences) ? object.metadata.ownerReferences : []) != "
    "(has(oldObject.metadata.ownerReferences) ? oldObject.metadata.ownerReferences : [])"
)


#: The API server's own ceiling on a ``result`` written with the outcome (no webhook sees that
#: write): bytes of CEL's text of the value (``'%s'.format``: keys sorted, ", " between items,
#: floats with six decimals), which is never shorter than its canonical JSON. The documented limit
#: is :data:`MAX_CALL_BYTES` of JSON, which the SDK checks before it writes; twice that here does
#: not refuse what the SDK admits, and keeps any client's result under what etcd refuses (stored,
#: it can take up to about six times that: the API server writes ``<``, ``>`` and ``&`` as
#: ``\u003c`` and so on) (docs/concepts.md#the-journal).
RESULT_CEILING_BYTES = 2 * MAX_CALL_BYTES


@dataclass(frozen=True)
class Hook:
    """One webhook: served at ``/<path>``, registered for ``operations`` on ``resources``."""

    kind: str  # "mutating" or "validating"
    name: str  # the kind it checks, e.g. "runstep"
    resources: tuple[str, ...]
    operations: tuple[str, ...]
    side_effects: str = "None"
    #: (name, CEL expression): the API server calls the webhook only when every one is true
    match_conditions: tuple[tuple[str, str], ...] = field(default=())
    #: ``Ignore`` whatever the configuration's failure policy: a Halt must be storable while no
    #: admission replica answers (it is in force through the API server's halts policy)
    fail_open: bool = False

    @property
    def path(self) -> str:
        return f"/{'mutate' if self.kind == 'mutating' else 'validate'}-{self.name}"

    @property
    def webhook_name(self) -> str:
        return f"{self.name}.{'mutate' if self.kind == 'mutating' else 'validate'}.reversi.dev"


#: The controllers that delete RunSteps with their Run or their namespace: the garbage collector
#: (a step's owner, its Run, is gone) and the namespace controller (the namespace goes, its Runs
#: with it), under their own ServiceAccounts or, without ``--use-service-account-credentials``,
#: as kube-controller-manager. A RunStep is deleted only with its Run, and these deletes are
#: that: ``validate-runstep`` is not called for them, so deleting a Run or a namespace neither
#: costs a review per step nor waits for an admission replica (``failurePolicy: Fail``).
CLEANUP_USERS = (
    "system:serviceaccount:kube-system:generic-garbage-collector",
    "system:serviceaccount:kube-system:namespace-controller",
    "system:kube-controller-manager",
)
CLEANUP_MATCH = ("request.operation != 'DELETE' || !(request.userInfo.username in ["
                 + ", ".join(f"'{user}'" for user in CLEANUP_USERS) + "])")

#: A RunStep create that is a recorded call (it carries ``spec.runAtOpen``) is stamped and checked
#: by the API server's own policies (:mod:`reversi.adapters.policies`), not by ``mutate-runstep``.
RECORDED_CALL_SKIP = f"!({policies.RECORDED_CALL})"

_OUTCOME_SKIP = (("not-an-outcome-write", OUTCOME_MATCH),)
HOOKS: tuple[Hook, ...] = (
    Hook("mutating", "run", ("runs",), ("CREATE", "UPDATE")),
    # the create of a step is checked here, once (stamped, then checked; re-invoked if a later
    # mutation changes it), so recording a call crosses one webhook
    Hook("mutating", "runstep", ("runsteps",), ("CREATE", "UPDATE"), "NoneOnDryRun",
         (*_OUTCOME_SKIP, ("not-a-recorded-call", RECORDED_CALL_SKIP))),
    Hook("mutating", "rollbackrequest", ("rollbackrequests",), ("CREATE", "UPDATE")),
    Hook("validating", "run", ("runs",), ("CREATE", "UPDATE"), "NoneOnDryRun"),
    Hook("validating", "runstep", ("runsteps",), ("UPDATE", "DELETE"), "None",
         (*_OUTCOME_SKIP, ("not-a-controller-cleanup", CLEANUP_MATCH))),
    Hook("validating", "rollbackrequest", ("rollbackrequests",), ("CREATE", "UPDATE")),
    Hook("validating", "toolmanifest", ("toolmanifests",), ("CREATE", "UPDATE")),
    Hook("validating", "halt", ("halts",), ("CREATE", "UPDATE"), fail_open=True),
    Hook("validating", "clusterhalt", ("clusterhalts",), ("CREATE", "UPDATE"), fail_open=True),
)


#: The recording webhook (docs/concepts.md#recording-with-no-agent-code): the writes of the users that
#: Runs record, to namespaced objects of any kind (and ``kubectl scale``), in a configuration of its
#: own (:func:`record_configuration`) whose match condition the operator keeps (:func:`recorded_users`).
RECORD_HOOK = Hook("validating", "record", ("*", "*/scale"), ("CREATE", "UPDATE", "DELETE"), "NoneOnDryRun")
#: the recording webhook configuration's name on the local control plane (the chart's: ``<release>-record``)
RECORD_NAME = f"{NAME}-record"
#: the users one recording configuration names at most (Runs that record, counted by user)
MAX_RECORDED_USERS = 256
#: the name of the recording webhook's one match condition (the operator replaces it)
RECORDED_USERS = "recorded-users"
#: CEL: the write is of a kind that is recorded (the groups and core resources the recorder leaves out,
#: :data:`reversi.engine.kube_review.UNRECORDED_GROUPS` and ``UNRECORDED_CORE``, never reach it)
_UNRECORDED = (f"!(request.resource.group in [{', '.join(map(policies.cel_string, sorted(UNRECORDED_GROUPS)))}]) && "
               "!(request.resource.group == '' && request.resource.resource in "
               f"[{', '.join(map(policies.cel_string, sorted(UNRECORDED_CORE)))}])")


def recorded_users(recorders: Mapping[str, Sequence[str]]) -> str:
    """CEL: the write is one of ``recorders``' (user -> namespaces, :func:`reversi.engine.kube_review.recorders`)
    in one of its namespaces, and of a kind that is recorded; ``false`` when none records. Raises
    ``ValueError`` past :data:`MAX_RECORDED_USERS` users."""
    if not recorders:
        return "false"
    if len(recorders) > MAX_RECORDED_USERS:
        raise ValueError(f"{len(recorders)} users are recorded at once, more than the limit of {MAX_RECORDED_USERS}")
    table = "{" + ", ".join(f"{policies.cel_string(user)}: [{', '.join(map(policies.cel_string, spaces))}]"
                            for user, spaces in sorted(recorders.items())) + "}"
    # a namespace's own delete names the namespace as request.name (the recorder refuses it)
    where = "(request.resource.group == '' && request.resource.resource == 'namespaces' ? request.name : " \
            "request.namespace)"
    return (f"request.userInfo.username in {table} && {where} in {table}[request.userInfo.username] && "
            f"{_UNRECORDED}")


def record_configuration(client_config: Any, recorders: Mapping[str, Sequence[str]], *,
                         name: str = RECORD_NAME, timeout_seconds: int = 10) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration of the recording webhook (a dict): every namespaced kind, create,
    update (and ``scale``) and delete, ``failurePolicy: Fail`` (a recorded user's write is refused while no
    replica answers, never let through unrecorded), called only for the writes :func:`recorded_users` names.
    ``client_config(hook)`` gives its ``clientConfig``."""
    webhook = {
        "name": RECORD_HOOK.webhook_name, "admissionReviewVersions": ["v1"], "sideEffects": RECORD_HOOK.side_effects,
        "failurePolicy": "Fail", "timeoutSeconds": timeout_seconds, "matchPolicy": "Equivalent",
        "clientConfig": client_config(RECORD_HOOK),
        "rules": [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": list(RECORD_HOOK.operations),
                   "resources": list(RECORD_HOOK.resources), "scope": "Namespaced"},
                  # the delete of a recorded namespace, refused: its objects would go with no record
                  {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"], "resources": ["namespaces"],
                   "scope": "Cluster"}],
        "matchConditions": [{"name": RECORDED_USERS, "expression": recorded_users(recorders)}],
    }
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name}, "webhooks": [webhook]}


def condition_of(configuration: Mapping[str, Any]) -> str:
    """The recording configuration's match condition (a dict of it, as the API server returns it): its
    expression, ``""`` when it has none."""
    hooks = configuration.get("webhooks") or []
    for condition in (hooks[0].get("matchConditions") or []) if hooks else []:
        if condition.get("name") == RECORDED_USERS:
            return str(condition.get("expression"))
    return ""


def recorded_now(api: client.ApiClient, name: str) -> str | None:
    """The recording configuration ``name``'s match condition as it stands, or ``None`` when there is no such
    configuration (the chart's ``webhook.enabled`` off, or not installed yet). Raises ``ApiException``."""
    adm = client.AdmissionregistrationV1Api(api)
    try:
        body = calls.call(adm.read_validating_webhook_configuration, name, _preload_content=False)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return condition_of(json.loads(body.data))


def set_recorded(api: client.ApiClient, name: str, recorders: Mapping[str, Sequence[str]]) -> None:
    """Make the recording configuration ``name`` call its webhook for ``recorders``' writes only: one JSON
    patch of its match conditions. Raises ``ApiException`` (404: no such configuration)."""
    adm = client.AdmissionregistrationV1Api(api)
    patch = [{"op": "replace", "path": "/webhooks/0/matchConditions",
              "value": [{"name": RECORDED_USERS, "expression": recorded_users(recorders)}]}]
    calls.call(adm.patch_validating_webhook_configuration, name, patch, _content_type=calls.JSON_PATCH)


def configuration(kind: str, client_config: Any, *, failure_policy: str = "Fail", timeout_seconds: int = 10,
                  name: str = NAME) -> dict[str, Any]:
    """The Mutating- or ValidatingWebhookConfiguration (a dict) of the :data:`HOOKS` of ``kind``.
    ``client_config(hook)`` gives each webhook's ``clientConfig`` (a URL and CA locally, a
    Service in the chart)."""
    webhooks = []
    for hook in HOOKS:
        if hook.kind != kind:
            continue
        webhook: dict[str, Any] = {
            "name": hook.webhook_name, "admissionReviewVersions": ["v1"], "sideEffects": hook.side_effects,
            "failurePolicy": "Ignore" if hook.fail_open else failure_policy, "timeoutSeconds": timeout_seconds,
            "matchPolicy": "Equivalent",
            "clientConfig": client_config(hook),
            "rules": [{"apiGroups": [GROUP], "apiVersions": [VERSION], "operations": list(hook.operations),
                       "resources": list(hook.resources), "scope": "*"}],
        }
        if kind == "mutating":
            webhook["reinvocationPolicy"] = "IfNeeded"  # a later mutation (of anyone) is checked again
        if hook.match_conditions:
            webhook["matchConditions"] = [{"name": n, "expression": e} for n, e in hook.match_conditions]
        webhooks.append(webhook)
    return {"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration" if kind == "mutating" else "ValidatingWebhookConfiguration",
            "metadata": {"name": name}, "webhooks": webhooks}


def _same_value(field_: str) -> str:
    return (f"has(object.spec.{field_}) == has(oldObject.spec.{field_}) && "
            f"(!has(object.spec.{field_}) || object.spec.{field_} == oldObject.spec.{field_})")


#: CEL: the update changes the call's record (outcome, result or error)
_CALL_CHANGED = f"!(object.spec.outcome == oldObject.spec.outcome && {_same_value('result')} && {_same_value('error')})"


def outcome_policy(name: str = f"{NAME}-runstep-outcome", recorder: str | None = None) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy the API server evaluates on every RunStep update of a step
    that carries its principal (rule 10 and the size limit, with the webhooks' messages): only the
    step's principal, or ``recorder`` (the admission server, which settles the outcome of the writes it
    records: docs/concepts.md#recording-with-no-agent-code; of a step it marked
    ``runAtOpen.recordedAtAdmission``, the recorder alone), changes its outcome, result or error; a
    ``result`` is at most :data:`RESULT_CEILING_BYTES` bytes of CEL's text of it."""
    run = "'Run ' + object.metadata.namespace + '/' + object.spec.runRef.name"
    is_recorder = f"request.userInfo.username == {policies.cel_string(recorder)}" if recorder else "false"
    marked = ("has(oldObject.spec.runAtOpen) && has(oldObject.spec.runAtOpen.recordedAtAdmission) && "
              "oldObject.spec.runAtOpen.recordedAtAdmission")
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [GROUP], "apiVersions": [VERSION],
                                                    "operations": ["UPDATE"], "resources": ["runsteps"]}]},
            "matchConditions": [{"name": "step-carries-its-principal",
                                 "expression": "has(oldObject.spec.principal)"}],
            "validations": [
                # a step the recording webhook recorded is settled by it alone: its outcome is what the
                # API server stored, never the agent's word (docs/concepts.md#recording-with-no-agent-code)
                {"expression": f"!({_CALL_CHANGED}) || ({marked} ? {is_recorder} : "
                               f"(request.userInfo.username == oldObject.spec.principal || {is_recorder}))",
                 "reason": "Forbidden",
                 "messageExpression": f"({marked}) ? 'step ' + string(object.spec.index) + ' of ' + {run} + ' was "
                                      "recorded at admission: its outcome is what the API server stored, and only "
                                      "Reversi\\'s recorder settles it; ' + request.userInfo.username + ' may not' : "
                                      f"{run} + ' belongs to another principal (' + oldObject.spec.principal + '); ' "
                                      "+ request.userInfo.username + ' may not add or change its steps: open a Run "
                                      "of your own'"},
                {"expression": f"!has(object.spec.result) || size(bytes('%s'.format([object.spec.result]))) <= "
                               f"{RESULT_CEILING_BYTES}",
                 "reason": "Invalid",
                 "messageExpression": "'step ' + string(object.spec.index) + ' (' + object.spec.tool + '): result "
                                      f"is more than {RESULT_CEILING_BYTES} bytes as the API server measures it, past "
                                      f"the limit of {MAX_CALL_BYTES} bytes of JSON per step; record a reference "
                                      "(an id, a URL) instead of the whole payload'"},
            ],
        },
    }


def outcome_binding(name: str = f"{NAME}-runstep-outcome") -> dict[str, Any]:
    """The binding that puts :func:`outcome_policy` in force in every namespace (Deny)."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}}


def url_client_config(base_url: str, ca_pem: bytes) -> Any:
    """``clientConfig`` by URL (``https://127.0.0.1:<port>``), for the local control plane."""
    bundle = base64.b64encode(ca_pem).decode()
    return lambda hook: {"url": f"{base_url.rstrip('/')}{hook.path}", "caBundle": bundle}


def _apply(create: Any, replace: Any, read: Any, body: dict[str, Any]) -> None:
    """Create ``body``, or replace the object of that name with it."""
    name = body["metadata"]["name"]
    try:
        calls.call(create, body, repeat="unsent")
    except ApiException as err:
        if err.status != 409:
            raise
        current = calls.call(read, name)
        body = {**body, "metadata": {**body["metadata"], "resourceVersion": current.metadata.resource_version}}
        calls.call(replace, name, body)


def register(api: client.ApiClient, client_config: Any, *, failure_policy: str = "Fail",
             timeout_seconds: int = 10, recorder: str | None = None,
             recorders: Mapping[str, Sequence[str]] | None = None) -> None:
    """Create or replace the webhook configurations of :data:`HOOKS`, the recording configuration (its
    match condition kept when it exists, else naming ``recorders``: users -> namespaces) and the policies
    with their bindings (local control plane; the chart renders the same objects). Raises ``ApiException``."""
    adm = client.AdmissionregistrationV1Api(api)
    _apply(adm.create_mutating_webhook_configuration, adm.replace_mutating_webhook_configuration,
           adm.read_mutating_webhook_configuration,
           configuration("mutating", client_config, failure_policy=failure_policy, timeout_seconds=timeout_seconds))
    _apply(adm.create_validating_webhook_configuration, adm.replace_validating_webhook_configuration,
           adm.read_validating_webhook_configuration,
           configuration("validating", client_config, failure_policy=failure_policy,
                         timeout_seconds=timeout_seconds))
    record = record_configuration(client_config, recorders or {}, timeout_seconds=timeout_seconds)
    current = recorded_now(api, RECORD_NAME)
    if current:  # kept: the operator names the recorded users in it
        record["webhooks"][0]["matchConditions"] = [{"name": RECORDED_USERS, "expression": current}]
    _apply(adm.create_validating_webhook_configuration, adm.replace_validating_webhook_configuration,
           adm.read_validating_webhook_configuration, record)
    register_policies(api, recorder)


def _verbs(adm: client.AdmissionregistrationV1Api, kind: str) -> tuple[Any, Any, Any]:
    """(create, replace, read) of the admissionregistration kind ``kind`` (e.g.
    ``MutatingAdmissionPolicyBinding``)."""
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in kind).lstrip("_")
    return (getattr(adm, f"create_{snake}"), getattr(adm, f"replace_{snake}"), getattr(adm, f"read_{snake}"))


def register_policies(api: client.ApiClient, recorder: str | None = None) -> None:
    """Create or replace the outcome policy, the recorded call's policies
    (:func:`reversi.adapters.policies.recording_policies`, ``recorder`` the admission server's user)
    and their bindings. Raises ``ApiException``."""
    adm = client.AdmissionregistrationV1Api(api)
    for body in (outcome_policy(recorder=recorder), outcome_binding(), *policies.recording_policies(NAME, recorder)):
        _apply(*_verbs(adm, body["kind"]), body)


def unregister(api: client.ApiClient, name: str = NAME) -> None:
    """Delete the local webhook configurations (``failurePolicy: Fail``: with no admission server
    left to answer, they would refuse every write of Reversi's kinds) (404s are fine).

    The admission policies stay, as a chart's stay while it is installed: the API server runs
    them, with or without an admission server. Deleting and creating them again would open a
    window of up to 30 s in which the API server refuses every RunStep create ("failed to
    configure policy": it resolves the halts policies' CRD param kinds again through a discovery
    it refreshes every 30 s)."""
    adm = client.AdmissionregistrationV1Api(api)
    named = [(adm.delete_validating_webhook_configuration, name), (adm.delete_mutating_webhook_configuration, name),
             (adm.delete_validating_webhook_configuration, f"{name}-record")]
    for delete, obj in named:
        try:
            delete(obj)
        except ApiException as err:
            if err.status != 404:
                raise
