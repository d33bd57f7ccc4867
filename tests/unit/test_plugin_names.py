"""The plugin never sends an empty or malformed name: on the API an empty name is the collection."""

from __future__ import annotations

import pytest

from reversi.cli.api import CliError, check_name


@pytest.mark.parametrize("name", ["", " ", "Upper", "a/b", "-lead", "trail-", "x" * 254, "a b"])
def test_bad_names_are_refused_before_any_call(name):
    with pytest.raises(CliError) as err:
        check_name(name, "Halt")
    assert "is not a valid Halt name" in str(err.value)


@pytest.mark.parametrize("name", ["a", "order-4711", "reversi-kill-switch", "a.b-c", "x" * 253])
def test_good_names_pass(name):
    assert check_name(name, "Run") == name
