"""Rules 1, 2, 6, 7 (docs/concepts.md#rollback-rules) and the example run, on the pure planner."""

from __future__ import annotations

import pytest

from reversi.engine import (
    AWAITING_APPROVAL,
    COMPENSATED,
    PENDING,
    RUNNING,
    InvalidRun,
    build_graph,
    build_plan,
    compensation_key,
    initial_progress,
    ready_steps,
)
from reversi.models import RunSpec, RunStatus, StepUndo
from reversi_testkit import RUN_ID, example_run_dict, example_run_spec, run_spec, step, tool


def kinds(plan):
    return {a.step: a.kind for a in plan.actions}


# -------------------------------------------------------------------------- the example run


def test_design_example_plan():
    plan = build_plan(example_run_spec(), run_id=RUN_ID)
    assert kinds(plan) == {0: "skip", 1: "defer", 2: "unresolved", 3: "unrecoverable"}
    assert plan.action(1).blocked_by == [2]
    assert "the customer has read the email" in plan.action(3).reason
    assert plan.action(3).residue == ["the customer has read the email"]
    assert plan.fully_reversible is False


def test_design_example_after_resolution_step2_is_compensated_before_step1():
    spec = example_run_spec(
        resolutions=[{"step": 2, "status": "succeeded", "result": {"id": "cap_1"}, "note": "seen in the dashboard"}]
    )
    graph = build_graph(spec)
    plan = build_plan(spec, run_id=RUN_ID, graph=graph)
    assert kinds(plan) == {0: "skip", 1: "compensate", 2: "compensate", 3: "unrecoverable"}
    capture = plan.action(2)
    assert capture.compensation_tool == "payments.void_capture"
    assert capture.args == {"capture_id": "cap_1"}
    assert capture.needs_approval is True
    # not approved yet: step 2 awaits approval and step 1 waits behind it
    progress = initial_progress(plan)
    assert progress == {1: PENDING, 2: AWAITING_APPROVAL}
    assert ready_steps(plan, graph, progress, parallelism=4) == []
    # approved: step 2 first, step 1 only after step 2 is compensated
    progress = initial_progress(plan, approved=[2])
    assert ready_steps(plan, graph, progress, parallelism=4) == [2]
    progress[2] = RUNNING
    assert ready_steps(plan, graph, progress, parallelism=4) == []
    progress[2] = COMPENSATED
    assert ready_steps(plan, graph, progress, parallelism=4) == [1]


def test_design_example_irreversible_dependent_defers_step1_for_good():
    run = example_run_dict()
    run["spec"]["steps"][3]["dependsOn"] = [1]
    plan = build_plan(RunSpec.model_validate(run["spec"]), run_id=RUN_ID)
    assert plan.action(1).kind == "defer" and plan.action(1).blocked_by == [2, 3]
    # settling step 2 does not help: the irreversible step 3 stands forever
    run["spec"]["resolutions"] = [{"step": 2, "status": "succeeded", "result": {"id": "cap_1"}, "note": "n"}]
    plan = build_plan(RunSpec.model_validate(run["spec"]), run_id=RUN_ID)
    assert plan.action(2).kind == "compensate"
    assert plan.action(1).kind == "defer" and plan.action(1).blocked_by == [3]


# ------------------------------------------------------------------------------------ rule 2

WRITE = tool("db.insert", residue=["an audit row remains"])
READ = tool("db.select", "read")
IDEMPOTENT = tool("db.upsert", "idempotent")
MAIL = tool("mail.send", "irreversible", residue=["the mail was read"])


def test_rule2_read_and_idempotent_steps_are_skipped():
    plan = build_plan(run_spec([step(0, READ), step(1, IDEMPOTENT)]), run_id=RUN_ID)
    assert kinds(plan) == {0: "skip", 1: "skip"}
    assert plan.fully_reversible is True


def test_rule2_failed_outcome_is_skipped_even_for_irreversible_tools():
    plan = build_plan(run_spec([step(0, WRITE, "failed"), step(1, MAIL, "failed")]), run_id=RUN_ID)
    assert kinds(plan) == {0: "skip", 1: "skip"}
    assert "outcome failed" in plan.action(0).reason
    assert plan.fully_reversible is True


def test_rule2_irreversible_step_is_unrecoverable_and_states_its_residue():
    plan = build_plan(run_spec([step(0, MAIL)]), run_id=RUN_ID)
    action = plan.action(0)
    assert action.kind == "unrecoverable"
    assert action.residue == ["the mail was read"]
    assert "irreversible" in action.reason and "the mail was read" in action.reason
    assert plan.fully_reversible is False


