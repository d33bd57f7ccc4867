"""Admission rules for Runs and RollbackRequests (rules 7–12 and 16–17, docs/concepts.md#admission): pure decisions.

The webhook handlers (:mod:`reversi.handlers.admission`) read the halts, the manifest and the
caller's identity from the API and ask these functions; each returns ``None`` (admit) or a
:class:`Refusal` whose message says what happened and what to do. What a CEL rule in the CRD can
check without identity or other objects (append-only steps, immutable mode and scope) stays a
CEL rule; what needs them lives here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Iterable, Sequence

from ..models.halt import ClusterHaltScope, HaltScope, glob_match
from ..models.run import UNKNOWN_OUTCOMES, RunSpec, Step
from ..models.toolmanifest import ToolManifestSpec, ToolSpec
from .keys import canonical_json, forward_key
from .templates import MissingValue

_LOOKS_LIKE_REFERENCE = re.compile(r"^\$[A-Za-z_][A-Za-z0-9_]*(\..*)?$")

#: refusal reasons (the ``reason`` label of ``reversi_refused_calls_total``)
HALTED = "halted"
FOREIGN_PRINCIPAL = "foreignPrincipal"
UNKNOWN_TOOL = "unknownTool"
DUPLICATE = "duplicate"
INVALID = "invalid"
RUN_CLOSED = "runClosed"
RECOVERY_REQUIRED = "recoveryRequired"


@dataclass(frozen=True)
class Refusal:
    """Why a write is refused: ``reason`` (one of the constants above), ``message`` for the
    user, and for a halt the halt that refused it (``halt`` = ``(kind, namespace, name)``)."""

    reason: str
    message: str
    tool: str = ""
    halt: tuple[str, str | None, str] | None = None


@dataclass(frozen=True)
class HaltView:
    """A Halt (``namespace`` set) or ClusterHalt (``namespace`` None) in force."""

    kind: str
    name: str
    namespace: str | None
    reason: str
    scope: HaltScope | ClusterHaltScope | None


def steps_changed(old: RunSpec, new: RunSpec) -> bool:
    """Whether the journal changed at all (a step added, or an outcome or result set)."""
    if len(old.steps) != len(new.steps):
        return True
    return any(a != b for a, b in zip(old.steps, new.steps, strict=True))


def matching_halt(halts: Iterable[HaltView], *, namespace: str, tool: str,
                  scope: dict[str, str | None]) -> HaltView | None:
    """The first halt that refuses a call of ``tool`` in a run with ``scope`` in ``namespace``
    (rule 9): every field a halt's scope names must match; no scope matches everything."""
    call = {"tool": tool, "actor": scope.get("actor"), "tenant": scope.get("tenant"),
            "environment": scope.get("environment")}
    for halt in halts:
        if halt.namespace is not None and halt.namespace != namespace:
            continue
        if halt.scope is None:
            return halt
        fields = dict(call)
        if halt.namespace is None:
            fields["namespace"] = namespace
        if halt.scope.matches(**fields):
            return halt
    return None


def check_halts(halts: list[HaltView], namespace: str, spec: RunSpec, steps: list[Step],
                ancestors: Sequence[tuple[str, dict[str, str | None]]] = ()) -> Refusal | None:
    """Refuse recording any of ``steps`` that a halt matches: ``kill switch: <reason>``. A step of a
    child run (nested runs, rule 17) is matched with its own run's scope and with the scope
    of each of its ancestors (``ancestors``: ``[(run name, its spec.scope), ...]`` from the parent
    up): a halt on the parent's actor, tenant or environment stops its children's calls too."""
    scopes: list[tuple[str | None, dict[str, str | None]]] = [(None, spec.scope.model_dump())]
    scopes += [(name, scope) for name, scope in ancestors]
    for step in steps:
        for via, scope in scopes:
            halt = matching_halt(halts, namespace=namespace, tool=step.tool, scope=scope)
            if halt is None:
                continue
            where = f"{halt.kind} {halt.namespace}/{halt.name}" if halt.namespace else f"{halt.kind} {halt.name}"
            through = f", by the scope of ancestor Run {via}" if via else ""
            return Refusal(HALTED, f"kill switch: {halt.reason} ({where} refuses step {step.index}, {step.tool}"
                           f"{through}; deleting the halt lifts it)", step.tool, (halt.kind, halt.namespace, halt.name))
    return None


