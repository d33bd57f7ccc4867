"""reversi-admission under connections that stall: hundreds of them, held open against its webhook
port, neither pin the server nor delay the API server's reviews, and each is closed by the deadline
of the stage it stalled in (docs/operations.md#admission-where-each-rule-is-enforced: the webhook
server's deadlines).

The admission server runs as a real process (its deadlines shortened through its settings, so the
test takes seconds), registered with the API server for the test; the reviews come from the real
kube-apiserver. The integration operator's own admission servers are registered again afterwards."""

from __future__ import annotations

import asyncio
import re
import ssl
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator

import pytest
from kubernetes import client

from reversi.adapters import webhooks
from reversi_devcluster.localop import AdmissionProcess, free_port
from tests.helpers import open_stalled

pytestmark = pytest.mark.cluster
G, V = "reversi.dev", "v1alpha1"
#: each stage's deadline, in seconds (REVERSI_WEBHOOK_HEADERS_SECONDS, ..._IDLE_..., ..._BODY_...)
DEADLINE = 5.0
#: stalled connections per kind: 260 in all, most of them the cheapest to hold open (a TCP connection
#: that never starts its TLS handshake), so the flood does not depend on how fast a loaded machine
#: does handshakes
KINDS = {"silent": 200, "headers": 20, "body": 20, "idle": 20}


@pytest.fixture
def stalled_admission(cluster, crds, admin_api, operator, monkeypatch) -> Iterator[AdmissionProcess]:
    """reversi-admission with DEADLINE-second deadlines, serving every review of the cluster for
    the test; the integration operator's admission servers serve them again afterwards."""
    for stage in ("HEADERS", "IDLE", "BODY"):
        monkeypatch.setenv(f"REVERSI_WEBHOOK_{stage}_SECONDS", str(DEADLINE))
    proc = AdmissionProcess(cluster.paths.admin_kubeconfig, cluster.paths.logs / "admission-stalls.log",
                            webhook_port=free_port(), metrics_port=free_port())
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
        assert operator.admission is not None
        ca = (operator.admission.replicas[0].cert_dir / "ca.crt").read_bytes()
        webhooks.register(admin_api, webhooks.url_client_config(f"https://127.0.0.1:{operator.webhook_port}", ca))


async def _closed_at(streams: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> float:
    """The loop time at which the server closed the connection (EOF or reset)."""
    reader, _ = streams
    try:
        while await reader.read(65536):
            pass
    except ConnectionError:
        pass
    return asyncio.get_running_loop().time()


def _reviews(api: client.ApiClient, namespace: str, count: int) -> list[float]:
    """``count`` Halts created as dry runs (each one a review the API server sends to the webhook,
    failurePolicy Fail): the seconds each took."""
    custom = client.CustomObjectsApi(api)
    took = []
    for i in range(count):
        started = time.monotonic()
        custom.create_namespaced_custom_object(G, V, namespace, "halts", {
            "apiVersion": f"{G}/{V}", "kind": "Halt", "metadata": {"name": f"probe-{i}"},
            "spec": {"reason": "is the webhook answering?", "by": "test"}}, dry_run="All")
        took.append(time.monotonic() - started)
    return took


def _dropped(metrics_port: int) -> Counter[str]:
    """reversi_webhook_connections_dropped_total by reason, from the server's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    pattern = r'^reversi_webhook_connections_dropped_total\{reason="(\w+)"\} (\S+)$'
    return Counter({m.group(1): int(float(m.group(2))) for m in re.finditer(pattern, text, re.M)})


def test_hundreds_of_stalled_connections_neither_delay_reviews_nor_outlive_their_deadline(
        stalled_admission, admin_api, namespace):
    port = stalled_admission.webhook_port
    context = ssl.create_default_context(cafile=str(stalled_admission.cert_dir / "ca.crt"))

    async def scenario() -> tuple[list[float], float, list[tuple[str, float, float]]]:
        loop = asyncio.get_running_loop()
        kinds = [kind for kind, count in KINDS.items() for _ in range(count)]
        opening = list(kinds)
        all_open = asyncio.Event()

        async def held(kind: str) -> tuple[str, float, float]:
            started = loop.time()  # the deadline counts from the server's accept, which comes after this
            streams = await open_stalled(port, context, kind, "/validate-halt")
            opening.pop()
            if not opening:
                all_open.set()
            return kind, started, await _closed_at(streams)

        closing = asyncio.gather(*(held(kind) for kind in kinds))  # all at once, as a flood would come
        await asyncio.wait_for(all_open.wait(), 4 * DEADLINE)
        took = await asyncio.to_thread(_reviews, admin_api, namespace, 10)
        answered = loop.time()
        return took, answered, await asyncio.wait_for(closing, 4 * DEADLINE)

    took, answered, held = asyncio.run(scenario())
    # every review was answered (failurePolicy Fail: one not answered would have raised), each in well
    # under the webhook's timeout (10 s), while the flood was held
    assert max(took) < 5.0, took
    still_held = sum(end > answered for _, _, end in held)  # (on a loaded machine the first may expire meanwhile)
    assert still_held >= len(held) // 2, f"only {still_held} stalled connections were held when the reviews ended"
    # each stalled connection was closed by its deadline: not before it, and not long after
    late = [(kind, round(end - started, 2)) for kind, started, end in held
            if not DEADLINE <= end - started < DEADLINE + 4.0]
    assert late == [], late
    dropped = _dropped(stalled_admission.metrics_port)
    assert dropped["headers"] == KINDS["silent"] + KINDS["headers"], dropped
    assert dropped["body"] == KINDS["body"], dropped
    assert dropped["idle"] >= KINDS["idle"], dropped  # and the API server's own connections, once idle
