"""Standby replicas (docs/operations.md#standby-replicas-peering): two operator replicas peer through
kopf; the rollback workers of a replica that kopf pauses start no pass, also for the requests their
work queue still holds, and the standby takes the work over once the active replica is gone. The
workers learn kopf's pause from a kopf daemon that runs only while kopf runs the replica
(reversi.handlers.peering)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from reversi.handlers import peering
from reversi_devcluster.localop import OperatorProcess
from tests.helpers import wait_for
from tests.integration.test_contract import _charge_step, _jobs

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
PEER = "standby-test-peer"
#: what reversi.handlers.peering logs when kopf starts and stops its daemon
ACTIVE = "kopf runs this replica"
PAUSED = "kopf paused or is stopping this replica"


def _apply_peering_crds(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    for doc in yaml.safe_load_all((ROOT / "charts" / "reversi" / "crds" / "kopf-peering.yaml").read_text()):
        try:
            ext.create_custom_resource_definition(doc)
        except ApiException as err:
            if err.status != 409:
                raise
    custom = client.CustomObjectsApi(api)

    def served() -> bool:
        try:
            custom.list_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings")
        except ApiException as err:
            if err.status != 404:  # a CRD just made is served a moment later
                raise
            return False
        return True

    wait_for(served, timeout=30, what="the peering CRDs to be served")


def _log_from(path: Path, offset: int = 0) -> str:
    with path.open("rb") as fh:
        fh.seek(offset)
        return fh.read().decode(errors="replace")


def test_a_paused_replica_starts_no_pass_and_the_standby_takes_over(rv, operator, cluster, admin_api, monkeypatch):
    """The first replica is active (the oldest has the highest priority), the second stands by.
    The first works a request up to its approval (its only pass left is requeued every 5 s). A
    peer of higher priority appears: kopf pauses the first replica as well. The approval given now
    must not be acted on (no compensator Job), though the first replica's queue holds the request.
    The first replica stops; once the other peer is gone too, kopf resumes the standby, whose
    workers finish the request."""
    _apply_peering_crds(admin_api)
    custom = client.CustomObjectsApi(admin_api)
    name = f"reversi-{rv.ns}"
    custom.create_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", {
        "apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}, "status": {}})

    def peers() -> dict:
        return custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", name).get("status") or {}

    replicas: list[OperatorProcess] = []
    starts: list[int] = []  # where each replica's log begins for this test
    try:
        monkeypatch.setenv("REVERSI_PEERING", name)
        operator.kill()  # the tests' operator; its admission replicas go on serving
        for n in (1, 2):
            replica = OperatorProcess(cluster.paths.admin_kubeconfig, operator.log.with_name(f"operator-peer-{n}.log"),
                                      tick_seconds=operator.tick_seconds)
            starts.append(replica.log.stat().st_size if replica.log.exists() else 0)
            replica.start()
            replicas.append(replica)
            wait_for(lambda n=n: len(peers()) == n, timeout=60, what=f"replica {n} to announce itself")
            if n == 1:
                wait_for(lambda: ACTIVE in _log_from(replicas[0].log, starts[0]), timeout=60,
                         what="kopf to run the first replica")
        first, second = replicas
        first_at, second_at = first.log.stat().st_size, starts[1]

        rv.apply_manifest()
        s0, charge = _charge_step(rv, 0, "o-standby")
        capture = rv.capture(charge["id"])
        rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, capture)])
        rv.request("undo", "r")
        rv.wait_phase("undo", "AwaitingApproval")  # the capture's void waits; the refund waits for it
        assert ACTIVE not in _log_from(second.log, second_at), "the standby ran while the first replica worked"

        now = dt.datetime.now(dt.UTC).isoformat()
        custom.patch_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", name, {
            "status": {PEER: {"priority": 10**12, "lifetime": 600, "lastseen": now}}})
        wait_for(lambda: PAUSED in _log_from(first.log, first_at), timeout=60, what="kopf to pause the first replica")
        rv.patch("rollbackrequests", "undo", {"spec": {"approvals": [{"step": 1}]}})
        held = time.monotonic()
        while time.monotonic() - held < 8:  # past the 5 s requeue of a request awaiting approval
            assert _jobs(rv, "compensator") == [], "a paused replica started a compensator"
            assert rv.get("rollbackrequests", "undo")["status"]["phase"] == "AwaitingApproval"
            time.sleep(0.25)

        first.stop()  # kopf takes it out of the peering object as it exits
        wait_for(lambda: len(peers()) == 2, timeout=30, what="the first replica to leave the peering object")
        custom.patch_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", name, {"status": {PEER: None}})
        wait_for(lambda: ACTIVE in _log_from(second.log, second_at), timeout=90, what="kopf to resume the standby")
        req = rv.wait_phase("undo", "Succeeded", "Incomplete", timeout=120)
        assert req["status"]["phase"] == "Succeeded", req["status"].get("report")
        assert rv.downstream.get(f"/payments/captures/{capture['id']}")["status"] == "voided"
        assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
        assert len(rv.downstream.calls(f"/payments/captures/{capture['id']}/void", since=rv.started)) == 1
        assert len(rv.downstream.calls("/payments/refunds", since=rv.started)) == 1
        crd = client.ApiextensionsV1Api(admin_api).read_custom_resource_definition(peering.CLUSTER_PEERING_CRD)
        assert any("kopf" in f for f in crd.metadata.finalizers or []), "the daemon holds kopf's finalizer"
    finally:
        for replica in replicas:
            replica.stop()
        monkeypatch.delenv("REVERSI_PEERING", raising=False)
        # no replica follows the peering any more: lift the daemon's finalizer, as the docs say to
        ext = client.ApiextensionsV1Api(admin_api)
        kept = [f for f in ext.read_custom_resource_definition(peering.CLUSTER_PEERING_CRD).metadata.finalizers or []
                if "kopf" not in f]
        ext.patch_custom_resource_definition(peering.CLUSTER_PEERING_CRD, {"metadata": {"finalizers": kept or None}})
        operator.start()
        try:
            custom.delete_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", name)
        except ApiException as err:
            if err.status != 404:
                raise
