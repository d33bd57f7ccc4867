"""Kubernetes reads and writes for the operator: the only module that talks to the API for it.

Every call goes through :mod:`~reversi.adapters.apicalls` (request timeout, paging, conflicts,
retries of transient errors). Every call is blocking (the official client): use it from sync
kopf handlers or worker threads, never from ``async`` code, where it would block the event loop.
"""

from __future__ import annotations

import builtins
import datetime as dt
import inspect
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Literal

from kubernetes import client
from kubernetes.client.rest import ApiException

from ..engine.executor import JobView
from . import apicalls as calls
from .jobs import LABEL_ROLE
from .apicalls import FAILED_TEST, Conflict, api_message, failed_test  # noqa: F401 - re-exported: callers import them from here

#: a Job's verdict (:attr:`JobView.state`)
JobState = Literal["running", "succeeded", "failed"]

GROUP, VERSION = calls.GROUP, calls.VERSION
JSON_PATCH = calls.JSON_PATCH
log = logging.getLogger("reversi.kube")
#: what the API server sends for a metadata-only LIST
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
#: call Secrets (namespace, name) a Kube remembers as existing (not created again)
SECRETS_REMEMBERED = 4096


def read_crds(api: client.ApiClient, names: tuple[str, ...]) -> list[dict]:
    """The CRDs called ``names`` as installed (dicts; missing ones left out). Raises
    ``ApiException`` on errors other than 404."""
    ext = client.ApiextensionsV1Api(api)
    out = []
    for name in names:
        try:
            crd = calls.call(ext.read_custom_resource_definition, name)
        except ApiException as err:
            if err.status == 404:
                continue
            raise
        out.append(api.sanitize_for_serialization(crd))
    return out


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _job_conditions(job: Any) -> tuple[JobState, Any, str, str]:
    """``(state, finished at, message, reason)`` from a Job's Complete and Failed conditions:
    ``running`` until one of them is True."""
    state: JobState = "running"
    job_message = job_reason = ""
    finished_at = None
    for cond in job.status.conditions or []:
        if cond.status != "True":
            continue
        if cond.type == "Complete":
            state = "succeeded"
            finished_at = cond.last_transition_time
        elif cond.type == "Failed":
            state = "failed"
            finished_at = cond.last_transition_time
            job_message = f"{cond.reason}: {cond.message}" if cond.reason else (cond.message or "")
            job_reason = cond.reason or ""
    return state, finished_at, job_message, job_reason


def _deadline(job: Any) -> dt.datetime | None:
    """When a Job's ``activeDeadlineSeconds`` runs out (its start time plus the deadline), or None."""
    start = job.status.start_time if job.status else None
    seconds = job.spec.active_deadline_seconds if job.spec else None
    if start is None or seconds is None:
        return None
    return start + dt.timedelta(seconds=seconds)


