"""Nested runs (rule 17): the order of a tree's rollback (children as units, newest first
inside each run, ordered by the parent step index at which each child was opened), the floor that
holds a parent's earlier steps back, and the ancestry checks of admission."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reversi.engine import build_graph, build_plan
from reversi.engine.schedule import COMPENSATED, is_finished, ready_steps
from reversi.engine.nested_runs import (
    Node,
    ancestry_problem,
    children_order,
    descendants,
    floor,
    next_child,
    rollback_order,
    subtree,
    units,
)
from reversi.models.run import MAX_RUN_DEPTH, MAX_TREE_RUNS
from reversi_testkit import RUN_ID, run_spec, step, tool


@st.composite
def trees(draw):
    """A random tree of up to 12 runs: each run's step count, and each child's opening index at most
    its parent's step count (what admission records)."""
    n = draw(st.integers(1, 12))
    steps = {"r0": draw(st.integers(0, 6))}
    nodes = [Node("r0")]
    for i in range(1, n):
        parent = f"r{draw(st.integers(0, i - 1))}"
        opened = draw(st.integers(0, steps[parent]))
        nodes.append(Node(f"r{i}", parent, opened, created=f"2026-01-01T00:00:{draw(st.integers(0, 59)):02d}Z"))
        steps[f"r{i}"] = draw(st.integers(0, 6))
    return nodes, steps


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees())
def test_tree_order_children_are_units_newest_first_inside_ordered_by_opening(data):
    nodes, steps = data
    tree = subtree(nodes, "r0")
    order = rollback_order(tree, steps, "r0")
    # every step of every run exactly once
    assert sorted(order) == sorted((r, s) for r, k in steps.items() for s in range(k))
    position = {rs: i for i, rs in enumerate(order)}
    for run in steps:  # newest first inside each run
        mine = [s for r, s in order if r == run]
        assert mine == sorted(mine, reverse=True)
    for parent, children in tree.items():
        for child in children:
            span = [position[(r, s)] for n in [child, *descendants(tree, child.name)] for r, s in order
                    if r == n.name and s < steps[n.name]]
            if not span:
                continue
            lo, hi = min(span), max(span)
            inside = {child.name, *(d.name for d in descendants(tree, child.name))}
            # a child with its own children is one contiguous unit
            assert all(order[i][0] in inside for i in range(lo, hi + 1))
            # after the parent's steps recorded after it was opened, before the earlier ones
            for s in range(steps[parent]):
                assert (position[(parent, s)] < lo) == (s >= child.opened)
        # siblings: the later opening index first
        ordered = children_order(children)
        assert [c.opened for c in ordered] == sorted((c.opened for c in ordered), reverse=True)


def test_units_interleave_segments_and_children():
    kids = [Node("a", "p", 2, "t1"), Node("b", "p", 4, "t1"), Node("c", "p", 2, "t2")]
    assert [(u.lo, u.hi, u.child) for u in units(5, kids)] == [
        (4, 5, None), (4, 4, "b"), (2, 4, None), (2, 2, "c"), (2, 2, "a"), (0, 2, None)]
    assert floor(kids, []) == 4
    assert floor(kids, ["b"]) == 2
    assert next_child(kids, ["b"]) == kids[2]  # c: opened at 2 like a, created later
    assert floor(kids, ["a", "b", "c"]) == 0 and next_child(kids, ["a", "b", "c"]) is None


def test_floor_holds_earlier_steps_back_until_the_child_is_done():
    w = tool("w")
    spec = run_spec([step(i, w) for i in range(4)])
    graph = build_graph(spec)
    plan = build_plan(spec, [], run_id=RUN_ID, graph=graph)
    progress: dict[int, str] = {}
    assert ready_steps(plan, graph, progress, 4, floor=2) == [3, 2]
    progress.update({3: COMPENSATED, 2: COMPENSATED})
    assert ready_steps(plan, graph, progress, 4, floor=2) == []
    assert is_finished(plan, graph, progress, floor=2)
    assert not is_finished(plan, graph, progress)
    assert ready_steps(plan, graph, progress, 4) == [1, 0]


def _chain(*pairs):
    return [(a, b) for a, b in pairs]


