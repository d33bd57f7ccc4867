"""Latency reversi-gateway adds to one MCP tool call.

    python benchmarks/gateway_bench.py [--calls 200] [--warmup 20] [--json]

On the local control plane (started if it is not running, stopped again if it was started
here), with the operator, its admission webhooks and the recorded call's admission policies (every
recorded step is admitted by the API server's policies, no webhook),
the demo MCP shop and the gateway (demo/mcp_demo.py's ``Stack``). One MCP client session each:

- **direct**: ``payments.get_customer`` on the shop itself, nothing recorded;
- **sdk**: the same direct call recorded by the Python SDK in the agent's process
  (``Recorder.begin``, the call, ``Recorder.finish``, as the same service account): what
  recording costs without the gateway;
- **gateway**: the same call through the gateway, with a service-account token: TokenReview
  (cached), the step recorded ``intended`` (a create of its RunStep), the call forwarded, the
  outcome recorded (a JSON patch of the RunStep).

All three run in the same process, round-robin (one of each per iteration, so they share the
machine's load), ``--calls`` each after ``--warmup`` unmeasured ones; the SDK's calls go into
one Run and the gateway's into another. Printed: median and p99 of each, the
median added per call and the ratio gateway/direct, the gateway's own share (gateway minus sdk),
and the median of the first and last 20% of each run (whether recording costs more late in a run
than early: each step is a RunStep of its own, docs/concepts.md#the-journal).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from demo.mcp_demo import Stack  # noqa: E402

TOOL, ARGS = "payments.get_customer", {"customer_id": "cus_9"}


async def measure(stack: Stack, warmup: int, calls: int) -> dict[str, list[float]]:
    """Round-robin: one direct, one SDK-recorded and one gateway call per iteration, so all
    three see the same machine load; returns the measured milliseconds of each."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from reversi.sdk import Recorder

    token = stack.tokens["checkout-agent"].read_text()
    rec = await asyncio.to_thread(Recorder.open, stack.namespace, "bench-sdk", manifest="shop-mcp",
                                  api=stack.api_as("checkout-agent"), scope={"actor": "checkout-agent"})
    gw_headers = {"Authorization": f"Bearer {token}", "Reversi-Run-Id": "bench-gateway"}
    async with httpx2.AsyncClient(timeout=60) as h1, httpx2.AsyncClient(headers=gw_headers, timeout=60) as h2:
        async with Client(streamable_http_client(stack.shop_url, http_client=h1), cache=None) as shop, \
                Client(streamable_http_client(stack.gateway_url, http_client=h2), cache=None) as gateway:
            async def direct():
                return await shop.call_tool(TOOL, ARGS)

            async def sdk():
                step = await asyncio.to_thread(rec.begin, TOOL, ARGS)
                result = await shop.call_tool(TOOL, ARGS)
                await asyncio.to_thread(rec.finish, step, "succeeded", result.structured_content)
                return result

            async def through():
                return await gateway.call_tool(TOOL, ARGS)

            ways = {"direct": direct, "sdk": sdk, "gateway": through}
            out: dict[str, list[float]] = {k: [] for k in ways}
            for i in range(warmup + calls):
                for name, fn in ways.items():
                    t = time.perf_counter()
                    result = await fn()
                    if result.is_error:
                        raise RuntimeError(f"{name} call failed: {result.content[0].text}")
                    if i >= warmup:
                        out[name].append((time.perf_counter() - t) * 1000)
            return out


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[98] if len(xs) > 1 else xs[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    stack = Stack(namespace="reversi-bench-gateway")
    try:
        stack.up(log=lambda m: print(m, file=sys.stderr))
        times = asyncio.run(measure(stack, a.warmup, a.calls))
    finally:
        stack.down()
    direct, sdk, gateway = times["direct"], times["sdk"], times["gateway"]
    fifth = max(1, a.calls // 5)
    def summary(xs: list[float]) -> dict[str, float]:
        return {"median": statistics.median(xs), "p99": p99(xs), "median_first_20pct": statistics.median(xs[:fifth]),
                "median_last_20pct": statistics.median(xs[-fifth:])}

    out = {"calls": a.calls, "warmup": a.warmup, "direct_ms": summary(direct), "sdk_ms": summary(sdk),
           "gateway_ms": summary(gateway)}
    out["added_median_ms"] = out["gateway_ms"]["median"] - out["direct_ms"]["median"]
    out["added_p99_ms"] = out["gateway_ms"]["p99"] - out["direct_ms"]["p99"]
    out["ratio_median"] = out["gateway_ms"]["median"] / out["direct_ms"]["median"]
    out["gateway_over_sdk_median_ms"] = out["gateway_ms"]["median"] - out["sdk_ms"]["median"]
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    d, k, g = out["direct_ms"], out["sdk_ms"], out["gateway_ms"]
    print(f"MCP tool call {TOOL}: {a.calls} measured calls each, after {a.warmup} warm-up calls "
          f"(the recorded runs reach {a.calls + a.warmup} steps)")
    print(f"  {'':32} {'median':>9} {'p99':>9} {'first 20%':>10} {'last 20%':>10}   (ms)")
    for label, x in (("direct to the MCP server", d), ("direct, recorded by the SDK", k),
                     ("through reversi-gateway", g)):
        print(f"  {label:32} {x['median']:9.2f} {x['p99']:9.2f} {x['median_first_20pct']:10.2f} "
              f"{x['median_last_20pct']:10.2f}")
    print(f"  added by the gateway vs direct:  median {out['added_median_ms']:.2f} ms, "
          f"p99 {out['added_p99_ms']:.2f} ms, "
          f"ratio of medians {out['ratio_median']:.1f}x")
    print(f"  the gateway's own share (gateway - SDK-recorded): median {out['gateway_over_sdk_median_ms']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
