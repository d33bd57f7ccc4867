"""What ``kubectl reversi`` prints: pure functions from API objects (dicts) to text or JSON.

No I/O and no Kubernetes client here, so every view is checked by a fast unit test. Objects come
in as the API returns them (wire names, camelCase); times as RFC 3339 strings.
"""

from __future__ import annotations

import datetime as dt
import json
import shlex
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..adapters.jobs import (ANNOTATION_REQUEST, LABEL_ATTEMPT, LABEL_READ, LABEL_REQUEST_UID, LABEL_STEP,
                             job_name)
from ..engine import standing as sd
from ..engine.acknowledgement import acknowledged, residue_request, stale
from ..engine.archive import step_columns
from ..engine.plan import COMPENSATE, DEFER, SKIP, UNMANIFESTED, UNRECOVERABLE, UNRESOLVED
from ..engine.nested_runs import Node, units
from ..models.rollbackrequest import TERMINAL_PHASES, Plan, PlanAction

#: Fields of one action in ``plan -o json|yaml``, in this order: :class:`PlanAction`'s, printed
#: with their API names (camelCase, as ``status.plan.actions`` of a RollbackRequest has them).
PLAN_FIELDS = (
    "step",
    "tool",
    "kind",
    "compensation_tool",
    "args",
    "idempotency_key",
    "needs_approval",
    "residue",
    "compensation_kind",
    "verified",
    "blocked_by",
    "reason",
)
#: Phases ``rollback --wait`` stops at, and their exit codes.
FINAL_EXIT = {"Succeeded": 0, "Planned": 0, "Incomplete": 2, "Failed": 2}
#: Halt scope fields, in the order ``halt list`` shows them.
SCOPE_FIELDS = ("tool", "actor", "tenant", "environment", "namespace")
#: Most items listed per report bucket in ``describe`` (the rest are counted).
BUCKET_LIMIT = 50
#: Label of each report bucket in ``describe``, in the order they are printed.
BUCKETS = (
    ("compensated", "Compensated (undone and checked by a reader)"),
    ("noReadBack", "Compensated, no read-back declared (undone; the manifest declares no check)"),
    ("unverified", "Unverified (undone, NOT checked: no reader ran)"),
    ("failed", "Failed"),
    ("unrecoverable", "Unrecoverable (cannot be undone)"),
    ("unresolved", "Unresolved (outcome intended or uncertain: Reversi will not guess)"),
    ("unmanifested", "Unmanifested (no manifest entry: recorded in observe mode)"),
    ("deferred", "Deferred (a dependent still stands)"),
    ("awaitingApproval", "Awaiting approval"),
    ("pending", "Pending (not settled yet)"),
    ("cancelled", "Cancelled (not started: the request was cancelled)"),
    ("alreadyRecovered", "Already recovered (found undone by the precheck read: no compensator ran)"),
    ("expired", "Expired (the undo window had passed: not attempted)"),
    ("handlerUnavailable", "Handler unavailable (runner missing or its Job refused: not attempted)"),
    ("conflict", "Conflict (the precondition does not hold: not undone)"),
    ("compensationDeadlinePassed", "Compensation deadline passed (not started: not attempted)"),
)
#: Residue types (docs/concepts.md#the-report) in the order ``describe`` groups them, with their headings.
RESIDUE_GROUPS = (
    ("declared", "declared (the manifest says the undo cannot take this back)"),
    ("failed", "failed (the undo failed: the effect may remain)"),
    ("notAttempted", "not attempted (not undone: the effect remains)"),
    ("unknown", "unknown (nobody knows whether the effect is gone)"),
)


# ----------------------------------------------------------------------------------- helpers