class Kube:
    """Thin, typed access to the objects Reversi reads and writes."""

    def __init__(self, api: client.ApiClient, timeout: float = 30.0):
        self.api = api
        self.timeout = timeout  # seconds, on every request
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self._created: dict[tuple[str, str], float] = {}  # Jobs created (or adopted) by this process: when
        self._created_lock = threading.Lock()
        self._secrets: dict[tuple[str, str], None] = {}  # call Secrets known to exist, oldest first

    # ----- custom objects -------------------------------------------------------------------

    def get(self, plural: str, namespace: str, name: str) -> dict | None:
        """The object as a dict, or None when it does not exist."""
        return calls.get(self.custom, plural, name, namespace, timeout=self.timeout)

    def select(self, plural: str, namespace: str, selector: str) -> list[dict]:
        """The objects of a kind in ``namespace`` whose labels match ``selector`` (a paged LIST)."""
        return calls.list_objects(self.custom, plural, namespace, label_selector=selector, timeout=self.timeout)

    def list(self, plural: str, namespace: str | None = None, *, cached: bool = False) -> list[dict]:
        """All objects of a kind (in one namespace, or cluster-wide), paged.

        ``cached``: served from the API server's watch cache as it is (``resourceVersion=0``),
        possibly milliseconds behind etcd, instead of a consistent read that may wait for the
        cache to catch up (up to ~100 ms when the kind was not written lately).
        """
        return calls.list_objects(self.custom, plural, namespace, cached=cached, timeout=self.timeout)

    def list_paged(self, plural: str, namespace: str | None = None, page: int = 500,
                   keep: Callable[[dict], Any] | None = None) -> builtins.list[Any]:
        """All objects of a kind, read ``page`` at a time (a cluster with thousands of Runs is
        never one unbounded response); with ``keep``, what it keeps of each object (``None``:
        nothing), so no more than a page of whole objects is held at once."""
        return calls.list_objects(self.custom, plural, namespace, page=page, timeout=self.timeout, keep=keep)

    def count(self, plural: str, namespace: str) -> int | None:
        """How many objects of a kind ``namespace`` holds, from one consistent, metadata-only LIST
        of one item (its ``remainingItemCount``, which etcd counts): no object is read whole, so
        this costs the same for 10 RunSteps and 1,000,000. None when the API server did not say
        (it leaves the count out in some cases, e.g. an inconsistent continuation)."""
        resp = calls.call(self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, plural, limit=1,
                          _headers={"Accept": METADATA_LIST}, _preload_content=False, timeout=self.timeout)
        found = json.loads(resp.data)
        meta = found.get("metadata") or {}
        items = len(found.get("items") or [])
        if not meta.get("continue"):
            return items
        remaining = meta.get("remainingItemCount")
        return items + int(remaining) if isinstance(remaining, int) else None

    def resource_quotas(self, namespace: str | None = None) -> builtins.list[dict]:
        """The ResourceQuotas of ``namespace`` (None: every namespace) as dicts, paged."""
        if namespace:
            found, _ = calls.list_all(self.core.list_namespaced_resource_quota, namespace, timeout=self.timeout,
                                      _preload_content=False)
        else:
            found, _ = calls.list_all(self.core.list_resource_quota_for_all_namespaces, timeout=self.timeout,
                                      _preload_content=False)
        return found

    def merge_status(self, plural: str, namespace: str, name: str, status: dict,
                     resource_version: str | None = None) -> dict:
        """Merge-patch ``status`` through the status subresource. With ``resource_version``,
        raise :class:`Conflict` when the object changed since it was read."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return calls.patch(self.custom, plural, name, body, namespace, status=True, timeout=self.timeout)

    def create(self, plural: str, namespace: str, body: dict) -> bool:
        """Create an object; False when one of that name exists already (it is left as it is;
        also when a first attempt that failed on the way had created it: names are
        deterministic, so the object is there either way)."""
        return calls.create(self.custom, plural, body, namespace, exists_ok=True, timeout=self.timeout) is not None

    def merge(self, plural: str, namespace: str, name: str, patch: dict) -> dict:
        """Merge-patch an object (not its status)."""
        return calls.patch(self.custom, plural, name, patch, namespace, timeout=self.timeout)

    def delete(self, plural: str, namespace: str, name: str, *, uid: str | None = None,
               resource_version: str | None = None) -> bool:
        """Delete an object in the background (the garbage collector then deletes what it owns),
        only if it still has ``uid`` and ``resource_version`` when given (preconditions: the API
        server refuses the delete of an object changed or replaced since it was read). False when
        it did not exist; raises :class:`Conflict` when a precondition failed, ``ApiException``
        on other errors."""
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if preconditions:
            body["preconditions"] = preconditions
        try:
            return calls.delete(self.custom, plural, name, namespace, timeout=self.timeout, body=body)
        except ApiException as err:
            if err.status == 409:
                raise Conflict(api_message(err), err) from err
            raise

    def json_patch_status(self, plural: str, namespace: str, name: str, ops: builtins.list[dict]) -> dict:
        """Apply a JSON patch to the status subresource; a failed ``test`` raises :class:`Conflict`."""
        return calls.patch(self.custom, plural, name, ops, namespace, status=True, json_patch=True,
                           timeout=self.timeout)

    # ----- jobs -------------------------------------------------------------------------------

    def list_jobs(self, namespace: str, selector: str) -> dict[str, Any]:
        """Jobs matching a label selector, by name."""
        jobs, _ = calls.list_all(self.batch.list_namespaced_job, namespace, label_selector=selector,
                                 timeout=self.timeout)
        return {j.metadata.name: j for j in jobs}

    def job_object(self, body: dict) -> client.V1Job:
        """A Job as the client's ``V1Job`` (what :meth:`job_view` reads) from its JSON dict (a
        watch event's object, e.g. from kopf's index)."""
        text = json.dumps(body, default=str)
        if "content_type" in inspect.signature(self.api.deserialize).parameters:  # newer: the text and its type
            job: client.V1Job = self.api.deserialize(text, "V1Job", "application/json")
        else:  # older clients read a response object's data
            job = self.api.deserialize(SimpleNamespace(data=text), "V1Job")
        return job

    def created_recently(self, namespace: str, name: str, seconds: float) -> bool:
        """Whether this process created (or adopted) Job ``namespace/name`` less than ``seconds``
        ago: a watch may not have brought it back yet. Older records are dropped."""
        now = time.monotonic()
        with self._created_lock:
            for key in [k for k, at in self._created.items() if now - at > seconds]:
                del self._created[key]
            return (namespace, name) in self._created

    def seen(self, namespace: str, name: str) -> None:
        """Job ``namespace/name`` came back through a watch: no longer only recently created."""
        with self._created_lock:
            self._created.pop((namespace, name), None)

    def create_job(self, secret: dict, job: dict) -> bool:
        """Create the call Secret and the Job; an existing one (same deterministic name) is
        adopted, not replaced. Returns True when the Job was created now.

        A calls Secret is shared by the Jobs of several steps (adapters/jobs.py) and its name
        says its content, so one this process created (or found) is not created again: the last
        ``SECRETS_REMEMBERED`` names are remembered."""
        ns = job["metadata"]["namespace"]
        with self._created_lock:
            self._created[(ns, job["metadata"]["name"])] = time.monotonic()
        key = (ns, secret["metadata"]["name"])
        if key not in self._secrets:
            try:  # names are deterministic: "exists" is done, so a create that may have landed is repeated
                calls.call(self.core.create_namespaced_secret, ns, secret, timeout=self.timeout)
            except ApiException as err:
                if err.status != 409:
                    raise
            with self._created_lock:
                self._secrets[key] = None
                while len(self._secrets) > SECRETS_REMEMBERED:
                    self._secrets.pop(next(iter(self._secrets)))
        try:
            calls.call(self.batch.create_namespaced_job, ns, job, timeout=self.timeout)
            return True
        except ApiException as err:
            if err.status == 409:
                return False
            raise

    def job_view(self, job: Any, reader: bool) -> JobView:
        """What a Job did: running, or succeeded/failed with its container's termination message
        (and, for a reader, its stdout), judged by its last pod (pod truth, :func:`pod_verdict`).

        The pods are read (one LIST) for every finished Job but a Complete ``verifyCommand``
        check (role label ``check``, whose exit 0 is taken as it is). A compensator's exit 0 is its
        answer only when nothing stopped it: a Complete compensator whose pod was disrupted
        (``DisruptionTarget``) or ended at or after the Job's deadline (:func:`killed_by_deadline`)
        gave no answer of its own (the Job controller sometimes marks Complete a Job whose evicted
        pod exited 0 on SIGTERM: docs/guarantees.md#c-evicted), so it is ``failed``, ``lost`` and
        ``effect_unknown``. When its pod is gone, the kubelet's ``Killing`` Events of the Job's
        pods say whether the kubelet stopped its container (:meth:`_stopped_by_kubelet`: two more
        LISTs, only for a Complete compensator with no pod); with none, the Job is trusted. A
        failed compensator is ``effect_unknown`` by :func:`call_unanswered`
        (docs/guarantees.md#c-evicted). The reconciler caches a view that is not running (a
        finished Job's verdict does not change), so this runs once per Job. Raises ``ApiException``."""
        state, finished_at, job_message, job_reason = _job_conditions(job)
        if state == "running":
            return JobView("running")
        compensator = not reader and (job.metadata.labels or {}).get(LABEL_ROLE) != "check"
        if state == "succeeded" and not compensator and not reader:
            return JobView("succeeded")  # a verifyCommand check: no output, no error, its exit 0 taken as it is
        ns, name = job.metadata.namespace, job.metadata.name
        pods, _ = calls.list_all(self.core.list_namespaced_pod, ns, label_selector=f"job-name={name}",
                                 timeout=self.timeout)
        pods.sort(key=lambda p: p.metadata.creation_timestamp or dt.datetime.min)
        seen = read_pod(pods[-1]) if pods else PodRead()
        message, ran, stopped = seen.message, seen.ran, False
        disrupted = seen.disruption is not None
        deadline_killed = bool(pods) and killed_by_deadline(job_reason, _deadline(job), seen.finished,
                                                            complete=state == "succeeded")
        truth = pod_verdict(state, seen.codes, disrupted, deadline_killed, compensator=compensator)
        if truth == "succeeded" and state == "failed":
            log.info("Job %s/%s is marked %s but its container exited 0: the attempt succeeded", ns, name, state)
            state, message, job_message = truth, "", ""
        elif truth != state:  # a Complete compensator stopped mid-call
            state, message = truth, unanswered_success(seen.disruption, deadline_killed)
            log.info("Job %s/%s: %s: not counted as done", ns, name, message)
        elif state == "succeeded" and compensator and not pods:  # its pod is gone: stopped before its exit 0?
            killing = self._stopped_by_kubelet(ns, name)
            if killing is not None:
                state, message, disrupted, ran = "failed", unanswered_success(killing=killing), True, True
                stopped = True
                log.info("Job %s/%s: %s: not counted as done", ns, name, message)
        if state == "succeeded":
            if reader and pods:
                return self._reader_view(pods[-1], finished_at, message)
            return JobView(state, message=message)
        lost = no_answer(job_reason, seen.ends, disrupted, deadline_killed)
        if not message:
            message = job_message
        if job_message.startswith("DeadlineExceeded"):
            message = f"{job_message}; {message}" if message and message not in job_message else job_message
        if not seen.ends and not stopped:  # its program did not run to an exit: say what kept it from running
            trouble, may_have_run = self._why_not_run(job, seen.waiting, gone=not pods)
            ran = ran or may_have_run
            if trouble:
                message = f"{message}; its container{_image_of(job)} never ran: {trouble}"
        unknown = compensator and call_unanswered(seen.ends, ran, disrupted, deadline_killed)
        return JobView(state, message=message, lost=lost, effect_unknown=unknown)

    def _reader_view(self, pod: Any, finished_at: Any, message: str) -> JobView:
        """A succeeded read's view with its output, the log of its ``pod``; ``running`` while a log
        that cannot be read on the way may still come (:func:`reader_log_pending`), else a failed
        read. One GET."""
        ns, name = pod.metadata.namespace, pod.metadata.name
        try:
            # the container is named after the Job's role: reader, precheck or precondition
            container = pod.spec.containers[0].name if pod.spec and pod.spec.containers else "reader"
            resp = calls.call(self.core.read_namespaced_pod_log, name, ns, container=container,
                              _preload_content=False, timeout=self.timeout)
        except ApiException as err:
            if reader_log_pending(err.status, finished_at, dt.datetime.now(dt.UTC)):
                log.info("pod %s/%s: its reader's log cannot be read yet (%s %s); looking again later",
                         ns, name, err.status, api_message(err))
                return JobView("running")
            return JobView("failed", message=f"cannot read the reader's output: {api_message(err)}")
        output = resp.data.decode("utf-8", errors="replace")  # a reader may print any bytes
        return JobView("succeeded", message=message, output=output)

    def _why_not_run(self, job: Any, waiting: tuple[tuple[str | None, str | None], ...],
                     gone: bool) -> tuple[str | None, bool]:
        """For a failed Job whose program did not run to an exit: what kept its container from
        running (its ``waiting`` reasons, else its pods' Warning Events: :meth:`_pod_trouble`), or
        None; and whether it may have run all the same: its pod is ``gone``, it had one (the
        Job's counts, or a ``SuccessfulCreate`` Event), and nothing says it never ran. Two LISTs
        unless ``waiting`` says why. Raises ``ApiException``."""
        trouble = never_ran(waiting)
        if trouble is not None:
            return trouble, False
        ns, name = job.metadata.namespace, job.metadata.name
        created = self._job_pods(ns, name)
        trouble = self._pod_trouble(ns, created)
        counted = job.status is not None and bool(job.status.failed or job.status.succeeded)
        return trouble, gone and trouble is None and (counted or bool(created))

    def _job_pods(self, namespace: str, job: str) -> builtins.list[str]:
        """The names of the pods Job ``namespace/job`` created, from its own ``SuccessfulCreate``
        Events (the pods themselves may be gone); sorted. One LIST. Raises ``ApiException``."""
        created, _ = calls.list_all(self.core.list_namespaced_event, namespace,
                                    field_selector=f"involvedObject.kind=Job,involvedObject.name={job}",
                                    timeout=self.timeout)
        return sorted({e.message.rsplit(" ", 1)[-1] for e in created
                       if e.reason == "SuccessfulCreate" and (e.message or "").startswith("Created pod: ")})

    def _pod_trouble(self, namespace: str, pods: builtins.list[str]) -> str | None:
        """What kept a Job's ``pods`` (their names: :meth:`_job_pods`) from running, from their
        containers' Warning Events (the pods themselves are gone: the Job controller deletes a
        failed Job's running pods; the pod's own Events, such as a node's missing cluster DNS, say
        nothing of its container), the newest first; None when there are none. One LIST a pod,
        only for a failed Job whose program never ran to an exit. Raises ``ApiException``."""
        found: list[Any] = []
        for pod in pods:
            found += self._pod_events(namespace, pod, "type=Warning")
        return pod_trouble([(e.reason, e.message, e.last_timestamp or e.event_time) for e in found
                            if e.involved_object and e.involved_object.field_path])

    def _stopped_by_kubelet(self, namespace: str, job: str) -> str | None:
        """What the kubelet said when it stopped a container of Job ``namespace/job``'s pods (its
        ``Killing`` Event: ``Stopping container compensator``, sent before the SIGTERM of an
        eviction, a deletion or a deadline), or None when it stopped none, or its Events are gone
        (Events live an hour by default). For a Complete compensator whose pod is gone. Two LISTs.
        Raises ``ApiException``."""
        for pod in self._job_pods(namespace, job):
            events = self._pod_events(namespace, pod, "reason=Killing")
            if events:
                return f"pod {pod}: {events[-1].message or 'Killing'}"
        return None

    def _pod_events(self, namespace: str, pod: str, selector: str) -> builtins.list[Any]:
        """The Events of pod ``namespace/pod`` that match the field ``selector`` too (e.g.
        ``type=Warning``). One LIST. Raises ``ApiException``."""
        events, _ = calls.list_all(self.core.list_namespaced_event, namespace,
                                   field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod},{selector}",
                                   timeout=self.timeout)
        return events

    # ----- events -------------------------------------------------------------------------------

    def event(self, obj: dict, reason: str, message: str, warning: bool = False) -> None:
        """Post a Kubernetes Event about ``obj`` (a custom object dict). Never raises."""
        meta = obj["metadata"]
        now = dt.datetime.now(dt.UTC)
        body = {
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                               "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")},
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "reversi-operator"},
            "reportingComponent": "reversi.dev/operator",
            "reportingInstance": "reversi-operator",
            "firstTimestamp": now, "lastTimestamp": now, "eventTime": now, "action": reason, "count": 1,
        }
        try:
            calls.call(self.core.create_namespaced_event, meta["namespace"], body, repeat="unsent",
                       timeout=self.timeout)
        except ApiException as err:  # an event is worth a log line, never a failure
            log.warning("event %s on %s/%s not posted: %s", reason, meta["namespace"], meta["name"], err.reason)


