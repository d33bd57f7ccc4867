"""Rules 1 and 8 at run time: order, parallelism, approval, final deferral."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reversi.engine import (
    AWAITING_APPROVAL,
    BLOCKING_KINDS,
    COMPENSATED,
    DEFERRED,
    FAILED,
    PENDING,
    RUNNING,
    StepOutcome,
    build_graph,
    build_plan,
    build_report,
    deferred_steps,
    initial_progress,
    is_finished,
    progress_text,
    ready_steps,
)
from reversi_testkit import RUN_ID, run_spec, step, tool

W = tool("w")
CHARGE = tool("charge")
CAPTURE = tool("capture", requires=["charge"])
NEEDS_OK = tool("ok", approval=True)


def setup(steps, **kw):
    spec = run_spec(steps, **kw)
    graph = build_graph(spec)
    plan = build_plan(spec, run_id=RUN_ID, graph=graph)
    return plan, graph


def test_rule1_independent_steps_start_newest_first():
    plan, graph = setup([step(i, W) for i in range(4)])
    assert ready_steps(plan, graph, initial_progress(plan), parallelism=1) == [3]
    assert ready_steps(plan, graph, initial_progress(plan), parallelism=3) == [3, 2, 1]


@pytest.mark.parametrize("dependent_state", [PENDING, RUNNING, FAILED, AWAITING_APPROVAL])
def test_rule1_step_never_starts_while_a_dependent_is_not_compensated(dependent_state):
    plan, graph = setup([step(0, CHARGE), step(1, CAPTURE)])
    progress = {0: PENDING, 1: dependent_state}
    ready = ready_steps(plan, graph, progress, parallelism=8)
    assert 0 not in ready
    progress[1] = COMPENSATED
    assert ready_steps(plan, graph, progress, parallelism=8) == [0]


def test_parallelism_caps_running_compensations():
    plan, graph = setup([step(i, W) for i in range(6)])
    progress = initial_progress(plan)
    progress[5] = RUNNING
    progress[4] = RUNNING
    assert ready_steps(plan, graph, progress, parallelism=3) == [3]
    assert ready_steps(plan, graph, progress, parallelism=2) == []
    with pytest.raises(ValueError):
        ready_steps(plan, graph, progress, parallelism=0)


def test_a_step_being_read_back_holds_no_parallelism_slot():
    # 5 and 4 are running, but only 5's compensation is under way (4's undo is done: its
    # read-back runs): at parallelism 2 one more compensation may start
    plan, graph = setup([step(i, W) for i in range(6)])
    progress = initial_progress(plan)
    progress[5] = RUNNING
    progress[4] = RUNNING
    assert ready_steps(plan, graph, progress, parallelism=2, holding={5}) == [3]
    assert ready_steps(plan, graph, progress, parallelism=2, holding={5, 4}) == []
    assert ready_steps(plan, graph, progress, parallelism=2) == []  # default: every running step holds one
    # the order still holds: a step whose dependent is being read back does not start
    plan, graph = setup([step(0, CHARGE), step(1, CAPTURE)])
    assert ready_steps(plan, graph, {0: PENDING, 1: RUNNING}, parallelism=2, holding=set()) == []


def test_rule8_compensation_needing_approval_waits_until_approved():
    plan, graph = setup([step(0, W), step(1, NEEDS_OK)])
    assert initial_progress(plan) == {0: PENDING, 1: AWAITING_APPROVAL}
    assert initial_progress(plan, approved=[1])[1] == PENDING
    assert initial_progress(plan, approve_all=True)[1] == PENDING
    # the unapproved step is not started, the independent one is
    assert ready_steps(plan, graph, initial_progress(plan), parallelism=2) == [0]


def test_rule1_dependent_whose_compensation_failed_defers_the_step_at_the_end():
    plan, graph = setup([step(0, CHARGE), step(1, W), step(2, CAPTURE)])
    progress = {0: PENDING, 1: COMPENSATED, 2: FAILED}
    assert ready_steps(plan, graph, progress, parallelism=1) == []
    assert is_finished(plan, graph, progress)
    assert deferred_steps(plan, graph, progress) == {0: [2]}


def test_rule1_not_finished_while_something_runs_or_can_start():
    plan, graph = setup([step(0, CHARGE), step(1, CAPTURE)])
    assert not is_finished(plan, graph, {0: PENDING, 1: PENDING})
    assert not is_finished(plan, graph, {0: PENDING, 1: RUNNING})
    assert is_finished(plan, graph, {0: COMPENSATED, 1: COMPENSATED})


def test_progress_counts_compensated_of_compensate_and_defer_actions():
    plan, _graph = setup([step(0, CHARGE), step(1, CAPTURE, "uncertain"), step(2, W), step(3, W)])
    assert [a.kind for a in plan.actions] == ["defer", "unresolved", "compensate", "compensate"]
    assert progress_text(plan, {2: COMPENSATED, 3: RUNNING}) == "1/3"


def test_unknown_progress_state_is_refused():
    plan, graph = setup([step(0, W)])
    with pytest.raises(ValueError, match="unknown progress state"):
        ready_steps(plan, graph, {0: "done"}, parallelism=1)


# ----------------------------------------------------------------------------- properties

TOOLS = ["a", "b", "c", "d"]


@st.composite
def random_runs(draw):
    """A random run: tools a..d with random requires among them, random outcomes and dependsOn."""
    requires = {name: draw(st.lists(st.sampled_from(TOOLS), max_size=2, unique=True)) for name in TOOLS}
    effects = {name: draw(st.sampled_from(["write", "write", "write", "read", "irreversible"])) for name in TOOLS}
    entries = {name: tool(name, effects[name], requires=requires[name]) for name in TOOLS}
    n = draw(st.integers(min_value=1, max_value=18))
    steps = []
    for i in range(n):
        name = draw(st.sampled_from(TOOLS))
        outcome = draw(st.sampled_from(["succeeded", "succeeded", "succeeded", "failed", "uncertain", "intended"]))
        deps = draw(st.lists(st.integers(min_value=0, max_value=i - 1), max_size=3, unique=True)) if i else []
        manifested = draw(st.booleans()) or draw(st.booleans())
        steps.append(step(i, entries[name] if manifested else None, outcome, tool_name=name, depends_on=deps))
    spec = run_spec(steps, mode="observe")
    graph = build_graph(spec)
    plan = build_plan(spec, run_id=RUN_ID, graph=graph)
    return spec, graph, plan


def unsettled(plan, progress, t):
    kind = plan.actions[t].kind
    if kind == "compensate":
        return progress.get(t, PENDING) != COMPENSATED
    return kind in BLOCKING_KINDS


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), run=random_runs())
def test_property_no_step_starts_while_a_standing_dependent_remains(data, run):
    _spec, graph, plan = run
    parallelism = data.draw(st.integers(min_value=1, max_value=4))
    approve_all = data.draw(st.booleans())
    progress = initial_progress(plan, approve_all=approve_all)
    outcomes = {}
    for _ in range(4 * len(plan.actions) + 4):
        ready = ready_steps(plan, graph, progress, parallelism)
        running = [s for s, state in progress.items() if state == RUNNING]
        assert len(running) + len(ready) <= parallelism
        assert ready == sorted(ready, reverse=True)
        for s in ready:
            # brute force over all pairs: no dependent of s is unsettled
            for t in graph.dependents(s):
                assert not unsettled(plan, progress, t), (s, t, progress)
            progress[s] = RUNNING
        running = [s for s, state in progress.items() if state == RUNNING]
        if not running:
            break
        finish = data.draw(st.sampled_from(running))
        result = data.draw(st.sampled_from([COMPENSATED, COMPENSATED, FAILED]))
        progress[finish] = result
        outcomes[finish] = StepOutcome(result, verification="verified" if result == COMPENSATED else None, error="boom")
    assert is_finished(plan, graph, progress)
    for s, blockers in deferred_steps(plan, graph, progress).items():
        assert blockers and all(unsettled(plan, progress, b) for b in blockers)
        assert all(graph.depends(b, s) for b in blockers)
        outcomes[s] = StepOutcome(DEFERRED, blocked_by=tuple(blockers))
    for s, state in progress.items():
        if state == AWAITING_APPROVAL:
            outcomes[s] = StepOutcome(AWAITING_APPROVAL)
    report = build_report(plan, outcomes)
    assert report.pending == []  # at the end every step is settled somewhere
    placed = (
        report.compensated + report.skipped + report.unresolved + report.unmanifested + report.awaiting_approval
        + report.unverified + [f.step for f in report.failed] + [u.step for u in report.unrecoverable]
        + [d.step for d in report.deferred]
    )
    assert sorted(placed) == list(range(len(plan.actions)))  # every step in exactly one bucket
