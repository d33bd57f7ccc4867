"""``kubectl reversi`` views: pure formatting of plans, reports, progress, halts and exports."""

from __future__ import annotations

import datetime as dt
import json

from reversi.cli import views
from reversi.engine import build_plan
from reversi.engine.keys import compensation_key
from reversi.models import RunStatus

from reversi_testkit import RUN_ID, example_run_dict, example_run_spec, run_spec, snapshot, step, tool

NOW = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def _example_plan(**changes):
    return build_plan(example_run_spec(**changes), None, run_id=RUN_ID)


# ------------------------------------------------------------------------------------ plan


def test_plan_doc_has_exactly_the_camel_case_fields_the_api_gives_a_plan():
    data = views.plan_doc(_example_plan(), run_id=RUN_ID)
    assert set(data) == {"runId", "fullyReversible", "actions"}
    assert data["runId"] == RUN_ID
    assert data["fullyReversible"] is False
    for action in data["actions"]:
        assert set(action) == {"step", "tool", "kind", "compensationTool", "args", "idempotencyKey",
                               "needsApproval", "residue", "compensationKind", "verified", "blockedBy", "reason"}
    json.dumps(data)  # plain JSON


def test_plan_doc_actions_are_named_as_the_operators_status_plan_names_them():
    """The same plan, as a RollbackRequest's status.plan.actions (the model dumped with its
    aliases), has the same keys and values for every field the plugin prints."""
    plan = _example_plan()
    theirs = plan.model_dump(by_alias=True, mode="json")["actions"]
    for mine, status in zip(views.plan_doc(plan)["actions"], theirs, strict=True):
        assert mine == {k: status[k] for k in mine}


def test_plan_doc_carries_the_design_example_verdicts():
    by_step = {a["step"]: a for a in views.plan_doc(_example_plan())["actions"]}
    assert [by_step[i]["kind"] for i in range(4)] == ["skip", "defer", "unresolved", "unrecoverable"]
    assert by_step[1]["blockedBy"] == [2]
    assert by_step[1]["compensationTool"] == "payments.refund"
    assert by_step[1]["args"] == {"charge_id": "ch_o9", "amount": 700}
    assert by_step[1]["idempotencyKey"] == compensation_key(RUN_ID, 1, "payments.refund")
    assert by_step[3]["residue"] == ["the customer has read the email"]


def test_plan_table_has_a_row_per_step_and_names_blockers_with_their_kind():
    text = views.plan_table(_example_plan())
    lines = text.splitlines()
    assert lines[0].split() == ["STEP", "TOOL", "KIND", "COMPENSATION", "APPROVAL", "VERIFIED", "REASON", "/",
                                "BLOCKED", "BY"]
    assert len(lines) == 5
    row1 = next(line for line in lines if line.startswith("1 "))
    assert "defer" in row1 and "payments.refund" in row1 and "blocked by 2 (unresolved)" in row1
    row3 = next(line for line in lines if line.startswith("3 "))
    assert "unrecoverable" in row3 and "the customer has read the email" in row3


def test_plan_verdict_not_fully_reversible_lists_blockers_and_the_resolve_command():
    text = views.plan_verdict(_example_plan(), "order-4711", "shop")
    assert "NOT fully reversible" in text
    assert "1 unrecoverable (3)" in text and "1 unresolved (2)" in text and "1 deferred (1)" in text
    assert "kubectl reversi resolve order-4711 2 --status succeeded|failed" in text and "-n shop" in text


def test_plan_verdict_fully_reversible_names_approval_and_residue():
    plan = _example_plan(resolutions=[{"step": 2, "status": "succeeded", "result": {"id": "cap_1"}, "note": "seen"}],
                         steps=example_run_dict()["spec"]["steps"][:3])
    assert plan.fully_reversible
    text = views.plan_verdict(plan, "order-4711", "shop")
    assert text.startswith("Verdict: fully reversible")
    assert "approval needed for step(s) 2" in text
    assert "step 1: the charge stays visible on the customer's statement" in text


# -------------------------------------------------------------------------------- describe


