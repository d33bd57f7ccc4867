"""Halts, identity, resolutions and approvals, enforced at admission (rules 7–10).

Each test acts as distinct users with distinct permissions: client certificates minted by the
local control plane's CA, so the API server — not the client — says who is calling.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from reversi.adapters.journal import step_body
from reversi_devcluster import build
from reversi.models.runstep import LABEL_FORWARD_KEY, LABEL_RUN, step_name
from reversi.rbac import RECORD
from reversi.sdk import DuplicateCall, Halted, NotPermitted, NotYourRun, Recorder, RecordingRefused
from tests.helpers import users_with_roles, wait_for, wait_for_role

pytestmark = pytest.mark.cluster
G, V = "reversi.dev", "v1alpha1"

# as the chart's edit role: RunSteps are recorded and settled, never deleted (they go with their Run)
AGENT_RULES = [
    {"apiGroups": [G], "resources": ["runs"], "verbs": ["get", "list", "watch", "create", "update", "patch"]},
    {"apiGroups": [G], "resources": ["runsteps"], "verbs": ["get", "list", "watch", "create", "update", "patch"]},
    {"apiGroups": [G], "resources": ["toolmanifests"], "verbs": ["get", "list", "watch"]},
    # a keyed call claims its idempotency key (a Lease), as the chart's edit role allows
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "get", "patch", "delete"]},
]
ONCALL_RULES = [
    {"apiGroups": [G], "resources": ["runs", "runsteps"], "verbs": ["get", "list", "watch", "update", "patch"]},
    {"apiGroups": [G], "resources": ["rollbackrequests"],
     "verbs": ["get", "list", "watch", "create", "update", "patch"]},
]
APPROVER_RULES = ONCALL_RULES + [{"apiGroups": [G], "resources": ["rollbackrequests"], "verbs": ["approve"]}]


@pytest.fixture
def users(cluster, admin_api, namespace):
    """Users with Roles in the test namespace: agent-a and agent-b (record runs), oncall (requests,
    resolutions; no approve) and approver (oncall + verb approve). Returns ``{name: ApiClient}``."""
    return users_with_roles(cluster, admin_api, namespace, {
        "agent-a": AGENT_RULES, "agent-b": AGENT_RULES, "oncall": ONCALL_RULES, "approver": APPROVER_RULES})


def _custom(api):
    return client.CustomObjectsApi(api)


def _halt(admin_api, namespace, name, reason, scope=None, *, in_force=False):
    """Create the Halt; with ``in_force``, return once its InForce condition is True (the API
    server refused the operator's dry run of a call it matches), as ``kubectl reversi halt add
    --wait`` does: a halt is in force within the API server's informer lag
    (docs/concepts.md#the-recorded-calls-contract-rule-by-rule), so a test that judges which calls
    it refuses waits for it first."""
    body = {"apiVersion": f"{G}/{V}", "kind": "Halt", "metadata": {"name": name},
            "spec": {"reason": reason, "by": "oncall", **({"scope": scope} if scope is not None else {})}}
    _custom(admin_api).create_namespaced_custom_object(G, V, namespace, "halts", body)
    if in_force:
        wait_for(lambda: next((c for c in (_custom(admin_api).get_namespaced_custom_object(
            G, V, namespace, "halts", name).get("status") or {}).get("conditions", [])
            if c["type"] == "InForce" and c["status"] == "True"), None), timeout=30,
            what=f"Halt {name} in force")


def _cluster_halt(admin_api, name, reason, scope=None):
    body = {"apiVersion": f"{G}/{V}", "kind": "ClusterHalt", "metadata": {"name": name},
            "spec": {"reason": reason, **({"scope": scope} if scope is not None else {})}}
    _custom(admin_api).create_cluster_custom_object(G, V, "clusterhalts", body)


def _lift_cluster_halt(admin_api, name):
    try:
        _custom(admin_api).delete_cluster_custom_object(G, V, "clusterhalts", name)
    except ApiException:
        pass


def _recorder(api, namespace, run, scope=None):
    return Recorder.open(namespace, run, manifest="payments", api=api,
                         scope=scope or {"actor": "checkout-agent", "tenant": "acme", "environment": "prod"})


def _halted(rec, tool="payments.get_customer", seconds=5.0):
    """Record calls of ``tool`` (never made) until one is refused by a halt; returns the refusal.
    A halt is in force within the API server's informer lag (docs/concepts.md#admission)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            rec.begin(tool, {"id": "cus_9"})
        except Halted as err:
            return err
        assert time.monotonic() < deadline, f"no halt refused {tool} within {seconds} s"


def _call(rec, tool="payments.get_customer"):
    """Record one call through the SDK; return whether the call itself was made."""
    made = []
    rec.call(tool, {"id": "cus_9"}, lambda a: made.append(a) or {"id": "cus_9"})
    return bool(made)


def _call_unless_halted(rec):
    """:func:`_call`, or False when a halt still refuses it."""
    try:
        return _call(rec)
    except Halted:
        return False


# ------------------------------------------------------------------ an agent's least rights

def test_an_agent_with_only_the_record_rights_records_and_may_not_roll_back(rv, cluster, admin_api, namespace):
    """The least rights of an agent (reversi.rbac.RECORD, the chart's <fullname>-record;
    docs/operations.md#an-agents-rights) open a run and record a keyed call (its claim is a
    Lease) and a plain one through the SDK. They list nothing and delete nothing, and the SDK's
    refusal of the agent's own rollback says whose it is."""
    rv.apply_manifest()
    least = users_with_roles(cluster, admin_api, namespace, {"least-agent": [dict(r) for r in RECORD]})["least-agent"]
    rec = _recorder(least, namespace, "least")
    rec.call("payments.create_charge", {"order_id": "o-least", "amount": 1, "customer": "c"}, lambda a: {"id": "ch"})
    assert _call(rec) is True
    steps = rv.custom.list_namespaced_custom_object(G, V, namespace, "runsteps", label_selector=f"{LABEL_RUN}=least")
    assert [(s["spec"]["tool"], s["spec"]["outcome"]) for s in steps["items"]] == [
        ("payments.create_charge", "succeeded"), ("payments.get_customer", "succeeded")]
    with pytest.raises(NotPermitted) as err:
        rec.rollback("the agent failed")
    assert "<fullname>-recover" in str(err.value) and "kubectl reversi rollback" in str(err.value)
    for attempt in (lambda: _custom(least).list_namespaced_custom_object(G, V, namespace, "runsteps"),
                    lambda: _custom(least).delete_namespaced_custom_object(G, V, namespace, "runs", "least")):
        with pytest.raises(ApiException) as refused:
            attempt()
        assert refused.value.status == 403


# ------------------------------------------------------------------------------ rule 9: halts

# The glob semantics of each field are a property of the translation the policy evaluates
# (tests/unit/test_recording_policy_expressions.py, docs/concepts.md#glob-semantics-of-halt-scopes);
# on the cluster: the policy reads every field of the scope, and a call must match each one named.
@pytest.mark.parametrize("scope, matches", [
    (None, True),                                           # no scope halts everything
    ({"tool": "payments.get_?ustomer", "actor": "checkout-*", "tenant": "ac*", "environment": "prod"}, True),
    ({"tool": "payments.*", "actor": "checkout-agent", "environment": "staging"}, False),  # every field must match
])
def test_rule9_halt_scope_matching(rv, users, admin_api, namespace, scope, matches):
    rv.apply_manifest()
    rec = _recorder(users["agent-a"], namespace, "r")
    _halt(admin_api, namespace, "stop", "investigating duplicate charges", scope, in_force=True)
    if matches:
        with pytest.raises(Halted) as err:
            _call(rec)
        assert "kill switch: investigating duplicate charges" in str(err.value)
    else:
        assert _call(rec) is True


def test_rule9_halted_sdk_call_raises_before_the_call_is_made(rv, users, admin_api, namespace):
    rv.apply_manifest()
    rec = _recorder(users["agent-a"], namespace, "r")
    assert _call(rec) is True
    _halt(admin_api, namespace, "stop", "charges look duplicated", {"tool": "payments.*"})
    made = []
    with pytest.raises(Halted) as err:
        rec.call("payments.create_charge", {"order_id": "o-h", "amount": 1, "customer": "c"},
                 lambda a: made.append(a) or rv.charge("o-h"))
    assert made == [], "the call must not be made"
    assert "kill switch: charges look duplicated" in str(err.value)
    assert [s["spec"]["index"] for s in rv.steps("r")] == [0], "nothing is recorded for the refused call"
    # the API server's halts policy refused it (no webhook: the Halt's refusedCalls counts only the
    # webhook's refusals); the operator reports the halt in force when it gets to it
    halt = wait_for(lambda: (h := rv.get("halts", "stop")).get("status", {}).get("active") and h,
                    what="the halt reported in force")
    assert halt["status"]["active"] is True and halt["status"]["since"]
    # lifting the halt is deleting it: the policies see the delete within the API server's informer
    # lag, as they see a create; until then a call is refused and not made, and nothing is recorded
    rv.custom.delete_namespaced_custom_object(G, V, namespace, "halts", "stop")
    assert wait_for(lambda: _call_unless_halted(rec), what="the call admitted once the halt is deleted")
    assert [s["spec"]["index"] for s in rv.steps("r")] == [0, 1]


def test_rule9_creating_a_run_whose_first_steps_match_a_halt_is_refused(rv, users, admin_api, namespace):
    rv.apply_manifest()
    _halt(admin_api, namespace, "stop", "maintenance window", {"tool": "payments.create_charge"}, in_force=True)
    body = {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": "r"},
            "spec": {"scope": {"actor": "a"}, "manifestRef": {"name": "payments"}, "steps": [
                {"index": 0, "tool": "payments.create_charge", "args": {"order_id": "o", "amount": 1, "customer": "c"},
                 "outcome": "intended"}]}}
    with pytest.raises(ApiException) as err:
        _custom(users["agent-a"]).create_namespaced_custom_object(G, V, namespace, "runs", body)
    assert err.value.status == 403 and "kill switch: maintenance window" in err.value.body


def test_rule9_recording_a_runstep_that_matches_a_halt_is_refused(rv, users, admin_api, namespace):
    rv.apply_manifest()
    _recorder(users["agent-a"], namespace, "r")
    _halt(admin_api, namespace, "stop", "maintenance window", {"tool": "payments.create_charge"}, in_force=True)
    step = {"index": 0, "tool": "payments.create_charge", "args": {"order_id": "o", "amount": 1, "customer": "c"},
            "outcome": "intended"}
    with pytest.raises(ApiException) as err:
        _custom(users["agent-a"]).create_namespaced_custom_object(G, V, namespace, "runsteps",
                                                                  step_body(namespace, "r", step))
    assert err.value.status == 403 and "kill switch: maintenance window" in _message(err.value)
    assert rv.steps("r") == [], "nothing is recorded for the refused call"


def test_rule9_cluster_halt_across_namespaces(rv, users, admin_api, namespace):
    rv.apply_manifest()
    rec = _recorder(users["agent-a"], namespace, "r")
    _cluster_halt(admin_api, f"other-ns-{namespace}", "not this namespace", {"namespace": "elsewhere-*"})
    _cluster_halt(admin_api, f"this-ns-{namespace}", "whole fleet paused", {"namespace": namespace[:6] + "*"})
    try:
        err = _halted(rec)  # in force within the API server's informer lag
        assert "kill switch: whole fleet paused" in str(err)
        _lift_cluster_halt(admin_api, f"this-ns-{namespace}")
        # the other ClusterHalt names other namespaces only: once the policy has seen the deletion
        # (its informer lag, as for a create), the call is admitted and made
        assert wait_for(lambda: _call_unless_halted(rec), what="the call admitted once the ClusterHalt is deleted")
    finally:
        _lift_cluster_halt(admin_api, f"other-ns-{namespace}")
        _lift_cluster_halt(admin_api, f"this-ns-{namespace}")


def test_rule9_rollback_finishes_while_a_total_halt_is_active(rv, admin_api):
    rv.apply_manifest()
    charge = rv.charge("o-total")
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-total", "amount": 700, "customer": "cus_9"},
                         charge)])
    name = f"total-{rv.ns}"
    _cluster_halt(admin_api, name, "total stop")
    try:
        rv.request("undo", "r")
        # at that moment the halt is in force: a new step of another run is refused before the call
        # (a new step of the run being rolled back is refused anyway: the rollback closed it)
        rec = Recorder.open(rv.ns, "r2", manifest="payments", api=admin_api, scope={"actor": "test-agent"})
        called = []
        with pytest.raises(Halted, match="kill switch: total stop"):
            rec.call("payments.create_charge", {"order_id": "o-total-2", "amount": 700, "customer": "cus_9"},
                     lambda a: called.append(rv.charge(a["order_id"])))
        assert not called and not [ch for ch in rv.downstream.state()["charges"].values()
                                   if ch["order_id"] == "o-total-2"], "the downstream never saw the call"
        assert rv.steps("r2") == [] and [s["spec"]["index"] for s in rv.steps("r")] == [0], \
            "the refused step was not recorded"
        req = rv.wait_phase("undo", "Succeeded", "Incomplete")
        assert req["status"]["phase"] == "Succeeded"
        assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
        assert _custom(admin_api).get_cluster_custom_object(G, V, "clusterhalts", name), "the halt stayed in force"
    finally:
        _lift_cluster_halt(admin_api, name)


