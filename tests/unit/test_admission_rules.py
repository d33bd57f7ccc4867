"""Pure admission rules: halt globs and scopes (rule 9), principal (10), resolutions (7),
forward duplicates, approvals (8)."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reversi.engine import admission as rules
from reversi.models.halt import ClusterHaltScope, HaltScope, glob_match
from reversi.models.run import RunSpec
from reversi.models.toolmanifest import ToolManifestSpec

MANIFEST = ToolManifestSpec.model_validate({
    "runners": [{"name": "cli", "image": "x", "command": ["x"]}],
    "tools": [
        {"name": "payments.create_charge", "effect": "write", "idempotencyKey": "$args.order_id",
         "compensation": {"tool": "payments.refund", "kind": "compensation", "args": {}, "runner": "cli"}},
        {"name": "payments.get_customer", "effect": "read"},
    ]})


def _spec(steps, principal="agent-a", mode="enforce", resolutions=()):
    return RunSpec.model_validate({"principal": principal, "mode": mode, "manifestRef": {"name": "m"},
                                   "scope": {"actor": "checkout-agent", "tenant": "acme", "environment": "prod"},
                                   "steps": steps, "resolutions": list(resolutions)})


def _step(i, tool="payments.create_charge", order="o-1", outcome="succeeded"):
    return {"index": i, "tool": tool, "args": {"order_id": order}, "outcome": outcome}


# ------------------------------------------------------------------------------- globs

def test_glob_star_crosses_dots_and_slashes():
    assert glob_match("payments.*", "payments.refund")
    assert glob_match("payments.*", "payments.v2/charge")
    assert glob_match("*", "")
    assert not glob_match("payments.*", "payment.refund")


def test_glob_question_mark_is_exactly_one_character():
    assert glob_match("a?c", "abc") and glob_match("a?c", "a.c")
    assert not glob_match("a?c", "ac") and not glob_match("a?c", "abbc")


def test_glob_brackets_dots_and_escapes_are_literal():
    assert glob_match("[x]", "[x]") and not glob_match("[x]", "x")
    assert glob_match("a.b", "a.b") and not glob_match("a.b", "axb")
    assert glob_match(r"a\*", "a*") and not glob_match(r"a\*", "ab")


def test_glob_is_case_sensitive_and_whole_value():
    assert not glob_match("Pay*", "pay")
    assert not glob_match("pay", "payments")


@given(st.text(alphabet=string.ascii_letters + string.digits + "._/-[]", max_size=30))
def test_property_a_plain_value_matches_itself_and_star_matches_all(value):
    assert glob_match(value, value)
    assert glob_match("*", value)
    assert glob_match(value + "*", value + "tail")


# ------------------------------------------------------------------------------ rule 9

HALT = lambda name, scope, ns="shop": rules.HaltView("Halt", name, ns, f"{name} reason", scope)  # noqa: E731


def test_rule9_empty_scope_halts_everything_in_its_namespace():
    spec = _spec([_step(0)])
    assert rules.check_halts([HALT("all", None)], "shop", spec,
                             spec.steps).message.startswith("kill switch: all reason")
    assert rules.check_halts([HALT("all", None)], "other", spec, spec.steps) is None


def test_rule9_every_named_field_must_match():
    spec = _spec([_step(0)])
    assert rules.check_halts([HALT("h", HaltScope(tool="payments.*", actor="checkout-*"))], "shop", spec, spec.steps)
    assert rules.check_halts([HALT("h", HaltScope(tool="payments.*", tenant="globex"))], "shop", spec,
                             spec.steps) is None


def test_rule9_cluster_halt_matches_namespaces_by_glob():
    spec = _spec([_step(0)])
    cluster = rules.HaltView("ClusterHalt", "c", None, "fleet", ClusterHaltScope(namespace="sh*"))
    assert rules.check_halts([cluster], "shop", spec, spec.steps).halt == ("ClusterHalt", None, "c")
    assert rules.check_halts([cluster], "billing", spec, spec.steps) is None


def test_rule9_a_named_field_the_run_lacks_does_not_match():
    spec = RunSpec.model_validate({"manifestRef": {"name": "m"}, "steps": [_step(0)]})
    assert rules.check_halts([HALT("h", HaltScope(actor="*"))], "shop", spec, spec.steps) is None


# ----------------------------------------------------------------------------- rule 10

def test_rule10_only_the_principal_changes_the_journal():
    old = _spec([_step(0)])
    new = _spec([_step(0), _step(1, order="o-2")])
    assert rules.check_principal(old, new, "agent-b", "Run shop/r").reason == rules.FOREIGN_PRINCIPAL
    assert rules.check_principal(old, new, "agent-a", "Run shop/r") is None
    # a resolution by someone else is not a journal change
    resolved = _spec([_step(0)], resolutions=[{"step": 0, "status": "failed", "note": "n"}])
    assert rules.check_principal(old, resolved, "oncall", "Run shop/r") is None


# ------------------------------------------------------------------------------ rule 7

def test_rule7_only_intended_or_uncertain_steps_are_resolved():
    old = _spec([_step(0), _step(1, order="o-2", outcome="uncertain")])
    ok = _spec(old.model_dump(by_alias=True)["steps"], resolutions=[{"step": 1, "status": "succeeded", "note": "n"}])
    bad = _spec(old.model_dump(by_alias=True)["steps"], resolutions=[{"step": 0, "status": "failed", "note": "n"}])
    missing = _spec(old.model_dump(by_alias=True)["steps"], resolutions=[{"step": 7, "status": "failed", "note": "n"}])
    assert rules.check_resolutions(old, ok) is None
    assert "only intended or uncertain" in rules.check_resolutions(old, bad).message
    assert "no such step" in rules.check_resolutions(old, missing).message


# -------------------------------------------------------------------- forward duplicates

def test_forward_duplicate_of_a_standing_step_is_refused():
    spec = _spec([_step(0), _step(1, order="o-1", outcome="intended")])
    refusal = rules.check_duplicates(spec, [spec.steps[1]], set(), MANIFEST)
    assert refusal.reason == rules.DUPLICATE and "like step 0" in refusal.message


def test_forward_duplicate_of_a_failed_or_compensated_step_is_admitted():
    failed = _spec([_step(0, outcome="failed"), _step(1, outcome="intended")])
    assert rules.check_duplicates(failed, [failed.steps[1]], set(), MANIFEST) is None
    undone = _spec([_step(0), _step(1, outcome="intended")])
    assert rules.check_duplicates(undone, [undone.steps[1]], {0}, MANIFEST) is None


def test_tools_without_a_key_or_other_keys_are_not_duplicates():
    spec = _spec([_step(0), _step(1, order="o-2", outcome="intended"),
                  _step(2, tool="payments.get_customer", outcome="intended")])
    assert rules.check_duplicates(spec, spec.steps[1:], set(), MANIFEST) is None


def test_unknown_tool_is_refused_in_enforce_mode_only():
    spec = _spec([_step(0, tool="crm.delete")])
    assert rules.check_tools(spec, spec.steps, MANIFEST, "shop/m").reason == rules.UNKNOWN_TOOL
    observe = _spec([_step(0, tool="crm.delete")], mode="observe")
    assert rules.check_tools(observe, observe.steps, MANIFEST, "shop/m") is None


# ------------------------------------------------------------------------------ rule 8

def test_rule8_new_approvals_are_what_the_write_adds():
    assert rules.new_approvals(None, {"approveCompensations": True}) == ([], True)
    assert rules.new_approvals({"approvals": [{"step": 1}]}, {"approvals": [{"step": 1}, {"step": 2}]}) == ([2], False)
    assert rules.new_approvals({"approveCompensations": True}, {"approveCompensations": True}) == ([], False)


def _reference_regex(pattern: str):
    import re

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
    return re.compile("".join(out), re.DOTALL)


@given(st.text(alphabet="ab.*?\\", max_size=8), st.text(alphabet="ab.*?\\", max_size=10))
def test_property_glob_agrees_with_the_regular_expression_it_describes(pattern, value):
    assert glob_match(pattern, value) == bool(_reference_regex(pattern).fullmatch(value))


def test_glob_with_many_stars_against_a_long_value_is_answered():
    # a regular expression would backtrack exponentially here; the matcher is quadratic at worst
    assert glob_match("*a*a*a*a*a*a*a*a*b", "a" * 253) is False
    assert glob_match("*a*a*a*a*a*a*a*a*b", "a" * 252 + "b") is True


@pytest.mark.parametrize("text", ["$args.", "$result.", "$args.a..b", "$result.id."])
def test_a_reference_with_an_empty_path_segment_says_how_to_write_it(text):
    """Every refusal of a bad reference says what to write instead (the fuzzer's rule: a refusal
    names what to fix), here a field after each dot, or the root alone for the whole value."""
    root = text[1:].split(".")[0]
    assert rules.template_problem(text) == (f"{text!r} has an empty path segment: name a field after each dot, "
                                            f"as in ${root}.id (or write ${root} for the whole value)")