def _request(status: dict, **spec) -> dict:
    return {"apiVersion": "reversi.dev/v1alpha1", "kind": "RollbackRequest",
            "metadata": {"name": "undo-1", "namespace": "shop", "uid": "u1",
                         "creationTimestamp": "2025-01-02T03:00:00Z"},
            "spec": {"runRef": {"name": "order-9"}, **spec}, "status": status}


INCOMPLETE = {
    "phase": "Incomplete", "progress": "1/3", "startTime": "2025-01-02T03:00:01Z",
    "completionTime": "2025-01-02T03:01:00Z",
    "conditions": [{"type": "Complete", "status": "False", "reason": "Incomplete",
                    "message": "incomplete: 1 compensated",
                    "lastTransitionTime": "2025-01-02T03:01:00Z"}],
    "report": {"compensated": [4], "unverified": [5], "failed": [{"step": 6, "error": "refund failed: 502"}],
               "unrecoverable": [{"step": 3, "reason": "irreversible: the customer has read the email"}],
               "unresolved": [2], "unmanifested": [7], "deferred": [{"step": 1, "blockedBy": [2]}],
               "awaitingApproval": [], "pending": [], "skipped": [0],
               "residue": [{"step": 4, "residue": ["stays on the statement"]}], "complete": False},
    "steps": [{"step": 6, "tool": "payments.create_charge", "compensationTool": "payments.refund", "stage": "failed",
               "attempts": 3, "lastError": "refund failed: 502",
               "conditions": [{"type": "Compensated", "status": "False", "reason": "CompensationFailed"}]}],
}


def test_describe_lists_every_bucket_with_tools_errors_reasons_and_residue():
    run = {"spec": {"manifestRef": {"name": "payments"}}}
    assert views.steps_without_tool(_request(INCOMPLETE)) == [1, 2, 3, 4, 5, 7]
    text = views.describe_request(_request(INCOMPLETE), run, [], NOW, step_tools={i: f"tool{i}" for i in range(8)})
    assert "Phase:        Incomplete" in text and "Progress:     1/3" in text
    assert "Completed:    2025-01-02T03:01:00Z" in text
    assert "Compensated (undone and checked by a reader): 1\n  step 4  tool4" in text
    assert "Unverified (undone, NOT checked: no reader ran): 1\n  step 5  tool5" in text
    assert "step 6  tool6: refund failed: 502" in text
    assert "step 3  tool3: irreversible: the customer has read the email" in text
    assert "Unresolved" in text and "step 2  tool2" in text
    assert "Unmanifested" in text and "step 7  tool7" in text
    assert "step 1  tool1: blocked by 2" in text
    assert "Skipped (nothing to undo): 1" in text
    assert "step 4: stays on the statement" in text
    assert "Awaiting approval" not in text and "Pending (not settled yet)" not in text


def test_describe_groups_typed_residue_by_type_and_reads_the_old_shape_as_declared():
    typed = json.loads(json.dumps(INCOMPLETE))
    typed["report"]["cancelled"] = [8]
    typed["report"]["residue"] = [
        {"step": 4, "type": "declared", "text": "stays on the statement"},
        {"step": 6, "type": "failed", "text": "the undo of tool6 failed, so its effect may remain: 502"},
        {"step": 8, "type": "notAttempted", "text": "tool8 was not undone: the request was cancelled"},
        {"step": 2, "type": "unknown", "text": "the outcome of tool2 is uncertain"},
        {"step": 3, "type": "notAttempted", "text": "tool3 was not undone: irreversible"},
    ]
    text = views.describe_request(_request(typed), {"spec": {}}, [], NOW, step_tools={i: f"tool{i}" for i in range(9)})
    assert "Cancelled (not started: the request was cancelled): 1\n  step 8  tool8" in text
    section = text[text.index("Residue (what the rollback leaves behind), by type:"):]
    assert section.index("declared (") < section.index("failed (") < section.index("not attempted (") \
        < section.index("unknown (")
    assert "not attempted (not undone: the effect remains): 2\n    step 8: tool8 was not undone" in section
    assert views.residue_entries([{"step": 4, "residue": ["a", "b"]}]) == [
        {"step": 4, "type": "declared", "text": "a"}, {"step": 4, "type": "declared", "text": "b"}]
    doc = views.report_doc(_request(typed))
    assert doc["cancelled"] == [8] and doc["residue"][1]["type"] == "failed"


