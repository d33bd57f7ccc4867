"""The Job contract seen from inside a runner's container (docs/concepts.md#the-job-contract):
read the call JSON, and end with one line that says why.

Used by the runners that ship in the operator's image, ``reversi-mcp-runner`` and
``reversi-kube-runner``. Exit codes they share: 0 success; 1 the call was made and failed (or a
read's answer is not what was asked); 2 the call or the runner's settings are wrong.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


class CallError(Exception):
    """The call or the settings are wrong (exit 2)."""


def load_call(env: dict[str, str]) -> dict[str, Any]:
    """The call JSON (a dict) from the file ``REVERSI_CALL_FILE`` names, else from ``REVERSI_CALL``
    itself. Raises :class:`CallError` when neither is set or it is not a JSON object."""
    path = env.get("REVERSI_CALL_FILE")
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            raw = f.read()
    elif env.get("REVERSI_CALL"):
        raw = env["REVERSI_CALL"]
    else:
        raise CallError("no call: set REVERSI_CALL_FILE (a readable file) or REVERSI_CALL")
    try:
        call = json.loads(raw)
    except ValueError as err:
        raise CallError(f"call is not valid JSON: {err}") from None
    if not isinstance(call, dict):
        raise CallError("call must be a JSON object")
    return call


def fail(code: int, line: str, env: dict[str, str]) -> int:
    """Say why on stderr and in the termination log (``REVERSI_TERMINATION_LOG``, default
    ``/dev/termination-log`` where it exists: the operator copies it into the step's error);
    return ``code``. ``line`` is folded onto one line."""
    line = " ".join(line.split())
    print(line, file=sys.stderr)
    path = env.get("REVERSI_TERMINATION_LOG") or "/dev/termination-log"
    if "REVERSI_TERMINATION_LOG" in env or os.path.exists(path):
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError:
            pass
    return code
