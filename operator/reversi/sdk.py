"""Record an automation's calls in a Run, so Reversi can undo them later.

An agent opens (or continues) a Run and wraps each call. The step is recorded ``intended``
*before* the call is made, so a call that crashes the agent still leaves a trace; after the
call it becomes ``succeeded`` (with the result), ``failed`` (with the error: only for the
exceptions you name in ``failed_errors``, which mean "refused, nothing happened") or
``uncertain`` (any other exception — a timeout of any HTTP library, a dropped connection, an
interrupt: the effect is unknown). See docs/concepts.md#vocabulary and rules 7, 9 and 10 of
docs/concepts.md#rollback-rules.

    from reversi.sdk import Recorder

    rec = Recorder.open("shop", "order-4711", manifest="payments",
                        scope={"actor": "checkout-agent", "tenant": "acme", "environment": "prod"},
                        failed_errors=(PaymentDeclined,))
    charge = rec.call("payments.create_charge", {"order_id": "o-4711", "amount": 700},
                      lambda a: payments.create_charge(**a))
    with rec.step("inventory.reserve", {"sku": "sku-mug", "qty": 1}, depends_on=[1]) as step:
        step.result = inventory.reserve("sku-mug", 1)

When the API server refuses to record a step — a halt (``kill switch: …``), a run that belongs
to another principal, a tool with no manifest entry in enforce mode, a forward duplicate —
:class:`RecordingRefused` (or a subclass: :class:`Halted`, :class:`NotYourRun`,
:class:`UnknownTool`, :class:`DuplicateCall`) is raised **before the call is made**, with the
server's reason. When the outcome of a call that *was* made cannot be recorded,
:class:`OutcomeNotRecorded` is raised and the step stays ``intended``.

Recovery in code (README.md#recovery-in-code-boundaries-rollback-from-inside-reconcile):
``with Recorder.boundary(...) as b:`` rolls the run back when the block raises (re-raising the
error when the rollback is complete, :class:`RollbackIncomplete` otherwise);
``b.rollback(reason=...)`` rolls back from inside the block and closes the run (later calls
raise :class:`RunClosed`); ``rec.reconcile(probe)`` settles unknown outcomes with what
``probe(step)`` finds out (:class:`Settlement`), e.g. ``rec.reader_probe()``.
``recovery="required"`` refuses calls that could not be undone (:class:`RecoveryRequired`).

Every API call goes through :mod:`reversi.adapters.apicalls` (a timeout of :data:`TIMEOUT`
seconds, paging, retries of transient errors — 429, 5xx, connection errors — where repeating
the call cannot record anything twice: a step's ``intended`` record is repeated only when it
surely did not reach the API server, an outcome's write is read back when a repetition finds
it written). A recording write the API server refused because no admission webhook answered
(``failed calling webhook``: the admission server restarting, a rolling upgrade), or because the
API server does not serve Reversi's kinds yet (an install moments ago), never landed, so it is
tried again for up to 30 s (:data:`reversi.adapters.apicalls.RECORDING`): such a gap
costs the agent latency, not a failed call. A refusal by a rule is never tried again.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from collections.abc import Callable, Iterator, Mapping

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from .adapters import apicalls as calls
from .adapters import claims
from .adapters.journal import list_objects, run_at_open, step_body
from .adapters.kube_objects import Objects
from .engine import kube as kube_rules
from .engine.keys import canonical_json, forward_key
from .engine.templates import MissingValue
from .models.run import PinnedManifest
from .models.runstep import MAX_CALL_BYTES, MAX_RUN_STEPS, step_name
from .models.toolmanifest import ToolManifestSpec, ToolSpec

GROUP, VERSION = calls.GROUP, calls.VERSION
JSON_PATCH = calls.JSON_PATCH
TIMEOUT = calls.TIMEOUT  # seconds per API request
DEFAULT_TIMEOUT = 300.0  # seconds a boundary waits for its rollback
POLL_SECONDS = 0.5  # between looks at a rollback's phase
REASON_ANNOTATION = "reversi.dev/reason"
T = TypeVar("T")

#: By default no exception is taken to mean "the call had no effect": a timeout of any HTTP
#: library, a dropped connection, an interrupt — all leave the effect unknown, so the step is
#: recorded ``uncertain`` (Reversi will not guess). Pass the exceptions that do mean "refused,
#: nothing happened" (e.g. your client's HTTP 4xx error) as ``failed_errors``.
FAILED_ERRORS: tuple[type[BaseException], ...] = ()


class RecordingRefused(Exception):
    """The API server refused to record a step or open a run; no call was made.

    ``reason`` is the server's reason (``Forbidden``, ``Invalid``, ...) and ``message`` its
    explanation, e.g. ``kill switch: investigating duplicate charges``.
    """

    def __init__(self, message: str, reason: str = "", status: int = 0):
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.status = status


class UnknownTool(RecordingRefused):
    """The tool has no entry in the run's ToolManifest and the run is in enforce mode."""


class OutcomeNotRecorded(Exception):
    """The call was made, but its outcome could not be recorded: the step stays ``intended``."""

    def __init__(self, message: str, reason: str = "", status: int = 0):
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.status = status


class Halted(RecordingRefused):
    """A Halt or ClusterHalt refuses the call (``kill switch: <reason>``, rule 9)."""


class NotYourRun(RecordingRefused):
    """The run belongs to another principal (rule 10): open a run of your own."""


class DuplicateCall(RecordingRefused):
    """An earlier standing step of the run has the same forward idempotency key."""


class RunClosed(RecordingRefused):
    """The run is closed to new steps: a rollback took it (``run is being rolled back by
    RollbackRequest <name>``) or ended on it (``run was rolled back by RollbackRequest <name>``).
    ``request`` names that RollbackRequest. Record further calls in a new Run."""

    def __init__(self, message: str, reason: str = "", status: int = 0, request: str = ""):
        super().__init__(message, reason=reason, status=status)
        self.request = request or _closing_request(message)


class RecoveryRequired(RecordingRefused):
    """The run promises to be fully recoverable (``recovery="required"``) and the tool cannot be
    undone: its manifest entry is irreversible, has no compensation, or there is none
    (``recovery required: <tool> cannot be undone``)."""


class JournalFull(RecordingRefused):
    """The namespace's ResourceQuota on Reversi's journal is used up (``exceeded quota: ...,
    count/runsteps.reversi.dev``): no call was made. The message says what to do: wait for
    retention to delete expired runs, ask for a larger quota, or delete runs no longer needed
    (docs/operations.md#backpressure-a-ceiling-per-namespace)."""


class NotPermitted(RecordingRefused):
    """RBAC refused the identity a verb on a resource the SDK needs (``... is forbidden: User
    "x" cannot create resource "leases" ...``): no call was made. The message names the role to
    grant (docs/operations.md#an-agents-rights)."""