def test_rule9_halt_applied_from_a_folder_gitops(rv, users, cluster, namespace, tmp_path):
    rv.apply_manifest()
    rec = _recorder(users["agent-a"], namespace, "r")
    folder = tmp_path / "halts"
    folder.mkdir()
    (folder / "payments-halt.yaml").write_text(
        "apiVersion: reversi.dev/v1alpha1\nkind: Halt\nmetadata:\n  name: payments-freeze\n"
        f"  namespace: {namespace}\nspec:\n  reason: quarter-end freeze\n  by: finance\n"
        "  scope:\n    tool: \"payments.*\"\n")
    kubectl = [str(build.binary("kubernetes", "kubectl")), "--kubeconfig", str(cluster.paths.admin_kubeconfig)]
    subprocess.run(kubectl + ["apply", "-f", str(folder)], check=True, capture_output=True)
    assert "quarter-end freeze" in str(_halted(rec))  # in force within the API server's informer lag
    subprocess.run(kubectl + ["delete", "-f", str(folder)], check=True, capture_output=True)  # git revert
    assert wait_for(lambda: _call_unless_halted(rec), what="the call admitted once the halt is deleted")


# --------------------------------------------------------------------- rule 10: identity

def test_rule10_principal_is_stamped_from_the_authenticated_user(rv, users, namespace):
    rv.apply_manifest()
    body = {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": "r"},
            "spec": {"principal": "mallory", "manifestRef": {"name": "payments"}, "steps": []}}
    created = _custom(users["agent-a"]).create_namespaced_custom_object(G, V, namespace, "runs", body)
    assert created["spec"]["principal"] == "agent-a"


