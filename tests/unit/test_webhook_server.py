"""reversi-admission's webhook server (kopf's custom server protocol, docs.kopf.dev "Custom
servers/tunnels"): it serves reviews of megabytes over TLS, answers what is not a review with 400,
refuses bodies over its limit with 413, and serves again with renewed certificate files
(reversi.entrypoints.webhookserver)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import shutil
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from reversi import certs
from reversi.entrypoints.webhookserver import WEBHOOK_MAX_BODY, Deadlines, WebhookServer
from reversi_devcluster.localop import free_port
from tests.helpers import KeptRecords, open_stalled

MIB = 1024 * 1024


def _pair(folder: Path, stem: str = "webhook") -> tuple[certs.KeyPair, certs.KeyPair]:
    ca = certs.make_ca(folder, name="test-webhook-ca")
    return ca, certs.issue(ca, folder, stem, "reversi-webhook", dns_names=("localhost",),
                           ip_addresses=("127.0.0.1",), server=True)


def _review(uid: str, padding: int = 0) -> dict[str, Any]:
    obj = {"apiVersion": "reversi.dev/v1alpha1", "kind": "Run", "metadata": {"name": "r", "namespace": "ns"},
           "spec": {"notes": "x" * padding}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "operation": "UPDATE", "object": obj, "oldObject": obj}}


class _Recorder:
    """A stand-in for kopf's webhook function: records what it is called with, allows everything."""

    def __init__(self, fail: Exception | None = None):
        self.calls: list[dict[str, Any]] = []
        self.fail = fail

    async def __call__(self, request: dict, *, webhook: str | None = None, headers: Any = None,
                       sslpeer: Any = None) -> dict:
        self.calls.append({"request": request, "webhook": webhook, "headers": headers, "sslpeer": sslpeer})
        if self.fail is not None:
            raise self.fail
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": request["request"]["uid"], "allowed": True}}


def _serve(server: WebhookServer, fn: Any,
           body: Callable[[dict, ssl.SSLContext], Awaitable[Any]], cafile: Path) -> Any:
    """Run ``server`` with ``fn``, call ``body(first client config, client TLS context)`` while it
    serves, then stop it; returns what ``body`` returned."""

    async def scenario() -> Any:
        context = ssl.create_default_context(cafile=str(cafile))
        configs = server(fn)
        config = await anext(configs)
        try:
            return await body(dict(config), context)
        finally:
            await configs.aclose()

    return asyncio.run(scenario())


async def _post(url: str, context: ssl.SSLContext, data: bytes) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.post(
            url, data=data, ssl=context, headers={"Content-Type": "application/json"}) as resp:
        return resp.status, await resp.text()


def test_serves_a_review_of_megabytes_over_tls_to_kopfs_function(tmp_path):
    """A review of 2 MiB (a Run of thousands of steps, old and new object) reaches kopf's function
    with the webhook id from the path, and its answer comes back as JSON."""
    ca, pair = _pair(tmp_path)
    port = free_port()
    server = WebhookServer(addr="127.0.0.1", port=port, certfile=str(pair.cert), keyfile=str(pair.key),
                           cafile=str(ca.cert))
    fn = _Recorder()
    review = _review("u-big", padding=MIB)
    data = json.dumps(review).encode()
    assert len(data) > 2 * MIB

    async def body(config: dict, context: ssl.SSLContext) -> tuple[int, str]:
        assert config["url"] == f"https://127.0.0.1:{port}"
        assert base64.b64decode(config["caBundle"]) == ca.cert.read_bytes()
        return await _post(f"https://127.0.0.1:{port}/validate-run", context, data)

    status, text = _serve(server, fn, body, ca.cert)
    assert status == 200, text
    assert json.loads(text)["response"] == {"uid": "u-big", "allowed": True}
    [call] = fn.calls
    assert call["webhook"] == "validate-run"
    assert call["request"] == review
    assert call["headers"]["Content-Type"] == "application/json"
    # the API server refuses requests over 3 MiB and stores objects of at most 1.5 MiB: a review of
    # the new object and the old one fits
    assert WEBHOOK_MAX_BODY > 3 * MIB + 3 * MIB // 2


