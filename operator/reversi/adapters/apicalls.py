"""Every call Reversi makes to the Kubernetes API goes through here: one timeout, one paging
loop, one meaning of a conflict, one retry policy.

:func:`api_client` makes the client: in-cluster in a pod, else from a kubeconfig.

Used by the operator (:class:`~reversi.adapters.kube.Kube`, the webhooks, the metrics), the
journal (:mod:`~reversi.adapters.journal`), ``kubectl reversi`` (:mod:`reversi.cli.api`), the
SDK (:mod:`reversi.sdk`) and the gateway. It imports only the official kubernetes client,
urllib3 and tenacity (never kopf), so the SDK stays usable with the client alone.

The rules:

- **Timeout.** Every request carries ``_request_timeout`` = :data:`TIMEOUT` seconds (connect and
  read) unless the caller passes ``timeout``. Watches are the one exception (their timeout is
  the server-side ``timeout_seconds`` plus a margin, set where they are opened).
- **Paging.** :func:`list_all` (any LIST method) and :func:`list_objects` (custom objects) read
  :data:`PAGE` items at a time with ``limit``/``continue``. A continue token the server no
  longer knows (410 Gone, its snapshot was compacted) lists again from the start, at most
  :data:`RELISTS` times. The items of a paged LIST are one snapshot: its resourceVersion is the
  first page's.
- **Not found.** :func:`get` returns ``None`` on 404; :func:`read` raises it.
- **Conflict.** :func:`patch` raises :class:`Conflict` when a write lost an optimistic
  concurrency race: HTTP 409 (a stale ``metadata.resourceVersion``) or a JSON patch whose
  ``test`` op failed (422 with the server's generic message, :func:`failed_test`). The caller
  reads the object again and decides again.
- **Retries** (:class:`Policy`, built on tenacity; :data:`POLICY`: at most 3 attempts, waits of
  0.25 s doubling to 4 s with jitter, a 429's ``Retry-After`` honoured up to that cap). Transient
  errors are 429, 5xx and connection errors (:func:`transient`). Which calls are retried on
  which of them is the ``repeat`` argument of :func:`call`:

  - ``"always"`` (reads; writes whose repetition cannot do anything twice): retried on every
    transient error. These are GET and LIST, merge patches, writes with a precondition (a
    ``resourceVersion`` or a JSON-patch ``test``) whose caller, on :class:`Conflict`, reads the
    object again and writes only what is still missing (a repetition of one that landed fails
    with :class:`Conflict`; the caller then finds its own write: a lock it holds, a current
    status — but not a counter it would add one to again), deletes (a 404 on a
    repeated delete means it was deleted: :func:`delete` returns True), creates whose name is
    deterministic and whose caller takes "it exists already" as done
    (:func:`create` with ``exists_ok=True``: a repetition of one that landed answers
    AlreadyExists, i.e. the object is there), and reviews (TokenReview, SubjectAccessReview)
    that change nothing.
  - ``"unsent"`` (everything else: a create whose 409 means something else, e.g. the SDK's
    next step index or a RollbackRequest with a random name; a counter's increment; a JSON
    patch whose repetition the caller would misreport, e.g. the SDK's outcome; an Event):
    retried only when the request surely did not take effect — 429 (the API server refused it
    before handling it), a write refused because no admission webhook could be reached (500
    "failed calling webhook": refused before storage), a write refused because the API server
    does not serve a kind it was just given yet (:func:`not_yet_served`: a 403, 422 or 503 before
    storage, for up to 30 s after an install) or a connection that was never opened.
    A 5xx, a read timeout or a dropped connection may come after the write landed, so they are
    raised to the caller as before.

  Nothing else is retried: 4xx answers (400, 401, 403, 404, 409, 422) are the server's verdict
  (but for the 403 of :func:`not_yet_served`).
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import tenacity
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from urllib3 import exceptions as http

GROUP, VERSION = "reversi.dev", "v1alpha1"
JSON_PATCH = "application/json-patch+json"
#: seconds any one API request may take (connect and read) unless the caller says otherwise
TIMEOUT = 30.0
#: items per LIST page
PAGE = 500
#: how often a paged LIST starts again after its continue token expired (410 Gone)
RELISTS = 3
#: what the API server answers when a JSON-patch ``test`` operation fails (422, no causes)
FAILED_TEST = "the server rejected our request due to an error in our request"

Repeat = Literal["always", "unsent"]
T = TypeVar("T")
log = logging.getLogger("reversi.api")


class Conflict(Exception):
    """A write lost an optimistic-concurrency race (HTTP 409, or a failed JSON-patch test): the
    object changed since it was read. ``error`` is the server's answer (``ApiException``)."""

    def __init__(self, message: str, error: ApiException | None = None):
        super().__init__(message)
        self.error = error


