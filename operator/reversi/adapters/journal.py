"""The run's journal on the API: RunStep objects (docs/concepts.md#the-journal), read, written and migrated.

Pure builders (:func:`step_body`, :func:`undo_patch`) and the few API calls every reader and
writer shares — the operator, the webhooks, ``kubectl reversi`` and the SDK — so the layout is
known in one place:

- :func:`list_entries`: a run's RunSteps, paged (``limit`` :data:`PAGE`), as engine entries;
- :func:`load`: the Run's journal (inline steps of Reversi 0.1 merged with its RunSteps);
- :func:`write_undo`: a step's undo state, on its RunStep's status;
- :func:`migrate_inline`: move an inline journal of Reversi 0.1 into RunSteps.

Every call takes a ``CustomObjectsApi`` and goes through :mod:`~reversi.adapters.apicalls`
(:data:`TIMEOUT` seconds per request, paging, retries of transient errors).
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any
import datetime as dt

from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from ..engine.journal import Entry, Journal, assemble
from . import apicalls as calls
from .apicalls import api_message
from ..models.run import RunSpec, Step, StepUndo
from ..models.runstep import LABEL_RUN, RunStepSpec, step_name

GROUP, VERSION = calls.GROUP, calls.VERSION
RUNS, STEPS = "runs", "runsteps"
PAGE = calls.PAGE  # RunSteps per LIST page
TIMEOUT = calls.TIMEOUT  # seconds per API request
MOVE_WORKERS = 8  # RunSteps created at once when an inline journal is moved
JSON_PATCH = "application/json-patch+json"
log = logging.getLogger("reversi.journal")


class JournalError(Exception):
    """The journal cannot be read or moved; the message names the object and the fix."""


def step_body(namespace: str, run: str, spec: dict[str, Any], *, owner_uid: str | None = None) -> dict[str, Any]:
    """The RunStep object of step ``spec["index"]`` of ``run`` (wire dict).

    ``spec`` is the RunStep spec without ``runRef`` (it is added). With ``owner_uid`` the Run is
    set as owner (the mutating webhook sets it when the client does not).
    """
    meta: dict[str, Any] = {"name": step_name(run, spec["index"]), "namespace": namespace,
                            "labels": {LABEL_RUN: run}}
    if owner_uid:
        meta["ownerReferences"] = [owner_reference(run, owner_uid)]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RunStep", "metadata": meta,
            "spec": {"runRef": {"name": run}, **spec}}


def run_at_open(run_obj: dict[str, Any], ancestors: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """What a recorded call carries of its Run as read at open (``spec.runAtOpen``): the Run's
    uid, mode, recovery, pinned manifest revision, principal and scope, and ``ancestors`` (each
    ``{name, scope?}``, from the parent up; nested runs). The API server's policies stamp and check
    a step by it (docs/concepts.md#the-recorded-calls-contract-rule-by-rule). None for a Run with
    no pinned manifest (opened before its ToolManifest existed)."""
    spec = run_obj.get("spec") or {}
    pin = spec.get("pinnedManifest")
    if not isinstance(pin, dict) or "revision" not in pin:
        return None
    out: dict[str, Any] = {"uid": run_obj["metadata"]["uid"], "mode": spec.get("mode", "enforce"),
                           "recovery": spec.get("recovery", "bestEffort"), "manifestRevision": pin["revision"]}
    if spec.get("principal"):
        out["principal"] = spec["principal"]
    if spec.get("scope"):
        out["scope"] = dict(spec["scope"])
    if ancestors:
        out["ancestors"] = ancestors
    return out


def owner_reference(run: str, uid: str) -> dict[str, Any]:
    """The owner reference of a RunStep to its Run (garbage collection deletes steps with the Run)."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Run", "name": run, "uid": uid,
            "blockOwnerDeletion": False, "controller": True}


def entry_of(obj: dict[str, Any]) -> Entry:
    """The engine :class:`~reversi.engine.journal.Entry` of a RunStep object (dict).

    Raises :class:`JournalError` naming the object when its spec or status is not valid.
    """
    try:
        spec = RunStepSpec.model_validate(obj.get("spec") or {})
        created = (obj.get("metadata") or {}).get("creationTimestamp")
        if spec.recorded_at is None and spec.run_at_open is not None and isinstance(created, str):
            # a recorded call's time is its creation time (the API server's clock)
            spec = spec.model_copy(update={"recorded_at": dt.datetime.fromisoformat(created.replace("Z", "+00:00"))})
        raw = (obj.get("status") or {}).get("undo")
        undo = StepUndo.model_validate(raw) if raw else None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        name = (obj.get("metadata") or {}).get("name")
        raise JournalError(f"RunStep {name} is invalid: {where}: {first.get('msg')}") from err
    return Entry(spec, undo)


def list_objects(custom: client.CustomObjectsApi, namespace: str, run: str) -> list[dict[str, Any]]:
    """Every RunStep of ``run`` (dicts), paged; ordered by index."""
    return list_objects_and_version(custom, namespace, run)[0]


