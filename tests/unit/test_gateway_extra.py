"""reversi-gateway and reversi-mcp-runner without the gateway extra: one line and exit 2, never a
traceback; with it, an unrelated missing module is not hidden."""

from __future__ import annotations

import importlib.util

import pytest

import reversi.gateway as gw


def test_a_missing_extra_is_said_in_one_line(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mcp" else real(name, *a))
    assert gw._missing_extra("reversi-gateway", ModuleNotFoundError("No module named 'anyio'", name="anyio")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'reversi[gateway]'" in err and "mcp not installed" in err


def test_with_the_extra_another_missing_module_is_raised():
    error = ModuleNotFoundError("No module named 'nowhere'", name="nowhere")
    with pytest.raises(ModuleNotFoundError):
        gw._missing_extra("reversi-mcp-runner", error)


def test_every_gateway_flag_has_help_from_its_setting(capsys):
    """``reversi-gateway --help`` documents every flag (its setting's description, default and
    environment variable) in plain text."""
    from reversi.gateway.main import parse
    from reversi.gateway.settings import GatewaySettings

    with pytest.raises(SystemExit):
        parse(["--help"])
    text = capsys.readouterr().out
    assert "``" not in text
    for name in GatewaySettings.model_fields:
        if name == "token_cache_seconds":  # a setting with no flag (environment only)
            continue
        assert f"$REVERSI_GATEWAY_{name.upper()}" in text, name
    assert "(default: 8090)" in text