def test_describe_names_tools_of_a_run_of_0_1_not_moved_yet_and_without_the_journal_what_status_says():
    inline = {"spec": {"manifestRef": {"name": "payments"},
                       "steps": [{"index": i, "tool": f"tool{i}"} for i in range(8)]}}
    assert "step 4  tool4" in views.describe_request(_request(INCOMPLETE), inline, [], NOW)
    text = views.describe_request(_request(INCOMPLETE), None, [], NOW, run_missing="not readable")
    assert "step 6  payments.create_charge: refund failed: 502" in text and "\n  step 4\n" in text


def test_steps_without_tool_is_empty_when_the_status_names_every_step_shown():
    req = _request({"phase": "Succeeded", "report": {"compensated": [0], "skipped": [1], "complete": True},
                    "plan": {"fullyReversible": True, "actions": [{"step": 0, "tool": "a", "kind": "compensate"}]}})
    assert views.steps_without_tool(req) == []


def test_describe_says_what_to_do_next_for_each_kind_of_trouble():
    run = {"spec": {"manifestRef": {"name": "payments"}, "steps": []}}
    text = views.describe_request(_request(INCOMPLETE), run, [], NOW)
    todo = text.split("What to do next:")[1]
    assert "kubectl reversi resolve order-9 2 --status succeeded|failed [--result JSON] --note TEXT -n shop" in todo
    assert "kubectl reversi rollback order-9 -n shop" in todo  # re-run after fixing the failure
    assert "add a reader runner" in todo and "ToolManifest shop/payments" in todo
    assert "cannot be undone by Reversi" in todo


def test_describe_of_a_request_awaiting_approval_gives_the_approve_command():
    status = {"phase": "AwaitingApproval", "progress": "1/2",
              "report": {"compensated": [0], "awaitingApproval": [1], "complete": False},
              "steps": [{"step": 1, "tool": "payments.capture", "stage": "awaitingApproval", "attempts": 0}]}
    req = _request(status)
    text = views.describe_request(req, None, [], NOW)
    assert "Awaiting approval: 1" in text
    assert "kubectl reversi approve undo-1 --step 1 -n shop" in text
    assert "Run:          order-9  (not found)" in text
    hint = views.approval_hint(req)
    assert "kubectl reversi approve undo-1 --step 1 -n shop" in hint and "--all" in hint


def test_describe_of_a_dry_run_shows_the_plan_and_of_a_complete_one_nothing_to_do():
    planned = {"phase": "Planned", "plan": {"fullyReversible": False, "actions": [
        {"step": 0, "tool": "a", "kind": "skip"},
        {"step": 1, "tool": "b", "kind": "defer", "compensationTool": "undo-b", "blockedBy": [2]},
        {"step": 2, "tool": "c", "kind": "unresolved", "reason": "outcome uncertain"}]}}
    text = views.describe_request(_request(planned, dryRun=True), None, [], NOW)
    assert "Dry run:      yes" in text and "Plan (NOT fully reversible" in text
    assert "blocked by 2" in text and "outcome uncertain" in text
    assert "\n  0  " not in text  # skips are not listed
    done = {"phase": "Succeeded", "report": {"compensated": [0], "complete": True}}
    text = views.describe_request(_request(done), None, [], NOW)
    assert "Report (complete)" in text and "nothing: every standing step is undone and checked." in text


def test_describe_of_an_invalid_request_quotes_the_fix():
    failed = {"phase": "Failed", "conditions": [
        {"type": "Invalid", "status": "True", "reason": "RunNotFound",
         "message": "RollbackRequest shop/undo-1: Run shop/order-9 not found; create the Run or fix spec.runRef.name"}]}
    text = views.describe_request(_request(failed), None, [], NOW)
    assert "Invalid:      RunNotFound:" in text
    assert "create the Run or fix spec.runRef.name" in text.split("What to do next:")[1]


def test_describe_shows_the_last_events():
    events = [{"time": "2025-01-02T03:04:00Z", "type": "Normal", "reason": f"R{i}", "message": f"m{i}"}
              for i in range(12)]
    text = views.describe_request(_request(INCOMPLETE), None, events, NOW)
    assert "R11" in text and "R2" in text and "R1 " not in text  # the newest ten
    assert "5s" in text


