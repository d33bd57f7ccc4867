"""Templates, keys (docs/concepts.md#vocabulary), verification matching (rule 5), backoff (rule 4), the graph."""

from __future__ import annotations

import random
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reversi.engine import (
    InvalidRun,
    MissingValue,
    build_graph,
    ceiling_ms,
    compensation_key,
    delay_seconds,
    first_mismatch,
    forward_key,
    lookup,
    parse_answer,
    references,
    resolve,
)
from reversi.engine.graph import DependentIndex
from reversi_testkit import run_spec, step, tool

# ------------------------------------------------------------------------------- templates

ARGS = {"order_id": "o-1", "amount": 700, "customer": {"id": "cus_9", "tags": ["a", "b"]}}
RESULT = {"id": "ch_1", "items": [{"id": "it_1"}, {"id": "it_2"}], "zero": 0, "no": False, "none": None}


def test_template_args_and_result_paths_are_replaced():
    template = {"charge_id": "$result.id", "amount": "$args.amount", "customer": "$args.customer.id"}
    assert resolve(template, ARGS, RESULT) == {"charge_id": "ch_1", "amount": 700, "customer": "cus_9"}


def test_template_list_indices_and_whole_values():
    assert resolve("$result.items.1.id", ARGS, RESULT) == "it_2"
    assert resolve("$args.customer.tags.0", ARGS, RESULT) == "a"
    assert resolve("$args.customer", ARGS, RESULT) == {"id": "cus_9", "tags": ["a", "b"]}
    assert resolve("$result", ARGS, RESULT) == RESULT
    # falsy values are values
    assert resolve(["$result.zero", "$result.no"], ARGS, RESULT) == [0, False]


def test_template_other_values_are_literal_recursively():
    template = {"a": "order $args.order_id", "b": 5, "c": [True, None, "$argsx", "$other.x"],
                "d": {"e": "$args.amount"}}
    assert resolve(template, ARGS, RESULT) == {
        "a": "order $args.order_id",
        "b": 5,
        "c": [True, None, "$argsx", "$other.x"],
        "d": {"e": 700},
    }
    assert references(template) == ["$args.amount"]


@pytest.mark.parametrize(
    "path, args, result, message",
    [
        ("$args.missing", ARGS, RESULT, "has no 'missing'"),
        ("$result.id", ARGS, None, "the call has no result"),
        ("$result.items.5.id", ARGS, RESULT, "has 2 items; no index 5"),
        ("$result.items.first", ARGS, RESULT, "is a list; 'first' is not an index"),
        ("$args.amount.cents", ARGS, RESULT, "is not an object or a list"),
        ("$result.none", ARGS, RESULT, "is null"),
        ("$args.", ARGS, RESULT, "empty segment"),
    ],
)
def test_template_missing_value_is_refused_naming_the_path(path, args, result, message):
    with pytest.raises(MissingValue) as err:
        resolve({"x": [path]}, args, result)
    assert err.value.path == path
    assert message in str(err.value)
    assert str(err.value).startswith(path)


def test_template_resolution_copies_and_never_mutates_inputs():
    args = {"a": {"b": [1]}}
    out = resolve({"x": "$args.a"}, args, None)
    out["x"]["b"].append(2)
    assert args == {"a": {"b": [1]}}


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text("abc", max_size=2), inner, max_size=3)),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text("abc", max_size=2), json_values, max_size=4)
segments = st.lists(st.one_of(st.text("abc", min_size=1, max_size=2), st.integers(0, 3).map(str)), max_size=3)


def walk(root, parts):
    current = root
    for part in parts:
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return None, False
    return current, current is not None


@settings(max_examples=300, deadline=None)
@given(args=json_objects, result=st.one_of(st.none(), json_objects), root=st.sampled_from(["args", "result"]),
       parts=segments)
def test_property_templates_never_invent_values(args, result, root, parts):
    path = "$" + root + "".join("." + p for p in parts)
    source = args if root == "args" else result
    expected, present = walk(source, parts) if source is not None else (None, False)
    try:
        value = lookup(path, args, result)
    except MissingValue:
        assert not present
    else:
        assert present and value == expected


