"""``reversi-kube-runner``: the compensator and reader of the built-in Kubernetes family
(docs/concepts.md#built-in-kubernetes-compensation). It runs from the operator's image as the
ServiceAccount its runner names (the namespace owner grants it the rights: docs/operations.md#the-kube-runners-rights).

Input (environment)
  REVERSI_CALL_FILE        path of the call JSON (preferred); else REVERSI_CALL, the JSON itself
  REVERSI_TERMINATION_LOG  where the failure line is written (default /dev/termination-log, if it exists)
  KUBERNETES_SERVICE_HOST  in a pod: the API server, with the pod's service-account token;
                           elsewhere the kubeconfig (KUBECONFIG) is used

Call JSON
  compensator {"tool": "kube.restore", "args": {"ref", "prior", "post", "uid"}, "forced"?}: restores the
              object to its prior state, only while it still equals the post state the recorded call
              left (a person's change since is never overwritten: exit 1, "changed since" and the
              differences; also when the object was deleted and created again since: another uid), unless
              the undo was forced; a live object that already equals the prior state is left alone
              (exit 0), one being deleted is waited for (exit 1: the next attempt decides again). A
              create is undone by a delete with the live uid and resourceVersion as preconditions, a
              delete by a create of the prior state, an update by a write of the prior content
              conditioned on the live resourceVersion.
  reader      {"tool": "kube.matches", "arguments": {"ref", "state"}}: prints
              {"matches": bool, "differences": [...]} for the live object against the state.

Exit codes: 0 success; 1 refused (changed since, a missing right, a lost race) or the API server
failed; 2 the call or the settings are wrong.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import config
from kubernetes.client.exceptions import ApiException

from ..adapters import apicalls
from ..adapters.job_io import CallError, fail, load_call
from ..adapters.kube_objects import Objects, UnknownKind
from ..engine import kube
from ..models.runstep import step_name

RESTORE, MATCHES = "kube.restore", "kube.matches"
#: the field manager of every restore (server-side apply names it as the owner of what it wrote)
FIELD_MANAGER = "reversi-kube-runner"


class Refused(Exception):
    """The undo or the read was refused: changed since, a missing right, a lost race (exit 1)."""


def _arguments(call: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    tool = call.get("tool")
    arguments = call.get("arguments") if tool == MATCHES else call.get("args")
    if tool not in (RESTORE, MATCHES):
        raise CallError(f"reversi-kube-runner runs {RESTORE} (compensator) and {MATCHES} (reader), not {tool!r}")
    if not isinstance(arguments, dict) or not isinstance(arguments.get("ref"), dict):
        raise CallError(f"{tool}: arguments must be a JSON object with a \"ref\" object")
    for key in ("apiVersion", "kind", "namespace", "name"):
        if not isinstance(arguments["ref"].get(key), str) or not arguments["ref"][key]:
            raise CallError(f"{tool}: ref.{key} is missing")
    return tool, arguments


def _denied(err: ApiException, verb: str, ref: Mapping[str, Any]) -> Refused:
    """A refusal that names the verb and the resource when a right is missing, else the server's message."""
    if err.status == 403:
        return Refused(f"{verb} {ref['kind']} {ref['namespace']}/{ref['name']} is forbidden to this runner's "
                       f"service account: grant it {verb} on that resource "
                       "(docs/operations.md#the-kube-runners-rights)")
    return Refused(f"{verb} {ref['kind']} {ref['namespace']}/{ref['name']}: {apicalls.api_message(err)}")


@dataclass(frozen=True)
class Principal:
    """Who recorded the run (``Run.spec.principal``, stamped by the API server from the agent's
    authentication) and the groups the runner asks about: those every such user has
    (:func:`groups_of`; a user's other groups are not recorded, so rights granted only through
    them do not count)."""

    user: str
    groups: list[str] = field(default_factory=list)


def principal_of(objects: Objects, run_id: str) -> Principal:
    """The principal of the Run ``run_id`` (``namespace/name``, the call's ``run_id``): the
    ServiceAccount its ``spec.record`` names, whose writes admission recorded
    (docs/concepts.md#recording-with-no-agent-code), else its ``spec.principal``. Raises
    :class:`Refused` when the Run cannot be read or names none."""
    namespace, _, name = run_id.partition("/")
    try:
        run = objects.get({"apiVersion": "reversi.dev/v1alpha1", "kind": "Run", "namespace": namespace,
                           "name": name})
    except ApiException as err:
        raise _denied(err, "get", {"kind": "Run", "namespace": namespace, "name": name}) from None
    spec = (run or {}).get("spec") or {}
    record = spec.get("record")
    user: str | None = spec.get("principal")
    if isinstance(record, dict) and record.get("serviceAccount"):  # its writes were the recorded account's own
        user = f"system:serviceaccount:{namespace}:{record['serviceAccount']}"
    if not user:
        raise Refused(f"Run {run_id} is gone or names no principal: nothing is restored for an unknown agent")
    return Principal(str(user), groups_of(str(user)))


def recorded_at_admission(objects: Objects, run_id: str, index: Any) -> bool:
    """Whether step ``index`` of the Run ``run_id`` (``namespace/name``) was recorded by the recording webhook
    (its RunStep's ``spec.runAtOpen.recordedAtAdmission``, which the API server lets only the admission server
    set): its prior and post states are then the API server's own, not the agent's word
    (docs/concepts.md#recording-with-no-agent-code). Raises :class:`Refused` when the step cannot be read."""
    namespace, _, name = run_id.partition("/")
    if not isinstance(index, int) or isinstance(index, bool) or not name:
        return False
    ref = {"apiVersion": "reversi.dev/v1alpha1", "kind": "RunStep", "namespace": namespace,
           "name": step_name(name, index)}
    try:
        step = objects.get(ref)
    except ApiException as err:
        raise _denied(err, "get", ref) from None
    return bool((((step or {}).get("spec") or {}).get("runAtOpen") or {}).get("recordedAtAdmission"))


