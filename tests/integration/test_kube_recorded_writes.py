"""Recording an agent's own Kubernetes writes at admission, with no code of the agent's
(docs/concepts.md#recording-with-no-agent-code), on the local control plane: a ServiceAccount that writes
with the plain client (as kubectl does) while a Run with ``spec.record`` names it. Every verdict is checked
against the live objects and the RunSteps, never against the report alone."""

from __future__ import annotations

import json
import re

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from reversi import rbac as reversi_rbac
from reversi.adapters import webhooks
from reversi.engine import kube
from tests.helpers import wait_for, wait_for_role
from tests.integration.kube_setup import bind, deployment, gone, install_family

G, V = "reversi.dev", "v1alpha1"
AGENT_SA = "agent"
#: the agent changes these objects with plain writes, and opens its own Run; nothing of Reversi's SDK
AGENT_RULES = [
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "create", "patch", "update", "delete"]},
    {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch", "update"]},
    {"apiGroups": [""], "resources": ["configmaps", "services", "secrets"],
     "verbs": ["get", "create", "patch", "update", "delete"]},
    {"apiGroups": ["reversi.dev"], "resources": ["runs"], "verbs": ["get", "create"]},
    # what the chart's reversi-record role grants an agent: it could write a step's outcome
    {"apiGroups": ["reversi.dev"], "resources": ["runsteps"], "verbs": ["get", "patch", "update"]},
]


def _token_client(admin: client.ApiClient, namespace: str, account: str) -> client.ApiClient:
    """An API client that authenticates as ServiceAccount ``namespace/account`` (a bound token)."""
    token = client.CoreV1Api(admin).create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    conf = client.Configuration()
    conf.host, conf.ssl_ca_cert = admin.configuration.host, admin.configuration.ssl_ca_cert
    conf.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(conf)


@pytest.fixture
def agent_ns(rv):
    """``rv`` with the kube family's ToolManifest ``kube``, its runner, and ``rv.agent``: an API client of
    the ServiceAccount ``agent`` (:data:`AGENT_RULES`)."""
    install_family(rv)
    client.CoreV1Api(rv.api).create_namespaced_service_account(rv.ns, {"metadata": {"name": AGENT_SA}})
    bind(rv.api, rv.ns, AGENT_SA, AGENT_RULES, {"kind": "ServiceAccount", "name": AGENT_SA, "namespace": rv.ns})
    rv.user = f"system:serviceaccount:{rv.ns}:{AGENT_SA}"
    wait_for_role(rv.api, rv.user, rv.ns, AGENT_RULES[0])
    rv.agent = _token_client(rv.api, rv.ns, AGENT_SA)
    return rv


def _open_recording_run(rv, name: str = "agent-run", as_client: client.ApiClient | None = None) -> None:
    """The agent opens a Run that records its own writes (as kubectl create -f would), and waits until the
    API server sends its writes to the recording webhook: a server-side dry run is answered with the
    warning that the run records them (kubectl prints it), and records nothing."""
    body = {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": name},
            "spec": {"manifestRef": {"name": "kube"}, "record": {"serviceAccount": AGENT_SA}}}
    client.CustomObjectsApi(as_client or rv.agent).create_namespaced_custom_object(G, V, rv.ns, "runs", body)
    wait_for(lambda: rv.user in (webhooks.recorded_now(rv.api, webhooks.RECORD_NAME) or ""), timeout=30,
             what="the operator to name the agent in the recording webhook's match condition")

    def warned() -> bool:
        answer = client.CoreV1Api(rv.agent).create_namespaced_config_map(
            rv.ns, {"metadata": {"generateName": "probe-"}}, dry_run="All", _preload_content=False)
        return f"Reversi: Run {rv.ns}/{name} records your writes" in (answer.headers.get("Warning") or "")

    wait_for(warned, timeout=30, what="the API server to send the agent's writes to the recording webhook")
    assert rv.steps(name) == []  # a dry run records nothing


def _settled(rv, run: str) -> list[dict]:
    """The run's steps once none is intended any more (the recorder settles each from what was stored)."""
    def settled() -> tuple[list[dict]] | None:
        steps = rv.steps(run)
        return (steps,) if all(s["spec"]["outcome"] != "intended" for s in steps) else None

    return wait_for(settled, timeout=30, what="every recorded write's outcome")[0]