# ------------------------------------------------------------------------------ errors

def api_message(err: ApiException) -> str:
    """The API server's own message (``Status.message``) of an error, else its HTTP reason."""
    try:
        body = json.loads(err.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or err.reason or f"HTTP {err.status}")


def failed_test(err: ApiException) -> bool:
    """Whether ``err`` is a failed JSON-patch ``test`` (optimistic concurrency lost), not a
    validation error (those have their own message)."""
    return err.status == 422 and api_message(err) == FAILED_TEST


def not_found(err: ApiException, name: str) -> bool:
    """Whether ``err`` is a 404 for the object ``name`` itself (the server's ``details.name``),
    not for its kind (CRD not installed) or its namespace."""
    if err.status != 404:
        return False
    try:
        details = json.loads(err.body or "{}").get("details") or {}
    except (TypeError, ValueError, AttributeError):
        return False
    return isinstance(details, dict) and details.get("name") == name and details.get("kind") != "namespaces"


def conflict(err: ApiException) -> bool:
    """Whether a write lost a race: 409, or a failed JSON-patch ``test`` (:func:`failed_test`).
    Validation and webhook refusals carry their own message and are not races."""
    return err.status == 409 or failed_test(err)


#: connection errors raised before the request was sent (nothing can have landed)
_UNSENT = (http.NewConnectionError, http.ConnectTimeoutError)


def _cause(err: BaseException) -> BaseException:
    """The error under urllib3's MaxRetryError (what its own retries last met)."""
    if isinstance(err, http.MaxRetryError) and err.reason is not None:
        return err.reason
    return err


#: what the API server says when it could not reach an admission webhook (it then refuses the
#: write: it never reached storage); a webhook's own refusal never says it
ADMISSION_UNREACHABLE = "failed calling webhook"


def admission_unreachable(err: BaseException) -> bool:
    """Whether the API server refused a write because it could not reach an admission webhook
    (no replica answered: connection refused, no endpoints, its timeout passed). Such a write
    never landed; a webhook's refusal by a rule (403, 422, ...) is not this."""
    return isinstance(err, ApiException) and err.status == 500 and ADMISSION_UNREACHABLE in api_message(err)


#: what the API server says while it cannot yet serve a custom resource it was just given: an
#: admission policy whose param kind is a CRD it has not discovered yet (its discovery is reset
#: every 30 s), or the CRD's own kind not yet served. Either refuses the write before it is
#: stored; a moment later the same write is judged by the policies' rules
NOT_YET_SERVED = ("failed to configure policy: failed to find resource referenced by paramKind",
                  "not yet synced to use for admission",  # the binding's param informer has not synced yet
                  "There can be a delay between when CustomResourceDefinitions are created and when they are available")


def not_yet_served(err: BaseException) -> bool:
    """Whether the API server refused a write because it does not serve a kind it was just given
    yet (:data:`NOT_YET_SERVED`): for up to 30 s after Reversi's CRDs and policies are installed
    together. Such a write never landed."""
    if not isinstance(err, ApiException) or err.status not in (403, 422, 503):
        return False
    message = api_message(err)
    return any(marker in message for marker in NOT_YET_SERVED)


