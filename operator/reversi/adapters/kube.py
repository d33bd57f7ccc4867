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
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, Literal

from kubernetes import client
from kubernetes.client.rest import ApiException

from ..engine.executor import JobView
from . import apicalls as calls
from .apicalls import FAILED_TEST, Conflict, api_message, failed_test  # noqa: F401 - re-exported: callers import them from here

#: a Job's verdict (:attr:`JobView.state`)
JobState = Literal["running", "succeeded", "failed"]

GROUP, VERSION = calls.GROUP, calls.VERSION
JSON_PATCH = calls.JSON_PATCH
log = logging.getLogger("reversi.kube")
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
        (and, for a reader, its stdout)."""
        state, finished_at, job_message, job_reason = _job_conditions(job)
        if state == "running":
            return JobView("running")
        if state == "succeeded" and not reader:
            return JobView("succeeded")  # nothing to read from its pod: no output, no error, no truth to correct
        ns, name = job.metadata.namespace, job.metadata.name
        pods, _ = calls.list_all(self.core.list_namespaced_pod, ns, label_selector=f"job-name={name}",
                                 timeout=self.timeout)
        pods.sort(key=lambda p: p.metadata.creation_timestamp or dt.datetime.min)
        message, output = "", None
        disrupted = deadline_killed = False
        ends: list[tuple[int | None, str | None]] = []
        waiting: list[tuple[str | None, str | None]] = []
        if pods:
            pod = pods[-1]
            codes: list[int | None] = []  # every container's: one still running proves nothing yet
            finished: list[Any] = []
            for cs in (pod.status.container_statuses if pod.status else None) or []:
                term = cs.state.terminated if cs.state else None
                codes.append(term.exit_code if term is not None else None)
                if term is not None:
                    ends.append((term.exit_code, term.reason))
                    finished.append(term.finished_at)
                    message = ended_message(term.exit_code, term.reason, term.message)
                elif cs.state and cs.state.waiting:
                    waiting.append((cs.state.waiting.reason, cs.state.waiting.message))
            disrupted = any(cond.type == "DisruptionTarget" and cond.status == "True"
                            for cond in (pod.status.conditions if pod.status else None) or [])
            deadline_killed = killed_by_deadline(job_reason, _deadline(job), finished)
            truth = pod_verdict(state, codes, disrupted, deadline_killed)
            if truth != state:
                log.info("Job %s/%s is marked %s but its container exited 0: the attempt succeeded", ns, name, state)
                state, message, job_message = truth, "", ""
            if reader and state == "succeeded":
                try:
                    # the container is named after the Job's role: reader, precheck or precondition
                    container = pod.spec.containers[0].name if pod.spec and pod.spec.containers else "reader"
                    resp = calls.call(self.core.read_namespaced_pod_log, pod.metadata.name, ns, container=container,
                                      _preload_content=False, timeout=self.timeout)
                    output = resp.data.decode("utf-8", errors="replace")  # a reader may print any bytes
                except ApiException as err:
                    if reader_log_pending(err.status, finished_at, dt.datetime.now(dt.UTC)):
                        log.info("Job %s/%s: its reader's log cannot be read yet (%s %s); looking again later",
                                 ns, name, err.status, api_message(err))
                        return JobView("running")
                    return JobView("failed", message=f"cannot read the reader's output: {api_message(err)}")
        lost = state == "failed" and no_answer(job_reason, ends, disrupted, deadline_killed)
        if state == "failed" and not message:
            message = job_message
        if state == "failed" and job_message.startswith("DeadlineExceeded"):
            message = f"{job_message}; {message}" if message and message not in job_message else job_message
        if state == "failed" and not ends:  # its program never ran: say what kept it from running
            trouble = never_ran(waiting) or self._pod_trouble(ns, name)
            if trouble:
                template = job.spec.template if job.spec else None
                containers = (template.spec.containers or []) if template and template.spec else []
                image = f" (image {containers[0].image})" if containers else ""
                message = f"{message}; its container{image} never ran: {trouble}"
        return JobView(state, message=message, output=output, lost=lost)

    def _pod_trouble(self, namespace: str, job: str) -> str | None:
        """What kept a Job's pods from running, from their containers' Warning Events (the pods
        themselves are gone: the Job controller deletes a failed Job's running pods; the pod's own
        Events, such as a node's missing cluster DNS, say nothing of its container), the newest
        first; None when there are none. The pods' names come from the Job's own ``SuccessfulCreate`` Events. Two
        LISTs, only for a failed Job whose program never ran. Raises ``ApiException``."""
        created, _ = calls.list_all(self.core.list_namespaced_event, namespace,
                                    field_selector=f"involvedObject.kind=Job,involvedObject.name={job}",
                                    timeout=self.timeout)
        pods = {e.message.rsplit(" ", 1)[-1] for e in created
                if e.reason == "SuccessfulCreate" and (e.message or "").startswith("Created pod: ")}
        found: list[Any] = []
        for pod in sorted(pods):
            events, _ = calls.list_all(self.core.list_namespaced_event, namespace,
                                       field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod},type=Warning",
                                       timeout=self.timeout)
            found += events
        return pod_trouble([(e.reason, e.message, e.last_timestamp or e.event_time) for e in found
                            if e.involved_object and e.involved_object.field_path])

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


def never_ran(waiting: list[tuple[str | None, str | None]]) -> str | None:
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


def pod_verdict(job_state: JobState, exit_codes: list[int | None], disrupted: bool = False,
                deadline_killed: bool = False) -> JobState:
    """What an attempt really did, from its pod rather than its Job (pod truth): a Job marked
    ``failed`` — e.g. ``DeadlineExceeded`` after the API server was down while its pod ran —
    whose every container terminated with exit code 0 did its work, so it ``succeeded`` (a reader
    still checks it); anything else keeps the Job's verdict. An exit 0 that may be a program's
    answer to the SIGTERM that stopped it mid-call proves nothing, so the Job's verdict stands:
    a ``disrupted`` pod (its ``DisruptionTarget`` condition: evicted, preempted, its node lost),
    or one ``deadline_killed`` (:func:`killed_by_deadline`). Pure."""
    if (job_state == "failed" and not disrupted and not deadline_killed and exit_codes
            and all(code == 0 for code in exit_codes)):
        return "succeeded"
    return job_state


def killed_by_deadline(job_reason: str, deadline: dt.datetime | None, finished: list[dt.datetime | None]) -> bool:
    """Whether the Job's ``activeDeadlineSeconds`` ended its program rather than the program
    itself: the Job failed ``DeadlineExceeded`` and a container finished at or after the deadline
    (``deadline``: the Job's start time plus its deadline; ``finished``: each terminated
    container's ``finishedAt``, None when unknown). A program that finished before the deadline
    exited by itself (the Job was marked late, e.g. after an outage). Pure."""
    if job_reason != "DeadlineExceeded":
        return False
    if deadline is None:
        return True  # no start time to judge by: the deadline is the Job's own reason
    return any(at is None or at >= deadline for at in finished)


#: a container's termination reason that says the node lost it, not that its program ended
#: (kubelet's, and the local node agent's after a restart)
LOST_CONTAINER = "ContainerStatusUnknown"
#: exit codes of a program ended by a signal the node sent (SIGKILL, SIGTERM): no exit of its own
SIGNALLED_EXITS = frozenset({137, 143})


def no_answer(job_reason: str, ends: list[tuple[int | None, str | None]], disrupted: bool = False,
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
