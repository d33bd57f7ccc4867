"""The gateway demo (``make demo-mcp``): an MCP agent recorded by reversi-gateway, then rolled back.

1. starts what is missing: the local control plane, the CRDs, the operator (with its admission
   webhooks), the MCP shop (demo/mcp_shop/server.py: payments, inventory, an email outbox, with
   a call log) and reversi-gateway in front of it, running as its own user that may only review
   tokens and impersonate service accounts;
2. an MCP agent (demo/mcp_agent.py, no Reversi code) makes its calls through the gateway with
   its service-account token; each is recorded in Run order-4711 as the agent;
3. the on-call engineer applies a Halt on payments.*: the agent's next charge is refused by the
   gateway, and the shop's call log shows it never arrived;
4. the on-call engineer asks the gateway's operator tools (MCP, as themselves) for the plan and
   then for the rollback; the undo and read-back Jobs run reversi-mcp-runner against the shop;
5. the report is printed and checked against the shop's own state.

Where the machine can run containers (as ``make demo``: the node's Debian packages are installed
first where they are missing), the operator is installed by its Helm chart with its image, the MCP
shop is a Deployment of the demo image in a namespace that enforces the restricted Pod Security
Standard, and the undo and read-back Jobs run ``reversi-mcp-runner`` from the operator image,
reaching the shop by its Service's name; elsewhere one line says why and everything runs on the
node agent. The gateway runs on this machine either way. Setup stages print progress lines with
the time since the start; the demo ends with its time and the node it ran on.

Exit status: 0 when the report and the shop agree, 1 when they do not, 2 when the demo could not run.

    python demo/mcp_demo.py                # a real node where this machine can run one
    python demo/mcp_demo.py --node agent   # on the node agent even where a real node can run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from string import Template
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "operator"))

import yaml  # noqa: E402
from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from reversi.rbac import RECORD  # noqa: E402
from reversi.adapters.journal import list_objects  # noqa: E402
from reversi_devcluster import build, images  # noqa: E402
from reversi_devcluster.cluster import Cluster, ClusterError, ClusterSettings  # noqa: E402
from reversi_devcluster.localop import (  # noqa: E402
    OperatorProcess,
    apply_crds,
    free_port,
    remove_webhook_configurations,
)

from demo import on_real_node  # noqa: E402

G, V = "reversi.dev", "v1alpha1"
NS = "reversi-demo-mcp"
RUN = "order-4711"
GATEWAY_USER = "reversi-gateway"
ROLES = {
    # the gateway records as the agent (impersonation): the least rights of an agent, written once
    # in operator/reversi/rbac.py, as the chart's <fullname>-record role
    "checkout-agent": [dict(rule) for rule in RECORD],
    "oncall": [
        {"apiGroups": [G], "resources": ["runs", "runsteps"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [G], "resources": ["rollbackrequests"], "verbs": ["get", "list", "watch", "create"]},
        {"apiGroups": [G], "resources": ["halts"], "verbs": ["get", "list", "create", "delete"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
    ],
}


def title(text: str) -> None:
    print(f"\n== {text}", flush=True)


def recorded_steps(api: client.ApiClient, namespace: str, run: str) -> list[dict]:
    """The steps of Run ``namespace/run`` (their RunSteps' specs) in index order."""
    return [o["spec"] for o in list_objects(client.CustomObjectsApi(api), namespace, run)]


def start_listening(argv: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    """Start a process whose first stdout line is ``listening on URL``; return it and the URL."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO / "operator")})
    line = proc.stdout.readline().strip() if proc.stdout else ""
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"{Path(argv[1]).name if len(argv) > 1 else argv[0]} did not start; read {log}")
    return proc, line.split()[-1]


class Stack:
    """Control plane, operator, MCP shop and gateway, and a namespace with an agent and on-call
    service account. Used by this demo and by benchmarks/gateway_bench.py. ``real``: on a real
    node (the operator by its chart, the shop a Deployment, the Jobs in containers; see the module
    docstring), else on the node agent with everything as local processes."""

    def __init__(self, namespace: str = NS, call_timeout: float = 30.0, real: bool = False):
        self.namespace = namespace
        self.call_timeout = call_timeout
        self.real = real
        self.cluster = Cluster(ClusterSettings(real_node=real))
        self.started_cluster = False
        self.operator: OperatorProcess | None = None
        self.procs: list[subprocess.Popen] = []
        self.work = Path(tempfile.mkdtemp(prefix="reversi-demo-mcp-"))
        self.tokens: dict[str, Path] = {}

    def up(self, log=print) -> None:
        if not self.cluster.is_running():
            self.cluster.up(log=lambda m: log(f"  {m}"))
            self.started_cluster = True
        else:
            log(f"  using the running control plane at {self.cluster.server}")
        self.admin = config.new_client_from_config(config_file=str(self.cluster.paths.admin_kubeconfig))
        logs = self.cluster.paths.logs
        if self.real:
            log(f"  installing the operator with its Helm chart (release {on_real_node.RELEASE})")
            took = on_real_node.install_chart(self.admin, self.cluster.paths.admin_kubeconfig)
            log(f"  operator installed by its Helm chart in {on_real_node.SYSTEM_NS} (image {images.OPERATOR_IMAGE}, "
                f"restricted Pod Security) in {took:.0f}s")
            on_real_node.recreate_namespace(self.admin, self.namespace, on_real_node.RESTRICTED)
            self.shop_url = on_real_node.deploy_mcp_shop(self.admin, self.namespace)
            where = f"; the Jobs reach it by name: {on_real_node.mcp_shop_by_name(self.namespace)}"
        else:
            apply_crds(self.admin)
            self.operator = OperatorProcess(self.cluster.paths.admin_kubeconfig, logs / "demo-mcp-operator.log",
                                            metrics_port=free_port(), webhook_port=free_port())
            self.operator.start()
            log(f"  operator running with its admission webhooks (log: {self.operator.log})")
            shop, self.shop_url = start_listening([sys.executable, str(REPO / "demo/mcp_shop/server.py"), "--port",
                                                   "0"], logs / "demo-mcp-shop.log")
            self.procs.append(shop)
            where = ""
        self.shop_base = self.shop_url.rsplit("/", 1)[0]
        log(f"  MCP shop (payments, inventory, email outbox) at {self.shop_url}{where}")
        self._gateway_rbac()
        gateway, self.gateway_url = start_listening([
            sys.executable, "-m", "reversi.gateway.main", "--host", "127.0.0.1", "--port", "0",
            "--kubeconfig", str(self.cluster.kubeconfig_for(GATEWAY_USER)), "--upstream-url", self.shop_url,
            "--manifest", "shop-mcp", "--operator-tools", "--call-timeout-seconds", str(self.call_timeout)],
            logs / "demo-mcp-gateway.log")
        self.procs.append(gateway)
        self.operator_url = self.gateway_url.rsplit("/", 1)[0] + "/operator/mcp"
        log(f"  reversi-gateway at {self.gateway_url} (operator tools at {self.operator_url})")
        self._namespace()
        log(f"  namespace {self.namespace}: service accounts checkout-agent (records runs) and oncall "
            "(halts, rollbacks); ToolManifest shop-mcp")

    def _gateway_rbac(self) -> None:
        rbac = client.RbacAuthorizationV1Api(self.admin)
        rules = [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                 {"apiGroups": [""], "resources": ["serviceaccounts", "groups"], "verbs": ["impersonate"]}]
        ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reversi-gateway-demo"}
        for create, body in ((rbac.create_cluster_role, {"metadata": {"name": "reversi-gateway-demo"}, "rules": rules}),
                             (rbac.create_cluster_role_binding, {
                                 "metadata": {"name": "reversi-gateway-demo"}, "roleRef": ref,
                                 "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                               "name": GATEWAY_USER}]})):
            try:
                create(body)
            except ApiException as err:
                if err.status != 409:
                    raise

    def _namespace(self) -> None:
        core, rbac = client.CoreV1Api(self.admin), client.RbacAuthorizationV1Api(self.admin)
        if not self.real:  # on a real node it was made before the shop was deployed into it
            on_real_node.recreate_namespace(self.admin, self.namespace, {})
        for sa, rules in ROLES.items():
            rbac.create_namespaced_role(self.namespace, {"metadata": {"name": sa}, "rules": rules})
            core.create_namespaced_service_account(self.namespace, {"metadata": {"name": sa}})
            rbac.create_namespaced_role_binding(self.namespace, {
                "metadata": {"name": sa},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": self.namespace}]})
            token = core.create_namespaced_service_account_token(sa, self.namespace,
                                                                 {"spec": {"expirationSeconds": 3600}}).status.token
            path = self.work / f"{sa}.token"
            path.write_text(token)
            path.chmod(0o600)
            self.tokens[sa] = path
        manifest = yaml.safe_load(Template((REPO / "demo/mcp_shop/manifest.yaml").read_text()).safe_substitute(
            PYTHON=sys.executable, SHOP_URL=self.shop_url))
        if self.real:  # reversi-mcp-runner from the operator image, reaching the shop by its Service's name
            (runner,) = manifest["spec"]["runners"]
            runner.update(image=images.OPERATOR_IMAGE, command=["reversi-mcp-runner"],
                          env=[{"name": "REVERSI_MCP_URL", "value": on_real_node.mcp_shop_by_name(self.namespace)}])
        client.CustomObjectsApi(self.admin).create_namespaced_custom_object(G, V, self.namespace, "toolmanifests",
                                                                            manifest)

    def shop(self, method: str = "GET", path: str = "/_state", body: dict | None = None) -> Any:
        req = urllib.request.Request(self.shop_base + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.load(resp)

    def api_as(self, sa: str) -> client.ApiClient:
        """An ``ApiClient`` that authenticates with the service account's token."""
        cfg = client.Configuration()
        cfg.host = self.cluster.server
        cfg.ssl_ca_cert = str(self.cluster.ca.cert)
        cfg.api_key = {"authorization": "Bearer " + self.tokens[sa].read_text()}
        return client.ApiClient(cfg)

    def down(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.operator:
            self.operator.stop()
            if not self.started_cluster:  # a cluster we leave running must accept writes again
                remove_webhook_configurations(self.admin)
        if self.real and not self.started_cluster and hasattr(self, "admin"):
            on_real_node.uninstall_chart(self.cluster.paths.admin_kubeconfig, self.admin)
        if self.started_cluster:
            self.cluster.down(quiet=True)


async def operator_tool(url: str, token: str, tool: str, args: dict) -> Any:
    """Call one of the gateway's operator tools as the holder of ``token``."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http), cache=None) as c:
            return await c.call_tool(tool, args)


class Demo:
    def __init__(self, real: bool = False) -> None:
        self.stack = Stack(real=real)

    def agent(self, *extra: str) -> None:
        s = self.stack
        out = subprocess.run([sys.executable, str(REPO / "demo/mcp_agent.py"), "--url", s.gateway_url,
                              "--token-file", str(s.tokens["checkout-agent"]), "--run", RUN, *extra],
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        print(out.stdout, end="", flush=True)
        if out.returncode != 0:
            raise RuntimeError("the agent could not make its calls (its output is above)")

    def record(self) -> None:
        title(f"An MCP agent calls the shop through reversi-gateway (recorded in Run {RUN})")
        self.agent()
        run = client.CustomObjectsApi(self.stack.admin).get_namespaced_custom_object(G, V, NS, "runs", RUN)
        print(f"  Run {RUN}: principal {run['spec']['principal']} (the agent's service account, not the gateway)")
        for s in recorded_steps(self.stack.admin, NS, RUN):
            print(f"    {s['index']}  {s['tool']:<24} {s['outcome']}")

    def halt(self) -> None:
        title("On call: a Halt on payments.* (kept in git, applied by GitOps)")
        custom = client.CustomObjectsApi(self.stack.admin)
        custom.create_namespaced_custom_object(G, V, NS, "halts", {
            "apiVersion": f"{G}/{V}", "kind": "Halt", "metadata": {"name": "payments-freeze"},
            "spec": {"reason": "investigating double charges", "by": "oncall", "scope": {"tool": "payments.*"}}})
        before = len(self.stack.shop()["calls"])
        deadline = time.monotonic() + 20
        while True:  # the webhook sees the Halt once its watch delivers it
            steps = len(recorded_steps(self.stack.admin, NS, RUN))
            self.agent("--only", "payments.create_charge", "--order", "o-4711-retry")
            if len(recorded_steps(self.stack.admin, NS, RUN)) == steps or time.monotonic() > deadline:
                break
        arrived = [c for c in self.stack.shop()["calls"][before:] if c["args"].get("order_id") == "o-4711-retry"]
        refused = not arrived or len(recorded_steps(self.stack.admin, NS, RUN)) == steps
        print(f"  the shop's call log since the Halt: {len(arrived)} call(s) of the refused charge "
              f"({'it never arrived' if not arrived else 'it arrived before the halt was seen'})")
        custom.delete_namespaced_custom_object(G, V, NS, "halts", "payments-freeze")
        print("  Halt deleted (lifting a halt is deleting it)")
        if not refused:
            raise RuntimeError("the Halt did not refuse the charge within 20s")

    def rollback(self) -> dict:
        s = self.stack
        token = s.tokens["oncall"].read_text()
        title("On call asks the gateway's operator tools for the plan (as themselves)")
        plan = asyncio.run(operator_tool(s.operator_url, token, "reversi.plan_rollback", {"run": RUN}))
        if plan.is_error:
            raise RuntimeError(f"plan_rollback: {plan.content[0].text}")
        for a in plan.structured_content["plan"]["actions"]:
            extra = f" -> {a['compensationTool']}" if a.get("compensationTool") else ""
            print(f"    {a['step']}  {a['tool']:<24} {a['kind']:<13}{extra}")
        print(f"  fully reversible: {plan.structured_content['fullyReversible']} (the email cannot be unsent)")
        title("On call asks for the rollback; reversi-mcp-runner Jobs undo and read back through MCP")
        asked = asyncio.run(operator_tool(s.operator_url, token, "reversi.request_rollback",
                                          {"run": RUN, "confirm": True}))
        if asked.is_error:
            raise RuntimeError(f"request_rollback: {asked.content[0].text}")
        name = asked.structured_content["request"]
        print(f"  RollbackRequest {NS}/{name} created by system:serviceaccount:{NS}:oncall")
        custom = client.CustomObjectsApi(s.admin)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            req = custom.get_namespaced_custom_object(G, V, NS, "rollbackrequests", name)
            if (req.get("status") or {}).get("phase") in ("Succeeded", "Incomplete", "Failed"):
                break
            time.sleep(0.5)
        else:
            where = s.operator.log if s.operator else f"the operator's pod in {on_real_node.SYSTEM_NS}"
            raise RuntimeError(f"RollbackRequest {name} did not finish in 300s; see {where}")
        title(f"The report: {req['status']['phase']}")
        out = subprocess.run([sys.executable, "-m", "reversi.entrypoints.plugin", "--kubeconfig",
                              str(s.cluster.paths.admin_kubeconfig), "-n", NS, "describe", name], text=True,
                             capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO / "operator")}, timeout=60)
        print("\n".join("  " + line for line in (out.stdout + out.stderr).splitlines()))
        return req

    def check_truth(self, req: dict) -> int:
        title("The shop's own state: is what the report calls undone really undone?")
        state = self.stack.shop()
        report = req["status"]["report"]
        undone = set(report.get("compensated", [])) | set(report.get("unverified", []))
        disagreements = 0
        for step in recorded_steps(self.stack.admin, NS, RUN):
            if step["outcome"] != "succeeded":
                continue
            result, tool = step.get("result") or {}, step["tool"]
            if tool == "payments.create_charge":
                truth = "refunded" if state["charges"][result["id"]]["refunded"] else "still charged"
                really = truth == "refunded"
            elif tool == "inventory.reserve":
                truth = state["reservations"][result["id"]]["status"]
                really = truth == "released"
            elif tool == "email.send":
                sent = any(m["id"] == result.get("id") for m in state["outbox"])
                truth, really = ("in the customer's inbox" if sent else "not sent"), not sent
            else:
                continue
            claimed = step["index"] in undone
            verdict = "agrees" if claimed == really else "DISAGREES"
            disagreements += verdict != "agrees"
            print(f"  step {step['index']} {tool:<24} report: {'undone' if claimed else 'not undone':<11} "
                  f"shop: {truth:<24} {verdict}")
        keys = [c["idempotency_key"] for c in state["calls"] if c["tool"] in ("payments.refund", "inventory.release")]
        print(f"  undo calls the shop received: {len(keys)}, each with its idempotency key in _meta: {all(keys)}")
        if disagreements or not all(keys):
            print(f"\n{disagreements} disagreement(s) between the report and the shop")
            return 1
        print("\nThe report and the shop agree.")
        return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--node", choices=("auto", "real", "agent"), default=os.environ.get("REVERSI_DEMO_NODE", "auto"),
                   help="where pods run: a real node, the node agent, or auto (a real node where this machine can "
                        "run one; default, or $REVERSI_DEMO_NODE)")
    args = p.parse_args()
    started = time.monotonic()
    try:
        demo = Demo(real=on_real_node.choose_node(args.node))
    except ClusterError as err:
        print(f"demo failed: {err}", file=sys.stderr)
        return 2
    try:
        title("Setting up: local control plane, CRDs, operator, MCP shop, reversi-gateway")
        demo.stack.up(log=lambda m: build.progress(m.strip()))
        set_up = time.monotonic() - started
        demo.record()
        demo.halt()
        req = demo.rollback()
        verdict = demo.check_truth(req)
        print(f"\nOn {'a real node (kubelet, containerd)' if demo.stack.real else 'the node agent'}, in "
              f"{on_real_node.clock(time.monotonic() - started)} (setting up: {on_real_node.clock(set_up)}).")
        return verdict
    except (ClusterError, build.BuildError, images.ImageError, RuntimeError, ApiException) as err:
        print(f"\ndemo failed: {err}", file=sys.stderr)
        return 2
    finally:
        demo.stack.down()


if __name__ == "__main__":
    sys.exit(main())
