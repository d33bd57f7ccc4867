"""reversi-gateway on the local control plane, with the demo MCP shop as the upstream.

The agent is the official MCP SDK client with a service-account token; the downstream truth is
the shop's own state and call log (``GET /_state``): what the shop saw and what it never saw.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from collections.abc import AsyncIterator

import anyio
import httpx2
import pytest
from kubernetes import client
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.helpers import recorded_steps, wait_for

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
G, V = "reversi.dev", "v1alpha1"
MANIFEST = "shop-mcp"
CALL_TIMEOUT = 1.5


class Proc:
    """A child process whose first stdout line is ``listening on URL``."""

    def __init__(self, argv: list[str], log: Path):
        self.log = log
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
        line = self.proc.stdout.readline().strip()
        assert line.startswith("listening on "), f"{argv[:3]} did not start: {line!r}; see {log}"
        self.url = line.split()[-1]
        self.base = self.url.rsplit("/", 1)[0]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Shop(Proc):
    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        req = urllib.request.Request(self.base + path, method=method, headers={"Content-Type": "application/json"},
                                     data=json.dumps(body).encode() if body is not None else None)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.load(resp)

    def state(self) -> dict:
        return self._call("GET", "/_state")

    def calls(self, tool_prefix: str = "") -> list[dict]:
        return [c for c in self.state()["calls"] if c["tool"].startswith(tool_prefix)]

    def fault(self, tool: str, delay_s: float, times: int = 1) -> None:
        self._call("POST", "/_faults", {"tool": tool, "delay_s": delay_s, "times": times})

    def reset(self) -> None:
        self._call("POST", "/_reset", {})


@pytest.fixture(scope="module")
def shop(cluster):
    proc = Shop([sys.executable, str(REPO / "demo" / "mcp_shop" / "server.py"), "--port", "0"],
                cluster.paths.logs / "mcp-shop.log")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def gateway(cluster, admin_api, shop, operator):
    """reversi-gateway as its own user: may review tokens and impersonate service accounts, nothing else."""
    rbac = client.RbacAuthorizationV1Api(admin_api)
    name = f"reversi-gateway-test-{uuid.uuid4().hex[:5]}"
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["serviceaccounts", "groups"], "verbs": ["impersonate"]}]})
    rbac.create_cluster_role_binding({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "reversi-gateway"}]})
    kubeconfig = cluster.kubeconfig_for("reversi-gateway")
    gw = Proc([sys.executable, "-m", "reversi.gateway.main", "--host", "127.0.0.1", "--port", "0",
               "--kubeconfig", str(kubeconfig), "--upstream-url", shop.url, "--manifest", MANIFEST,
               "--call-timeout-seconds", str(CALL_TIMEOUT), "--operator-tools", "--log-level", "INFO"],
              cluster.paths.logs / "gateway.log")
    yield gw
    gw.stop()
    rbac.delete_cluster_role_binding(name)
    rbac.delete_cluster_role(name)


def shop_manifest(shop_url: str) -> dict:
    """The shop's ToolManifest: every compensator and reader is reversi-mcp-runner on the shop."""
    runner = {"name": "mcp", "image": "registry.example/reversi:0.1.0",
              "command": [sys.executable, "-m", "reversi.gateway.runner"],
              "env": [{"name": "REVERSI_MCP_URL", "value": shop_url}], "deadlineSeconds": 60}
    return {"apiVersion": f"{G}/{V}", "kind": "ToolManifest", "metadata": {"name": MANIFEST}, "spec": {
        "runners": [runner],
        "tools": [
            {"name": "payments.get_customer", "effect": "read"},
            {"name": "payments.create_charge", "effect": "write", "idempotencyKey": "$args.order_id",
             "compensation": {"tool": "payments.refund", "kind": "compensation", "runner": "mcp",
                              "args": {"charge_id": "$result.id", "amount": "$args.amount"},
                              "residue": ["the charge and its refund stay on the statement"]},
             "verification": {"tool": "payments.get_charge", "args": {"charge_id": "$result.id"},
                              "expect": {"refunded": True}, "retries": 2, "backoffMs": 200, "runner": "mcp"}},
            {"name": "inventory.reserve", "effect": "write", "toolErrors": "failed",
             "compensation": {"tool": "inventory.release", "kind": "inverse", "runner": "mcp",
                              "args": {"reservation_id": "$result.id"}},
             "verification": {"tool": "inventory.get_reservation", "args": {"reservation_id": "$result.id"},
                              "expect": {"status": "released"}, "retries": 2, "backoffMs": 200, "runner": "mcp"}},
            {"name": "email.send", "effect": "irreversible", "residue": ["the customer has read the email"]},
        ]}}


