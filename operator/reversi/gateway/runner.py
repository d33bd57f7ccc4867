"""``reversi-mcp-runner``: compensator and reader Jobs that call tools on an MCP server.

A ToolManifest runner whose command is ``reversi-mcp-runner`` needs no compensator code: the
compensation (or verification) tool is called on the team's MCP server. Job contract: docs/concepts.md#the-job-contract.

Input (environment)
  REVERSI_CALL_FILE        path of the call JSON (preferred); else REVERSI_CALL, the JSON itself
  REVERSI_MCP_URL          the MCP server, streamable HTTP (or REVERSI_MCP_COMMAND)
  REVERSI_MCP_COMMAND      the MCP server as a stdio subprocess, e.g. "python server.py --stdio"
  REVERSI_MCP_TOKEN        bearer token sent to the MCP server (or REVERSI_MCP_TOKEN_FILE)
  REVERSI_MCP_TIMEOUT      seconds the tool call may take (default 30)
  REVERSI_IDEMPOTENCY_KEY  compensation key, when the call JSON has no "idempotency_key"
  REVERSI_TERMINATION_LOG  where the failure line is written (default /dev/termination-log, if it exists)

Call JSON
  compensator {"run_id", "step", "tool", "original_tool", "args", "idempotency_key"}: calls
              ``tool(args)`` with ``_meta["reversi.dev/idempotencyKey"] = idempotency_key`` (the
              same key on every retry, so the server can do it once); prints the answer.
  reader      {"tool", "arguments"}: calls ``tool(arguments)``; prints its JSON answer (structured
              content, else the text), which the operator compares with ``expect``.

Exit codes: 0 success; 1 the server refused or failed (tool error, protocol error, timeout,
unreachable; for a reader also an answer that is not JSON); 2 the call or the settings are wrong.
On failure one line goes to stderr and to the termination log.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import Any, cast

import anyio

from ..adapters.job_io import CallError, fail, load_call
from .calls import META_IDEMPOTENCY_KEY, answer_json

__all__ = ["CallError", "ServerFailure", "call_tool", "fail", "load_call", "main", "request_of", "server_of"]

DEFAULT_TIMEOUT = 30.0


class ServerFailure(Exception):
    """The MCP server refused, failed or did not answer (exit 1)."""


def request_of(call: dict[str, Any], env: dict[str, str]) -> tuple[str, dict[str, Any], dict[str, Any] | None, bool]:
    """``(tool, arguments, _meta, is_read)`` for a call; raises :class:`CallError`.

    A call with ``"arguments"`` is a read; one with ``"args"`` is a compensation, whose
    idempotency key (``idempotency_key``, else ``REVERSI_IDEMPOTENCY_KEY``) goes in ``_meta``.
    """
    tool = call.get("tool")
    if not isinstance(tool, str) or not tool:
        raise CallError('call has no "tool"')
    if "arguments" in call:
        arguments, meta, read = call["arguments"], None, True
    elif "args" in call:
        arguments, read = call["args"], False
        key = call.get("idempotency_key") or env.get("REVERSI_IDEMPOTENCY_KEY")
        meta = {META_IDEMPOTENCY_KEY: key} if key else None
    else:
        raise CallError('call has neither "args" (compensation) nor "arguments" (read)')
    if not isinstance(arguments, dict):
        raise CallError(f"{tool}: arguments must be a JSON object")
    return tool, arguments, meta, read


def server_of(env: dict[str, str]) -> tuple[Any, dict[str, str]]:
    """What to connect to (URL or stdio parameters) and the HTTP headers; raises :class:`CallError`."""
    from mcp import StdioServerParameters

    url, command = env.get("REVERSI_MCP_URL"), env.get("REVERSI_MCP_COMMAND")
    if bool(url) == bool(command):
        raise CallError("set exactly one of REVERSI_MCP_URL (streamable HTTP) and REVERSI_MCP_COMMAND (stdio)")
    token = env.get("REVERSI_MCP_TOKEN")
    if not token and env.get("REVERSI_MCP_TOKEN_FILE"):
        try:
            with open(env["REVERSI_MCP_TOKEN_FILE"], encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as err:
            raise CallError(f"cannot read REVERSI_MCP_TOKEN_FILE: {err}") from None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if url:
        return url, headers
    parts = shlex.split(command or "")
    return StdioServerParameters(command=parts[0], args=parts[1:], env=dict(env)), headers


async def call_tool(server: Any, headers: dict[str, str], tool: str, arguments: dict[str, Any],
                    meta: dict[str, Any] | None, timeout: float) -> Any:
    """Call one tool; the JSON answer, or :class:`ServerFailure`."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
    import mcp_types as types

    target = server
    if isinstance(server, str):
        import httpx2

        target = streamable_http_client(server, http_client=httpx2.AsyncClient(headers=headers, timeout=timeout))
    try:
        with anyio.fail_after(timeout + 5):
            async with Client(target, cache=None) as client:
                # _meta takes any keys (MCP); the SDK's RequestParamsMeta type names only progressToken
                result = await client.call_tool(tool, arguments, read_timeout_seconds=timeout,
                                                meta=cast("types.RequestParamsMeta | None", meta))
    except MCPError as err:
        raise ServerFailure(f"{tool}: {err.error.message}") from None
    except TimeoutError:
        raise ServerFailure(f"{tool}: no answer after {timeout:g}s") from None
    except Exception as err:  # noqa: BLE001 - unreachable server, broken transport
        raise ServerFailure(f"{tool}: cannot reach the MCP server: {type(err).__name__}: {err}") from None
    texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    if result.is_error:
        raise ServerFailure(f"{tool}: tool error: {' '.join(texts) or 'no message'}")
    return answer_json(result.structured_content, texts)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        print(__doc__.replace("``", ""), file=sys.stdout if argv[0] in ("-h", "--help") else sys.stderr)
        return 0 if argv[0] in ("-h", "--help") else 2
    env = dict(os.environ)
    try:
        call = load_call(env)
        tool, arguments, meta, read = request_of(call, env)
        server, headers = server_of(env)
        try:
            timeout = float(env.get("REVERSI_MCP_TIMEOUT", DEFAULT_TIMEOUT))
        except ValueError:
            raise CallError("REVERSI_MCP_TIMEOUT must be a number of seconds") from None
        answer = anyio.run(call_tool, server, headers, tool, arguments, meta, timeout)
        if read and isinstance(answer, dict) and set(answer) == {"text"}:
            raise ServerFailure(f"{tool}: the answer is not JSON: {answer['text'][:200]}")
    except CallError as err:
        return fail(2, str(err), env)
    except ServerFailure as err:
        return fail(1, str(err), env)
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