def unsent(err: BaseException) -> bool:
    """Whether the request surely did not take effect: 429 (refused before it was handled: API
    priority and fairness, max-in-flight), a write refused because an admission webhook could not
    be reached (:func:`admission_unreachable`) or because a kind it needs is not served yet
    (:func:`not_yet_served`), or a connection that was never opened."""
    if isinstance(err, ApiException):
        return err.status == 429 or admission_unreachable(err) or not_yet_served(err)
    return isinstance(_cause(err), _UNSENT)


def transient(err: BaseException) -> bool:
    """Whether ``err`` may pass if the call is made again: 429, any 5xx, or a connection error
    (refused, reset, timed out). A 5xx or a broken connection may come after a write landed."""
    if isinstance(err, ApiException):
        return err.status is not None and (err.status == 429 or err.status >= 500 or not_yet_served(err))
    return isinstance(_cause(err), (http.HTTPError, ConnectionError, TimeoutError))


# ------------------------------------------------------------------------------ retries

@dataclass(frozen=True)
class Policy:
    """How often and how long to retry a transient error (see the module docstring):
    ``attempts`` in all (1 means no retry), waiting ``first_wait`` seconds, doubling up to
    ``max_wait``, with up to 25% jitter; a 429's ``Retry-After`` (seconds) is waited instead
    when longer, up to ``max_wait``."""

    attempts: int = 3
    first_wait: float = 0.25
    max_wait: float = 4.0
    #: seconds after the first attempt past which no attempt starts (None: ``attempts`` alone)
    deadline: float | None = None

    def wait(self, state: tenacity.RetryCallState) -> float:
        """Seconds to wait before attempt ``state.attempt_number + 1``."""
        backoff = min(self.max_wait, self.first_wait * 2 ** (state.attempt_number - 1))
        backoff *= 1 + random.random() / 4
        err = state.outcome.exception() if state.outcome else None
        if isinstance(err, ApiException) and err.status == 429:
            try:
                backoff = max(backoff, float((err.headers or {}).get("Retry-After", 0)))
            except (TypeError, ValueError):
                pass
        return min(backoff, self.max_wait)

    def retrying(self, repeat: Repeat, what: str = "") -> tenacity.Retrying:
        """A tenacity ``Retrying`` for calls of kind ``repeat``; the last error is re-raised."""
        test = transient if repeat == "always" else unsent
        return tenacity.Retrying(
            stop=tenacity.stop_after_attempt(max(1, self.attempts)) | (
                tenacity.stop_after_delay(self.deadline) if self.deadline is not None else tenacity.stop_never),
            wait=self.wait,
            retry=tenacity.retry_if_exception(test),
            before_sleep=lambda state: log.info(
                "API call %s failed (%s); attempt %d of %d", what or "", _describe(state), state.attempt_number + 1,
                self.attempts),
            reraise=True)


#: the policy every call uses unless given another
POLICY = Policy()
#: the recording writes of the SDK (and so of the gateway): a write refused because no admission
#: webhook answered (an admission server restarting, a rolling upgrade), or because the API server
#: does not serve Reversi's kinds yet (an install moments ago), never landed, so it is tried again
#: for up to 30 s; such a gap costs the agent latency, not a failed call
RECORDING = Policy(attempts=100, first_wait=0.05, max_wait=1.0, deadline=30.0)


#: what the operator watches, by API group and version, with a resource of each that discovery must
#: list: the kinds kopf resolves once at its start (:func:`wait_until_served`)
WATCHED: tuple[tuple[str, str, str], ...] = (
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions"), ("batch", "v1", "jobs"),
    (GROUP, VERSION, "rollbackrequests"), (GROUP, VERSION, "halts"), (GROUP, VERSION, "toolmanifests"))