def test_a_body_over_the_limit_is_refused_with_413(tmp_path):
    """The limit is the server's own: with 1 MiB (aiohttp's default, which kopf's server keeps)
    the same review is refused before kopf's function sees it."""
    ca, pair = _pair(tmp_path)
    port = free_port()
    server = WebhookServer(addr="127.0.0.1", port=port, certfile=str(pair.cert), keyfile=str(pair.key),
                           max_body=MIB)
    fn = _Recorder()
    data = json.dumps(_review("u-big", padding=MIB)).encode()

    async def body(config: dict, context: ssl.SSLContext) -> tuple[int, str]:
        assert base64.b64decode(config["caBundle"]) == pair.cert.read_bytes()  # no CA file: the certificate
        return await _post(f"https://127.0.0.1:{port}/validate-run", context, data)

    status, _ = _serve(server, fn, body, ca.cert)
    assert status == 413
    assert fn.calls == []


@pytest.mark.parametrize(("data", "fail", "reason"), [
    (b"{not json", None, "the review is not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, None, "the review is not JSON"),  # nested deeper than the parser goes
    (json.dumps(_review("u-1")).encode(), LookupError("The specified resource has no handlers: x"),
     "The specified resource has no handlers"),
])
def test_what_kopf_cannot_serve_is_answered_400(tmp_path, data, fail, reason):
    ca, pair = _pair(tmp_path)
    port = free_port()
    server = WebhookServer(addr="0.0.0.0", port=port, certfile=str(pair.cert), keyfile=str(pair.key))

    async def body(config: dict, context: ssl.SSLContext) -> tuple[int, str]:
        assert config["url"] == f"https://127.0.0.1:{port}"  # every interface: reached on the loopback
        async with aiohttp.ClientSession() as session, session.post(
                f"https://127.0.0.1:{port}/validate-run", data=data, ssl=context) as resp:
            return resp.status, resp.reason or ""

    status, got = _serve(server, _Recorder(fail=fail), body, ca.cert)
    assert status == 400
    assert reason in got


def _renewable(tmp_path: Path) -> tuple[certs.KeyPair, certs.KeyPair, certs.KeyPair, Path, int, WebhookServer]:
    """A server on the files in ``<tmp>/live`` (the first pair's, signed by the first CA), checked
    every 50 ms, and a second pair to renew them with: ``(first CA, first, second, live, port, server)``."""
    ca1, first = _pair(tmp_path / "one")
    _, second = _pair(tmp_path / "two")
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(first.cert, live / "tls.crt")
    shutil.copy(first.key, live / "tls.key")
    port = free_port()
    server = WebhookServer(addr="127.0.0.1", port=port, certfile=str(live / "tls.crt"),
                           keyfile=str(live / "tls.key"), file_check_interval=0.05)
    return ca1, first, second, live, port, server


def test_serves_again_with_renewed_certificate_files(tmp_path):
    """A renewed Secret changes the mounted files without an event: the server reads them again
    and serves with the new certificate (the client config says so too)."""
    _, first, second, live, port, server = _renewable(tmp_path)

    async def scenario() -> tuple[bytes, bytes, int]:
        configs = server(_Recorder())
        try:
            before = base64.b64decode((await anext(configs))["caBundle"])
            shutil.copy(second.cert, live / "tls.crt")
            shutil.copy(second.key, live / "tls.key")
            after = base64.b64decode((await asyncio.wait_for(anext(configs), 10))["caBundle"])
            context = ssl.create_default_context(cafile=str(tmp_path / "two" / "ca.crt"))
            status, _ = await _post(f"https://127.0.0.1:{port}/x", context, json.dumps(_review("u")).encode())
            return before, after, status
        finally:
            await configs.aclose()

    before, after, status = asyncio.run(scenario())
    assert before == first.cert.read_bytes()
    assert after == second.cert.read_bytes()
    assert status == 200  # the client trusts only the second CA: the new certificate is served


def test_a_body_of_nothing_but_objects_is_refused_before_it_is_parsed(tmp_path):
    """Parsing a body of a million empty objects takes far more memory than the admission pod has:
    it is refused (413) by counting, and kopf's function never sees it."""
    ca, pair = _pair(tmp_path)
    port = free_port()
    server = WebhookServer(addr="127.0.0.1", port=port, certfile=str(pair.cert), keyfile=str(pair.key))
    fn = _Recorder()
    data = b'{"request":{"uid":"1","x":[' + b",".join([b"{}"] * 1_000_000) + b"]}}"

    async def body(config: dict, context: ssl.SSLContext) -> tuple[int, str]:
        return await _post(f"https://127.0.0.1:{port}/validate-run", context, data)

    status, _ = _serve(server, fn, body, ca.cert)
    assert status == 413 and fn.calls == []


def test_a_renewal_keeps_the_port_open_waits_for_nobody_and_skips_files_it_cannot_use(tmp_path):
    """A client stalled mid-body while the certificate is renewed does not delay the renewal, and
    the port never closes (the new certificate is loaded in place); a new certificate whose key has
    not arrived yet is not used: the old pair serves until both match."""
    ca1, _, second, live, port, server = _renewable(tmp_path)
    review = json.dumps(_review("u")).encode()
    kept = KeptRecords()
    logging.getLogger("reversi.webhookserver").addHandler(kept)

    async def scenario() -> tuple[int, int, bytes]:
        configs: list[Any] = []

        async def consume() -> None:  # as kopf does: it takes each client config as it comes
            async for config in server(_Recorder()):
                configs.append(config)

        async def until(predicate: Callable[[], bool]) -> None:
            while not predicate():
                await asyncio.sleep(0.01)

        old = ssl.create_default_context(cafile=str(ca1.cert))
        new = ssl.create_default_context(cafile=str(tmp_path / "two" / "ca.crt"))
        serving = asyncio.create_task(consume())
        try:
            await until(lambda: len(configs) == 1)
            _, stalled = await asyncio.open_connection("127.0.0.1", port, ssl=old)
            stalled.write(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 1000\r\n\r\n{")
            await stalled.drain()
            shutil.copy(second.cert, live / "tls.crt")  # its key comes later: not usable yet
            await until(lambda: any("cannot be used" in r.getMessage() for r in kept.records))
            while_half_written, _ = await _post(f"https://127.0.0.1:{port}/x", old, review)
            shutil.copy(second.key, live / "tls.key")
            await until(lambda: len(configs) == 2)
            renewed, _ = await _post(f"https://127.0.0.1:{port}/x", new, review)
            stalled.close()
            return while_half_written, renewed, base64.b64decode(configs[1]["caBundle"])
        finally:
            serving.cancel()

    try:
        while_half_written, renewed, after = asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        logging.getLogger("reversi.webhookserver").removeHandler(kept)
    assert while_half_written == 200  # the old pair still served: the new certificate had no key yet
    assert after == second.cert.read_bytes()
    assert renewed == 200  # served with the new certificate at once, the stalled client still open


async def _closed_after(streams: tuple[asyncio.StreamReader, asyncio.StreamWriter], opened: float) -> float:
    """Seconds from ``opened`` until the server closed the connection (EOF or reset)."""
    reader, _ = streams
    try:
        while await reader.read(65536):
            pass
    except ConnectionError:
        pass
    return asyncio.get_running_loop().time() - opened


def test_connections_that_stall_are_dropped_by_their_stage_and_reviews_go_on(tmp_path):
    """A connection that sends nothing (not even a TLS handshake), half its headers, half its body,
    or nothing after an answer is closed once its stage's deadline passes, counted by stage; a
    review on a fresh connection is served meanwhile."""
    ca, pair = _pair(tmp_path)
    port = free_port()
    drops: list[str] = []
    server = WebhookServer(addr="127.0.0.1", port=port, certfile=str(pair.cert), keyfile=str(pair.key),
                           deadlines=Deadlines(headers=0.6, idle=0.6, body=0.6), on_drop=drops.append)
    stages = ["silent", "headers", "body", "idle"] * 3

    async def body(config: dict, context: ssl.SSLContext) -> tuple[list[float], int, int]:
        loop = asyncio.get_running_loop()
        opened = [(await open_stalled(port, context, stage), loop.time()) for stage in stages]
        status, _ = await _post(f"https://127.0.0.1:{port}/validate-run", context, json.dumps(_review("u")).encode())
        took = await asyncio.wait_for(asyncio.gather(*(_closed_after(r, t) for r, t in opened)), 10)
        while server.open_connections() and loop.time() < opened[-1][1] + 5:
            await asyncio.sleep(0.05)
        return took, status, server.open_connections()

    took, status, left = _serve(server, _Recorder(), body, ca.cert)
    assert status == 200
    assert left == 0  # every connection, dropped or closed by its client, is forgotten
    assert all(0.5 <= t < 3 for t in took), took
    assert sorted(drops) == sorted(["headers"] * 6 + ["body"] * 3 + ["idle"] * 3), drops