def test_rule10_another_principal_may_not_add_steps(rv, users, namespace):
    rv.apply_manifest()
    rec_a = _recorder(users["agent-a"], namespace, "r")
    _call(rec_a)
    rec_b = Recorder.attach(namespace, "r", api=users["agent-b"])
    with pytest.raises(NotYourRun) as err:
        _call(rec_b)
    assert "belongs to another principal (agent-a)" in str(err.value)
    assert len(rv.steps("r")) == 1, "nothing is recorded for the refused call"
    # nor may another principal record the outcome of a step the principal began
    began = rec_a.begin("payments.get_customer", {"id": "cus_9"})
    with pytest.raises(ApiException) as err:
        _jpatch(users["agent-b"], namespace, "runsteps", step_name("r", began.index),
                [{"op": "replace", "path": "/spec/outcome", "value": "failed"}])
    assert err.value.status == 403 and "belongs to another principal (agent-a)" in _message(err.value)
    rec_a.finish(began, "succeeded", {"id": "cus_9"})
    assert _call(rec_a) is True
    assert [s["spec"]["outcome"] for s in rv.steps("r")] == ["succeeded"] * 3


def test_rule10_mode_and_scope_never_change(rv, users, namespace):
    rv.apply_manifest()
    _recorder(users["agent-a"], namespace, "r")
    c = _custom(users["agent-a"])
    with pytest.raises(ApiException) as err:
        c.patch_namespaced_custom_object(G, V, namespace, "runs", "r", {"spec": {"mode": "observe"}})
    assert err.value.status == 422 and "spec.mode is immutable" in err.value.body
    with pytest.raises(ApiException) as err:
        c.patch_namespaced_custom_object(G, V, namespace, "runs", "r", {"spec": {"scope": {"tenant": "globex"}}})
    assert err.value.status == 422 and "spec.scope is immutable" in err.value.body