@settings(max_examples=200, deadline=None)
@given(template=json_values, args=json_objects)
def test_property_templates_without_references_are_returned_unchanged(template, args):
    if references(template):
        return
    assert resolve(template, args, None) == template


# ------------------------------------------------------------------------------------ keys


def test_compensation_key_is_64_hex_stable_and_pinned():
    key = compensation_key("uid-1", 1, "payments.refund")
    assert re.fullmatch(r"[0-9a-f]{64}", key)
    assert key == compensation_key("uid-1", 1, "payments.refund")
    # pinned: changing the encoding would break idempotency across operator versions
    assert key == "c7e16926f6b3f28518ee6457934d95f3ee367c18ca628709d4c280f3755242fc"


def test_compensation_key_is_unambiguous():
    keys = {
        compensation_key("a", 1, "b"),
        compensation_key("a", 11, "b"),
        compensation_key("a1", 1, "b"),
        compensation_key("a", 1, "b1"),
        compensation_key("a,1", 1, "b"),
    }
    assert len(keys) == 5
    with pytest.raises(ValueError):
        compensation_key("", 1, "b")
    with pytest.raises(ValueError):
        compensation_key("a", -1, "b")


@settings(max_examples=200, deadline=None)
@given(run_id=st.text(min_size=1, max_size=40), step_index=st.integers(0, 10**6),
       tool_name=st.text(min_size=1, max_size=40))
def test_property_compensation_keys_are_stable_64_hex(run_id, step_index, tool_name):
    key = compensation_key(run_id, step_index, tool_name)
    assert re.fullmatch(r"[0-9a-f]{64}", key)
    assert key == compensation_key(run_id, step_index, tool_name)
    assert key != compensation_key(run_id, step_index + 1, tool_name)


def test_snapshot_id_is_16_hex_and_follows_the_content():
    from reversi.engine import snapshot_id
    from reversi.models import ToolSpec

    entry = tool("db.insert")
    sid = snapshot_id(entry)
    assert re.fullmatch(r"[0-9a-f]{16}", sid)
    assert snapshot_id(ToolSpec.model_validate(entry)) == snapshot_id(ToolSpec.model_validate(entry).to_wire())
    assert snapshot_id(dict(entry, id="x")) == sid
    assert snapshot_id(tool("db.insert", residue=["r"])) != sid


def test_forward_key_is_the_resolved_template_stringified_canonically():
    assert forward_key("$args.order_id", {"order_id": "o-4711"}) == "o-4711"
    assert forward_key("$args.amount", {"amount": 700}) == "700"
    assert forward_key("$args.o", {"o": {"b": 1, "a": "é"}}) == '{"a":"é","b":1}'
    assert forward_key("fixed", {}) == "fixed"
    with pytest.raises(MissingValue):
        forward_key("$args.order_id", {})


# ---------------------------------------------------------------------------- verification


def test_rule5_answer_containing_expect_matches():
    assert first_mismatch({"id": "ch_1", "refunded": True, "extra": [1]}, {"refunded": True}) is None
    assert first_mismatch({"a": {"b": 1, "c": 2}}, {"a": {"b": 1}}) is None
    assert first_mismatch({"n": 1.0}, {"n": 1}) is None
    assert first_mismatch({}, {}) is None


def test_rule5_mismatch_names_the_first_differing_field():
    assert first_mismatch({"status": "succeeded"},
                          {"status": "canceled"}) == 'status is "succeeded", expected "canceled"'
    assert first_mismatch({"id": 1}, {"refunded": True}) == "refunded is missing, expected true"
    assert first_mismatch({"a": {"b": {"c": 2}}}, {"a": {"b": {"c": 3}}}) == "a.b.c is 2, expected 3"
    assert first_mismatch({"a": "x"}, {"a": {"b": 1}}) == 'a is "x", expected an object like {"b": 1}'
    assert first_mismatch([1], {"a": 1}).startswith("the answer is [1]")


def test_rule5_lists_and_scalars_must_be_equal_and_booleans_are_not_numbers():
    assert first_mismatch({"tags": [1, 2, 3]}, {"tags": [1, 2]}) == "tags is [1, 2, 3], expected [1, 2]"
    assert first_mismatch({"ok": 1}, {"ok": True}) == "ok is 1, expected true"
    assert first_mismatch({"v": None}, {"v": 0}) == "v is null, expected 0"


