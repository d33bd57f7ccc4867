"""reversi-gateway's pure rules and reversi-mcp-runner, without a cluster.

The runner is exercised against the demo MCP shop in-process (the SDK's in-memory transport).
"""

from __future__ import annotations

import anyio
import pytest

from demo.mcp_shop.server import Shop, build_server
from reversi.gateway import calls, runner
from reversi.gateway.settings import GatewaySettings


# ----- which run ----------------------------------------------------------------------------

def test_run_is_named_by_the_header_first():
    assert calls.run_name({"reversi-run-id": "order-7", "mcp-session-id": "abc"}) == "order-7"


def test_run_without_header_is_one_per_mcp_session():
    assert calls.run_name({"mcp-session-id": "0F3A-99"}) == "mcp-0f3a99"


def test_run_without_header_or_session_takes_the_default_or_is_refused():
    assert calls.run_name({}, default="local") == "local"
    with pytest.raises(calls.CallRefused, match="Reversi-Run-Id"):
        calls.run_name({})


@pytest.mark.parametrize("bad", ["Order_7", "-x", "a" * 254, "x/y"])
def test_run_header_must_be_an_object_name(bad):
    with pytest.raises(calls.CallRefused, match="not a valid Run name"):
        calls.run_name({"reversi-run-id": bad})


def test_service_account_names_its_namespace_and_actor():
    user = "system:serviceaccount:shop:checkout-agent"
    assert calls.principal_namespace(user) == "shop"
    assert calls.principal_short_name(user) == "checkout-agent"
    assert calls.principal_namespace("alice") is None and calls.principal_short_name("alice") == "alice"


# ----- tools ---------------------------------------------------------------------------------

def test_tool_names_map_one_to_one_unless_configured():
    mapping = {"charge": "payments.create_charge"}
    assert calls.manifest_tool("charge", mapping) == "payments.create_charge"
    assert calls.manifest_tool("email.send", mapping) == "email.send"


def test_tool_filter_keeps_tools_with_a_manifest_entry():
    names = ["charge", "email.send", "debug.dump"]
    assert calls.visible_tools(names, None, {}) == names
    assert calls.visible_tools(names, {"payments.create_charge", "email.send"},
                               {"charge": "payments.create_charge"}) == ["charge", "email.send"]


# ----- outcomes ------------------------------------------------------------------------------

def test_answer_is_structured_content_else_json_text_else_text():
    assert calls.answer_json({"id": 1}, ['{"id": 2}']) == {"id": 1}
    assert calls.answer_json(None, ['{"id": ', "2}"]) == {"id": 2}
    assert calls.answer_json(None, ["done"]) == {"text": "done"}
    assert calls.answer_json(None, []) is None


def test_normal_answer_is_succeeded_with_its_result():
    assert calls.outcome_of(False, {"id": "ch_1"}, None) == calls.Outcome("succeeded", result={"id": "ch_1"})


def test_tool_error_is_uncertain_unless_the_manifest_says_failed():
    assert calls.outcome_of(True, {"text": "declined"}, None).outcome == "uncertain"
    assert calls.outcome_of(True, {"text": "declined"}, "uncertain").outcome == "uncertain"
    failed = calls.outcome_of(True, {"text": "declined"}, "failed")
    assert failed.outcome == "failed" and failed.error == "tool error: declined"


def test_a_call_that_raised_is_uncertain():
    out = calls.outcome_of_exception(TimeoutError("no answer"))
    assert out.outcome == "uncertain" and out.error == "TimeoutError: no answer"
    from mcp.shared.exceptions import MCPError

    timed_out = calls.outcome_of_exception(MCPError(-32001, "Request 'tools/call' timed out"))
    assert timed_out.error == "MCPError: Request 'tools/call' timed out"


def test_depends_on_comes_from_request_meta():
    assert calls.depends_on(None) is None
    assert calls.depends_on({calls.META_DEPENDS_ON: [0, 2]}) == [0, 2]
    for bad in ([-1], ["0"], 3, [True]):
        with pytest.raises(calls.CallRefused, match="list of step indices"):
            calls.depends_on({calls.META_DEPENDS_ON: bad})


# ----- settings ------------------------------------------------------------------------------

def test_settings_need_exactly_one_upstream():
    with pytest.raises(ValueError, match="exactly one upstream"):
        GatewaySettings(manifest="m")
    with pytest.raises(ValueError, match="exactly one upstream"):
        GatewaySettings(manifest="m", upstream_url="http://x/mcp", upstream_command=["srv"])
    s = GatewaySettings(manifest="m", upstream_url="http://x/mcp", tenant="acme")
    assert s.scope("agent-a") == {"actor": "agent-a", "tenant": "acme"}


def test_stdio_records_as_the_gateway_itself():
    with pytest.raises(ValueError, match="no token to review"):
        GatewaySettings(manifest="m", upstream_url="http://x/mcp", listen="stdio")