# ------------------------------------------------------------------- rule 7: resolutions

def _uncertain_run(rv, users, namespace):
    rec = _recorder(users["agent-a"], namespace, "r")
    charge = rv.charge("o-unc")
    with pytest.raises(TimeoutError):
        with rec.step("payments.create_charge", {"order_id": "o-unc", "amount": 700, "customer": "cus_9"}):
            raise TimeoutError("the payments API did not answer in 10s")
    return charge


def _resolve(api, namespace, resolution):
    """Settle a step of run r: merge-patch its RunStep's spec.resolution (as the plugin does)."""
    res = {k: v for k, v in resolution.items() if k != "step"}
    return _custom(api).patch_namespaced_custom_object(G, V, namespace, "runsteps", step_name("r", resolution["step"]),
                                                       {"spec": {"resolution": res}})


def _message(err: ApiException) -> str:
    return json.loads(err.body)["message"]


def test_rule7_resolution_without_a_note_is_refused(rv, users, namespace):
    rv.apply_manifest()
    _uncertain_run(rv, users, namespace)
    with pytest.raises(ApiException) as err:
        _resolve(users["oncall"], namespace, {"step": 0, "status": "succeeded"})
    assert err.value.status == 422 and "note" in err.value.body
    with pytest.raises(ApiException) as err:
        _resolve(users["oncall"], namespace, {"step": 0, "status": "succeeded", "note": "   "})
    assert err.value.status == 422 and "a note is required" in _message(err.value)
    assert "resolution" not in rv.steps("r")[0]["spec"]


def test_rule7_only_intended_or_uncertain_steps_can_be_resolved(rv, users, namespace):
    rv.apply_manifest()
    rec = _recorder(users["agent-a"], namespace, "r")
    _call(rec)
    with pytest.raises(ApiException) as err:
        _resolve(users["oncall"], namespace, {"step": 0, "status": "failed", "note": "n"})
    assert "only a step whose outcome is intended or uncertain can be resolved" in _message(err.value)
    assert "resolution" not in rv.steps("r")[0]["spec"]


# A resolved uncertain step undone with the given result, its actor stamped from the
# authenticated user: tests/integration/test_rollback_rules.py (the same rule, the same checks).


# --------------------------------------------------------------------- rule 8: approvals

def test_rule8_approval_needs_the_approve_permission_and_records_the_approver(rv, users, namespace):
    rv.apply_manifest(capture_needs_approval=True)
    charge = rv.charge("o-appr")
    capture = rv.capture(charge["id"])
    rv.run("r",
           [rv.step(0, "payments.create_charge", {"order_id": "o-appr", "amount": 700, "customer": "cus_9"}, charge),
                 rv.step(1, "payments.capture", {"charge_id": charge["id"]}, capture)])
    oncall, approver = _custom(users["oncall"]), _custom(users["approver"])
    # approving all at creation needs the permission too
    with pytest.raises(ApiException) as err:
        oncall.create_namespaced_custom_object(G, V, namespace, "rollbackrequests", {
            "apiVersion": f"{G}/{V}", "kind": "RollbackRequest", "metadata": {"name": "undo-all"},
            "spec": {"runRef": {"name": "r"}, "approveCompensations": True}})
    assert err.value.status == 403 and 'needs the RBAC verb "approve"' in _message(err.value)
    oncall.create_namespaced_custom_object(G, V, namespace, "rollbackrequests", {
        "apiVersion": f"{G}/{V}", "kind": "RollbackRequest", "metadata": {"name": "undo"},
        "spec": {"runRef": {"name": "r"}}})
    req = rv.wait_phase("undo", "AwaitingApproval")
    assert req["status"]["report"]["awaitingApproval"] == [1]
    approve = {"spec": {"approvals": [{"step": 1}]}}
    with pytest.raises(ApiException) as err:
        oncall.patch_namespaced_custom_object(G, V, namespace, "rollbackrequests", "undo", approve)
    assert err.value.status == 403 and "oncall may not approve step(s) [1]" in _message(err.value)
    approver.patch_namespaced_custom_object(G, V, namespace, "rollbackrequests", "undo", approve)
    req = rv.wait_phase("undo", "Succeeded", "Incomplete")
    assert req["status"]["phase"] == "Succeeded"
    approved = next(c for c in rv.step_status(req, 1)["conditions"] if c["type"] == "Approved")
    assert approved["reason"] == "ApprovedByUser" and approved["message"] == "approved by approver"
    assert rv.downstream.get(f"/payments/captures/{capture['id']}")["status"] == "voided"


# ------------------------------------------------------------------- forward duplicates

