"""Reversi on a real node: the operator from its image, compensators and readers in containers,
and the faults only a real kubelet and container runtime produce. Each case is checked against
the downstream system's own record of what happened (tests/e2e/conftest.py)."""

from __future__ import annotations

import itertools
import json
import os
import random
import socket
import threading
import time
import urllib.request
from typing import Any

import pytest
from kubernetes import client

from demo import on_real_node
from reversi_devcluster import images
from tests.e2e.conftest import describe, kubectl_reversi
from tests.helpers import wait_for

pytestmark = pytest.mark.cluster
G, V = "reversi.dev", "v1alpha1"


def test_the_chart_installed_operator_undoes_a_charge_with_a_compensator_in_a_container(shop):
    """The verified rollback, end to end on the real node: the refund happens once downstream,
    the reader confirms it, and the compensator's pod ran as the restricted standard demands
    (a non-root user id, a read-only root) in the demo image. The compensator and the reader reach
    the downstream by its Service's DNS name (downstream.<namespace>.svc, through CoreDNS), the way
    users write their runners."""
    shop.manifest([shop.runner()])
    charge = shop.charge_in_a_run("order-1", "o-1")
    name = shop.roll_back("order-1")
    done = shop.wait_final(name)
    assert done["status"]["phase"] == "Succeeded", describe(shop, name)
    assert done["status"]["report"]["compensated"] == [0]
    refunds = shop.refunds(charge["id"])
    assert len(refunds) == 1 and refunds[0]["amount"] == 700, refunds
    assert shop.downstream.get_charge(charge["id"])["refunded"] is True
    pods = shop.pods(**{"reversi.dev/step": "0"})
    assert {p.spec.containers[0].name for p in pods} >= {"compensator", "reader"}
    for pod in pods:
        assert pod.status.phase == "Succeeded", pod.status
        assert pod.spec.containers[0].image == "localhost/reversi-demo:dev"
        assert pod.spec.security_context.run_as_user == 65532
        assert pod.spec.containers[0].security_context.read_only_root_filesystem is True
        env = {e.name: e.value for e in pod.spec.containers[0].env or []}
        assert env["DOWNSTREAM_URL"] == f"http://downstream.{shop.namespace}.svc:8080", env
        ended = pod.status.container_statuses[0].state.terminated
        assert ended.exit_code == 0 and ended.container_id.startswith("containerd://"), ended


def test_a_compensator_killed_by_its_memory_limit_is_reported_as_such_and_the_charge_stands(shop):
    """The kernel's OOM killer ends the compensator (its runner's memory limit): the attempt
    fails with the reason named, never as a success, and the report says the charge may stand,
    as it does downstream."""
    hungry = shop.runner("hungry", command=["python", "-c", "b = bytearray(512 * 1024 * 1024); print(len(b))"],
                         resources={"limits": {"memory": "48Mi"}, "requests": {"memory": "48Mi"}})
    shop.manifest([shop.runner(), hungry], compensator="hungry")
    charge = shop.charge_in_a_run("order-2", "o-2")
    name = shop.roll_back("order-2", retries=1)
    done = shop.wait_final(name)
    assert done["status"]["phase"] != "Succeeded", describe(shop, name)
    assert 0 not in done["status"]["report"].get("compensated", []), describe(shop, name)
    failed = {f["step"]: f["error"] for f in done["status"]["report"].get("failed", [])}
    assert "OOMKilled" in failed.get(0, ""), describe(shop, name)
    assert shop.refunds(charge["id"]) == []
    (pod,) = shop.pods(**{"reversi.dev/step": "0"})
    assert pod.status.container_statuses[0].state.terminated.reason == "OOMKilled"