def _image_of(job: Any) -> str:
    """`` (image <its first container's image>)`` for a message, or "" when the Job names none."""
    template = job.spec.template if job.spec else None
    containers = (template.spec.containers or []) if template and template.spec else []
    return f" (image {containers[0].image})" if containers else ""


@dataclass(frozen=True)
class PodRead:
    """What a Job's last pod says (:func:`read_pod`); the default: no pod. ``codes``: every
    container's exit code (None while it has not terminated: one still running proves nothing
    yet); ``ends``: ``(exitCode, reason)`` of each terminated container; ``finished``: their
    ``finishedAt``; ``waiting``: ``(reason, message)`` of each waiting one; ``ran``: a container
    ran (running or terminated); ``message``: the last terminated container's error
    (:func:`ended_message`); ``disruption``: its ``DisruptionTarget`` (:func:`disruption_of`)."""

    codes: tuple[int | None, ...] = ()
    ends: tuple[tuple[int | None, str | None], ...] = ()
    finished: tuple[dt.datetime | None, ...] = ()
    waiting: tuple[tuple[str | None, str | None], ...] = ()
    ran: bool = False
    message: str = ""
    disruption: str | None = None


def read_pod(pod: Any) -> PodRead:
    """The :class:`PodRead` of ``pod`` (the client's ``V1Pod``), from its container statuses and
    conditions. Pure."""
    status = pod.status
    codes: list[int | None] = []
    ends: list[tuple[int | None, str | None]] = []
    finished: list[dt.datetime | None] = []
    waiting: list[tuple[str | None, str | None]] = []
    ran, message = False, ""
    for cs in (status.container_statuses if status else None) or []:
        term = cs.state.terminated if cs.state else None
        codes.append(term.exit_code if term is not None else None)
        ran = ran or term is not None or bool(cs.state and cs.state.running)
        if term is not None:
            ends.append((term.exit_code, term.reason))
            finished.append(term.finished_at)
            message = ended_message(term.exit_code, term.reason, term.message)
        elif cs.state and cs.state.waiting:
            waiting.append((cs.state.waiting.reason, cs.state.waiting.message))
    disruption = disruption_of([(c.type, c.status, c.reason, c.message)
                                for c in (status.conditions if status else None) or []])
    return PodRead(tuple(codes), tuple(ends), tuple(finished), tuple(waiting), ran, message, disruption)