def test_forward_duplicate_is_refused_naming_the_earlier_step(rv, users, namespace):
    rv.apply_manifest()
    rec = _recorder(users["agent-a"], namespace, "r")
    rec.call("payments.create_charge", {"order_id": "o-dup", "amount": 700, "customer": "cus_9"},
             lambda a: rv.charge("o-dup"))
    made = []
    with pytest.raises(DuplicateCall) as err:
        rec.call("payments.create_charge", {"order_id": "o-dup", "amount": 700, "customer": "cus_9"},
                 lambda a: made.append(a))
    assert made == []
    assert "like step 0, which still stands" in str(err.value) and "'o-dup'" in str(err.value)
    rec.call("payments.create_charge", {"order_id": "o-other", "amount": 700, "customer": "cus_9"},
             lambda a: rv.charge("o-other"))


# ------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("plural, body, expected", [
    ("runs", {"spec": {"manifestRef": {"name": "payments"},
                       "steps": [{"index": 0, "tool": "t", "args": {}, "outcome": "maybe"}]}},
     "outcome"),
    ("runs", {"spec": {"steps": []}}, "manifestRef"),
    ("runs", {"spec": {"manifestRef": {"name": "payments"}, "steps": "not a list"}}, "steps"),
    ("runs", {"spec": {"manifestRef": {"name": "payments"}, "scope": {"actor": "x" * 5000}}}, "actor"),
    ("rollbackrequests", {"spec": {}}, "runRef"),
    ("rollbackrequests", {"spec": {"runRef": {"name": "r"}, "retries": 99}}, "retries"),
    ("rollbackrequests", {"spec": {"runRef": {"name": "r"}, "parallelism": "many"}}, "parallelism"),
    ("toolmanifests", {"spec": {"tools": [{"name": "w", "effect": "write"}]}}, "compensation"),
    ("toolmanifests", {"spec": {"tools": [{"name": "w", "effect": "write", "compensation": {
        "tool": "u", "kind": "inverse", "args": {}, "runner": "nowhere"}}]}}, "must name a runner in spec.runners"),
    ("halts", {"spec": {"scope": {"tool": "x"}}}, "reason"),
    ("halts", {"spec": {"reason": "r", "scope": {"color": "red"}}}, "color"),
    ("runsteps", {"spec": {"runRef": {"name": "r"}, "index": 0, "tool": "t", "args": {}, "outcome": "maybe"}},
     "outcome"),
    ("runsteps", {"spec": {"index": 0, "tool": "t", "args": {}, "outcome": "intended"}}, "runRef"),
    ("runsteps", {"spec": {"runRef": {"name": "r"}, "index": 0, "tool": "t", "args": {}, "outcome": "intended",
                           "colour": "red"}}, "colour"),
])
def test_bad_input_is_refused_with_a_message_and_the_operator_keeps_serving(rv, users, namespace, plural, body,
                                                                            expected):
    rv.apply_manifest()
    kind = {"runs": "Run", "rollbackrequests": "RollbackRequest", "toolmanifests": "ToolManifest", "halts": "Halt",
            "runsteps": "RunStep"}[plural]
    obj = {"apiVersion": f"{G}/{V}", "kind": kind, "metadata": {"name": "bad"}, **body}
    with pytest.raises(ApiException) as err:
        # kubectl's default: unknown fields are an error, not silently pruned
        rv.custom.create_namespaced_custom_object(G, V, namespace, plural, obj, field_validation="Strict")
    assert err.value.status in (400, 403, 422)
    message = json.loads(err.value.body)["message"]
    assert expected in message, message
    # the operator keeps serving: a good write goes through its webhooks
    rec = _recorder(users["agent-a"], namespace, "after-bad-input")
    assert _call(rec) is True


def test_unknown_tool_in_enforce_mode_is_refused(rv, users, namespace):
    rv.apply_manifest()
    rec = _recorder(users["agent-a"], namespace, "r")
    with pytest.raises(RecordingRefused) as err:
        rec.call("crm.delete_contact", {"id": 1}, lambda a: None)
    assert "has no entry in ToolManifest" in str(err.value)
    # the server refuses it too, whatever the client checked
    step = {"index": 0, "tool": "crm.delete_contact", "args": {"id": 1}, "outcome": "intended"}
    with pytest.raises(ApiException) as err:
        _custom(users["agent-a"]).create_namespaced_custom_object(G, V, namespace, "runsteps",
                                                                  step_body(namespace, "r", step))
    assert err.value.status == 422 and "has no entry in ToolManifest" in _message(err.value)
    assert rv.steps("r") == []


def test_snapshot_is_stamped_from_the_manifest_not_the_client(rv, users, namespace):
    rv.apply_manifest()
    run = _recorder(users["agent-a"], namespace, "r")._load()
    lie = {"name": "payments.create_charge", "effect": "read"}  # a client claiming nothing needs undoing
    step = {"index": 0, "tool": "payments.create_charge", "args": {"order_id": "o", "amount": 1, "customer": "c"},
            "outcome": "intended", "snapshot": lie, "recordedAt": "2001-01-01T00:00:00Z"}
    body = step_body(namespace, "r", step)
    body["metadata"]["labels"][LABEL_FORWARD_KEY] = "forged"
    created = _custom(users["agent-a"]).create_namespaced_custom_object(G, V, namespace, "runsteps", body)
    snap = created["spec"]["snapshot"]
    assert snap["effect"] == "write" and snap["compensation"]["tool"] == "payments.refund"
    assert created["spec"]["recordedAt"] and not created["spec"]["recordedAt"].startswith("2001")
    # the server also stamps the owner (the Run: steps go with it) and the labels that find the step
    meta = created["metadata"]
    assert [(o["kind"], o["name"], o["uid"]) for o in meta["ownerReferences"]] == [("Run", "r", run["metadata"]["uid"])]
    assert meta["labels"][LABEL_RUN] == "r" and len(meta["labels"][LABEL_FORWARD_KEY]) == 40


