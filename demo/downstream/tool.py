#!/usr/bin/env python3
"""Compensator and reader command for the demo downstream (docs/concepts.md#the-job-contract).

Stand-alone (stdlib only, no imports from this package) so it can be copied into an image as
the command of compensator and reader Jobs. It takes no arguments::

    python tool.py            # or any path/entry point to this file

Input (environment)
  REVERSI_CALL_FILE        path of the call JSON (preferred)
  REVERSI_CALL             the call JSON itself (used when REVERSI_CALL_FILE is unset or missing)
  DOWNSTREAM_URL           base URL of the downstream server, e.g. http://127.0.0.1:8080 (required)
  REVERSI_IDEMPOTENCY_KEY  compensation key, used when the call JSON has no "idempotency_key"
  DOWNSTREAM_TIMEOUT       seconds per HTTP call (default 10)
  REVERSI_TERMINATION_LOG  where the failure line is also written (default /dev/termination-log,
                           written only if it exists; write errors are ignored)

Call JSON
  compensator: {"run_id", "step", "tool", "original_tool", "args", "idempotency_key"}
               performs ``tool`` with ``args``, sending ``Idempotency-Key: <idempotency_key>``;
               prints the downstream answer (JSON) on stdout.
  reader:      {"tool", "arguments"}  performs a read-only tool; prints its JSON answer on stdout.
  A call with "arguments" is a read, a call with "args" is a compensation.

Exit codes
  0  success
  1  the downstream refused or failed (HTTP error, timeout, connection error)
  2  the call itself is wrong: unknown tool, wrong kind of tool, missing argument, bad JSON,
     DOWNSTREAM_URL unset
  143  stopped by SIGTERM (eviction, deadline, pod deleted): the call may or may not have happened
On failure one line goes to stderr (and to the termination log).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, NamedTuple


class Tool(NamedTuple):
    kind: str                 # "compensate" or "read"
    method: str
    path: str                 # "{name}" placeholders are filled from the arguments
    body: tuple[str, ...] = ()      # required body fields
    optional: tuple[str, ...] = ()  # body fields sent when present


# The one table mapping tool names to HTTP calls.
TOOLS: dict[str, Tool] = {
    # compensations
    "payments.refund": Tool("compensate", "POST", "/payments/refunds", ("charge_id",), ("amount",)),
    "payments.void_capture": Tool("compensate", "POST", "/payments/captures/{capture_id}/void"),
    "inventory.release": Tool("compensate", "POST", "/inventory/reservations/{reservation_id}/release"),
    # read-only tools (verification)
    "payments.get_charge": Tool("read", "GET", "/payments/charges/{charge_id}"),
    "payments.get_capture": Tool("read", "GET", "/payments/captures/{capture_id}"),
    "payments.get_customer": Tool("read", "GET", "/payments/customers/{customer_id}"),
    "inventory.get_reservation": Tool("read", "GET", "/inventory/reservations/{reservation_id}"),
    "inventory.get_stock": Tool("read", "GET", "/inventory/stock/{sku}"),
    "inventory.find_reservation": Tool("read", "GET", "/inventory/orders/{order_id}/reservation"),
}


class CallError(Exception):
    """The call cannot be performed as given (exit 2)."""


class DownstreamFailure(Exception):
    """The downstream refused or did not answer (exit 1)."""


def load_call() -> dict[str, Any]:
    path = os.environ.get("REVERSI_CALL_FILE")
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            raw = f.read()
    elif os.environ.get("REVERSI_CALL"):
        raw = os.environ["REVERSI_CALL"]
    else:
        raise CallError("no call: set REVERSI_CALL_FILE (a readable file) or REVERSI_CALL")
    try:
        call = json.loads(raw)
    except ValueError as e:
        raise CallError(f"call is not valid JSON: {e}") from None
    if not isinstance(call, dict):
        raise CallError("call must be a JSON object")
    return call


def build_request(call: dict[str, Any]) -> tuple[str, Tool, str, dict[str, Any] | None, str | None]:
    """(tool name, tool, path, body, idempotency key) for a call; raises CallError."""
    if "arguments" in call:
        kind, arguments, key = "read", call["arguments"], None
    elif "args" in call:
        kind, arguments = "compensate", call["args"]
        key = call.get("idempotency_key") or os.environ.get("REVERSI_IDEMPOTENCY_KEY") or None
    else:
        raise CallError('call has neither "args" (compensation) nor "arguments" (read)')
    name = call.get("tool")
    tool = TOOLS.get(name) if isinstance(name, str) else None
    if tool is None:
        raise CallError(f"unknown tool {name!r}; known tools: {', '.join(sorted(TOOLS))}")
    if tool.kind != kind:
        wanted = "a read (\"arguments\")" if tool.kind == "read" else "a compensation (\"args\")"
        raise CallError(f"tool {name} must be called as {wanted}")
    if not isinstance(arguments, dict):
        raise CallError(f"{name}: arguments must be a JSON object")

    def need(field: str) -> Any:
        if arguments.get(field) is None:
            raise CallError(f"{name}: missing argument {field!r}")
        return arguments[field]

    path = tool.path
    for field in [part.split("}")[0] for part in tool.path.split("{")[1:]]:
        path = path.replace("{" + field + "}", urllib.parse.quote(str(need(field)), safe=""))
    body = None
    if tool.method == "POST":
        body = {field: need(field) for field in tool.body}
        body.update({f: arguments[f] for f in tool.optional if arguments.get(f) is not None})
    return name, tool, path, body, key


def perform(base_url: str, tool: Tool, path: str, body: dict | None, key: str | None,
            timeout: float) -> Any:
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if key:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(base_url.rstrip("/") + path, data=data, headers=headers,
                                     method=tool.method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")
        try:
            detail = json.loads(detail).get("error", detail)
        except (ValueError, AttributeError):
            pass
        raise DownstreamFailure(f"HTTP {e.code}: {detail}") from None
    except (TimeoutError, urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError) or isinstance(e, TimeoutError):
            raise DownstreamFailure(f"timed out after {timeout:g}s") from None
        raise DownstreamFailure(f"cannot reach {base_url}: {reason}") from None
    except ValueError:
        raise DownstreamFailure("downstream answer is not JSON") from None


def fail(code: int, line: str) -> int:
    line = " ".join(line.split())  # one line
    print(line, file=sys.stderr)
    # The default path is only written when it exists (Kubernetes mounts it); never create
    # files under /dev on a workstation.
    path = os.environ.get("REVERSI_TERMINATION_LOG") or "/dev/termination-log"
    if "REVERSI_TERMINATION_LOG" in os.environ or os.path.exists(path):
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError:
            pass
    return code


def _stop_on_sigterm(signum: int, _frame: object) -> None:
    """An eviction, a deadline or a deleted pod sends SIGTERM. In a container this program is PID 1,
    for which the kernel has no default action on SIGTERM: without this handler the pod would end only
    when the kubelet SIGKILLs it, after the grace period. The call may or may not have taken effect."""
    raise SystemExit(fail(128 + signum, "stopped by SIGTERM (the pod is being terminated): the call may or may "
                                        "not have taken effect"))


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        print(__doc__, file=sys.stderr if argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv[0] in ("-h", "--help") else 2
    name = "tool"
    try:
        call = load_call()
        name, tool, path, body, key = build_request(call)
        base_url = os.environ.get("DOWNSTREAM_URL")
        if not base_url:
            raise CallError("DOWNSTREAM_URL is not set")
        try:
            timeout = float(os.environ.get("DOWNSTREAM_TIMEOUT", "10"))
        except ValueError:
            raise CallError("DOWNSTREAM_TIMEOUT must be a number of seconds") from None
        answer = perform(base_url, tool, path, body, key, timeout)
    except CallError as e:
        return fail(2, str(e))
    except DownstreamFailure as e:
        return fail(1, f"{name}: {e}")
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
