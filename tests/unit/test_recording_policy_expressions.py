"""The recorded call's admission policies (reversi.adapters.policies): the glob-to-regex
translation the halts' policy evaluates in CEL means what a halt pattern means everywhere else
(docs/concepts.md#glob-semantics-of-halt-scopes)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from reversi.adapters import policies
from reversi.models.halt import glob_match, pattern_problem

ALPHABET = "ab.*?\\\\/:-_()[]{}|+^$ \n"


@settings(max_examples=500)
@given(st.text(ALPHABET, max_size=8), st.text(ALPHABET.replace("*", "").replace("?", ""), max_size=8))
def test_the_policys_regex_matches_what_the_glob_matches(pattern, value):
    """For every pattern the halt rules admit, the regex built by replacements (as the API server
    builds it in CEL) matches exactly the values the engine's glob matcher matches."""
    if pattern_problem("actor", pattern) is not None:
        return
    regex = policies.glob_regex_of(pattern)
    assert bool(re.fullmatch(regex, value)) == glob_match(pattern, value), (pattern, value, regex)


def test_wildcards_and_escapes():
    assert re.fullmatch(policies.glob_regex_of("payments.*"), "payments.v2/charge")
    assert not re.fullmatch(policies.glob_regex_of("payments.*"), "paymentsXv2")
    assert re.fullmatch(policies.glob_regex_of("a\\*b"), "a*b")
    assert not re.fullmatch(policies.glob_regex_of("a\\*b"), "axb")
    assert re.fullmatch(policies.glob_regex_of("bot-?"), "bot-a")
    assert not re.fullmatch(policies.glob_regex_of("bot-?"), "bot-ab")


def test_every_cel_literal_is_printable():
    """The policies' CEL holds no raw control character (they are written \\uXXXX)."""
    def strings(value):
        if isinstance(value, dict):
            for v in value.values():
                yield from strings(v)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)
        elif isinstance(value, str):
            yield value

    for body in policies.recording_policies("x"):
        assert not any(ord(c) < 32 for text in strings(body) for c in text), body["metadata"]["name"]


# ----------------------------------------------------------------- after the fact: foreign steps

def _run_spec(**extra):
    from reversi.models.run import RunSpec

    return RunSpec.model_validate({"principal": "agent-a", "manifestRef": {"name": "m"}, "scope": {"actor": "bot"},
                                   "pinnedManifest": {"revision": 3, "tools": [
                                       {"name": "box.put", "effect": "write", "compensation": {
                                           "tool": "box.remove", "kind": "inverse", "args": {}, "runner": "r"}}]},
                                   **extra})


def _entry(index, principal="agent-a", uid="u1", **copy):
    from reversi.engine.journal import Entry
    from reversi.models.runstep import RunStepSpec

    return Entry(RunStepSpec.model_validate({
        "index": index, "tool": "box.put", "args": {}, "outcome": "succeeded", "runRef": {"name": "r"},
        "principal": principal, "runAtOpen": {"uid": uid, "principal": "agent-a", "scope": {"actor": "bot"}, **copy}}))


def test_a_step_whose_copy_disagrees_with_its_run_is_foreign_and_left_out():
    from reversi.engine.journal import assemble

    journal = assemble(_run_spec(), [_entry(0), _entry(1, principal="agent-b"), _entry(2, uid="u0"),
                                     _entry(3, mode="observe"), _entry(5)], run_uid="u1")
    assert [s.index for s in journal.spec.steps] == [0, 5]
    assert sorted(journal.foreign) == [1, 2, 3]
    assert "rule 10" in journal.foreign[1] and "another Run of the same name" in journal.foreign[2]
    assert "mode" in journal.foreign[3]
    assert journal.missing == [4], "a gap is named, a foreign step is not a gap"
    assert journal.size == 6


def test_a_step_without_a_snapshot_is_undone_by_its_runs_pinned_entry():
    from reversi.engine.journal import assemble

    journal = assemble(_run_spec(), [_entry(0)], run_uid="u1")
    assert journal.spec.steps[0].snapshot is not None and journal.spec.steps[0].snapshot.compensation.tool == \
        "box.remove"


def test_describe_names_the_pinned_manifest_and_the_foreign_steps():
    import datetime as dt

    from reversi.cli import views

    req = {"metadata": {"name": "undo", "namespace": "shop"}, "spec": {"runRef": {"name": "r"}},
           "status": {"phase": "Succeeded", "report": {"foreign": [{"step": 1, "reason": "recorded by agent-b"}],
                                                       "missing": [4]}}}
    run = {"spec": {"manifestRef": {"name": "m"}, "pinnedManifest": {"revision": 3, "tools": []}}}
    text = views.describe_request(req, run, [], dt.datetime.now(dt.UTC))
    assert "Manifest:     m revision 3, pinned when the run was opened" in text
    assert "step 1 is not part of the run's record: recorded by agent-b" in text and "step(s) 4" in text