def test_rule2_missing_compensation_argument_makes_step_unrecoverable():
    entry = tool("vm.create", comp_args={"vm": "$result.vm.id", "zone": "$args.zone"})
    plan = build_plan(run_spec([step(0, entry, args={"zone": "z1"}, result={"name": "x"})]), run_id=RUN_ID)
    action = plan.action(0)
    assert action.kind == "unrecoverable"
    assert "$result.vm.id" in action.reason
    assert action.args is None


def test_rule2_intended_and_uncertain_steps_are_unresolved():
    plan = build_plan(run_spec([step(0, WRITE, "intended"), step(1, WRITE, "uncertain")]), run_id=RUN_ID)
    assert kinds(plan) == {0: "unresolved", 1: "unresolved"}
    assert "resolution" in plan.action(1).reason
    assert plan.fully_reversible is False


def test_rule2_step_without_manifest_entry_is_unmanifested():
    plan = build_plan(run_spec([step(0, None, tool_name="shell.exec")], mode="observe"), run_id=RUN_ID)
    assert kinds(plan) == {0: "unmanifested"}
    assert plan.fully_reversible is False


def test_rule2_compensate_action_shows_tool_args_key_approval_residue_kind_and_check():
    entry = tool("db.insert", comp_args={"id": "$result.id", "table": "$args.table", "hard": True}, residue=["r1"],
                 approval=True)
    plan = build_plan(run_spec([step(0, entry, args={"table": "t"}, result={"id": 7})]), run_id=RUN_ID)
    action = plan.action(0)
    assert action.kind == "compensate"
    assert action.compensation_tool == "undo-db.insert"
    assert action.compensation_kind == "inverse"
    assert action.runner == "cli"
    assert action.args == {"id": 7, "table": "t", "hard": True}
    assert action.idempotency_key == compensation_key(RUN_ID, 0, "undo-db.insert")
    assert action.needs_approval is True
    assert action.residue == ["r1"]
    assert action.verified is True


def test_rule2_no_reader_runner_means_the_undo_will_not_be_verified():
    no_reader = tool("a", reader=False)
    no_check = tool("b", verify=False)
    plan = build_plan(run_spec([step(0, no_reader), step(1, no_check)]), run_id=RUN_ID)
    assert [a.verified for a in plan.actions] == [False, False]
    assert "unverified" in plan.action(0).reason


def test_rule2_residue_does_not_make_a_run_less_than_fully_reversible():
    plan = build_plan(run_spec([step(0, READ), step(1, WRITE)]), run_id=RUN_ID)
    assert plan.action(1).residue == ["an audit row remains"]
    assert plan.fully_reversible is True


def test_rule2_one_action_per_step_in_step_order():
    spec = run_spec([step(i, WRITE) for i in range(5)])
    plan = build_plan(spec, run_id=RUN_ID)
    assert [a.step for a in plan.actions] == [0, 1, 2, 3, 4]


# ------------------------------------------------------------------------------------ rule 1

CHARGE = tool("charge")
CAPTURE = tool("capture", requires=["charge"])


def test_rule1_step_is_deferred_while_dependent_stands():
    plan = build_plan(run_spec([step(0, CHARGE), step(1, CAPTURE, "uncertain")]), run_id=RUN_ID)
    assert kinds(plan) == {0: "defer", 1: "unresolved"}
    assert plan.action(0).blocked_by == [1]
    assert "1 (unresolved)" in plan.action(0).reason


def test_rule1_dependent_that_will_be_compensated_is_an_ordering_constraint_not_a_blocker():
    plan = build_plan(run_spec([step(0, CHARGE), step(1, CAPTURE)]), run_id=RUN_ID)
    assert kinds(plan) == {0: "compensate", 1: "compensate"}
    assert plan.fully_reversible is True


def test_rule1_requires_applies_to_every_earlier_step_of_the_required_tool_only():
    spec = run_spec([step(0, CHARGE), step(1, CHARGE), step(2, CAPTURE, "uncertain"), step(3, CHARGE)])
    plan = build_plan(spec, run_id=RUN_ID)
    assert kinds(plan) == {0: "defer", 1: "defer", 2: "unresolved", 3: "compensate"}


def test_rule1_depends_on_blocks_like_requires():
    spec = run_spec([step(0, WRITE), step(1, MAIL, depends_on=[0])])
    plan = build_plan(spec, run_id=RUN_ID)
    assert plan.action(0).kind == "defer" and plan.action(0).blocked_by == [1]