# -------------------------------------------------------------------------------- progress


def test_progress_line_and_key():
    entry = {"step": 1, "tool": "payments.capture", "compensationTool": "payments.void_capture", "stage": "retrying",
             "attempts": 2, "lastError": "boom",
             "conditions": [{"type": "Approved", "status": "True", "reason": "ApprovedByUser"},
                            {"type": "Compensated", "status": "Unknown", "reason": "CompensationRetrying"}]}
    line = views.progress_line(entry)
    assert line.startswith("step 1  payments.capture -> payments.void_capture  retrying  attempts=2")
    assert "Approved=ApprovedByUser Compensated=CompensationRetrying" in line and line.endswith("error: boom")
    assert views.progress_key(entry) != views.progress_key({**entry, "attempts": 3})
    assert views.progress_key(entry) == views.progress_key(dict(entry))


def test_phase_line_says_why_a_request_waits():
    req = _request({"phase": "Waiting", "conditions": [
        {"type": "Running", "status": "False", "reason": "WaitingForRun",
         "message": "RollbackRequest shop/a is working"}]})
    assert views.phase_line(req) == "phase Waiting  (RollbackRequest shop/a is working)"
    assert views.phase_line(_request({})) == "phase Pending"


def test_final_exit_codes():
    assert views.FINAL_EXIT == {"Succeeded": 0, "Planned": 0, "Incomplete": 2, "Failed": 2}


# ----------------------------------------------------------------------------------- halts


def test_age_is_kubectl_style():
    assert views.age("2025-01-02T03:04:00Z", NOW) == "5s"
    assert views.age("2025-01-02T02:54:05Z", NOW) == "10m"
    assert views.age("2025-01-01T00:04:05Z", NOW) == "27h"
    assert views.age("2024-12-01T03:04:05Z", NOW) == "32d"
    assert views.age(None, NOW) == "<unknown>"


def test_halt_rows_show_scope_active_refused_and_age():
    halts = [{"kind": "ClusterHalt", "metadata": {"name": "dup", "creationTimestamp": "2025-01-02T03:00:05Z"},
              "spec": {"reason": "duplicate charges", "by": "oncall",
                       "scope": {"namespace": "shop-*", "tool": "payments.*"}},
              "status": {"active": True, "refusedCalls": 3}},
             {"kind": "Halt",
              "metadata": {"name": "all", "namespace": "shop", "creationTimestamp": "2025-01-02T03:04:00Z"},
              "spec": {"reason": "stop"}}]
    text = views.halt_rows(halts, NOW, all_namespaces=True)
    lines = text.splitlines()
    assert lines[0].split() == ["KIND", "NAMESPACE", "NAME", "REASON", "SCOPE", "ACTIVE", "REFUSED", "BY", "AGE"]
    assert lines[1].split()[:3] == ["ClusterHalt", "*", "dup"]
    assert "tool=payments.* namespace=shop-*" in lines[1] and "true" in lines[1] and lines[1].endswith("4m")
    assert "<every call>" in lines[2] and "<unknown>" in lines[2] and lines[2].endswith("5s")
    assert "NAMESPACE" not in views.halt_rows(halts, NOW, all_namespaces=False)


def test_kill_switch_text():
    assert views.kill_switch_text(None, NOW) == "kill switch: off"
    on = {"metadata": {"creationTimestamp": "2025-01-02T03:04:00Z"}, "spec": {"reason": "incident 7", "by": "alice"}}
    text = views.kill_switch_text(on, NOW)
    assert text.startswith("kill switch: ON by alice for 5s: incident 7")


# ---------------------------------------------------------------------------------- export


def _runstep(spec: dict, resolution: dict | None = None, undo: dict | None = None) -> dict:
    obj = {"metadata": {"name": f"r-{spec['index']:05d}"},
           "spec": {**spec, "runRef": {"name": "r"}, **({"resolution": resolution} if resolution else {})}}
    if undo:
        obj["status"] = {"undo": undo}
    return obj