def wait_until_served(custom: client.CustomObjectsApi, seconds: float,
                      watched: tuple[tuple[str, str, str], ...] = WATCHED) -> list[str]:
    """Wait up to ``seconds`` until the API server's discovery lists each ``(group, version,
    resource)`` of ``watched``; returns those still missing then (empty: all served). kopf
    resolves the resources it watches once, at its start, and again only on a CRD's event, which
    it cannot watch if the CRDs' own kind was not resolved: a start while the API server is down,
    or its discovery is still incomplete a moment after a restart, would otherwise leave the
    operator watching nothing until it restarts."""
    def missing() -> list[str]:
        out = []
        for group, version, resource in watched:
            try:
                found = call(custom.get_api_resources, group, version, policy=Policy(attempts=1), timeout=5)
                names = {r.name for r in found.resources or []}
            except (ApiException, http.HTTPError, OSError):
                names = set()
            if resource not in names:
                out.append(f"{resource}.{group}/{version}")
        return out

    try:
        return tenacity.Retrying(stop=tenacity.stop_after_delay(seconds), wait=tenacity.wait_fixed(0.5),
                                 retry=tenacity.retry_if_result(bool), reraise=True)(missing)
    except tenacity.RetryError as err:
        return err.last_attempt.result()


def _describe(state: tenacity.RetryCallState) -> str:
    err = state.outcome.exception() if state.outcome else None
    if isinstance(err, ApiException):
        return f"{err.status} {err.reason}"
    return f"{type(err).__name__}: {err}"


def call(method: Callable[..., T], *args: Any, repeat: Repeat = "always", timeout: float = TIMEOUT,
         policy: Policy = POLICY, **kwargs: Any) -> T:
    """``method(*args, **kwargs)`` (any kubernetes client API method) with the request timeout
    (``_request_timeout``, unless given in ``kwargs``) and the retry policy for calls of kind
    ``repeat`` (module docstring). Raises the last error (``ApiException`` or urllib3's)."""
    kwargs.setdefault("_request_timeout", timeout)
    name = getattr(method, "__name__", "")
    return policy.retrying(repeat, name)(method, *args, **kwargs)


def api_client(kubeconfig: str | None = None, connections: int | None = None) -> client.ApiClient:
    """An API client: in-cluster when in a pod, else from ``kubeconfig`` / ``$KUBECONFIG``.

    ``connections``: how many connections to the API server it keeps open for reuse (the
    client's default is 5 per core; a process whose threads make more requests at once than that
    would open a new TLS connection for each extra one and drop it after the answer)."""
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(
            "/var/run/secrets/kubernetes.io/serviceaccount/token"):
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
    else:
        configuration = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    if connections:
        configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)


# ------------------------------------------------------------------------------ paging

def _page(resp: Any) -> tuple[list[Any], str | None, str]:
    """A LIST answer's items, continue token and resourceVersion; the answer is a dict, a typed
    list (``V1JobList``...) or a raw response (``_preload_content=False``)."""
    if not isinstance(resp, dict) and not hasattr(resp, "items") and hasattr(resp, "data"):
        resp = json.loads(resp.data)
    if isinstance(resp, dict):
        meta = resp.get("metadata") or {}
        return list(resp.get("items") or []), meta.get("continue") or None, meta.get("resourceVersion") or ""
    meta = getattr(resp, "metadata", None)
    token = getattr(meta, "_continue", None) if meta is not None else None
    version = getattr(meta, "resource_version", None) if meta is not None else None
    return list(resp.items or []), token or None, version or ""