def groups_of(user: str) -> list[str]:
    """The groups the API server gives every request of ``user``: ``system:authenticated``, and for
    a ServiceAccount (``system:serviceaccount:<ns>:<name>``) ``system:serviceaccounts`` and
    ``system:serviceaccounts:<ns>``."""
    parts = user.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        return ["system:serviceaccounts", f"system:serviceaccounts:{parts[2]}", "system:authenticated"]
    return ["system:authenticated"]


def restore(objects: Objects, args: Mapping[str, Any], forced: bool, principal: Principal | None = None,
            run: str = "") -> str:
    """Undo one recorded write (module docstring); returns what was done. Raises :class:`Refused`.
    With ``principal``, a write the run's principal itself may not make is refused (a
    LocalSubjectAccessReview): the states come from the agent's own record, so the runner, whose
    rights may be wider, never writes for it what it could not. A create that finds the object
    there already (its own earlier attempt landed, or someone created it since) reads and decides
    once more. ``run`` (``namespace/name``) marks an object created again
    (:data:`reversi.engine.kube.RESTORED_BY`), so that a later step of the same rollback on the same
    object (a change, then its delete) knows it for the one it restored."""
    try:
        return _restore_once(objects, args, forced, principal, run)
    except _CreatedMeanwhile:
        return _restore_once(objects, args, forced, principal, run)


class _CreatedMeanwhile(Exception):
    """A create answered 409: the object exists now."""


def _restore_once(objects: Objects, args: Mapping[str, Any], forced: bool, principal: Principal | None = None,
                  run: str = "") -> str:
    ref = args["ref"]
    kube.check_states(ref, args.get("prior") or {}, args.get("post") or {})
    try:
        live = objects.get(ref)
    except ApiException as err:
        raise _denied(err, "get", ref) from None
    decision = kube.decide_restore(args.get("prior") or {}, args.get("post") or {}, live, forced,
                                   uid=str(args.get("uid") or ""), run=run)
    what = f"{ref['kind']} {ref['namespace']}/{ref['name']}"
    verb = {"delete": "delete", "create": "create", "replace": "update"}.get(decision.action, "")
    # a change of content is the principal's to make with update or with patch
    asked = ("update", "patch") if verb == "update" else (verb,)
    if verb and principal is not None and not any(objects.allowed(principal.user, principal.groups, v, ref)
                                                   for v in asked):
        raise Refused(f"the run's principal {principal.user} may not {verb} {what}: Reversi never writes for an "
                      "agent what the agent itself could not write (its recorded states are its own word)")
    try:
        if decision.action == "none":
            return f"{what} already equals its prior state: nothing to do"
        if decision.action == "wait":
            raise Refused(f"{what} is being deleted: it can be neither restored nor called restored until it is gone; "
                          "the next attempt decides again")
        if decision.action == "refuse":
            raise Refused(f"changed since: {what} no longer equals the state the recorded call left, so it is not "
                          f"restored (force it with spec.force): {'; '.join(decision.differences)}")
        if decision.action == "delete":
            objects.delete(ref, uid=decision.uid or "", resource_version=decision.resource_version or "")
            return f"{what} deleted (uid {decision.uid})"
        assert decision.body is not None
        if decision.action == "create":
            objects.create(decision.body, repeat="always")
            return f"{what} created again from its prior state"
        objects.replace(decision.body)
        return f"{what} restored to its prior content"
    except apicalls.Conflict as err:
        raise Refused(f"{what} changed while it was being restored ({err}); the next attempt decides again") from None
    except ApiException as err:
        if err.status == 409 and decision.action == "create":
            raise _CreatedMeanwhile() from None
        raise _denied(err, verb, ref) from None


def read(objects: Objects, args: Mapping[str, Any]) -> dict[str, Any]:
    """The reader's answer for ``{"ref", "state"}`` (:func:`reversi.engine.kube.read_answer`)."""
    try:
        live = objects.get(args["ref"])
    except ApiException as err:
        raise _denied(err, "get", args["ref"]) from None
    return kube.read_answer(args.get("state") or {}, live)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        print(__doc__, file=sys.stdout if argv[0] in ("-h", "--help") else sys.stderr)
        return 0 if argv[0] in ("-h", "--help") else 2
    env = dict(os.environ)
    try:
        call = load_call(env)
        tool, args = _arguments(call)
        objects = Objects(apicalls.api_client(), FIELD_MANAGER)
        if tool == MATCHES:
            print(json.dumps(read(objects, args)))
        else:
            run_id = str(call.get("run_id") or "")
            # a step recorded at admission holds the API server's own states: nothing of the agent's word to check
            principal = None if recorded_at_admission(objects, run_id, call.get("step")) else principal_of(objects,
                                                                                                          run_id)
            print(restore(objects, args, bool(call.get("forced")), principal, run_id))
    except (CallError, ValueError, config.ConfigException) as err:
        return fail(2, str(err), env)
    except (Refused, UnknownKind) as err:
        return fail(1, str(err), env)
    except _CreatedMeanwhile:
        return fail(1, "the object was created again twice while it was being restored; the next attempt decides "
                    "again", env)
    except ApiException as err:
        return fail(1, f"the API server failed: {apicalls.api_message(err)}", env)
    except Exception as err:  # noqa: BLE001 - unreachable API server, a client error: one line, never a traceback
        return fail(1, f"{type(err).__name__}: {err}", env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
