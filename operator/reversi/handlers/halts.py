"""Halt and ClusterHalt status: active, since when, and whether the tool pattern matches any tool
(refused calls are counted by the webhook).

A halt is in force from the moment it exists — the webhook reads halts from the API on every
write, so every replica sees the same halts; this handler only reports it:

- ``Active``: True (``HaltInEffect``), or False (``InvalidPattern``) for a halt stored with a
  pattern that can never match (admission refuses those; one may predate the rule);
- ``MatchesNoTool`` (only for a halt with ``scope.tool``): True (``NoToolInReach``) when the
  pattern matches no tool of any ToolManifest in the halt's reach, else False (``ToolsInReach``).
  A ToolManifest change re-checks the halts that reach it;
- ``Ready`` / ``Reconciling`` / ``Stalled`` (kstatus): Ready while in force; Stalled
  (``InvalidPattern``) for a halt that refuses nothing.

Lifting a halt is deleting it.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from .. import conditions as cond
from ..adapters import apicalls as calls
from ..adapters import halt_probe
from ..adapters import status as st
from ..engine import admission as rules
from ..engine.admission import reach_text, tools_in_reach
from ..adapters.kube import Kube
from ..models.halt import ClusterHaltScope, HaltScope, glob_match
from . import runtime

G, V = "reversi.dev", "v1alpha1"
log = logging.getLogger("reversi.halts")


def halt_conditions(spec: Any, namespace: str | None, tools: list[str] | None, old: list[dict],
                    generation: int | None) -> list[dict]:
    """The halt's conditions (pure): ``Active`` and, with ``scope.tool``, ``MatchesNoTool``.
    ``tools``: the tool names in reach, None when they could not be read (the condition is left
    as it was)."""
    spec = spec if isinstance(spec, dict) else {}
    scope = spec.get("scope") if isinstance(spec.get("scope"), dict) else None
    model = ClusterHaltScope if namespace is None else HaltScope
    try:
        parsed = model.model_validate(scope) if scope is not None else None
    except ValidationError:
        parsed = None
    problems = parsed.problems() if parsed is not None else []
    if problems:
        field, bad, why = problems[0]
        active = cond.condition(cond.ACTIVE, cond.FALSE, cond.INVALID_PATTERN,
                             f"scope.{field} {bad!r} can never match, so this halt refuses nothing: {why}",
                             generation)
    else:
        active = cond.condition(cond.ACTIVE, cond.TRUE, cond.HALT_IN_EFFECT,
                             f"refusing matching calls: kill switch: {spec.get('reason', '')}", generation)
    conds = cond.set_condition(old, active)
    pattern = (scope or {}).get("tool")
    if not isinstance(pattern, str) or problems:
        return [x for x in conds if x.get("type") != cond.MATCHES_NO_TOOL]
    if tools is None:
        return conds
    matched = rules.tools_matched(pattern, tools)
    if matched:
        shown = ", ".join(matched[:5]) + (f" and {len(matched) - 5} more" if len(matched) > 5 else "")
        reach = cond.condition(cond.MATCHES_NO_TOOL, cond.FALSE, cond.TOOLS_IN_REACH,
                               f"scope.tool {pattern!r} matches {shown}",
                           generation)
    else:
        reach = cond.condition(cond.MATCHES_NO_TOOL, cond.TRUE, cond.NO_TOOL_IN_REACH,
                           rules.no_tool_message(pattern, reach_text(namespace, scope), len(tools)), generation)
    return cond.set_condition(conds, reach)


def _tools(kube: Kube, namespace: str | None, scope: dict | None) -> list[str] | None:
    try:
        return tools_in_reach(kube.list("toolmanifests", namespace, cached=True), namespace, scope)
    except ApiException as err:  # e.g. a ClusterHalt while the operator watches some namespaces only
        log.info("cannot list ToolManifests %s: %s", reach_text(namespace, scope), err.reason)
        return None


def halt_status(body: Any, namespace: str | None = None, tools: list[str] | None = None, *,
                recheck: bool = False, in_force: tuple[str, str, str] | None = None) -> dict | None:
    """The status a Halt (``namespace`` set) or ClusterHalt should have, or ``None`` when it
    already has it (pure): ``active`` and ``since``, ``Active`` and ``MatchesNoTool``
    (:func:`halt_conditions`; ``tools`` in reach, None when unknown), ``Ready``/``Reconciling``/
    ``Stalled`` and ``observedGeneration``. ``recheck``: the tools in reach may have changed.
    ``in_force``: ``(status, reason, message)`` of the ``InForce`` condition, from a probe of the
    API server (None: left as it is)."""
    status = body.get("status") or {}
    meta = body["metadata"]
    gen = meta.get("generation")
    spec = body.get("spec") or {}
    old = status.get("conditions") or []
    conds = halt_conditions(spec, namespace, tools, old, gen)
    if in_force is not None:
        conds = cond.set_condition(conds, cond.condition(cond.IN_FORCE, *in_force, gen))
    active_cond = cond.get_condition(conds, cond.ACTIVE) or {}
    active = cond.is_true(conds, cond.ACTIVE)
    state = st.READY_STATE if active else st.STALLED_STATE
    reason, message = active_cond.get("reason", cond.HALT_IN_EFFECT), active_cond.get("message", "")
    if active and cond.is_true(conds, cond.MATCHES_NO_TOOL):
        # in force, yet it refuses no call a manifest names: a person meant something else (GitOps
        # tools show kstatus and health, never the warning given when it was applied)
        no_tool = cond.get_condition(conds, cond.MATCHES_NO_TOOL) or {}
        state, reason = st.STALLED_STATE, cond.NO_TOOL_IN_REACH
        message = f"in force, but {no_tool.get('message', 'scope.tool matches no tool')}"
    conds = st.summary_conditions(conds, gen, st.readiness(state, reason, message))
    if status.get("observedGeneration") == gen and status.get("active") is active and st.same_conditions(conds, old):
        return None
    return {"active": active, "since": (status.get("since") or meta.get("creationTimestamp")) if active else None,
            "observedGeneration": gen, "conditions": conds}


def _report(parts: runtime.Parts, body: Any, plural: str, namespace: str | None, name: str, *,
            recheck: bool = False) -> None:
    if not parts.reconciling():
        return
    status = body.get("status") or {}
    meta = body["metadata"]
    spec = body.get("spec") or {}
    has_tool = isinstance((spec.get("scope") or {}).get("tool"), str)
    conds = status.get("conditions")
    probed = cond.get_condition(conds, cond.IN_FORCE) or {}
    if not recheck and status.get("observedGeneration") == meta.get("generation") and \
            cond.get_condition(conds, cond.READY) and (not has_tool or cond.get_condition(conds, cond.MATCHES_NO_TOOL)
                                                      or not cond.is_true(conds, cond.ACTIVE)) and \
            (probed.get("status") in (cond.TRUE, cond.UNKNOWN) or not cond.is_true(conds, cond.ACTIVE)):
        return  # reported for this generation (a halt of an older operator gets its conditions now)
    kube = parts.kube
    force = None
    if not recheck and not (probed.get("status") == cond.TRUE and probed.get("observedGeneration") == meta.get(
            "generation")):
        force = _probe(kube, body, namespace, name)
    update = halt_status(body, namespace, _tools(kube, namespace, spec.get("scope")) if has_tool else [],
                         recheck=recheck, in_force=force)
    if update is None:
        return
    patch = {"status": update}
    try:
        calls.patch(kube.custom, plural, name, patch, namespace or None, status=True, timeout=kube.timeout)
    except ApiException as err:
        if err.status != 404:  # lifted (deleted) meanwhile: nothing to report
            raise


#: the namespace a ClusterHalt is probed in (when its namespace glob matches it)
CLUSTER_PROBE_NAMESPACE = "default"


def _probe(kube: Kube, body: Any, namespace: str | None, name: str) -> tuple[str, str, str]:
    """The ``InForce`` condition of a halt: a dry run of a call it matches, refused by the API
    server's halts policy naming this halt (:mod:`reversi.adapters.halt_probe`)."""
    scope = (body.get("spec") or {}).get("scope")
    scope = scope if isinstance(scope, dict) else {}
    where = f"Halt {namespace}/{name}" if namespace else f"ClusterHalt {name}"
    probe_ns = namespace or CLUSTER_PROBE_NAMESPACE
    pattern = scope.get("namespace")
    if namespace is None and isinstance(pattern, str) and not glob_match(pattern, probe_ns):
        return (cond.UNKNOWN, cond.NOT_PROBED, f"not probed: scope.namespace {pattern!r} does not match namespace "
                f"{probe_ns}, where the operator probes ClusterHalts; it is in force all the same")
    try:
        refused = halt_probe.in_force(kube.custom, probe_ns, scope, where)
    except ApiException as err:
        return (cond.UNKNOWN, cond.NOT_PROBED, f"not probed: the API server answered {err.status} ({err.reason})")
    if refused:
        return (cond.TRUE, cond.REFUSED_BY_API_SERVER, "the API server refuses the calls it matches (a dry run of one "
                "was refused), with no operator or admission server needed")
    return (cond.FALSE, cond.NOT_YET_REFUSED, "a dry run of a call it matches was still admitted 2 s after the halt "
            "was stored: is the halts admission policy installed (webhook.enabled)?")


