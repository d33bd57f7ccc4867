"""What stands: the undos a run's rollbacks left failed or unverified (docs/concepts.md#what-stands).

The journal (each step's undo entry, rule 3) is the durable truth of each step's undo; the Run's
``status.standing`` is its bounded summary, the one place the metrics, the Run's conditions and
``kubectl reversi describe`` read what stands. This module computes it, pure (no client, no kopf):

- a step **stands failed** when its undo entry says ``compensationFailed`` (the compensator kept
  failing, or its read-back found the effect standing, failed or could not be made), and
  **stands unverified** when it says ``compensated`` with verification ``unverified`` (undone,
  not checked); a step the ending request found undone (its report's ``compensated`` or
  ``alreadyRecovered``) stands no more, whatever an older entry says;
- only a rollback that held the run changes what stands, when it ends (:func:`after_rollback`):
  a step stops standing when a rollback undoes it (and checks it), or finds it already undone;
  it starts standing when a rollback's compensation of it fails or goes unchecked;
- a request that **undid nothing** (wrote no undo entry: cancelled before it acted, every step
  denied, stopped by its deadline, deleted, or failed before it started) leaves what stands, the
  run's ``RolledBack`` condition and the request an acknowledgement names as they were. Two
  exceptions, both verdicts on the whole run: a report that is complete says nothing stands
  (e.g. resolutions left nothing to undo), and the first rollback of a run that ran to its end
  (not stopped) gives the run its first verdict (e.g. an irreversible step);
- ``request`` names the rollback whose residue stands: the last one that left a step standing
  that was not before (or gave the first verdict). An acknowledgement that names it covers what
  stands (:mod:`reversi.engine.acknowledgement`); a later rollback that leaves a new step
  standing is not covered, one that only undid more, or undid nothing, is.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..models.run import MAX_STANDING_STEPS, MAX_STANDING_TOOLS, OTHER_TOOLS, StepUndo

FAILED = "failed"
UNVERIFIED = "unverified"
STATES = (FAILED, UNVERIFIED)


@dataclass(frozen=True)
class StandingUndo:
    """One step whose undo stands ``failed`` or ``unverified``; ``request``: the RollbackRequest
    that last wrote its undo entry (its compensation, or a read-back of it)."""

    step: int
    tool: str
    state: str
    request: str | None


def state_of(undo: StepUndo | None) -> str | None:
    """``failed``, ``unverified`` or None (nothing stands: undone and checked, no read-back
    declared, under way, or never tried) for one undo entry."""
    if undo is None:
        return None
    if undo.state == "compensationFailed":
        return FAILED
    if undo.state == "compensated" and undo.verification == "unverified":
        return UNVERIFIED
    return None


def writer(undo: StepUndo) -> str | None:
    """The RollbackRequest that last wrote ``undo``: the one that read an earlier undo back
    (``verifiedBy``), else the one whose compensation it records."""
    return undo.verified_by or undo.request


def standing_undos(undo: Mapping[int, StepUndo], tools: Mapping[int, str],
                   undone: Collection[int] = ()) -> list[StandingUndo]:
    """The steps of a journal (``undo`` by step index; ``tools`` by step index) whose undo stands,
    in index order, leaving out ``undone``: steps the ending request found undone. O(n log n)."""
    out = []
    for step in sorted(undo):
        state = state_of(undo[step])
        if state is not None and step not in undone:
            out.append(StandingUndo(step, tools.get(step) or "", state, writer(undo[step])))
    return out


def summary(steps: Iterable[StandingUndo], request: str | None) -> dict[str, Any]:
    """``status.standing`` (wire, without ``acknowledgedBy`` and ``updatedAt``) of ``steps``:
    the counts, the steps by ``(tool, state)`` (at most ``MAX_STANDING_TOOLS`` pairs, most steps
    first, the rest summed per state under ``OTHER_TOOLS``) and the first ``MAX_STANDING_STEPS``
    steps (failed first, then unverified, by index)."""
    steps = list(steps)
    counts: dict[tuple[str, str], int] = {}
    for s in steps:
        counts[(s.tool, s.state)] = counts.get((s.tool, s.state), 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    tools = [{"tool": t, "state": st, "steps": n} for (t, st), n in ranked[:MAX_STANDING_TOOLS]]
    for state in STATES:
        more = sum(n for (_, st), n in ranked[MAX_STANDING_TOOLS:] if st == state)
        if more:
            tools.append({"tool": OTHER_TOOLS, "state": state, "steps": more})
    listed = sorted(steps, key=lambda s: (STATES.index(s.state), s.step))[:MAX_STANDING_STEPS]
    return {"request": request,
            "failed": sum(1 for s in steps if s.state == FAILED),
            "unverified": sum(1 for s in steps if s.state == UNVERIFIED),
            "tools": tools,
            "steps": [{k: v for k, v in {"step": s.step, "tool": s.tool, "state": s.state,
                                         "request": s.request}.items() if v is not None} for s in listed]}


def by_tool(standing: Mapping[str, Any] | None) -> dict[tuple[str, str], int]:
    """``{(tool, state): steps}`` of a Run's ``status.standing`` (wire), what
    ``reversi_standing_undos`` exports for it; empty for None or a malformed value."""
    out: dict[tuple[str, str], int] = {}
    if not isinstance(standing, Mapping):
        return out
    for item in standing.get("tools") or []:
        if not isinstance(item, Mapping) or item.get("state") not in STATES:
            continue
        steps = item.get("steps")
        if isinstance(steps, int) and steps > 0:
            key = (str(item.get("tool") or ""), str(item["state"]))
            out[key] = out.get(key, 0) + steps
    return out


@dataclass(frozen=True)
class Ending:
    """A rollback that held the run, as it ends: ``request`` its name; ``writers`` the requests
    whose undo entries are its own (the request; for a run below the root of a tree, also the
    child request that worked on it); ``complete`` its report's verdict for this run; ``stopped``
    when it did not run to its end (cancelled, deleted, failed); ``undone`` the steps its report
    found undone (compensated, alreadyRecovered)."""

    request: str
    writers: frozenset[str]
    complete: bool
    stopped: bool = False
    undone: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Settled:
    """What an ending rollback makes of the run: ``rolled_back`` the new status of its
    ``RolledBack`` condition (None: left as it is), ``standing`` its new ``status.standing``
    (wire, without ``acknowledgedBy`` and ``updatedAt``; None: none yet), ``acted`` whether the
    rollback changed the journal, ``new`` the steps it left standing that were not before."""

    rolled_back: Literal["True", "False"] | None
    standing: dict[str, Any] | None
    acted: bool
    new: tuple[int, ...]


def after_rollback(rolled_back: str | None, previous: Mapping[str, Any] | None, undo: Mapping[int, StepUndo],
                   tools: Mapping[int, str], ending: Ending) -> Settled:
    """What stands once ``ending`` ends, given the run's ``RolledBack`` status before
    (``"True"``, ``"False"`` or None: never rolled back), its ``status.standing`` before
    (``previous``, wire) and its journal now (``undo`` by step, ``tools`` by step). The rules
    are the module's. Pure, O(n log n) in the steps."""
    steps = standing_undos(undo, tools, ending.undone)
    new = tuple(s.step for s in steps if s.request in ending.writers)
    acted = any(writer(u) in ending.writers for u in undo.values()) or any(
        state_of(undo.get(s)) is not None for s in ending.undone)
    before = previous.get("request") if isinstance(previous, Mapping) else None
    if ending.complete:
        return Settled("True", summary([], ending.request), acted, ())
    if acted:
        leaves = ending.request if new or rolled_back != "False" or not before else before
        return Settled("False", summary(steps, leaves), acted, new)
    if rolled_back is None and not ending.stopped:  # the run's first verdict
        return Settled("False", summary(steps, ending.request), acted, new)
    if rolled_back is None:
        return Settled(None, None, acted, ())  # stopped before it acted: still never rolled back
    return Settled(None, summary(steps, before or ending.request), acted, ())  # undid nothing: as it was


def text(standing: Mapping[str, Any] | None) -> str:
    """``1 failed and 2 unverified undo(s) stand`` (or ``no failed or unverified undo stands``) of
    a ``status.standing`` (wire)."""
    failed, unverified = (standing or {}).get("failed") or 0, (standing or {}).get("unverified") or 0
    if not failed and not unverified:
        return "no failed or unverified undo stands"
    parts = [f"{failed} failed" if failed else "", f"{unverified} unverified" if unverified else ""]
    return " and ".join(p for p in parts if p) + " undo(s) stand"


def same(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Whether two ``status.standing`` values say the same (``updatedAt`` and ``acknowledgedBy``
    aside)."""
    def key(x: Mapping[str, Any] | None) -> dict[str, Any]:
        return {k: v for k, v in (x or {}).items() if k not in ("updatedAt", "acknowledgedBy") and v is not None}
    return key(a) == key(b)