def check_halt_scope(scope: HaltScope | ClusterHaltScope | None) -> Refusal | None:
    """A halt pattern that can never match is refused, naming the field and why
    (:func:`reversi.models.halt.pattern_problem`): a kill switch must not look active while it
    lets every call through."""
    for field, pattern, why in (scope.problems() if scope is not None else []):
        return Refusal(INVALID, f"spec.scope.{field} {pattern!r} can never match: {why}")
    return None


def tools_matched(pattern: str, tools: Iterable[str]) -> list[str]:
    """The tools (of the ToolManifests in a halt's reach) that the halt's ``tool`` glob matches."""
    return sorted({t for t in tools if glob_match(pattern, t)})


def reach_text(namespace: str | None, scope: dict | None) -> str:
    """Where a halt's tools come from: ``in namespace shop``, ``in any namespace``."""
    if namespace:
        return f"in namespace {namespace}"
    glob = (scope or {}).get("namespace")
    return f"in namespaces matching {glob!r}" if glob else "in any namespace"


def tools_in_reach(manifests: Iterable[dict], namespace: str | None, scope: dict | None) -> list[str]:
    """Tool names of the ToolManifests a Halt (``namespace``) or ClusterHalt (None) reaches."""
    glob = None if namespace else (scope or {}).get("namespace")
    names: set[str] = set()
    for m in manifests:
        ns = (m.get("metadata") or {}).get("namespace", "")
        if (namespace and ns != namespace) or (glob and not glob_match(glob, ns)):
            continue
        for tool in (m.get("spec") or {}).get("tools") or []:
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                names.add(tool["name"])
    return sorted(names)


def no_tool_message(pattern: str, reach: str, count: int) -> str:
    """The warning and ``MatchesNoTool`` message of a halt whose ``tool`` glob matches no tool
    (``reach``: ``in namespace shop``, ``in any namespace``; ``count``: the tools there)."""
    which = (f"none of the {count} tools of the ToolManifests {reach}" if count
             else f"no tool: there is no ToolManifest with tools {reach}")
    return (f"scope.tool {pattern!r} matches {which}; check its spelling "
            "(the halt is in force and will refuse such a tool once a manifest names it)")


def check_principal(old: RunSpec, new: RunSpec, user: str, run: str) -> Refusal | None:
    """Only the principal that created a run may change its journal (rule 10). ``run`` names the
    run in the message, e.g. ``Run shop/order-4711``."""
    if old.principal and user != old.principal and (steps_changed(old, new) or old.snapshots != new.snapshots):
        tool = new.steps[-1].tool if new.steps else ""
        return Refusal(FOREIGN_PRINCIPAL, f"{run} belongs to another principal ({old.principal}); "
                       f"{user} may not add or change its steps: open a Run of your own", tool)
    return None


def check_tools(spec: RunSpec, steps: list[Step], manifest: ToolManifestSpec | None,
                manifest_name: str) -> Refusal | None:
    """In enforce mode every new step's tool needs a manifest entry (the Run's ``mode``)."""
    if spec.mode != "enforce":
        return None
    for step in steps:
        if manifest is None:
            return Refusal(UNKNOWN_TOOL, f"ToolManifest {manifest_name} not found: in enforce mode every call needs "
                           "its tool's manifest entry; create the manifest or fix spec.manifestRef", step.tool)
        if manifest.tool(step.tool) is None:
            return Refusal(UNKNOWN_TOOL, f"tool {step.tool!r} (step {step.index}) has no entry in ToolManifest "
                           f"{manifest_name}: add it, or record this run in observe mode", step.tool)
    return None


