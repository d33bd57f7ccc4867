"""Pure builders for RollbackRequest and Run status (no I/O).

Per-step detail is bounded (docs/concepts.md#the-rollbackrequests-status): ``status.steps`` keeps
the steps that need a person's eye first — active, failed, awaiting approval, deferred — then the
rest, up to a limit; the plan in status lists the non-skip actions up to the same limit and counts
what it left out. The report's buckets are step numbers (small), with error texts cut to a limit.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, cast
from collections.abc import Iterable

from .. import conditions as cond
from ..engine import standing as sd
from ..engine.acknowledgement import Acknowledged, acknowledged as acknowledgement_of, acknowledged_by
from ..engine.executor import ACTIVE_STAGES, Stage, StepRun
from ..engine.plan import compact_plan
from ..models.rollbackrequest import Plan, PlanAction, Report

_PRIORITY = {"compensating": 0, "checking": 0, "verifying": 0, "retrying": 0, "rereading": 0, "prechecking": 0,
             "preconditioning": 0, "failed": 1, "conflict": 1, "handlerUnavailable": 1, "awaitingApproval": 2,
             "expired": 3, "compensationDeadlinePassed": 3, "deferred": 3, "cancelled": 4, "pending": 4,
             "alreadyRecovered": 5, "compensated": 5}
#: plan kinds with a status.steps entry (the step stage of a kind that is not compensate is the kind)
ENTRY_KINDS = ("compensate", "defer", "expired", "handlerUnavailable")
#: the Compensated condition of the statuses of rules 15 and 16: (status, reason, message prefix)
_NOT_UNDONE = {
    "alreadyRecovered": (cond.TRUE, cond.ALREADY_RECOVERED,
                         "already undone when the rollback looked (the precheck read "
                         "matched): no compensator ran"),
    "expired": (cond.FALSE, cond.EXPIRED, "not attempted"),
    "handlerUnavailable": (cond.FALSE, cond.HANDLER_UNAVAILABLE, "not attempted"),
    "conflict": (cond.FALSE, cond.CONFLICT, "not undone"),
    "compensationDeadlinePassed": (cond.FALSE, cond.COMPENSATION_DEADLINE_PASSED, "not attempted"),
}


def iso(ts: float | None) -> str | None:
    """Epoch seconds as an RFC 3339 UTC timestamp (None stays None)."""
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cut(text: str | None, limit: int) -> str | None:
    """``text`` shortened to ``limit`` characters (with an ellipsis), None stays None."""
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


def approval_condition(action: PlanAction, approved: dict[int, str], approved_all_by: str | None,
                       generation: int, old: list[dict]) -> list[dict]:
    """The step's ``Approved`` condition (rule 8), naming the approver."""
    if not action.needs_approval:
        approval = cond.condition(cond.APPROVED, cond.TRUE, cond.APPROVAL_NOT_REQUIRED,
                           "the compensation does not require approval", generation)
    elif action.step in approved:
        approval = cond.condition(cond.APPROVED, cond.TRUE, cond.APPROVED_BY_USER,
                                  f"approved by {approved[action.step]}", generation)
    elif approved_all_by is not None:
        approval = cond.condition(cond.APPROVED, cond.TRUE, cond.APPROVED_FOR_ALL,
                           f"approved by {approved_all_by} (approveCompensations)", generation)
    else:
        approval = cond.condition(cond.APPROVED, cond.FALSE, cond.AWAITING_APPROVAL,
                           f"{action.compensation_tool} requires approval: approve step {action.step} "
                           f"(kubectl reversi approve) or set spec.approveCompensations", generation)
    return cond.set_condition(old, approval)


