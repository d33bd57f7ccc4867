#!/usr/bin/env python3
"""A compensator and reader for Reversi's Job contract (docs/concepts.md#the-job-contract), to copy.

The ToolManifest in docs/examples/toolmanifest.yaml runs it as ``payments-tool`` for two tools of a
payments API: ``payments.refund`` (the compensation of ``payments.create_charge``) and
``payments.get_charge`` (the read-back that checks the refund). Replace the two functions of TOOLS
with calls of your own API; keep the rest, which is the contract:

- **Input.** The call JSON is in the file ``$REVERSI_CALL_FILE`` (else ``$REVERSI_CALL``). A
  compensation is ``{"run_id", "step", "tool", "original_tool", "args", "idempotency_key"}``; a read
  is ``{"tool", "arguments"}``. Credentials come from the environment (the runner's ``envFrom`` names a
  Secret): here ``PAYMENTS_URL`` and ``PAYMENTS_TOKEN``.
- **Once.** Send ``idempotency_key`` to your API with the compensation: a Job that is retried (an
  eviction, a node lost) sends the same key, so the refund happens once.
- **Output.** Print the answer as JSON on stdout and exit 0. A read's answer is compared with the
  manifest's ``expect``.
- **Failure.** Exit 1 when the API refused or did not answer, 2 when the call is wrong; either way one
  line on stderr and in ``/dev/termination-log`` (the step's error shows it). On SIGTERM (the pod is
  stopped) exit 143: the call may or may not have happened, and Reversi does not take it for done.

It needs only Python's standard library, runs as any user, and writes nothing but the termination log
(the restricted Pod Security Standard: UID 65532, a read-only root file system).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

TIMEOUT_SECONDS = 10.0


class CallError(Exception):
    """The call is wrong: an unknown tool, a missing argument (exit 2)."""


class ApiFailure(Exception):
    """The API refused or did not answer (exit 1)."""


def api(method: str, path: str, body: dict[str, Any] | None = None, key: str | None = None) -> Any:
    """One call of the payments API, its JSON answer; raises ApiFailure."""
    base = os.environ.get("PAYMENTS_URL")
    if not base:
        raise CallError("PAYMENTS_URL is not set (the runner's envFrom Secret gives it)")
    headers = {"Accept": "application/json"}
    if os.environ.get("PAYMENTS_TOKEN"):
        headers["Authorization"] = f"Bearer {os.environ['PAYMENTS_TOKEN']}"
    if key:
        headers["Idempotency-Key"] = key
    data = None if body is None else json.dumps(body).encode()
    if data is not None:
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(base.rstrip("/") + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as answer:
            return json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as err:
        raise ApiFailure(f"{method} {path}: HTTP {err.code}") from None
    except (OSError, ValueError) as err:
        raise ApiFailure(f"{method} {path}: {err}") from None


def refund(args: dict[str, Any], key: str | None) -> Any:
    if not args.get("charge_id"):
        raise CallError("payments.refund: missing argument 'charge_id'")
    body = {"charge_id": args["charge_id"], **({"amount": args["amount"]} if args.get("amount") else {})}
    return api("POST", "/payments/refunds", body, key)


def get_charge(args: dict[str, Any], _key: str | None) -> Any:
    if not args.get("charge_id"):
        raise CallError("payments.get_charge: missing argument 'charge_id'")
    return api("GET", "/payments/charges/" + urllib.parse.quote(str(args["charge_id"]), safe=""))


#: tool -> (kind, function): "compensate" for an undo, "read" for a read-back
TOOLS: dict[str, tuple[str, Callable[[dict[str, Any], str | None], Any]]] = {
    "payments.refund": ("compensate", refund),
    "payments.get_charge": ("read", get_charge),
}


def load_call() -> dict[str, Any]:
    path = os.environ.get("REVERSI_CALL_FILE")
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as file:
            raw = file.read()
    else:
        raw = os.environ.get("REVERSI_CALL") or ""
    try:
        call = json.loads(raw)
    except ValueError:
        raise CallError("no call JSON in REVERSI_CALL_FILE or REVERSI_CALL") from None
    if not isinstance(call, dict):
        raise CallError("the call JSON is not an object")
    return call


def fail(code: int, line: str) -> int:
    line = " ".join(line.split())
    print(line, file=sys.stderr)
    log = os.environ.get("REVERSI_TERMINATION_LOG") or "/dev/termination-log"
    if "REVERSI_TERMINATION_LOG" in os.environ or os.path.exists(log):
        try:
            with open(log, "w", encoding="utf-8") as file:
                file.write(line + "\n")
        except OSError:
            pass
    return code


def stopped(signum: int, _frame: object) -> None:
    raise SystemExit(fail(128 + signum, "stopped by SIGTERM: the call may or may not have happened"))


def main() -> int:
    signal.signal(signal.SIGTERM, stopped)
    try:
        call = load_call()
        kind = "read" if "arguments" in call else "compensate"
        name = call.get("tool")
        known = TOOLS.get(name) if isinstance(name, str) else None
        if known is None or known[0] != kind:
            raise CallError(f"{name!r} is not a {kind} tool of this runner (it knows {', '.join(sorted(TOOLS))})")
        arguments = call.get("arguments" if kind == "read" else "args")
        if not isinstance(arguments, dict):
            raise CallError(f"{name}: its arguments are not an object")
        key = call.get("idempotency_key") or os.environ.get("REVERSI_IDEMPOTENCY_KEY")
        answer = known[1](arguments, key if kind == "compensate" else None)
    except CallError as err:
        return fail(2, str(err))
    except ApiFailure as err:
        return fail(1, str(err))
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