# ------------------------------------------------------------------- the record never changes

def _jpatch(api, namespace, plural, name, ops):
    return _custom(api).patch_namespaced_custom_object(G, V, namespace, plural, name, ops,
                                                       _content_type="application/json-patch+json")


def test_a_resolution_cannot_be_swapped_out_and_back_in(rv, users, namespace):
    rv.apply_manifest()
    _uncertain_run(rv, users, namespace)
    _resolve(users["oncall"], namespace, {"step": 0, "status": "succeeded", "result": {"id": "ch_x"}, "note": "seen"})
    with pytest.raises(ApiException) as err:
        _jpatch(users["oncall"], namespace, "runsteps", step_name("r", 0),
                [{"op": "replace", "path": "/spec/resolution", "value": {"status": "failed", "note": "no"}}])
    assert "never changes" in _message(err.value) or "cannot be changed" in _message(err.value)
    with pytest.raises(ApiException) as err:
        _jpatch(users["oncall"], namespace, "runsteps", step_name("r", 0),
                [{"op": "remove", "path": "/spec/resolution"}])
    assert "never changes" in _message(err.value) or "cannot be changed" in _message(err.value)
    resolution = rv.steps("r")[0]["spec"]["resolution"]
    assert resolution["status"] == "succeeded" and resolution["note"] == "seen" and resolution["actor"] == "oncall"


def test_shared_snapshots_cannot_be_replaced(rv, users, namespace):
    rv.apply_manifest()
    from reversi.engine.keys import snapshot_id
    from reversi.models.toolmanifest import ToolSpec

    entry = ToolSpec.model_validate(rv.snapshot("payments.create_charge"))
    sid = snapshot_id(entry)
    charge = rv.charge("o-snap")
    body = {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": "r"},
            "spec": {"manifestRef": {"name": "payments"}, "snapshots": [{"id": sid, **entry.to_wire()}],
                     "steps": [{"index": 0, "tool": "payments.create_charge", "snapshotId": sid, "outcome": "succeeded",
                                "args": {"order_id": "o-snap", "amount": 700, "customer": "cus_9"}, "result": charge}]}}
    _custom(users["agent-a"]).create_namespaced_custom_object(G, V, namespace, "runs", body)
    # the operator moves the inline step (and the shared snapshot it names) into a RunStep
    step = wait_for(lambda: (rv.get("runs", "r").get("status") or {}).get("movedSteps") == 1 and rv.steps("r"),
                    what="the inline step moved into a RunStep")[0]
    assert step["spec"]["snapshot"] == entry.to_wire()
    forged = {"id": sid, "name": "payments.create_charge", "effect": "idempotent"}
    for user in ("agent-b", "agent-a"):  # not even the principal may rewrite the record
        with pytest.raises(ApiException) as err:
            _jpatch(users[user], namespace, "runsteps", step_name("r", 0),
                    [{"op": "replace", "path": "/spec/snapshot",
                      "value": {k: v for k, v in forged.items() if k != "id"}}])
        assert err.value.status in (403, 422)
        with pytest.raises(ApiException) as err:  # nor replace the shared snapshot the Run recorded
            _jpatch(users[user], namespace, "runs", "r",
                    [{"op": "replace", "path": "/spec/snapshots/0", "value": forged}])
        assert err.value.status in (403, 422)
    assert rv.steps("r")[0]["spec"]["snapshot"] == entry.to_wire()
    assert rv.get("runs", "r")["spec"]["snapshots"] == body["spec"]["snapshots"], "the inline record never changes"


def test_steps_out_of_order_are_refused_at_admission(rv, users, namespace):
    rv.apply_manifest()
    body = {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": "r"},
            "spec": {"manifestRef": {"name": "payments"}, "steps": [
                {"index": 1, "tool": "payments.get_customer", "args": {}, "outcome": "succeeded"},
                {"index": 0, "tool": "payments.get_customer", "args": {}, "outcome": "succeeded"}]}}
    with pytest.raises(ApiException) as err:
        _custom(users["agent-a"]).create_namespaced_custom_object(G, V, namespace, "runs", body)
    assert "out of order" in _message(err.value)
    # as RunSteps: a step is recorded only after the one before it
    _recorder(users["agent-a"], namespace, "r")
    step = {"index": 1, "tool": "payments.get_customer", "args": {}, "outcome": "succeeded"}
    with pytest.raises(ApiException) as err:
        _custom(users["agent-a"]).create_namespaced_custom_object(G, V, namespace, "runsteps",
                                                                  step_body(namespace, "r", step))
    assert "step 0 of Run" in _message(err.value) and "record the previous step first" in _message(err.value)
    misnamed = step_body(namespace, "r", {**step, "index": 0})
    misnamed["metadata"]["name"] = "r-0"
    with pytest.raises(ApiException) as err:
        _custom(users["agent-a"]).create_namespaced_custom_object(G, V, namespace, "runsteps", misnamed)
    assert "must be named r-00000" in _message(err.value)
    assert rv.steps("r") == []