def test_a_runner_image_that_cannot_be_pulled_is_named_in_the_step(shop):
    """A runner whose image no registry has: the kubelet cannot pull it; the step says so, naming
    the image and the kubelet's reason, and the charge is reported as standing."""
    missing = shop.runner("missing", image="localhost/reversi-no-such-image:1", deadlineSeconds=8)
    shop.manifest([shop.runner(), missing], compensator="missing")
    charge = shop.charge_in_a_run("order-3", "o-3")
    name = shop.roll_back("order-3", retries=1)
    done = shop.wait_final(name)
    assert 0 not in done["status"]["report"].get("compensated", []), describe(shop, name)
    failed = {f["step"]: f["error"] for f in done["status"]["report"].get("failed", [])}
    error = failed.get(0) or shop.step_status(name, 0).get("lastError") or ""
    assert "localhost/reversi-no-such-image:1" in error and ("ErrImagePull" in error or "ImagePullBackOff" in error), \
        describe(shop, name)
    assert shop.refunds(charge["id"]) == []


def _compensator_running(shop, timeout: float = 60, run: str | None = None) -> str:
    """The name of a compensator pod of step 0 (of Run ``run``, when given) once its container runs."""
    uid = run and shop.custom.get_namespaced_custom_object(G, V, shop.namespace, "runs", run)["metadata"]["uid"]

    def running():
        labels = {"reversi.dev/step": "0", **({"reversi.dev/run-uid": uid} if uid else {})}
        for pod in shop.pods(**labels):
            statuses = pod.status.container_statuses or []
            if pod.spec.containers[0].name == "compensator" and statuses and statuses[0].state.running:
                return pod.metadata.name
        return None
    return wait_for(running, timeout=timeout, what="the compensator's container to run")


