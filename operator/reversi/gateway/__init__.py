"""reversi-gateway: an MCP proxy that records every tool call of an agent in a Run.

The gateway is an MCP server towards the agent and an MCP client towards the tool server
(the *upstream*). Each ``tools/call`` is recorded through the SDK (:class:`reversi.sdk.Recorder`)
exactly as a Python agent would record it: ``intended`` before the call is forwarded, then
``succeeded``, ``failed`` or ``uncertain``. A refused recording (halt, another principal, unknown
tool, duplicate) comes back to the agent as an MCP tool error, and the upstream never sees it.

Modules:

- :mod:`.calls`: pure rules: run names, tool mapping, outcome of an upstream answer;
- :mod:`.settings`: the gateway's settings (one typed object, from flags and environment);
- :mod:`.identity`: TokenReview of the agent's token, API clients that impersonate it;
- :mod:`.upstream`: one long-lived MCP client connection to the upstream, reconnected on failure;
- :mod:`.proxy`: the MCP server the agent talks to;
- :mod:`.main`: the ``reversi-gateway`` command;
- :mod:`.runner`: the ``reversi-mcp-runner`` command (compensator and reader Jobs over MCP).

Both commands need the ``gateway`` extra (``pip install 'reversi[gateway]'``: the MCP SDK,
uvicorn, starlette), which the operator, ``kubectl reversi`` and the SDK do without; without it
they say so in one line (exit 2) instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import sys

#: the gateway extra's own packages (they bring the rest: anyio, httpx, the MCP types)
EXTRA_MODULES = ("mcp", "uvicorn", "starlette")


def _missing_extra(command: str, err: ModuleNotFoundError) -> int:
    """Exit status 2 and one line when the gateway extra is not installed; else ``err`` again."""
    missing = [name for name in EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if not missing:
        raise err
    print(f"{command} needs the gateway extra ({', '.join(missing)} not installed): pip install 'reversi[gateway]'",
          file=sys.stderr)
    return 2


def gateway_main() -> int:
    """The ``reversi-gateway`` command (:func:`reversi.gateway.main.main`)."""
    try:
        from .main import main
    except ModuleNotFoundError as err:
        return _missing_extra("reversi-gateway", err)
    return main()


def runner_main() -> int:
    """The ``reversi-mcp-runner`` command (:func:`reversi.gateway.runner.main`)."""
    try:
        from .runner import main
    except ModuleNotFoundError as err:
        return _missing_extra("reversi-mcp-runner", err)
    return main()