def list_all(method: Callable[..., Any], *args: Any, page: int = PAGE, timeout: float = TIMEOUT,
             policy: Policy = POLICY, relists: int = RELISTS, keep: Callable[[Any], Any] | None = None,
             **kwargs: Any) -> tuple[list[Any], str]:
    """Every item a LIST method returns, read ``page`` at a time, and the LIST's
    resourceVersion (the first page's: a paged LIST is one snapshot, so a WATCH from it sees
    every later change). Items are as the method returns them (dicts for custom objects, typed
    objects otherwise). Each page is a :func:`call` (timeout, retried). A 410 Gone on a continue
    token (the snapshot expired) lists again from the start, up to ``relists`` times; then, like
    any other error, it is raised. ``resource_version`` in ``kwargs`` applies to the first page
    only (the server refuses it with a continue token). ``keep``: what to keep of each item (its
    answer; ``None`` drops the item), so only one page of whole objects is in memory at a time."""
    for attempt in range(relists + 1):
        items: list[Any] = []
        token: str | None = None
        version = ""
        try:
            while True:
                kw = dict(kwargs, limit=page)
                if token:
                    kw["_continue"] = token
                    kw.pop("resource_version", None)
                    kw.pop("resource_version_match", None)
                found, token, rv = _page(call(method, *args, timeout=timeout, policy=policy, **kw))
                if keep is None:
                    items.extend(found)
                else:
                    items.extend(kept for kept in map(keep, found) if kept is not None)
                del found
                version = version or rv
                if not token:
                    return items, version
        except ApiException as err:
            if err.status != 410 or not token or attempt == relists:
                raise
            log.info("LIST %s: continue token expired (410); listing again from the start",
                     getattr(method, "__name__", ""))
    raise AssertionError("unreachable")


# ------------------------------------------------------------------------------ custom objects
# ``namespace=None``: a cluster-scoped kind (or, for lists, every namespace).

def read(custom: client.CustomObjectsApi, plural: str, name: str, namespace: str | None = None, *,
         timeout: float = TIMEOUT, policy: Policy = POLICY) -> dict:
    """The object (a dict); raises ``ApiException`` (404 when it does not exist)."""
    if namespace:
        return call(custom.get_namespaced_custom_object, GROUP, VERSION, namespace, plural, name,
                    timeout=timeout, policy=policy)
    return call(custom.get_cluster_custom_object, GROUP, VERSION, plural, name, timeout=timeout, policy=policy)


def get(custom: client.CustomObjectsApi, plural: str, name: str, namespace: str | None = None, *,
        timeout: float = TIMEOUT, policy: Policy = POLICY) -> dict | None:
    """The object (a dict), or ``None`` on 404; other errors raise ``ApiException``."""
    try:
        return read(custom, plural, name, namespace, timeout=timeout, policy=policy)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def list_objects_and_version(custom: client.CustomObjectsApi, plural: str, namespace: str | None = None, *,
                             cached: bool = False, page: int = PAGE, timeout: float = TIMEOUT,
                             policy: Policy = POLICY, keep: Callable[[dict], Any] | None = None,
                             **kwargs: Any) -> tuple[list[Any], str]:
    """Every object of a kind in ``namespace`` (or every namespace / cluster-scoped), paged
    (:func:`list_all`), and the LIST's resourceVersion. ``kwargs``: ``label_selector``,
    ``field_selector``, ``_preload_content=False`` (faster: JSON parsed once). ``cached``:
    served from the API server's watch cache as it is (``resourceVersion=0``), possibly
    milliseconds behind etcd, instead of a consistent read. ``keep``: as for :func:`list_all`."""
    if cached:
        kwargs["resource_version"] = "0"
    if namespace:
        return list_all(custom.list_namespaced_custom_object, GROUP, VERSION, namespace, plural, page=page,
                        timeout=timeout, policy=policy, keep=keep, **kwargs)
    return list_all(custom.list_cluster_custom_object, GROUP, VERSION, plural, page=page, timeout=timeout,
                    policy=policy, keep=keep, **kwargs)


def list_objects(custom: client.CustomObjectsApi, plural: str, namespace: str | None = None, *,
                 cached: bool = False, page: int = PAGE, timeout: float = TIMEOUT, policy: Policy = POLICY,
                 keep: Callable[[dict], Any] | None = None, **kwargs: Any) -> list[Any]:
    """Like :func:`list_objects_and_version`, the objects (or what ``keep`` keeps of them) only."""
    return list_objects_and_version(custom, plural, namespace, cached=cached, page=page, timeout=timeout,
                                    policy=policy, keep=keep, **kwargs)[0]


