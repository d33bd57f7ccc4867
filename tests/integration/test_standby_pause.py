"""A replica that kopf's peering pauses (a standby) starts no reconcile pass, also for the
requests its work queue still holds, and works them as soon as kopf resumes it
(docs/operations.md#standby-replicas-peering)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.helpers import wait_for
from tests.integration.test_contract import _charge_step, _jobs

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
PEER = "standby-test-peer"


def _apply_peering_crds(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    for doc in yaml.safe_load_all((ROOT / "charts" / "reversi" / "crds" / "kopf-peering.yaml").read_text()):
        try:
            ext.create_custom_resource_definition(doc)
        except ApiException as err:
            if err.status != 409:
                raise
    custom = client.CustomObjectsApi(api)
    wait_for(lambda: custom.list_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings") is not None,
             timeout=30, what="the peering CRDs to be served")


def _log_from(path: Path, offset: int) -> str:
    with path.open("rb") as fh:
        fh.seek(offset)
        return fh.read().decode(errors="replace")


def test_a_replica_paused_by_peering_starts_no_pass_until_kopf_resumes_it(rv, operator, admin_api, monkeypatch):
    """The operator works a request (its only pass left waits for an approval, requeued every
    5 s); an active replica of higher priority appears, so kopf pauses this one and delivers no
    more events. The approval given during the pause must not be acted on by a requeued pass
    (no compensator Job); once the other replica is gone, kopf resumes this one and it finishes."""
    _apply_peering_crds(admin_api)
    custom = client.CustomObjectsApi(admin_api)
    name = f"reversi-{rv.ns}"
    custom.create_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", {
        "apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}, "status": {}})
    try:
        monkeypatch.setenv("REVERSI_PEERING", name)
        operator.stop()
        operator.start()
        rv.apply_manifest()
        s0, charge = _charge_step(rv, 0, "o-standby")
        capture = rv.capture(charge["id"])
        rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, capture)])
        rv.request("undo", "r")
        rv.wait_phase("undo", "AwaitingApproval")  # the capture's void waits; the refund waits for it
        offset = operator.log.stat().st_size
        now = dt.datetime.now(dt.UTC).isoformat()
        custom.patch_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", name, {
            "status": {PEER: {"priority": 10**12, "lifetime": 600, "lastseen": now}}})
        wait_for(lambda: "Pausing operations in favour of" in _log_from(operator.log, offset), timeout=60,
                 what="kopf to pause the operator")
        rv.patch("rollbackrequests", "undo", {"spec": {"approvals": [{"step": 1}]}})
        held = time.monotonic()
        while time.monotonic() - held < 8:  # past the 5 s requeue of a request awaiting approval
            assert _jobs(rv, "compensator") == [], "a paused replica started a compensator"
            assert rv.get("rollbackrequests", "undo")["status"]["phase"] == "AwaitingApproval"
            time.sleep(0.25)
        custom.patch_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", name, {"status": {PEER: None}})
        req = rv.wait_phase("undo", "Succeeded", "Incomplete", timeout=120)
        assert req["status"]["phase"] == "Succeeded", req["status"].get("report")
        assert "Resuming operations after the pause" in _log_from(operator.log, offset)
        assert rv.downstream.get(f"/payments/captures/{capture['id']}")["status"] == "voided"
        assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
        assert len(rv.downstream.calls(f"/payments/captures/{capture['id']}/void", since=rv.started)) == 1
        assert len(rv.downstream.calls("/payments/refunds", since=rv.started)) == 1
    finally:
        monkeypatch.delenv("REVERSI_PEERING", raising=False)
        operator.stop()
        operator.start()
        try:
            custom.delete_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", name)
        except ApiException as err:
            if err.status != 404:
                raise