def _evict(shop, real_api, pod: str) -> None:
    """Evict ``pod`` through the Eviction API, as a node drain does."""
    client.CoreV1Api(real_api).create_namespaced_pod_eviction(pod, shop.namespace, {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": shop.namespace}})


def _evicted_mid_refund(shop, real_api, run: str, order: str) -> tuple[str, dict]:
    """Charge ``order`` in Run ``run``, roll it back, and evict the compensator while its refund
    waits for an answer (the refund has happened downstream): the request's name and the charge."""
    charge = shop.charge_in_a_run(run, order)
    shop.downstream.inject_fault("/payments/refunds", "timeout", times=1, delay_s=60)
    name = shop.roll_back(run, retries=3, backoff={"baseMs": 500, "maxMs": 1000})
    pod = _compensator_running(shop)
    wait_for(lambda: shop.refunds(charge["id"]), timeout=30, what="the refund to happen downstream")
    _evict(shop, real_api, pod)
    return name, charge


def _refund_replays(shop) -> list[bool]:
    """Whether each refund call the downstream saw was a replay of an earlier one's key."""
    return [c["replayed"] for c in shop.downstream.state()["calls"] if c["path"] == "/payments/refunds"]


def test_a_compensator_evicted_mid_call_is_tried_again_and_the_refund_happens_once(shop, real_api):
    """The Eviction API ends the compensator while its refund call waits for an answer (the
    refund already happened downstream): the attempt fails, the next one sends the same
    idempotency key, so the downstream replays instead of refunding twice; the report says
    compensated after two attempts, and the downstream shows exactly one refund."""
    shop.manifest([shop.runner(env=[{"name": "DOWNSTREAM_URL", "value": shop.url},
                                    {"name": "DOWNSTREAM_TIMEOUT", "value": "120"}])])
    name, charge = _evicted_mid_refund(shop, real_api, "order-4", "o-4")
    done = shop.wait_final(name)
    assert done["status"]["phase"] == "Succeeded", describe(shop, name)
    assert shop.step_status(name, 0)["attempts"] == 2, describe(shop, name)
    assert len(shop.refunds(charge["id"])) == 1
    assert _refund_replays(shop) == [False, True]  # one effect, then its replay


def test_an_evicted_compensator_that_exits_0_is_not_taken_for_a_done_undo(shop, real_api):
    """An exit 0 that answers an eviction's SIGTERM is no proof of the undo. The compensator's entry
    point answers SIGTERM with exit 0 (a shell trap), and the tool declares no read-back that could
    catch a wrong verdict. It is evicted while its refund waits for an answer (the refund
    happened). On this Kubernetes (v1.36.3) the Job controller mostly counts the evicted pod failed
    (``BackoffLimitExceeded``) although its container exited 0; sometimes it marks the Job Complete
    (docs/guarantees.md#c-evicted). Either way the attempt is not counted done: pod truth sees the pod's
    ``DisruptionTarget`` (or, once the pod is gone, the kubelet's ``Killing`` Event) and takes the
    exit 0 for no answer (docs/guarantees.md#c-evicted). The attempt is tried again with the same
    idempotency key, which the downstream replays: compensated after 2 attempts, one real refund."""
    trap = shop.runner("trap", command=["sh", "-c", "trap 'exit 0' TERM; python /opt/reversi/demo/tool.py & wait $!"],
                       env=[{"name": "DOWNSTREAM_URL", "value": shop.url},
                            {"name": "DOWNSTREAM_TIMEOUT", "value": "120"}])
    shop.manifest([trap], compensator="trap", reader=None)
    name, _ = _evicted_mid_refund(shop, real_api, "order-9", "o-9")
    done = shop.wait_final(name)
    retried = [e.message for e in client.CoreV1Api(real_api).list_namespaced_event(
        shop.namespace, field_selector=f"involvedObject.name={name}").items if e.reason == "CompensationRetrying"]
    print(f"the evicted attempt, as the operator saw it: {retried}")  # Complete or Failed: which way it went
    assert shop.step_status(name, 0)["attempts"] == 2, describe(shop, name)
    assert done["status"]["report"]["compensated"] == [0], describe(shop, name)
    assert _refund_replays(shop) == [False, True]  # the effect once, then its replay


def test_a_kubelet_restarted_under_a_running_compensator_loses_nothing(shop, real_cluster):
    """The kubelet stops while the compensator waits for its refund's answer and comes back:
    the container kept running under containerd, its exit is read after the restart, and the
    refund is reported compensated and happened once."""
    shop.manifest([shop.runner(env=[{"name": "DOWNSTREAM_URL", "value": shop.url},
                                    {"name": "DOWNSTREAM_TIMEOUT", "value": "120"}])])
    charge = shop.charge_in_a_run("order-5", "o-5")
    shop.downstream.inject_fault("/payments/refunds", "timeout", times=1, delay_s=8)
    name = shop.roll_back("order-5")
    _compensator_running(shop)
    real_cluster.restart(["kubelet"], kill=True, down_seconds=2)
    done = shop.wait_final(name)
    assert done["status"]["phase"] == "Succeeded", describe(shop, name)
    assert shop.step_status(name, 0)["attempts"] == 1, describe(shop, name)
    calls = [c for c in shop.downstream.state()["calls"] if c["path"] == "/payments/refunds"]
    assert [c["replayed"] for c in calls] == [False], calls
    assert shop.downstream.get_charge(charge["id"])["refunded"] is True


def _container_running(shop, role: str, timeout: float = 60) -> str:
    """The name of a pod of step 0 whose ``role`` container (compensator, reader) runs."""

    def running():
        for pod in shop.pods(**{"reversi.dev/step": "0"}):
            statuses = pod.status.container_statuses or []
            if pod.spec.containers[0].name == role and statuses and statuses[0].state.running:
                return pod.metadata.name
        return None
    return wait_for(running, timeout=timeout, what=f"the {role}'s container to run")


def _compensator_job_complete(shop) -> bool:
    jobs = client.BatchV1Api(shop.api).list_namespaced_job(
        shop.namespace, label_selector="reversi.dev/step=0,reversi.dev/role=compensator").items
    return any(job.status.succeeded for job in jobs)


@pytest.mark.parametrize("component", ["kubelet", "containerd"])
def test_the_node_down_before_a_compensator_starts_and_before_its_read_back_loses_nothing(shop, real_cluster,
                                                                                         component):
    """docs/guarantees.md#c-kubelet and #containerd, moments 1, 3 and 4: ``component`` is down when
    the compensator's pod is made (moment 1), down again the moment its Job is Complete, before its
    read-back runs (moment 3), and restarted while the reader waits for its answer (moment 4).
    Each pod waits and runs once the node is whole, a running container lives on: the undo read
    back, one refund downstream."""
    shop.manifest([shop.runner(env=[{"name": "DOWNSTREAM_URL", "value": shop.url},
                                    {"name": "DOWNSTREAM_TIMEOUT", "value": "120"}])])
    charge = shop.charge_in_a_run("order-7", "o-7")
    real_cluster.stop([component])
    try:
        name = shop.roll_back("order-7")
        wait_for(lambda: shop.pods(**{"reversi.dev/step": "0"}), timeout=60, what="the compensator's pod")
    finally:
        real_cluster.start_stopped([component])
    wait_for(lambda: _compensator_job_complete(shop), timeout=120, what="the compensator's Job to complete")
    real_cluster.stop([component])
    try:
        wait_for(lambda: shop.step_status(name, 0)["stage"] == "verifying", timeout=60, what="the read-back due")
        shop.downstream.inject_fault(f"/payments/charges/{charge['id']}", "timeout", times=1, delay_s=8)
    finally:
        real_cluster.start_stopped([component])
    _container_running(shop, "reader")
    real_cluster.restart([component], kill=True, down_seconds=1)
    done = shop.wait_final(name)
    assert done["status"]["phase"] == "Succeeded", describe(shop, name)
    # the downstream runs on this node too: right after a kubelet restart its readiness probe may
    # fail, so an attempt can find its Service without endpoints; that attempt answers failed on its
    # own (nothing happened) and the retry sends the same key
    retried = [e.message for e in client.CoreV1Api(shop.api).list_namespaced_event(shop.namespace).items
               if e.reason == "CompensationRetrying"]
    assert shop.step_status(name, 0)["attempts"] == 1 + len(retried), describe(shop, name)
    assert all("cannot reach" in m for m in retried), retried
    assert done["status"]["report"]["compensated"] == [0], describe(shop, name)
    assert len(shop.refunds(charge["id"])) == 1
    assert shop.downstream.get_charge(charge["id"])["refunded"] is True


def test_reversi_mcp_runner_jobs_undo_an_mcp_servers_call_from_the_operator_image(shop, real_api):
    """The gateway's runner in a container: the compensator and reader Jobs run
    ``reversi-mcp-runner`` from the operator image against an MCP server (the MCP shop, a
    Deployment of the demo image); the shop's own call log shows the refund, with its
    idempotency key, and the read back."""
    mcp_url = on_real_node.deploy_mcp_shop(real_api, shop.namespace)
    runner = {"name": "mcp", "image": images.OPERATOR_IMAGE, "command": ["reversi-mcp-runner"],
              "env": [{"name": "REVERSI_MCP_URL", "value": on_real_node.mcp_shop_by_name(shop.namespace)}],
              "deadlineSeconds": 60}
    shop.manifest([runner], compensator="mcp", reader="mcp")
    from reversi.sdk import Recorder

    rec = Recorder.open(shop.namespace, "order-6", manifest="tools", api=real_api)
    args = {"order_id": "o-6", "amount": 700, "customer": "cus_9"}
    charge = rec.call("payments.create_charge", args, lambda a: _mcp_call(mcp_url, "payments.create_charge", a))
    truth = _rolled_back_in_the_mcp_shop(shop, "order-6", mcp_url)
    assert truth["charges"][charge["id"]]["refunded"] is True
    refunds = [c for c in truth["calls"] if c["tool"] == "payments.refund"]
    assert len(refunds) == 1 and refunds[0]["idempotency_key"], refunds
    assert any(c["tool"] == "payments.get_charge" for c in truth["calls"]), "the reader Job read the shop back"


def test_the_charts_gateway_records_an_agents_mcp_call_as_the_agent_and_it_is_undone(shop, real_cluster, real_api):
    """The chart's reversi-gateway Deployment (the operator image, restricted) in front of the MCP
    shop: an agent's service account calls through it with its own token; the step is recorded as
    the agent (the gateway impersonates it) before the shop sees the call, and a rollback by
    ``reversi-mcp-runner`` Jobs refunds it once, as the shop's own log shows."""
    mcp_url = on_real_node.deploy_mcp_shop(real_api, shop.namespace)
    runner = {"name": "mcp", "image": images.OPERATOR_IMAGE, "command": ["reversi-mcp-runner"],
              "env": [{"name": "REVERSI_MCP_URL", "value": on_real_node.mcp_shop_by_name(shop.namespace)}],
              "deadlineSeconds": 60}
    shop.manifest([runner], compensator="mcp", reader="mcp")
    core, rbac = client.CoreV1Api(real_api), client.RbacAuthorizationV1Api(real_api)
    core.create_namespaced_service_account(shop.namespace, {"metadata": {"name": "agent"}})
    rbac.create_namespaced_role_binding(shop.namespace, {
        "metadata": {"name": "agent-records"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": shop.namespace}]})
    token = core.create_namespaced_service_account_token("agent", shop.namespace, {
        "spec": {"expirationSeconds": 600}}).status.token
    on_real_node.upgrade_chart(real_cluster.paths.admin_kubeconfig, {"gateway": {
        "enabled": True, "upstreamURL": on_real_node.mcp_shop_by_name(shop.namespace), "manifest": "tools"}})
    gateway = core.read_namespaced_service("reversi-gateway", on_real_node.SYSTEM_NS)
    url = f"http://{gateway.spec.cluster_ip}:{gateway.spec.ports[0].port}/mcp"
    wait_for(lambda: _answers(gateway.spec.cluster_ip, gateway.spec.ports[0].port), timeout=30,
             what="kube-proxy to route the gateway's Service")
    charge = _mcp_call(url, "payments.create_charge", {"order_id": "o-8", "amount": 700, "customer": "cus_9"},
                       {"Authorization": f"Bearer {token}", "Reversi-Run-Id": "order-8"})
    assert charge["_meta"]["reversi.dev/run"] == "order-8" and charge["_meta"]["reversi.dev/outcome"] == "succeeded"
    run = shop.custom.get_namespaced_custom_object(G, V, shop.namespace, "runs", "order-8")
    assert run["spec"]["principal"] == f"system:serviceaccount:{shop.namespace}:agent"
    truth = _rolled_back_in_the_mcp_shop(shop, "order-8", mcp_url)
    assert [c["tool"] for c in truth["calls"] if c["tool"] != "payments.get_charge"] == \
        ["payments.create_charge", "payments.refund"], truth["calls"]
    assert truth["charges"][charge["id"]]["refunded"] is True


def _rolled_back_in_the_mcp_shop(shop, run: str, mcp_url: str) -> dict:
    """Roll ``run`` back, check that its one step was compensated, and return the MCP shop's own
    state (its charges and every call it saw)."""
    name = shop.roll_back(run)
    done = shop.wait_final(name)
    assert done["status"]["phase"] == "Succeeded" and done["status"]["report"]["compensated"] == [0], \
        describe(shop, name)
    with urllib.request.urlopen(mcp_url.removesuffix("/mcp") + "/_state", timeout=10) as resp:
        return json.load(resp)


def _answers(host: str, port: int) -> bool:
    """Whether a TCP connection to ``host:port`` is accepted."""
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def _mcp_call(url: str, tool: str, args: dict, headers: dict[str, str] | None = None) -> dict:
    """One MCP tool call to ``url`` (with HTTP ``headers``); its structured result."""
    import anyio
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def go() -> Any:
        async with httpx2.AsyncClient(headers=headers or {}, timeout=30) as http:
            async with Client(streamable_http_client(url, http_client=http), cache=None) as c:
                return await c.call_tool(tool, args)

    result = anyio.run(go)
    assert not result.is_error, (result.meta, [getattr(c, "text", c) for c in result.content])
    return {**(result.structured_content or json.loads(result.content[0].text)), "_meta": result.meta or {}}


def test_a_rolling_upgrade_of_the_release_refuses_no_call_an_agent_records(shop, real_cluster, real_api):
    """``helm upgrade`` rolls the operator and every admission replica (a new pod annotation) while
    an agent records calls as fast as it can: no call is refused, every recorded call was made
    exactly once downstream, and the longest wait between two recorded calls stays short
    (docs/operations.md#admission-where-each-rule-is-enforced)."""
    from reversi.sdk import Recorder

    shop.manifest([shop.runner()])
    rec = Recorder.open(shop.namespace, "order-7", manifest="tools", api=real_api)
    stop, recorded, refused = threading.Event(), [], []

    def agent() -> None:
        while not stop.is_set():
            order = f"o-7-{len(recorded) + len(refused)}"
            try:
                rec.call("payments.create_charge", {"order_id": order, "amount": 100, "customer": "cus_9"},
                         lambda a: shop.downstream.create_charge(a["order_id"], a["amount"], a["customer"],
                                                                 idempotency_key=a["order_id"]))
                recorded.append(time.monotonic())
            except Exception as e:  # noqa: BLE001 - every refusal is the finding
                refused.append(f"{order}: {e!r}")

    core = client.CoreV1Api(real_api)
    rolled = "app.kubernetes.io/component!=gateway"  # the operator and the admission server (podAnnotations)
    before = {p.metadata.name for p in core.list_namespaced_pod(on_real_node.SYSTEM_NS, label_selector=rolled).items}
    thread = threading.Thread(target=agent, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(recorded) >= 5, timeout=30, what="the agent to record its first calls")
        rolled_at = time.monotonic()
        took = on_real_node.upgrade_chart(real_cluster.paths.admin_kubeconfig,
                                          {"podAnnotations": {"reversi.dev/rolled": str(rolled_at)}})
        count = len(recorded)
        wait_for(lambda: len(recorded) >= count + 5, timeout=30, what="the agent to record after the upgrade")
    finally:
        stop.set()
        thread.join(timeout=60)
    after = {p.metadata.name for p in core.list_namespaced_pod(on_real_node.SYSTEM_NS, label_selector=rolled).items
             if p.metadata.deletion_timestamp is None}
    assert after and not after & before, f"the upgrade rolled every pod: before {before}, after {after}"
    assert refused == [], refused[:5]
    during = [t for t in recorded if t >= rolled_at]
    longest = max(b - a for a, b in itertools.pairwise(during))
    print(f"rolling upgrade: {took:.1f} s, {len(during)} calls recorded meanwhile, longest wait {longest:.2f} s")
    assert longest < 5, f"{longest:.2f} s without a recorded call during the upgrade"
    charges = [c for c in shop.downstream.state()["charges"].values() if c["order_id"].startswith("o-7-")]
    steps = shop.custom.list_namespaced_custom_object(G, V, shop.namespace, "runsteps",
                                                      label_selector="reversi.dev/run=order-7")["items"]
    assert len(charges) == len(recorded) == len([s for s in steps if s["spec"].get("outcome") == "succeeded"])


def _lease_holder(real_api) -> str | None:
    """The operator pod that holds the release's Lease (its ``holderIdentity``), or None."""
    lease = client.CoordinationV1Api(real_api).read_namespaced_lease(f"{on_real_node.RELEASE}-operator",
                                                                     on_real_node.SYSTEM_NS)
    return lease.spec.holder_identity or None


def test_the_charts_standby_operator_takes_over_a_rollback_whose_leader_pod_is_killed(shop, real_api):
    """The chart's two operator replicas on the real node: the pod holding the Lease is deleted
    with a grace period of 0 (the kubelet stops it at once; the operator releases its Lease as it
    stops) while a two-step rollback at parallelism 1 waits on its first refund; the other replica
    takes the Lease and finishes the rollback, and the downstream made each refund exactly once
    (docs/operations.md#leader-election). A SIGKILLed holder is the local control plane's case
    (tests/integration/test_leader_election.py)."""
    from reversi.sdk import Recorder

    shop.manifest([shop.runner()])
    rec = Recorder.open(shop.namespace, "order-9", manifest="tools", api=real_api)
    charges = [rec.call("payments.create_charge", {"order_id": order, "amount": 300, "customer": "cus_9"},
                        lambda a: shop.downstream.create_charge(a["order_id"], a["amount"], a["customer"],
                                                                idempotency_key=a["order_id"]))
               for order in ("o-9a", "o-9b")]
    # the first refund happens downstream and is answered 5 s later: the kill lands mid-call
    shop.downstream.inject_fault("/payments/refunds", "timeout", times=1, delay_s=5)
    name = shop.roll_back("order-9", parallelism=1)
    wait_for(lambda: shop.pods(**{"reversi.dev/role": "compensator"}) or None, timeout=90,
             what="the rollback's first compensator pod")
    holder = wait_for(lambda: _lease_holder(real_api), timeout=30, what="a Lease holder")
    standby = {p.metadata.name for p in client.CoreV1Api(real_api).list_namespaced_pod(
        on_real_node.SYSTEM_NS, label_selector="app.kubernetes.io/component=operator").items} - {holder}
    assert standby, "the chart runs one operator replica: no standby to take over"
    killed = time.monotonic()
    client.CoreV1Api(real_api).delete_namespaced_pod(holder, on_real_node.SYSTEM_NS, grace_period_seconds=0)
    new = wait_for(lambda: (h := _lease_holder(real_api)) and h != holder and h, timeout=60,
                   what="another replica to take the Lease")
    took = time.monotonic() - killed
    done = shop.wait_final(name, timeout=240)
    print(f"real-node failover: {holder} killed, {new} holds the Lease {took:.1f} s later")
    assert new in standby, (new, standby)
    assert done["status"]["phase"] == "Succeeded", describe(shop, name)
    for charge in charges:
        assert len(shop.refunds(charge["id"])) == 1, shop.downstream.state()["refunds"]


#: rollbacks of the real node's chaos case: ``make e2e`` runs one (containerd, the fault no other
#: case covers), ``make chaos`` many (REVERSI_NODE_CHAOS_ROLLBACKS), every fault in turn, then at random
NODE_CHAOS_ROLLBACKS = int(os.environ.get("REVERSI_NODE_CHAOS_ROLLBACKS", "1"))
NODE_FAULTS = ("containerd", "kubelet", "eviction")


def test_rollbacks_hold_against_the_nodes_own_faults(shop, real_cluster, real_api):
    """Chaos on the node itself (docs/development.md#chaos): for each rollback of a two-charge run,
    while a compensator waits for its refund's answer, containerd or the kubelet is SIGKILLed and
    started again, or the compensator's pod is evicted. Judged against the downstream: every
    request ends; no charge is refunded twice for real (the retries replay the same idempotency
    key); a step reported compensated is refunded downstream; a step that is not is reported as
    failed, unverified or residue, never dropped. ``REVERSI_CHAOS_SEED`` replays a sequence."""
    seed = int(os.environ.get("REVERSI_CHAOS_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    print(f"node chaos: seed {seed}, {NODE_CHAOS_ROLLBACKS} rollbacks")
    shop.manifest([shop.runner(env=[{"name": "DOWNSTREAM_URL", "value": shop.url},
                                    {"name": "DOWNSTREAM_TIMEOUT", "value": "120"}])])
    from reversi.sdk import Recorder

    for i in range(NODE_CHAOS_ROLLBACKS):
        fault = NODE_FAULTS[i] if i < len(NODE_FAULTS) else rng.choice(NODE_FAULTS)
        run = f"chaos-{i}"
        rec = Recorder.open(shop.namespace, run, manifest="tools", api=real_api)
        charges = [rec.call("payments.create_charge", {"order_id": f"c{i}-{k}", "amount": 100 + k, "customer": "cus_9"},
                            lambda a: shop.downstream.create_charge(a["order_id"], a["amount"], a["customer"],
                                                                    idempotency_key=a["order_id"]))
                   for k in range(2)]
        # both refunds answer late (the refund happens at once): the fault lands mid-call
        shop.downstream.inject_fault("/payments/refunds", "timeout", times=2, delay_s=rng.uniform(3, 6))
        name = shop.roll_back(run, retries=3, backoff={"baseMs": 500, "maxMs": 1000})
        pod = _compensator_running(shop, run=run)
        down = rng.uniform(0, 2)
        if fault == "eviction":
            _evict(shop, real_api, pod)
        else:
            real_cluster.restart([fault], kill=True, down_seconds=down)
        done = shop.wait_final(name)
        report = done["status"]["report"]
        said = ({f["step"] for f in report.get("failed", [])} | set(report.get("unverified", []))
                | {r.get("step") for r in report.get("residue", [])})
        attempts = [shop.step_status(name, step).get("attempts") for step in range(2)]
        print(f"  {run}: {fault} (down {down:.1f} s) -> {done['status']['phase']}, compensated "
              f"{report.get('compensated', [])}, attempts {attempts}")
        for step, charge in enumerate(charges):
            refunds = shop.refunds(charge["id"])
            assert len(refunds) <= 1, (seed, run, fault, refunds)
            if step in report.get("compensated", []):
                assert refunds and shop.downstream.get_charge(charge["id"])["refunded"], (seed, run, fault)
            else:
                assert step in said, (seed, run, fault, describe(shop, name))


def test_kubectl_reversi_check_passes_before_and_after_the_install_and_names_admission_scaled_to_zero(
        shop, real_cluster, real_api, pre_check):
    """``kubectl reversi check --pre`` passed on the bare cluster (run before the chart's install), ``kubectl
    reversi check`` passes on the install, and with the admission replicas scaled to 0 it fails (exit 2) with one
    line that names them and what to do (docs/operations.md#checking-an-install)."""
    pre = pre_check
    assert pre.returncode == 0 and pre.stdout.strip().endswith("all checks passed"), (pre.stdout, pre.stderr)
    assert "Kubernetes v1.36" in pre.stdout
    installed = kubectl_reversi(real_cluster, "check", "--release-namespace", on_real_node.SYSTEM_NS)
    assert installed.returncode == 0, (installed.stdout, installed.stderr)
    assert "policies are in force" in installed.stdout and "webhooks answer" in installed.stdout
    assert f"Lease {on_real_node.SYSTEM_NS}/{on_real_node.RELEASE}-operator held by" in installed.stdout

    apps = client.AppsV1Api(real_api)
    admission = f"{on_real_node.RELEASE}-admission"
    replicas = apps.read_namespaced_deployment(admission, on_real_node.SYSTEM_NS).spec.replicas
    apps.patch_namespaced_deployment_scale(admission, on_real_node.SYSTEM_NS, {"spec": {"replicas": 0}})
    try:
        wait_for(lambda: not apps.read_namespaced_deployment(admission, on_real_node.SYSTEM_NS).status.ready_replicas,
                 timeout=120, what="the admission replicas gone")
        broken = kubectl_reversi(real_cluster, "check")
        problems = [line for line in broken.stdout.splitlines() if line.startswith("✗")]
        assert broken.returncode == 2, (broken.stdout, broken.stderr)
        assert problems == [f"✗ Deployment {on_real_node.SYSTEM_NS}/{admission} has 0 of 0 replicas ready: every "
                            "write of Reversi's kinds is refused meanwhile (failurePolicy Fail): kubectl -n "
                            f"{on_real_node.SYSTEM_NS} scale deployment {admission} --replicas=2, and see "
                            "docs/operations.md#reversiadmissiondown"], broken.stdout
    finally:
        apps.patch_namespaced_deployment_scale(admission, on_real_node.SYSTEM_NS, {"spec": {"replicas": replicas}})
        wait_for(lambda: kubectl_reversi(real_cluster, "check").returncode == 0, timeout=180,
                 what="kubectl reversi check to pass again with the admission replicas back")