def step_conditions(action: PlanAction, run: StepRun, verify_tool: str | None, approved: dict[int, str],
                    approved_all_by: str | None, generation: int, old: list[dict],
                    blocked_by: list[int], limit: int) -> list[dict]:
    """``Approved``, ``Compensated`` and ``Verified`` of one step (docs/concepts.md#the-rollbackrequests-status)."""
    conds = approval_condition(action, approved, approved_all_by, generation, old)
    if run.reason == cond.DENIED and run.stage == "awaitingApproval":
        denied = cond.condition(cond.APPROVED, cond.FALSE, cond.DENIED, cut(run.error, limit) or "denied", generation)
        conds = cond.set_condition(conds, denied)
    stage = run.stage
    error = cut(run.error, limit) or ""
    comp = _compensated(action, run, error, blocked_by)
    conds = cond.set_condition(conds, cond.condition(cond.COMPENSATED, comp[0], comp[1], comp[2], generation))
    if stage == "compensated" and run.forced_by:
        comp = (cond.TRUE, cond.FORCED, f"{action.compensation_tool} succeeded (attempt {run.attempts}) although its "
                f"precondition did not hold: forced by {run.forced_by}")
        conds = cond.set_condition(conds, cond.condition(cond.COMPENSATED, comp[0], comp[1], comp[2], generation))
    ver = _verified(run, verify_tool, error)
    return cond.set_condition(conds, cond.condition(cond.VERIFIED, ver[0], ver[1], ver[2], generation))


def _compensated(action: PlanAction, run: StepRun, error: str, blocked_by: list[int]) -> tuple[str, str, str]:
    """``(status, reason, message)`` of a step's ``Compensated`` condition, from its stage."""
    stage = run.stage
    if stage == "compensated":
        return (cond.TRUE, cond.COMPENSATION_SUCCEEDED,
                f"{action.compensation_tool} succeeded (attempt {run.attempts})")
    elif stage == "failed" and run.verification is None:
        return (cond.FALSE, cond.COMPENSATION_FAILED, error)
    elif stage == "failed":
        return (cond.FALSE, cond.COMPENSATION_FAILED, f"the undo ran but was not confirmed: {error}")
    elif stage == "compensating":
        return (cond.UNKNOWN, cond.COMPENSATING, f"attempt {run.attempts}: {action.compensation_tool} is running")
    elif stage == "retrying":
        return (cond.UNKNOWN, cond.COMPENSATION_RETRYING,
                f"attempt {run.attempts} failed: {error}; next attempt at {iso(run.next_at)}")
    elif stage in ("checking", "verifying", "rereading"):
        return (cond.UNKNOWN, cond.COMPENSATING, f"{action.compensation_tool} succeeded; checking the undo")
    elif stage == "cancelled":
        return (cond.FALSE, cond.CANCELLED,
                f"not undone: not started before the request was cancelled ({error or 'spec.cancel'})")
    elif stage in ("prechecking", "preconditioning"):
        what = "whether it is already undone" if stage == "prechecking" else "the precondition"
        return (cond.UNKNOWN, cond.PENDING, f"reading {what} before {action.compensation_tool} runs")
    elif stage in _NOT_UNDONE:
        status, reason, text = _NOT_UNDONE[stage]
        detail = error or (action.reason if action.kind != "compensate" else "")
        return (status, reason, f"{text}: {detail}" if detail and stage != "alreadyRecovered" else text)
    elif stage == "deferred" or blocked_by:
        return (cond.FALSE, cond.BLOCKED, f"blocked by standing dependents {blocked_by}: they must be undone first")
    elif stage == "awaitingApproval" and run.reason == cond.DENIED:
        return (cond.FALSE, cond.DENIED, f"not undone: {error}")
    elif stage == "awaitingApproval":
        return (cond.FALSE, cond.AWAITING_APPROVAL, "waiting for approval")
    else:
        return (cond.FALSE, cond.PENDING, "not started yet (newest first, within parallelism)")


