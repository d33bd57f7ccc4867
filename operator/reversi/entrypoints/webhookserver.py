"""The HTTPS server of ``reversi-admission``'s webhooks: kopf's documented custom server, with a
request body limit of its own.

The API server sends the whole object in each AdmissionReview (the old and the new one on an
update), so a review of a Run of thousands of steps is megabytes. kopf's ``kopf.WebhookServer``
builds its aiohttp application with aiohttp's default body limit (1 MiB: a larger review is
refused with 413) and has no setting for it. kopf documents the way out: ``settings.admission.server``
takes any callable that, given kopf's webhook function, yields client configs and serves reviews
by calling that function (docs.kopf.dev, "Admission control", "Custom servers/tunnels").
:class:`WebhookServer` is such a server, built on aiohttp's public API. For the settings Reversi
uses, it does what kopf's server does:

- HTTPS with the given certificate and key; the CA bundle (``cafile``, else the certificate) in
  the client config it yields;
- ``POST /<webhook id>``: the JSON review goes to kopf's function with ``webhook`` (the id from
  the path), the request's ``headers`` and the client certificate (``sslpeer``), and its answer
  goes back as JSON; a body that is not JSON is answered 400;
- the port is bound with ``SO_REUSEPORT`` and ``SO_REUSEADDR``: several replicas on one host may
  share it (the kernel spreads the API server's connections);
- every ``file_check_interval`` seconds it reads the certificate, key and CA files again and, when
  they changed (a renewed Secret: mounted files change without filesystem events), loads them
  into the TLS context in place (new connections get them; the port stays open) and yields the
  client config again (kopf registers a new CA bundle); files it cannot use yet keep the old ones;
- a connection that stalls is dropped (:class:`Deadlines`): its TLS handshake and request headers
  must arrive within ``headers`` seconds of its accept, the next request's headers within ``idle``
  seconds of the last answer (keep-alive), a request's body within ``body`` seconds of its headers;
  each drop is counted by its stage (``on_drop(reason)``: ``headers``, ``idle``, ``body``), so idle
  or hostile connections cannot pile up and take the process's file descriptors;
- a body that nests more than :data:`MAX_CONTAINERS` objects and arrays is refused before it is
  parsed (413), so one client cannot make the server parse its way out of memory.

The deadlines are kept by the server's own site (:class:`_GuardedSite`): it accepts TCP itself and
upgrades each connection to TLS with asyncio's ``loop.start_tls`` before it hands the connection to
aiohttp's request handler, so a deadline covers the handshake too and can close the socket at any
stage (asyncio's and aiohttp's own timers close such connections late and uncounted: a handshake
after 60 s, a keep-alive after an hour).

One difference: a review kopf's function cannot serve (kopf raises its own errors for a review
that names no resource with handlers, or lacks the user or the object) is answered 400 with the
error's message, where kopf's server says 404, 409 or 400 by the error's class (classes kopf does
not make public). The API server treats any answer but 200 as a failed call either way.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.web
import kopf

log = logging.getLogger("reversi.webhookserver")

#: the largest review body served, in bytes: the API server refuses a request over 3 MiB and stores
#: an object of at most 1.5 MiB, so a review (the new object, and the old one on an update) stays
#: under 8 MiB
WEBHOOK_MAX_BODY = 8 * 1024 * 1024
#: the most objects and arrays a review may hold (``{`` and ``[`` in its body, strings included):
#: a review of the largest object holds a few tens of thousands; a body of nothing else would take
#: gigabytes to parse
MAX_CONTAINERS = 400_000


@dataclass(frozen=True)
class Deadlines:
    """How long a connection may stall, in seconds, per stage (the settings
    ``REVERSI_WEBHOOK_HEADERS_SECONDS``, ``REVERSI_WEBHOOK_IDLE_SECONDS``,
    ``REVERSI_WEBHOOK_BODY_SECONDS``):

    - ``headers``: from the TCP accept to a request's last header line, the TLS handshake included
      (the API server sends its review at once: milliseconds);
    - ``idle``: from an answer to the next request's last header line on a kept-alive connection
      (the API server's client keeps an idle connection 90 s; one closed before that is noticed by
      the client, which opens another);
    - ``body``: from the headers to the body's last byte (the API server gives up on a webhook after
      its ``timeoutSeconds``, 30 s at most)."""

    headers: float = 10.0
    idle: float = 60.0
    body: float = 30.0

    def reasons(self) -> tuple[str, ...]:
        """The reasons a connection is dropped for (the ``reason`` label of the drop metric)."""
        return ("headers", "idle", "body")


class WebhookServer:
    """kopf's custom webhook server protocol over HTTPS (see the module docstring).

    ``addr``: the address to listen on (``"0.0.0.0"``, ``""`` or None: every interface);
    ``port``: the TCP port; ``certfile``/``keyfile``: PEM paths of the serving certificate and its
    key; ``cafile``: the PEM CA bundle for the client config (default: the certificate);
    ``max_body``: the largest request body in bytes (:data:`WEBHOOK_MAX_BODY`; larger ones are
    answered 413); ``file_check_interval``: seconds between reads of the files for a renewal;
    ``deadlines``: how long a connection may stall (:class:`Deadlines`); ``on_drop``: called with
    the reason of each connection dropped for a stall (the admission server's metric).
    Raises nothing when built; serving raises ``OSError`` (port, files) and ``ssl.SSLError``
    (a certificate and key that do not match)."""

    def __init__(self, *, addr: str | None, port: int, certfile: str, keyfile: str, cafile: str | None = None,
                 max_body: int = WEBHOOK_MAX_BODY, file_check_interval: float = 60.0,
                 deadlines: Deadlines | None = None, on_drop: Callable[[str], None] | None = None) -> None:
        self.addr = addr
        self.port = port
        self.certfile = certfile
        self.keyfile = keyfile
        self.cafile = cafile
        self.max_body = max_body
        self.file_check_interval = file_check_interval
        self.deadlines = deadlines or Deadlines()
        self.on_drop = on_drop
        #: webhooks served by a function of the project's own instead of kopf's, by path without its
        #: slash: ``fn(review) -> answer`` (dicts), called on a worker thread (the recording webhook
        #: reviews writes of every kind, which kopf serves only for the kinds it watches)
        self.routes: dict[str, Callable[[dict], dict]] = {}
        self._site: _GuardedSite | None = None

    def open_connections(self) -> int:
        """How many connections the server holds now (accepted and not closed; 0 when not serving)."""
        return len(self._site.accepted) if self._site is not None else 0

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        """Serve reviews with ``fn`` and yield the client config; again after each renewal of the files."""

        async def serve(request: aiohttp.web.Request) -> aiohttp.web.Response:
            return await self._serve(fn, request)

        digest = self._digest()  # before reading them: a renewal while they are read is seen next time
        context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.certfile, self.keyfile)
        connections: dict[asyncio.BaseTransport, _Connection] = {}
        app = aiohttp.web.Application(client_max_size=self.max_body, middlewares=[_staged(connections)])
        app.add_routes([aiohttp.web.post("/{id:.*}", serve)])
        # aiohttp's own keep-alive timer only backs ours up (it would close a connection unseen)
        backstop = self.deadlines.idle + self.deadlines.headers
        runner = aiohttp.web.AppRunner(app, handle_signals=False, keepalive_timeout=backstop)
        await runner.setup()
        try:
            site = self._site = _GuardedSite(runner, self.addr or None, self.port, context, self.deadlines,
                                             connections, self._dropped)
            await site.start()
            log.debug("serving admission webhooks on %s:%d (bodies up to %d bytes)", self.addr or "*",
                      self.port, self.max_body)
            while True:
                yield self._client_config()
                digest = await self._renewed(context, digest)
        finally:
            self._site = None
            await runner.cleanup()

    def _dropped(self, reason: str) -> None:
        log.debug("dropped a connection that stalled (%s)", reason)
        if self.on_drop is not None:
            self.on_drop(reason)

    async def _renewed(self, context: ssl.SSLContext, digest: str | None) -> str | None:
        """Wait until the certificate files change, then load them into ``context`` in place: new
        connections are served with them, the ones open keep theirs, and the port is never closed.
        Files that cannot be used yet (a key that does not match the certificate, a file missing
        while a writer replaces it) keep the ones in use: it tries again every
        ``file_check_interval`` seconds. Returns the digest of the files now in use."""
        while True:
            await self._until_files_change(digest)
            changed = self._digest()
            try:
                # tried on a context of its own first: a failed load leaves a context half changed
                ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH).load_cert_chain(self.certfile, self.keyfile)
                self._client_config()  # the CA file must be readable too
                context.load_cert_chain(self.certfile, self.keyfile)
            except (OSError, ssl.SSLError) as err:
                log.warning("the webhook certificate files changed but cannot be used (%s): serving with the "
                            "previous ones, trying again in %gs", err, self.file_check_interval)
                await asyncio.sleep(self.file_check_interval)
                continue
            log.info("the webhook certificate files changed: new connections are served with the new ones")
            return changed

    def _client_config(self) -> kopf.WebhookClientConfig:
        """The client config kopf registers: the URL and the CA bundle (``cafile``, else the certificate)."""
        cadata = Path(self.cafile or self.certfile).read_bytes()
        return kopf.WebhookClientConfig(url=self.url(), caBundle=base64.b64encode(cadata).decode("ascii"))

    def url(self) -> str:
        """``https://<host>:<port>``, the host being the listening address (the loopback address
        for every interface)."""
        host = self.addr or "127.0.0.1"
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return f"https://{host}:{self.port}"
        if ip.is_unspecified:
            ip = ipaddress.ip_address("::1" if ip.version == 6 else "127.0.0.1")
        return f"https://[{ip}]:{self.port}" if ip.version == 6 else f"https://{ip}:{self.port}"

    async def _serve(self, fn: kopf.WebhookFn, request: aiohttp.web.Request) -> aiohttp.web.Response:
        """One review: kopf's function answers it (see the module docstring), or the route of
        :attr:`routes` for its path."""
        headers = dict(request.headers)
        sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
        webhook = request.match_info.get("id") or None
        body = await request.read()  # read by the middleware already, within the body deadline
        if body.count(b"{") + body.count(b"[") > MAX_CONTAINERS:  # parsing it would take too much memory
            raise aiohttp.web.HTTPRequestEntityTooLarge(max_size=MAX_CONTAINERS, actual_size=len(body),
                                                        reason="the review nests too many objects and arrays")
        try:
            review = json.loads(body)  # bytes: UTF-8, -16 or -32, whatever the header says
        except (ValueError, RecursionError) as err:  # not JSON, or nested too deep
            why = " ".join(str(err).split())[:200]
            raise aiohttp.web.HTTPBadRequest(reason=f"the review is not JSON: {why}") from err
        own = self.routes.get(webhook or "")
        if own is not None:
            if not isinstance(review, dict):
                raise aiohttp.web.HTTPBadRequest(reason="the review is not a JSON object")
            return aiohttp.web.json_response(await asyncio.to_thread(own, review))
        try:
            response = await fn(review, webhook=webhook, headers=headers, sslpeer=sslpeer)
        except Exception as err:  # kopf's own errors for a review it cannot serve (module docstring)
            log.warning("a review for webhook %s could not be served: %s: %s", webhook, type(err).__name__, err)
            reason = " ".join(str(err).split())[:300] or type(err).__name__  # a reason phrase is one line
            raise aiohttp.web.HTTPBadRequest(reason=reason) from err
        return aiohttp.web.json_response(response)

    def _digest(self) -> str | None:
        """A hash of the certificate, key and CA files (only the hash is kept, never the key); None
        while one of them cannot be read."""
        hasher = hashlib.sha256()
        try:
            for path in (self.certfile, self.keyfile, self.cafile):
                if path:
                    hasher.update(Path(path).read_bytes())
        except OSError:
            return None
        return hasher.hexdigest()

    async def _until_files_change(self, digest: str | None) -> None:
        while self._digest() == digest:
            await asyncio.sleep(self.file_check_interval)


_Handler = Callable[[aiohttp.web.Request], Awaitable[aiohttp.web.StreamResponse]]


def _staged(connections: dict[asyncio.BaseTransport, _Connection]) -> Callable[..., Awaitable[Any]]:
    """An aiohttp middleware that moves each request's connection through its stages: once its
    headers are in, its body must arrive within the body deadline (read here; aiohttp keeps it for
    the handler, and refuses one over the size limit with 413); no deadline while the handler
    serves it; the idle deadline once it is answered. Every request passes it, also one answered
    404 or 405 by aiohttp's router."""

    @aiohttp.web.middleware
    async def staged(request: aiohttp.web.Request, handler: _Handler) -> aiohttp.web.StreamResponse:
        connection = connections.get(request.transport) if request.transport else None
        if connection is None:
            return await handler(request)
        connection.stage("body")
        try:
            try:
                await request.read()
            except ConnectionError as err:  # dropped by the body deadline, or the client went away
                raise aiohttp.web.HTTPRequestTimeout(reason="the review's body did not arrive") from err
            connection.stage(None)
            return await handler(request)
        finally:
            connection.stage("idle")

    return staged


