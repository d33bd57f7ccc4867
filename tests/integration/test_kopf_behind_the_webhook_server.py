"""reversi-admission's webhook server (reversi.entrypoints.webhookserver) with kopf itself: a kopf
operator runs in this process with two webhooks on Halts (one refuses, one crashes) and serves
them through the server, so kopf's own webhook function answers and kopf's own code logs.

- A review of megabytes (the API server sends the old and the new object of a large Run) is
  served: aiohttp's default limit, which kopf's server keeps, would refuse it with 413.
- A refusal is not logged at ERROR, a handler's crash still is, with its traceback
  (reversi.entrypoints.admission.RefusalsAreNotErrors on kopf's ``kopf.objects`` logger)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import threading
import urllib.request
from pathlib import Path
from typing import Any

import kopf
import pytest

from reversi import certs
from reversi.entrypoints import common
from reversi.entrypoints.admission import RefusalsAreNotErrors
from reversi.entrypoints.webhookserver import WebhookServer
from reversi_devcluster.localop import free_port
from tests.helpers import KeptRecords
from tests.helpers import wait_for

pytestmark = pytest.mark.cluster

MIB = 1024 * 1024


class _Seen(logging.Filter):
    """Put first on the logger, it sees every record, also those the next filter drops."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return True


def _review(uid: str, notes: int = 0) -> dict[str, Any]:
    halt = {"apiVersion": "reversi.dev/v1alpha1", "kind": "Halt",
            "metadata": {"name": "h", "namespace": "default", "annotations": {"notes": "x" * notes}},
            "spec": {"reason": "test"}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "reversi.dev", "version": "v1alpha1", "kind": "Halt"},
        "resource": {"group": "reversi.dev", "version": "v1alpha1", "resource": "halts"},
        "name": "h", "namespace": "default", "operation": "UPDATE", "userInfo": {"username": "alice"},
        "object": halt, "oldObject": halt, "dryRun": False}}


def _post(port: int, webhook: str, review: dict, context: ssl.SSLContext) -> tuple[int, dict]:
    req = urllib.request.Request(f"https://127.0.0.1:{port}/{webhook}", data=json.dumps(review).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30, context=context) as resp:
        return resp.status, json.load(resp)


def _serving(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_kopf_serves_large_reviews_and_refusals_are_not_logged_as_errors(cluster, crds, tmp_path: Path,
                                                                        monkeypatch):
    registry = kopf.OperatorRegistry()

    @kopf.on.validate("reversi.dev", "v1alpha1", "halts", id="refuse", registry=registry)
    def refuse(**_: Any) -> None:
        raise kopf.AdmissionError("halts are refused here", code=422)

    @kopf.on.validate("reversi.dev", "v1alpha1", "halts", id="crash", registry=registry)
    def crash(**_: Any) -> None:
        raise RuntimeError("a bug in a handler")

    monkeypatch.setenv("REVERSI_KUBECONFIG", str(cluster.paths.admin_kubeconfig))
    kopf.on.login(registry=registry)(common.login)  # as reversi-admission logs in

    ca = certs.make_ca(tmp_path, name="test-webhook-ca")
    pair = certs.issue(ca, tmp_path, "webhook", "reversi-webhook", ip_addresses=("127.0.0.1",), server=True)
    port = free_port()
    settings = kopf.OperatorSettings()
    settings.posting.enabled = False
    settings.admission.server = WebhookServer(addr="127.0.0.1", port=port, certfile=str(pair.cert),
                                              keyfile=str(pair.key), cafile=str(ca.cert))

    objects = logging.getLogger("kopf.objects")
    seen, ours, kept = _Seen(), RefusalsAreNotErrors(), KeptRecords()
    objects.addFilter(seen)
    objects.addFilter(ours)  # as reversi-admission's main() does
    objects.addHandler(kept)
    stop = threading.Event()
    operator = threading.Thread(target=asyncio.run, name="kopf-in-test", daemon=True, args=(kopf.operator(
        registry=registry, settings=settings, standalone=True, clusterwide=True, stop_flag=stop),))
    operator.start()
    try:
        # kopf starts its webhook server once it has scanned the cluster's resources
        wait_for(lambda: _serving(port) or not operator.is_alive(), timeout=60, what="kopf's webhook server")
        assert operator.is_alive(), "the in-process kopf operator stopped"
        context = ssl.create_default_context(cafile=str(ca.cert))

        big = _review("u-big", notes=MIB)
        assert len(json.dumps(big)) > 2 * MIB
        status, answer = _post(port, "refuse", big, context)
        assert status == 200
        assert answer["response"]["uid"] == "u-big"
        assert answer["response"]["allowed"] is False
        assert answer["response"]["status"] == {"message": "halts are refused here", "code": 422}

        status, answer = _post(port, "crash", _review("u-crash"), context)
        assert status == 200
        assert answer["response"]["allowed"] is False and answer["response"]["status"]["code"] == 500
    finally:
        stop.set()
        operator.join(timeout=30)
        for f in (seen, ours):
            objects.removeFilter(f)
        objects.removeHandler(kept)

    def errors(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
        return [r for r in records if r.levelno >= logging.ERROR]

    # kopf itself logged both at ERROR; the filter kept only the crash, with its traceback
    assert len(errors(seen.records)) == len(errors(kept.records)) + 1, [r.getMessage() for r in seen.records]
    [crashed] = errors(kept.records)
    assert crashed.exc_info is not None and isinstance(crashed.exc_info[1], RuntimeError)
    assert "a bug in a handler" in crashed.getMessage()