def _verified(run: StepRun, verify_tool: str | None, error: str) -> tuple[str, str, str]:
    """``(status, reason, message)`` of a step's ``Verified`` condition, from its verification."""
    stage = run.stage
    if run.verification == "verified":
        return (cond.TRUE, cond.VERIFIED, f"{verify_tool} answered as expected")
    elif run.verification == "none":
        return (cond.FALSE, cond.NO_READ_BACK_DECLARED, "undone, no read-back declared: the manifest declares no "
                "verification for this tool, so the undo counts as complete without a check")
    elif run.verification == "unverified" and run.reason == cond.READ_BACK_REQUIRED:
        return (cond.FALSE, cond.READ_BACK_REQUIRED, "undone but not checked: no read-back is declared and the request "
                "sets requireVerification, so this undo is unverified")
    elif run.verification == "unverified" and run.reason in (cond.CANCELLED, cond.DEADLINE_EXCEEDED):
        why = "was cancelled" if run.reason == cond.CANCELLED else "reached its deadline"
        return (cond.FALSE, run.reason, f"undone but not checked: the request {why} before a read-back answered; "
                "a later request on the run runs it (never the compensator again)")
    elif run.verification == "unverified":
        return (cond.FALSE, cond.NO_READER, "undone but not checked: no reader ran, so this undo is unverified")
    elif run.verification == "verificationFailed":
        reason = cond.VERIFICATION_ARGUMENTS_UNAVAILABLE if run.reason == "VerificationArgumentsUnavailable" else (
            cond.READ_FAILED if error.startswith("verification failed: read failed") else cond.VERIFICATION_FAILED)
        return (cond.FALSE, reason, error)
    elif stage in ("verifying", "rereading"):
        return (cond.UNKNOWN, cond.VERIFYING, f"read-back {run.reads}" + (f": {error}" if error else ""))
    else:
        return (cond.UNKNOWN, cond.PENDING, "not checked yet")


def step_entries(plan: Plan, runs: dict[int, StepRun], deferred: dict[int, list[int]], keys: dict[int, str],
                 approved: dict[int, str], approved_all_by: str | None, generation: int,
                 old_entries: dict[int, dict], verify_tools: dict[int, str | None], limit: int,
                 message_limit: int) -> list[dict]:
    """``status.steps``: one entry per compensate or defer action, most important first, at
    most ``limit`` (active steps are always kept so a restarted operator can resume them)."""
    chosen: list[tuple[int, int, dict]] = []
    for action in plan.actions:
        if action.kind not in ENTRY_KINDS:
            continue
        stage = {"defer": "deferred", "compensate": "pending"}.get(action.kind, action.kind)
        run = runs.get(action.step) or StepRun(action.step, stage=cast(Stage, stage))
        blocked = deferred.get(action.step) or (list(action.blocked_by) if action.kind == "defer" else [])
        if blocked and run.stage == "pending":
            run = StepRun(run.step, stage="deferred", attempts=run.attempts)
        old = old_entries.get(action.step, {})
        entry = {
            "step": action.step,
            "tool": action.tool,
            "compensationTool": action.compensation_tool,
            "stage": run.stage,
            "attempts": run.attempts,
            "firstAttempt": run.first_attempt,
            "reads": run.reads,
            "lostReads": run.lost_reads or None,
            "effectUnknown": run.effect_unknown or None,
            "idempotencyKey": keys.get(action.step) or action.idempotency_key,
            "blockedBy": blocked,
            "lastError": cut(run.error, message_limit),
            "nextAttemptAt": iso(run.next_at),
            "forcedBy": run.forced_by,
            "conditions": step_conditions(action, run, verify_tools.get(action.step), approved, approved_all_by,
                                          generation, old.get("conditions", []), blocked, message_limit),
        }
        chosen.append((_PRIORITY.get(run.stage, 9), action.step, {k: v for k, v in entry.items() if v is not None}))
    keep = [e for p, _, e in chosen if p == 0]
    rest = sorted((e for e in chosen if e[0] != 0), key=lambda t: (t[0], -t[1]))
    keep += [e for _, _, e in rest[: max(0, limit - len(keep))]]
    return sorted(keep, key=lambda e: e["step"])


