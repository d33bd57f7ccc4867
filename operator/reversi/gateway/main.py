"""``reversi-gateway``: record every MCP tool call of an agent in a Run, then forward it.

    # in a cluster: agents send their service-account token; runs are written as them
    reversi-gateway --upstream-url http://shop-mcp:8000/mcp --manifest shop-tools --port 8090

    # locally over stdio, recording as yourself (your kubeconfig) in one named run
    reversi-gateway --listen stdio --identity self --namespace shop --run my-run \\
        --manifest shop-tools --upstream-command python demo/mcp_shop/server.py --stdio

Every flag is also an environment variable ``REVERSI_GATEWAY_<FLAG>`` (see
:mod:`reversi.gateway.settings`). Over HTTP, the first line on stdout is
``listening on http://HOST:PORT/PATH``. Exit status 2: bad settings (the message names the flag).
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
from typing import Any

import anyio
from pydantic import ValidationError

from .identity import TokenReviewer, gateway_configuration, impersonating
from .proxy import Gateway
from .settings import GatewaySettings
from .upstream import Upstream


def _help_from_settings(p: argparse.ArgumentParser) -> None:
    """Give each flag of a setting (:class:`~reversi.gateway.settings.GatewaySettings`) its
    description and default (unless it has a help of its own) and its environment variable."""
    fields = GatewaySettings.model_fields
    for action in p._actions:
        field = fields.get(action.dest)
        if field is None:
            continue
        default = "" if field.is_required() or field.default in (None, False) or field.default_factory else \
            f" (default: {field.default})"
        text = action.help or f"{field.description}{default}"
        action.help = f"{text} [${'REVERSI_GATEWAY_' + action.dest.upper()}]"


def parse(argv: list[str] | None) -> GatewaySettings:
    p = argparse.ArgumentParser(prog="reversi-gateway", description=__doc__.split("\n\n")[0].replace("``", ""),
                                epilog="Every flag is also an environment variable REVERSI_GATEWAY_<FLAG>. Over HTTP, "
                                       "the first line on stdout is 'listening on http://HOST:PORT/PATH'. Exit status "
                                       "2: bad settings (the message names the flag).",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream-url")
    p.add_argument("--upstream-command", nargs=argparse.REMAINDER,
                   help="stdio upstream: the command and its arguments (must be the last flag)")
    p.add_argument("--listen", choices=["http", "stdio"])
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--path")
    p.add_argument("--sse-responses", action="store_true", default=None)
    p.add_argument("--kubeconfig")
    p.add_argument("--identity", choices=["token", "self"])
    p.add_argument("--audience", dest="audiences", action="append")
    p.add_argument("--namespace")
    p.add_argument("--manifest")
    p.add_argument("--mode", choices=["enforce", "observe"])
    p.add_argument("--tenant")
    p.add_argument("--environment")
    p.add_argument("--actor")
    p.add_argument("--run")
    p.add_argument("--tool-map", type=json.loads, help='JSON object: MCP tool name -> manifest tool name')
    p.add_argument("--filter-tools", action="store_true", default=None)
    p.add_argument("--operator-tools", action="store_true", default=None)
    p.add_argument("--call-timeout-seconds", type=float)
    p.add_argument("--connect-timeout-seconds", type=float)
    p.add_argument("--log-level", default="INFO", help="Python logging level (default: INFO).")
    _help_from_settings(p)
    ns = p.parse_args(argv)
    logging.basicConfig(level=ns.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides: dict[str, Any] = {k: v for k, v in vars(ns).items() if v is not None and k != "log_level"}
    try:
        return GatewaySettings(**overrides)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "settings"
        p.exit(2, f"reversi-gateway: {where}: {first['msg']} (flag --{where.replace('_', '-')} or "
                  f"REVERSI_GATEWAY_{where.upper()})\n")
        raise


def build(settings: GatewaySettings) -> Gateway:
    """The gateway for ``settings``, connected to nothing yet."""
    cfg = gateway_configuration(settings.kubeconfig)
    reviewer = (TokenReviewer(impersonating(cfg, None), settings.audiences, settings.token_cache_seconds)
                if settings.identity == "token" else None)
    upstream = Upstream(settings.upstream_url, settings.upstream_command, settings.connect_timeout_seconds)
    return Gateway(settings, cfg, upstream, reviewer)


def serve_http(gateway: Gateway) -> None:
    import uvicorn

    s = gateway.settings
    family = socket.AF_INET6 if ":" in s.host else socket.AF_INET
    # proto IPPROTO_TCP, so asyncio turns Nagle off on accepted connections (TCP_NODELAY): with
    # proto 0 every small answer waits ~40 ms for the client's delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((s.host, s.port))
    sock.listen(128)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"listening on http://{shown}:{port}{s.path}", flush=True)
    server = uvicorn.Server(uvicorn.Config(gateway.http_app(), log_level="warning", lifespan="on"))
    server.run(sockets=[sock])


def serve_stdio(gateway: Gateway) -> None:
    from mcp.server.stdio import stdio_server

    async def main() -> None:
        server = gateway.server()
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


def main(argv: list[str] | None = None) -> int:
    settings = parse(argv)
    gateway = build(settings)
    if settings.listen == "stdio":
        serve_stdio(gateway)
    else:
        serve_http(gateway)
    return 0


if __name__ == "__main__":
    sys.exit(main())
