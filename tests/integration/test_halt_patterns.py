"""Halt patterns on the real control plane: one meaning for every pattern from every entry point
(kubectl apply, kubectl reversi halt add; docs/concepts.md#glob-semantics-of-halt-scopes),
MatchesNoTool, errors that name a missing namespace, and a RollbackRequest created before its Run."""

from __future__ import annotations

import json
import re
import subprocess
import uuid

import pytest
from kubernetes.client.rest import ApiException

from reversi_devcluster import build
from reversi.models.halt import pattern_problem
from reversi.sdk import Halted, Recorder
from tests.gitops import kstatus
from tests.helpers import wait_for
from tests.integration.test_plugin import kr, one_line_error

pytestmark = pytest.mark.cluster
G, V = "reversi.dev", "v1alpha1"


def _halt_body(name: str, scope: dict) -> dict:
    return {"apiVersion": f"{G}/{V}", "kind": "Halt", "metadata": {"name": name},
            "spec": {"reason": "edge pattern", "scope": scope}}


def _agent_calls(rv, run: str, orders: list[str]) -> int:
    """An agent charges each order through the SDK; returns how many calls were refused (Halted).
    The downstream system is the truth: a refused call must leave no charge there."""
    rec = Recorder.open(rv.ns, run, manifest="payments", api=rv.api,
                        scope={"actor": "checkout-agent", "tenant": "acme", "environment": "prod"})
    refused = 0
    for order in orders:
        try:
            rec.call("payments.create_charge", {"order_id": order, "amount": 700, "customer": "cus_9"},
                     lambda a: rv.charge(a["order_id"]))
        except Halted:
            refused += 1
    return refused


def _charged(rv, orders: list[str]) -> int:
    charges = rv.downstream.state()["charges"].values()
    return sum(1 for ch in charges if ch["order_id"] in orders)


EDGE = ["", "payments\\", "^payments\\..*$", "pay ments.*", "payments.[a-z]*"]


def test_an_impossible_pattern_is_refused_the_same_by_apply_and_halt_add(rv, cluster):
    for i, pattern in enumerate(EDGE):
        why = pattern_problem("tool", pattern)
        assert why
        with pytest.raises(ApiException) as err:
            rv.create("halts", _halt_body(f"edge-{i}", {"tool": pattern}))
        assert err.value.status == 422 and f"can never match: {why}" in json.loads(err.value.body)["message"]
        line = one_line_error(kr(cluster, "halt", "add", f"cli-{i}", "--reason", "edge", "--tool", pattern,
                                 namespace=rv.ns))
        assert line.endswith(f"can never match: {why}"), line
    assert rv.custom.list_namespaced_custom_object(G, V, rv.ns, "halts")["items"] == []


def test_a_halt_from_each_entry_point_refuses_the_same_calls(rv, cluster):
    rv.apply_manifest()
    tag = uuid.uuid4().hex[:6]
    # kubectl apply of the YAML kept in git, then the plugin: the same pattern, the same refusals
    rv.create("halts", _halt_body("from-yaml", {"tool": "payments.create_*"}))
    orders = [f"o-{tag}-y{i}" for i in range(3)]
    assert _agent_calls(rv, "yaml-run", orders) == 3 and _charged(rv, orders) == 0
    rv.custom.delete_namespaced_custom_object(G, V, rv.ns, "halts", "from-yaml")
    added = kr(cluster, "halt", "add", "from-cli", "--reason", "edge", "--tool", "payments.create_*", namespace=rv.ns)
    assert added.returncode == 0 and "tool=payments.create_*" in added.stdout and "warning" not in added.stderr
    orders = [f"o-{tag}-c{i}" for i in range(3)]
    assert _agent_calls(rv, "cli-run", orders) == 3 and _charged(rv, orders) == 0
    # the API server's halts policy refused them (its own metric counts them, not the Halt's refusedCalls)
    wait_for(lambda: (rv.get("halts", "from-cli").get("status") or {}).get("active"), what="the halt reported")
    listed = kr(cluster, "halt", "list", namespace=rv.ns)
    row = next(line for line in listed.stdout.splitlines() if "from-cli" in line)
    assert "tool=payments.create_*" in row and " true " in row, listed.stdout
    # a pattern that matches nothing of the agent's from either entry point lets every call through
    kr(cluster, "halt", "lift", "from-cli", namespace=rv.ns)
    rv.create("halts", _halt_body("other-tool", {"tool": "inventory.*"}))
    orders = [f"o-{tag}-n{i}" for i in range(2)]
    assert _agent_calls(rv, "free-run", orders) == 0 and _charged(rv, orders) == 2


