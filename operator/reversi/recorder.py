"""Recording an agent's own Kubernetes writes with no code of the agent's: the admission webhook
``/validate-record`` that ``reversi-admission`` serves (docs/concepts.md#recording-with-no-agent-code).

A Run with ``spec.record`` names a ServiceAccount whose writes it records while it is open. The operator
keeps the recording webhook configuration's match condition naming exactly those users and namespaces
(:func:`reversi.adapters.webhooks.record_configuration`), so the API server sends this webhook their
writes and no one else's. For each review, :class:`WriteRecorder`:

1. finds the Run that records the user in that namespace (the newest; from an informer of the Runs
   labelled :data:`LABEL_RECORD`, no read per review);
2. turns the review into a step of the built-in kube family (:func:`reversi.engine.kube_review.written`: the
   prior state from ``oldObject``, for a ``kubectl scale`` from the object read just before) and records it
   ``intended`` with the SDK's :class:`~reversi.sdk.Recorder`, **before the write is stored**: the API
   server's policies stamp and check that step as any recorded call (a Halt, a closed run, the size);
3. answers: allowed once the step is recorded; refused, with the reason, when it cannot be (the write is
   never let through unrecorded; with no replica answering, ``failurePolicy: Fail`` refuses it too);
4. settles the step's outcome afterwards from what the API server stored
   (:func:`reversi.engine.kube_review.settle_change`, :func:`~reversi.engine.kube_review.settle_create`),
   on a thread of its own: ``succeeded`` with the post state, or ``failed`` for a write refused after
   admission (its undo is a verified no-op); ``uncertain`` when the recorder cannot read the object.

The recorder writes the steps under its own identity, which the recorded call's policies accept for any
Run (:func:`reversi.adapters.policies.record_policy`); the Run names the recorded user, and the kube
runner checks that user's rights before it undoes a write of theirs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import tenacity
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .adapters.informer import Informer, namespaced_key
from .adapters.kube_objects import Objects, UnknownKind
from .engine import kube_review
from .engine.kube import OutOfScope
from .models.run import LABEL_RECORD
from .sdk import OutcomeNotRecorded, Recorder, RecordingRefused, Step

log = logging.getLogger("reversi.recorder")

#: field manager of the recorder's own reads and writes
FIELD_MANAGER = "reversi-recorder"
#: seconds a write's outcome is waited for before it counts as not stored
SETTLE_SECONDS = 10


@dataclass(frozen=True, slots=True)
class RecordingRun:
    """What the recording webhook keeps of one Run that records (a few hundred bytes)."""

    namespace: str
    name: str
    uid: str
    created: str
    user: str
    namespaces: tuple[str, ...]
    #: the RollbackRequest that closed the Run (``status.closedBy``), once one did
    closed_by: str | None = None


def recording_run(run: Mapping[str, Any]) -> RecordingRun | None:
    """:class:`RecordingRun` of a Run (a dict), or ``None`` when it records nothing now
    (:func:`reversi.engine.kube_review.recorded_by`)."""
    recording = kube_review.recorded_by(run)
    if recording is None:
        return None
    meta = run.get("metadata") or {}
    return RecordingRun(namespace=str(meta.get("namespace")), name=str(meta.get("name")), uid=str(meta.get("uid")),
                        created=str(meta.get("creationTimestamp") or ""), user=recording[0],
                        namespaces=recording[1], closed_by=(run.get("status") or {}).get("closedBy") or None)


def runs_informer(api: client.ApiClient, namespaces: list[str], timeout: float) -> Informer:
    """The informer (not started) of the Runs that record, by ``(namespace, name)``."""
    custom = client.CustomObjectsApi(api)

    def list_for(namespace: str | None) -> tuple[Any, tuple[Any, ...]]:
        if namespace:
            return custom.list_namespaced_custom_object, ("reversi.dev", "v1alpha1", namespace, "runs")
        return custom.list_cluster_custom_object, ("reversi.dev", "v1alpha1", "runs")

    return Informer(list_for, keep=recording_run, key=namespaced_key, namespaces=namespaces,
                    name="recording-runs", label_selector=LABEL_RECORD, timeout=timeout)


def review_response(uid: str, refusal: str | None, warning: str | None = None) -> dict[str, Any]:
    """The ``AdmissionReview`` answer: allowed, or refused (HTTP 403, ``Forbidden``) with ``refusal``; with a
    ``warning`` for the writer (kubectl prints it: ``Warning: Reversi: recorded as step 3 ...``)."""
    response: dict[str, Any] = {"uid": uid, "allowed": refusal is None}
    if refusal is not None:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": refusal}
    if warning:
        response["warnings"] = [warning]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


class WriteRecorder:
    """The recording webhook's reviews (module docstring): :meth:`review` answers one, from any thread.

    ``api``: the recorder's client; ``runs``: :func:`runs_informer`, started; ``settle_seconds``: how long
    a write's outcome is waited for; ``settlers``: threads that wait for outcomes at once."""

    def __init__(self, api: client.ApiClient, runs: Informer, *, settle_seconds: int = SETTLE_SECONDS,
                 settlers: int = 16) -> None:
        self.api = api
        self.runs = runs
        self.objects = Objects(api, FIELD_MANAGER)
        self.settle_seconds = settle_seconds
        self._recorders: dict[tuple[str, str, str], tuple[Recorder, threading.Lock]] = {}
        #: (run namespace, run name, object uid, resourceVersion) -> the step a stored version settled: one
        #: stored write is one step's, never two attempts' (a write admitted again after losing a race)
        self._claimed: dict[tuple[str, str, str, str], int] = {}
        self._lock = threading.Lock()
        self._settling = ThreadPoolExecutor(settlers, thread_name_prefix="settle")
        runs.subscribe(self._run_changed)

    def review(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Answer one ``AdmissionReview`` (a dict): allowed once the write is recorded (or when no Run
        records its user there), refused with the reason otherwise (a closed Run's user: the run boundary)."""
        request = body.get("request") or {}
        warning: str | None = None
        try:
            refusal, warning = self._record(request)
        except Exception as err:  # never let a recorded user's write through unrecorded
            log.exception("recording a write failed")
            refusal = f"Reversi could not record this write ({type(err).__name__}: {err}); the write was not made"
        return review_response(str(request.get("uid") or ""), refusal, warning)

    def _run_changed(self, key: tuple[str, str], _old: RecordingRun | None, new: RecordingRun | None) -> None:
        """A Run that records no more (deleted) drops its recorder: what is kept follows the recording Runs."""
        if new is None:
            with self._lock:
                for held in [k for k in self._recorders if k[:2] == key]:
                    del self._recorders[held]
                for claim in [k for k in self._claimed if k[:2] == key]:
                    del self._claimed[claim]

    def close(self) -> None:
        """Stop taking outcomes to settle (those under way finish)."""
        self._settling.shutdown(wait=False)

    def run_for(self, user: str, namespace: str) -> RecordingRun | None:
        """The newest Run that records ``user``'s writes in ``namespace`` (closed or not), or ``None``."""
        found = [run for run in self.runs.values() if run.user == user and namespace in run.namespaces]
        return max(found, key=lambda run: (run.created, run.name), default=None)

    def _record(self, request: Mapping[str, Any]) -> tuple[str | None, str | None]:
        """``(refusal, warning)``: the write refused with the reason, or allowed with what to tell the writer."""
        if not self.runs.synced(timeout=self.settle_seconds):
            return ("Reversi's recorder has not read the Runs that record yet (it is starting); the write was not "
                    "made: try again"), None
        user = str((request.get("userInfo") or {}).get("username") or "")
        namespace = str(request.get("namespace") or "")
        resource = request.get("resource") or {}
        if not resource.get("group") and resource.get("resource") == "namespaces":  # a namespace's own delete
            namespace = str(request.get("name") or "")
        run = self.run_for(user, namespace)
        if run is None:
            return None, None  # no Run records this user here (any more): the write is not recorded
        where = f"Run {run.namespace}/{run.name}"
        if run.closed_by:  # the run boundary (rule 11): as a closed run's SDK calls are
            return (f"{where} was rolled back by RollbackRequest {run.namespace}/{run.closed_by}: {user}'s writes in "
                    f"namespace {namespace} are refused until a new Run records them (or that Run is deleted); the "
                    "write was not made"), None
        try:
            write = kube_review.written(request, self._parent(request))
        except (OutOfScope, UnknownKind, ValueError) as err:
            return f"Reversi records {user}'s writes for {where} and cannot record this one: {err}", None
        if write is None:
            return None, (f"Reversi: {where} records your writes; a dry run is not recorded" if request.get("dryRun")
                          else None)
        recorder, lock = self._recorder(run)
        try:
            with lock:  # one writer of the run's next index in this process (another replica: the name decides)
                step = recorder.begin(write.tool, write.args)
        except RecordingRefused as err:
            return f"{err.message}; the write was not made (Reversi records {user}'s writes for {where})", None
        self._settling.submit(self._settle, recorder, step, write)
        return None, f"Reversi: recorded as step {step.index} ({write.tool}) of {where}"

    def _parent(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """The object a ``scale`` write scales, read now (its prior state); None for other writes."""
        if request.get("subResource") != kube_review.SCALE_SUBRESOURCE or request.get("dryRun"):
            return None
        resource = request.get("resource") or {}
        group, version = str(resource.get("group") or ""), str(resource.get("version") or "")
        ref = {"apiVersion": f"{group}/{version}" if group else version, "resource": str(resource.get("resource")),
               "namespace": str(request.get("namespace")), "name": str(request.get("name"))}
        try:
            return self.objects.get(ref)
        except ApiException as err:
            if err.status == 403:
                raise ValueError(f"the recorder may not get {ref['resource']} in namespace {ref['namespace']}: grant "
                                 "the admission server's ServiceAccount get on it (docs/operations.md#the-recorders-"
                                 "rights)") from err
            raise

    def _recorder(self, run: RecordingRun) -> tuple[Recorder, threading.Lock]:
        key = (run.namespace, run.name, run.uid)
        with self._lock:
            held = self._recorders.get(key)
        if held is None:
            made = (Recorder.attach(run.namespace, run.name, api=self.api, at_admission=True), threading.Lock())
            with self._lock:
                for old in [k for k in self._recorders if k[:2] == key[:2] and k != key]:
                    del self._recorders[old]  # a Run of that name deleted and created again
                held = self._recorders.setdefault(key, made)
        return held

    def _settle(self, recorder: Recorder, step: Step, write: kube_review.Written) -> None:
        try:
            settled = self._settlement(write)
        except Exception as err:  # noqa: BLE001 - the outcome cannot be read: said so, never guessed
            reason = f"the recorder could not read what the API server stored ({type(err).__name__}: {err})"
            if isinstance(err, ApiException) and err.status == 403:
                reason += "; grant the admission server's ServiceAccount get, list and watch on it " \
                          "(docs/operations.md#the-recorders-rights)"
            settled = kube_review.Settlement("uncertain", error=reason)
        settled = self._claim(recorder, step, write, settled)
        try:
            recorder.finish(step, settled.outcome, settled.result, settled.error)
        except (RecordingRefused, OutcomeNotRecorded) as err:
            log.warning("the outcome of step %d of Run %s/%s was not recorded: %s", step.index, recorder.namespace,
                        recorder.run, err.message)
        except Exception:
            log.exception("the outcome of step %d of Run %s/%s was not recorded", step.index, recorder.namespace,
                          recorder.run)

    def _claim(self, recorder: Recorder, step: Step, write: kube_review.Written,
               settled: kube_review.Settlement) -> kube_review.Settlement:
        """``settled``, unless the stored version it names is already another step's: then ``failed``
        (:func:`reversi.engine.kube_review.claimed_by_another`)."""
        version = str((settled.result or {}).get("resourceVersion") or "")
        if settled.outcome != "succeeded" or not version or write.verb == "delete":
            return settled
        key = (recorder.namespace, recorder.run, write.uid or write.ref["name"], version)
        with self._lock:
            owner = self._claimed.setdefault(key, step.index)
        return settled if owner == step.index else kube_review.claimed_by_another(write, owner)

    def _settlement(self, write: kube_review.Written) -> kube_review.Settlement:
        if write.verb == "create":
            retrying = tenacity.Retrying(stop=tenacity.stop_after_delay(self.settle_seconds),
                                         wait=tenacity.wait_exponential(multiplier=0.01, max=0.5),
                                         retry=tenacity.retry_if_result(lambda found: found is None),
                                         retry_error_callback=lambda _state: None)
            found = retrying(lambda: kube_review.settle_create(write, self.objects.get(write.ref)))
            return found if found is not None else kube_review.not_created(write)
        if write.changes_nothing:
            return kube_review.settle_change(write, None)
        first, deleted = self.objects.first_change(write.ref, write.prior_version, self.settle_seconds)
        return kube_review.settle_change(write, first, deleted=deleted)