def check_duplicates(spec: RunSpec, steps: list[Step], compensated: set[int],
                     manifest: ToolManifestSpec | None) -> Refusal | None:
    """Refuse a new step whose forward idempotency key matches an earlier standing step of the
    same tool in the same run (the forward idempotency key, docs/concepts.md#vocabulary)."""
    by_key: dict[tuple[str, str], int] = {}
    new_indices = {s.index for s in steps}
    for step in spec.steps:
        entry = _entry(spec, step, manifest)
        if entry is None or not entry.idempotency_key:
            continue
        try:
            key = forward_key(entry.idempotency_key, step.args, None)
        except MissingValue:
            continue
        standing = step.standing and step.index not in compensated
        if step.index in new_indices:
            earlier = by_key.get((step.tool, key))
            if earlier is not None:
                return Refusal(DUPLICATE, f"duplicate call: step {step.index} ({step.tool}) has idempotency key "
                               f"{key!r}, like step {earlier}, which still stands; the first call must be undone "
                               "(or fail) before it is repeated", step.tool)
        if standing:
            by_key.setdefault((step.tool, key), step.index)
    return None


def check_resolutions(old: RunSpec | None, new: RunSpec) -> Refusal | None:
    """A new resolution must name an existing step whose outcome is intended or uncertain (rule 7)."""
    known = {r.step for r in old.resolutions} if old else set()
    steps = {s.index: s for s in new.steps}
    for res in new.resolutions:
        if res.step in known:
            continue
        step = steps.get(res.step)
        if step is None:
            return Refusal(INVALID, f"resolution of step {res.step}: the run has no such step")
        if step.outcome not in UNKNOWN_OUTCOMES:
            return Refusal(INVALID, f"resolution of step {res.step}: its outcome is {step.outcome}; only intended "
                           "or uncertain steps can be resolved")
        if not res.note.strip():
            return Refusal(INVALID, f"resolution of step {res.step}: a note is required (say how you know)")
    return None


def new_approvals(old: dict | None, new: dict) -> tuple[list[int], bool]:
    """What a RollbackRequest write approves: new per-step approvals, and whether
    ``approveCompensations`` is newly set (rule 8). ``old``/``new`` are specs (wire dicts)."""
    before = {a.get("step") for a in (old or {}).get("approvals") or [] if isinstance(a, dict)}
    steps = [a.get("step") for a in new.get("approvals") or [] if isinstance(a, dict) and a.get("step") not in before]
    all_now = bool(new.get("approveCompensations")) and not bool((old or {}).get("approveCompensations"))
    return [s for s in steps if isinstance(s, int)], all_now


def new_denials(old: dict | None, new: dict) -> list[int]:
    """Steps a RollbackRequest write newly denies (``spec.denials``; wire dicts)."""
    before = {d.get("step") for d in (old or {}).get("denials") or [] if isinstance(d, dict)}
    return [d["step"] for d in new.get("denials") or []
            if isinstance(d, dict) and isinstance(d.get("step"), int) and d.get("step") not in before]


def new_forces(old: dict | None, new: dict) -> list[int]:
    """Steps a RollbackRequest write newly forces (``spec.force``; wire dicts): each needs the
    RBAC verb ``force`` on rollbackrequests (rule 16)."""
    before = {f.get("step") for f in (old or {}).get("force") or [] if isinstance(f, dict)}
    return [f["step"] for f in new.get("force") or []
            if isinstance(f, dict) and isinstance(f.get("step"), int) and f.get("step") not in before]


