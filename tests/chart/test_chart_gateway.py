"""The chart's reversi-gateway Deployment: off by default; when on, restricted, least privilege."""

from __future__ import annotations

from tests.chart.chartkit import find

GATEWAY = {"gateway": {"enabled": True, "upstreamURL": "http://shop-mcp.shop:8000/mcp", "manifest": "shop-tools",
                       "toolMap": {"charge": "payments.create_charge"}, "tenant": "acme"}}


def test_gateway_is_off_by_default(render):
    assert not [o for o in render() if "gateway" in o["metadata"]["name"]]


def test_gateway_deployment_runs_reversi_gateway_restricted(render):
    objs = render(GATEWAY)
    dep = find(objs, "Deployment", "rv-reversi-gateway")
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["reversi-gateway"] and pod["serviceAccountName"] == "rv-reversi-gateway"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["REVERSI_GATEWAY_UPSTREAM_URL"] == "http://shop-mcp.shop:8000/mcp"
    assert env["REVERSI_GATEWAY_MANIFEST"] == "shop-tools" and env["REVERSI_GATEWAY_IDENTITY"] == "token"
    assert env["REVERSI_GATEWAY_TOOL_MAP"] == '{"charge":"payments.create_charge"}'
    assert env["REVERSI_GATEWAY_TENANT"] == "acme" and "REVERSI_GATEWAY_NAMESPACE" not in env
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    svc = find(objs, "Service", "rv-reversi-gateway")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert dep["spec"]["selector"]["matchLabels"] != find(objs, "Deployment",
                                                          "rv-reversi")["spec"]["selector"]["matchLabels"]


def test_gateway_may_only_review_tokens_and_impersonate_service_accounts(render):
    role = find(render(GATEWAY), "ClusterRole", "rv-reversi-gateway")
    assert role["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]}]
    with_tools = find(render({"gateway": {**GATEWAY["gateway"], "operatorTools": True}}), "ClusterRole",
                      "rv-reversi-gateway")
    assert with_tools["rules"][-1] == {"apiGroups": [""], "resources": ["users", "groups"], "verbs": ["impersonate"]}


def test_gateway_needs_its_upstream_and_manifest(render):
    assert "gateway.upstreamURL is required" in render.errors({"gateway": {"enabled": True, "manifest": "m"}})
    assert "gateway.manifest is required" in render.errors(
        {"gateway": {"enabled": True, "upstreamURL": "http://x/mcp"}})
    assert "additional properties" in render.errors({"gateway": {"enabled": True, "upstream": "x"}}).lower()
