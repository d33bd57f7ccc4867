"""Models: the example objects round-trip; bad input is refused with clear messages."""

from __future__ import annotations

from datetime import datetime, UTC

import pytest
from pydantic import ValidationError

from reversi import conditions as cond
from reversi.models import (
    ClusterHalt,
    Halt,
    HaltScope,
    RollbackRequest,
    RollbackRequestSpec,
    Run,
    RunSpec,
    ToolManifest,
    ToolManifestSpec,
    ToolSpec,
)
from reversi_testkit import example_documents, example_run_dict

KINDS = {"ToolManifest": ToolManifest, "Run": Run, "RollbackRequest": RollbackRequest, "ClusterHalt": ClusterHalt}


def _subset(small, big):
    """Every key of ``small`` is in ``big`` with the same value (defaults may be added)."""
    if isinstance(small, dict):
        return isinstance(big, dict) and all(k in big and _subset(v, big[k]) for k, v in small.items())
    if isinstance(small, list):
        return isinstance(big, list) and len(small) == len(big) and all(
            _subset(a, b) for a, b in zip(small, big, strict=True))
    return small == big


@pytest.mark.parametrize("index", range(4))
def test_design_examples_round_trip(index):
    doc = example_documents()[index]
    model = KINDS[doc["kind"]].model_validate(doc)
    wire = model.to_wire()
    assert _subset(doc, wire), wire
    assert KINDS[doc["kind"]].model_validate(wire) == model


def test_run_with_snapshots_round_trips_and_snake_case_is_accepted():
    run = Run.model_validate(example_run_dict())
    assert run.spec.steps[1].snapshot.compensation.tool == "payments.refund"
    assert run.spec.manifest_ref.name == "payments"
    again = RunSpec(manifest_ref={"name": "payments"}, steps=[], mode="observe")
    assert again.to_wire() == {"mode": "observe", "recovery": "bestEffort", "scope": {},
                               "manifestRef": {"name": "payments"}, "steps": [], "snapshots": [], "resolutions": []}


def test_defaults_of_a_rollback_request():
    spec = RollbackRequestSpec.model_validate({"runRef": {"name": "r"}})
    assert (spec.dry_run, spec.approve_compensations, spec.retries, spec.parallelism) == (False, False, 3, 1)
    assert (spec.backoff.base_ms, spec.backoff.max_ms) == (200, 5000)


def _error(model, data):
    with pytest.raises(ValidationError) as err:
        model.model_validate(data)
    return str(err.value)


def test_write_tool_without_compensation_is_refused():
    message = _error(ToolSpec, {"name": "db.insert", "effect": "write"})
    assert "db.insert: a write tool needs a compensation" in message


def test_compensation_runner_must_name_a_runner_of_the_manifest():
    manifest = example_documents()[0]["spec"]
    manifest["tools"][1]["compensation"]["runner"] = "payments-cli2"
    message = _error(ToolManifestSpec, manifest)
    assert "payments.create_charge: compensation.runner 'payments-cli2' is not in spec.runners" in message


def test_verification_runner_must_name_a_runner_of_the_manifest():
    manifest = example_documents()[0]["spec"]
    manifest["tools"][1]["verification"]["runner"] = "reader"
    assert "verification.runner 'reader' is not in spec.runners" in _error(ToolManifestSpec, manifest)


def test_duplicate_tool_names_are_refused():
    manifest = example_documents()[0]["spec"]
    manifest["tools"].append({"name": "payments.get_customer", "effect": "read"})
    assert "tool 'payments.get_customer' is listed twice" in _error(ToolManifestSpec, manifest)


def test_unknown_fields_are_refused_in_specs():
    manifest = example_documents()[0]["spec"]
    manifest["tools"][0]["efect"] = "read"
    assert "efect" in _error(ToolManifestSpec, manifest)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"retries": 11}, "retries"),
        ({"retries": 0}, "retries"),
        ({"parallelism": 0}, "parallelism"),
        ({"parallelism": 33}, "parallelism"),
        ({"backoff": {"baseMs": 900, "maxMs": 100}}, "backoff.maxMs (100) must be at least backoff.baseMs (900)"),
        ({"runRef": {"name": ""}}, "runRef.name"),
    ],
)
def test_bad_rollback_request_is_refused(change, field):
    spec = {"runRef": {"name": "r"}, **change}
    assert field in _error(RollbackRequestSpec, spec)


