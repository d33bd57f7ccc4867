"""ToolManifest status: ``Accepted`` says whether the operator can use the manifest as it is.

The admission webhook refuses a bad manifest before it is stored; this condition covers one that
got in another way (webhooks off, or written before a rule existed) and shows up in the
``Accepted`` printer column.
"""

from __future__ import annotations

from typing import Any

import kopf
from pydantic import ValidationError

from .. import conditions as cond
from ..adapters import status as st
from ..engine import admission as rules
from ..models.toolmanifest import ToolManifestSpec
from . import halts, runtime

G, V = "reversi.dev", "v1alpha1"


def acceptance(spec: Any) -> tuple[bool, str]:
    """Whether a manifest spec is usable, and a message saying why not (pure)."""
    try:
        parsed = ToolManifestSpec.model_validate(spec or {})
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return False, f"spec.{where}: {first.get('msg')}" if where else str(first.get("msg"))
    refusal = rules.check_templates(parsed)
    if refusal is not None:
        return False, refusal.message
    return True, f"{len(parsed.tools)} tools, {len(parsed.runners)} runners"


def manifest_status(body: Any) -> dict | None:
    """The status a ToolManifest should have (``Accepted``; ``Ready`` True when accepted, else
    ``Stalled`` until a person fixes it; observedGeneration current), or ``None`` when it already
    has it (pure)."""
    gen = body["metadata"].get("generation")
    status = body.get("status") or {}
    old = status.get("conditions") or []
    if status.get("observedGeneration") == gen and cond.get_condition(old, cond.READY) is not None:
        return None
    ok, message = acceptance(body.get("spec"))
    reason = cond.MANIFEST_VALID if ok else cond.MANIFEST_INVALID
    conds = st.summary_conditions(old, gen, [
        (cond.ACCEPTED, cond.TRUE if ok else cond.FALSE, reason, message),
        *st.readiness(st.READY_STATE if ok else st.STALLED_STATE, reason,
                      message if ok else f"{message}; fix the manifest")])
    return {"observedGeneration": gen, "conditions": conds}


@kopf.on.event(G, V, "toolmanifests")
def tool_manifest_event(type: str, body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo,
                        **_: Any) -> None:
    assert namespace is not None  # ToolManifests are namespaced
    tool_manifest_changed(runtime.parts(memo), type, body, namespace, name)


def tool_manifest_changed(parts: runtime.Parts, type: str, body: Any, namespace: str, name: str) -> None:
    """Report the manifest's acceptance and readiness; its tools changed or went away, so re-check
    the halts that reach it (one that matched no tool may match one now, or the other way)."""
    if not parts.reconciling():
        return
    if type == "DELETED":
        halts.recheck_reach(parts, namespace)
        return
    status = manifest_status(body)
    if status is not None:
        halts.recheck_reach(parts, namespace)
        parts.kube.merge_status("toolmanifests", namespace, name, status)
