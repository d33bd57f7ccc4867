"""Record an automation's calls in a Run, so Reversi can undo them later.

An agent opens (or continues) a Run and wraps each call. The step is recorded ``intended``
*before* the call is made, so a call that crashes the agent still leaves a trace; after the
call it becomes ``succeeded`` (with the result), ``failed`` (with the error: only for the
exceptions you name in ``failed_errors``, which mean "refused, nothing happened") or
``uncertain`` (any other exception — a timeout of any HTTP library, a dropped connection, an
interrupt: the effect is unknown). DESIGN §2 and §4 rules 7, 9, 10.

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
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, TypeVar

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from .adapters.journal import step_body
from .models.runstep import MAX_RUN_STEPS, step_name
from .models.toolmanifest import ToolManifestSpec

GROUP, VERSION = "reversi.dev", "v1alpha1"
JSON_PATCH = "application/json-patch+json"
TIMEOUT = 30  # seconds per API request
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


_KINDS: tuple[tuple[str, type[RecordingRefused]], ...] = (
    ("kill switch:", Halted),
    ("belongs to another principal", NotYourRun),
    ("duplicate call:", DuplicateCall),
    ("has no entry in ToolManifest", UnknownTool),
)


def _refusal(err: ApiException, what: str) -> RecordingRefused:
    try:
        body = json.loads(err.body or "{}")
        message, reason = body.get("message", err.reason), body.get("reason", "")
    except ValueError:
        message, reason = str(err.body or err.reason), ""
    kind = next((k for marker, k in _KINDS if marker in message), RecordingRefused)
    return kind(f"{what} refused: {message}", reason=reason, status=err.status)


def _reason(err: ApiException) -> str:
    try:
        return str(json.loads(err.body or "{}").get("reason") or "")
    except (ValueError, AttributeError):
        return ""


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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
                 failed_errors: tuple[type[BaseException], ...] = FAILED_ERRORS):
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.run = run
        self.failed_errors = failed_errors
        self._manifest: ToolManifestSpec | None = None
        self._mode = "enforce"
        self._manifest_name = ""
        self._next: int | None = None  # the next free step index, once known
        #: how often another writer took the index this recorder was about to use (it then took
        #: the next free one): two writers never share an index
        self.index_conflicts = 0

    # ----- opening ------------------------------------------------------------------------

    @classmethod
    def open(cls, namespace: str, run: str, *, manifest: str, mode: str = "enforce",
             scope: Mapping[str, str] | None = None, api: client.ApiClient | None = None,
             kubeconfig: str | None = None, **kwargs: Any) -> "Recorder":
        """Create the Run ``namespace/run`` (or continue it if it exists) and return a recorder.

        ``manifest`` names the ToolManifest in the same namespace; ``mode`` is ``enforce`` or
        ``observe``; ``scope`` has ``actor``, ``tenant``, ``environment``. The principal is
        stamped by the API server from the authenticated user. Raises
        :class:`RecordingRefused` when the server refuses the Run.
        """
        api = api or _default_api(kubeconfig)
        rec = cls(api, namespace, run, **kwargs)
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Run",
                "metadata": {"name": run, "namespace": namespace},
                "spec": {"mode": mode, "scope": dict(scope or {}), "manifestRef": {"name": manifest}}}
        try:
            rec.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "runs", body,
                                                       _request_timeout=TIMEOUT)
            rec._mode, rec._manifest_name, rec._next = mode, manifest, 0  # a new run: step 0 is next
        except ApiException as err:
            if err.status != 409:
                raise _refusal(err, f"Run {namespace}/{run}") from err
            rec._load()
        return rec

    @classmethod
    def attach(cls, namespace: str, run: str, *, api: client.ApiClient | None = None,
               kubeconfig: str | None = None, **kwargs: Any) -> "Recorder":
        """Continue an existing Run; raises :class:`RecordingRefused` if it does not exist."""
        rec = cls(api or _default_api(kubeconfig), namespace, run, **kwargs)
        rec._load()
        return rec

    def _load(self) -> dict:
        try:
            obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, "runs", self.run,
                                                           _request_timeout=TIMEOUT)
        except ApiException as err:
            raise _refusal(err, f"Run {self.namespace}/{self.run}") from err
        self._mode = obj["spec"].get("mode", "enforce")
        self._manifest_name = obj["spec"]["manifestRef"]["name"]
        return obj

    def manifest(self, refresh: bool = False) -> ToolManifestSpec | None:
        """The run's ToolManifest spec (cached), or None when it does not exist."""
        if self._manifest is None or refresh:
            try:
                obj = self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, "toolmanifests", self._manifest_name, _request_timeout=TIMEOUT)
            except ApiException as err:
                if err.status == 404:
                    return None
                raise
            self._manifest = ToolManifestSpec.model_validate(obj["spec"])
        return self._manifest

    # ----- the journal's next index ---------------------------------------------------------

    def _recorded(self, index: int) -> bool:
        """Whether step ``index`` of the run exists (one GET of its RunStep)."""
        try:
            self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, "runsteps",
                                                     step_name(self.run, index), _request_timeout=TIMEOUT)
            return True
        except ApiException as err:
            if err.status == 404:
                return False
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
        :class:`RecordingRefused` (or :class:`Halted`, :class:`NotYourRun`,
        :class:`DuplicateCall`) when the server refuses, e.g. past the run's size limit.
        """
        manifest = self.manifest()
        spec = manifest.tool(tool) if manifest else None
        if spec is None:  # maybe added since it was read: look once more before refusing
            manifest = self.manifest(refresh=True)
            spec = manifest.tool(tool) if manifest else None
        if spec is None and self._mode == "enforce":
            raise UnknownTool(
                f"tool {tool!r} has no entry in ToolManifest {self.namespace}/{self._manifest_name}; "
                "add it to the manifest or open the run in observe mode", reason="UnknownTool")
        value: dict[str, Any] = {"tool": tool, "args": dict(args), "outcome": "intended", "recordedAt": _now()}
        if depends_on:
            value["dependsOn"] = list(depends_on)
        if spec is not None:
            value["snapshot"] = spec.to_wire()
        if self._next is None:
            self._next = self._first_free()
        for _ in range(50):
            index = self._next
            if index >= MAX_RUN_STEPS:
                raise RecordingRefused(f"recording {tool}: Run {self.namespace}/{self.run} has reached the limit of "
                                       f"{MAX_RUN_STEPS:,} steps; open a new Run for further calls", reason="Invalid")
            body = step_body(self.namespace, self.run, {**value, "index": index})
            try:
                self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, "runsteps", body,
                                                            _request_timeout=TIMEOUT)
            except ApiException as err:
                if err.status == 409 and _reason(err) == "AlreadyExists":  # another writer took it
                    self.index_conflicts += 1
                    self._next = self._first_free(index + 1)
                    continue
                raise _refusal(err, f"recording {tool} in Run {self.namespace}/{self.run}") from err
            self._next = index + 1
            return Step(index, tool, dict(args))
        raise RecordingRefused(f"recording {tool}: the run kept changing; try again", reason="Conflict")

    def finish(self, step: Step, outcome: str, result: Any = None, error: str | None = None) -> None:
        """Move ``step`` from ``intended`` to ``outcome`` (succeeded, failed, uncertain): one
        patch of its RunStep, guarded by a test that the outcome is still intended.

        Raises :class:`OutcomeNotRecorded` when the server refuses the write: the call *was*
        made, and the step stays ``intended`` (a rollback reports it unresolved).
        """
        patch: list[dict[str, Any]] = [
            {"op": "test", "path": "/spec/outcome", "value": "intended"},
            {"op": "replace", "path": "/spec/outcome", "value": outcome},
        ]
        if result is not None:
            patch.append({"op": "add", "path": "/spec/result",
                          "value": result if isinstance(result, dict) else {"value": result}})
        if error:
            patch.append({"op": "add", "path": "/spec/error", "value": error[:500]})
        try:
            self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, "runsteps",
                                                       step_name(self.run, step.index), patch,
                                                       _content_type=JSON_PATCH, _request_timeout=TIMEOUT)
        except ApiException as err:
            refused = _refusal(err, f"recording the outcome of step {step.index} of Run {self.namespace}/{self.run}")
            raise OutcomeNotRecorded(f"{refused.message}; the call was made, and step {step.index} stays intended "
                                     "(settle it with a resolution)", reason=refused.reason, status=err.status) from err
        step.outcome, step.result, step.error = outcome, result, error

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


def _default_api(kubeconfig: str | None) -> client.ApiClient:
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        return config.new_client_from_config()
