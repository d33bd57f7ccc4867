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