def test_a_halt_matching_no_tool_is_admitted_with_a_warning_and_MatchesNoTool(rv, cluster):
    rv.apply_manifest()
    kubectl = [str(build.binary("kubernetes", "kubectl")), "--kubeconfig", str(cluster.paths.admin_kubeconfig)]
    yaml = (f"apiVersion: {G}/{V}\nkind: Halt\nmetadata:\n  name: typo\n  namespace: {rv.ns}\n"
            "spec:\n  reason: typo\n  scope:\n    tool: \"paymnets.*\"\n")
    applied = subprocess.run(kubectl + ["apply", "-f", "-"], input=yaml, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    assert "scope.tool 'paymnets.*' matches none of the" in applied.stderr, applied.stderr
    added = kr(cluster, "halt", "add", "typo2", "--reason", "typo", "--tool", "emial.*", namespace=rv.ns)
    assert added.returncode == 0 and "warning: scope.tool 'emial.*' matches none of the" in added.stderr

    def condition(name):
        conds = (rv.get("halts", name).get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "MatchesNoTool"), None)

    cond = wait_for(lambda: condition("typo"), what="MatchesNoTool on typo")
    assert cond["status"] == "True" and cond["reason"] == "NoToolInReach"
    # GitOps tools never show the warning: the halt is not Ready but Stalled (kstatus Failed), though in force
    halt = rv.get("halts", "typo")
    conds = {x["type"]: (x["status"], x["reason"]) for x in halt["status"]["conditions"]}
    assert conds["Ready"] == ("False", "NoToolInReach") and conds["Stalled"] == ("True", "NoToolInReach")
    assert conds["Active"][0] == "True" and halt["status"]["active"] is True
    assert [x["status"] for x in kstatus([halt])] == ["Failed"]
    wait_for(lambda: condition("typo2"), what="MatchesNoTool on typo2")
    listed = kr(cluster, "halt", "list", namespace=rv.ns)
    assert f"Halt {rv.ns}/typo: MatchesNoTool=True (NoToolInReach): scope.tool 'paymnets.*'" in listed.stdout
    # a manifest that names such a tool clears the condition (the ToolManifest change re-checks)
    body = rv.get("toolmanifests", "payments")
    body["spec"]["tools"].append({"name": "paymnets.typo", "effect": "read"})
    rv.custom.replace_namespaced_custom_object(G, V, rv.ns, "toolmanifests", "payments", body)
    wait_for(lambda: condition("typo")["status"] == "False", what="MatchesNoTool=False after the manifest change")
    assert "paymnets.typo" in condition("typo")["message"]
    ready = wait_for(lambda: next((x for x in rv.get("halts", "typo")["status"]["conditions"]
                                   if x["type"] == "Ready" and x["status"] == "True"), None), what="the halt Ready")
    assert ready["reason"] == "HaltInEffect"


def test_a_typod_namespace_is_reported_as_missing_by_every_command(rv, cluster):
    typo = f"nosuch-{uuid.uuid4().hex[:5]}"
    expected = f"namespace {typo} not found"
    for args in (["plan", "my-run"], ["describe", "run/my-run"], ["describe", "run", "my-run"],
                 ["describe", "undo-1"], ["halt", "add", "h", "--reason", "r", "--tool", "payments.*"],
                 ["halt", "list"], ["rollback", "my-run"]):
        line = one_line_error(kr(cluster, *args, namespace=typo))
        assert expected in line and "CRDs" not in line, (args, line)


def test_describe_run_name_works_like_run_slash_name(rv, cluster):
    rv.apply_manifest()
    rv.run("r", [rv.step(0, "payments.get_customer", {"id": "cus_9"}, {"id": "cus_9"})])
    rv.request("undo", "r")
    rv.wait_phase("undo", "Succeeded")
    spaced, slashed = kr(cluster, "describe", "run", "r", namespace=rv.ns), kr(cluster, "describe", "run/r",
                                                                               namespace=rv.ns)
    assert spaced.returncode == 0 and slashed.returncode == 0
    ages = re.compile(r"\b\d+[smhd]\b")  # the Events' ages may tick between the two calls (and widen their column)
    assert re.sub(r" +", " ", ages.sub("", spaced.stdout)) == re.sub(r" +", " ", ages.sub("", slashed.stdout))


def test_a_request_created_before_its_run_waits_and_completes_once_the_run_exists(rv):
    rv.apply_manifest()
    order = f"o-{uuid.uuid4().hex[:6]}"
    rv.request("undo", "later")  # a GitOps apply of both files may create the request first
    req = rv.wait_phase("undo", "Pending", timeout=30)
    cond = wait_for(lambda: next((c for c in (rv.get("rollbackrequests", "undo").get("status") or {}).get(
        "conditions") or [] if c.get("reason") == "RunNotFound"), None), what="RunNotFound condition")
    assert cond["type"] == "Planned" and cond["status"] == "False"
    assert f"Run {rv.ns}/later not found; waiting for it to be created" in cond["message"]
    charge = rv.charge(order)
    rv.run("later", [rv.step(0, "payments.create_charge", {"order_id": order, "amount": 700, "customer": "cus_9"},
                             charge)])
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", "Failed", timeout=90)
    assert req["status"]["phase"] == "Succeeded", req["status"]
    assert req["status"]["report"]["compensated"] == [0], req["status"]
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