AGENT_RULES = [
    {"apiGroups": [G], "resources": ["runs"], "verbs": ["get", "list", "watch", "create", "update", "patch"]},
    {"apiGroups": [G], "resources": ["runsteps"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": [G], "resources": ["toolmanifests"], "verbs": ["get", "list", "watch"]},
    # a keyed call claims its idempotency key (a Lease), as the chart's edit role allows
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "get", "patch", "delete"]},
]

ONCALL_RULES = [
    {"apiGroups": [G], "resources": ["runs", "runsteps"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [G], "resources": ["rollbackrequests"], "verbs": ["get", "list", "watch", "create"]},
]


@pytest.fixture
def agents(admin_api, namespace, shop, gateway):
    """Service accounts agent-a and agent-b (may record runs), oncall (may request rollbacks)
    and their tokens; the shop's
    manifest; the shop reset. Returns ``{name: token}``."""
    shop.reset()
    core, rbac = client.CoreV1Api(admin_api), client.RbacAuthorizationV1Api(admin_api)
    client.CustomObjectsApi(admin_api).create_namespaced_custom_object(G, V, namespace, "toolmanifests",
                                                                       shop_manifest(shop.url))
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "agent"}, "rules": AGENT_RULES})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "oncall"}, "rules": ONCALL_RULES})
    tokens = {}
    for sa, role in (("agent-a", "agent"), ("agent-b", "agent"), ("oncall", "oncall")):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": sa}})
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": sa},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]})
        req = core.create_namespaced_service_account_token(sa, namespace, {"spec": {"expirationSeconds": 3600}})
        tokens[sa] = req.status.token
    return tokens


@asynccontextmanager
async def mcp_agent(url: str, token: str, run: str | None) -> AsyncIterator[Client]:
    """An MCP client as the agent: its token, and the run named in Reversi-Run-Id."""
    headers = {"Authorization": f"Bearer {token}", **({"Reversi-Run-Id": run} if run else {})}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http), cache=None) as c:
            yield c


def calls_through(url: str, token: str, run: str | None, calls: list[tuple[str, dict]]) -> list[Any]:
    """Make ``calls`` in order through the gateway; return the CallToolResults."""
    async def go() -> list[Any]:
        async with mcp_agent(url, token, run) as c:
            return [await c.call_tool(tool, args) for tool, args in calls]

    return anyio.run(go)


def text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