def reverify_entries(plan: Plan, runs: dict[int, StepRun], verify_tools: dict[int, str | None], generation: int,
                     old_entries: dict[int, dict], message_limit: int) -> list[dict]:
    """``status.steps`` entries of steps undone by an earlier request whose declared read-back
    this request runs (re-verify, rule 5): their stage, reads and ``Verified`` condition."""
    out = []
    for s, run in sorted(runs.items()):
        action = plan.actions[s]
        error = cut(run.error, message_limit)
        if run.verification == "verified":
            ver = (cond.TRUE, cond.VERIFIED,
                   f"{verify_tools.get(s)} answered as expected (re-verified: no compensator ran again)")
        elif run.verification == "verificationFailed":
            ver = (cond.FALSE, cond.READ_FAILED if (error or "").startswith("verification failed: read failed")
                   else cond.VERIFICATION_FAILED, error or "verification failed")
        else:
            ver = (cond.UNKNOWN, cond.VERIFYING, f"re-verifying an earlier undo: read-back {run.reads}"
                   + (f": {error}" if error else ""))
        conds = cond.set_condition((old_entries.get(s) or {}).get("conditions") or [],
                                cond.condition(cond.VERIFIED, ver[0], ver[1], ver[2], generation))
        entry = {"step": s, "tool": action.tool, "stage": run.stage, "attempts": run.attempts, "reads": run.reads,
                 "lostReads": run.lost_reads or None, "effectUnknown": run.effect_unknown or None,
                 "lastError": error, "nextAttemptAt": iso(run.next_at),
                 "conditions": conds}
        out.append({k: v for k, v in entry.items() if v is not None})
    return out


def plan_status(plan: Plan, limit: int) -> dict[str, Any]:
    """``status.plan``: ``fullyReversible`` and at most ``limit`` actions (skips left out first),
    with ``omitted`` counting what was left out."""
    return compact_plan(plan, limit).to_wire()


def report_status(report: Report, message_limit: int) -> dict[str, Any]:
    """The report as wire JSON, texts cut to ``message_limit``."""
    wire = report.to_wire()
    for bucket, key in (("failed", "error"), ("unrecoverable", "reason")):
        for item in wire.get(bucket, []):
            item[key] = cut(item.get(key), message_limit)
    return wire


def summary_conditions(old: list[dict], generation: int, updates: Iterable[tuple[str, str, str, str]]) -> list[dict]:
    """Set the summary conditions ``(type, status, reason, message)`` on ``old``."""
    out = list(old)
    for ctype, status, reason, message in updates:
        out = cond.set_condition(out, cond.condition(ctype, status, reason, message, generation))
    return out


def active(runs: dict[int, StepRun]) -> list[int]:
    """Steps whose compensation, check or read-back is under way."""
    return sorted(s for s, r in runs.items() if r.stage in ACTIVE_STAGES)


# ----------------------------------------------------------------- kstatus: Ready / Reconciling / Stalled

# readiness and request_readiness are pure rules of the conditions (reversi.conditions), used here
READY_STATE, PROGRESSING, STALLED_STATE = cond.READY_STATE, cond.PROGRESSING, cond.STALLED_STATE
readiness, request_readiness = cond.readiness, cond.request_readiness


def run_readiness(conds: list[dict] | None, name: str = "NAME",
                  acknowledged: Acknowledged | None = None) -> list[tuple[str, str, str, str]]:
    """Ready/Reconciling/Stalled of a Run from its ``Locked`` and ``RolledBack`` conditions:
    progressing while a rollback holds it, stalled when its last rollback is incomplete and no
    acknowledgement of it counts (``acknowledged``: :func:`reversi.engine.acknowledgement.acknowledged`),
    ready otherwise (rolled back completely, never rolled back, or its residue acknowledged:
    reason ``ResidueAcknowledged``). ``name``: the Run's, for the command the Stalled message gives."""
    locked = cond.get_condition(conds, cond.LOCKED)
    if locked and locked.get("status") == cond.TRUE:
        return readiness(PROGRESSING, cond.HELD_BY_REQUEST, locked.get("message", ""))
    rolled = cond.get_condition(conds, cond.ROLLED_BACK)
    if rolled is None:
        return readiness(READY_STATE, cond.NO_ROLLBACK, "no rollback has worked on this run")
    if rolled.get("status") == cond.TRUE:
        return readiness(READY_STATE, cond.ALL_COMPENSATED, rolled.get("message", ""))
    if acknowledged is not None:
        return readiness(READY_STATE, cond.RESIDUE_ACKNOWLEDGED,
                         f"{rolled.get('message', '')}; its residue is {acknowledged.text()}")
    return readiness(STALLED_STATE, cond.INCOMPLETE, f"{rolled.get('message', '')}: read its report "
                     f"(kubectl reversi describe run/{name}), settle what is left, or accept what cannot be undone "
                     f"(kubectl reversi acknowledge {name} --note ...)")