def check_templates(manifest: ToolManifestSpec) -> Refusal | None:
    """Every ``$``-string in a manifest's templates is a valid reference: a typo such as
    ``$reslt.id`` would otherwise reach a compensator as a literal string."""
    for tool in manifest.tools:
        places: list[tuple[str, Any]] = [("idempotencyKey", tool.idempotency_key)]
        if tool.compensation is not None:
            places.append(("compensation.args", tool.compensation.args))
        if tool.verification is not None:
            places.append(("verification.args", tool.verification.args))
        for where, template in places:
            for text in _strings(template):
                problem = template_problem(text)
                if problem:
                    return Refusal(INVALID, f"tool {tool.name}: {where}: {problem}")
    return None


def check_guards(manifest: ToolManifestSpec) -> Refusal | None:
    """A ``compensation.precheck`` skips the compensator when the verification's answer contains
    its ``expect`` (rule 16): an empty ``expect`` is contained in every answer, so every step would
    be ``alreadyRecovered`` and never undone. Refused at admission only (a snapshot recorded
    earlier still reads)."""
    for tool in manifest.tools:
        comp, check = tool.compensation, tool.verification
        if comp is not None and comp.precheck and check is not None and check.expect == {}:
            return Refusal(INVALID, f"tool {tool.name}: compensation.precheck with verification.expect {{}}: every "
                           "answer contains an empty expect, so every step would be alreadyRecovered and never "
                           "undone; give expect the fields an undone call shows (e.g. {refunded: true}) or drop "
                           "precheck")
    return None


def template_problem(text: str) -> str | None:
    """Why ``text`` (a string starting with ``$``) is not a valid reference, or None."""
    if not _LOOKS_LIKE_REFERENCE.match(text):
        return None  # e.g. "$5 fee": literal
    root, dot, rest = text[1:].partition(".")
    if root not in ("args", "result"):
        return f"{text!r} looks like a reference but names no root: use $args.<path> or $result.<path>"
    if dot and (not rest or "" in rest.split(".")):
        return (f"{text!r} has an empty path segment: name a field after each dot, as in ${root}.id "
                f"(or write ${root} for the whole value)")
    return None


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def check_approvals(spec: RunSpec, steps: list[int]) -> Refusal | None:
    """Approvals must name steps of the run whose compensation asks for approval (rule 8)."""
    return _check_named_steps(spec, steps, "approval", lambda comp: comp.requires_approval,
                              "its compensation does not require approval")


def check_forces(spec: RunSpec, steps: list[int]) -> Refusal | None:
    """Forces must name steps of the run whose compensation has a precondition (rule 16: forcing
    is checked like approvals); anything else would be admitted and do nothing."""
    return _check_named_steps(spec, steps, "force", lambda comp: comp.precondition is not None,
                              "its compensation has no precondition, so there is nothing to force (spec.force "
                              "undoes a step whose precondition does not hold)")


def _check_named_steps(spec: RunSpec, steps: list[int], what: str, applies: Callable[[Any], bool],
                       otherwise: str) -> Refusal | None:
    """The first of ``steps`` that the run lacks, or whose compensation ``applies`` is false for,
    as a :class:`Refusal` naming it (``<what> of step N: ...``); ``None`` when all are fine."""
    by_index = {s.index: s for s in spec.steps}
    for index in steps:
        step = by_index.get(index)
        if step is None:
            return Refusal(INVALID, f"{what} of step {index}: the run has no such step")
        entry = spec.snapshot_of(step)
        if entry is None or entry.compensation is None or not applies(entry.compensation):
            return Refusal(INVALID, f"{what} of step {index}: {otherwise}")
    return None


def _entry(spec: RunSpec, step: Step, manifest: ToolManifestSpec | None) -> ToolSpec | None:
    entry = spec.snapshot_of(step)
    if entry is None and manifest is not None:
        entry = manifest.tool(step.tool)
    return entry


# ------------------------------------------------------------------------- the sliced journal