def parse_time(value: str | None) -> dt.datetime | None:
    """An RFC 3339 timestamp as an aware datetime (``None`` or garbage: ``None``)."""
    if not value:
        return None
    try:
        moment = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def age(value: str | None, now: dt.datetime) -> str:
    """kubectl-style age of a timestamp: ``42s``, ``5m``, ``3h``, ``2d`` (unknown: ``<unknown>``)."""
    moment = parse_time(value)
    if moment is None:
        return "<unknown>"
    seconds = max(0, int((now - moment).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 2 * 3600:
        return f"{seconds // 60}m"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns two spaces apart (kubectl's layout); the last column is not padded."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def steps_text(steps: Sequence[int], limit: int = 10) -> str:
    """``1, 2, 3`` (at most ``limit``, then ``...``)."""
    shown = ", ".join(str(s) for s in steps[:limit])
    return shown + (", ..." if len(steps) > limit else "")


def ns_flag(namespace: str) -> str:
    """``-n NAMESPACE`` for the commands a view suggests."""
    return f"-n {shlex.quote(namespace)}"


# -------------------------------------------------------------------------------------- plan


def _api_name(field: str) -> str:
    """A :class:`PlanAction` field's name in the API (``needs_approval`` -> ``needsApproval``)."""
    return PlanAction.model_fields[field].alias or field


def plan_doc(plan: Plan, run_id: str | None = None) -> dict[str, Any]:
    """``plan -o json|yaml``: ``{"runId", "fullyReversible", "actions": [{PLAN_FIELDS...}]}``
    with the API's camelCase names (``compensationTool``, ``idempotencyKey``, ``needsApproval``,
    ``compensationKind``, ``blockedBy``); ``runId`` is the Run's uid (the compensation
    idempotency keys are derived from it)."""
    return {
        "runId": run_id,
        "fullyReversible": bool(plan.fully_reversible),
        "actions": [{_api_name(name): _plain(getattr(action, name)) for name in PLAN_FIELDS}
                    for action in plan.actions],
    }


#: ``rollback --wait -o json`` and ``describe -o json``: the report's fields, with the API's names
#: (``status.report``), in the order printed (README.md#what-the-plugin-promises-scripts).
REPORT_FIELDS = (
    "compensated",
    "skipped",
    "failed",
    "unrecoverable",
    "unresolved",
    "unmanifested",
    "deferred",
    "awaitingApproval",
    "unverified",
    "complete",
    "pending",
    "cancelled",
    "noReadBack",
    "denied",
    "alreadyRecovered",
    "expired",
    "handlerUnavailable",
    "conflict",
    "compensationDeadlinePassed",
    "forced",
    "residue",
)


def report_doc(request: Mapping[str, Any]) -> dict[str, Any]:
    """``rollback --wait -o json|yaml`` and ``describe -o json|yaml``: the report of ``request``
    with the API's camelCase names (:data:`REPORT_FIELDS`; ``deferred[].blockedBy``, typed
    ``residue[]``), after ``request`` and ``run`` (``namespace/name``), ``phase``, ``dryRun``;
    for a dry run ``fullyReversible``, and for a run with child runs ``runs`` (one section per
    run, as in ``status.report.runs``). A request not reported yet has empty buckets and
    ``complete: false``."""
    meta = request.get("metadata") or {}
    spec = request.get("spec") or {}
    status = request.get("status") or {}
    report = status.get("report") or {}
    doc: dict[str, Any] = {
        "request": f"{meta.get('namespace')}/{meta.get('name')}",
        "run": f"{meta.get('namespace')}/{(spec.get('runRef') or {}).get('name')}",
        "phase": status.get("phase"),
        "dryRun": bool(spec.get("dryRun")),
    }
    for name in REPORT_FIELDS:
        value = report.get(name, False if name == "complete" else [])
        if name == "deferred":
            value = [{"step": d.get("step"), "blockedBy": list(d.get("blockedBy") or [])} for d in value]
        if name == "residue":
            value = residue_entries(value)
        doc[name] = value
    if report.get("runs"):  # nested runs: one section per run of the tree, in rollback order
        doc["runs"] = [dict(sec) for sec in report["runs"] if isinstance(sec, Mapping)]
    if spec.get("dryRun"):
        doc["fullyReversible"] = bool((status.get("plan") or {}).get("fullyReversible"))
    return doc


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _kinds(plan: Plan) -> dict[int, str]:
    return {a.step: a.kind for a in plan.actions}


def _last_column(action: PlanAction, kinds: Mapping[int, str]) -> str:
    if action.kind == DEFER and action.blocked_by:
        named = ", ".join(f"{b} ({kinds[b]})" if b in kinds else str(b) for b in action.blocked_by)
        return f"blocked by {named}"
    return action.reason


def plan_table(plan: Plan, wide: bool = False) -> str:
    """The plan as a table: step, tool, kind, compensation tool, approval, verified, reason or
    blockedBy; ``wide`` (``-o wide``) adds the compensation's kind, its runner and its resolved
    arguments (compact JSON) before the last column."""
    kinds = _kinds(plan)
    rows = []
    for a in plan.actions:
        undoes = a.kind in (COMPENSATE, DEFER)
        row: list[Any] = [
            a.step,
            a.tool,
            a.kind,
            a.compensation_tool or "-",
            ("required" if a.needs_approval else "no") if undoes else "-",
            ("yes" if a.verified else "no") if undoes else "-",
        ]
        if wide:
            row += [a.compensation_kind or "-", a.runner or "-",
                    json_line(a.args) if a.args is not None else "-"]
        rows.append(row + [_last_column(a, kinds)])
    headers = ["STEP", "TOOL", "KIND", "COMPENSATION", "APPROVAL", "VERIFIED"]
    if wide:
        headers += ["UNDO KIND", "RUNNER", "ARGS"]
    return table(headers + ["REASON / BLOCKED BY"], rows)


def plan_verdict(plan: Plan, run: str, namespace: str) -> str:
    """The verdict under the plan table, with residue and what to do about blockers."""
    by_kind: dict[str, list[int]] = {}
    for a in plan.actions:
        by_kind.setdefault(a.kind, []).append(a.step)
    compensate = by_kind.get(COMPENSATE, [])
    lines: list[str] = []
    if plan.fully_reversible:
        detail = [f"{len(compensate)} to compensate", f"{len(by_kind.get(SKIP, []))} to skip"]
        approval = [a.step for a in plan.actions if a.kind == COMPENSATE and a.needs_approval]
        unchecked = [a.step for a in plan.actions if a.kind == COMPENSATE and not a.verified]
        if approval:
            detail.append(f"approval needed for step(s) {steps_text(approval)}")
        if unchecked:
            detail.append(f"step(s) {steps_text(unchecked)} will be unverified (no reader)")
        lines.append(f"Verdict: fully reversible ({'; '.join(detail)}), assuming each compensation succeeds.")
    else:
        parts = []
        for kind in (UNRECOVERABLE, UNRESOLVED, UNMANIFESTED, DEFER):
            steps = by_kind.get(kind, [])
            if steps:
                parts.append(f"{len(steps)} {'deferred' if kind == DEFER else kind} ({steps_text(steps)})")
        lines.append(f"Verdict: NOT fully reversible: {', '.join(parts)}; "
                     f"{len(compensate)} to compensate, {len(by_kind.get(SKIP, []))} to skip.")
        if by_kind.get(UNRESOLVED):
            first = by_kind[UNRESOLVED][-1]
            lines.append(f"  Settle unresolved steps first: kubectl reversi resolve {run} {first} "
                         f"--status succeeded|failed [--result JSON] --note TEXT {ns_flag(namespace)}")
    residue = [(a.step, line) for a in plan.actions if a.kind in (COMPENSATE, DEFER) for line in a.residue]
    if residue:
        lines.append("Residue (stays even after the undo):")
        lines += [f"  step {step}: {line}" for step, line in residue]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- describe


def _conditions(entry: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in entry.get("conditions") or []}


def condition_reasons(entry: Mapping[str, Any]) -> str:
    """``Approved=ApprovedByUser Compensated=Compensating Verified=Pending``."""
    return " ".join(f"{c.get('type')}={c.get('reason')}" for c in entry.get("conditions") or [])


def progress_line(entry: Mapping[str, Any]) -> str:
    """One line of ``rollback --wait``: step, tool, stage, attempts, conditions' reasons, error."""
    parts = [f"step {entry.get('step')}", str(entry.get("tool") or "?")]
    if entry.get("compensationTool"):
        parts[-1] += f" -> {entry['compensationTool']}"
    parts.append(str(entry.get("stage") or "pending"))
    parts.append(f"attempts={entry.get('attempts', 0)}")
    if entry.get("reads"):
        parts.append(f"reads={entry['reads']}")
    if entry.get("blockedBy"):
        parts.append(f"blockedBy={','.join(str(b) for b in entry['blockedBy'])}")
    reasons = condition_reasons(entry)
    if reasons:
        parts.append(reasons)
    line = "  ".join(parts)
    if entry.get("lastError"):
        line += f"  error: {entry['lastError']}"
    return line


def progress_key(entry: Mapping[str, Any]) -> tuple:
    """What must change for ``rollback --wait`` to print a step again."""
    return (entry.get("stage"), entry.get("attempts"), entry.get("reads"), entry.get("lastError"),
            tuple((c.get("type"), c.get("status"), c.get("reason")) for c in entry.get("conditions") or []))


def phase_line(request: Mapping[str, Any]) -> str:
    """``phase Running  progress 1/3`` and, while waiting or invalid, why."""
    status = request.get("status") or {}
    line = f"phase {status.get('phase') or 'Pending'}"
    if status.get("progress"):
        line += f"  progress {status['progress']}"
    conds = _conditions(status)
    running = conds.get("Running") or {}
    if status.get("phase") == "Waiting" and running.get("message"):
        line += f"  ({running['message']})"
    invalid = conds.get("Invalid") or {}
    if invalid.get("status") == "True":
        line += f"  ({invalid.get('message')})"
    return line


def awaiting_steps(request: Mapping[str, Any]) -> list[int]:
    """Steps waiting for approval, from the report (else from the per-step entries)."""
    status = request.get("status") or {}
    report = status.get("report") or {}
    if report.get("awaitingApproval"):
        return sorted(report["awaitingApproval"])
    return sorted(e["step"] for e in status.get("steps") or [] if e.get("stage") == "awaitingApproval")


def approval_hint(request: Mapping[str, Any]) -> str:
    """What to run when a request waits for approval."""
    meta = request.get("metadata") or {}
    name, ns = meta.get("name", "?"), meta.get("namespace", "default")
    steps = awaiting_steps(request)
    flags = " ".join(f"--step {s}" for s in steps) or "--step N"
    return (f"steps {steps_text(steps, 50) or '?'} wait for approval; approve them with:\n"
            f"  kubectl reversi approve {name} {flags} {ns_flag(ns)}\n"
            f"or approve every compensation of the request: kubectl reversi approve {name} --all {ns_flag(ns)}")


def _tool_names(request: Mapping[str, Any], run: Mapping[str, Any] | None,
                step_tools: Mapping[int, str] | None = None) -> dict[int, str]:
    """Each step's tool: from the request's status, then the journal (``step_tools``, from the
    RunSteps, and the inline steps of a Run of Reversi 0.1 not moved yet), which wins."""
    tools: dict[int, str] = {}
    status = request.get("status") or {}
    for action in (status.get("plan") or {}).get("actions") or []:
        tools[action["step"]] = action.get("tool", "")
    for entry in status.get("steps") or []:
        if entry.get("tool"):
            tools[entry["step"]] = entry["tool"]
    for step in ((run or {}).get("spec") or {}).get("steps") or []:
        tools[step["index"]] = step.get("tool", "")
    tools.update(step_tools or {})
    return tools


def _bucket_steps(items: Iterable[Any]) -> list[int]:
    return [item["step"] if isinstance(item, Mapping) else item for item in items]


def steps_without_tool(request: Mapping[str, Any]) -> list[int]:
    """Steps ``describe`` lists by name whose tool the request's status does not say (a long
    run's status keeps a bounded part of the plan): their tools come from the run's RunSteps."""
    status = request.get("status") or {}
    report = status.get("report") or {}
    known = _tool_names(request, None)
    shown = {s for key, _ in BUCKETS for s in _bucket_steps((report.get(key) or [])[:BUCKET_LIMIT])}
    shown |= {e.get("step") for e in (status.get("steps") or [])[:BUCKET_LIMIT]}
    return sorted(s for s in shown if isinstance(s, int) and s not in known)


def tree_lines(run: str, steps: Mapping[str, int], tree: Mapping[str, Sequence[Node]], depth: int = 0) -> list[str]:
    """``plan``'s order of a tree rollback (nested runs): the run's step ranges and its child runs
    as units, newest first, each child's own units indented below it. ``steps``: each run's step
    count."""
    lines = ["Child runs: a rollback of this run undoes, in this order:"] if depth == 0 else []
    pad = "  " * (depth + 1)
    for unit in units(steps.get(run, 0), tree.get(run, ())):
        if unit.child is None:
            span = f"step {unit.lo}" if unit.hi - unit.lo == 1 else f"steps {unit.hi - 1}..{unit.lo}"
            lines.append(f"{pad}- {span} of {run}")
        else:
            lines.append(f"{pad}- child Run {unit.child} (opened at step {unit.lo}), as one unit")
            lines += tree_lines(unit.child, steps, tree, depth + 1)
    return lines


def run_section_lines(sections: list[Any]) -> list[str]:
    """``describe``'s section per run of a tree rollback (nested runs): the request's run, then
    the runs below it in the order they are rolled back, each with its outcome and the request
    that holds its full report."""
    if not sections:
        return []
    rows = []
    for sec in sections:
        if not isinstance(sec, dict):
            continue
        opened = f"at step {sec['opened']} of {sec['parent']}" if sec.get("parent") else "(this request's run)"
        rows.append((sec.get("run", ""), opened, sec.get("outcome", ""), sec.get("compensated", 0),
                     sec.get("failed", 0), sec.get("request") or "-"))
    lines = ["", "Runs (nested, in rollback order):"]
    lines += ["  " + line for line in table(("RUN", "OPENED", "OUTCOME", "COMPENSATED", "FAILED", "REPORT IN"),
                                            rows).splitlines()]
    return lines


def residue_entries(residue: list[Any]) -> list[dict[str, Any]]:
    """Typed residue ``[{step, type, text}]`` from a report's ``residue``; a report written
    before typed residue (``[{step, residue: [lines]}]``) reads as one ``declared`` entry per line."""
    out: list[dict[str, Any]] = []
    for item in residue:
        if not isinstance(item, Mapping):
            continue
        if item.get("type") or item.get("text"):
            out.append({"step": item.get("step"), "type": item.get("type") or "declared",
                        "text": item.get("text") or ""})
        else:
            out += [{"step": item.get("step"), "type": "declared", "text": line} for line in item.get("residue") or []]
    return out


def residue_lines(residue: list[Any]) -> list[str]:
    """``describe``'s residue section: entries grouped by type (declared, failed, notAttempted,
    unknown), at most ``BUCKET_LIMIT`` per group."""
    entries = residue_entries(residue)
    if not entries:
        return []
    lines = [" Residue (what the rollback leaves behind), by type:"]
    for kind, heading in RESIDUE_GROUPS:
        group = [e for e in entries if e["type"] == kind]
        if not group:
            continue
        lines.append(f"  {heading}: {len(group)}")
        lines += [f"    step {e['step']}: {e['text']}" for e in group[:BUCKET_LIMIT]]
        if len(group) > BUCKET_LIMIT:
            lines.append(f"    ... and {len(group) - BUCKET_LIMIT} more "
                         "(all of them: kubectl get rollbackrequest -o yaml)")
    return lines


def _bucket_lines(name: str, items: list[Any], tools: Mapping[int, str],
                  notes: Mapping[int, str] | None = None) -> list[str]:
    out = []
    for item in items[:BUCKET_LIMIT]:
        step = item["step"] if isinstance(item, Mapping) else item
        head = f"  step {step}  {tools.get(step, '')}".rstrip()
        if name == "noReadBack":
            head += ": undone, no read-back declared"
        if notes and step in notes:
            head += f": {notes[step]}"
        if name == "failed":
            head += f": {item.get('error', '')}"
        elif name == "unrecoverable" or (isinstance(item, Mapping) and item.get("reason")):
            head += f": {item.get('reason', '')}"
        elif name == "deferred":
            head += f": blocked by {steps_text(item.get('blockedBy') or [], 8) or 'a standing dependent'}"
        out.append(head)
    if len(items) > BUCKET_LIMIT:
        out.append(f"  ... and {len(items) - BUCKET_LIMIT} more (all of them: kubectl get rollbackrequest -o yaml)")
    return out


def next_steps(request: Mapping[str, Any], run: Mapping[str, Any] | None) -> list[str]:
    """The "What to do next" lines of ``describe`` (empty when nothing is left to do)."""
    meta = request.get("metadata") or {}
    name, ns = meta.get("name", "?"), meta.get("namespace", "default")
    run_name = ((request.get("spec") or {}).get("runRef") or {}).get("name", "RUN")
    status = request.get("status") or {}
    report = status.get("report") or {}
    phase = status.get("phase")
    n = ns_flag(ns)
    manifest = (((run or {}).get("spec") or {}).get("manifestRef") or {}).get("name", "<manifest>")
    early = _next_steps_before_work(status, phase, name, run_name, n)
    if early is not None:
        return early
    out = ["Another request is undoing the run; this one starts when it ends."] if phase == "Waiting" else []
    out += _next_steps_to_settle(report, phase, name, run_name, n)
    out += _next_steps_to_undo(report, ns, manifest, run_name, n)
    out += _next_steps_left(report, phase, run_name, n)
    if out and phase == "Incomplete" and run is not None and acknowledged(run) is None:
        out.append(f"Once what stands is dealt with by hand, accept it: kubectl reversi acknowledge {run_name} "
                   f"--note TEXT {n} (the run and this request then read as done; the report keeps the residue)")
    return out


def _next_steps_before_work(status: Mapping[str, Any], phase: str | None, name: str, run_name: str,
                            n: str) -> list[str] | None:
    """What to do about a request that never got to work (invalid, planned, waiting for its Run,
    not picked up), or None when it did."""
    out: list[str] = []
    invalid = _conditions(status).get("Invalid") or {}
    if phase == "Failed" and invalid.get("status") == "True":
        out.append(f"The request cannot be carried out: {invalid.get('message', '')}")
        out.append(f"Fix that, then start a new request: kubectl reversi rollback {run_name} {n}")
        return out
    if phase == "Planned":
        plan = status.get("plan") or {}
        if plan.get("fullyReversible"):
            out.append(f"Nothing blocks the undo. Start it: kubectl reversi rollback {run_name} {n}")
        else:
            out.append(f"See every step with kubectl reversi plan {run_name} {n}; settle what blocks it, then "
                       f"kubectl reversi rollback {run_name} {n}")
        return out
    planned = _conditions(status).get("Planned") or {}
    if phase == "Pending" and planned.get("reason") == "RunNotFound":
        out.append(f"The operator waits for the Run: {planned.get('message', '')}")
        out.append(f"Check the name with kubectl get runs {n}, or delete this request: kubectl delete "
                   f"rollbackrequest {name} {n}")
        return out
    if phase in (None, "Pending"):
        out.append("The operator has not picked the request up yet: check that reversi-operator is running.")
        return out
    return None


def _next_steps_to_settle(report: Mapping[str, Any], phase: str | None, name: str, run_name: str,
                          n: str) -> list[str]:
    """Steps a person must settle: unresolved, denied, awaiting approval."""
    out: list[str] = []
    unresolved = report.get("unresolved") or []
    if unresolved:
        out.append(f"Settle unresolved step(s) {steps_text(unresolved)} (what did the call really do?), e.g.:")
        out.append(f"  kubectl reversi resolve {run_name} {unresolved[-1]} --status succeeded|failed "
                   f"[--result JSON] --note TEXT {n}")
        out.append(f"  then undo what they unblock: kubectl reversi rollback {run_name} {n}")
    denied = {int(d["step"]) for d in report.get("denied") or [] if isinstance(d, Mapping) and "step" in d}
    if denied:
        out.append(f"Step(s) {steps_text(sorted(denied))} were denied: they stay as they are (the residue says "
                   f"what remains); to undo them after all, start a new request and approve them: "
                   f"kubectl reversi rollback {run_name} {n}")
    awaiting = [s for s in report.get("awaitingApproval") or [] if s not in denied]
    if awaiting and phase not in TERMINAL_PHASES:
        out.append(f"Approve step(s) {steps_text(awaiting)}: kubectl reversi approve {name} "
                   + " ".join(f"--step {s}" for s in awaiting[:10]) + f" {n}  (or --all)")
    elif awaiting:
        out.append(f"Step(s) {steps_text(awaiting)} were never approved; start a new request and approve it: "
                   f"kubectl reversi rollback {run_name} --approve-compensations {n}")
    return out


def _next_steps_to_undo(report: Mapping[str, Any], ns: str, manifest: str, run_name: str, n: str) -> list[str]:
    """Steps left standing, and how each kind can still be undone or handled."""
    out: list[str] = []
    failed = report.get("failed") or []
    if failed:
        out.append(f"Fix what made step(s) {steps_text([f['step'] for f in failed])} fail (errors above), then re-run: "
                   f"kubectl reversi rollback {run_name} {n}  (same idempotency keys, compensated steps are skipped)")
    unverified = report.get("unverified") or []
    if unverified:
        out.append(f"Step(s) {steps_text(unverified)} were undone but not checked: add a reader runner to the "
                   f"tools' verification in ToolManifest {ns}/{manifest} so the next undo is checked.")
    deferred = report.get("deferred") or []
    if deferred:
        out.append(f"Deferred step(s) {steps_text([d['step'] for d in deferred])} are undone only after the steps "
                   "blocking them are undone or settled.")
    unrecoverable = report.get("unrecoverable") or []
    if unrecoverable:
        out.append(f"Step(s) {steps_text([u['step'] for u in unrecoverable])} cannot be undone by Reversi: "
                   "handle them by hand and tell the people affected.")
    unmanifested = report.get("unmanifested") or []
    if unmanifested:
        out.append(f"Step(s) {steps_text(unmanifested)} have no manifest entry: undo them by hand.")
    expired = report.get("expired") or []
    if expired:
        out.append(f"Step(s) {steps_text([e['step'] for e in expired])} are past their undo window "
                   "(compensation.windowSeconds): undo them by hand, or tell the people affected.")
    handlers = report.get("handlerUnavailable") or []
    if handlers:
        out.append(f"Step(s) {steps_text([h['step'] for h in handlers])} have no runner that can run: add it to "
                   f"spec.runners of ToolManifest {ns}/{manifest} (reasons above), then kubectl reversi rollback "
                   f"{run_name} {n}")
    unread = [x["step"] for x in report.get("conflict") or [] if "could not be read" in (x.get("reason") or "")]
    if unread:
        out.append(f"Step(s) {steps_text(unread)} were not undone: their precondition could not be read (errors "
                   f"above: often a right the runner lacks). Fix that, then re-run: kubectl reversi rollback "
                   f"{run_name} {n}")
    conflicts = [x for x in report.get("conflict") or [] if x["step"] not in unread]
    if conflicts:
        steps = [x["step"] for x in conflicts]
        out.append(f"Step(s) {steps_text(steps)} were not undone: their precondition no longer holds (someone "
                   "changed the state since). Check it; to undo anyway, a user with the RBAC verb force runs: "
                   f"kubectl reversi rollback {run_name} " + " ".join(f"--force {s}" for s in steps[:10]) + f" {n}")
    if report.get("compensationDeadlinePassed"):
        out.append(f"Step(s) {steps_text(report['compensationDeadlinePassed'])} did not start before "
                   f"spec.compensationDeadlineSeconds: re-run kubectl reversi rollback {run_name} {n} or undo by hand")
    return out


def _next_steps_left(report: Mapping[str, Any], phase: str | None, run_name: str, n: str) -> list[str]:
    """What a request that ended left to a new one: cancelled, child runs, pending."""
    out: list[str] = []
    cancelled = report.get("cancelled") or []
    if cancelled and phase in TERMINAL_PHASES:
        out.append(f"Step(s) {steps_text(cancelled)} were not started because the request was cancelled; a new "
                   f"request undoes them when you are ready: kubectl reversi rollback {run_name} {n}")
    for sec in (report.get("runs") or [])[1:]:  # nested runs: each child run's section (the first is this run's)
        if isinstance(sec, Mapping) and sec.get("outcome") in ("incomplete", "cancelled"):
            child = sec.get("request")
            out.append(f"Run {sec.get('run')} (a child run) is {sec.get('outcome')}"
                       + (f": kubectl reversi describe {child} {n}" if child else "")
                       + f"; a new request on {run_name} rolls back what is left")
    if report.get("pending") and phase in TERMINAL_PHASES:
        out.append(f"Step(s) {steps_text(report['pending'])} were not settled (deadline?): re-run "
                   f"kubectl reversi rollback {run_name} {n}")
    return out


def describe_request(request: Mapping[str, Any], run: Mapping[str, Any] | None, events: Sequence[Mapping[str, Any]],
                     now: dt.datetime, run_missing: str = "not found",
                     step_tools: Mapping[int, str] | None = None, wide: bool = False) -> str:
    """``kubectl reversi describe``: a report a person can read (Velero style). ``run_missing``
    says why ``run`` is ``None`` (``not found``, or e.g. ``not readable``); ``step_tools``: the
    tool of each step, from its RunStep, for steps the request's status does not name; ``wide``
    (``-o wide``): the steps table also shows each step's compensation tool and read-backs."""
    meta = request.get("metadata") or {}
    spec = request.get("spec") or {}
    status = request.get("status") or {}
    ns = meta.get("namespace", "default")
    run_name = (spec.get("runRef") or {}).get("name", "")
    tools = _tool_names(request, run, step_tools)
    conds = _conditions(status)
    lines = [
        f"Name:         {meta.get('name', '')}",
        f"Namespace:    {ns}",
        f"Run:          {run_name}" + ("" if run is not None else f"  ({run_missing})"),
        f"Dry run:      {'yes' if spec.get('dryRun') else 'no'}",
        f"Phase:        {status.get('phase') or 'Pending'}",
    ]
    run_spec = (run or {}).get("spec") or {}
    pin = run_spec.get("pinnedManifest")
    if isinstance(pin, dict):  # the manifest revision the run's steps are undone by
        lines.insert(3, f"Manifest:     {(run_spec.get('manifestRef') or {}).get('name', '')} revision "
                        f"{pin.get('revision')}, pinned when the run was opened")
    if status.get("progress"):
        report = status.get("report") or {}
        cancelled = report.get("cancelled") or []
        lines.append(f"Progress:     {status['progress']} compensations settled"
                     + (f"; {len(cancelled)} cancelled before they started" if cancelled else ""))
    approve = "all (approveCompensations" + (f", by {spec['approvedBy']})" if spec.get("approvedBy") else ")") \
        if spec.get("approveCompensations") else ""
    approvals = spec.get("approvals") or []
    if approvals:
        per = ", ".join(f"{a['step']}" + (f" by {a['approver']}" if a.get("approver") else "") for a in approvals)
        approve = (approve + "; " if approve else "") + f"steps {per}"
    lines.append(f"Approved:     {approve or 'none'}")
    lines.append(f"Retries:      {spec.get('retries', 3)}   Parallelism: {spec.get('parallelism', 1)}")
    created = meta.get("creationTimestamp")
    lines.append(f"Created:      {created or '<unknown>'} ({age(created, now)} ago)")
    lines.append(f"Started:      {status.get('startTime') or '-'}")
    lines.append(f"Completed:    {status.get('completionTime') or '-'}")
    report_now = status.get("report") or {}
    for item in report_now.get("foreign") or []:  # not the run's record: never undone
        lines.append(f"Not undone:   step {item.get('step')} is not part of the run's record: {item.get('reason')}")
    if report_now.get("missing"):
        lines.append(f"Missing:      no call was recorded at step(s) {', '.join(map(str, report_now['missing']))}")
    if status.get("runners") is not None:  # recorded at the lock: every Job of the request runs one of these
        used = ", ".join(f"{r.get('name')} ({r.get('image')})" for r in status["runners"]) or "none needed"
        lines.append(f"Runners:      {used}, as recorded at the lock (status.runners)")
    complete = conds.get("Complete") or {}
    if complete.get("message"):
        lines.append(f"Verdict:      {complete['message']}")
    lines += standing_lines(run)
    invalid = conds.get("Invalid") or {}
    if invalid.get("status") == "True":
        lines.append(f"Invalid:      {invalid.get('reason')}: {invalid.get('message')}")
    running = conds.get("Running") or {}
    if status.get("phase") == "Waiting" and running.get("message"):
        lines.append(f"Waiting:      {running['message']}")

    report = status.get("report")
    if status.get("phase") == "Planned" or (report is None and status.get("plan")):
        lines += _plan_lines(status.get("plan") or {}, run_name, ns)
    if report is not None:
        lines += _report_lines(report, tools)
    entries = status.get("steps") or []
    if entries and status.get("phase") not in ("Planned", "Failed"):
        lines += _step_lines(entries, tools, ((run or {}).get("metadata") or {}).get("uid"), meta, wide)
    lines += _next_step_lines(request, run)
    if events:
        lines += _event_lines(events, now)
    return "\n".join(lines)


def standing_lines(run: Mapping[str, Any] | None) -> list[str]:
    """``describe``'s lines on what stands on the run now (its ``status.standing``,
    docs/concepts.md#what-stands), the same whichever request is described, and on its
    acknowledgement: one that covers what stands now, or one that does not (it accepted an earlier
    rollback's residue), never mixed. Empty for a run no rollback has given a verdict."""
    if run is None:
        return []
    status = run.get("status") or {}
    standing = status.get("standing") if isinstance(status.get("standing"), Mapping) else None
    name = (run.get("metadata") or {}).get("name", "")
    rolled = next((c.get("status") for c in status.get("conditions") or []
                   if isinstance(c, Mapping) and c.get("type") == "RolledBack"), None)
    lines: list[str] = []
    if standing is not None:
        left = standing.get("request")
        whole = "rolled back in full" if rolled == "True" else sd.text(standing)
        if rolled == "False" and not (standing.get("failed") or standing.get("unverified")):
            whole += " (not rolled back in full: the residue says what else stays)"
        lines.append(f"Standing:     on Run {name} now: {whole}"
                     + (f", left by RollbackRequest {left}" if left and rolled != "True" and (
                         standing.get("failed") or standing.get("unverified")) else ""))
        listed = [s for s in standing.get("steps") or [] if isinstance(s, Mapping)]
        for s in listed[:BUCKET_LIMIT]:
            by = f" (RollbackRequest {s['request']})" if s.get("request") else ""
            lines.append(f"  step {s.get('step')}  {s.get('tool', '')}: {s.get('state')}{by}")
        more = (standing.get("failed") or 0) + (standing.get("unverified") or 0) - min(len(listed), BUCKET_LIMIT)
        if more > 0:
            lines.append(f"  ... and {more} more (their RunSteps: kubectl get runsteps -l reversi.dev/run={name})")
    ack = acknowledged(run)
    old = stale(run)
    if ack is not None:
        covers = "" if ack.legacy else f"; it covers what stands now (RollbackRequest {ack.request}'s residue)"
        lines.append(f"Residue:      {ack.text()}{covers} (kubectl reversi acknowledge --withdraw takes it back)")
    elif old is not None:
        why = ("the run is rolled back in full since" if rolled != "False" else
               f"RollbackRequest {residue_request(run)} left steps standing since")
        lines.append(f"Residue:      not acknowledged now: {old.text()} accepted RollbackRequest {old.request}'s "
                     f"residue, not what stands now ({why})")
    return lines


def _plan_lines(plan: Mapping[str, Any], run_name: str, ns: str) -> list[str]:
    """``describe``'s plan section: the actions that are not skips, at most BUCKET_LIMIT."""
    lines: list[str] = []
    lines.append("")
    verdict = "fully reversible" if plan.get("fullyReversible") else "NOT fully reversible"
    lines.append(f"Plan ({verdict}; skipped steps not listed):")
    actions = [a for a in plan.get("actions") or [] if a.get("kind") != SKIP]
    if actions:
        rows = [(a["step"], a.get("tool", ""), a.get("kind", ""), a.get("compensationTool") or "-",
                 ("blocked by " + steps_text(a["blockedBy"], 8)) if a.get("blockedBy") else a.get("reason", ""))
                for a in actions[:BUCKET_LIMIT]]
        lines += ["  " + line for line in
                  table(("STEP", "TOOL", "KIND", "COMPENSATION", "REASON / BLOCKED BY"), rows).splitlines()]
        if len(actions) > BUCKET_LIMIT:
            lines.append(f"  ... and {len(actions) - BUCKET_LIMIT} more: "
                         f"kubectl reversi plan {run_name} {ns_flag(ns)}")
    else:
        lines.append("  nothing to undo")
    if plan.get("omitted"):
        lines.append(f"  ({plan['omitted']} actions omitted from the status; "
                     f"kubectl reversi plan {run_name} shows all)")
    return lines


def _report_lines(report: Mapping[str, Any], tools: Mapping[int, str]) -> list[str]:
    """``describe``'s report section: each bucket with its steps, the skipped count, the residue and the runs."""
    lines: list[str] = []
    lines.append("")
    lines.append(f"Report ({'complete' if report.get('complete') else 'NOT complete'}):")
    unchecked = set(report.get("noReadBack") or [])
    for key, label in BUCKETS:
        items = report.get(key) or []
        if key == "compensated":  # the undos with no read-back declared are listed on their own
            items = [s for s in items if s not in unchecked]
        if items:
            lines.append(f" {label}: {len(items)}")
            notes: dict | None = None  # denied steps under awaitingApproval, forced ones under compensated
            if key == "awaitingApproval":
                notes = {d["step"]: d.get("reason", "") for d in report.get("denied") or []}
            elif key == "compensated":
                notes = {f["step"]: f.get("reason", "") for f in report.get("forced") or []}
            lines += _bucket_lines(key, items, tools, notes)
    lines.append(f" Skipped (nothing to undo): {len(report.get('skipped') or [])}")
    lines += residue_lines(report.get("residue") or [])
    lines += run_section_lines(report.get("runs") or [])
    return lines


def _step_lines(entries: Sequence[Mapping[str, Any]], tools: Mapping[Any, str], run_uid: str | None,
                meta: Mapping[str, Any], wide: bool = False) -> list[str]:
    """``describe``'s steps section: stage, attempts, Jobs and conditions of each step (``wide``:
    with its compensation tool and read-backs); ``meta``: the request's metadata."""
    lines: list[str] = []
    lines.append("")
    lines.append("Steps:")
    step_rows: list[list[Any]] = []
    for e in entries[:BUCKET_LIMIT]:
        error = f"  error: {e['lastError']}" if e.get("lastError") else ""
        row = [e.get("step"), e.get("tool") or tools.get(e.get("step"), ""), e.get("stage") or "pending",
               e.get("attempts", 0)]
        if wide:
            row += [e.get("compensationTool") or "-", e.get("reads", 0)]
        step_rows.append(row + [step_jobs(run_uid, e), condition_reasons(e) + error])
    headers = ["STEP", "TOOL", "STAGE", "ATTEMPTS"] + (["COMPENSATION", "READS"] if wide else []) + \
        ["JOBS", "CONDITIONS"]
    lines += ["  " + line for line in table(headers, step_rows).splitlines()]
    if run_uid:
        lines.append(f"  (a step's Job logs: kubectl reversi logs {meta.get('name', 'REQUEST')} --step N "
                     f"[--reader] {ns_flag(meta.get('namespace', 'default'))}, while the Job is kept)")
    if len(entries) > BUCKET_LIMIT:
        lines.append(f"  ... and {len(entries) - BUCKET_LIMIT} more")
    return lines


def _next_step_lines(request: Mapping[str, Any], run: Mapping[str, Any] | None) -> list[str]:
    """``describe``'s "What to do next" section (:func:`next_steps`, or why there is nothing)."""
    status = request.get("status") or {}
    lines: list[str] = []
    todo = next_steps(request, run)
    lines.append("")
    lines.append("What to do next:")
    if (status.get("report") or {}).get("complete") or status.get("phase") == "Planned":
        idle = ["  nothing: every standing step is undone and checked."]
    elif status.get("phase") not in TERMINAL_PHASES:
        idle = ["  nothing yet: the rollback is still working (describe it again to follow it)."]
    else:
        idle = ["  nothing more Reversi can do: read the report and the residue above."]
    lines += [f"  - {line}" if not line.startswith("  ") else f"    {line.strip()}" for line in todo] or idle
    return lines


def _event_lines(events: Sequence[Mapping[str, Any]], now: dt.datetime) -> list[str]:
    """``describe``'s events section: the last ten."""
    lines: list[str] = []
    lines.append("")
    lines.append("Events (newest last):")
    recent = [(age(e.get("time"), now), e.get("type", ""), e.get("reason", ""), e.get("message", ""))
              for e in list(events)[-10:]]
    lines += ["  " + line for line in table(("AGE", "TYPE", "REASON", "MESSAGE"), recent).splitlines()]
    return lines


def step_jobs(run_uid: str | None, entry: Mapping[str, Any]) -> str:
    """The Jobs of a step's last attempt, as ``describe`` lists them: its compensator and, when
    it read back, its last reader (``rv-3f2a...-4-c2, rv-3f2a...-4-c2-r1``); ``-`` before any
    attempt or without the Run (its uid names the Jobs)."""
    attempt = entry.get("attempts") or 0
    step = entry.get("step")
    if not run_uid or not attempt or not isinstance(step, int):
        return "-"
    jobs = [job_name(run_uid, step, attempt)]
    if entry.get("reads"):
        jobs.append(job_name(run_uid, step, attempt, "reader", entry["reads"]))
    return ", ".join(jobs)


# -------------------------------------------------------------------------------------- logs


#: The labels the Job controller puts on a Job's pods (the newer one first).
POD_JOB_LABELS = ("batch.kubernetes.io/job-name", "job-name")


def _number(labels: Mapping[str, str], key: str) -> int:
    try:
        return int(labels.get(key, "0"))
    except ValueError:
        return 0


def jobs_by_step(jobs: Iterable[Mapping[str, Any]], request_uid: str | None) -> dict[int, Mapping[str, Any]]:
    """``logs``: the Job to show for each step among ``jobs`` (Job metadata: ``name``,
    ``labels``, ``annotations``) of one role of one run, selected by their labels
    (``reversi.dev/step``, ``reversi.dev/attempt``, ``reversi.dev/read``,
    ``reversi.dev/request-uid``): the last attempt (then the last read-back) that the request
    ``request_uid`` started, else, for a step this request adopted or did not run, the run's last
    one (its ``reversi.dev/request`` annotation names who started it)."""
    best: dict[int, tuple[tuple[bool, int, int], Mapping[str, Any]]] = {}
    for job in jobs:
        labels = job.get("labels") or {}
        if not str(labels.get(LABEL_STEP, "")).isdigit():
            continue
        step = int(labels[LABEL_STEP])
        rank = (labels.get(LABEL_REQUEST_UID) == request_uid, _number(labels, LABEL_ATTEMPT),
                _number(labels, LABEL_READ))
        if step not in best or rank > best[step][0]:
            best[step] = (rank, job)
    return {step: job for step, (_, job) in best.items()}


def pod_of_job(pods: Iterable[Mapping[str, Any]], job: str) -> Mapping[str, Any] | None:
    """``logs``: the newest pod (metadata: ``name``, ``labels``, ``created``) of Job ``job``,
    by the labels the Job controller sets; ``None`` when it has none (yet, or any more)."""
    mine = [p for p in pods if any((p.get("labels") or {}).get(k) == job for k in POD_JOB_LABELS)]
    return max(mine, key=lambda p: (str(p.get("created") or ""), p.get("name", ""))) if mine else None


def logs_heading(step: int, tool: str | None, job: Mapping[str, Any] | None, request: str) -> str:
    """``logs``' line above a step's log: ``==> step 2 (payments.refund): Job rv-...-2-c1 <==``,
    naming the request that started the Job when it is not ``request``."""
    what = f"step {step}" + (f" ({tool})" if tool else "")
    if job is None:
        return f"==> {what} <=="
    started = (job.get("annotations") or {}).get(ANNOTATION_REQUEST)
    by = f", started by RollbackRequest {started}" if started and started != request else ""
    return f"==> {what}: Job {job.get('name')}{by} <=="


# ------------------------------------------------------------------------------------- halts


def scope_text(scope: Mapping[str, Any] | None) -> str:
    """``tool=payments.* actor=checkout-agent``; no scope: ``<every call>``. Every field named is
    shown as written (an empty pattern as ``tool=""``): a named field never reads as every call."""
    scope = {k: v for k, v in (scope or {}).items() if v is not None}
    order = [k for k in SCOPE_FIELDS if k in scope] + sorted(k for k in scope if k not in SCOPE_FIELDS)
    fields = [f"{k}={json.dumps(v)}" if not v or " " in v or v.startswith('"') else f"{k}={v}"
              for k, v in ((k, str(scope[k])) for k in order)]
    return " ".join(fields) if fields else "<every call>"


def halt_rows(halts: Iterable[Mapping[str, Any]], now: dt.datetime, all_namespaces: bool, wide: bool = False) -> str:
    """``halt list``: kind, (namespace), name, reason, scope, active, refused, by, age; ``wide``
    (``-o wide``) adds whether the API server refuses its calls yet (its ``InForce`` condition)
    and every condition as ``Type=Status``."""
    headers = ["KIND"] + (["NAMESPACE"] if all_namespaces else []) + \
        ["NAME", "REASON", "SCOPE", "ACTIVE", "REFUSED", "BY"] + (["IN-FORCE", "CONDITIONS"] if wide else []) + ["AGE"]
    rows = []
    for h in halts:
        meta, spec, status = h.get("metadata") or {}, h.get("spec") or {}, h.get("status") or {}
        kind = h.get("kind", "Halt")
        row = [kind]
        if all_namespaces:
            row.append(meta.get("namespace") or "*")
        active = status.get("active")
        row += [meta.get("name", ""), spec.get("reason", ""), scope_text(spec.get("scope")),
                "<unknown>" if active is None else str(bool(active)).lower(), status.get("refusedCalls", 0),
                spec.get("by") or "-"]
        if wide:
            conds = _conditions(status)
            row += [(conds.get("InForce") or {}).get("status") or "-",
                    ",".join(f"{c.get('type')}={c.get('status')}" for c in status.get("conditions") or []) or "-"]
        rows.append(row + [age(meta.get("creationTimestamp"), now)])
    return table(headers, rows)


def halt_notes(halts: Iterable[Mapping[str, Any]]) -> list[str]:
    """Lines under the ``halt list`` table for halts whose conditions need a look: ``Active`` False
    (a pattern that can never match) and ``MatchesNoTool`` True."""
    notes = []
    for h in halts:
        meta, status = h.get("metadata") or {}, h.get("status") or {}
        where = f"{h.get('kind', 'Halt')} " + (f"{meta['namespace']}/" if meta.get("namespace") else "") + \
            meta.get("name", "")
        for cond in status.get("conditions") or []:
            if (cond.get("type"), cond.get("status")) in (("Active", "False"), ("MatchesNoTool", "True")):
                notes.append(f"{where}: {cond.get('type')}={cond.get('status')} ({cond.get('reason')}): "
                             f"{cond.get('message', '')}")
    return notes


def kill_switch_text(halt: Mapping[str, Any] | None, now: dt.datetime) -> str:
    """``kill-switch status``."""
    if halt is None:
        return "kill switch: off"
    meta, spec, status = halt.get("metadata") or {}, halt.get("spec") or {}, halt.get("status") or {}
    by = f" by {spec['by']}" if spec.get("by") else ""
    return (f"kill switch: ON{by} for {age(meta.get('creationTimestamp'), now)}: {spec.get('reason', '')}\n"
            f"every new call in every namespace is refused ({status.get('refusedCalls', 0)} refused so far); "
            "rollbacks keep working. Turn it off with kubectl reversi kill-switch off")


def kill_switch_doc(halt: Mapping[str, Any] | None) -> dict[str, Any]:
    """``kill-switch status -o json|yaml``: ``{"on": false}``, or ``{"on": true, "reason", "by",
    "since" (RFC 3339), "refusedCalls"}`` from the kill switch's ClusterHalt."""
    if halt is None:
        return {"on": False}
    meta, spec, status = halt.get("metadata") or {}, halt.get("spec") or {}, halt.get("status") or {}
    return {"on": True, "reason": spec.get("reason", ""), "by": spec.get("by"),
            "since": meta.get("creationTimestamp"), "refusedCalls": status.get("refusedCalls", 0)}


# ------------------------------------------------------------------------------------ export


def _time_key(value: str | None) -> dt.datetime:
    return parse_time(value) or dt.datetime.min.replace(tzinfo=dt.UTC)


def export_records(run: Mapping[str, Any], steps: Iterable[Mapping[str, Any]], transitions: Iterable[Mapping[str, Any]],
                   with_snapshots: bool = False, inline: bool = True) -> Iterator[dict[str, Any]]:
    """``export``: one record per journal step, resolution, undo entry and undo transition.

    ``steps`` are the run's RunStep objects. Order: a ``run`` record, the steps (by index), the
    resolutions (each RunStep's ``spec.resolution``, with its ``step``), the undo state per step
    (each RunStep's ``status.undo``), then the transitions (Events on the run's RollbackRequests)
    in time order. Steps leave out their manifest entry unless ``with_snapshots``: a step's own
    ``snapshot``, else (a recorded call, which carries ``runAtOpen``) its tool's entry in the Run's
    pinned manifest, which is what the step is undone by (docs/concepts.md#the-journal). With
    ``inline`` (a Run of Reversi 0.1 whose inline journal, ``spec.steps``, the operator has not
    moved yet) the inline journal is exported the same way; a RunStep wins over an inline step of
    the same index (it is the moved copy).
    """
    meta, spec, status = run.get("metadata") or {}, run.get("spec") or {}, run.get("status") or {}
    inline_spec = spec if inline else {}
    inline_status = status if inline else {}
    calls: dict[int, dict[str, Any]] = {}
    snapshots: dict[int, Any] = {}
    resolutions: dict[int, dict[str, Any]] = {}
    undo: dict[int, dict[str, Any]] = {}
    shared = {s.get("id"): s for s in inline_spec.get("snapshots") or []}
    pinned = {t.get("name"): t for t in (spec.get("pinnedManifest") or {}).get("tools") or [] if isinstance(t, dict)}
    for step in inline_spec.get("steps") or []:  # inline journal (Reversi 0.1)
        calls[step["index"]] = {k: v for k, v in step.items() if k != "snapshot"}
        snap = step.get("snapshot")
        if snap is None and step.get("snapshotId") in shared:
            snap = {k: v for k, v in shared[step["snapshotId"]].items() if k != "id"}
        snapshots[step["index"]] = snap
    for res in inline_spec.get("resolutions") or []:
        resolutions[res["step"]] = dict(res)
    for entry in inline_status.get("undo") or []:
        undo[entry.get("step", 0)] = dict(entry)
    for obj in steps:
        step_spec = obj.get("spec") or {}
        index = step_spec["index"]  # required by the RunStep schema
        calls[index] = {k: v for k, v in step_spec.items() if k not in ("snapshot", "runRef", "resolution")}
        snapshots[index] = step_spec.get("snapshot") or (pinned.get(step_spec.get("tool"))
                                                          if step_spec.get("runAtOpen") else None)
        if step_spec.get("resolution"):
            resolutions[index] = {"step": index, **step_spec["resolution"]}
        if (obj.get("status") or {}).get("undo"):
            undo[index] = obj["status"]["undo"]
    yield {"type": "run", "namespace": meta.get("namespace"), "name": meta.get("name"), "uid": meta.get("uid"),
           "principal": spec.get("principal"), "mode": spec.get("mode"), "scope": spec.get("scope") or {},
           "manifestRef": spec.get("manifestRef"), "steps": len(calls), "createdAt": meta.get("creationTimestamp")}
    for index in sorted(calls):
        record = {"type": "step", **calls[index]}
        if with_snapshots:
            record["snapshot"] = snapshots.get(index)
        yield record
    for index in sorted(resolutions):
        yield {"type": "resolution", **resolutions[index]}
    for index in sorted(undo):
        yield {"type": "undo", **undo[index]}
    for t in sorted(transitions, key=lambda t: (_time_key(t.get("time")), t.get("request") or "")):
        yield {"type": "transition", "request": t.get("request"), "reason": t.get("reason"),
               "message": t.get("message"), "time": t.get("time")}


def json_line(record: Mapping[str, Any]) -> str:
    """One compact JSON line."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False, default=str)


# ------------------------------------------------------------------------------ archive


def archive_rows(runs: Sequence[Any], now: dt.datetime, all_namespaces: bool, wide: bool = False) -> str:
    """``archive list``: one row per archived Run (``reversi.adapters.archive.ArchivedRun``);
    ``wide`` (``-o wide``) adds how many of its steps were writes."""
    headers = (["NAMESPACE"] if all_namespaces else []) + ["NAME", "PRINCIPAL", "ACTOR", "STEPS"] + \
        (["WRITES"] if wide else []) + ["CREATED", "LAST-ACTIVITY", "ARCHIVED", "REASON", "UID"]
    rows = []
    for r in runs:
        row = ([r.namespace] if all_namespaces else []) + [r.name, r.principal or "-", r.actor or "-", str(r.steps)]
        row += ([str(r.writes)] if wide else []) + [
            _stamp(r.created_at), _stamp(r.last_activity), f"{age(_stamp(r.archived_at), now)} ago", r.deleted_reason,
            r.uid]
        rows.append(row)
    return table(headers, rows)


def archive_doc(run: Any) -> dict[str, Any]:
    """``archive list -o json|yaml``: one archived Run (``ArchivedRun``) with camelCase keys and
    RFC 3339 times (``null`` when unknown)."""
    def when(moment: dt.datetime | None) -> str | None:
        return _stamp(moment) if moment is not None else None

    return {"namespace": run.namespace, "name": run.name, "uid": run.uid, "principal": run.principal,
            "actor": run.actor, "steps": run.steps, "writes": run.writes, "createdAt": when(run.created_at),
            "lastActivity": when(run.last_activity), "archivedAt": when(run.archived_at),
            "deletedReason": run.deleted_reason}


def archived_run_doc(record: Any) -> dict[str, Any]:
    """``archive show -o json|yaml``: the archived Run (``reversi.engine.archive.Record``) whole:
    ``run``, ``steps`` (its RunSteps) and ``requests`` (its RollbackRequests) as the API served
    them, ``actions`` (who did what: ``{action, actor, at, step, request, note}``),
    ``deletedReason`` and ``lastActivity``."""
    return {
        "run": dict(record.run), "steps": [dict(s) for s in record.steps],
        "requests": [dict(r) for r in record.requests],
        "actions": [{"action": a.action, "actor": a.actor, "at": _stamp(a.at) if a.at else None, "step": a.step,
                     "request": a.request, "note": a.note} for a in record.actions],
        "deletedReason": record.reason,
        "lastActivity": _stamp(record.last_activity) if record.last_activity else None,
    }


def _stamp(moment: dt.datetime | None) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if moment is not None else "-"


#: ``deleted_reason`` -> who deleted the Run (reversi.engine.archive.EXPIRED, DELETED)
_DELETED_BY = {"expired": "by retention, its time to live passed", "deleted": "by a person or its namespace's deletion"}


def archived_run(record: Any, now: dt.datetime, wide: bool = False) -> str:
    """``archive show``: the archived Run (``reversi.engine.archive.Record``): who ran it, who did
    what, its steps, and the report of each of its RollbackRequests as ``describe`` printed it
    (without Events, which are not archived). ``wide`` (``-o wide``): the steps table also shows
    each step's dependencies and resolution, and the reports their wide steps tables."""
    cols = record.columns()
    lines = [
        f"Run:           {cols['namespace']}/{cols['name']}  (uid {cols['uid']})",
        f"Principal:     {cols['principal'] or '-'}",
        f"Scope:         {scope_text((record.run.get('spec') or {}).get('scope'))}",
        f"Created:       {_stamp(cols['created_at'])}",
        f"Last activity: {_stamp(cols['last_activity'])}",
        f"Deleted:       {cols['deleted_reason']} ({_DELETED_BY.get(cols['deleted_reason'], 'deleted')}; its record is "
        "this archive)",
        f"Steps:         {cols['steps']}",
        "",
        "Who did what:",
    ]
    for a in record.actions:
        what = f"{a.action}" + (f" step {a.step}" if a.step is not None else "") + (
            f" ({a.request})" if a.request else "") + (f": {a.note}" if a.note else "")
        lines.append(f"  {_stamp(a.at)}  {a.actor or '-'}  {what}")
    headers = ["STEP", "TOOL", "OUTCOME", "PRINCIPAL", "RECORDED"] + (["DEPENDS-ON", "RESOLUTION"] if wide else [])
    rows = []
    for s in record.steps:
        c, spec = step_columns(s), s.get("spec") or {}
        row = [str(c["index"]), c["tool"], c["outcome"] or "-", c["principal"] or "-", _stamp(c["recorded_at"])]
        if wide:
            row += [steps_text(spec.get("dependsOn") or [], 8) or "-",
                    (spec.get("resolution") or {}).get("status") or "-"]
        rows.append(row)
    lines += ["", "Steps:", table(headers, rows)]
    for request in record.requests:
        lines += ["", f"--- RollbackRequest {(request.get('metadata') or {}).get('name')} ---",
                  describe_request(request, record.run, [], now, wide=wide)]
    if not record.requests:
        lines += ["", "No RollbackRequest named this run."]
    return "\n".join(lines)