def test_an_agents_plain_writes_are_recorded_at_admission_and_undone_against_the_live_objects(agent_ns):
    rv, ns = agent_ns, agent_ns.ns
    core, apps = client.CoreV1Api(rv.api), client.AppsV1Api(rv.api)
    apps.create_namespaced_deployment(ns, deployment(ns, 2))
    core.create_namespaced_config_map(ns, {"metadata": {"name": "settings"}, "data": {"color": "blue"}})
    before_svc = core.create_namespaced_service(ns, {
        "metadata": {"name": "front", "labels": {"tier": "front"}},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    _open_recording_run(rv)
    agent_core, agent_apps = client.CoreV1Api(rv.agent), client.AppsV1Api(rv.agent)
    agent_apps.patch_namespaced_deployment_scale("web", ns, {"spec": {"replicas": 0}})  # kubectl scale
    answer = agent_core.patch_namespaced_config_map("settings", ns, {"data": {"color": "green"}},  # kubectl patch
                                                    _preload_content=False)
    # what kubectl prints the agent: Warning: Reversi: recorded as step N (kube.patch) of Run <ns>/agent-run
    assert re.search(rf"Reversi: recorded as step \d+ \({kube.PATCH}\) of Run {ns}/agent-run",
                     answer.headers.get("Warning", ""))
    agent_core.delete_namespaced_service("front", ns)  # kubectl delete
    agent_core.create_namespaced_config_map(ns, {"metadata": {"name": "extra"}, "data": {"color": "red"}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "admins-own"}})  # another user: not recorded

    steps = _settled(rv, "agent-run")
    # a scale that loses a race with the deployment controller's status write is admitted again by the API
    # server: the losing attempt is a failed step of its own, the retry the one that landed
    # (docs/concepts.md#recording-with-no-agent-code)
    lost = [s for s in steps if s["spec"]["outcome"] == "failed"]
    assert all(s["spec"]["tool"] == kube.SCALE and "another write's" in s["spec"]["error"] for s in lost), lost
    steps = [s for s in steps if s not in lost]
    assert [(s["spec"]["tool"], s["spec"]["outcome"]) for s in steps] == [
        (kube.SCALE, "succeeded"), (kube.PATCH, "succeeded"), (kube.DELETE, "succeeded"), (kube.CREATE, "succeeded")]
    assert steps[1]["spec"]["args"]["prior"]["object"]["data"] == {"color": "blue"}
    assert steps[1]["spec"]["result"]["post"]["object"]["data"] == {"color": "green"}
    assert apps.read_namespaced_deployment("web", ns).spec.replicas == 0

    rv.request("undo", "agent-run")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", timeout=180)
    assert req["status"]["phase"] == "Succeeded", json.dumps({k: v for k, v in req["status"]["report"].items() if v})
    assert apps.read_namespaced_deployment("web", ns).spec.replicas == 2
    assert core.read_namespaced_config_map("settings", ns).data == {"color": "blue"}
    svc = core.read_namespaced_service("front", ns)
    assert svc.metadata.uid != before_svc.metadata.uid and svc.metadata.labels == {"tier": "front"}
    assert [(p.name, p.port, p.target_port) for p in svc.spec.ports] == [("http", 80, 8080)]
    assert gone(core.read_namespaced_config_map, "extra", ns)
    assert core.read_namespaced_config_map("admins-own", ns) is not None
    for entry in req["status"]["steps"]:
        assert rv.condition(entry, "Verified")["status"] == "True", entry
    # the run boundary: once rolled back, the agent's writes there are refused, never let through unrecorded
    with pytest.raises(ApiException) as closed:
        agent_core.patch_namespaced_config_map("settings", ns, {"data": {"color": "after"}})
    assert closed.value.status == 403 and "rolled back by RollbackRequest" in closed.value.body
    assert core.read_namespaced_config_map("settings", ns).data == {"color": "blue"}


def test_a_change_made_since_is_refused_with_its_difference_and_force_overrides_it(agent_ns):
    rv, ns = agent_ns, agent_ns.ns
    core = client.CoreV1Api(rv.api)
    core.create_namespaced_config_map(ns, {"metadata": {"name": "settings"}, "data": {"color": "blue"}})
    _open_recording_run(rv)
    client.CoreV1Api(rv.agent).patch_namespaced_config_map("settings", ns, {"data": {"color": "green"}})
    _settled(rv, "agent-run")
    core.patch_namespaced_config_map("settings", ns, {"data": {"color": "red"}})  # a person, since

    rv.request("undo", "agent-run")
    req = rv.wait_phase("undo", "Incomplete", timeout=120)
    (conflict,) = req["status"]["report"]["conflict"]
    assert r'data.color: recorded \"green\", live \"red\"' in conflict["reason"], conflict
    assert core.read_namespaced_config_map("settings", ns).data == {"color": "red"}
    rv.request("forced", "agent-run", force=[{"step": conflict["step"]}])
    req = rv.wait_phase("forced", "Succeeded", "Incomplete", timeout=120)
    assert req["status"]["phase"] == "Succeeded", req["status"]["report"]
    assert core.read_namespaced_config_map("settings", ns).data == {"color": "blue"}


def test_a_write_refused_after_admission_is_recorded_failed_and_its_undo_is_a_verified_no_op(agent_ns):
    """A ResourceQuota is checked after the validating webhooks: the create is recorded, then refused."""
    rv, ns = agent_ns, agent_ns.ns
    core = client.CoreV1Api(rv.api)
    _open_recording_run(rv)
    count = len(core.list_namespaced_config_map(ns).items)
    core.create_namespaced_resource_quota(ns, {"metadata": {"name": "cap"},
                                               "spec": {"hard": {"count/configmaps": str(count)}}})
    wait_for(lambda: (core.read_namespaced_resource_quota("cap", ns).status.hard or {}).get("count/configmaps"),
             timeout=30, what="the quota's status")
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(rv.agent).create_namespaced_config_map(ns, {"metadata": {"name": "over"}})
    assert refused.value.status == 403 and "exceeded quota" in refused.value.body
    # while its outcome is being read (no object appears: up to 10 s), the agent may not settle it itself,
    # say as failed, which a rollback skips: a recorded write's outcome is what the API server stored
    (intended,) = [s for s in rv.steps("agent-run") if s["spec"]["outcome"] == "intended"]
    with pytest.raises(ApiException) as forged:
        client.CustomObjectsApi(rv.agent).patch_namespaced_custom_object(
            G, V, ns, "runsteps", intended["metadata"]["name"], {"spec": {"outcome": "succeeded"}})
    assert forged.value.status == 403 and "only Reversi's recorder settles it" in forged.value.body
    step = _settled(rv, "agent-run")[-1]
    assert (step["spec"]["tool"], step["spec"]["outcome"]) == (kube.CREATE, "failed")
    assert "not stored by the API server" in step["spec"]["error"]
    core.delete_namespaced_resource_quota("cap", ns)
    rv.request("undo", "agent-run")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", timeout=120)
    assert req["status"]["report"]["complete"] and step["spec"]["index"] in req["status"]["report"]["skipped"]
    assert gone(core.read_namespaced_config_map, "over", ns)


def test_while_no_admission_replica_answers_a_recorded_users_write_is_refused_and_anothers_admitted(agent_ns, operator):
    """Every admission replica SIGKILLed: the API server refuses the recorded user's write (failurePolicy
    Fail), never lets it through unrecorded; another user's write never reaches the webhook."""
    rv, ns = agent_ns, agent_ns.ns
    core = client.CoreV1Api(rv.api)
    _open_recording_run(rv)
    assert operator.admission is not None, "the test operator runs with its admission server"
    operator.admission.kill()
    try:
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(rv.agent).create_namespaced_config_map(ns, {"metadata": {"name": "while-down"}})
        assert refused.value.status >= 500 and "failed calling webhook" in refused.value.body
        core.create_namespaced_config_map(ns, {"metadata": {"name": "admins"}})  # admitted: never sent there
    finally:
        operator.admission.start()
    assert gone(core.read_namespaced_config_map, "while-down", ns)
    assert _settled(rv, "agent-run") == []  # nothing recorded, nothing made


def test_a_recording_configuration_someone_resets_is_put_right_at_once(agent_ns):
    """The operator watches the recording configuration: reset to record no one, it names the agent again
    within seconds, not at a resync minutes later."""
    rv = agent_ns
    _open_recording_run(rv)
    adm = client.AdmissionregistrationV1Api(rv.api)
    adm.patch_validating_webhook_configuration(webhooks.RECORD_NAME, [
        {"op": "replace", "path": "/webhooks/0/matchConditions",
         "value": [{"name": webhooks.RECORDED_USERS, "expression": "false"}]}])
    wait_for(lambda: rv.user in (webhooks.recorded_now(rv.api, webhooks.RECORD_NAME) or ""), timeout=15,
             what="the operator to put the recorded users back")


def test_a_secrets_content_never_enters_a_runstep_and_a_halt_refuses_the_agents_writes(agent_ns):
    rv, ns = agent_ns, agent_ns.ns
    core = client.CoreV1Api(rv.api)
    core.create_namespaced_secret(ns, {"metadata": {"name": "db"}, "stringData": {"password": "hunter2"}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "probe"}, "data": {"n": "0"}})
    _open_recording_run(rv)
    agent = client.CoreV1Api(rv.agent)
    agent.patch_namespaced_secret("db", ns, {"stringData": {"password": "correct-horse"}})
    text = json.dumps(_settled(rv, "agent-run"))
    assert kube.SECRET in text
    for secret in ("hunter2", "correct-horse", "aHVudGVyMg", "Y29ycmVjdC1ob3JzZQ"):
        assert secret not in text

    rv.create("halts", {"apiVersion": f"{G}/{V}", "kind": "Halt", "metadata": {"name": "stop"},
                        "spec": {"reason": "incident 42"}})

    def halted() -> str | None:
        try:
            agent.patch_namespaced_config_map("probe", ns, {"data": {"n": "halted?"}})
        except ApiException as err:
            return err.body if err.status == 403 else None
        return None

    body = wait_for(halted, timeout=30, what="the halt in force on the agent's writes")
    assert "kill switch: incident 42" in body and "the write was not made" in body
    assert core.read_namespaced_config_map("probe", ns).data != {"n": "halted?"}


