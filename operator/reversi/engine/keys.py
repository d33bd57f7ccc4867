"""Idempotency keys (docs/concepts.md#vocabulary).

- Compensation key: derived from run, step and compensation tool; the same on every retry and
  re-run, so a downstream API that honours idempotency keys never applies one undo twice.
- Forward key: the manifest's ``idempotencyKey`` template resolved against a call, as a canonical
  string; the admission webhook refuses a second call with the same (tool, key) while the first
  stands.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .templates import resolve

COMPENSATION_KEY_VERSION = "reversi.compensation.v1"


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> str:
    """Canonical JSON text of ``value``: sorted keys, no spaces, UTF-8 kept (not escaped).
    Raises ``TypeError`` for a value JSON cannot hold and ``ValueError`` for NaN or infinity."""
    return _CANONICAL.encode(value)


def compensation_key(run_id: str, step: int, compensation_tool: str) -> str:
    """The compensation idempotency key: 64 lowercase hex characters.

    sha256 over the canonical JSON array ``["reversi.compensation.v1", run_id, step, tool]``
    (a versioned, unambiguous encoding: no two different inputs share bytes).
    ``run_id`` should identify the run for good: use the Run's ``metadata.uid`` (a Run deleted and
    recreated under the same name is a different run and must not share keys).
    Raises ``ValueError`` for an empty ``run_id`` or tool, or a negative step.
    """
    if not run_id:
        raise ValueError("compensation_key needs a run id (the Run's metadata.uid)")
    if not compensation_tool:
        raise ValueError("compensation_key needs the compensation tool")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"compensation_key needs a step index >= 0, not {step!r}")
    payload = canonical_json([COMPENSATION_KEY_VERSION, run_id, step, compensation_tool])
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def forward_key(template: Any, args: dict[str, Any] | None, result: dict[str, Any] | None = None) -> str:
    """The forward idempotency key of a call: ``template`` resolved, stringified canonically.

    A resolved string is used as is (``"$args.order_id"`` -> ``"o-4711"``); any other JSON value
    becomes its canonical JSON text (``700`` -> ``"700"``, ``{"b":1,"a":2}`` -> ``'{"a":2,"b":1}'``).
    Raises ``templates.MissingValue`` when the template names a value the call does not have.
    """
    value = resolve(template, args, result)
    if isinstance(value, str):
        return value
    return canonical_json(value)


def snapshot_id(entry: Any) -> str:
    """Id of a manifest entry copied into ``Run.spec.snapshots``: 16 lowercase hex characters.

    sha256 over ``["reversi.snapshot.v1", <canonical JSON of the entry>]`` (the entry's wire
    form without any ``id``), so equal entries share one snapshot and a changed entry gets a new
    one. ``entry`` is a ``ToolSpec`` (or ``ToolSnapshot``) or its wire dict.
    """
    wire = entry.to_wire() if hasattr(entry, "to_wire") else dict(entry)
    wire.pop("id", None)
    payload = canonical_json(["reversi.snapshot.v1", wire])
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]