#: a terminated container's reasons that say only that its program ended (the exit code says how)
PLAIN_ENDS = frozenset({"Error", "Completed"})


def ended_message(exit_code: int | None, reason: str | None, message: str | None) -> str:
    """The error of a container that terminated: its termination message (what it wrote to
    /dev/termination-log), else its exit code; with the runtime's reason in front when the
    reason says more than that the program ended (``OOMKilled``: the kernel killed it at its
    memory limit; ``ContainerCannotRun``, ``StartError``). Empty for an exit 0 with no message.
    Pure."""
    text = (message or "").strip()
    if not text and exit_code:
        text = f"exit code {exit_code}"
    if reason and reason not in PLAIN_ENDS:
        return f"{reason}: {text}" if text else reason
    return text


def never_ran(waiting: Sequence[tuple[str | None, str | None]]) -> str | None:
    """Why a container is still waiting to run, from its ``(reason, message)`` (the kubelet's
    ``ErrImagePull``, ``ImagePullBackOff``, ``CreateContainerConfigError``, ...), or None when
    there is no reason. Pure."""
    for reason, message in waiting:
        if reason and reason != "ContainerCreating":
            return f"{reason}: {message}" if message else reason
    return None


def pod_trouble(events: list[tuple[str | None, str | None, Any]], most: int = 2) -> str | None:
    """What the Warning Events of a pod that never ran say, from ``(reason, message, time)``
    tuples: the ``most`` newest distinct ones, newest first, as ``reason: message`` joined by
    ``; `` (an image pull says both the kubelet's state, ``Error: ImagePullBackOff``, and the
    image, ``Back-off pulling image "x"``). None when there are none. Pure."""
    epoch = dt.datetime.min.replace(tzinfo=dt.UTC)
    ordered = sorted(enumerate(events), key=lambda ie: (ie[1][2] or epoch, ie[0]), reverse=True)
    said: list[str] = []
    for _, (reason, message, _when) in ordered:
        text = f"{reason}: {message}" if reason and message else (reason or message or "")
        if text and text not in said:
            said.append(text)
        if len(said) == most:
            break
    return "; ".join(said) or None