def test_bad_steps_and_resolutions_are_refused():
    run = example_run_dict()["spec"]
    bad = dict(run, steps=[dict(run["steps"][0], outcome="done")])
    assert "outcome" in _error(RunSpec, bad)
    bad = dict(run, resolutions=[{"step": 2, "status": "succeeded", "note": ""}])
    assert "note" in _error(RunSpec, bad)
    bad = dict(run,
               resolutions=[{"step": 2, "status": "failed", "note": "a"}, {"step": 2, "status": "failed", "note": "b"}])
    assert "step 2 has two resolutions" in _error(RunSpec, bad)
    bad = dict(run, mode="record")
    assert "mode" in _error(RunSpec, bad)


def test_step_takes_an_inline_snapshot_or_a_snapshot_id_not_both():
    run = example_run_dict()["spec"]
    bad = dict(run, steps=[dict(run["steps"][1], snapshotId="abc")])
    assert "set snapshot or snapshotId, not both" in _error(RunSpec, bad)


def test_status_models_ignore_unknown_fields():
    from reversi.models import RunStatus

    status = RunStatus.model_validate({"kopf": {"progress": {}}, "activeRequest": "undo-1"})
    assert status.active_request == "undo-1"


def test_halt_scope_matches_every_field_named():
    halt = ClusterHalt.model_validate(example_documents()[3])
    scope = halt.spec.scope
    assert scope.matches(tool="payments.create_charge", actor="checkout-agent", tenant="acme")
    assert not scope.matches(tool="email.send", actor="checkout-agent")
    assert not scope.matches(tool="payments.refund", actor="other-agent")
    assert not scope.matches(tool="payments.refund")  # actor named but unknown: no match
    assert HaltScope().matches(tool="anything")
    assert Halt.model_validate({"spec": {"reason": "stop"}}).spec.scope is None
    assert "reason" in _error(Halt, {"spec": {"by": "me"}})


# ---------------------------------------------------------------------------------- conditions

T0 = datetime(2025, 1, 1, tzinfo=UTC)
T1 = datetime(2025, 1, 2, tzinfo=UTC)


def test_condition_builds_the_wire_shape():
    made = cond.condition(cond.COMPLETE, False, cond.INCOMPLETE, "step 3 could not be undone", observed_generation=2,
                          now=T0)
    assert made == {
        "type": "Complete",
        "status": "False",
        "reason": "Incomplete",
        "message": "step 3 could not be undone",
        "lastTransitionTime": "2025-01-01T00:00:00Z",
        "observedGeneration": 2,
    }


def test_condition_refuses_unknown_types_reasons_and_statuses():
    with pytest.raises(ValueError, match="unknown condition reason"):
        cond.condition(cond.COMPLETE, cond.TRUE, "AllGood")
    with pytest.raises(ValueError, match="unknown condition type"):
        cond.condition("Done", cond.TRUE, cond.ALL_COMPENSATED)
    with pytest.raises(ValueError, match="True, False or Unknown"):
        cond.condition(cond.COMPLETE, "yes", cond.ALL_COMPENSATED)


def test_reasons_are_camel_case():
    for reason in cond.REASONS | cond.TYPES:
        assert reason[0].isupper() and reason.isalnum(), reason


def test_set_condition_keeps_transition_time_while_status_holds():
    first = cond.set_condition([], cond.condition(cond.RUNNING, cond.TRUE, cond.IN_PROGRESS, "1/3", now=T0))
    second = cond.set_condition(first, cond.condition(cond.RUNNING, cond.TRUE, cond.IN_PROGRESS, "2/3", now=T1))
    assert second[0]["lastTransitionTime"] == "2025-01-01T00:00:00Z"
    assert second[0]["message"] == "2/3"
    third = cond.set_condition(second, cond.condition(cond.RUNNING, cond.FALSE, cond.FINISHED, "3/3", now=T1))
    assert third[0]["lastTransitionTime"] == "2025-01-02T00:00:00Z"
    both = cond.set_condition(third, cond.condition(cond.COMPLETE, cond.TRUE, cond.ALL_COMPENSATED, now=T1))
    assert [x["type"] for x in both] == ["Running", "Complete"]
    assert cond.is_true(both, cond.COMPLETE) and not cond.is_true(both, cond.RUNNING)
    assert first[0]["message"] == "1/3"  # inputs are not modified