def list_objects_and_version(custom: client.CustomObjectsApi, namespace: str,
                             run: str) -> tuple[list[dict[str, Any]], str]:
    """Every RunStep of ``run`` (dicts, paged, ordered by index) and the LIST's resourceVersion
    (a WATCH from it sees every later change)."""
    return list_selected_and_version(custom, namespace, f"{LABEL_RUN}={run}")


def list_selected_and_version(custom: client.CustomObjectsApi, namespace: str,
                              selector: str) -> tuple[list[dict[str, Any]], str]:
    """Every RunStep matching the label ``selector`` (dicts, paged, ordered by index) and the
    LIST's resourceVersion (one snapshot: a WATCH from it sees every later change)."""
    items, version = calls.list_objects_and_version(custom, STEPS, namespace, label_selector=selector, page=PAGE,
                                                    _preload_content=False)
    items.sort(key=lambda o: (o.get("spec") or {}).get("index", -1))
    return items, version


def list_entries(custom: client.CustomObjectsApi, namespace: str, run: str) -> list[Entry]:
    """Every RunStep of ``run`` as engine entries (see :func:`list_objects`, :func:`entry_of`)."""
    return [entry_of(obj) for obj in list_objects(custom, namespace, run)]


def load(custom: client.CustomObjectsApi, run_obj: dict[str, Any]) -> Journal:
    """The journal of the Run ``run_obj`` (a dict read from the API): its RunSteps merged with
    any inline journal. Raises :class:`JournalError` when the Run or a step is invalid."""
    meta = run_obj["metadata"]
    spec, legacy = inline_journal(run_obj)
    return assemble(spec, list_entries(custom, meta["namespace"], meta["name"]), legacy, meta.get("uid"))


def inline_journal(run_obj: dict[str, Any]) -> tuple[RunSpec, list[StepUndo]]:
    """The Run's spec and the undo state of its inline journal, for :func:`assemble`; once the
    inline journal has been moved (:func:`inline_moved`) both leave it out: the RunSteps are the
    record. Raises :class:`JournalError` when the Run is invalid."""
    spec = run_spec_of(run_obj)
    if spec.steps and inline_moved(run_obj):
        return spec.model_copy(update={"steps": [], "snapshots": [], "resolutions": []}), []
    try:
        legacy = [StepUndo.model_validate(u) for u in (run_obj.get("status") or {}).get("undo") or []]
    except ValidationError as err:
        raise JournalError(f"Run {run_obj['metadata'].get('name')}: status.undo is invalid: "
                           f"{err.errors()[0]['msg']}") from err
    return spec, legacy


def run_spec_of(run_obj: dict[str, Any]) -> RunSpec:
    """The Run's spec, validated; raises :class:`JournalError` naming the first problem."""
    try:
        return RunSpec.model_validate(run_obj.get("spec") or {})
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        meta = run_obj.get("metadata") or {}
        raise JournalError(f"Run {meta.get('namespace')}/{meta.get('name')} is invalid: spec.{where}: "
                           f"{first.get('msg')}") from err


def undo_patch(undo: StepUndo) -> dict[str, Any]:
    """The merge patch of a RunStep's status that records ``undo`` (rule 3: journal first). Each
    entry is whole (a write replaces the one before): a field ``undo`` leaves out is sent as
    ``null``, which a merge patch removes, so nothing of an earlier entry (an ``effectUnknown``, a
    ``lastError``, a ``verifiedBy``) outlives the write that settled it otherwise."""
    wire = undo.to_wire()
    cleared: dict[str, Any] = {f.alias or name: None for name, f in StepUndo.model_fields.items()}
    return {"status": {"undo": {**cleared, **wire}}}


def write_undo(custom: client.CustomObjectsApi, namespace: str, run: str, undo: StepUndo) -> dict[str, Any]:
    """Record a step's undo state on its RunStep (status subresource). Raises ``ApiException``."""
    return calls.call(custom.patch_namespaced_custom_object_status,  # a merge patch: safe to repeat
                      GROUP, VERSION, namespace, STEPS, step_name(run, undo.step), undo_patch(undo))


def inline_step_spec(run_spec: RunSpec, step: Step) -> dict[str, Any]:
    """The RunStep spec (wire dict, without ``runRef``) of an inline step of Reversi 0.1: the call
    with its snapshot inline and its resolution, if any."""
    snapshot = run_spec.snapshot_of(step)
    moved = step.model_copy(update={"snapshot": snapshot, "snapshot_id": None}).to_wire()
    res = next((r for r in run_spec.resolutions if r.step == step.index), None)
    if res is not None:
        moved["resolution"] = {k: v for k, v in res.to_wire().items() if k != "step"}
    return moved


def inline_moved(run_obj: dict[str, Any]) -> bool:
    """Whether the Run's inline journal (Reversi 0.1), if any, has been moved into RunSteps
    (``status.movedSteps`` counts the steps moved; the inline list itself never changes)."""
    inline = (run_obj.get("spec") or {}).get("steps") or []
    return not inline or (run_obj.get("status") or {}).get("movedSteps") == len(inline)


