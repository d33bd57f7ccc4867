"""The plugin's connection to the API server and the reads and writes its commands make.

Every expected failure becomes a :class:`CliError` whose message names the object and the fix;
``main`` prints it as one line (``error: ...``) and exits 1. Every API call goes through
:mod:`reversi.adapters.apicalls` (timeout, paging, retries of transient errors).
"""

from __future__ import annotations

import builtins
import json
import re
import os
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any, overload
from collections.abc import Callable

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from ..adapters import apicalls as calls
from ..adapters import journal
from ..adapters.apicalls import api_message as server_message  # re-exported: the commands quote the server

GROUP, VERSION = calls.GROUP, calls.VERSION
API_VERSION = f"{GROUP}/{VERSION}"
JSON_PATCH = calls.JSON_PATCH
#: Seconds any one API call may take (connect and read) before the plugin gives up on it.
TIMEOUT = calls.TIMEOUT
IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

#: plural -> kind, for messages
KINDS = {"runs": "Run", "runsteps": "RunStep", "rollbackrequests": "RollbackRequest", "halts": "Halt",
         "clusterhalts": "ClusterHalt", "toolmanifests": "ToolManifest"}


class CliError(Exception):
    """An expected failure: the message is one line that names the object and the fix."""


_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def check_name(name: str, kind: str) -> str:
    """``name`` if it is a valid object name, else :class:`CliError`. An empty name must never
    reach the API: there it means the whole collection (a delete would remove every object)."""
    if not name or len(name) > 253 or not _NAME.match(name):
        raise CliError(f"{name!r} is not a valid {kind} name (lowercase letters, digits, '-' and '.'); "
                       f"list them with kubectl get {kind.lower()}s")
    return name


def _kind(plural: str) -> str:
    return KINDS.get(plural, plural)


def _details(err: ApiException) -> dict:
    try:
        return json.loads(err.body or "{}").get("details") or {}
    except (TypeError, ValueError, AttributeError):
        return {}


def _not_found_is_object(err: ApiException, name: str) -> bool:
    """A 404 for the object itself (``details.name``), not for its kind (CRD not installed)."""
    return calls.not_found(err, name)


def refused(err: ApiException, what: str) -> CliError:
    """A server refusal as one line: ``<what> refused (<Reason>): <server message>``."""
    try:
        reason = json.loads(err.body or "{}").get("reason") or err.reason
    except (TypeError, ValueError, AttributeError):
        reason = err.reason
    message = server_message(err).replace("\n", " ")
    hint = ""
    if err.status == 401:
        hint = "; your credentials were not accepted: check --kubeconfig and --context"
    return CliError(f"{what} refused ({reason}): {message}{hint}")


