"""The engine on contradictory or noisy input: a resolution that contradicts the recorded outcome
(rule 7), a re-run of an undone step (rule 6), a reader's answer among log lines (rule 5)."""

from __future__ import annotations

import pytest

from reversi.engine import build_plan, parse_answer
from reversi.models.run import RunSpec

SNAP = {"name": "payments.create_charge", "effect": "write",
        "compensation": {"tool": "payments.refund", "kind": "compensation", "args": {"id": "$result.id"},
                         "runner": "cli", "residue": ["stays on the statement"]}}


def _spec(outcome, resolution):
    return RunSpec.model_validate({"manifestRef": {"name": "m"}, "steps": [
        {"index": 0, "tool": "payments.create_charge", "args": {}, "result": {"id": "ch_1"}, "outcome": outcome,
         "snapshot": SNAP}], "resolutions": [resolution]})


def test_rule7_an_outcome_that_contradicts_the_resolution_is_unresolved():
    plan = build_plan(_spec("succeeded", {"step": 0, "status": "failed", "note": "no charge seen", "actor": "oncall"}),
                      run_id="u")
    action = plan.actions[0]
    assert action.kind == "unresolved" and "conflict" in action.reason and plan.fully_reversible is False


def test_rule7_an_outcome_that_agrees_with_the_resolution_is_planned_normally():
    plan = build_plan(_spec("succeeded", {"step": 0, "status": "succeeded", "note": "seen", "actor": "oncall"}),
                      run_id="u")
    assert plan.actions[0].kind == "compensate"


def test_rule6_an_already_compensated_step_keeps_its_residue():
    from reversi.models.run import StepUndo

    spec = RunSpec.model_validate({"manifestRef": {"name": "m"}, "steps": [
        {"index": 0, "tool": "payments.create_charge", "args": {}, "result": {"id": "ch_1"}, "outcome": "succeeded",
         "snapshot": SNAP}]})
    undo = [StepUndo(step=0, state="compensated", attempts=1, idempotency_key="a" * 64, verification="verified")]
    action = build_plan(spec, undo, run_id="u").actions[0]
    assert action.kind == "skip" and action.residue == ["stays on the statement"]


def test_rule5_the_answer_may_follow_log_lines():
    assert parse_answer('starting\nreading ch_1\n{"refunded": true}\n') == {"refunded": True}


def test_rule5_no_json_at_all_is_a_failed_read_that_does_not_echo_the_output():
    with pytest.raises(ValueError) as err:
        parse_answer("password=hunter2\nnot json")
    assert "hunter2" not in str(err.value) and "printed no JSON" in str(err.value)