def test_rule1_deferral_is_transitive():
    spec = run_spec([step(0, WRITE), step(1, WRITE, depends_on=[0]), step(2, WRITE, "uncertain", depends_on=[1])])
    plan = build_plan(spec, run_id=RUN_ID)
    assert kinds(plan) == {0: "defer", 1: "defer", 2: "unresolved"}
    assert plan.action(0).blocked_by == [1]
    assert plan.action(1).blocked_by == [2]


def test_rule1_everything_independent_is_still_undone():
    spec = run_spec([step(0, WRITE), step(1, CHARGE), step(2, CAPTURE, "intended"), step(3, WRITE)])
    plan = build_plan(spec, run_id=RUN_ID)
    assert kinds(plan) == {0: "compensate", 1: "defer", 2: "unresolved", 3: "compensate"}


def test_rule1_skipped_and_failed_dependents_do_not_block():
    reader = tool("get", "read", requires=["charge"])
    spec = run_spec([step(0, CHARGE), step(1, reader), step(2, CAPTURE, "failed")])
    plan = build_plan(spec, run_id=RUN_ID)
    assert kinds(plan) == {0: "compensate", 1: "skip", 2: "skip"}


def test_rule1_unmanifested_dependent_blocks():
    spec = run_spec([step(0, WRITE), step(1, None, tool_name="x", depends_on=[0])], mode="observe")
    plan = build_plan(spec, run_id=RUN_ID)
    assert plan.action(0).kind == "defer" and plan.action(0).blocked_by == [1]


def test_rule1_broken_dependencies_are_refused_with_the_step_named():
    with pytest.raises(InvalidRun, match=r"step 1 .* depends on itself"):
        build_plan(run_spec([step(0, WRITE), step(1, WRITE, depends_on=[1])]), run_id=RUN_ID)
    with pytest.raises(InvalidRun, match=r"step 0 .* later step 1"):
        build_plan(run_spec([step(0, WRITE, depends_on=[1]), step(1, WRITE)]), run_id=RUN_ID)


# ------------------------------------------------------------------------------------ rule 6


def _undo(step_index, state, verification=None, attempts=1):
    return StepUndo(
        step=step_index,
        state=state,
        attempts=attempts,
        idempotency_key=compensation_key(RUN_ID, step_index, "undo-db.insert"),
        verification=verification,
        request="undo-1",
    )


def test_rule6_compensated_steps_are_skipped():
    spec = run_spec([step(0, WRITE), step(1, WRITE)])
    plan = build_plan(spec, RunStatus(undo=[_undo(1, "compensated", "verified")]), run_id=RUN_ID)
    assert kinds(plan) == {0: "compensate", 1: "skip"}
    assert "already compensated" in plan.action(1).reason


def test_rule6_failed_compensation_is_planned_again_with_the_same_key():
    spec = run_spec([step(0, WRITE)])
    first = build_plan(spec, run_id=RUN_ID)
    again = build_plan(spec, [_undo(0, "compensationFailed", attempts=3)], run_id=RUN_ID)
    assert again.action(0).kind == "compensate"
    assert again.action(0).idempotency_key == first.action(0).idempotency_key
    assert "retrying" in again.action(0).reason


def test_rule6_compensated_dependent_no_longer_blocks():
    spec = run_spec([step(0, CHARGE), step(1, CAPTURE)])
    plan = build_plan(spec, {1: _undo(1, "compensated", "verified")}, run_id=RUN_ID)
    assert kinds(plan) == {0: "compensate", 1: "skip"}


# ------------------------------------------------------------------------------------ rule 7


def test_rule7_resolution_with_result_makes_an_uncertain_step_compensable():
    spec = run_spec(
        [step(0, WRITE, "uncertain")],
        resolutions=[{"step": 0, "status": "succeeded", "result": {"id": "row-9"}, "note": "found it", "actor": "bob"}],
    )
    action = build_plan(spec, run_id=RUN_ID).action(0)
    assert action.kind == "compensate"
    assert action.args == {"id": "row-9"}
    assert "resolved as succeeded by bob" in action.reason


def test_rule7_resolution_without_result_leaves_result_arguments_missing():
    spec = run_spec([step(0, WRITE, "uncertain")], resolutions=[{"step": 0, "status": "succeeded", "note": "it ran"}])
    action = build_plan(spec, run_id=RUN_ID).action(0)
    assert action.kind == "unrecoverable"
    assert "$result.id" in action.reason and "no result" in action.reason


def test_rule7_resolution_as_failed_skips_the_step_and_unblocks_its_dependencies():
    spec = run_spec(
        [step(0, CHARGE), step(1, CAPTURE, "uncertain")],
        resolutions=[{"step": 1, "status": "failed", "note": "declined upstream"}],
    )
    plan = build_plan(spec, run_id=RUN_ID)
    assert kinds(plan) == {0: "compensate", 1: "skip"}
    assert "declined upstream" in plan.action(1).reason
    assert plan.fully_reversible is True