@dataclass
class Connection:
    """An API client plus the namespace and context the commands work in."""

    api: client.ApiClient
    namespace: str
    context: str | None
    server: str

    def __post_init__(self) -> None:
        self.custom = client.CustomObjectsApi(self.api)

    @cached_property
    def core(self) -> client.CoreV1Api:
        """Core v1 (Events), made on first use: importing it costs about a second."""
        return client.CoreV1Api(self.api)

    # ---------------------------------------------------------------------- reads

    def where(self, plural: str, name: str, namespace: str | None) -> str:
        kind = KINDS.get(plural, plural)
        return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"

    @overload
    def get(self, plural: str, name: str, namespace: str | None = None, *, cluster: bool = False,
            missing: str) -> dict: ...

    @overload
    def get(self, plural: str, name: str, namespace: str | None = None, *, cluster: bool = False,
            missing: None = None) -> dict | None: ...

    def get(self, plural: str, name: str, namespace: str | None = None, *, cluster: bool = False,
            missing: str | None = None) -> dict | None:
        """The object, or ``None`` when it does not exist (or :class:`CliError` with ``missing``
        as the fix when given). ``cluster``: a cluster-scoped kind."""
        check_name(name, _kind(plural))
        ns = None if cluster else (namespace or self.namespace)
        try:
            return calls.read(self.custom, plural, name, ns)
        except ApiException as err:
            if err.status == 404 and _not_found_is_object(err, name):
                if ns:
                    self.check_namespace(ns)  # a typo'd -n reads as a missing object otherwise
                if missing is None:
                    return None
                raise CliError(f"{self.where(plural, name, ns)} not found; {missing}") from err
            raise self.api_error(err, f"reading {self.where(plural, name, ns)}", plural, ns) from err

    def list(self, plural: str, namespace: str | None = None, *, cluster: bool = False,
             all_namespaces: bool = False) -> list[dict]:
        """Every object of a kind in the namespace (or all namespaces, or cluster-scoped), paged."""
        ns = None if cluster or all_namespaces else namespace or self.namespace
        try:
            return calls.list_objects(self.custom, plural, ns)
        except ApiException as err:
            where = f"namespace {ns}" if ns else "all namespaces"
            raise self.api_error(err, f"listing {plural}.{GROUP} in {where}", plural, ns) from err

    def run_steps(self, run: str, namespace: str | None = None) -> builtins.list[dict]:
        """Every RunStep of Run ``run`` (dicts), ordered by index: one paged LIST by the run's
        label, never a GET per step."""
        ns = namespace or self.namespace
        check_name(run, "Run")
        try:
            return journal.list_objects(self.custom, ns, run)
        except ApiException as err:
            raise self.steps_error(err, ns, run) from err

    def steps_error(self, err: ApiException, namespace: str, run: str) -> CliError:
        what = f"listing the RunSteps of Run {namespace}/{run}"
        if err.status == 404:  # Runs are known (the Run was read), RunSteps are not: CRDs of 0.1
            return CliError(f"{what}: the server does not know runsteps.{GROUP} (its Reversi CRDs are older "
                            "than this plugin); install the current ones with kubectl apply -f crds/ or the Helm chart")
        return self.api_error(err, what)

    def events_for(self, namespace: str, kind: str, uids: set[str]) -> builtins.list[dict]:
        """Core v1 Events about objects of ``kind`` whose uid is in ``uids`` (paged), as
        ``{uid, name, reason, message, type, time}``, oldest first."""
        out: list[dict] = []
        if not uids:
            return out
        selector = f"involvedObject.kind={kind}"
        if len(uids) == 1:
            selector += f",involvedObject.uid={next(iter(uids))}"
        try:
            events, _ = calls.list_all(self.core.list_namespaced_event, namespace, field_selector=selector)
        except ApiException as err:
            raise self.api_error(err, f"listing Events in namespace {namespace}") from err
        for e in events:
            obj = e.involved_object
            if obj is None or obj.uid not in uids:
                continue
            moment = e.event_time or e.last_timestamp or e.first_timestamp or e.metadata.creation_timestamp
            out.append({"uid": obj.uid, "name": obj.name, "reason": e.reason, "message": e.message,
                        "type": e.type, "time": _rfc3339(moment)})
        out.sort(key=lambda e: e["time"] or "")
        return out

    # ---------------------------------------------------------------------- writes

    def create(self, plural: str, body: dict, *, cluster: bool = False) -> dict:
        name = check_name(body["metadata"].get("name", ""), _kind(plural))
        ns = None if cluster else body["metadata"].get("namespace") or self.namespace
        try:  # a 409 is "choose another name": repeated only when it surely did not land
            created = calls.create(self.custom, plural, body, ns)
            assert created is not None  # without exists_ok a 409 raises
            return created
        except ApiException as err:
            if err.status == 409:
                raise CliError(f"{self.where(plural, name, ns)} already exists; choose another name") from err
            raise self.api_error(err, f"creating {self.where(plural, name, ns)}", plural, ns) from err

    def patch(self, plural: str, name: str, body: Any, *, json_patch: bool = False, cluster: bool = False,
              namespace: str | None = None) -> dict:
        """Patch an object (merge patch, or a JSON patch); a refusal raises :class:`ApiException`
        (a lost race too: :func:`retry_conflicts` reads it). Retried on transient errors: the
        commands' patches are merge patches or guarded by a ``test`` whose caller reads again
        (:mod:`reversi.adapters.apicalls`)."""
        check_name(name, _kind(plural))
        try:
            return calls.patch(self.custom, plural, name, body, None if cluster else namespace or self.namespace,
                               json_patch=json_patch)
        except calls.Conflict as lost:
            assert lost.error is not None
            raise lost.error from None

    def delete(self, plural: str, name: str, *, cluster: bool = False, namespace: str | None = None) -> bool:
        """Delete an object; False when it did not exist."""
        check_name(name, _kind(plural))
        ns = None if cluster else namespace or self.namespace
        try:
            if calls.delete(self.custom, plural, name, ns):
                return True
            if ns:
                self.check_namespace(ns)
            return False
        except ApiException as err:
            if err.status == 404 and _not_found_is_object(err, name):
                if ns:
                    self.check_namespace(ns)
                return False
            raise self.api_error(err, f"deleting {self.where(plural, name, ns)}", plural, ns) from err

    def whoami(self) -> str | None:
        """The authenticated user's name (SelfSubjectReview), or ``None`` when the server cannot tell."""
        try:
            review = calls.call(client.AuthenticationV1Api(self.api).create_self_subject_review,  # changes nothing
                                {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        except (ApiException, ValueError, AttributeError):
            return None
        info = getattr(getattr(review, "status", None), "user_info", None)
        return getattr(info, "username", None) or None

    # ---------------------------------------------------------------------- errors

    def check_namespace(self, namespace: str | None = None) -> None:
        """:class:`CliError` ``namespace … not found`` when the namespace does not exist; nothing
        when it does or when the server will not tell (no permission to read namespaces)."""
        ns = namespace or self.namespace
        try:
            calls.call(self.core.read_namespace, ns)
        except ApiException as err:
            if err.status == 404:
                raise CliError(f"namespace {ns} not found; check -n/--namespace "
                               "(kubectl get namespaces lists them)") from err

    def kind_known(self, plural: str) -> bool | None:
        """Whether discovery lists ``plural`` in reversi.dev/v1alpha1 (None: discovery failed)."""
        try:
            resources = calls.call(self.custom.get_api_resources, GROUP, VERSION)
        except ApiException as err:
            return False if err.status == 404 else None
        names = {r.get("name") if isinstance(r, dict) else getattr(r, "name", None)
                 for r in (resources.get("resources") if isinstance(resources, dict)
                           else getattr(resources, "resources", None)) or []}
        return plural in names

    def api_error(self, err: ApiException, what: str, plural: str | None = None,
                  namespace: str | None = None) -> CliError:
        """An unexpected API answer as a :class:`CliError` naming the fix where one is known. A 404
        is read for what it is: a missing namespace (the server's details, or a namespace check),
        or the CRDs not installed only when discovery says so."""
        if err.status == 404:
            details = _details(err)
            if details.get("kind") == "namespaces":
                return CliError(f"{what}: namespace {details.get('name') or namespace} not found; check "
                                "-n/--namespace (kubectl get namespaces lists them)")
            if namespace:
                try:
                    self.check_namespace(namespace)
                except CliError as missing:
                    return CliError(f"{what}: {missing}")
            if plural is not None and self.kind_known(plural) is False:
                return CliError(f"{what}: the server does not know {plural + '.' if plural else ''}{GROUP}/{VERSION} "
                                "(the Reversi CRDs are not installed); install them with kubectl apply -f crds/ "
                                "or the Helm chart")
            return refused(err, what)
        if err.status == 403:
            return CliError(f"{what}: forbidden: {server_message(err)}; ask for RBAC access "
                            "(kubectl auth can-i --list shows what you may do)")
        return refused(err, what)


def _rfc3339(moment: Any) -> str | None:
    if moment is None:
        return None
    if hasattr(moment, "astimezone"):
        import datetime as dt

        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        text = moment.astimezone(dt.UTC).isoformat(timespec="microseconds")
        return text.replace("+00:00", "Z")
    return str(moment)


def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Connection:
    """Load the kubeconfig (``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``; in a
    pod with none of them, the service account), pick the context and the namespace
    (``--namespace``, else the context's, else ``default``)."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if kubeconfig and not os.path.exists(kubeconfig):
        raise CliError(f"kubeconfig {kubeconfig} not found; pass an existing file to --kubeconfig")
    has_file = any(os.path.exists(p) for p in path.split(os.pathsep) if p)
    if not has_file and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config()
        except config.ConfigException as err:
            raise CliError(f"no kubeconfig at {path} and no usable service account ({err}); "
                           "pass --kubeconfig or set KUBECONFIG") from err
        ns = namespace
        if ns is None and os.path.exists(IN_CLUSTER_NAMESPACE):
            with open(IN_CLUSTER_NAMESPACE) as fh:
                ns = fh.read().strip() or None
        api = client.ApiClient()
        return Connection(api, ns or "default", None, api.configuration.host)
    if not has_file:
        raise CliError(f"no kubeconfig at {path}; pass --kubeconfig or set KUBECONFIG")
    try:
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig or path)
    except (config.ConfigException, OSError, ValueError, TypeError) as err:
        raise CliError(f"cannot read kubeconfig {path}: {err}; fix it or pass another with --kubeconfig") from err
    if context is not None:
        chosen = next((c for c in contexts or [] if c.get("name") == context), None)
        if chosen is None:
            names = ", ".join(c.get("name", "?") for c in contexts or []) or "none"
            raise CliError(f"context {context} not found in kubeconfig {path} (contexts: {names}); "
                           "list them with kubectl config get-contexts")
    else:
        chosen = active
        if not chosen:
            raise CliError(f"kubeconfig {path} has no current context; pass --context "
                           "(kubectl config get-contexts lists them)")
    ns = namespace or (chosen.get("context") or {}).get("namespace") or "default"
    try:
        api = config.new_client_from_config(config_file=kubeconfig or path, context=chosen.get("name"))
    except (config.ConfigException, OSError, ValueError, TypeError) as err:
        raise CliError(f"cannot use context {chosen.get('name')} of kubeconfig {path}: {err}; "
                       "fix the kubeconfig or pass another --context") from err
    return Connection(api, ns, chosen.get("name"), api.configuration.host)


#: What the API server says when a JSON patch cannot be applied, e.g. a failed ``test`` op.
PATCH_NOT_APPLICABLE = calls.FAILED_TEST


def lost_race(err: ApiException) -> bool:
    """The write lost an optimistic-concurrency race: a 409, or a 422 whose message is the
    generic "cannot apply the patch" (our ``test`` of ``metadata.resourceVersion`` failed).
    Validation and webhook refusals carry their own message and are not races."""
    return calls.conflict(err)


def retry_conflicts(action: Callable[[], Any], what: str, attempts: int = 5) -> Any:
    """Run ``action`` again (it re-reads the object) when the object changed under it; other
    refusals propagate as :class:`ApiException`."""
    for attempt in range(attempts):
        try:
            return action()
        except ApiException as err:
            race = lost_race(err)
            if not race or attempt == attempts - 1:
                if race:
                    raise CliError(f"{what}: the object kept changing; try again") from err
                raise
            time.sleep(0.1 * (attempt + 1))
    raise AssertionError("unreachable")