def test_a_forged_approved_by_is_dropped(rv, users, namespace):
    rv.apply_manifest()
    rv.run("r", [rv.step(0, "payments.get_customer", {"id": "cus_9"}, {"id": "cus_9"})])
    created = _custom(users["oncall"]).create_namespaced_custom_object(G, V, namespace, "rollbackrequests", {
        "apiVersion": f"{G}/{V}", "kind": "RollbackRequest", "metadata": {"name": "undo"},
        "spec": {"runRef": {"name": "r"}, "approvedBy": "the-cfo", "dryRun": True}})
    assert "approvedBy" not in created["spec"]


def test_an_approval_must_name_a_step_that_needs_one(rv, users, namespace):
    rv.apply_manifest(capture_needs_approval=True)
    charge = rv.charge("o-appr2")
    rv.run("r",
           [rv.step(0, "payments.create_charge", {"order_id": "o-appr2", "amount": 700, "customer": "cus_9"}, charge)])
    for step, expected in ((0, "does not require approval"), (7, "no such step")):
        with pytest.raises(ApiException) as err:
            _custom(users["approver"]).create_namespaced_custom_object(G, V, namespace, "rollbackrequests", {
                "apiVersion": f"{G}/{V}", "kind": "RollbackRequest", "metadata": {"name": f"undo-{step}"},
                "spec": {"runRef": {"name": "r"}, "approvals": [{"step": step}]}})
        assert expected in _message(err.value)


def test_client_side_apply_that_adds_an_approval_keeps_the_first_approver(rv, cluster, namespace, tmp_path):
    rv.apply_manifest(capture_needs_approval=True)
    charge = rv.charge("o-apply")
    capture = rv.capture(charge["id"])
    second = rv.charge("o-apply-2")
    cap2 = rv.capture(second["id"])
    rv.run("r", [rv.step(0, "payments.capture", {"charge_id": charge["id"]}, capture),
                 rv.step(1, "payments.capture", {"charge_id": second["id"]}, cap2)])
    kubectl = [str(build.binary("kubernetes", "kubectl")), "--kubeconfig", str(cluster.paths.admin_kubeconfig),
               "-n", namespace]
    doc = ("apiVersion: reversi.dev/v1alpha1\nkind: RollbackRequest\nmetadata:\n  name: undo\n"
           "spec:\n  runRef: {name: r}\n  dryRun: true\n  approvals:\n")
    path = tmp_path / "rbr.yaml"
    path.write_text(doc + "  - {step: 1}\n")
    subprocess.run(kubectl + ["apply", "-f", str(path)], check=True, capture_output=True)
    first = rv.get("rollbackrequests", "undo")["spec"]["approvals"][0]
    path.write_text(doc + "  - {step: 1}\n  - {step: 0}\n")
    out = subprocess.run(kubectl + ["apply", "-f", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    approvals = {a["step"]: a for a in rv.get("rollbackrequests", "undo")["spec"]["approvals"]}
    assert approvals[1]["approver"] == first["approver"] and approvals[1]["approvedAt"] == first["approvedAt"]
    assert approvals[0]["approver"] == "reversi-admin"


# ------------------------------------------------------------ manifests: what a runner may do

def test_a_manifest_template_typo_is_refused(rv, namespace):
    body = manifest_with(rv, compensation_args={"charge_id": "$reslt.id"})
    with pytest.raises(ApiException) as err:
        rv.custom.create_namespaced_custom_object(G, V, namespace, "toolmanifests", body)
    assert "'$reslt.id' looks like a reference" in _message(err.value)


def test_a_runner_cannot_use_a_secret_its_author_may_not_read(rv, users, admin_api, namespace):
    client.CoreV1Api(admin_api).create_namespaced_secret(namespace, {"metadata": {"name": "db-password"},
                                                                     "stringData": {"password": "hunter2"}})
    rbac = client.RbacAuthorizationV1Api(admin_api)
    rules = [{"apiGroups": [G], "resources": ["toolmanifests"], "verbs": ["create"]},
             {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}]
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "author"}, "rules": rules})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "author"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "author"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "agent-a"}]})
    wait_for_role(admin_api, "agent-a", namespace, rules[0])  # else the create may meet RBAC's cache first
    body = manifest_with(rv,
                         env=[{"name": "P", "valueFrom": {"secretKeyRef": {"name": "db-password", "key": "password"}}}])
    with pytest.raises(ApiException) as err:
        _custom(users["agent-a"]).create_namespaced_custom_object(G, V, namespace, "toolmanifests", body)
    assert err.value.status == 403 and "may not get secret 'db-password'" in _message(err.value)


def test_a_runner_that_would_not_make_a_valid_job_is_refused(rv, namespace):
    body = manifest_with(rv, env=[{"value": "no-name-here"}])
    with pytest.raises(ApiException) as err:
        rv.custom.create_namespaced_custom_object(G, V, namespace, "toolmanifests", body)
    assert "would not make a valid Job" in _message(err.value) and "name" in _message(err.value)


def manifest_with(rv, compensation_args=None, env=None):
    from tests.integration.conftest import manifest_body

    body = manifest_body(rv.downstream.url)
    body["metadata"]["name"] = "odd"
    if env is not None:
        body["spec"]["runners"][0]["env"] = body["spec"]["runners"][0]["env"] + env
    if compensation_args is not None:
        body["spec"]["tools"][1]["compensation"]["args"] = compensation_args
    return body


# ---------------------------------------------------------------------------- the SDK