def test_export_records_order_and_snapshots():
    charge = snapshot(tool("pay.charge"))
    steps = [_runstep(step(1, charge, "uncertain"), resolution={"status": "failed", "note": "n", "actor": "alice"}),
             _runstep(step(0, charge), undo={"step": 0, "state": "compensated", "attempts": 1, "idempotencyKey": "k"})]
    run = {"metadata": {"name": "r", "namespace": "shop", "uid": "u"},
           "spec": {"principal": "agent", "mode": "enforce", "manifestRef": {"name": "m"}}}
    transitions = [{"request": "b", "reason": "RollbackComplete", "message": "done", "time": "2025-01-02T03:00:09Z"},
                   {"request": "a", "reason": "RunnersRecorded", "message": "go", "time": "2025-01-02T03:00:01.5Z"}]
    records = list(views.export_records(run, steps, transitions))
    assert [r["type"] for r in records] == ["run", "step", "step", "resolution", "undo", "transition", "transition"]
    assert records[0]["principal"] == "agent" and records[0]["steps"] == 2
    assert [r["index"] for r in records[1:3]] == [0, 1]
    assert records[1] == {"type": "step", **{k: v for k, v in step(0, charge).items() if k != "snapshot"}}
    assert "runRef" not in records[2] and "resolution" not in records[2]
    assert records[3] == {"type": "resolution", "step": 1, "status": "failed", "note": "n", "actor": "alice"}
    assert records[4] == {"type": "undo", "step": 0, "state": "compensated", "attempts": 1, "idempotencyKey": "k"}
    assert [r["reason"] for r in records[5:]] == ["RunnersRecorded", "RollbackComplete"]
    assert set(records[5]) == {"type", "request", "reason", "message", "time"}
    full = list(views.export_records(run, steps, [], with_snapshots=True))
    assert full[1]["snapshot"]["name"] == full[2]["snapshot"]["name"] == "pay.charge"
    line = views.json_line(records[1])
    assert "\n" not in line and json.loads(line) == records[1]


def test_export_gives_a_recorded_call_its_tool_entry_in_the_runs_pinned_manifest():
    """A recorded call carries no snapshot: it is undone by its tool's entry in the Run's pinned
    manifest (docs/concepts.md#the-journal), which --with-snapshots exports; a step with a
    snapshot of its own keeps it, and one of a tool the pin lacks (observe mode) has none."""
    charge, capture = snapshot(tool("pay.charge")), snapshot(tool("pay.capture"))
    at_open = {"uid": "u", "mode": "observe", "manifestRevision": 3}
    recorded = [{k: v for k, v in step(i, charge).items() if k != "snapshot"} | {"runAtOpen": at_open}
                for i in (0, 1)]
    recorded[1]["tool"] = "pay.unknown"
    older = step(2, {**capture, "residue": ["kept from when it was recorded"]})
    run = {"metadata": {"name": "r", "namespace": "shop", "uid": "u"},
           "spec": {"principal": "agent", "mode": "observe", "manifestRef": {"name": "m"},
                    "pinnedManifest": {"revision": 3, "tools": [charge, capture]}}}
    full = list(views.export_records(run, [_runstep(s) for s in (*recorded, older)], [], with_snapshots=True))
    assert [r.get("snapshot") for r in full[1:]] == [charge, None, older["snapshot"]]
    assert all("snapshot" not in r for r in views.export_records(run, [_runstep(s) for s in recorded], []))