def test_self_identity_over_http_is_loopback_only():
    with pytest.raises(ValueError, match="loopback"):
        GatewaySettings(manifest="m", upstream_url="http://x/mcp", identity="self", host="0.0.0.0")


# ----- reversi-mcp-runner --------------------------------------------------------------------

def test_runner_compensation_carries_the_idempotency_key_in_meta():
    call = {"run_id": "r", "step": 1, "tool": "payments.refund", "original_tool": "payments.create_charge",
            "args": {"charge_id": "ch_1"}, "idempotency_key": "k-1"}
    assert runner.request_of(call, {}) == ("payments.refund", {"charge_id": "ch_1"},
                                           {calls.META_IDEMPOTENCY_KEY: "k-1"}, False)
    del call["idempotency_key"]
    assert runner.request_of(call, {"REVERSI_IDEMPOTENCY_KEY": "k-env"})[2] == {calls.META_IDEMPOTENCY_KEY: "k-env"}


def test_runner_reader_call_has_no_key():
    assert runner.request_of({"tool": "payments.get_charge", "arguments": {"charge_id": "c"}}, {}) == (
        "payments.get_charge", {"charge_id": "c"}, None, True)


@pytest.mark.parametrize("call, message", [({"args": {}}, 'no "tool"'), ({"tool": "t"}, "neither"),
                                           ({"tool": "t", "args": []}, "JSON object")])
def test_runner_refuses_a_malformed_call(call, message):
    with pytest.raises(runner.CallError, match=message):
        runner.request_of(call, {})


def test_runner_needs_exactly_one_server():
    with pytest.raises(runner.CallError, match="exactly one"):
        runner.server_of({})
    assert runner.server_of({"REVERSI_MCP_URL": "http://s/mcp", "REVERSI_MCP_TOKEN": "t"}) == (
        "http://s/mcp", {"Authorization": "Bearer t"})


def test_runner_exits_2_with_a_termination_message_for_a_bad_call(tmp_path, monkeypatch):
    log = tmp_path / "termination-log"
    monkeypatch.setenv("REVERSI_CALL", "not json")
    monkeypatch.setenv("REVERSI_TERMINATION_LOG", str(log))
    monkeypatch.delenv("REVERSI_CALL_FILE", raising=False)
    assert runner.main([]) == 2
    assert log.read_text().startswith("call is not valid JSON")


def test_runner_undoes_and_reads_back_on_an_mcp_server_once_per_key():
    shop = Shop()
    server = build_server(shop)
    charge = shop.call("payments.create_charge", {"order_id": "o-1", "amount": 5, "customer": "cus_9"})
    key = {calls.META_IDEMPOTENCY_KEY: "refund-1"}

    async def go():
        first = await runner.call_tool(server, {}, "payments.refund", {"charge_id": charge["id"]}, key, 5)
        again = await runner.call_tool(server, {}, "payments.refund", {"charge_id": charge["id"]}, key, 5)
        read = await runner.call_tool(server, {}, "payments.get_charge", {"charge_id": charge["id"]}, None, 5)
        return first, again, read

    first, again, read = anyio.run(go)
    assert first == again and read["refunded"] is True
    assert [c["replayed"] for c in shop.calls if c["tool"] == "payments.refund"] == [False, True]


def test_runner_reports_a_tool_error_as_a_server_failure():
    server = build_server(Shop())
    with pytest.raises(runner.ServerFailure, match="tool error: no reservation 'nope'"):
        anyio.run(runner.call_tool, server, {}, "inventory.release", {"reservation_id": "nope"}, None, 5)


# ----- the upstream connection ---------------------------------------------------------------

def test_upstream_connection_is_made_again_after_the_server_restarts(tmp_path):
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from reversi.gateway.upstream import Upstream

    server = Path(__file__).resolve().parents[2] / "demo" / "mcp_shop" / "server.py"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def start() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, str(server), "--port", str(port)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().startswith("listening on ")
        return proc

    shop = start()
    upstream = Upstream(f"http://127.0.0.1:{port}/mcp", connect_timeout=10)

    async def go() -> list[str]:
        nonlocal shop
        seen = []
        async with anyio.create_task_group() as tg:
            await tg.start(upstream.run)
            c = await upstream.client()
            seen.append((await c.call_tool("inventory.get_stock", {"sku": "sku-mug"})).structured_content["sku"])
            shop.terminate()
            shop.wait(timeout=10)
            with pytest.raises(Exception):  # noqa: B017 - whatever the transport raises once the server is gone
                await c.call_tool("inventory.get_stock", {"sku": "sku-mug"}, read_timeout_seconds=5)
            upstream.broken(c)
            assert not upstream.connected
            shop = start()
            c2 = await upstream.client()
            assert c2 is not c
            seen.append((await c2.call_tool("inventory.get_stock", {"sku": "sku-tee"})).structured_content["sku"])
            tg.cancel_scope.cancel()
        return seen

    try:
        assert anyio.run(go) == ["sku-mug", "sku-tee"]
    finally:
        shop.terminate()
        shop.wait(timeout=10)