def test_ancestry_refusals_say_what_to_fix():
    assert ancestry_problem("a", "a", [], 0) is not None and "itself" in ancestry_problem("a", "a", [], 0)
    assert "not found" in ancestry_problem("a", "p", [None], 0)
    assert ancestry_problem("a", "p", _chain(("p", None)), 0) is None
    cycle = ancestry_problem("a", "p", _chain(("p", "a"), ("a", "p")), 0)
    assert cycle is not None and "cycle" in cycle and "a -> p -> a" in cycle

    def ancestors(k):  # a chain of k ancestors r0 (the parent) .. r{k-1} (the root)
        return [(f"r{i}", f"r{i + 1}" if i < k - 1 else None) for i in range(k)]

    assert ancestry_problem("new", "r0", ancestors(MAX_RUN_DEPTH - 1), 0) is None  # depth 8: admitted
    deep = ancestors(MAX_RUN_DEPTH)
    refused = ancestry_problem("new", "r0", deep, 0)  # 8 ancestors: depth 9
    assert refused is not None and f"at most {MAX_RUN_DEPTH} deep" in refused
    full = ancestry_problem("a", "p", _chain(("p", None)), MAX_TREE_RUNS)
    assert full is not None and str(MAX_TREE_RUNS) in full


def test_describe_shows_a_section_per_run():
    from reversi.cli.views import run_section_lines

    lines = run_section_lines([
        {"run": "p", "outcome": "rolledBack", "compensated": 3},
        {"run": "b", "parent": "p", "opened": 2, "outcome": "rolledBack", "compensated": 2, "request": "undo-b-1a2b3"},
        {"run": "a", "parent": "p", "opened": 1, "outcome": "alreadyRecovered"}])
    text = "\n".join(lines)
    assert "Runs (nested, in rollback order):" in text
    assert text.index(" b ") < text.index(" a ") and "at step 2 of p" in text and "alreadyRecovered" in text
    assert run_section_lines([]) == []


def _simulate(tree, steps, run, out):
    """What the reconciler does for one run of a tree, parallelism 1: start what ready_steps
    allows above the floor; when nothing can start, roll back the next child as a unit."""
    w = tool("w")
    spec = run_spec([step(i, w) for i in range(steps[run])])
    graph = build_graph(spec)
    plan = build_plan(spec, [], run_id=RUN_ID, graph=graph)
    progress: dict[int, str] = {}
    done: set[str] = set()
    children = tree.get(run, [])
    while True:
        ready = ready_steps(plan, graph, progress, 1, floor=floor(children, done))
        if ready:
            out.append((run, ready[0]))
            progress[ready[0]] = COMPENSATED
            continue
        child = next_child(children, done)
        if child is None:
            assert is_finished(plan, graph, progress)
            return
        _simulate(tree, steps, child.name, out)
        done.add(child.name)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees())
def test_the_schedule_with_a_floor_follows_the_tree_order(data):
    nodes, steps = data
    tree = subtree(nodes, "r0")
    out: list[tuple[str, int]] = []
    _simulate(tree, steps, "r0", out)
    assert out == rollback_order(tree, steps, "r0")


def test_child_requests_are_named_and_owned_deterministically():
    from reversi.handlers.tree_rollback import child_request, child_request_name
    from reversi.models.rollbackrequest import RollbackRequestSpec

    name = child_request_name("undo", "a")
    assert name.startswith("undo-a-") and len(name) == len("undo-a-") + 5
    assert child_request_name("undo", "a") == name != child_request_name("undo-a", "x")
    long = child_request_name("r" * 250, "child")
    assert len(long) <= 253 and long.endswith("-child-" + long[-5:])
    spec = RollbackRequestSpec.model_validate({"runRef": {"name": "p"}, "retries": 2, "approveCompensations": True,
                                               "approvals": [{"step": 0}], "parallelism": 3, "cancel": True})
    body = child_request({"metadata": {"name": "undo", "namespace": "shop", "uid": "u-1"}}, spec, "a")
    assert body["spec"] == {"runRef": {"name": "a"}, "retries": 2, "backoff": body["spec"]["backoff"],
                            "parallelism": 3, "requireVerification": False}
    assert body["metadata"]["ownerReferences"][0] == {"apiVersion": "reversi.dev/v1alpha1", "kind": "RollbackRequest",
                                                      "name": "undo", "uid": "u-1", "controller": True}


def test_plan_shows_the_tree_order():
    from reversi.cli.views import tree_lines

    tree = {"p": [Node("a", "p", 1), Node("b", "p", 2)], "a": [Node("g", "a", 1)], "b": [], "g": []}
    lines = tree_lines("p", {"p": 3, "a": 2, "b": 2, "g": 1}, tree)
    assert lines == [
        "Child runs: a rollback of this run undoes, in this order:",
        "  - step 2 of p",
        "  - child Run b (opened at step 2), as one unit",
        "    - steps 1..0 of b",
        "  - step 1 of p",
        "  - child Run a (opened at step 1), as one unit",
        "    - step 1 of a",
        "    - child Run g (opened at step 1), as one unit",
        "      - step 0 of g",
        "    - step 0 of a",
        "  - step 0 of p",
    ]