def test_rule7_resolution_for_a_missing_step_is_refused():
    spec = run_spec([step(0, WRITE)], resolutions=[{"step": 4, "status": "failed", "note": "n"}])
    with pytest.raises(InvalidRun, match="step 4"):
        build_plan(spec, run_id=RUN_ID)


# ------------------------------------------------------------------------ shared snapshots


def _shared(spec_dict):
    """The same run with each distinct snapshot stored once in spec.snapshots."""
    from reversi.engine import snapshot_id

    shared = {}
    for entry in spec_dict["steps"]:
        snap = entry.pop("snapshot", None)
        if snap is not None:
            sid = snapshot_id(snap)
            shared[sid] = dict(snap, id=sid)
            entry["snapshotId"] = sid
    spec_dict["snapshots"] = list(shared.values())
    return RunSpec.model_validate(spec_dict)


def test_shared_snapshots_plan_exactly_like_inline_snapshots():
    inline = example_run_dict()["spec"]
    shared = _shared(example_run_dict()["spec"])
    assert len(shared.snapshots) == 4
    assert build_plan(shared, run_id=RUN_ID) == build_plan(RunSpec.model_validate(inline), run_id=RUN_ID)


def test_snapshot_id_that_is_not_in_spec_snapshots_is_refused():
    spec = _shared(example_run_dict()["spec"]).model_copy(update={"snapshots": []})
    with pytest.raises(InvalidRun, match=r"step 0 \(payments.get_customer\) names snapshot '[0-9a-f]{16}', "
                                         r"which is not in spec.snapshots"):
        build_plan(spec, run_id=RUN_ID)


def test_compact_plan_drops_skips_first_then_the_oldest_and_counts_them():
    from reversi.engine import build_report, compact_plan

    read = tool("get", "read")
    spec = run_spec([step(0, read), step(1, WRITE), step(2, read), step(3, WRITE), step(4, WRITE)])
    plan = build_plan(spec, run_id=RUN_ID)
    assert compact_plan(plan, 10) is plan
    small = compact_plan(plan, 3)
    assert [a.step for a in small.actions] == [1, 3, 4] and small.omitted == 2
    smaller = compact_plan(plan, 2)
    assert [a.step for a in smaller.actions] == [3, 4] and smaller.omitted == 3
    assert smaller.action(4).kind == "compensate"
    with pytest.raises(KeyError):
        smaller.action(1)
    assert smaller.to_wire()["omitted"] == 3
    with pytest.raises(ValueError, match="full plan"):
        build_report(smaller)


def test_rule2_plan_says_verified_only_when_the_reader_runner_exists_now():
    spec = run_spec([step(0, tool("a"))])
    assert build_plan(spec, run_id=RUN_ID).action(0).verified is True
    assert build_plan(spec, run_id=RUN_ID, runner_names=[]).action(0).verified is False
    assert "not defined in the ToolManifest" in build_plan(spec, run_id=RUN_ID, runner_names=[]).action(0).reason


def test_planning_pauses_the_cyclic_collector_and_restores_it_as_it_found_it():
    import gc
    import threading

    from reversi.engine.gcpause import no_cyclic_gc

    seen: list[bool] = []
    assert gc.isenabled()
    with no_cyclic_gc():
        seen.append(gc.isenabled())
        with no_cyclic_gc():  # nested
            seen.append(gc.isenabled())
        seen.append(gc.isenabled())  # the inner pause ended, the outer still holds
    assert seen == [False, False, False] and gc.isenabled()

    # overlapping pauses in two threads: the collector resumes only when the last one ends
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with no_cyclic_gc():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with no_cyclic_gc():
        pass
    assert not gc.isenabled()  # the other thread's pause still holds
    release.set()
    t.join(10)
    assert gc.isenabled()

    gc.disable()  # a collector someone else disabled stays disabled
    try:
        with no_cyclic_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_each_action_has_its_own_lists():
    # actions are shallow copies of one blank action: their list fields must not be shared
    plan = build_plan(example_run_spec(), None, run_id=RUN_ID)
    first, second = plan.actions[0], plan.actions[1]
    assert first.blocked_by is not second.blocked_by and first.residue is not second.residue
    first.blocked_by.append(99)
    first.residue.append("x")
    assert 99 not in second.blocked_by and "x" not in second.residue
    assert build_plan(example_run_spec(), None, run_id=RUN_ID).actions[0].blocked_by == []