def test_export_of_a_run_of_0_1_not_moved_yet_reads_its_inline_journal():
    charge = snapshot(tool("pay.charge"))
    steps = [step(0, charge), step(1, charge, "uncertain")]
    steps[1].pop("snapshot")
    steps[1]["snapshotId"] = "abc"
    run = {"metadata": {"name": "r", "namespace": "shop", "uid": "u"},
           "spec": {"principal": "agent", "mode": "enforce", "manifestRef": {"name": "m"}, "steps": steps,
                    "snapshots": [{"id": "abc", **charge}],
                    "resolutions": [{"step": 1, "status": "failed", "note": "n", "actor": "alice"}]},
           "status": {"undo": [{"step": 0, "state": "compensated", "attempts": 1, "idempotencyKey": "k"}]}}
    records = list(views.export_records(run, [], []))
    assert [r["type"] for r in records] == ["run", "step", "step", "resolution", "undo"]
    assert "snapshot" not in records[1] and records[2]["snapshotId"] == "abc"
    assert records[3] == {"type": "resolution", "step": 1, "status": "failed", "note": "n", "actor": "alice"}
    full = list(views.export_records(run, [], [], with_snapshots=True))
    assert full[2]["snapshot"]["name"] == "pay.charge" and "id" not in full[2]["snapshot"]
    moved = list(views.export_records(run, [_runstep(step(0, charge), undo={"step": 0, "state": "compensating",
                                                                               "attempts": 2, "idempotencyKey": "k"})],
                                      []))
    assert moved[0]["steps"] == 2 and next(r for r in moved if r["type"] == "undo")["state"] == "compensating"
    done = list(views.export_records(run, [_runstep(step(0, charge))], [], inline=False))  # moved: RunSteps only
    assert [r["type"] for r in done] == ["run", "step"] and done[0]["steps"] == 1


def test_export_with_no_steps_has_only_the_run_record():
    run = {"metadata": {"name": "r"}, "spec": {}}
    assert [r["type"] for r in views.export_records(run, [], [])] == ["run"]


def test_plan_of_an_undone_run_skips_what_is_compensated():
    charge = snapshot(tool("pay.charge"))
    spec = run_spec([step(0, charge)])
    key = compensation_key(RUN_ID, 0, "undo-pay.charge")
    status = RunStatus.model_validate({"undo": [{"step": 0, "state": "compensated", "attempts": 1,
                                                 "idempotencyKey": key, "verification": "verified"}]})
    data = views.plan_doc(build_plan(spec, status, run_id=RUN_ID))
    assert data["fullyReversible"] is True
    assert data["actions"][0]["kind"] == "skip" and "already compensated" in data["actions"][0]["reason"]


def test_report_doc_uses_the_api_field_names_of_status_report():
    request = {"metadata": {"name": "undo", "namespace": "shop"},
               "spec": {"runRef": {"name": "r"}},
               "status": {"phase": "Incomplete", "report": {
                   "compensated": [4], "noReadBack": [4], "unverified": [5],
                   "failed": [{"step": 6, "error": "refund failed: 502"}],
                   "deferred": [{"step": 1, "blockedBy": [2]}], "awaitingApproval": [3], "complete": False}}}
    data = views.report_doc(request)
    for name in ("compensated", "skipped", "failed", "unrecoverable", "unresolved", "unmanifested", "deferred",
                 "awaitingApproval", "unverified", "complete"):
        assert name in data
    assert data["deferred"] == [{"step": 1, "blockedBy": [2]}]
    assert data["awaitingApproval"] == [3] and data["noReadBack"] == [4] and data["complete"] is False
    assert data["request"] == "shop/undo" and data["run"] == "shop/r" and data["phase"] == "Incomplete"
    assert data["dryRun"] is False and not any("_" in key for key in data)
    json.dumps(data)


def test_describe_says_undone_no_read_back_declared_apart_from_checked_undos():
    status = {"phase": "Succeeded", "report": {"compensated": [1, 2], "noReadBack": [2], "complete": True}}
    text = views.describe_request(_request(status), None, [], NOW, step_tools={1: "tool1", 2: "tool2"})
    assert "Compensated (undone and checked by a reader): 1\n  step 1  tool1" in text
    assert "step 2  tool2: undone, no read-back declared" in text
    assert "step 2  tool2\n" not in text.split("no read-back declared (")[0]


def test_describe_after_a_cancel_counts_the_steps_it_cancelled():
    """A cancelled request's progress names the steps it never started (a new user read "3/5
    compensations settled" as two left in flight)."""
    cancelled = {"phase": "Incomplete", "progress": "3/5", "report": {"compensated": [2, 3, 4], "cancelled": [0, 1]}}
    text = views.describe_request(_request(cancelled), None, [], NOW)
    assert "Progress:     3/5 compensations settled; 2 cancelled before they started" in text
    assert "cancelled before" not in views.describe_request(_request(INCOMPLETE), None, [], NOW)