def check_call_size(step: Any, limit: int) -> Refusal | None:
    """A step's ``args`` and ``result`` are at most ``limit`` bytes of JSON each (the documented
    limit, ``MAX_CALL_BYTES``), refused by name before the API server or etcd would."""
    for field in ("args", "result"):
        value = getattr(step, field, None)
        if value is None:
            continue
        size = len(canonical_json(value).encode("utf-8"))
        if size > limit:
            return Refusal(INVALID, f"step {step.index} ({step.tool}): {field} is {size} bytes of JSON, more than "
                           f"the limit of {limit} bytes per step; record a reference (an id, a URL) instead of "
                           "the whole payload", step.tool)
    return None


def check_step_principal(principal: str | None, user: str, run: str, tool: str = "") -> Refusal | None:
    """Only the principal that created a run may record or change its calls (rule 10). ``run``
    names the run in the message, e.g. ``Run shop/order-4711``."""
    if principal and user != principal:
        return Refusal(FOREIGN_PRINCIPAL, f"{run} belongs to another principal ({principal}); {user} may not add "
                       "or change its steps: open a Run of your own", tool)
    return None


def standing_after(outcome: str, resolution: Any | None, undo_state: str | None) -> bool:
    """Whether a recorded call still stands for the forward-duplicate rule: its effective outcome
    (the resolution's, when settled) is not ``failed`` and it has not been compensated."""
    effective = resolution.status if resolution is not None else outcome
    return effective != "failed" and undo_state != "compensated"


def check_forward_duplicate(step: Step, key: str,
                            earlier: Iterable[tuple[int, str, str, Any, str | None]]) -> Refusal | None:
    """Refuse ``step`` when an earlier call of the same tool with the same forward idempotency
    ``key`` still stands. ``earlier``: ``(index, tool, outcome, resolution,
    undo state)`` of the run's steps that carry the same key label (the label is a hash: the
    tool is compared again here)."""
    for index, tool, outcome, resolution, undo_state in sorted(earlier, key=lambda e: e[0]):
        if index >= step.index or tool != step.tool:
            continue
        if standing_after(outcome, resolution, undo_state):
            return Refusal(DUPLICATE, f"duplicate call: step {step.index} ({step.tool}) has idempotency key {key!r}, "
                           f"like step {index}, which still stands; the first call must be undone (or fail) before "
                           "it is repeated", step.tool)
    return None


def check_run_open(active_request: str | None, closed_by: str | None, run: str, tool: str = "") -> Refusal | None:
    """A Run is closed to new steps from the moment a rollback takes its lock, and stays closed
    after it ends (rule 11, a rollback closes the run): ``active_request`` and ``closed_by`` are the
    Run's ``status.activeRequest`` and ``status.closedBy``. Resolutions and approvals are not
    steps and are not refused here."""
    if active_request:
        return Refusal(RUN_CLOSED, f"{run}: run is being rolled back by RollbackRequest {active_request}; it takes "
                       "no new steps: record further calls in a new Run", tool)
    if closed_by:
        return Refusal(RUN_CLOSED, f"{run}: run was rolled back by RollbackRequest {closed_by}; it takes no new "
                       "steps: record further calls in a new Run", tool)
    return None


def check_recovery(spec: RunSpec, steps: list[Step], manifest: ToolManifestSpec | None) -> Refusal | None:
    """In a run with ``recovery: required``, refuse a new step whose tool cannot be undone: its
    manifest entry is irreversible, a write with no compensation, or missing (rule 12, strict runs),
    so the call is never made."""
    if spec.recovery != "required":
        return None
    for step in steps:
        entry = _entry(spec, step, manifest)
        if entry is None or entry.effect == "irreversible" or (entry.effect == "write" and entry.compensation is None):
            why = "it has no manifest entry" if entry is None else f"its manifest entry is {entry.effect}"
            return Refusal(RECOVERY_REQUIRED, f"recovery required: {step.tool} cannot be undone ({why}; step "
                           f"{step.index}): this run refuses calls it could not undo; make the call in a run with "
                           "recovery: bestEffort, or give the tool a compensation", step.tool)
    return None