def test_rule5_reader_output_that_is_not_json_is_a_failed_read():
    assert parse_answer('{"refunded": true}') == {"refunded": True}
    with pytest.raises(ValueError, match="printed no JSON"):
        parse_answer("Traceback (most recent call last)")


# ---------------------------------------------------------------------------------- backoff


def test_rule4_backoff_doubles_up_to_the_maximum():
    assert [ceiling_ms(a, 200, 5000) for a in range(1, 8)] == [200, 400, 800, 1600, 3200, 5000, 5000]
    assert ceiling_ms(10_000, 200, 5000) == 5000
    assert delay_seconds(3, 200, 5000, jitter="none") == 0.8


def test_rule4_jitter_stays_within_its_range():
    rng = random.Random(7)
    for attempt in range(1, 10):
        cap = ceiling_ms(attempt, 100, 3000) / 1000
        full = delay_seconds(attempt, 100, 3000, rng)
        equal = delay_seconds(attempt, 100, 3000, rng, jitter="equal")
        assert 0 <= full <= cap
        assert cap / 2 <= equal <= cap


def test_rule4_backoff_refuses_bad_input():
    with pytest.raises(ValueError):
        delay_seconds(0, 100, 1000)
    with pytest.raises(ValueError):
        delay_seconds(1, 100, 1000, jitter="wild")


@settings(max_examples=200, deadline=None)
@given(attempt=st.integers(1, 500), base=st.integers(1, 10_000), top=st.integers(1, 60_000), seed=st.integers(0, 1000))
def test_property_backoff_is_bounded_by_the_maximum(attempt, base, top, seed):
    for jitter in ("full", "equal", "none"):
        assert 0 <= delay_seconds(attempt, base, top, random.Random(seed), jitter) <= top / 1000


# ------------------------------------------------------------------------------------ graph

CHARGE = tool("charge")
CAPTURE = tool("capture", requires=["charge"])


def test_rule1_graph_requires_and_depends_on():
    spec = run_spec([step(0, CHARGE), step(1, tool("x")), step(2, CAPTURE, depends_on=[1]), step(3, CHARGE),
                     step(4, CAPTURE)])
    graph = build_graph(spec)
    assert graph.dependencies(2) == [0, 1]
    assert graph.dependencies(4) == [0, 3]
    assert graph.dependents(0) == [2, 4]
    assert graph.dependents(3) == [4]
    assert graph.depends(4, 0) and not graph.depends(0, 4) and not graph.depends(3, 1)


@pytest.mark.parametrize(
    "steps, message",
    [
        ([step(0, CHARGE), step(1, CHARGE, depends_on=[1])], r"step 1 \(charge\) depends on itself"),
        ([step(0, CHARGE, depends_on=[1]), step(1, CHARGE)], r"step 0 \(charge\) depends on the later step 1"),
        ([step(0, CHARGE), step(1, CHARGE, depends_on=[7])],
         r"step 1 \(charge\) depends on step 7, which does not exist"),
        ([step(0, CHARGE), step(0, CHARGE)], r"spec.steps\[1\]: index 0 is used twice"),
        ([step(1, CHARGE), step(0, CHARGE)], r"spec.steps\[0\]: index 1 is out of order"),
    ],
)
def test_rule1_invalid_runs_are_refused_naming_the_step_and_the_fix(steps, message):
    with pytest.raises(InvalidRun, match=message):
        build_graph(run_spec(steps))


def test_dependent_index_requires_newest_first():
    graph = build_graph(run_spec([step(0, CHARGE), step(1, CAPTURE)]))
    index = DependentIndex(graph)
    index.register(1)
    assert index.blocked(0) and index.blockers(0) == [1]
    with pytest.raises(ValueError):
        index.register(1)


def test_graph_of_ten_thousand_steps_is_built_in_linear_time():
    entries = [tool(f"t{k}", requires=[f"t{k - 1}"] if k else []) for k in range(10)]
    steps = [step(i, entries[i % 10], depends_on=[i - 1] if i else []) for i in range(10_000)]
    spec = run_spec(steps)
    started = time.perf_counter()
    graph = build_graph(spec)
    assert time.perf_counter() - started < 1.0
    assert graph.dependencies(15) == [4, 14]