def test_sdk_records_any_unexpected_error_as_uncertain_and_declared_ones_as_failed(rv, users, namespace):
    rv.apply_manifest()

    class Declined(Exception):
        pass

    rec = Recorder.open(namespace, "r", manifest="payments", api=users["agent-a"], failed_errors=(Declined,))
    with pytest.raises(OSError):
        rec.call("payments.get_customer", {"id": "cus_9"}, lambda a: (_ for _ in ()).throw(OSError("read timed out")))
    with pytest.raises(Declined):
        rec.call("payments.get_customer", {"id": "cus_1"}, lambda a: (_ for _ in ()).throw(Declined("card declined")))
    outcomes = [s["spec"]["outcome"] for s in rv.steps("r")]
    assert outcomes == ["uncertain", "failed"]


def test_a_misspelt_field_is_refused_whatever_the_client_field_validation(rv, namespace):
    rv.apply_manifest()
    rv.run("r", [rv.step(0, "payments.get_customer", {"id": "cus_9"}, {"id": "cus_9"})])
    body = {"apiVersion": f"{G}/{V}", "kind": "RollbackRequest", "metadata": {"name": "undo"},
            "spec": {"runRef": {"name": "r"}, "dryrun": True}}
    for validation in (None, "Ignore"):  # the server would otherwise prune the typo silently
        with pytest.raises(ApiException) as err:
            kwargs = {"field_validation": validation} if validation else {}
            rv.custom.create_namespaced_custom_object(G, V, namespace, "rollbackrequests", body, **kwargs)
        assert "spec.dryrun: unknown field: check its spelling" in _message(err.value)


# ----------------------------------------------------------------------- the sliced journal

def test_a_recorded_runstep_is_append_only(rv, users, namespace):
    """CEL on the RunStep: the call never changes, the outcome moves only from intended, even for
    the principal; only the outcome (with its result) of an intended step may be recorded."""
    rv.apply_manifest()
    rec = _recorder(users["agent-a"], namespace, "r")
    rec.call("payments.create_charge", {"order_id": "o-ao", "amount": 700, "customer": "cus_9"},
             lambda a: {"id": "ch_ao"})
    name = step_name("r", 0)
    original = rv.steps("r")[0]["spec"]
    changes = [
        ({"op": "replace", "path": "/spec/tool", "value": "payments.get_customer"}, "tool cannot change"),
        ({"op": "replace", "path": "/spec/args/amount", "value": 1}, "args cannot change"),
        # a recorded call carries no snapshot (its Run pins the manifest) and no recordedAt (the
        # creation time): neither can be added later, so nobody can change how it is undone
        ({"op": "add", "path": "/spec/snapshot", "value": {"name": "payments.create_charge", "effect": "read"}},
         "snapshot cannot change"),
        ({"op": "add", "path": "/spec/recordedAt", "value": "2001-01-01T00:00:00Z"}, "recordedAt cannot change"),
        ({"op": "add", "path": "/spec/runAtOpen/mode", "value": "observe"}, "spec.runAtOpen is immutable"),
        ({"op": "replace", "path": "/spec/outcome", "value": "failed"}, "an outcome moves only from intended"),
        ({"op": "replace", "path": "/spec/result", "value": {"id": "ch_other"}}, "result may only be set while"),
        ({"op": "add", "path": "/spec/dependsOn", "value": [0]}, "dependsOn"),
    ]
    for op, expected in changes:
        with pytest.raises(ApiException) as err:
            _jpatch(users["agent-a"], namespace, "runsteps", name, [op])
        assert err.value.status == 422 and expected in _message(err.value), (op, _message(err.value))
    assert rv.steps("r")[0]["spec"] == original


def test_adding_an_inline_step_to_a_run_is_refused(rv, users, namespace):
    """Run.spec.steps is the inline journal of Reversi 0.1: read on create, never written again."""
    rv.apply_manifest()
    rec = _recorder(users["agent-a"], namespace, "r")
    _call(rec)
    step = {"index": 0, "tool": "payments.get_customer", "args": {"id": "cus_9"}, "outcome": "succeeded"}
    message = ("spec.steps, spec.snapshots and spec.resolutions are the inline journal of Reversi 0.1 "
               "and take no changes")
    for ops in ([{"op": "add", "path": "/spec/steps", "value": [step]}],
                [{"op": "add", "path": "/spec/resolutions",
                  "value": [{"step": 0, "status": "failed", "note": "inline"}]}]):
        with pytest.raises(ApiException) as err:
            _jpatch(users["agent-a"], namespace, "runs", "r", ops)
        assert err.value.status == 422 and message in _message(err.value)
        assert "record steps as RunSteps" in _message(err.value)
    run = rv.get("runs", "r")
    assert not run["spec"].get("steps") and not run["spec"].get("resolutions")
    assert [s["spec"]["index"] for s in rv.steps("r")] == [0]
    assert _call(rec) is True  # recording as RunSteps goes on


def test_a_runstep_is_deleted_only_with_its_run(rv, namespace):
    rv.apply_manifest()
    rv.run("r", [rv.step(0, "payments.get_customer", {"id": "cus_9"}, {"id": "cus_9"})])
    with pytest.raises(ApiException) as err:  # not even the cluster admin
        rv.custom.delete_namespaced_custom_object(G, V, namespace, "runsteps", step_name("r", 0))
    assert err.value.status == 403 and "deleted with the Run" in _message(err.value)
    assert len(rv.steps("r")) == 1
    rv.custom.delete_namespaced_custom_object(G, V, namespace, "runs", "r", propagation_policy="Foreground")
    wait_for(lambda: rv.steps("r") == [], timeout=60, what="the RunSteps deleted with their Run")