def pod_verdict(job_state: JobState, exit_codes: Sequence[int | None], disrupted: bool = False,
                deadline_killed: bool = False, *, compensator: bool = False) -> JobState:
    """What an attempt really did, from its pod rather than its Job (pod truth): a Job marked
    ``failed`` — e.g. ``DeadlineExceeded`` after the API server was down while its pod ran —
    whose every container terminated with exit code 0 did its work, so it ``succeeded`` (a reader
    still checks it). An exit 0 that may be a program's answer to the SIGTERM that stopped it
    mid-call proves nothing: a ``disrupted`` pod (its ``DisruptionTarget`` condition: evicted,
    preempted, its node lost), or one ``deadline_killed`` (:func:`killed_by_deadline`). So such a
    failed Job stays ``failed``, and a ``compensator``'s Job marked ``succeeded`` (Complete; its
    exit 0 is its answer, unlike a reader's, whose answer is its output) is ``failed``: the Job
    controller sometimes counts an evicted pod's exit 0 a success (docs/guarantees.md#c-evicted).
    Anything else keeps the Job's verdict. Pure."""
    if (job_state == "failed" and not disrupted and not deadline_killed and exit_codes
            and all(code == 0 for code in exit_codes)):
        return "succeeded"
    if job_state == "succeeded" and compensator and (disrupted or deadline_killed):
        return "failed"
    return job_state