def test_only_the_service_account_or_who_may_act_as_it_opens_a_run_that_records_it(agent_ns):
    rv, ns = agent_ns, agent_ns.ns
    core = client.CoreV1Api(rv.api)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "other"}})
    bind(rv.api, rv.ns, "opener", [*reversi_rbac.RECORD], {"kind": "ServiceAccount", "name": "other", "namespace": ns})
    wait_for_role(rv.api, f"system:serviceaccount:{ns}:other", ns, reversi_rbac.RECORD[0])
    other = _token_client(rv.api, ns, "other")
    body = {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": "theirs"},
            "spec": {"manifestRef": {"name": "kube"}, "record": {"serviceAccount": AGENT_SA}}}
    with pytest.raises(ApiException) as refused:
        client.CustomObjectsApi(other).create_namespaced_custom_object(G, V, ns, "runs", body)
    assert refused.value.status == 403
    assert f"spec.record names ServiceAccount {ns}/{AGENT_SA}; only that ServiceAccount" in refused.value.body
    assert "create on serviceaccounts/token" in refused.value.body
    # a user who may act as an account that does not exist opens the Run, and is told it records nothing yet
    typo = {**body, "metadata": {"name": "typo"}, "spec": {**body["spec"], "record": {"serviceAccount": "agnet"}}}
    answer = client.CustomObjectsApi(rv.api).create_namespaced_custom_object(G, V, ns, "runs", typo,
                                                                             _preload_content=False)
    assert f"spec.record names ServiceAccount {ns}/agnet, which does not exist" in answer.headers.get("Warning", "")
    mine = client.CustomObjectsApi(rv.api).create_namespaced_custom_object(G, V, ns, "runs", body, dry_run="All",
                                                                           _preload_content=False)
    assert "does not exist" not in (mine.headers.get("Warning") or ""), "the agent's own account exists"
