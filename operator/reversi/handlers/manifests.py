"""ToolManifest status: ``Accepted`` says whether the operator can use the manifest as it is.

The admission webhook refuses a bad manifest before it is stored; this condition covers one that
got in another way (webhooks off, or written before a rule existed) and shows up in the
``Accepted`` printer column.
"""

from __future__ import annotations

from typing import Any

import kopf
from pydantic import ValidationError

from .. import conditions as c
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


@kopf.on.event(G, V, "toolmanifests")
def tool_manifest_event(type: str, body: Any, namespace: str, name: str, **_: Any) -> None:
    if type == "DELETED":
        halts.recheck_reach(namespace)  # a halt may now match no tool (MatchesNoTool)
        return
    gen = body["metadata"].get("generation")
    status = body.get("status") or {}
    if status.get("observedGeneration") == gen:
        return
    halts.recheck_reach(namespace)  # its tools changed: halts that matched none may match one now
    ok, message = acceptance(body.get("spec"))
    cond = c.condition(c.ACCEPTED, c.TRUE if ok else c.FALSE, c.MANIFEST_VALID if ok else c.MANIFEST_INVALID,
                       message, gen)
    runtime.state().kube.merge_status("toolmanifests", namespace, name, {
        "observedGeneration": gen, "conditions": c.set_condition(status.get("conditions") or [], cond)})