def request_acknowledged_update(status: dict | None, acknowledged: Acknowledged | None) -> dict | None:
    """For a RollbackRequest that ended ``Incomplete`` and is its Run's last: the status merge
    patch that makes its Ready/Reconciling/Stalled say whether its residue is acknowledged
    (Ready, reason ``ResidueAcknowledged``) or not (Stalled, reason ``Incomplete``, or
    ``Cancelled`` for a cancelled request, with its verdict from the ``Complete`` condition), or
    ``None`` when they already do or the request is in another phase."""
    status = status or {}
    if status.get("phase") != "Incomplete":
        return None
    old = status.get("conditions") or []
    gen = status.get("observedGeneration") or 0
    if acknowledged is not None:
        wanted = readiness(READY_STATE, cond.RESIDUE_ACKNOWLEDGED,
                           f"incomplete; its residue is {acknowledged.text()}")
    else:
        complete = cond.get_condition(old, cond.COMPLETE) or {}
        reason = cond.CANCELLED if complete.get("reason") == cond.CANCELLED else cond.INCOMPLETE
        wanted = readiness(STALLED_STATE, reason, complete.get("message") or "")
    conds = summary_conditions(old, gen, wanted)
    if same_conditions(conds, old):
        return None
    return {"conditions": conds}


def request_superseded_update(status: dict | None, holder: str, run: str) -> dict | None:
    """For a RollbackRequest of Run ``run`` that ended ``Incomplete`` and whose residue is not what stands on
    the run (``holder``: the request whose residue stands, :func:`reversi.engine.acknowledgement.residue_request`):
    the status merge patch that makes it Ready, reason ``Superseded``, since what stands is ``holder``'s to say
    and to acknowledge (docs/concepts.md#acknowledging-residue); ``None`` when it already says so or the request
    is in another phase. Its phase, report and ``Complete`` condition stay as they ended: the record of what it
    did."""
    status = status or {}
    if status.get("phase") != "Incomplete":
        return None
    old = status.get("conditions") or []
    complete = cond.get_condition(old, cond.COMPLETE) or {}
    verdict = complete.get("message") or "incomplete"
    wanted = readiness(READY_STATE, cond.SUPERSEDED,
                       f"{verdict}; superseded: what stands on Run {run} is RollbackRequest {holder}'s to say "
                       f"(kubectl reversi describe run/{run})")
    conds = summary_conditions(old, status.get("observedGeneration") or 0, wanted)
    if same_conditions(conds, old):
        return None
    return {"conditions": conds}


def run_status_update(status: dict | None, generation: int | None, name: str = "NAME",
                      acknowledged: Acknowledged | None = None) -> dict | None:
    """The status merge patch that makes a Run's ``observedGeneration`` current, its
    Ready/Reconciling/Stalled agree with its Locked/RolledBack conditions and its acknowledgement
    (:func:`run_readiness`), and ``status.standing.acknowledgedBy`` name who accepted what stands
    while that acknowledgement counts (absent when none does), or ``None`` when nothing would
    change (then nothing is written)."""
    status = status or {}
    old = status.get("conditions") or []
    conds = summary_conditions(old, generation or 0, run_readiness(old, name, acknowledged))
    standing = status.get("standing")
    who = {}
    if isinstance(standing, dict) and standing.get("acknowledgedBy") != acknowledged_by(acknowledged):
        who = {"standing": {"acknowledgedBy": acknowledged_by(acknowledged)}}
    if status.get("observedGeneration") == generation and same_conditions(conds, old) and not who:
        return None
    return {"observedGeneration": generation, "conditions": conds, **who}


def needs_standing(status: dict | None) -> bool:
    """Whether a Run has a rollback's verdict (a ``RolledBack`` condition) but no
    ``status.standing`` (written by a version before it existed), and no rollback holds it: the
    operator then computes what stands from its journal once (docs/concepts.md#what-stands)."""
    status = status or {}
    conds = status.get("conditions") or []
    locked = cond.get_condition(conds, cond.LOCKED) or {}
    return (status.get("standing") is None and cond.get_condition(conds, cond.ROLLED_BACK) is not None
            and locked.get("status") != cond.TRUE)


