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
- a body is read within :data:`BODY_READ_SECONDS`, and one that nests more than
  :data:`MAX_CONTAINERS` objects and arrays is refused before it is parsed (413), so one client
  cannot hold a connection forever or make the server parse its way out of memory.

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
from collections.abc import AsyncIterator
from pathlib import Path

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
#: seconds a review's body may take to arrive (the API server gives up on a webhook after 30 s)
BODY_READ_SECONDS = 30.0


class WebhookServer:
    """kopf's custom webhook server protocol over HTTPS (see the module docstring).

    ``addr``: the address to listen on (``"0.0.0.0"``, ``""`` or None: every interface);
    ``port``: the TCP port; ``certfile``/``keyfile``: PEM paths of the serving certificate and its
    key; ``cafile``: the PEM CA bundle for the client config (default: the certificate);
    ``max_body``: the largest request body in bytes (:data:`WEBHOOK_MAX_BODY`; larger ones are
    answered 413); ``file_check_interval``: seconds between reads of the files for a renewal.
    Raises nothing when built; serving raises ``OSError`` (port, files) and ``ssl.SSLError``
    (a certificate and key that do not match)."""

    def __init__(self, *, addr: str | None, port: int, certfile: str, keyfile: str, cafile: str | None = None,
                 max_body: int = WEBHOOK_MAX_BODY, file_check_interval: float = 60.0) -> None:
        self.addr = addr
        self.port = port
        self.certfile = certfile
        self.keyfile = keyfile
        self.cafile = cafile
        self.max_body = max_body
        self.file_check_interval = file_check_interval

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        """Serve reviews with ``fn`` and yield the client config; again after each renewal of the files."""

        async def serve(request: aiohttp.web.Request) -> aiohttp.web.Response:
            return await self._serve(fn, request)

        digest = self._digest()  # before reading them: a renewal while they are read is seen next time
        context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.certfile, self.keyfile)
        app = aiohttp.web.Application(client_max_size=self.max_body)
        app.add_routes([aiohttp.web.post("/{id:.*}", serve)])
        runner = aiohttp.web.AppRunner(app, handle_signals=False)
        await runner.setup()
        try:
            site = aiohttp.web.TCPSite(runner, self.addr or None, self.port, ssl_context=context,
                                       reuse_port=True, reuse_address=True)
            await site.start()
            log.debug("serving admission webhooks on %s:%d (bodies up to %d bytes)", self.addr or "*",
                      self.port, self.max_body)
            while True:
                yield self._client_config()
                digest = await self._renewed(context, digest)
        finally:
            await runner.cleanup()

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

    @staticmethod
    async def _serve(fn: kopf.WebhookFn, request: aiohttp.web.Request) -> aiohttp.web.Response:
        """One review: kopf's function answers it (see the module docstring)."""
        headers = dict(request.headers)
        sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
        webhook = request.match_info.get("id") or None
        try:
            body = await asyncio.wait_for(request.read(), timeout=BODY_READ_SECONDS)
        except TimeoutError as err:  # a client that stalls mid-body does not hold the connection
            raise aiohttp.web.HTTPRequestTimeout(reason="the review's body took too long to arrive") from err
        if body.count(b"{") + body.count(b"[") > MAX_CONTAINERS:  # parsing it would take too much memory
            raise aiohttp.web.HTTPRequestEntityTooLarge(max_size=MAX_CONTAINERS, actual_size=len(body),
                                                        reason="the review nests too many objects and arrays")
        try:
            review = json.loads(body)  # bytes: UTF-8, -16 or -32, whatever the header says
        except (ValueError, RecursionError) as err:  # not JSON, or nested too deep
            why = " ".join(str(err).split())[:200]
            raise aiohttp.web.HTTPBadRequest(reason=f"the review is not JSON: {why}") from err
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