class _Connection(asyncio.Protocol):
    """One accepted TCP connection: TLS by ``loop.start_tls``, then aiohttp's request handler,
    with one deadline armed at a time (:class:`Deadlines`): ``headers`` from the accept, ``body``
    once a request's headers are in, none while a review is served, ``idle`` after an answer. When
    a deadline passes the socket is aborted and the reason reported.

    It stays the protocol of the TLS transport for the connection's whole life and hands every
    event on to aiohttp's handler once that has taken over, so it sees the connection end (and
    forgets it) however it ends."""

    def __init__(self, site: _GuardedSite) -> None:
        self.site = site
        self.raw: asyncio.Transport | None = None
        self.tls: asyncio.Transport | None = None
        self.handler: asyncio.Protocol | None = None
        self.early: list[bytes] = []
        self.timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport  # type: ignore[assignment]  # a stream server hands out transports
        self.site.accepted.add(self)
        self.stage("headers")
        self.task = asyncio.get_running_loop().create_task(self._handshake())

    async def _handshake(self) -> None:
        assert self.raw is not None
        loop = asyncio.get_running_loop()
        try:  # within the headers deadline: it aborts the socket, and start_tls raises
            tls = await loop.start_tls(self.raw, self, self.site.context, server_side=True,
                                       ssl_handshake_timeout=self.site.deadlines.headers + 1)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as err:
            log.debug("a TLS handshake failed: %s", err)
            self.close()
            return
        if tls is None or self.raw.is_closing():
            self.close()
            return
        self.tls = tls
        self.site.connections[tls] = self
        self.handler = self.site.runner.server()  # type: ignore[misc]  # aiohttp's protocol factory
        self.handler.connection_made(tls)
        for data in self.early:  # what arrived between the handshake's end and now
            self.handler.data_received(data)
        self.early.clear()

    def data_received(self, data: bytes) -> None:
        if self.handler is not None:
            self.handler.data_received(data)
        else:
            self.early.append(data)

    def eof_received(self) -> bool | None:
        return self.handler.eof_received() if self.handler is not None else None

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.handler is not None:
            self.handler.connection_lost(exc)
        self.forget()

    def stage(self, reason: str | None) -> None:
        """Arm the deadline of stage ``reason`` (``headers``, ``body``, ``idle``), or none."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if reason is not None and self.raw is not None and not self.raw.is_closing():
            seconds = getattr(self.site.deadlines, reason)
            self.timer = asyncio.get_running_loop().call_later(seconds, self._expired, reason)

    def _expired(self, reason: str) -> None:
        self.timer = None
        if self.raw is None or self.raw.is_closing():
            return
        self.site.on_drop(reason)
        self.close()

    def close(self) -> None:
        """Abort the socket (aiohttp's handler, if it took over, sees the connection lost)."""
        if self.raw is not None:
            self.raw.abort()
        self.forget()

    def forget(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.site.accepted.discard(self)
        if self.tls is not None:
            self.site.connections.pop(self.tls, None)


class _GuardedSite(aiohttp.web.BaseSite):
    """An aiohttp site (its public ``BaseSite``) on ``host:port`` (``SO_REUSEPORT`` and
    ``SO_REUSEADDR``: replicas on one host share the port) that accepts TCP itself and serves each
    connection as a :class:`_Connection` under ``deadlines``; ``on_drop(reason)`` for each drop."""

    def __init__(self, runner: aiohttp.web.AppRunner, host: str | None, port: int, context: ssl.SSLContext,
                 deadlines: Deadlines, connections: dict[asyncio.BaseTransport, _Connection],
                 on_drop: Callable[[str], None]) -> None:
        super().__init__(runner, backlog=1024)
        self.runner = runner
        self.host = host
        self.port = port
        self.context = context
        self.deadlines = deadlines
        self.connections = connections
        self.on_drop = on_drop
        self.accepted: set[_Connection] = set()

    @property
    def name(self) -> str:
        return f"https://{self.host or '0.0.0.0'}:{self.port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), self.host, self.port,
                                                backlog=self._backlog, reuse_address=True, reuse_port=True)

    async def stop(self) -> None:
        await super().stop()
        for connection in list(self.accepted):
            if connection.handler is None:  # aiohttp's runner ends the ones it serves
                connection.close()