def killed_by_deadline(job_reason: str, deadline: dt.datetime | None, finished: Sequence[dt.datetime | None],
                       complete: bool = False) -> bool:
    """Whether the Job's ``activeDeadlineSeconds`` ended its program rather than the program
    itself: the Job failed ``DeadlineExceeded`` and a container finished at or after the deadline
    (``deadline``: the Job's start time plus its deadline; ``finished``: each terminated
    container's ``finishedAt``, None when unknown). A program that finished before the deadline
    exited by itself (the Job was marked late, e.g. after an outage). A Job marked Complete
    (``complete``) was killed by its deadline only when a container is known to have finished
    at or after it (nothing else says a deadline struck). Pure."""
    if complete:
        return deadline is not None and any(at is not None and at >= deadline for at in finished)
    if job_reason != "DeadlineExceeded":
        return False
    if deadline is None:
        return True  # no start time to judge by: the deadline is the Job's own reason
    return any(at is None or at >= deadline for at in finished)


def disruption_of(conditions: list[tuple[str | None, str | None, str | None, str | None]]) -> str | None:
    """A pod's ``DisruptionTarget`` condition that is True, from its conditions' ``(type,
    status, reason, message)``, as ``reason: message`` (e.g. ``EvictionByEvictionAPI: Eviction
    API: evicting``; the reason alone when there is no message), or None when the pod was not
    disrupted. Pure."""
    for ctype, status, reason, message in conditions:
        if ctype == "DisruptionTarget" and status == "True":
            what = reason or "DisruptionTarget"
            return f"{what}: {message}" if message else what
    return None


