"""Pure rules of the gateway: no I/O, no Kubernetes, no MCP session.

- :func:`run_name`: which Run a call goes to (``Reversi-Run-Id`` header, else the MCP session);
- :func:`principal_namespace`: the namespace of a service-account user;
- :func:`outcome_of`: what an upstream answer means for the step (the outcomes of docs/concepts.md#vocabulary);
- :func:`answer_json`: the JSON value of a tool answer (structured content, else JSON text).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from collections.abc import Mapping, Sequence

#: The header that names the Run (created or continued). Without it, a run per MCP session.
RUN_HEADER = "reversi-run-id"
#: The MCP session header of handshake-era (2025) connections.
SESSION_HEADER = "mcp-session-id"
#: ``_meta`` keys: what the agent may send, and what the gateway adds to each answer.
META_DEPENDS_ON = "reversi.dev/dependsOn"
META_RUN = "reversi.dev/run"
META_STEP = "reversi.dev/step"
META_OUTCOME = "reversi.dev/outcome"
META_WARNING = "reversi.dev/warning"
#: ``_meta`` key carrying the compensation's idempotency key (reversi-mcp-runner).
META_IDEMPOTENCY_KEY = "reversi.dev/idempotencyKey"

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_SA_PREFIX = "system:serviceaccount:"


class CallRefused(Exception):
    """The gateway cannot take the call (bad run name, no run, no identity); nothing was recorded
    and the upstream was not called. The message is what the agent sees."""


def run_name(headers: Mapping[str, str], default: str | None = None) -> str:
    """The Run a call is recorded in.

    ``headers`` are the HTTP request's headers (lower-case names). The rule: the
    ``Reversi-Run-Id`` header when present; else ``mcp-<session id>`` for a handshake-era MCP
    session; else ``default`` (the gateway's ``--run``, for stdio). Raises :class:`CallRefused`
    when the name is not a valid object name, or when there is nothing to name the run by.
    """
    explicit = (headers.get(RUN_HEADER) or "").strip()
    if explicit:
        if not _NAME.match(explicit):
            raise CallRefused(f"Reversi-Run-Id {explicit!r} is not a valid Run name: use lower-case letters, "
                              "digits, '-' and '.', starting and ending with a letter or digit")
        return explicit
    session = (headers.get(SESSION_HEADER) or "").strip().lower()
    if session:
        name = "mcp-" + re.sub(r"[^a-z0-9]", "", session)[:40]
        if _NAME.match(name):
            return name
    if default:
        return default
    raise CallRefused("no run to record the call in: send a Reversi-Run-Id header "
                      "(this connection has no MCP session to name one after)")


def principal_namespace(username: str) -> str | None:
    """``ns`` for ``system:serviceaccount:ns:name``, else None."""
    if username.startswith(_SA_PREFIX):
        parts = username[len(_SA_PREFIX):].split(":")
        if len(parts) == 2 and all(parts):
            return parts[0]
    return None


def principal_short_name(username: str) -> str:
    """``name`` for ``system:serviceaccount:ns:name``, else the user name itself."""
    return username.split(":")[-1] if principal_namespace(username) else username


def manifest_tool(name: str, mapping: Mapping[str, str]) -> str:
    """The manifest tool an MCP tool name records as: ``mapping[name]``, else the name itself."""
    return mapping.get(name, name)


def visible_tools(names: Sequence[str], manifest_tools: set[str] | None, mapping: Mapping[str, str]) -> list[str]:
    """The MCP tool names to list: all of them when ``manifest_tools`` is None (no filter),
    else those whose manifest tool has an entry."""
    if manifest_tools is None:
        return list(names)
    return [n for n in names if manifest_tool(n, mapping) in manifest_tools]


def answer_json(structured: Any, texts: Sequence[str]) -> Any:
    """The JSON value of a tool answer: its structured content when present; else the text
    content parsed as JSON; else ``{"text": <the text>}``; ``None`` when there is nothing."""
    if structured is not None:
        return structured
    text = "".join(texts)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return {"text": text[:4000]}


@dataclass(frozen=True)
class Outcome:
    """What to record for a step: ``outcome`` with ``result`` or ``error``."""

    outcome: str
    result: Any = None
    error: str | None = None


def outcome_of(is_error: bool, value: Any, tool_errors: str | None) -> Outcome:
    """The outcome of a call the upstream answered.

    - a normal answer: ``succeeded`` with ``value`` as the result (a dict; anything else is kept
      by the SDK as ``{"value": ...}``);
    - a tool error answer (MCP ``isError``): ``failed`` only when the tool's manifest entry says
      ``toolErrors: failed`` (the server refused, nothing happened); otherwise ``uncertain``.
    """
    if not is_error:
        return Outcome("succeeded", result=value)
    error = "tool error: " + _short(value)
    return Outcome("failed" if tool_errors == "failed" else "uncertain", error=error)


def outcome_of_exception(err: BaseException) -> Outcome:
    """A call that raised (timeout, dropped connection, cancelled, protocol error): ``uncertain``.

    The error names the exception and its message (an MCP error's own message, not its tuple).
    """
    data = getattr(err, "error", None)
    message = getattr(data, "message", None) or str(err) or "no message"
    return Outcome("uncertain", error=f"{type(err).__name__}: {message}"[:500])


def depends_on(meta: Mapping[str, Any] | None) -> list[int] | None:
    """Step indices from the request's ``_meta["reversi.dev/dependsOn"]``; raises
    :class:`CallRefused` when it is not a list of non-negative integers."""
    if not meta or META_DEPENDS_ON not in meta:
        return None
    value = meta[META_DEPENDS_ON]
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        raise CallRefused(f"_meta[{META_DEPENDS_ON!r}] must be a list of step indices (integers >= 0)")
    return list(value)


def _short(value: Any) -> str:
    if isinstance(value, dict) and set(value) == {"text"}:
        value = value["text"]
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return " ".join(text.split())[:400]
