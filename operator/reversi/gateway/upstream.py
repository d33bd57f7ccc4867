"""One long-lived MCP client connection to the upstream tool server, reconnected on failure.

:class:`Upstream` runs as a task (:meth:`Upstream.run`) for the gateway's lifetime. Calls wait
for a connection (:meth:`Upstream.client`) up to a timeout; a transport failure marks the
connection broken (:meth:`Upstream.broken`) and the task connects again.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

log = logging.getLogger("reversi.gateway.upstream")


class UpstreamUnavailable(Exception):
    """No connection to the upstream MCP server: the call was not forwarded (nor recorded)."""


def target(url: str | None, command: list[str] | None) -> Any:
    """What :class:`mcp.Client` connects to: the URL, or a stdio subprocess."""
    if url:
        return url
    if not command:
        raise ValueError("no upstream: give a streamable HTTP URL or a stdio command")
    return StdioServerParameters(command=command[0], args=list(command[1:]))


class Upstream:
    """The upstream connection; ``describe`` names it in errors."""

    def __init__(self, url: str | None = None, command: list[str] | None = None, connect_timeout: float = 10.0):
        self.target = target(url, command)
        self.describe = url or " ".join(command or [])
        self.connect_timeout = connect_timeout
        self._client: Client | None = None
        self._ready = anyio.Event()
        self._broken = anyio.Event()
        self.last_error = ""

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep a connection open until cancelled; reconnect (with backoff) when it breaks."""
        started = False
        delay = 0.2
        while True:
            try:
                async with Client(self.target, cache=None) as c:
                    self._client, delay = c, 0.2
                    self._ready.set()
                    log.info("connected to upstream %s", self.describe)
                    if not started:
                        task_status.started()
                        started = True
                    await self._broken.wait()
            except Exception as err:  # noqa: BLE001 - any failure to connect: try again
                self.last_error = f"{type(err).__name__}: {err}"
                log.warning("upstream %s: %s", self.describe, self.last_error)
            self._client = None
            self._ready, self._broken = anyio.Event(), anyio.Event()
            if not started:
                task_status.started()
                started = True
            await anyio.sleep(delay)
            delay = min(delay * 2, 5.0)

    @property
    def connected(self) -> bool:
        """Whether a connection is open now."""
        return self._client is not None

    async def client(self) -> Client:
        """The open connection; raises :class:`UpstreamUnavailable` after ``connect_timeout``."""
        deadline = anyio.current_time() + self.connect_timeout
        while self._client is None and anyio.current_time() < deadline:
            with anyio.move_on_after(min(0.1, deadline - anyio.current_time())):
                await self._ready.wait()
        if self._client is None:
            raise UpstreamUnavailable(f"upstream MCP server {self.describe} is not reachable"
                                      + (f" ({self.last_error})" if self.last_error else "")
                                      + "; the call was not made")
        return self._client

    def broken(self, client: Client) -> None:
        """Say that ``client``'s connection failed; the run task reconnects."""
        if client is self._client:
            self._client = None
            self._ready = anyio.Event()
            self._broken.set()
