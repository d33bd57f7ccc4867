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
"""