def test_gateway_records_each_call_in_order_with_its_outcome(gateway, shop, agents, admin_api, namespace):
    async def go() -> tuple[list[str], list[Any]]:
        async with mcp_agent(gateway.url, agents["agent-a"], "order-1") as c:
            listed = [t.name for t in (await c.list_tools()).tools]
            results = [await c.call_tool("payments.get_customer", {"customer_id": "cus_9"}),
                       await c.call_tool("payments.create_charge",
                                         {"order_id": "o-1", "amount": 700, "customer": "cus_9"}),
                       await c.call_tool("inventory.reserve", {"sku": "sku-mug", "qty": 99, "order_id": "o-1"}),
                       await c.call_tool("inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-1"}),
                       await c.call_tool("email.send", {"to": "ada@example.com", "subject": "your order"})]
            return listed, results

    listed, results = anyio.run(go)
    assert "payments.create_charge" in listed and "inventory.release" in listed  # tools/list passes through
    steps = recorded_steps(admin_api, namespace, "order-1")
    assert [(s["index"], s["tool"], s["outcome"]) for s in steps] == [
        (0, "payments.get_customer", "succeeded"), (1, "payments.create_charge", "succeeded"),
        (2, "inventory.reserve", "failed"),      # a tool error, and the manifest says it means "nothing happened"
        (3, "inventory.reserve", "succeeded"), (4, "email.send", "succeeded")]
    truth = shop.state()
    charge = next(iter(truth["charges"].values()))
    assert steps[1]["result"] == charge, "the recorded result is the server's answer"
    assert steps[3]["result"]["id"] in truth["reservations"] and truth["stock"]["sku-mug"] == 4
    assert "out of stock" in steps[2]["error"] and results[2].is_error
    assert [c["tool"] for c in truth["calls"]] == [s["tool"] for s in steps], "the shop saw exactly the recorded calls"
    assert [r.meta["reversi.dev/step"] for r in results] == [0, 1, 2, 3, 4]
    [again] = calls_through(gateway.url, agents["agent-a"], "order-1",
                            [("payments.get_customer", {"customer_id": "cus_9"})])
    assert again.meta["reversi.dev/step"] == 5, "a new connection with the same Reversi-Run-Id continues the run"
    run = client.CustomObjectsApi(admin_api).get_namespaced_custom_object(G, V, namespace, "runs", "order-1")
    assert run["spec"]["principal"] == f"system:serviceaccount:{namespace}:agent-a", \
        "the agent's identity, not the gateway's"
    assert run["spec"]["scope"]["actor"] == "agent-a" and run["spec"]["manifestRef"]["name"] == MANIFEST


def test_gateway_records_a_timeout_uncertain(gateway, shop, agents, admin_api, namespace):
    shop.fault("payments.create_charge", delay_s=CALL_TIMEOUT + 2)
    [result] = calls_through(gateway.url, agents["agent-a"], "slow-1",
                             [("payments.create_charge", {"order_id": "o-2", "amount": 300, "customer": "cus_9"})])
    assert result.is_error and "recorded uncertain" in text(result), text(result)
    [step] = recorded_steps(admin_api, namespace, "slow-1")
    assert step["outcome"] == "uncertain" and "timed out" in step["error"], step
    # downstream truth: the charge did happen, which is exactly why Reversi will not guess
    assert [c["order_id"] for c in shop.state()["charges"].values()] == ["o-2"]


def test_gateway_refuses_a_halted_call_before_the_upstream_sees_it(gateway, shop, agents, admin_api, namespace):
    client.CustomObjectsApi(admin_api).create_namespaced_custom_object(G, V, namespace, "halts", {
        "apiVersion": f"{G}/{V}", "kind": "Halt", "metadata": {"name": "freeze"},
        "spec": {"reason": "duplicate charges", "by": "oncall", "scope": {"tool": "payments.*"}}})

    def refused() -> Any:
        [r] = calls_through(gateway.url, agents["agent-a"], "halted-1",
                            [("payments.create_charge", {"order_id": "o-3", "amount": 1, "customer": "cus_9"})])
        return r if r.is_error else None  # the webhook sees the Halt as soon as its watch delivers it

    result = wait_for(refused, timeout=20, what="the halt to refuse the call")
    assert "kill switch: duplicate charges" in text(result)
    assert shop.calls("payments.create_charge") == [], "the shop never saw the halted call"
    assert recorded_steps(admin_api, namespace, "halted-1") == []
    [ok] = calls_through(gateway.url, agents["agent-a"], "halted-1", [("email.send", {"to": "x@y", "subject": "s"})])
    assert not ok.is_error, "tools outside the halt's scope still work"