def migrate_inline(custom: client.CustomObjectsApi, run_obj: dict[str, Any]) -> int:
    """Move the inline journal of a Run recorded by Reversi 0.1 into RunSteps.

    Each inline step becomes the RunStep ``<run>-<index>`` with the same call, snapshot,
    ``recordedAt`` and resolution, and its ``status.undo`` entry; a RunStep that exists is kept
    (the move is idempotent: run it again after a crash). Then the Run's ``status.movedSteps`` is
    set to the number of steps moved, and readers take the steps from the RunSteps alone (the
    inline list, append-only, stays as it was recorded). Returns the number of steps moved;
    raises :class:`JournalError` or ``ApiException``.
    """
    meta = run_obj["metadata"]
    ns, run = meta["namespace"], meta["name"]
    spec = run_spec_of(run_obj)
    if inline_moved(run_obj):
        return 0
    undo = {u.get("step"): u for u in (run_obj.get("status") or {}).get("undo") or []}

    def move(step: Step) -> None:
        body = step_body(ns, run, inline_step_spec(spec, step), owner_uid=meta["uid"])
        try:  # a RunStep that exists is kept: repeating a create that may have landed is safe
            calls.create(custom, STEPS, body, ns, exists_ok=True)
        except ApiException as err:
            if err.status != 409:
                raise JournalError(f"Run {ns}/{run}: moving step {step.index} into a RunStep was refused: "
                                   f"{api_message(err)}") from err
        if step.index in undo:
            calls.call(custom.patch_namespaced_custom_object_status,
                       GROUP, VERSION, ns, STEPS, step_name(run, step.index), {"status": {"undo": undo[step.index]}})

    with ThreadPoolExecutor(MOVE_WORKERS) as pool:  # moved copies are admitted in any order
        for future in [pool.submit(move, step) for step in spec.steps]:
            future.result()
    calls.call(custom.patch_namespaced_custom_object_status, GROUP, VERSION, ns, RUNS, run,
               {"status": {"movedSteps": len(spec.steps)}})
    log.info("Run %s/%s: moved %d inline steps into RunSteps", ns, run, len(spec.steps))
    return len(spec.steps)


def count_steps(custom: client.CustomObjectsApi, namespace: str, run: str, hint: int = 0) -> int:
    """The number of steps of ``run`` as the API server holds them now (consistent GETs, not a
    cache): the first index from ``hint`` on with no RunStep, searched down when ``hint`` itself
    is past the end. Steps are 0..n-1 with no gap, so this is one or two GETs when ``hint`` is
    right (the size a watch has seen) and O(log n) otherwise."""

    def recorded(index: int) -> bool:
        return calls.get(custom, STEPS, step_name(run, index), namespace) is not None

    return _first_free(recorded, hint)


#: what the API server sends for a metadata-only read (PartialObjectMetadata): no spec, no status
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def step_metadata(custom: client.CustomObjectsApi, namespace: str, run: str, index: int) -> dict[str, Any] | None:
    """The metadata of step ``index`` of ``run`` (a consistent, metadata-only GET: name, uid,
    creationTimestamp, managedFields with the time of each writer's last write, no spec), or
    None when there is no such RunStep. Raises ``ApiException`` on other errors."""
    try:
        resp = calls.call(custom.get_namespaced_custom_object, GROUP, VERSION, namespace, STEPS,
                          step_name(run, index), _headers={"Accept": METADATA_ONLY}, _preload_content=False)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    found: dict[str, Any] = json.loads(resp.data)
    return found


def newest_step(custom: client.CustomObjectsApi, namespace: str, run: str,
                hint: int = 0) -> tuple[int, dict[str, Any] | None]:
    """``(number of steps, the newest step's metadata)`` of ``run`` (None without steps), found
    as :func:`count_steps` finds the count but with metadata-only GETs (:func:`step_metadata`):
    two GETs when ``hint`` is the count, about ``2 * log2(steps)`` without a hint. Steps are
    0..n-1 with no gap (admission refuses step n before step n-1), so this is exact."""
    seen: dict[int, dict[str, Any]] = {}

    def recorded(index: int) -> bool:
        found = step_metadata(custom, namespace, run, index)
        if found is not None:
            seen[index] = found
        return found is not None

    count = _first_free(recorded, hint)
    if count == 0:
        return 0, None
    newest = seen.get(count - 1)
    if newest is None:  # known recorded without a read of its own (the hint's predecessor): read it
        newest = step_metadata(custom, namespace, run, count - 1)
    return count, newest


def _first_free(recorded: Any, hint: int) -> int:
    """The first index with no step (steps 0..n-1 with no gap): from ``hint``, galloping up
    (hint, hint+1, hint+3, ...) or down, then a binary search; ``recorded(index)`` says whether
    step ``index`` exists."""
    low, high = -1, None  # low: known recorded (or -1); high: known free
    probe = max(hint, 0)
    if probe > 0 and not recorded(probe - 1):
        high = probe - 1
    else:
        low = probe - 1
        jump = 1
        while high is None:
            if recorded(low + jump):
                low, jump = low + jump, jump * 2
            else:
                high = low + jump
    while high - low > 1:
        mid = (low + high) // 2
        if recorded(mid):
            low = mid
        else:
            high = mid
    return high
