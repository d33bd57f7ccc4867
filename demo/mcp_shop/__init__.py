"""A small stateful MCP tool server for the gateway demo and tests (see server.py)."""