def recheck_reach(parts: runtime.Parts, namespace: str) -> None:
    """A ToolManifest in ``namespace`` changed: re-check ``MatchesNoTool`` of the halts that reach it."""
    kube = parts.kube
    for obj in kube.list("halts", namespace, cached=True):
        if ((obj.get("spec") or {}).get("scope") or {}).get("tool"):
            _report(parts, obj, "halts", namespace, obj["metadata"]["name"], recheck=True)
    try:
        cluster_halts = kube.list("clusterhalts", cached=True)
    except ApiException:
        return
    for obj in cluster_halts:
        if ((obj.get("spec") or {}).get("scope") or {}).get("tool"):
            _report(parts, obj, "clusterhalts", None, obj["metadata"]["name"], recheck=True)


def halt_changed(parts: runtime.Parts, type: str, body: Any, namespace: str | None, name: str) -> None:
    """A Halt was added, changed or deleted (``type``: the watch event), or is taken up again."""
    if type != "DELETED":
        _report(parts, body, "halts", namespace, name)
    _refresh_gauges(parts)


def cluster_halt_changed(parts: runtime.Parts, type: str, body: Any, name: str) -> None:
    """A ClusterHalt was added, changed or deleted, or is taken up again."""
    if type != "DELETED":
        _report(parts, body, "clusterhalts", None, name)
    _refresh_gauges(parts)


@kopf.on.event(G, V, "halts")
def halt_event(type: str, body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    halt_changed(runtime.parts(memo), type, body, namespace, name)


@kopf.on.event(G, V, "clusterhalts")
def cluster_halt_event(type: str, body: kopf.Body, name: str, memo: kopf.Memo, **_: Any) -> None:
    cluster_halt_changed(runtime.parts(memo), type, body, name)


def _refresh_gauges(parts: runtime.Parts) -> None:
    if parts.metrics:
        parts.metrics.refresh_halts(parts.kube)