def run_release_update(run_obj: dict, request: str, settled: sd.Settled | None, *, complete: bool, deleted: bool,
                       now: str | None) -> dict:
    """The status merge patch that releases a Run's lock as RollbackRequest ``request`` ends
    (``deleted``: it was deleted before it finished): ``Locked=False``, ``RolledBack`` and
    ``status.standing`` as ``settled`` says (:func:`reversi.engine.standing.after_rollback`;
    None when the run's journal could not be read: then only a ``complete`` report changes
    them), Ready/Reconciling/Stalled from those and the acknowledgement that counts then, and
    ``standing.acknowledgedBy``. ``now``: RFC 3339, for ``standing.updatedAt`` when what stands
    changed."""
    meta, status = run_obj["metadata"], run_obj.get("status") or {}
    run_name, gen = meta["name"], meta.get("generation")
    old_standing = status.get("standing") if isinstance(status.get("standing"), dict) else None
    if settled is None:
        settled = sd.Settled("True", sd.summary([], request), True, ()) if complete else \
            sd.Settled(None, old_standing, True, ())
    if deleted:
        locked = (cond.REQUEST_DELETED, f"RollbackRequest {request} was deleted before it finished; the lock is "
                                         "released")
    else:
        locked = (cond.RELEASED, f"RollbackRequest {request} finished")
    if settled.rolled_back is None and not settled.acted:
        locked = (locked[0], locked[1] + "; it undid nothing, so what stands is unchanged")
    conds = cond.set_condition(status.get("conditions") or [], cond.condition(
        cond.LOCKED, cond.FALSE, locked[0], locked[1], gen))
    standing = dict(settled.standing) if settled.standing is not None else None
    if settled.rolled_back is not None:
        conds = cond.set_condition(conds, cond.condition(
            cond.ROLLED_BACK, settled.rolled_back,
            cond.ALL_COMPENSATED if settled.rolled_back == cond.TRUE else cond.INCOMPLETE,
            _rolled_back_text(request, settled.rolled_back == cond.TRUE, deleted, standing), gen))
    patch: dict[str, Any] = {"activeRequest": None, "observedGeneration": gen}
    ack = None
    if standing is not None:
        standing["updatedAt"] = (old_standing or {}).get("updatedAt") if old_standing and sd.same(
            standing, old_standing) else now
        ack = acknowledgement_of({"metadata": meta, "spec": run_obj.get("spec") or {},
                                  "status": {**status, "conditions": conds, "standing": standing}})
        standing["acknowledgedBy"] = acknowledged_by(ack)
        patch["standing"] = standing
    patch["conditions"] = summary_conditions(conds, gen or 0, run_readiness(conds, run_name, ack))
    return patch


def _rolled_back_text(request: str, complete: bool, deleted: bool, standing: dict | None) -> str:
    if complete:
        return f"last rollback: RollbackRequest {request} (complete)"
    if deleted:
        text = f"last rollback: RollbackRequest {request} was deleted mid-way (incomplete): create a new request"
    else:
        text = f"last rollback: RollbackRequest {request} (incomplete)"
    if standing is not None and (standing.get("failed") or standing.get("unverified")):
        left = standing.get("request")
        text += f"; {sd.text(standing)}" + (f", left by RollbackRequest {left}" if left != request else "")
    return text


def same_conditions(new: list[dict], old: list[dict]) -> bool:
    """Whether two condition lists say the same, ``lastTransitionTime`` aside (order ignored)."""
    def key(conds: list[dict]) -> list[tuple]:
        return sorted((x["type"], x["status"], x["reason"], x.get("message"), x.get("observedGeneration"))
                      for x in conds)
    return key(new) == key(old)


def observed_update(status: dict | None, generation: int | None) -> dict | None:
    """For an object whose work is done (a final RollbackRequest): the status merge patch that
    records ``generation`` as observed (and in its conditions), or ``None`` when it already is.
    Spec changes after the end change nothing, but kstatus needs to see them observed."""
    status = status or {}
    if status.get("observedGeneration") == generation:
        return None
    conds = [{**item, "observedGeneration": generation} for item in status.get("conditions") or []]
    return {"observedGeneration": generation, "conditions": conds}
