"""An MCP agent for the gateway demo: plain MCP tool calls, no Reversi code at all.

    python demo/mcp_agent.py --url http://127.0.0.1:PORT/mcp --token-file TOKEN --run order-4711 --order o-4711

It authenticates with its service-account token and names its run with the ``Reversi-Run-Id``
header; reversi-gateway does the recording. Calls: payments.get_customer, payments.create_charge,
inventory.reserve (a mug), inventory.reserve (3 tees: out of stock, nothing happens),
email.send, then payments.create_charge of the shipping fee (a Halt may refuse it). Prints one
line per call with the step the gateway recorded. Exit 1 when a call could not be made at all.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def describe(result: Any) -> str:
    meta = result.meta or {}
    text = " ".join(getattr(c, "text", "") for c in result.content)
    where = (f"step {meta['reversi.dev/step']} {meta['reversi.dev/outcome']}" if "reversi.dev/step" in meta
             else "not recorded")
    if result.is_error:  # the whole message: a refusal names the halt, the principal or the tool
        return f"{where:<22} ERROR\n      {text}"
    return f"{where:<22} {str(result.structured_content or text)[:100]}"


async def run(url: str, token: str, run_id: str, order: str, only: str | None) -> int:
    calls = [
        ("payments.get_customer", {"customer_id": "cus_9"}),
        ("payments.create_charge", {"order_id": order, "amount": 2400, "customer": "cus_9"}),
        ("inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": order}),
        ("inventory.reserve", {"sku": "sku-tee", "qty": 3, "order_id": order}),
        ("email.send", {"to": "ada@example.com", "subject": f"Your order {order}"}),
        ("payments.create_charge", {"order_id": f"{order}-shipping", "amount": 500, "customer": "cus_9"}),
    ]
    if only:
        calls = [c for c in calls if c[0] == only][-1:]
    headers = {"Authorization": f"Bearer {token}", "Reversi-Run-Id": run_id}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http), cache=None) as client:
            tools = [t.name for t in (await client.list_tools()).tools]
            print(f"  agent: {len(tools)} tools offered through the gateway")
            for tool, args in calls:
                result = await client.call_tool(tool, args)
                print(f"  agent: {tool:<24} -> {describe(result)}", flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the gateway's MCP endpoint")
    p.add_argument("--token-file", required=True, help="the agent's service-account token")
    p.add_argument("--run", required=True)
    p.add_argument("--order", default="o-4711")
    p.add_argument("--only", help="make only the last call of this tool")
    a = p.parse_args()
    with open(a.token_file, encoding="utf-8") as f:
        token = f.read().strip()
    try:
        return asyncio.run(run(a.url, token, a.run, a.order, a.only))
    except Exception as err:  # noqa: BLE001 - say it in one line
        print(f"agent: cannot reach the gateway at {a.url}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
