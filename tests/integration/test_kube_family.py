"""The built-in Kubernetes family (docs/concepts.md#built-in-kubernetes-compensation) on the local
control plane: an agent's writes recorded with ``rec.kube``, undone and read back by
``reversi-kube-runner`` Jobs that run as the namespace's own ServiceAccount. Every verdict is
checked against the live objects, never against the report alone."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from reversi import rbac as reversi_rbac
from reversi.engine import kube
from reversi.models.runstep import step_name
from reversi.sdk import Recorder
from tests.helpers import users_with_roles
from tests.integration.kube_setup import RUNNER_RULES, RUNNER_SA, deployment, gone, install_family

#: the agent: it records (the chart's reversi-record role) and changes these objects itself
AGENT_RULES = [*reversi_rbac.RECORD,
               {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "create", "patch", "delete"]},
               {"apiGroups": [""], "resources": ["configmaps", "services", "secrets"],
                "verbs": ["get", "create", "patch", "delete"]}]


@pytest.fixture
def kube_ns(rv, cluster):
    """``rv`` with the family's ToolManifest ``kube``, its runner's ServiceAccount and Role, and
    ``rv.agent``: an API client of the user ``kube-agent`` (:data:`AGENT_RULES`), and of
    ``weak-agent``, who records but may only read ConfigMaps (``rv.weak``)."""
    install_family(rv)
    users = users_with_roles(cluster, rv.api, rv.ns, {
        "kube-agent": AGENT_RULES,
        "weak-agent": [*reversi_rbac.RECORD, {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]})
    rv.agent, rv.weak = users["kube-agent"], users["weak-agent"]
    return rv


def _configmap(ns: str, name: str, color: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns},
            "data": {"color": color}}


def _service(ns: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "front", "namespace": ns,
                                                                 "labels": {"tier": "front"}},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}


def _ref(obj: dict) -> dict:
    return kube.object_ref(obj)


def test_a_create_a_patch_a_scale_and_a_delete_are_restored_and_read_back_against_the_live_objects(kube_ns):
    rv, ns = kube_ns, kube_ns.ns
    core, apps = client.CoreV1Api(rv.api), client.AppsV1Api(rv.api)
    apps.create_namespaced_deployment(ns, deployment(ns, 2))
    core.create_namespaced_config_map(ns, _configmap(ns, "settings", "blue"))
    before_svc = core.create_namespaced_service(ns, _service(ns))
    rec = Recorder.open(ns, "agent", manifest="kube", api=rv.agent)
    rec.kube.scale(_ref(deployment(ns, 2)), 0)
    rec.kube.patch(_ref(_configmap(ns, "settings", "")), {"data": {"color": "green"}})
    rec.kube.delete(_ref(_service(ns)))
    rec.kube.create(_configmap(ns, "extra", "red"))
    assert apps.read_namespaced_deployment("web", ns).spec.replicas == 0
    assert gone(core.read_namespaced_service, "front", ns)

    rv.request("undo", "agent")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", timeout=180)
    report = req["status"]["report"]
    assert req["status"]["phase"] == "Succeeded" and report["complete"], report
    assert sorted(report["compensated"]) == [0, 1, 2, 3]
    # the live objects, not the report
    assert apps.read_namespaced_deployment("web", ns).spec.replicas == 2
    assert core.read_namespaced_config_map("settings", ns).data == {"color": "blue"}
    svc = core.read_namespaced_service("front", ns)
    assert svc.metadata.uid != before_svc.metadata.uid  # created again from its prior state
    assert [(p.name, p.port, p.target_port) for p in svc.spec.ports] == [("http", 80, 8080)]
    assert svc.spec.selector == {"app": "web"} and svc.metadata.labels == {"tier": "front"}
    assert gone(core.read_namespaced_config_map, "extra", ns)
    # each undo was read back against the prior state by a kube.matches reader Job
    for entry in req["status"]["steps"]:
        assert rv.condition(entry, "Verified")["status"] == "True", entry


def test_a_change_made_since_is_refused_with_its_differences_and_force_overrides_it(kube_ns):
    rv, ns = kube_ns, kube_ns.ns
    core = client.CoreV1Api(rv.api)
    core.create_namespaced_config_map(ns, _configmap(ns, "settings", "blue"))
    rec = Recorder.open(ns, "agent", manifest="kube", api=rv.agent)
    rec.kube.patch(_ref(_configmap(ns, "settings", "")), {"data": {"color": "green"}})
    core.patch_namespaced_config_map("settings", ns, {"data": {"color": "red"}})  # a person, since

    rv.request("undo", "agent")
    req = rv.wait_phase("undo", "Incomplete", timeout=120)
    (conflict,) = req["status"]["report"]["conflict"]
    assert conflict["step"] == 0
    # the reader's answer, as the operator shows a mismatch (JSON): each difference by its path
    assert r'differences is ["data.color: recorded \"green\", live \"red\""]' in conflict["reason"], conflict
    assert core.read_namespaced_config_map("settings", ns).data == {"color": "red"}  # the person's change stands

    rv.request("forced", "agent", force=[{"step": 0}])
    req = rv.wait_phase("forced", "Succeeded", "Incomplete", timeout=120)
    assert req["status"]["phase"] == "Succeeded", req["status"]["report"]
    assert core.read_namespaced_config_map("settings", ns).data == {"color": "blue"}
    assert req["status"]["report"]["forced"][0]["step"] == 0


def test_a_write_the_api_server_refused_is_recorded_failed_and_its_undo_changes_nothing(kube_ns):
    rv, ns = kube_ns, kube_ns.ns
    apps = client.AppsV1Api(rv.api)
    apps.create_namespaced_deployment(ns, deployment(ns, 2))
    rec = Recorder.open(ns, "agent", manifest="kube", api=rv.agent)
    with pytest.raises(ApiException) as refused:
        rec.kube.scale(_ref(deployment(ns, 2)), -1)
    assert refused.value.status == 422
    step = rv.get("runsteps", step_name("agent", 0))
    assert step["spec"]["outcome"] == "failed"
    rv.request("undo", "agent")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", timeout=60)
    assert req["status"]["report"]["skipped"] == [0] and req["status"]["report"]["complete"]
    assert apps.read_namespaced_deployment("web", ns).spec.replicas == 2


def test_a_secrets_content_never_enters_a_runstep_and_its_step_is_irreversible_residue(kube_ns):
    rv, ns = kube_ns, kube_ns.ns
    core = client.CoreV1Api(rv.api)
    core.create_namespaced_secret(ns, {"metadata": {"name": "db"}, "stringData": {"password": "hunter2"}})
    rec = Recorder.open(ns, "agent", manifest="kube", api=rv.agent)
    rec.kube.patch({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": ns}},
                   {"stringData": {"password": "correct-horse"}})
    text = json.dumps(rv.steps("agent"))
    for secret in ("hunter2", "correct-horse", "aHVudGVyMg", "Y29ycmVjdC1ob3JzZQ"):
        assert secret not in text
    rv.request("plan", "agent", dryRun=True)
    plan = rv.wait_phase("plan", "Planned", timeout=30)["status"]["plan"]
    (action,) = plan["actions"]
    assert action["kind"] == "unrecoverable" and "content never enters the journal" in action["reason"]


def test_a_right_the_runner_lacks_fails_its_step_naming_the_verb_and_the_object(kube_ns):
    rv, ns = kube_ns, kube_ns.ns
    core, rbac = client.CoreV1Api(rv.api), client.RbacAuthorizationV1Api(rv.api)
    rules = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}, *RUNNER_RULES[2:]]  # no update
    rbac.patch_namespaced_role(RUNNER_SA, ns, {"rules": rules})
    core.create_namespaced_config_map(ns, _configmap(ns, "settings", "blue"))
    rec = Recorder.open(ns, "agent", manifest="kube", api=rv.agent)
    rec.kube.patch(_ref(_configmap(ns, "settings", "")), {"data": {"color": "green"}})
    rv.request("undo", "agent", retries=1)
    req = rv.wait_phase("undo", "Incomplete", timeout=120)
    (failed,) = req["status"]["report"]["failed"]
    assert f"update ConfigMap {ns}/settings is forbidden to this runner's service account" in failed["error"], failed
    assert core.read_namespaced_config_map("settings", ns).data == {"color": "green"}  # nothing silently skipped


def test_a_forged_step_never_makes_the_runner_write_what_its_agent_could_not(kube_ns):
    """The states of a step are the agent's own word: an agent that may only read a ConfigMap
    records a patch of it with a prior state of its choosing. The runner, whose rights are wider,
    asks whether the run's principal may make the write (a LocalSubjectAccessReview) and refuses."""
    rv, ns = kube_ns, kube_ns.ns
    core = client.CoreV1Api(rv.api)
    live = core.create_namespaced_config_map(ns, _configmap(ns, "settings", "blue")).to_dict()
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(rv.weak).patch_namespaced_config_map("settings", ns, {"data": {"color": "evil"}})
    assert refused.value.status == 403
    rec = Recorder.open(ns, "agent", manifest="kube", api=rv.weak)
    ref = _ref(_configmap(ns, "settings", ""))
    forged = kube.user_state(_configmap(ns, "settings", "evil"))
    rec.call("kube.patch", {"ref": ref, "prior": forged},
             lambda a: {"post": kube.user_state(_configmap(ns, "settings", "blue")), "uid": live["metadata"]["uid"]})
    rv.request("undo", "agent", retries=1)
    req = rv.wait_phase("undo", "Incomplete", timeout=120)
    (failed,) = req["status"]["report"]["failed"]
    assert "the run's principal weak-agent may not update ConfigMap" in failed["error"], failed
    assert core.read_namespaced_config_map("settings", ns).data == {"color": "blue"}


def test_a_change_then_a_delete_of_one_object_and_a_create_then_a_delete_are_undone_to_before_the_run(kube_ns):
    """Newest first: the delete's undo creates the object again (another uid), and the change's
    undo then restores that object, since this rollback created it; the created-then-deleted
    object is created again and deleted again: the cluster ends as before the run."""
    rv, ns = kube_ns, kube_ns.ns
    core = client.CoreV1Api(rv.api)
    core.create_namespaced_config_map(ns, _configmap(ns, "settings", "blue"))
    rec = Recorder.open(ns, "agent", manifest="kube", api=rv.agent)
    settings = _ref(_configmap(ns, "settings", ""))
    rec.kube.patch(settings, {"data": {"color": "green"}})
    rec.kube.delete(settings)
    rec.kube.create(_configmap(ns, "extra", "red"))
    rec.kube.delete(_ref(_configmap(ns, "extra", "")))
    rv.request("undo", "agent")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", timeout=180)
    assert req["status"]["phase"] == "Succeeded", req["status"]["report"]
    live = core.read_namespaced_config_map("settings", ns)
    assert live.data == {"color": "blue"} and kube.RESTORED_BY not in (live.metadata.annotations or {})
    assert gone(core.read_namespaced_config_map, "extra", ns)