#: what an RBAC refusal adds: what to grant (the rules are reversi.rbac.RECORD and RECOVER)
RECORD_ADVICE = ("grant the identity the rights of an agent that records (the chart's ClusterRole <fullname>-record, "
                 "reversi-record for a release named reversi; rules in docs/operations.md#an-agents-rights)")
RECOVER_ADVICE = ("this identity records but may not roll back: the run's rollback belongs to a person who may "
                  "(kubectl reversi rollback RUN -n NAMESPACE), or grant the identity the chart's ClusterRole "
                  "<fullname>-recover (docs/operations.md#an-agents-rights)")


#: the authorizer's refusal: ``User "x" cannot create resource "leases" in API group ...``
_RBAC_REFUSAL = re.compile(r'^\S+ is forbidden: User "[^"]*" cannot \S+ resource "[^"]*"')


def _rbac_refused(err: ApiException, message: str) -> bool:
    """Whether ``err`` is the authorizer's refusal (a 403 ``<resource> is forbidden: User "x"
    cannot <verb> resource "<resource>"``), not an admission rule's (a halt's reason may say
    anything)."""
    return err.status == 403 and _RBAC_REFUSAL.match(message) is not None


#: what a refusal by a ResourceQuota adds: what to do about it
JOURNAL_FULL_ADVICE = (
    "the namespace's ResourceQuota on Reversi's journal is used up and no call was made: wait for retention to "
    "delete expired runs (docs/concepts.md#retention), ask for a larger quota (count/runsteps.reversi.dev), or "
    "delete runs no longer needed (kubectl delete run NAME -n NAMESPACE: their steps go with them)")

_KINDS: tuple[tuple[str, type[RecordingRefused]], ...] = (
    ("run is being rolled back by", RunClosed),
    ("run was rolled back by", RunClosed),
    ("recovery required:", RecoveryRequired),
    ("kill switch:", Halted),
    ("belongs to another principal", NotYourRun),
    ("duplicate call:", DuplicateCall),
    ("has no entry in ToolManifest", UnknownTool),
)


def _refusal(err: ApiException, what: str, *, advice: str = RECORD_ADVICE) -> RecordingRefused:
    """The :class:`RecordingRefused` kind for the API server's refusal ``err`` of ``what``, its
    message the server's; an RBAC refusal (:class:`NotPermitted`) ends with ``advice``."""
    try:
        body = json.loads(err.body or "{}")
        message, reason = body.get("message", err.reason), body.get("reason", "")
    except ValueError:
        message, reason = str(err.body or err.reason), ""
    if calls.admission_unreachable(err):  # no rule refused it: no admission replica answered, even after retries
        return RecordingRefused(f"{what} refused: Reversi's admission server is unreachable (no reversi-admission "
                                f"replica answered; the write never landed and the call was not made): {message}",
                                reason="AdmissionUnreachable", status=err.status)
    if _rbac_refused(err, message):
        return NotPermitted(f"{what} refused: {message}; {advice}", reason=reason, status=err.status)
    if "exceeded quota:" in message:
        return JournalFull(f"{what} refused: {message}; {JOURNAL_FULL_ADVICE}", reason=reason, status=err.status)
    kind = next((k for marker, k in _KINDS if marker in message), RecordingRefused)
    return kind(f"{what} refused: {message}", reason=reason, status=err.status)


def _closing_request(message: str) -> str:
    for marker in ("rolled back by RollbackRequest ", "rolled back by "):
        if marker in message:
            return message.split(marker, 1)[1].split(";", 1)[0].split()[0]
    return ""


