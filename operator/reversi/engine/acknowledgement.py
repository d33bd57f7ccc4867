"""Acknowledging residue: a person accepts what a Run's rollbacks could not undo.

The rule (docs/concepts.md#acknowledging-residue): an acknowledgement names the RollbackRequest
whose residue it accepts (the server stamps the run's ``status.standing.request`` into it: the
rollback that left what stands, :mod:`reversi.engine.standing`). It counts while that request
is still the one whose residue stands and the run is not rolled back in full: a later rollback
that leaves a step standing that was not before is not covered; one that undid nothing, or only
undid more, changes nothing that stands and leaves it in force. While it counts, the Run and that
request read as done for alerts and GitOps health (Ready, not Stalled), and the Run's
``status.standing.acknowledgedBy`` names who accepted it; their conditions ``RolledBack`` and
``Complete`` and the report still say what stands. A Run written before ``status.standing``
existed is judged by its ``status.lastRequest``. The annotation ``reversi.dev/acknowledged`` of
earlier versions still counts, for any rollback, and says so.

Pure functions over the Run as a dict (what the API server returns): no client, no kopf.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import conditions as cond

#: The annotation earlier versions used to acknowledge a Run (value: who and what was done). It
#: is honoured still; anyone who may patch the Run can set it, so ``kubectl reversi acknowledge``
#: (an RBAC verb of its own, actor stamped by the server) replaces it.
LEGACY_ANNOTATION = "reversi.dev/acknowledged"


@dataclass(frozen=True)
class Acknowledged:
    """An acknowledgement that counts: ``note``, ``actor`` and ``at`` (RFC 3339) as stamped,
    ``request`` whose residue it accepts; ``legacy`` when it is the old annotation."""

    note: str
    actor: str | None = None
    at: str | None = None
    request: str | None = None
    legacy: bool = False

    def text(self) -> str:
        """``acknowledged by oncall at 2026-12-01T10:00:00Z: refunded by hand``."""
        if self.legacy:
            return f"acknowledged (annotation {LEGACY_ANNOTATION}): {self.note}"
        who = f" by {self.actor}" if self.actor else ""
        when = f" at {self.at}" if self.at else ""
        return f"acknowledged{who}{when}: {self.note}"


def _condition(run: Mapping[str, Any], kind: str) -> str | None:
    """The status (``"True"``, ``"False"``, ...) of the Run's condition of type ``kind``, or None."""
    for condition in (run.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == kind:
            return condition.get("status")
    return None


def _rolled_back(run: Mapping[str, Any]) -> str | None:
    return _condition(run, "RolledBack")


def incomplete(run: Mapping[str, Any]) -> bool:
    """Whether ``run``'s last rollback left something in place (``RolledBack=False``) and no
    acknowledgement of it counts: what the Run's Stalled condition and the
    ``reversi_incomplete_rollbacks`` gauge both say."""
    return _rolled_back(run) == "False" and acknowledged(run) is None


def residue_request(run: Mapping[str, Any]) -> str | None:
    """The RollbackRequest whose residue stands on ``run``: ``status.standing.request``, or, for a
    Run whose status has no ``standing`` yet (written before it existed), ``status.lastRequest``.
    What the server stamps into a new acknowledgement, and what one must name to count."""
    status = run.get("status") or {}
    standing = status.get("standing")
    if isinstance(standing, Mapping) and standing.get("request"):
        return str(standing["request"])
    return status.get("lastRequest")


def acknowledged(run: Mapping[str, Any]) -> Acknowledged | None:
    """The acknowledgement that counts for what stands on ``run``, or None: its
    ``spec.acknowledgement`` when that names the request whose residue stands
    (:func:`residue_request`) and the run is not rolled back in full (``RolledBack=False``);
    else the legacy annotation when set."""
    if _rolled_back(run) != "False":
        return None
    ack = (run.get("spec") or {}).get("acknowledgement")
    if isinstance(ack, dict) and ack.get("note") and ack.get("request") == residue_request(run):
        return Acknowledged(str(ack["note"]), ack.get("actor"), ack.get("acknowledgedAt"), ack.get("request"))
    legacy = ((run.get("metadata") or {}).get("annotations") or {}).get(LEGACY_ANNOTATION)
    if legacy is not None:
        return Acknowledged(str(legacy), legacy=True)
    return None


def acknowledged_by(ack: Acknowledged | None) -> str | None:
    """What ``status.standing.acknowledgedBy`` says for ``ack`` (the Acknowledged-By column):
    its actor, the legacy annotation's name, or None when no acknowledgement counts."""
    if ack is None:
        return None
    if ack.legacy:
        return f"annotation {LEGACY_ANNOTATION}"
    return ack.actor or "(unknown)"


def stale(run: Mapping[str, Any]) -> Acknowledged | None:
    """The run's ``spec.acknowledgement`` when it is set but does not count (it names an earlier
    rollback's residue, or the run is rolled back in full since): what it covered, never to be
    shown as covering what stands now. None when there is none or it counts."""
    ack = (run.get("spec") or {}).get("acknowledgement")
    if not isinstance(ack, dict) or not ack.get("note"):
        return None
    counted = acknowledged(run)
    if counted is not None and not counted.legacy:
        return None
    return Acknowledged(str(ack["note"]), ack.get("actor"), ack.get("acknowledgedAt"), ack.get("request"))


def changed(old: Any, new: Any) -> bool:
    """Whether a write sets, changes or withdraws ``spec.acknowledgement`` (its note; the stamps
    are the server's)."""
    old_note = old.get("note") if isinstance(old, dict) else None
    new_note = new.get("note") if isinstance(new, dict) else None
    return old_note != new_note


def problem(run: Mapping[str, Any], run_name: str) -> str | None:
    """Why ``run`` (as stored before the write) has nothing to acknowledge now, or None: a
    rollback holds it, or no rollback has left it incomplete."""
    if _condition(run, "Locked") == "True":
        return (f"RollbackRequest {(run.get('status') or {}).get('activeRequest')} is working on Run {run_name}: "
                "acknowledge its residue once it has finished (kubectl reversi describe run/" + run_name + ")")
    if _rolled_back(run) != "False":
        return (f"Run {run_name} has no incomplete rollback to acknowledge: its last rollback undid everything, or "
                "none has run (kubectl reversi describe run/" + run_name + ")")
    return None


def superseded(residue_request: str | None, locked_by: str | None,
               requests: Iterable[tuple[str, str | None, str | None]]) -> list[str]:
    """The requests of a Run to mark Ready, reason ``Superseded``: those that ended ``Incomplete`` and are not
    the one whose residue stands on the Run (``residue_request``, :func:`residue_request`), while no rollback
    holds it (``locked_by`` None). Only the request whose residue stands follows the Run's acknowledgement, so
    only it may stay Stalled (docs/concepts.md#acknowledging-residue). ``requests``: ``(name, phase, Ready
    reason)`` of the requests naming the Run; those already marked are left out. Sorted names."""
    if not residue_request or locked_by:
        return []
    return sorted(name for name, phase, reason in requests
                  if phase == "Incomplete" and name != residue_request and reason != cond.SUPERSEDED)