def unanswered_success(disruption: str | None = None, deadline_killed: bool = False,
                       killing: str | None = None) -> str:
    """The error of a Complete compensator whose exit 0 gave no answer of its own (a
    :func:`pod_verdict` turned ``failed``): why — its pod's ``disruption`` (:func:`disruption_of`),
    the Job's deadline (``deadline_killed``), or the kubelet's ``killing`` Event of a pod that is
    gone (``Kube._stopped_by_kubelet``) — and that the call may or may not have taken effect.
    Pure."""
    if disruption:
        why = f"its pod was disrupted ({disruption})"
    elif deadline_killed:
        why = "its program ended at or after the Job's deadline"
    else:
        why = f"the kubelet stopped its container ({killing or 'Killing'})"
    return (f"its Job is Complete, but {why}: its exit 0 may answer the SIGTERM that stopped it, "
            "so the call may or may not have taken effect")


#: a container's termination reason that says the node lost it, not that its program ended
#: (kubelet's, and the local node agent's after a restart)
LOST_CONTAINER = "ContainerStatusUnknown"
#: exit codes of a program ended by a signal the node sent (SIGKILL, SIGTERM): no exit of its own
SIGNALLED_EXITS = frozenset({137, 143})


def no_answer(job_reason: str, ends: Sequence[tuple[int | None, str | None]], disrupted: bool = False,
              deadline_killed: bool = False) -> bool:
    """Whether a failed Job's program gave no answer of its own. ``job_reason`` is the reason of
    the Job's ``Failed`` condition (e.g. ``DeadlineExceeded``, ``BackoffLimitExceeded``); ``ends``
    the ``(exitCode, reason)`` of each terminated container of its last pod (empty: no pod, or
    none of its containers terminated). No answer: nothing terminated (the pod never ran its
    program to an exit), a container the node lost (:data:`LOST_CONTAINER`), a pod ``disrupted``
    (evicted, preempted: whatever it exited with answered the SIGTERM), or one the Job's deadline
    killed (``deadline_killed``, or ``DeadlineExceeded`` and a signalled exit). A program that
    exited non-zero by itself answered (a failed read, rule 5). Pure."""
    if not ends or disrupted or deadline_killed:
        return True
    for code, reason in ends:
        if reason == LOST_CONTAINER:
            return True
        if job_reason == "DeadlineExceeded" and code in SIGNALLED_EXITS:
            return True
    return False