def test_gateway_refuses_a_second_principal(gateway, shop, agents, admin_api, namespace):
    calls_through(gateway.url, agents["agent-a"], "mine", [("payments.get_customer", {"customer_id": "cus_9"})])
    [result] = calls_through(gateway.url, agents["agent-b"], "mine",
                             [("payments.create_charge", {"order_id": "o-4", "amount": 5, "customer": "cus_9"})])
    assert result.is_error and "belongs to another principal" in text(result), text(result)
    assert shop.calls("payments.create_charge") == [], "the shop never saw agent-b's call"
    assert [s["tool"] for s in recorded_steps(admin_api, namespace, "mine")] == ["payments.get_customer"]
    [unknown] = calls_through(gateway.url, agents["agent-a"], "mine", [("inventory.get_stock", {"sku": "sku-mug"})])
    assert unknown.is_error and "has no entry in ToolManifest" in text(unknown), text(unknown)
    assert shop.calls("inventory.get_stock") == [], "a tool with no manifest entry is refused in enforce mode"


def test_gateway_refuses_a_call_once_the_journal_is_full_and_says_what_to_do(gateway, shop, agents, admin_api,
                                                                             namespace):
    from tests.integration.test_backpressure import journal_quota

    journal_quota(admin_api, namespace, 1)
    first, second = calls_through(gateway.url, agents["agent-a"], "full", [
        ("payments.get_customer", {"customer_id": "cus_9"}),
        ("payments.create_charge", {"order_id": "o-q", "amount": 5, "customer": "cus_9"})])
    assert not first.is_error
    assert second.is_error and "exceeded quota: reversi-journal" in text(second), text(second)
    assert "wait for retention to delete expired runs" in text(second) and "ask for a larger quota" in text(second)
    assert shop.calls("payments.create_charge") == [], "the shop never saw the refused call"