def create(custom: client.CustomObjectsApi, plural: str, body: dict, namespace: str | None = None, *,
           exists_ok: bool = False, timeout: float = TIMEOUT, policy: Policy = POLICY, **kwargs: Any) -> dict | None:
    """Create an object; the created object (a dict).

    ``exists_ok``: an object of that name existing already (409) is the caller's "done": the
    answer is ``None``, and the create is retried on every transient error (a repetition of one
    that landed answers 409). Without it a 409 raises ``ApiException`` and the create is
    retried only when it surely did not land (``repeat="unsent"``)."""
    repeat: Repeat = "always" if exists_ok else "unsent"
    try:
        if namespace:
            return call(custom.create_namespaced_custom_object, GROUP, VERSION, namespace, plural, body,
                        repeat=repeat, timeout=timeout, policy=policy, **kwargs)
        return call(custom.create_cluster_custom_object, GROUP, VERSION, plural, body, repeat=repeat,
                    timeout=timeout, policy=policy, **kwargs)
    except ApiException as err:
        if exists_ok and err.status == 409:
            return None
        raise


def patch(custom: client.CustomObjectsApi, plural: str, name: str, body: Any, namespace: str | None = None, *,
          status: bool = False, json_patch: bool = False, repeat: Repeat = "always", timeout: float = TIMEOUT,
          policy: Policy = POLICY) -> dict:
    """Patch an object, or its status subresource with ``status``: a merge patch (``body`` a
    dict), or a JSON patch (``json_patch``, ``body`` a list of ops). Returns the object.

    Raises :class:`Conflict` when the write lost a race (409, failed ``test``), ``ApiException``
    on other refusals. Retried per ``repeat``: ``"always"`` suits merge patches and patches
    with a precondition (module docstring); pass ``"unsent"`` for a JSON patch that is not
    safe to repeat."""
    kwargs: dict[str, Any] = {"_content_type": JSON_PATCH} if json_patch else {}
    try:
        if namespace:
            method = custom.patch_namespaced_custom_object_status if status else custom.patch_namespaced_custom_object
            return call(method, GROUP, VERSION, namespace, plural, name, body, repeat=repeat, timeout=timeout,
                        policy=policy, **kwargs)
        method = custom.patch_cluster_custom_object_status if status else custom.patch_cluster_custom_object
        return call(method, GROUP, VERSION, plural, name, body, repeat=repeat, timeout=timeout, policy=policy,
                    **kwargs)
    except ApiException as err:
        if conflict(err):
            raise Conflict(api_message(err), err) from err
        raise


def delete(custom: client.CustomObjectsApi, plural: str, name: str, namespace: str | None = None, *,
           timeout: float = TIMEOUT, policy: Policy = POLICY, **kwargs: Any) -> bool:
    """Delete an object; False when it did not exist (a 404 naming it, :func:`not_found`, on the
    first attempt). The same 404 on a repeated attempt (the first failed on the way, e.g. 503 or
    a dropped connection) means the object is gone: True. Other errors (also a 404 for the kind
    or the namespace) raise ``ApiException``."""
    tries = 0

    def once(**kw: Any) -> Any:
        nonlocal tries
        tries += 1
        if namespace:
            return custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, plural, name, **kwargs, **kw)
        return custom.delete_cluster_custom_object(GROUP, VERSION, plural, name, **kwargs, **kw)

    try:
        call(once, timeout=timeout, policy=policy)
    except ApiException as err:
        if not_found(err, name):
            return tries > 1
        raise
    return True


def whoami(api: client.ApiClient) -> str:
    """The user name the API server authenticates ``api``'s requests as (a SelfSubjectReview: needs no
    right). Raises ``ApiException``."""
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    answer = call(client.AuthenticationV1Api(api).create_self_subject_review, review)
    return str(answer.status.user_info.username)