#: a terminated container's reason that says the kernel killed it at its memory limit
OOM_KILLED = "OOMKilled"


def call_unanswered(ends: Sequence[tuple[int | None, str | None]], ran: bool, disrupted: bool = False,
                    deadline_killed: bool = False) -> bool:
    """Whether a failed compensator's program started and ended without an answer of its own, so
    that whether its call took effect is unknown (:attr:`JobView.effect_unknown`: residue
    ``unknown``, docs/concepts.md#the-report). ``ends``: the ``(exitCode, reason)`` of each
    terminated container of its last pod; ``ran``: a container of it ran (running or terminated),
    or its pod is gone and nothing says it never ran. Unanswered: its pod was ``disrupted`` or
    ``deadline_killed``, a container the node lost (:data:`LOST_CONTAINER`), one the kernel
    OOM-killed, one a signal ended (:data:`SIGNALLED_EXITS`), or no container ran to an exit. A
    program that never ran did nothing (``failed``); one that exited non-zero by itself answered
    (``failed``). Pure."""
    if not ran:
        return False
    if disrupted or deadline_killed or not ends:
        return True
    return any(reason in (LOST_CONTAINER, OOM_KILLED) or code in SIGNALLED_EXITS for code, reason in ends)


#: seconds after a reader Job finished during which a log read that fails on the way (the API
#: server or the node's kubelet down or restarting: 5xx, 429) is tried again on the next pass
READER_LOG_GRACE_SECONDS = 120.0


def reader_log_pending(status: int | None, finished_at: dt.datetime | None, now: dt.datetime) -> bool:
    """Whether a reader's log that could not be read (HTTP ``status``) should be read again later
    rather than count as a failed read: the error is one on the way (5xx or 429: the API server
    cannot reach the kubelet, e.g. while the node agent restarts) and the Job finished less than
    :data:`READER_LOG_GRACE_SECONDS` ago (or has no finish time). Any other error, or a later one,
    is a failed read (the reader runs again, rule 5). Pure."""
    if status is None or not (status >= 500 or status == 429):
        return False
    return finished_at is None or (now - finished_at).total_seconds() < READER_LOG_GRACE_SECONDS