def test_gateway_names_the_run_after_the_mcp_session_when_no_header_names_it(gateway, shop, agents, admin_api,
                                                                            namespace):
    async def go(mode: str) -> list[Any]:
        headers = {"Authorization": f"Bearer {agents['agent-a']}"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            async with Client(streamable_http_client(gateway.url, http_client=http), cache=None, mode=mode) as c:
                return [await c.call_tool("payments.get_customer", {"customer_id": "cus_9"}) for _ in range(2)]

    legacy = anyio.run(go, "legacy")  # a 2025 MCP session: one run per session
    run = legacy[0].meta["reversi.dev/run"]
    assert run.startswith("mcp-") and legacy[1].meta["reversi.dev/run"] == run
    assert [s["index"] for s in recorded_steps(admin_api, namespace, run)] == [0, 1]
    sessionless = anyio.run(go, "auto")  # 2026 protocol: no session to name a run after
    assert sessionless[0].is_error and "send a Reversi-Run-Id header" in text(sessionless[0])
    assert len(shop.calls()) == 2, "the refused calls never reached the shop"


def test_gateway_refuses_requests_without_a_valid_token(gateway):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).encode()
    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        req = urllib.request.Request(gateway.url, data=body, method="POST", headers={
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        assert err.value.code == 401, err.value.read()


def test_rollback_through_reversi_mcp_runner_undoes_the_servers_state(gateway, shop, agents, admin_api, namespace):
    calls_through(gateway.url, agents["agent-a"], "order-9", [
        ("payments.create_charge", {"order_id": "o-9", "amount": 700, "customer": "cus_9"}),
        ("inventory.reserve", {"sku": "sku-tee", "qty": 1, "order_id": "o-9"}),
        ("email.send", {"to": "ada@example.com", "subject": "order o-9"})])
    before = shop.state()
    assert before["stock"]["sku-tee"] == 0
    custom = client.CustomObjectsApi(admin_api)
    operator_url = gateway.base + "/operator/mcp"
    plan, unconfirmed, forbidden = calls_through(operator_url, agents["oncall"], None, [
        ("reversi.plan_rollback", {"run": "order-9"}), ("reversi.request_rollback", {"run": "order-9"})]) + \
        calls_through(operator_url, agents["agent-a"], None,
                      [("reversi.request_rollback", {"run": "order-9", "confirm": True})])
    assert plan.structured_content["fullyReversible"] is False, plan  # the email stands
    assert [a["kind"] for a in plan.structured_content["plan"]["actions"]] == ["compensate", "compensate",
                                                                               "unrecoverable"]
    assert unconfirmed.is_error and "needs confirm: true" in text(unconfirmed)
    assert forbidden.is_error and "forbidden" in text(forbidden).lower(), "RBAC is the caller's own"
    [requested] = calls_through(operator_url, agents["oncall"], None,
                                [("reversi.request_rollback", {"run": "order-9", "confirm": True})])
    name = requested.structured_content["request"]

    def done() -> dict | None:
        obj = custom.get_namespaced_custom_object(G, V, namespace, "rollbackrequests", name)
        return obj if (obj.get("status") or {}).get("phase") in ("Succeeded", "Incomplete", "Failed") else None

    req = wait_for(done, timeout=120, what="the rollback to finish")
    report = req["status"]["report"]
    assert report["compensated"] == [0, 1], report
    assert [u["step"] if isinstance(u, dict) else u for u in report["unrecoverable"]] == [2], report
    assert report["unverified"] == [] and report["failed"] == []
    truth = shop.state()
    charge = next(iter(truth["charges"].values()))
    reservation = next(iter(truth["reservations"].values()))
    assert charge["refunded"] is True and reservation["status"] == "released" and truth["stock"]["sku-tee"] == 1
    assert len(truth["outbox"]) == 1, "the email cannot be taken back, and the report says so"
    undo_calls = [c for c in truth["calls"] if c["tool"] in ("payments.refund", "inventory.release")]
    assert {c["tool"] for c in undo_calls} == {"payments.refund", "inventory.release"}
    assert all(c["idempotency_key"] for c in undo_calls), "each undo carries its idempotency key in _meta"
    assert any(c["tool"] == "payments.get_charge" for c in truth["calls"]), "the reader Jobs read the shop back"


def test_gateway_over_stdio_records_as_its_own_identity(cluster, admin_api, namespace, operator, shop, tmp_path):
    """Local use: the agent starts the gateway over stdio, the gateway starts the shop over stdio,
    and runs are written with the gateway's kubeconfig (here the user local-dev)."""
    rbac = client.RbacAuthorizationV1Api(admin_api)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "agent"}, "rules": AGENT_RULES})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "local-dev"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agent"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "local-dev"}]})
    client.CustomObjectsApi(admin_api).create_namespaced_custom_object(G, V, namespace, "toolmanifests",
                                                                       shop_manifest(shop.url))
    state = tmp_path / "shop.json"
    gateway_cmd = StdioServerParameters(command=sys.executable, args=[
        "-m", "reversi.gateway.main", "--listen", "stdio", "--identity", "self",
        "--kubeconfig", str(cluster.kubeconfig_for("local-dev")), "--namespace", namespace, "--run", "local-1",
        "--manifest", MANIFEST, "--upstream-command", sys.executable, str(REPO / "demo" / "mcp_shop" / "server.py"),
        "--stdio", "--state-file", str(state)])

    async def go() -> list[Any]:
        async with Client(gateway_cmd, cache=None) as c:
            return [await c.call_tool("payments.create_charge", {"order_id": "o-5", "amount": 9, "customer": "cus_9"}),
                    await c.call_tool("email.send", {"to": "ada@example.com", "subject": "hi"})]

    results = anyio.run(go)
    assert not any(r.is_error for r in results), [text(r) for r in results]
    steps = recorded_steps(admin_api, namespace, "local-1")
    assert [(s["tool"], s["outcome"]) for s in steps] == [("payments.create_charge", "succeeded"),
                                                          ("email.send", "succeeded")]
    truth = json.loads(state.read_text())
    assert [c["tool"] for c in truth["calls"]] == ["payments.create_charge", "email.send"]
    assert steps[0]["result"] == next(iter(truth["charges"].values()))
    run = client.CustomObjectsApi(admin_api).get_namespaced_custom_object(G, V, namespace, "runs", "local-1")
    assert run["spec"]["principal"] == "local-dev"
