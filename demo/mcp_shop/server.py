#!/usr/bin/env python3
"""A stateful shop as an MCP server (official ``mcp`` SDK): payments, inventory and an email outbox.

The tools an agent calls through reversi-gateway, and the ones reversi-mcp-runner calls to undo
and check them. State lives in memory; every ``tools/call`` that reaches the server is logged,
so a test can prove what the server saw (and what it never saw).

    python demo/mcp_shop/server.py --port 0            # streamable HTTP; prints "listening on URL"
    python demo/mcp_shop/server.py --stdio --state-file s.json   # over stdio; state written after each call

Tools
  payments.get_customer(customer_id)                 read
  payments.create_charge(order_id, amount, customer) -> {id, order_id, amount, refunded: false}
  payments.refund(charge_id[, amount])               compensation; -> the charge, refunded: true
  payments.get_charge(charge_id)                     read
  inventory.reserve(sku, qty, order_id)              -> {id, sku, qty, status: reserved}; a tool
                                                     error "out of stock" changes nothing
  inventory.release(reservation_id)                  compensation; -> status: released
  inventory.get_reservation(reservation_id)          read
  inventory.get_stock(sku)                           read
  email.send(to, subject)                            irreversible: the outbox keeps it

Idempotency: a call whose request ``_meta`` carries ``reversi.dev/idempotencyKey`` is done once
per key; a repeat returns the first answer and is logged ``replayed``.

Test controls over HTTP, next to ``/mcp``:
  GET  /_state                   {"charges", "reservations", "stock", "outbox", "calls"}
  POST /_faults {"tool", "delay_s", "times"}   the next ``times`` calls of ``tool`` take effect,
                                 then answer only after ``delay_s`` seconds (a slow server)
  POST /_reset                   back to the seed state
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import sys
import time
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server

IDEMPOTENCY_META = "reversi.dev/idempotencyKey"
SEED = {"customers": {"cus_9": {"id": "cus_9", "name": "Ada", "email": "ada@example.com"}},
        "stock": {"sku-mug": 5, "sku-tee": 1}}


def _schema(required: dict[str, str], optional: dict[str, str] | None = None) -> dict[str, Any]:
    props = {k: {"type": v} for k, v in {**required, **(optional or {})}.items()}
    return {"type": "object", "properties": props, "required": list(required)}


TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "payments.get_customer": ("Read a customer.", _schema({"customer_id": "string"})),
    "payments.create_charge": ("Charge a customer for an order.",
                               _schema({"order_id": "string", "amount": "integer", "customer": "string"})),
    "payments.refund": ("Refund a charge.", _schema({"charge_id": "string"}, {"amount": "integer"})),
    "payments.get_charge": ("Read a charge.", _schema({"charge_id": "string"})),
    "inventory.reserve": ("Reserve stock for an order.",
                          _schema({"sku": "string", "qty": "integer", "order_id": "string"})),
    "inventory.release": ("Release a reservation.", _schema({"reservation_id": "string"})),
    "inventory.get_reservation": ("Read a reservation.", _schema({"reservation_id": "string"})),
    "inventory.get_stock": ("Read the stock of a SKU.", _schema({"sku": "string"})),
    "email.send": ("Send an email (cannot be taken back).", _schema({"to": "string", "subject": "string"})),
}


class ToolError(Exception):
    """A refusal: the call changed nothing (answered as an MCP tool error)."""


class Shop:
    """The server's state and the tools' effects."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.customers = copy.deepcopy(SEED["customers"])
        self.stock: dict[str, int] = dict(SEED["stock"])
        self.charges: dict[str, dict] = {}
        self.reservations: dict[str, dict] = {}
        self.outbox: list[dict] = []
        self.calls: list[dict] = []
        self.done: dict[str, Any] = {}   # idempotency key -> first answer
        self.faults: dict[str, dict] = {}

    def state(self) -> dict[str, Any]:
        return {"charges": self.charges, "reservations": self.reservations, "stock": self.stock,
                "outbox": self.outbox, "calls": self.calls}

    def call(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        def need(name: str) -> Any:
            if args.get(name) is None:
                raise ToolError(f"{tool}: missing argument {name!r}")
            return args[name]

        if tool == "payments.get_customer":
            return self._get(self.customers, need("customer_id"), "customer")
        if tool == "payments.create_charge":
            charge_id = f"ch_{len(self.charges) + 1}_{need('order_id')}"
            self.charges[charge_id] = {"id": charge_id, "order_id": args["order_id"], "amount": int(need("amount")),
                                       "customer": need("customer"), "refunded": False}
            return dict(self.charges[charge_id])
        if tool == "payments.refund":
            charge = self._get(self.charges, need("charge_id"), "charge", copy_=False)
            charge["refunded"] = True
            charge["refunded_amount"] = int(args.get("amount") or charge["amount"])
            return dict(charge)
        if tool == "payments.get_charge":
            return self._get(self.charges, need("charge_id"), "charge")
        if tool == "inventory.reserve":
            sku, qty = need("sku"), int(need("qty"))
            if self.stock.get(sku, 0) < qty:
                raise ToolError(f"out of stock: {sku} has {self.stock.get(sku, 0)}, {qty} wanted")
            self.stock[sku] -= qty
            rid = f"res_{len(self.reservations) + 1}"
            self.reservations[rid] = {"id": rid, "sku": sku, "qty": qty, "order_id": need("order_id"),
                                      "status": "reserved"}
            return dict(self.reservations[rid])
        if tool == "inventory.release":
            res = self._get(self.reservations, need("reservation_id"), "reservation", copy_=False)
            if res["status"] == "reserved":
                res["status"] = "released"
                self.stock[res["sku"]] += res["qty"]
            return dict(res)
        if tool == "inventory.get_reservation":
            return self._get(self.reservations, need("reservation_id"), "reservation")
        if tool == "inventory.get_stock":
            return {"sku": need("sku"), "available": self.stock.get(args["sku"], 0)}
        if tool == "email.send":
            mail = {"id": f"mail_{len(self.outbox) + 1}", "to": need("to"), "subject": need("subject")}
            self.outbox.append(mail)
            return dict(mail)
        raise ToolError(f"unknown tool {tool!r}")

    @staticmethod
    def _get(table: dict, key: str, what: str, copy_: bool = True) -> dict:
        if key not in table:
            raise ToolError(f"no {what} {key!r}")
        return dict(table[key]) if copy_ else table[key]


def build_server(shop: Shop, state_file: str | None = None) -> Server:
    """The MCP server over ``shop``; with ``state_file``, the state is written there after each call."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name=n, description=d, input_schema=s)
                                            for n, (d, s) in TOOLS.items()])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = dict(params.arguments or {})
        key = (ctx.meta or {}).get(IDEMPOTENCY_META)
        entry: dict[str, Any] = {"at": time.time(), "tool": params.name, "args": args, "idempotency_key": key,
                                 "replayed": False}
        shop.calls.append(entry)
        if key and (params.name, key) in shop.done:
            entry["replayed"] = True
            answer, error = shop.done[(params.name, key)]
        else:
            try:
                answer, error = shop.call(params.name, args), None
            except ToolError as err:
                answer, error = None, str(err)
            if key and error is None:
                shop.done[(params.name, key)] = (answer, error)
        entry["error"] = error
        if state_file:
            with open(state_file + ".tmp", "w", encoding="utf-8") as f:
                json.dump(shop.state(), f)
            os.replace(state_file + ".tmp", state_file)
        fault = shop.faults.get(params.name)
        if fault and fault["times"] > 0:
            fault["times"] -= 1
            await anyio.sleep(float(fault["delay_s"]))  # the effect is done; the answer is late
        if error is not None:
            return types.CallToolResult(content=[types.TextContent(text=error)], is_error=True)
        return types.CallToolResult(content=[types.TextContent(text=json.dumps(answer))], structured_content=answer)

    return Server("reversi-demo-shop", version="0.1.0", on_list_tools=list_tools, on_call_tool=call_tool)


def http_app(shop: Shop, host: str) -> Any:
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def state(_request: Request) -> JSONResponse:
        return JSONResponse(shop.state())

    async def faults(request: Request) -> JSONResponse:
        body = await request.json()
        shop.faults[body["tool"]] = {"delay_s": float(body.get("delay_s", 3)), "times": int(body.get("times", 1))}
        return JSONResponse({"ok": True})

    async def reset(_request: Request) -> JSONResponse:
        shop.reset()
        return JSONResponse({"ok": True})

    routes = [Route("/_state", state), Route("/_faults", faults, methods=["POST"]),
              Route("/_reset", reset, methods=["POST"])]
    # single JSON answers, not SSE streams: no TCP delayed-ACK wait (~40 ms) on each small answer
    return build_server(shop).streamable_http_app(host=host, custom_starlette_routes=routes, json_response=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: any free port")
    p.add_argument("--stdio", action="store_true", help="serve over stdio instead of HTTP")
    p.add_argument("--state-file", help="write the state (with the call log) here after each call")
    ns = p.parse_args(argv)
    shop = Shop()
    if ns.stdio:
        from mcp.server.stdio import stdio_server

        async def run() -> None:
            server = build_server(shop, ns.state_file)
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(run)
        return 0
    import uvicorn

    # proto IPPROTO_TCP, so asyncio turns Nagle off on accepted connections (TCP_NODELAY)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((ns.host, ns.port))
    sock.listen(128)
    print(f"listening on http://{ns.host}:{sock.getsockname()[1]}/mcp", flush=True)
    uvicorn.Server(uvicorn.Config(http_app(shop, ns.host), log_level="warning")).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
