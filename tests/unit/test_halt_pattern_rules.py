"""One meaning for every halt pattern (docs/concepts.md#glob-semantics-of-halt-scopes),
property-tested across the entry points: admission (the webhook's check), the CLI (``halt add``'s
scope and its check), matching (``HaltScope.matches``, ``matching_halt``) and display (``halt
list``'s scope column)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from reversi.cli import views
from reversi.cli.api import CliError
from reversi.cli.main import halt_scope
from reversi.engine import admission as rules
from reversi.models.halt import ClusterHaltScope, HaltScope, glob_match, pattern_problem

FIELDS = ("tool", "actor", "tenant", "environment", "namespace")
TOOL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

# patterns built from the characters that matter: globs, escapes, regex syntax, spaces, letters
pattern_chars = st.sampled_from(list("ab.-_/:*?\\^$[](){}|+ Ax9"))
patterns = st.text(pattern_chars, max_size=12)
tool_patterns = st.text(st.sampled_from(list("ab.-_/:*?\\9Z$")), min_size=1, max_size=12)
tool_names = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._:/-]{0,15}\Z")
namespaces = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?\Z")


def reference_match(pattern: str, value: str) -> bool:
    """The documented glob semantics as a regular expression (whole value, * any run, ? one)."""
    out, escaped = [], False
    for ch in pattern:
        if escaped:
            out.append(re.escape(ch))
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        else:
            out.append(re.escape(ch))
    if escaped:
        out.append(re.escape("\\"))
    return re.fullmatch("".join(out), value, re.DOTALL) is not None


def witness(pattern: str) -> str:
    """A value an accepted pattern matches: * and ? as ``a``, escapes as the character."""
    out, escaped = [], False
    for ch in pattern:
        if escaped:
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in "*?":
            out.append("a")
        else:
            out.append(ch)
    return "".join(out)


def cli_scope(field: str, pattern: str) -> dict | str:
    """What ``halt add --<field> PATTERN`` sends, or its error message."""
    try:
        return halt_scope(**{f: (pattern if f == field else None) for f in FIELDS})
    except CliError as err:
        return str(err)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(FIELDS), patterns)
def test_the_cli_and_admission_accept_and_refuse_the_same_patterns_for_the_same_reason(field, pattern):
    why = pattern_problem(field, pattern)
    sent = cli_scope(field, pattern)
    scope = ClusterHaltScope.model_validate({field: pattern})
    refusal = rules.check_halt_scope(scope)
    if why is None:
        assert sent == {field: pattern}, "the CLI sends the pattern exactly as given"
        assert refusal is None
    else:
        assert isinstance(sent, str) and sent.endswith(f"can never match: {why}")
        assert refusal is not None and refusal.message.endswith(f"can never match: {why}")


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(FIELDS), patterns)
def test_a_named_field_is_displayed_as_written_never_as_every_call(field, pattern):
    text = views.scope_text({field: pattern})
    assert text != "<every call>"
    assert text.startswith(f"{field}=")
    shown = text[len(field) + 1:]
    assert (json.loads(shown) if shown.startswith('"') else shown) == pattern


@settings(max_examples=400, deadline=None)
@given(patterns, st.text(pattern_chars, max_size=12))
def test_matching_follows_the_documented_glob_for_accepted_patterns_and_nothing_for_refused_ones(pattern, value):
    for field in ("actor", "tenant", "environment"):
        matched = HaltScope.model_validate({field: pattern}).matches(**{field: value})
        if pattern_problem(field, pattern) is None:
            assert matched == reference_match(pattern, value) == glob_match(pattern, value)
        else:
            assert matched is False


@settings(max_examples=400, deadline=None)
@given(tool_patterns)
def test_every_accepted_tool_pattern_matches_some_tool_and_matching_halt_agrees(pattern):
    assume(pattern_problem("tool", pattern) is None)
    tool = witness(pattern)
    assert TOOL_NAME.match(tool), f"{pattern!r} accepted, but its witness {tool!r} is no tool name"
    halt = rules.HaltView("Halt", "h", "shop", "r", HaltScope(tool=pattern))
    assert rules.matching_halt([halt], namespace="shop", tool=tool, scope={}) is halt
    assert rules.tools_matched(pattern, [tool, "zz.other"])[:1] == [tool] or glob_match(pattern, "zz.other")


@settings(max_examples=300, deadline=None)
@given(st.one_of(patterns, tool_patterns), st.lists(tool_names, min_size=1, max_size=8))
def test_a_refused_tool_pattern_would_match_no_tool(pattern, tools):
    assume(pattern_problem("tool", pattern) is not None)
    assert not [t for t in tools if glob_match(pattern, t) and pattern]  # "" matches no tool name


@settings(max_examples=300, deadline=None)
@given(patterns, namespaces)
def test_namespace_globs_follow_the_same_rule(pattern, namespace):
    if pattern_problem("namespace", pattern) is None:
        w = witness(pattern)
        assert NAMESPACE.match(w), f"{pattern!r} accepted, but its witness {w!r} is no namespace name"
        assert glob_match(pattern, w)
    elif pattern:
        assert not glob_match(pattern, namespace) or pattern.endswith("\\")


@pytest.mark.parametrize("field, pattern, why", [
    ("tool", "", "an empty pattern matches nothing"),
    ("tool", "payments\\", "a trailing backslash escapes nothing"),
    ("tool", "^payments\\..*$", "looks like a regular expression"),
    ("tool", "payments.[a-z]*", "looks like a regular expression"),
    ("tool", "pay ments.*", "' ' can never match: a tool name holds only"),
    ("tool", " payments.*", "starts or ends with a space"),
    ("actor", "", "an empty pattern matches nothing"),
    ("actor", "^checkout$", "looks like a regular expression"),
    ("namespace", "Shop", "a namespace name holds only lowercase letters"),
    ("namespace", "shop-", "it ends with '-'"),
])
def test_patterns_that_cannot_match_are_refused_with_why(field, pattern, why):
    assert why in (pattern_problem(field, pattern) or "")


@pytest.mark.parametrize("field, pattern", [
    ("tool", "payments.*"), ("tool", "*"), ("tool", "payments.get_?ustomer"), ("tool", "payments\\.refund"),
    ("actor", "checkout agent"), ("actor", "team\\[a\\]"), ("namespace", "shop-*"), ("tool", "paymnets.*"),
])
def test_ordinary_globs_are_accepted(field, pattern):
    assert pattern_problem(field, pattern) is None


def test_a_halt_matching_no_tool_in_reach_says_so():
    manifests = [{"metadata": {"namespace": "shop"}, "spec": {"tools": [{"name": "payments.refund"}]}},
                 {"metadata": {"namespace": "other"}, "spec": {"tools": [{"name": "paymnets.refund"}]}}]
    tools = rules.tools_in_reach(manifests, "shop", {"tool": "paymnets.*"})
    assert tools == ["payments.refund"] and rules.tools_matched("paymnets.*", tools) == []
    assert rules.tools_matched("paymnets.*", rules.tools_in_reach(manifests, None, {})) == ["paymnets.refund"]
    msg = rules.no_tool_message("paymnets.*", rules.reach_text("shop", None), len(tools))
    assert msg.startswith("scope.tool 'paymnets.*' matches none of the 1 tools of the ToolManifests in namespace shop")


def test_halt_conditions_say_active_or_invalid_and_whether_the_tool_pattern_matches_a_tool():
    from reversi.handlers.halts import halt_conditions

    def by_type(conds):
        return {c["type"]: (c["status"], c["reason"]) for c in conds}

    tools = ["payments.refund", "inventory.reserve"]
    assert by_type(halt_conditions({"reason": "r", "scope": {"tool": "payments.*"}}, "shop", tools, [], 1)) == {
        "Active": ("True", "HaltInEffect"), "MatchesNoTool": ("False", "ToolsInReach")}
    assert by_type(halt_conditions({"reason": "r", "scope": {"tool": "paymnets.*"}}, "shop", tools, [], 1)) == {
        "Active": ("True", "HaltInEffect"), "MatchesNoTool": ("True", "NoToolInReach")}
    assert by_type(halt_conditions({"reason": "r", "scope": {"tool": ""}}, "shop", tools, [], 1)) == {
        "Active": ("False", "InvalidPattern")}  # stored before the rule: it refuses nothing, and says so
    assert by_type(halt_conditions({"reason": "r", "scope": {"actor": "a"}}, None, tools, [], 1)) == {
        "Active": ("True", "HaltInEffect")}