def _reason(err: ApiException) -> str:
    try:
        return str(json.loads(err.body or "{}").get("reason") or "")
    except (ValueError, AttributeError):
        return ""


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Step:
    """A step being recorded; set ``result`` inside ``with rec.step(...)``."""

    index: int
    tool: str
    args: dict[str, Any]
    result: Any = None
    outcome: str = "intended"
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Recorder:
    """Records steps in one Run. Create with :meth:`open` (create or continue) or
    :meth:`attach` (continue only)."""

    def __init__(self, api: client.ApiClient, namespace: str, run: str,
                 failed_errors: tuple[type[BaseException], ...] = FAILED_ERRORS, recovery: str = "bestEffort",
                 at_admission: bool = False):
        if recovery not in ("bestEffort", "required"):
            raise ValueError(f"recovery must be 'bestEffort' or 'required', not {recovery!r}")
        self.api = api
        self.recovery = recovery
        #: the recording webhook's recorder: its steps carry ``runAtOpen.recordedAtAdmission`` (the API
        #: server refuses that mark from anyone else; docs/concepts.md#recording-with-no-agent-code)
        self.at_admission = at_admission
        #: the RollbackRequest that closed the run, once this recorder knows of one: every later
        #: :meth:`begin` raises :class:`RunClosed` without a call to the API server
        self.closed_by: str | None = None
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.run = run
        self.failed_errors = failed_errors
        self._manifest: ToolManifestSpec | None = None
        self._mode = "enforce"
        self._manifest_name = ""
        self._next: int | None = None  # the next free step index, once known
        #: what this recorder read of its Run at open, copied into every step (``spec.runAtOpen``),
        #: and the Run's pinned manifest: None for a Run opened without one (its manifest did not
        #: exist then, or an older admission server opened it), whose steps cross the webhook
        self._at_open: dict[str, Any] | None = None
        self._pinned: PinnedManifest | None = None
        self._uid = ""
        #: this recorder's id in the claims it holds (two recorders never mistake each other's)
        self._id = uuid.uuid4().hex[:12]
        #: how often another writer took the index this recorder was about to use (it then took
        #: the next free one): two writers never share an index
        self.index_conflicts = 0
        #: how many steps this recorder has recorded (RunSteps it created)
        self.steps_recorded = 0
        self._kube: KubeCalls | None = None

    # ----- opening ------------------------------------------------------------------------

    @classmethod
    def open(cls, namespace: str, run: str, *, manifest: str, mode: str = "enforce",
             scope: Mapping[str, str] | None = None, api: client.ApiClient | None = None,
             kubeconfig: str | None = None, recovery: str = "bestEffort", parent: str | None = None,
             **kwargs: Any) -> Recorder:
        """Create the Run ``namespace/run`` (or continue it if it exists) and return a recorder.

        ``manifest`` names the ToolManifest in the same namespace; ``mode`` is ``enforce`` or
        ``observe``; ``scope`` has ``actor``, ``tenant``, ``environment``; ``recovery``
        (``bestEffort`` or ``required``) is the new Run's ``spec.recovery``: with ``required``
        a call that cannot be undone raises :class:`RecoveryRequired` before it is made (checked
        by the SDK and by admission). ``parent`` opens the run as a child of that Run (same
        namespace; nested runs: rolling back the parent rolls this run back as one unit, in the
        order it was opened). The principal is stamped by the API server from the
        authenticated user. Raises :class:`RecordingRefused` when the server refuses the Run
        (e.g. its parent is missing, closed or too deep).
        """
        api = api or _default_api(kubeconfig)
        rec = cls(api, namespace, run, recovery=recovery, **kwargs)
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Run",
                "metadata": {"name": run, "namespace": namespace},
                "spec": {"mode": mode, "scope": dict(scope or {}), "manifestRef": {"name": manifest},
                         "recovery": recovery, **({"parentRef": {"name": parent}} if parent else {})}}
        try:  # an existing run is continued, so a create that may have landed is repeated
            created = calls.create(rec.custom, "runs", body, namespace, exists_ok=True, policy=calls.RECORDING)
        except ApiException as err:
            raise _refusal(err, f"Run {namespace}/{run}") from err
        if created is not None:
            rec._next = 0  # a new run: step 0 is next
            rec._opened(created)
        else:
            rec._load()
        return rec

    @classmethod
    def attach(cls, namespace: str, run: str, *, api: client.ApiClient | None = None,
               kubeconfig: str | None = None, **kwargs: Any) -> Recorder:
        """Continue an existing Run; raises :class:`RecordingRefused` if it does not exist."""
        rec = cls(api or _default_api(kubeconfig), namespace, run, **kwargs)
        rec._load()
        return rec

    def _load(self) -> dict:
        try:
            obj = calls.read(self.custom, "runs", self.run, self.namespace)
        except ApiException as err:
            raise _refusal(err, f"Run {self.namespace}/{self.run}") from err
        self._opened(obj)
        return obj

    def _opened(self, obj: dict) -> None:
        """Keep what the recorder needs of its Run ``obj`` (as created or read at open): mode,
        recovery, manifest, its pinned manifest, and the copy every step carries
        (``spec.runAtOpen``: uid, mode, recovery, manifest revision, scope and, for a child run,
        its ancestors' scopes, read here once). Raises :class:`RecordingRefused` when an ancestor
        cannot be read."""
        spec = obj.get("spec") or {}
        self._mode = spec.get("mode", "enforce")
        if spec.get("recovery") == "required":
            self.recovery = "required"  # the run's promise holds for every recorder of it
        self._manifest_name = spec["manifestRef"]["name"]
        self._uid = obj["metadata"]["uid"]
        pin = spec.get("pinnedManifest")
        self._pinned = PinnedManifest.model_validate(pin) if isinstance(pin, dict) else None
        if self._pinned is None:
            self._at_open = None
            return
        self._at_open = run_at_open(obj, self._ancestors((spec.get("parentRef") or {}).get("name")))
        if self._at_open is not None and self.at_admission:  # the recording webhook's own mark
            self._at_open["recordedAtAdmission"] = True

    def _ancestors(self, parent: str | None) -> list[dict[str, Any]]:
        """The run's ancestors from its parent up (nested runs: at most 8), each ``{name,
        scope}`` as the API server holds it now: a halt on an ancestor's scope stops this run's
        calls too. Raises :class:`RecordingRefused` when one cannot be read."""
        out: list[dict[str, Any]] = []
        while parent and len(out) < 8:
            try:
                obj = calls.read(self.custom, "runs", parent, self.namespace)
            except ApiException as err:
                raise _refusal(err, f"reading ancestor Run {self.namespace}/{parent}") from err
            spec = obj.get("spec") or {}
            out.append({"name": parent, **({"scope": dict(spec["scope"])} if spec.get("scope") else {})})
            parent = (spec.get("parentRef") or {}).get("name")
        return out

    def manifest(self, refresh: bool = False) -> ToolManifestSpec | None:
        """The run's ToolManifest spec as it is now (cached), or None when it does not exist. A
        call is checked against the entries pinned when the run was opened (:meth:`begin`)."""
        if self._manifest is None or refresh:
            obj = calls.get(self.custom, "toolmanifests", self._manifest_name, self.namespace)
            if obj is None:
                return None
            self._manifest = ToolManifestSpec.model_validate(obj["spec"])
        return self._manifest

    # ----- the journal's next index ---------------------------------------------------------

    def _recorded(self, index: int) -> bool:
        """Whether step ``index`` of the run exists (one GET of its RunStep)."""
        try:
            return calls.get(self.custom, "runsteps", step_name(self.run, index), self.namespace) is not None
        except ApiException as err:
            raise _refusal(err, f"reading Run {self.namespace}/{self.run}") from err

    def _first_free(self, start: int = 0) -> int:
        """The lowest index from ``start`` on that no step has: steps are 0..n-1 with no gap, so a
        galloping then binary search finds it in O(log n) GETs, whatever the run's length."""
        if not self._recorded(start):
            return start
        low, step = start, 1  # low is recorded
        high = start + step
        while high < MAX_RUN_STEPS and self._recorded(high):
            low, step = high, step * 2
            high = start + step
        high = min(high, MAX_RUN_STEPS)
        while high - low > 1:  # low recorded, high not (or the limit)
            mid = (low + high) // 2
            if self._recorded(mid):
                low = mid
            else:
                high = mid
        return high

    # ----- recording ----------------------------------------------------------------------

    def begin(self, tool: str, args: Mapping[str, Any], depends_on: list[int] | None = None) -> Step:
        """Record ``tool(args)`` as ``intended`` and return the step (call not yet made).

        Creates the RunStep ``<run>-<index>`` for the next index: one write of a small object,
        whatever the run's length (the run itself is never read). When another writer took that
        index first, the name exists and the create fails, so the next free index is taken: two
        writers never share an index. The step carries a snapshot of the tool's manifest entry
        (read once per recorder; the admission webhook replaces it with the current entry).

        Raises :class:`UnknownTool` in enforce mode when the manifest has no entry,
        :class:`RecoveryRequired` with ``recovery="required"`` when the tool cannot be undone,
        :class:`RunClosed` once a rollback took the run, :class:`RecordingRefused` (or
        :class:`Halted`, :class:`NotYourRun`, :class:`DuplicateCall`) when the server refuses,
        e.g. past the run's size limit.
        """
        if self.closed_by:
            raise RunClosed(f"recording {tool} in Run {self.namespace}/{self.run} refused: run was rolled back by "
                            f"RollbackRequest {self.closed_by}; record further calls in a new Run",
                            reason="Forbidden", request=self.closed_by)
        if self._pinned is not None:  # the manifest as it was when the run was opened
            spec = self._pinned.tool(tool)
        else:
            manifest = self.manifest()
            spec = manifest.tool(tool) if manifest else None
            if spec is None:  # maybe added since it was read: look once more before refusing
                manifest = self.manifest(refresh=True)
                spec = manifest.tool(tool) if manifest else None
        if spec is None and self._mode == "enforce":
            pinned = f" as pinned when the run was opened (revision {self._pinned.revision})" if self._pinned else ""
            raise UnknownTool(
                f"tool {tool!r} has no entry in ToolManifest {self.namespace}/{self._manifest_name}{pinned}; "
                "add it to the manifest (a new run pins it) or open the run in observe mode", reason="UnknownTool")
        if self.recovery == "required" and not _undoable(spec):
            raise RecoveryRequired(f"recording {tool} in Run {self.namespace}/{self.run} refused: recovery required: "
                                   f"{tool} cannot be undone (its manifest entry is "
                                   f"{'missing' if spec is None else spec.effect + ' with no compensation'}); "
                                   "call it outside this run, or open the run with recovery='bestEffort'",
                                   reason="RecoveryRequired")
        try:
            size = len(canonical_json(dict(args)).encode("utf-8"))
        except (TypeError, ValueError):
            size = 0  # not plain JSON (the client serializes it): the API server measures it
        if size > MAX_CALL_BYTES:  # the documented limit, checked here: the API server's ceiling is looser
            raise RecordingRefused(f"recording {tool} in Run {self.namespace}/{self.run} refused: {tool}: args is "
                                   f"{size} bytes of JSON, more than the limit of {MAX_CALL_BYTES} bytes per step; "
                                   "record a reference (an id, a URL) instead of the whole payload", reason="Invalid",
                                   status=422)
        if self._at_open is not None:  # the recorded call: the API server's policies stamp and check it
            value: dict[str, Any] = {"tool": tool, "args": dict(args), "outcome": "intended",
                                     "runAtOpen": self._at_open}
        else:  # a Run opened without a pinned manifest: the step crosses the admission webhook
            value = {"tool": tool, "args": dict(args), "outcome": "intended", "recordedAt": _now()}
            if spec is not None:
                value["snapshot"] = spec.to_wire()
        if depends_on:
            value["dependsOn"] = list(depends_on)
        if self._next is None:
            self._next = self._first_free()
        claim = self._claim(tool, args, spec)
        try:
            return self._create_step(tool, args, value, claim)
        except BaseException:
            if claim is not None:
                claims.release(self.api, self.namespace, claim)  # the call is not made: it claims nothing
            raise

    def _claim(self, tool: str, args: Mapping[str, Any], spec: ToolSpec | None) -> str | None:
        """Claim the call's forward idempotency key before its step is recorded
        (:mod:`reversi.adapters.claims`): the claim's name, or None when the tool has no key (or
        the run crosses the webhook, which checks the key itself). Raises :class:`DuplicateCall`
        when an earlier call with the same key still stands."""
        if self._at_open is None or spec is None or not spec.idempotency_key:
            return None
        try:
            key = forward_key(spec.idempotency_key, dict(args), None)
        except (MissingValue, TypeError, ValueError):
            return None
        name = claims.claim_name(self.run, tool, key)
        index = self._next or 0
        try:
            held = claims.claim(self.api, self.namespace, self.run, self._uid, name,
                                f"{step_name(self.run, index)} {self._id}")
        except ApiException as err:
            raise _refusal(err, f"claiming the idempotency key of {tool} in Run {self.namespace}/{self.run}") from err
        if held is not None:
            earlier = held.rsplit("-", 1)[-1].lstrip("0") or "0"
            raise DuplicateCall(f"recording {tool} in Run {self.namespace}/{self.run} refused: duplicate call: step "
                                f"{index} ({tool}) has idempotency key {key!r}, like step {earlier}, which still "
                                "stands; the first call must be undone (or fail) before it is repeated",
                                reason="Conflict", status=409)
        return name

    def _create_step(self, tool: str, args: Mapping[str, Any], value: dict[str, Any], claim: str | None) -> Step:
        """Create the step's RunStep at the next free index (another writer took it: the next
        one, and the claim follows). Raises :class:`RecordingRefused` and its kinds."""
        assert self._next is not None
        claimed_for = self._next
        for _ in range(50):
            index = self._next
            if index >= MAX_RUN_STEPS:
                raise RecordingRefused(f"recording {tool}: Run {self.namespace}/{self.run} has reached the limit of "
                                       f"{MAX_RUN_STEPS:,} steps; open a new Run for further calls", reason="Invalid")
            if claim is not None and index != claimed_for:
                claims.hand_over(self.api, self.namespace, claim, f"{step_name(self.run, index)} {self._id}")
                claimed_for = index
            body = step_body(self.namespace, self.run, {**value, "index": index})
            try:  # a 409 means "index taken": repeated only when it surely did not land (never twice)
                calls.create(self.custom, "runsteps", body, self.namespace, policy=calls.RECORDING)
            except ApiException as err:
                if err.status == 409 and _reason(err) == "AlreadyExists":  # another writer took it
                    self.index_conflicts += 1
                    self._next = self._first_free(index + 1)
                    continue
                refused = _refusal(err, f"recording {tool} in Run {self.namespace}/{self.run}")
                if isinstance(refused, RunClosed):
                    self.closed_by = refused.request or self.closed_by
                raise refused from err
            self._next = index + 1
            self.steps_recorded += 1
            step = Step(index, tool, dict(args))
            if claim is not None:
                step.extra["claim"] = claim
            return step
        raise RecordingRefused(f"recording {tool}: the run kept changing; try again", reason="Conflict")

    def finish(self, step: Step, outcome: str, result: Any = None, error: str | None = None) -> None:
        """Move ``step`` from ``intended`` to ``outcome`` (succeeded, failed, uncertain): one
        patch of its RunStep, guarded by a test that the outcome is still intended.

        Raises :class:`OutcomeNotRecorded` when the server refuses the write: the call *was*
        made, and the step stays ``intended`` (a rollback reports it unresolved).
        """
        wire = None if result is None else result if isinstance(result, dict) else {"value": result}
        try:
            size = len(canonical_json(wire).encode("utf-8")) if wire is not None else 0
        except (TypeError, ValueError):
            size = 0  # not plain JSON (the client serializes it): the API server measures it
        if size > MAX_CALL_BYTES:  # the documented limit, checked here: the API server's ceiling is looser
            raise OutcomeNotRecorded(
                f"recording the outcome of step {step.index} of Run {self.namespace}/{self.run} refused: step "
                f"{step.index} ({step.tool}): result is {size} bytes of JSON, more than the limit of {MAX_CALL_BYTES} "
                f"bytes per step; record a reference (an id, a URL) instead of the whole payload; the call was made, "
                f"and step {step.index} stays intended (settle it with a resolution)", reason="Invalid", status=422)
        patch: list[dict[str, Any]] = [
            {"op": "test", "path": "/spec/outcome", "value": "intended"},
            {"op": "replace", "path": "/spec/outcome", "value": outcome},
        ]
        if wire is not None:
            patch.append({"op": "add", "path": "/spec/result", "value": wire})
        if error:
            patch.append({"op": "add", "path": "/spec/error", "value": error[:500]})
        tries = 0

        def write(**kw: Any) -> Any:
            nonlocal tries
            tries += 1
            return self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, "runsteps",
                                                              step_name(self.run, step.index), patch,
                                                              _content_type=JSON_PATCH, **kw)

        try:  # guarded by its test: a repetition of a write that landed fails the test, then is read back
            calls.call(write, policy=calls.RECORDING)
        except ApiException as err:
            if err.status == 404:
                raise OutcomeNotRecorded(
                    f"recording the outcome of step {step.index} of Run {self.namespace}/{self.run} refused: the step "
                    "is gone: its Run was deleted (and maybe created again under the same name) after this recorder "
                    "opened it, and its steps were deleted with it; the call was made and is in no journal now",
                    reason="NotFound", status=404) from err
            if not (tries > 1 and calls.failed_test(err) and self._outcome(step.index) == outcome):
                refused = _refusal(err, f"recording the outcome of step {step.index} of Run "
                                        f"{self.namespace}/{self.run}")
                raise OutcomeNotRecorded(f"{refused.message}; the call was made, and step {step.index} stays intended "
                                         "(settle it with a resolution)", reason=refused.reason,
                                         status=err.status) from err
            # else: an earlier attempt failed on the way but had landed (read back): recorded
        step.outcome, step.result, step.error = outcome, result, error
        claim = step.extra.get("claim")
        if outcome == "failed" and claim:  # a failed call no longer stands: its key is free again
            try:
                claims.release(self.api, self.namespace, claim)
            except ApiException:
                pass  # the next claimant releases it (its call no longer stands)

    def _outcome(self, index: int) -> str | None:
        """Step ``index``'s recorded outcome, read back (None when it cannot be read)."""
        try:
            obj = calls.get(self.custom, "runsteps", step_name(self.run, index), self.namespace)
        except ApiException:
            return None
        return ((obj or {}).get("spec") or {}).get("outcome")

    @contextlib.contextmanager
    def step(self, tool: str, args: Mapping[str, Any], depends_on: list[int] | None = None) -> Iterator[Step]:
        """Context manager: records ``intended``, yields the step, then records the outcome.

        Set ``step.result`` in the block. An exception from ``failed_errors`` records ``failed``
        (the call had no effect); any other exception — a timeout, a dropped connection, an
        interrupt — records ``uncertain``. Either is re-raised.
        """
        s = self.begin(tool, args, depends_on)
        try:
            yield s
        except self.failed_errors as err:
            self.finish(s, "failed", error=f"{type(err).__name__}: {err}")
            raise
        except BaseException as err:
            self.finish(s, "uncertain", error=f"{type(err).__name__}: {err}")
            raise
        self.finish(s, "succeeded", result=s.result)

    def call(self, tool: str, args: Mapping[str, Any], fn: Callable[[dict[str, Any]], T],
             depends_on: list[int] | None = None) -> T:
        """Record and make one call: ``fn(args)``; its return value is the step's result."""
        with self.step(tool, args, depends_on) as s:
            s.result = fn(dict(args))
        return s.result

    @property
    def kube(self) -> KubeCalls:
        """Writes to namespaced Kubernetes objects, each recorded with the object's prior and post
        state, undone by the built-in Kubernetes family (:class:`KubeCalls`)."""
        if self._kube is None:
            self._kube = KubeCalls(self)
        return self._kube


    # ----- rolling back and settling from code (recovery in code) ---------------------------

    def rollback(self, reason: str = "", *, timeout: float = DEFAULT_TIMEOUT, poll: float = POLL_SECONDS,
                 spec: Mapping[str, Any] | None = None) -> RollbackResult:
        """Roll the run back now and wait for the verdict: creates a RollbackRequest for the run
        (``reason`` kept in its ``reversi.dev/reason`` annotation; ``spec`` adds fields such as
        ``retries`` or ``approveCompensations``) and polls its phase every ``poll`` seconds until
        it is final or ``timeout`` seconds have passed.

        The request closes the run when it takes its lock: from then on this recorder's
        :meth:`begin` raises :class:`RunClosed` without reaching the API server (or the tool).
        Returns a :class:`RollbackResult` — complete or not; check ``.complete``. Raises
        :class:`RecordingRefused` when the request cannot be created.
        """
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RollbackRequest",
                "metadata": {"generateName": f"{self.run[:40]}-undo-",
                             "annotations": {REASON_ANNOTATION: reason[:1024]} if reason else {}},
                "spec": {**dict(spec or {}), "runRef": {"name": self.run}}}
        try:  # a generated name: repeated only when it surely did not land (never two requests)
            created = calls.create(self.custom, "rollbackrequests", body, self.namespace)
            assert created is not None  # without exists_ok a 409 raises
        except ApiException as err:
            raise _refusal(err, f"rolling back Run {self.namespace}/{self.run}", advice=RECOVER_ADVICE) from err
        name = created["metadata"]["name"]
        self.closed_by = name  # no later call of this recorder is made, whatever the request's fate
        return self.wait_rollback(name, timeout=timeout, poll=poll)

    def wait_rollback(self, request: str, *, timeout: float = DEFAULT_TIMEOUT,
                      poll: float = POLL_SECONDS) -> RollbackResult:
        """Poll RollbackRequest ``request`` until its phase is final (``Succeeded``,
        ``Incomplete``, ``Failed``) or ``timeout`` seconds pass; returns what it says then
        (``timedOut`` true when it was not final)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                obj = calls.read(self.custom, "rollbackrequests", request, self.namespace)
            except ApiException as err:
                if err.status != 404 or time.monotonic() >= deadline:
                    raise _refusal(err, f"reading RollbackRequest {self.namespace}/{request}",
                                   advice=RECOVER_ADVICE) from err
                obj = {"status": {}}
            status = obj.get("status") or {}
            final = status.get("phase") in ("Succeeded", "Incomplete", "Failed")
            if final or time.monotonic() >= deadline:
                return RollbackResult.of(self.namespace, self.run, request, status, timed_out=not final)
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))

    def unresolved(self) -> list[Step]:
        """The run's steps whose outcome is unknown (intended or uncertain) and that no resolution
        settles yet, oldest first (one paged LIST of the run's RunSteps). Each :class:`Step` has
        the tool's manifest entry in ``extra["snapshot"]``: its own snapshot, else the Run's pinned
        entry (None when unmanifested)."""
        out = []
        for obj in list_objects(self.custom, self.namespace, self.run):
            spec = obj.get("spec") or {}
            if spec.get("outcome") in ("intended", "uncertain") and not spec.get("resolution"):
                snapshot = spec.get("snapshot")
                if snapshot is None and spec.get("runAtOpen") and self._pinned is not None:
                    entry = self._pinned.tool(spec["tool"])
                    snapshot = entry.to_wire() if entry is not None else None
                out.append(Step(spec["index"], spec["tool"], dict(spec.get("args") or {}), spec.get("result"),
                                spec["outcome"], spec.get("error"), {"snapshot": snapshot}))
        return out

    def reconcile(self, probe: Callable[[Step], Settlement | None], *, name: str = "") -> Reconciled:
        """Settle the run's unknown outcomes by asking ``probe``.

        For each step of :meth:`unresolved`, calls ``probe(step)``: a :class:`Settlement`
        (``succeeded`` with the call's real ``result``, or ``failed``) settles the step with its
        RunStep's ``spec.resolution``, whose note says the probe settled it (``settled by probe
        <name>: <settlement note>``; the actor is the authenticated user, stamped by the API
        server, rule 7); ``None`` leaves it. A probe that raises leaves the step too (the error is
        in ``errors``). Returns :class:`Reconciled`: what was settled and what was left. A
        settled step with a result can then be undone by a rollback; one left stays unresolved.
        """
        label = name or getattr(probe, "__name__", "") or type(probe).__name__
        done = Reconciled()
        for step in self.unresolved():
            try:
                settlement = probe(step)
            except Exception as err:  # noqa: BLE001 - a probe that fails leaves the step as it was
                done.left.append(step.index)
                done.errors[step.index] = f"{type(err).__name__}: {err}"
                continue
            if settlement is None:
                done.left.append(step.index)
                continue
            resolution: dict[str, Any] = {"status": settlement.status,
                                          "note": f"settled by probe {label}: {settlement.note or 'no note'}"[:1024]}
            if settlement.result is not None:
                resolution["result"] = settlement.result if isinstance(settlement.result, dict) else {
                    "value": settlement.result}
            try:  # admission stamps the resolution: repeated only when it surely did not land
                calls.call(self.custom.patch_namespaced_custom_object, GROUP, VERSION, self.namespace, "runsteps",
                           step_name(self.run, step.index), {"spec": {"resolution": resolution}}, repeat="unsent")
            except ApiException as err:
                done.left.append(step.index)
                done.errors[step.index] = _refusal(err, f"settling step {step.index}").message
                continue
            done.settled[step.index] = settlement
        return done

    def reader_probe(self, *, timeout: float = 120.0,
                     poll: float = POLL_SECONDS) -> Callable[[Step], Settlement | None]:
        """A ready-made probe for :meth:`reconcile`: it runs the step's declared verification
        reader (its manifest snapshot's ``verification``: tool, runner) as a reader Job, with the
        arguments resolved from the call's ``args`` alone (the result is what is unknown), and
        proposes ``succeeded`` with the reader's JSON answer as the result. It leaves the step
        (``None``) when the tool declares no verification or runner, when the arguments need
        ``$result``, or when the reader fails or prints no JSON (absence is not proof). The Job
        (owned by the Run, named ``rv-<run>-<step>-c0-r<n>``) needs the right to create Jobs and
        Secrets in the namespace; it is waited for up to ``timeout`` seconds, polled every
        ``poll``."""
        from .adapters import jobs as jobs_mod
        from .adapters.kube import Kube
        from .engine.templates import MissingValue, resolve
        from .engine.verify import parse_answer

        kube = Kube(self.api)
        rec = self

        def reader(step: Step) -> Settlement | None:
            raw = step.extra.get("snapshot")
            entry = ToolSpec.model_validate(raw) if isinstance(raw, dict) else None
            check = entry.verification if entry is not None else None
            manifest = rec.manifest()
            runner = next((r for r in manifest.runners if check and r.name == check.runner), None) if manifest else None
            if check is None or runner is None:
                return None
            try:
                arguments = resolve(check.args, step.args, None)
            except MissingValue:
                return None
            run_obj = rec._load()
            uid = run_obj["metadata"]["uid"]
            owner = jobs_mod.Owner(rec.namespace, rec.run, uid, kind="Run")
            secret, job = jobs_mod.build_job(owner=owner, run_name=rec.run, run_uid=uid, step=step.index, attempt=0,
                                             runner=runner, call=jobs_mod.reader_call(check.tool, arguments),
                                             role="reader", read=int(time.time() * 10) % 10**8)
            kube.create_job(secret, job)
            name, deadline = job["metadata"]["name"], time.monotonic() + timeout
            while True:
                view = kube.job_view(calls.call(kube.batch.read_namespaced_job, name, rec.namespace), reader=True)
                if view.state != "running" or time.monotonic() >= deadline:
                    break
                time.sleep(poll)
            if view.state != "succeeded":
                return None
            try:
                answer = parse_answer(view.output or "")
            except ValueError:
                return None
            if not isinstance(answer, dict):
                return None
            return Settlement("succeeded", result=answer,
                              note=f"reader {check.tool} (Job {name}) found the call's effect: "
                                   f"{json.dumps(answer, sort_keys=True)[:300]}")

        return reader

    # ----- boundaries -----------------------------------------------------------------------

    @classmethod
    def boundary(cls, namespace: str, run: str, *, manifest: str, timeout: float = DEFAULT_TIMEOUT,
                 poll: float = POLL_SECONDS, rollback_spec: Mapping[str, Any] | None = None,
                 **open_kwargs: Any) -> Boundary:
        """A recovery boundary: ``with Recorder.boundary(ns, run, manifest=...) as b:``.

        Opens the run like :meth:`open` (same keyword arguments, plus ``recovery``) and yields a
        :class:`Boundary`, which records like a recorder (``b.call``, ``b.step``). When the
        block raises, the run is rolled back (a RollbackRequest, waited for up to ``timeout``
        seconds); then the original error is re-raised when the rollback is complete, or
        :class:`RollbackIncomplete` is raised (with the original error as ``__cause__``) when it
        is not. ``b.rollback(reason=...)`` rolls back from inside the block. ``async with
        Recorder.aboundary(...)`` is the async form.
        """
        return Boundary(cls.open(namespace, run, manifest=manifest, **open_kwargs), timeout=timeout, poll=poll,
                        rollback_spec=rollback_spec)

    @classmethod
    def aboundary(cls, namespace: str, run: str, *, manifest: str, timeout: float = DEFAULT_TIMEOUT,
                  poll: float = POLL_SECONDS, rollback_spec: Mapping[str, Any] | None = None,
                  **open_kwargs: Any) -> AsyncBoundary:
        """The async form of :meth:`boundary`: ``async with Recorder.aboundary(...) as b:``; the
        run is opened on entry (in a thread)."""
        return AsyncBoundary(lambda: cls.open(namespace, run, manifest=manifest, **open_kwargs), timeout=timeout,
                             poll=poll, rollback_spec=rollback_spec)


@dataclass
class Settlement:
    """What a probe found out about a call whose outcome was unknown: ``status`` ``succeeded``
    (with the call's real ``result``, a dict, so its undo can be resolved) or ``failed``
    (nothing happened); ``note`` says how it knows."""

    status: str
    result: Any = None
    note: str = ""

    def __post_init__(self) -> None:
        if self.status not in ("succeeded", "failed"):
            raise ValueError(f"a settlement is 'succeeded' or 'failed', not {self.status!r}")


@dataclass
class Reconciled:
    """What :meth:`Recorder.reconcile` did: ``settled`` (step index -> its settlement),
    ``left`` (indices the probe could not settle) and ``errors`` (index -> why, for a probe that
    raised or a resolution the server refused)."""

    settled: dict[int, Settlement] = field(default_factory=dict)
    left: list[int] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)


@dataclass
class RollbackResult:
    """The verdict of a rollback requested from code: ``request`` (the RollbackRequest's name),
    ``phase`` (``Succeeded``, ``Incomplete``, ``Failed``, or the last phase seen when
    ``timed_out``), ``complete``, the ``report`` (docs/concepts.md#the-report, as in the request's status),
    ``failed`` (``[{step, error}]``), ``residue`` (typed: ``[{step, type, text}]``, type
    declared, failed, notAttempted or unknown: what the rollback leaves behind) and ``message`` (the
    request's verdict)."""

    namespace: str
    run: str
    request: str
    phase: str
    complete: bool
    report: dict[str, Any]
    failed: list[dict[str, Any]]
    residue: list[dict[str, Any]]
    message: str
    timed_out: bool = False

    @classmethod
    def of(cls, namespace: str, run: str, request: str, status: Mapping[str, Any],
           timed_out: bool = False) -> RollbackResult:
        report = dict(status.get("report") or {})
        complete_cond: Mapping[str, Any] = next(
            (c for c in status.get("conditions") or [] if c.get("type") == "Complete"), {})
        phase = status.get("phase") or "Pending"
        return cls(namespace, run, request, phase, phase == "Succeeded" and bool(report.get("complete")), report,
                   list(report.get("failed") or []), list(report.get("residue") or []),
                   str(complete_cond.get("message") or ""), timed_out)

    def describe(self) -> str:
        """One line for a person: which request, how it ended, what failed."""
        what = f"RollbackRequest {self.namespace}/{self.request} of Run {self.namespace}/{self.run}"
        if self.timed_out:
            return f"{what} did not finish in time (phase {self.phase}); kubectl reversi describe run/{self.run}"
        failed = ", ".join(f"step {f.get('step')}: {f.get('error')}" for f in self.failed)
        return f"{what} ended {self.phase}: {self.message or 'incomplete'}" + (f" (failed: {failed})" if failed else "")


class RollbackIncomplete(Exception):
    """A boundary's rollback did not undo everything: ``result`` (:class:`RollbackResult`), and
    as shortcuts ``request``, ``report``, ``failed``, ``residue``; the block's original error
    is ``__cause__``."""

    def __init__(self, result: RollbackResult):
        super().__init__(result.describe())
        self.result = result
        self.request = result.request
        self.report = result.report
        self.failed = result.failed
        self.residue = result.residue


class Boundary:
    """A recovery boundary around a :class:`Recorder` (see :meth:`Recorder.boundary`).

    Records through the recorder (every recorder method works on it: ``call``, ``step``,
    ``begin``, ``finish``, ``reconcile``). The rule on exit of a block that raised an
    ``Exception``: unless the block already rolled back, roll the run back and wait; re-raise
    the error when the rollback is complete, else raise :class:`RollbackIncomplete` from it. A
    block that ends normally changes nothing. ``KeyboardInterrupt`` and other
    ``BaseException`` kinds pass through without a rollback.
    """

    def __init__(self, recorder: Recorder, *, timeout: float = DEFAULT_TIMEOUT, poll: float = POLL_SECONDS,
                 rollback_spec: Mapping[str, Any] | None = None):
        self.recorder = recorder
        self.timeout = timeout
        self.poll = poll
        self.rollback_spec = dict(rollback_spec or {})
        #: the verdict of this boundary's rollback, once there was one
        self.result: RollbackResult | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.recorder, name)

    def rollback(self, reason: str = "") -> RollbackResult:
        """Roll back from inside the block: closes the run (the request takes its lock), undoes
        what ran, and returns the :class:`RollbackResult` (check ``.complete``). Every later call
        in the block raises :class:`RunClosed` before it is made."""
        self.result = self.recorder.rollback(reason, timeout=self.timeout, poll=self.poll, spec=self.rollback_spec)
        return self.result

    def __enter__(self) -> Boundary:
        return self

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> Literal[False]:
        if error is None or not isinstance(error, Exception) or self.result is not None:
            return False
        result = self.rollback(f"the block raised {type(error).__name__}: {error}")
        if result.complete:
            return False  # the original error goes on
        raise RollbackIncomplete(result) from error


class AsyncBoundary:
    """The async form of :class:`Boundary` (``async with Recorder.aboundary(...) as b:``).
    Blocking API calls run in threads. ``await b.call(tool, args, fn)`` records a call whose
    ``fn(args)`` may return an awaitable; ``await b.rollback(reason)``; ``b.recorder`` for the
    rest. Same rule on exit as :class:`Boundary`."""

    def __init__(self, opener: Callable[[], Recorder], *, timeout: float = DEFAULT_TIMEOUT,
                 poll: float = POLL_SECONDS, rollback_spec: Mapping[str, Any] | None = None):
        self._opener = opener
        self._options = dict(timeout=timeout, poll=poll, rollback_spec=rollback_spec)
        self.sync: Boundary | None = None

    @property
    def recorder(self) -> Recorder:
        assert self.sync is not None, "use inside 'async with'"
        return self.sync.recorder

    async def call(self, tool: str, args: Mapping[str, Any], fn: Callable[[dict[str, Any]], Any],
                   depends_on: list[int] | None = None) -> Any:
        rec = self.recorder
        step = await asyncio.to_thread(rec.begin, tool, args, depends_on)
        try:
            result = fn(dict(args))
            if inspect.isawaitable(result):
                result = await result
        except rec.failed_errors as err:
            await asyncio.to_thread(rec.finish, step, "failed", None, f"{type(err).__name__}: {err}")
            raise
        except BaseException as err:
            await asyncio.to_thread(rec.finish, step, "uncertain", None, f"{type(err).__name__}: {err}")
            raise
        await asyncio.to_thread(rec.finish, step, "succeeded", result)
        return result

    async def rollback(self, reason: str = "") -> RollbackResult:
        assert self.sync is not None, "use inside 'async with'"
        return await asyncio.to_thread(self.sync.rollback, reason)

    async def __aenter__(self) -> AsyncBoundary:
        self.sync = Boundary(await asyncio.to_thread(self._opener), **self._options)  # type: ignore[arg-type]
        return self

    async def __aexit__(self, kind: Any, error: BaseException | None, tb: Any) -> bool:
        assert self.sync is not None
        return await asyncio.to_thread(self.sync.__exit__, kind, error, tb)


#: how often ``rec.kube`` writes again after losing a race to a write that left the prior state as it was
KUBE_CONFLICT_TRIES = 5


class KubeCalls:
    """``rec.kube``: an agent's writes to namespaced Kubernetes objects, made with the recorder's
    own credentials and each recorded as one step of the built-in Kubernetes family
    (docs/concepts.md#built-in-kubernetes-compensation): the object's reference and prior state in
    ``args`` (read just before the write), its post state, uid and resourceVersion in ``result``.

    Objects are named by a reference ``{"apiVersion", "kind", "namespace", "name"}`` or by an
    object (a dict with those fields). The Run's manifest needs the family's entries
    (``kubectl reversi kube-manifest``). A write the API server refuses (4xx, also a lost race on
    the prior's resourceVersion: :class:`~reversi.adapters.apicalls.Conflict`) is recorded
    ``failed`` and raised; a timeout or a 5xx is recorded ``uncertain`` and raised. A Secret's
    content, and a state larger than ``kube_rules.MAX_STATE_BYTES``, never enter the journal:
    such a write is recorded under an irreversible tool (its residue says why).
    Raises :class:`reversi.engine.kube.OutOfScope` for a cluster-scoped or unnamed object, before any call.
    """

    def __init__(self, recorder: Recorder, *, field_manager: str = "reversi-agent"):
        self.recorder = recorder
        self.objects = Objects(recorder.api, field_manager)

    def create(self, body: Mapping[str, Any]) -> dict:
        """Create ``body``; returns the stored object. Undone by a delete (uid precondition)."""
        return self._record("create", body, lambda prior: self.objects.create(body))

    def apply(self, body: Mapping[str, Any], *, force: bool = False) -> dict:
        """Server-side apply of ``body`` (``force`` takes fields another manager owns; every write of
        ``rec.kube`` is field manager ``field_manager``, so an apply never conflicts with the agent's
        own patches), conditioned on the resourceVersion read as its prior state; an
        object that did not exist is created (refused if someone created it meanwhile, never
        merged into theirs). Returns the stored object."""
        def write(prior: dict | None) -> dict:
            if prior is None:
                return self.objects.create(body)
            return self.objects.apply(body, force=force, resource_version=_resource_version(prior), repeat="unsent")

        return self._record("apply", body, write)

    def patch(self, target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict:
        """A JSON merge patch of ``target`` (a reference or an object), conditioned on the
        resourceVersion read as its prior state; returns the stored object."""
        return self._record("patch", target, lambda prior: self.objects.merge_patch(
            kube_rules.object_ref(target), patch, _resource_version(prior), repeat="unsent"))

    def scale(self, target: Mapping[str, Any], replicas: int) -> dict:
        """Set ``spec.replicas`` of ``target`` (a Deployment, StatefulSet, ReplicaSet...)."""
        return self._record("scale", target, lambda prior: self.objects.merge_patch(
            kube_rules.object_ref(target), {"spec": {"replicas": int(replicas)}}, _resource_version(prior),
            repeat="unsent"))

    def delete(self, target: Mapping[str, Any]) -> None:
        """Delete ``target``, conditioned on the resourceVersion read as its prior state.
        Undone by a create of the prior state."""
        ref = kube_rules.object_ref(target)

        def write(prior: dict | None) -> None:
            if not self.objects.delete(ref, resource_version=_resource_version(prior), repeat="unsent"):
                raise ApiException(status=404, reason=f"{ref['kind']} {ref['namespace']}/{ref['name']} not found")

        self._record("delete", target, write)

    def _record(self, verb: str, target: Mapping[str, Any], write: Callable[[dict | None], dict | None]) -> Any:
        ref = kube_rules.object_ref(target)
        prior = self.objects.get(ref)
        tool, args = kube_rules.recorded_args(verb, ref, prior, target if verb in ("create", "apply") else None)
        step = self.recorder.begin(tool, args)
        try:
            stored = self._while_prior_holds(ref, prior, write)
        except ApiException as err:  # the server's message only: never the response body (a Secret's)
            refused = err.status is not None and 400 <= err.status < 500
            why = err.reason if tool == kube_rules.SECRET else calls.api_message(err)
            self.recorder.finish(step, "failed" if refused else "uncertain", error=f"HTTP {err.status}: {why}")
            raise
        except calls.Conflict as err:
            self.recorder.finish(step, "failed", error=f"Conflict: {err}")
            raise
        except BaseException as err:
            self.recorder.finish(step, "uncertain", error=f"{type(err).__name__}: {err}")
            raise
        self.recorder.finish(step, "succeeded", result=kube_rules.recorded_result(tool, stored))
        return stored


    def _while_prior_holds(self, ref: Mapping[str, Any], prior: dict | None,
                           write: Callable[[dict | None], dict | None]) -> dict | None:
        """``write(prior)``, again with the object read anew when it lost a race to a write that
        left the recorded prior state as it was (a controller's status update moves the
        resourceVersion, not the state); raises :class:`~reversi.adapters.apicalls.Conflict` when
        the state itself changed since it was recorded, or after :data:`KUBE_CONFLICT_TRIES`."""
        for _ in range(KUBE_CONFLICT_TRIES - 1):
            try:
                return write(prior)
            except calls.Conflict:
                live = self.objects.get(ref)
                if not kube_rules.matches(kube_rules.user_state(live), kube_rules.user_state(prior)):
                    raise
                prior = live
        return write(prior)


def _resource_version(obj: Mapping[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


def _undoable(spec: ToolSpec | None) -> bool:
    """Whether a call of a tool with this manifest entry can be undone or needs no undo."""
    if spec is None or spec.effect == "irreversible":
        return False
    return spec.effect != "write" or spec.compensation is not None


def _default_api(kubeconfig: str | None) -> client.ApiClient:
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        return config.new_client_from_config()
