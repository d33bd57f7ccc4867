"""The pure rules of the built-in Kubernetes family (docs/concepts.md#built-in-kubernetes-compensation): states
and their projection, differences, the restore decision, classification, the size limit, the manifest
entries and the ``kube.matches`` answer (``reversi.engine.kube``)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reversi.engine import kube
from reversi.engine.templates import resolve
from reversi.engine.verify import first_mismatch
from reversi.models.toolmanifest import Runner, ToolManifestSpec, ToolSpec


def deployment(replicas: int = 3, **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "uid": "u-1",
            "resourceVersion": "41",
            "generation": 7,
            "creationTimestamp": "2024-01-01T00:00:00Z",
            "managedFields": [{"manager": "kubectl"}],
            "labels": {"app": "web"},
            "annotations": {
                "deployment.kubernetes.io/revision": "4",
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
                "team": "a",
            },
            **metadata,
        },
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}}},
        "status": {"readyReplicas": replicas},
    }


def service(cluster_ip: str = "10.0.0.7", node_port: int | None = 30080, service_type: str = "NodePort",
            rv: str = "9", port: int = 80) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "type": service_type,
        "clusterIP": cluster_ip,
        "clusterIPs": [cluster_ip],
        "ipFamilies": ["IPv4"],
        "ipFamilyPolicy": "SingleStack",
        "ports": [{"name": "http", "port": port, "protocol": "TCP", "targetPort": 8080}],
        "selector": {"app": "web"},
    }
    if node_port is not None:
        spec["ports"][0]["nodePort"] = node_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": "shop", "uid": "s-1", "resourceVersion": rv},
        "spec": spec,
        "status": {"loadBalancer": {}},
    }


def job(uid: str = "j-1") -> dict[str, Any]:
    labels = {"controller-uid": uid, "batch.kubernetes.io/controller-uid": uid, "job-name": "pi",
              "batch.kubernetes.io/job-name": "pi"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "pi", "namespace": "shop", "uid": uid, "labels": dict(labels)},
        "spec": {
            "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}},
            "template": {"metadata": {"labels": dict(labels)}, "spec": {"containers": [{"name": "pi"}]}},
        },
    }


def body(decision: kube.Restore) -> dict[str, Any]:
    """The body of a create or replace decision."""
    assert decision.body is not None
    return decision.body


# --- projection -------------------------------------------------------------------------------------------


def test_projection_drops_status_and_server_set_metadata_and_keeps_labels_annotations_and_spec():
    state = kube.user_state(deployment())
    assert state == {
        "object": {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "web",
                "namespace": "shop",
                "labels": {"app": "web"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "team": "a"},
            },
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}},
        }
    }


def test_a_missing_object_is_the_absent_state_never_null():
    assert kube.user_state(None) == {"absent": True}


def test_projection_keeps_owner_references_and_finalizers_and_omits_them_when_empty():
    owned = deployment(ownerReferences=[{"kind": "X", "name": "x", "uid": "1"}], finalizers=["f"])
    meta = kube.user_state(owned)["object"]["metadata"]
    assert meta["ownerReferences"] == [{"kind": "X", "name": "x", "uid": "1"}]
    assert meta["finalizers"] == ["f"]
    bare = deployment(ownerReferences=[], finalizers=[], labels={}, annotations={})
    assert set(kube.user_state(bare)["object"]["metadata"]) == {"name", "namespace"}


def test_projection_keeps_other_top_level_fields():
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "r", "namespace": "shop"}, "rules": [{"verbs": ["get"]}]}
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "shop"},
          "data": {"color": "blue"}, "binaryData": {"b": "AA=="}, "immutable": True}
    assert kube.user_state(role)["object"]["rules"] == [{"verbs": ["get"]}]
    assert {"data", "binaryData", "immutable"} <= set(kube.user_state(cm)["object"])


def test_projection_drops_the_server_set_paths_of_a_service_and_keeps_its_ip_families():
    spec = kube.user_state(service())["object"]["spec"]
    assert spec == {
        "type": "NodePort",
        "ipFamilies": ["IPv4"],
        "ipFamilyPolicy": "SingleStack",
        "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
        "selector": {"app": "web"},
    }


def test_projection_keeps_the_cluster_ip_of_a_headless_service():
    spec = kube.user_state(service(cluster_ip="None", node_port=None, service_type="ClusterIP"))["object"]["spec"]
    assert spec["clusterIP"] == "None" and spec["clusterIPs"] == ["None"]


def test_projection_drops_job_selector_and_controller_labels_and_the_maps_they_leave_empty():
    projected = kube.user_state(job())["object"]
    assert "labels" not in projected["metadata"]
    assert projected["spec"] == {"template": {"spec": {"containers": [{"name": "pi"}]}}}
    assert kube.matches(kube.user_state(job("j-1")), kube.user_state(job("j-2")))


def test_an_empty_map_on_the_way_to_a_server_set_path_is_the_same_as_none():
    empty_labels = job()
    empty_labels["spec"]["template"]["metadata"]["labels"] = {}
    no_metadata = job()
    del no_metadata["spec"]["template"]["metadata"]
    assert kube.user_state(empty_labels) == kube.user_state(no_metadata) == kube.user_state(job())


def test_projection_keeps_the_selector_of_a_job_with_a_manual_selector():
    manual = job()
    manual["spec"]["manualSelector"] = True
    assert kube.user_state(manual)["object"]["spec"]["selector"] == manual["spec"]["selector"]


def test_projection_keeps_empty_maps_the_user_wrote():
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
              "metadata": {"name": "deny", "namespace": "shop"}, "spec": {"podSelector": {}, "ingress": [{}]}}
    assert kube.user_state(policy)["object"]["spec"] == {"podSelector": {}, "ingress": [{}]}


def test_projection_drops_volume_name_of_a_claim_and_node_name_of_a_pod():
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {
        "name": "data", "namespace": "shop", "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
        "spec": {"volumeName": "pv-1", "resources": {"requests": {"storage": "1Gi"}}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "shop"},
           "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}}
    claim_state = kube.user_state(claim)["object"]
    assert "volumeName" not in claim_state["spec"] and "annotations" not in claim_state["metadata"]
    assert "nodeName" not in kube.user_state(pod)["object"]["spec"]


def test_server_set_paths_depend_on_the_api_group():
    knative = {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
               "metadata": {"name": "s", "namespace": "shop"}, "spec": {"clusterIP": "mine"}}
    assert kube.user_state(knative)["object"]["spec"] == {"clusterIP": "mine"}


def test_projection_does_not_modify_its_input():
    original = service()
    before = copy.deepcopy(original)
    kube.user_state(original)
    assert original == before


# --- object_ref -------------------------------------------------------------------------------------------


def test_object_ref_names_api_version_kind_namespace_and_name():
    assert kube.object_ref(deployment()) == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "namespace": "shop", "name": "web"}


def test_cluster_scoped_objects_are_out_of_scope_with_a_message_that_says_what_to_do():
    with pytest.raises(kube.OutOfScope) as err:
        kube.object_ref({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})
    message = str(err.value)
    assert "cluster-scoped objects (Namespace" in message
    assert "are out of scope of the built-in Kubernetes family: only namespaced objects are recorded" in message
    assert "ToolManifest" in message


def test_an_object_without_a_name_is_out_of_scope_a_name_is_required():
    with pytest.raises(kube.OutOfScope) as err:
        kube.object_ref({"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "shop", "generateName": "p-"}})
    assert "a name is required" in str(err.value) and "generateName 'p-'" in str(err.value)


def test_an_object_without_kind_is_malformed():
    with pytest.raises(ValueError):
        kube.object_ref({"metadata": {"name": "x", "namespace": "y"}})


# --- differences ------------------------------------------------------------------------------------------


def test_differences_name_paths_and_both_values():
    cm: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "shop"},
                          "data": {"color": "blue"}}
    live = copy.deepcopy(cm)
    live["data"]["color"] = "green"
    live["metadata"]["labels"] = {"team": "x"}
    assert kube.differences(kube.user_state(cm), kube.user_state(live)) == [
        'data.color: recorded "blue", live "green"',
        'metadata.labels: recorded absent, live {"team":"x"}',
    ]
    assert kube.differences(kube.user_state(deployment(0)), kube.user_state(deployment(3))) == [
        "spec.replicas: recorded 0, live 3"
    ]


def test_a_missing_key_is_named_absent():
    a, b = deployment(), deployment()
    b["metadata"]["labels"]["team"] = "x"
    assert kube.differences(kube.user_state(a), kube.user_state(b)) == [
        'metadata.labels.team: recorded absent, live "x"'
    ]


def test_differences_of_absent_and_present():
    present = kube.user_state(deployment())
    assert kube.differences(kube.ABSENT, present) == ["the object: recorded absent, live present"]
    assert kube.differences(present, {"absent": True}) == ["the object: recorded present, live absent"]
    assert kube.differences({"absent": True}, {"absent": True}) == []


def test_lists_are_compared_element_by_element_and_a_length_difference_is_named():
    a, b = service(port=80), service(port=81)
    assert kube.differences(kube.user_state(a), kube.user_state(b)) == ["spec.ports.0.port: recorded 80, live 81"]
    b["spec"]["ports"].append({"name": "https", "port": 443})
    assert kube.differences(kube.user_state(a), kube.user_state(b)) == [
        "spec.ports: recorded 1 item, live 2 items",
        "spec.ports.0.port: recorded 80, live 81",
        'spec.ports.1: recorded absent, live {"name":"https","port":443}',
    ]


def test_a_service_cluster_ip_never_counts_as_a_difference():
    before, after = service("10.0.0.7", 30080), service("10.0.0.99", 31000)
    assert kube.differences(kube.user_state(before), kube.user_state(after)) == []
    # also when a state was written with the server-set paths in it
    assert kube.matches({"object": before}, {"object": after})


def test_values_are_truncated_to_about_60_characters():
    a: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n"},
                         "data": {"k": "x"}}
    b = copy.deepcopy(a)
    b["data"]["k"] = "y" * 500
    [line] = kube.differences(kube.user_state(a), kube.user_state(b))
    assert line.startswith('data.k: recorded "x", live "yyy') and len(line) < 100 and line.endswith("…")


def test_at_most_limit_lines_the_last_says_how_many_more():
    a: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n"},
                         "data": {f"k{i:02}": "a" for i in range(27)}}
    b = copy.deepcopy(a)
    b["data"] = {key: "b" for key in a["data"]}
    lines = kube.differences(kube.user_state(a), kube.user_state(b))
    assert len(lines) == 20 and lines[-1] == "... and 8 more differences"
    assert lines[0] == 'data.k00: recorded "a", live "b"'
    assert len(kube.differences(kube.user_state(a), kube.user_state(b), limit=27)) == 27
    assert kube.differences(kube.user_state(a), kube.user_state(b), limit=26)[-1] == "... and 2 more differences"


def test_a_limit_below_one_is_refused():
    with pytest.raises(ValueError, match="limit"):
        kube.differences(kube.ABSENT, kube.ABSENT, limit=0)


def test_a_malformed_state_is_refused():
    malformed: list[Any] = [{}, {"absent": False}, {"object": None}, {"absent": True, "object": {}}, None, [1]]
    for bad in malformed:
        with pytest.raises(ValueError, match="not a recorded state"):
            kube.differences(bad, kube.ABSENT)
        with pytest.raises(ValueError):
            kube.decide_restore(bad, kube.ABSENT, None, forced=False)


def test_booleans_are_not_numbers():
    a: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n"},
                         "data": {"k": 1}}
    b = copy.deepcopy(a)
    b["data"]["k"] = True
    assert not kube.matches(kube.user_state(a), kube.user_state(b))
    b["data"]["k"] = 1.0
    assert kube.matches(kube.user_state(a), kube.user_state(b))


# --- restore ----------------------------------------------------------------------------------------------


def test_restore_none_when_live_already_equals_prior_even_when_forced():
    prior = kube.user_state(deployment(1))
    post = kube.user_state(deployment(3))
    for forced in (False, True):
        assert kube.decide_restore(prior, post, deployment(1), forced) == kube.Restore("none")
    assert kube.decide_restore(kube.ABSENT, post, None, False).action == "none"


def test_restore_refuses_an_object_changed_since_and_names_the_differences():
    decision = kube.decide_restore(kube.user_state(deployment(1)), kube.user_state(deployment(3)), deployment(5),
                                   forced=False)
    assert decision.action == "refuse"
    assert decision.differences == ("spec.replicas: recorded 3, live 5",)
    assert decision.body is None and decision.uid is None


def test_forced_overrides_refuse():
    decision = kube.decide_restore(kube.user_state(deployment(1)), kube.user_state(deployment(3)), deployment(5),
                                   forced=True)
    assert decision.action == "replace" and body(decision)["spec"]["replicas"] == 1


def test_restore_deletes_a_created_object_with_its_uid_as_precondition():
    live = deployment(3)
    decision = kube.decide_restore(kube.ABSENT, kube.user_state(live), live, forced=False)
    assert decision == kube.Restore("delete", uid="u-1", resource_version="41")


def test_restore_creates_a_deleted_object_from_the_prior_projection():
    prior = kube.user_state(deployment(2))
    decision = kube.decide_restore(prior, kube.ABSENT, None, forced=False)
    assert decision.action == "create"
    assert decision.body == prior["object"]
    assert "resourceVersion" not in body(decision)["metadata"]


def test_restore_refuses_to_create_over_an_object_created_since():
    decision = kube.decide_restore(kube.user_state(deployment(2)), kube.ABSENT, deployment(7), forced=False)
    assert decision.action == "refuse" and decision.differences == ("the object: recorded absent, live present",)


def test_replace_keeps_live_resource_version_and_server_set_annotations():
    live = deployment(3, resourceVersion="99")
    live["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "5"
    decision = kube.decide_restore(kube.user_state(deployment(1)), kube.user_state(live), live, forced=False)
    assert decision.action == "replace"
    assert body(decision)["metadata"]["resourceVersion"] == "99"
    assert body(decision)["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "5"
    assert body(decision)["spec"]["replicas"] == 1 and "status" not in body(decision)
    assert kube.user_state(body(decision)) == kube.user_state(deployment(1))


def test_replace_keeps_the_live_cluster_ip_and_node_ports_of_a_service():
    prior, live = service("10.0.0.7", 30080, port=80), service("10.0.0.99", 31000, rv="12", port=81)
    decision = kube.decide_restore(kube.user_state(prior), kube.user_state(live), live, forced=False)
    assert decision.action == "replace"
    spec = body(decision)["spec"]
    assert spec["clusterIP"] == "10.0.0.99" and spec["clusterIPs"] == ["10.0.0.99"]
    assert spec["ipFamilies"] == ["IPv4"] and spec["ipFamilyPolicy"] == "SingleStack"
    assert spec["ports"] == [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 31000}]
    assert body(decision)["metadata"]["resourceVersion"] == "12"


def test_replace_of_a_service_back_to_cluster_ip_does_not_keep_node_ports():
    prior = service("10.0.0.7", None, service_type="ClusterIP")
    live = service("10.0.0.7", 31000, service_type="NodePort")
    decision = kube.decide_restore(kube.user_state(prior), kube.user_state(live), live, forced=False)
    assert body(decision)["spec"]["clusterIP"] == "10.0.0.7"
    assert "nodePort" not in body(decision)["spec"]["ports"][0]


def test_replace_of_a_job_keeps_its_live_selector_and_controller_labels():
    prior, live = job("j-1"), job("j-2")
    prior["spec"]["parallelism"] = 1
    decision = kube.decide_restore(kube.user_state(prior), kube.user_state(live), live, forced=True)
    assert decision.action == "replace"
    assert body(decision)["spec"]["selector"] == live["spec"]["selector"]
    assert body(decision)["spec"]["template"]["metadata"]["labels"]["controller-uid"] == "j-2"
    assert body(decision)["metadata"]["labels"]["job-name"] == "pi"


def test_replace_of_a_headless_service_keeps_it_headless():
    prior = service("None", None, service_type="ClusterIP", port=80)
    live = service("None", None, service_type="ClusterIP", port=81)
    decision = kube.decide_restore(kube.user_state(prior), kube.user_state(live), live, forced=False)
    assert body(decision)["spec"]["clusterIP"] == "None"
    assert kube.user_state(body(decision)) == kube.user_state(prior)


def test_a_restore_decision_cannot_be_changed():
    with pytest.raises(AttributeError):
        kube.Restore("none").action = "delete"  # type: ignore[misc]


def test_decide_restore_does_not_modify_its_inputs():
    prior, post, live = kube.user_state(service(port=80)), kube.user_state(service(port=81)), service(port=81)
    saved = copy.deepcopy((prior, post, live))
    decision = kube.decide_restore(prior, post, live, forced=False)
    body(decision)["spec"]["ports"].clear()
    assert (prior, post, live) == saved


# --- classification and size ------------------------------------------------------------------------------

SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "n"}}
CLAIM = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "d", "namespace": "n"}}
OWNED_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {
    "name": "p", "namespace": "n", "ownerReferences": [{"kind": "ReplicaSet", "name": "r", "controller": True}]}}
FREE_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {
    "name": "p", "namespace": "n", "ownerReferences": [{"kind": "X", "name": "x"}]}}


@pytest.mark.parametrize(("verb", "prior", "post", "tool"), [
    ("create", None, SECRET, "kube.secret"),
    ("apply", SECRET, SECRET, "kube.secret"),
    ("delete", SECRET, None, "kube.secret"),
    ("delete", CLAIM, None, "kube.delete-volume-claim"),
    ("patch", CLAIM, CLAIM, "kube.patch"),
    ("create", None, CLAIM, "kube.create"),
    ("delete", OWNED_POD, None, "kube.delete-owned-pod"),
    ("delete", FREE_POD, None, "kube.delete-run"),  # created again it would run again
    ("delete", job(), None, "kube.delete-run"),
    ("patch", OWNED_POD, OWNED_POD, "kube.patch"),
    ("create", None, deployment(), "kube.create"),
    ("apply", deployment(), deployment(), "kube.apply"),
    ("patch", deployment(), deployment(), "kube.patch"),
    ("scale", deployment(1), deployment(3), "kube.scale"),
    ("delete", deployment(), None, "kube.delete"),
])
def test_classify_table(verb, prior, post, tool):
    assert kube.classify(verb, prior, post) == tool


def test_classify_refuses_an_unknown_verb():
    with pytest.raises(ValueError, match="unknown verb 'replace'"):
        kube.classify("replace", None, deployment())


def test_every_classified_tool_is_in_the_manifest():
    names = {tool["name"] for tool in kube.manifest_tools()}
    assert set(kube.REVERSIBLE) | set(kube.IRREVERSIBLE) == names


def test_state_size_is_the_bytes_of_compact_utf8_json():
    assert kube.state_size({"absent": True}) == len('{"absent":true}')
    assert kube.state_size({"object": {"data": {"k": "é"}}}) == len('{"object":{"data":{"k":"é"}}}'.encode())


def test_too_large_names_the_larger_size_only_over_the_limit():
    small = {"object": {"data": {"k": "x"}}}
    big = {"object": {"data": {"k": "x" * kube.MAX_STATE_BYTES}}}
    assert kube.too_large(small, small) is None
    assert kube.too_large(small, big) == kube.state_size(big) == kube.too_large(big, kube.ABSENT)
    exact = {"object": {"data": {"k": "x" * (kube.MAX_STATE_BYTES - len('{"object":{"data":{"k":""}}}'))}}}
    assert kube.state_size(exact) == kube.MAX_STATE_BYTES and kube.too_large(exact, exact) is None
    assert str(kube.state_size(big)) in kube.too_large_reason(kube.state_size(big))


# --- manifest entries and the reader answer ---------------------------------------------------------------


def test_every_manifest_entry_validates_as_a_tool_spec_and_keeps_its_fields():
    for entry in kube.manifest_tools("kube-tools"):
        spec = ToolSpec.model_validate(entry)
        wire = spec.to_wire()
        assert _contains(wire, entry), entry["name"]


def test_reversible_entries_restore_with_a_precondition_a_precheck_and_a_read_back():
    entries = {tool["name"]: tool for tool in kube.manifest_tools("kube")}
    for name in kube.REVERSIBLE:
        spec = ToolSpec.model_validate(entries[name])
        assert spec.effect == "write"
        assert spec.compensation is not None and spec.verification is not None
        assert spec.compensation.tool == "kube.restore" and spec.compensation.kind == "inverse"
        assert spec.compensation.precheck and spec.compensation.runner == "kube"
        assert spec.compensation.args == {"ref": "$args.ref", "prior": "$args.prior", "post": "$result.post",
                                          "uid": "$result.uid"}
        pre = spec.compensation.precondition
        assert pre is not None and pre.tool == "kube.matches" and pre.expect == {"differences": []}
        assert pre.args == {"ref": "$args.ref", "state": "$result.post"} and pre.runner == "kube"
        check = spec.verification
        assert check.args == {"ref": "$args.ref", "state": "$args.prior"}
        assert (check.retries, check.backoff_ms, check.runner) == (5, 1000, "kube")


def test_irreversible_entries_state_their_residue():
    entries = {tool["name"]: tool for tool in kube.manifest_tools()}
    for name in kube.IRREVERSIBLE:
        spec = ToolSpec.model_validate(entries[name])
        assert spec.effect == "irreversible" and spec.compensation is None and len(spec.residue) == 1
    assert "replaced" in entries["kube.delete-owned-pod"]["residue"][0]
    assert "not restored" in entries["kube.delete-owned-pod"]["residue"][0]


def test_the_runner_entry_and_the_tools_make_a_valid_manifest():
    runner = kube.runner_entry("registry.example/reversi:1.0", "reversi-kube")
    assert runner["command"] == ["reversi-kube-runner"]
    assert Runner.model_validate(runner).service_account_name == "reversi-kube"
    ToolManifestSpec.model_validate({"runners": [runner], "tools": kube.manifest_tools()})
    other = kube.runner_entry("img", "sa", name="k8s", command=["run", "--x"])
    assert other["command"] == ["run", "--x"]
    ToolManifestSpec.model_validate({"runners": [other], "tools": kube.manifest_tools("k8s")})
    with pytest.raises(ValueError):
        ToolManifestSpec.model_validate({"runners": [other], "tools": kube.manifest_tools("kube")})
    with pytest.raises(ValueError):
        kube.runner_entry("img", "sa", command=[])


def test_read_answer_lists_the_differences_and_matches_the_entries_expect_only_when_equal():
    expected = kube.user_state(deployment(1))
    assert kube.read_answer(expected, deployment(1)) == {"matches": True, "differences": []}
    assert kube.read_answer(expected, deployment(2)) == {
        "matches": False, "differences": ["spec.replicas: recorded 1, live 2"]}
    assert kube.read_answer(kube.ABSENT, None) == {"matches": True, "differences": []}
    assert kube.read_answer(kube.ABSENT, deployment()) == {
        "matches": False, "differences": ["the object: recorded absent, live present"]}
    json.dumps(kube.read_answer(expected, None))


def test_the_templates_of_the_entries_resolve_against_a_recorded_call_even_when_a_state_is_absent():
    """States are never null: a template that ends at null would count as missing."""
    ref = kube.object_ref(deployment())
    entry = {tool["name"]: tool for tool in kube.manifest_tools()}["kube.create"]
    args, result = {"ref": ref, "prior": kube.user_state(None)}, kube.recorded_result("kube.create", deployment())
    restore_args = resolve(entry["compensation"]["args"], args, result)
    assert restore_args == {"ref": ref, "prior": {"absent": True}, "post": result["post"], "uid": "u-1"}
    assert resolve(entry["compensation"]["precondition"]["args"], args, result)["state"] == result["post"]
    assert resolve(entry["verification"]["args"], args, result)["state"] == {"absent": True}


def test_the_reader_answer_meets_the_expectations_of_the_entries():
    entry = {tool["name"]: tool for tool in kube.manifest_tools()}["kube.scale"]
    expect = entry["verification"]["expect"]
    prior = kube.user_state(deployment(1))
    assert first_mismatch(kube.read_answer(prior, deployment(1)), expect) is None
    # the operator's own comparison (rule 5): a mismatch names the differences, for a conflict's message too
    assert first_mismatch(kube.read_answer(prior, deployment(2)), expect) == \
        'differences is ["spec.replicas: recorded 1, live 2"], expected []'
    assert first_mismatch(kube.read_answer(prior, deployment(1)), entry["compensation"]["precondition"]["expect"]) \
        is None


def _contains(answer, expect):
    if isinstance(expect, dict):
        return isinstance(answer, dict) and all(k in answer and _contains(answer[k], v) for k, v in expect.items())
    return answer == expect


# --- properties -------------------------------------------------------------------------------------------

keys = st.sampled_from(["a", "b", "c", "replicas", "color", "x.y"])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["", "blue", "green", "é"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)), max_leaves=12)
label_maps = st.dictionaries(st.sampled_from(["app", "team", "job-name", "controller-uid"]),
                             st.sampled_from(["a", "b"]), max_size=3)
kinds = st.sampled_from([("v1", "ConfigMap"), ("apps/v1", "Deployment"), ("v1", "Service"), ("batch/v1", "Job"),
                         ("v1", "Pod")])


@st.composite
def objects(draw):
    api_version, kind = draw(kinds)
    spec = draw(st.dictionaries(keys, values, max_size=3))
    if kind == "Service":
        spec["clusterIP"] = draw(st.sampled_from(["10.0.0.1", "10.0.0.2"]))
        spec["ports"] = [{"name": "p", "port": 80, "nodePort": draw(st.integers(30000, 30002))}]
        spec["type"] = draw(st.sampled_from(["ClusterIP", "NodePort"]))
    if kind == "Job":
        spec["selector"] = {"matchLabels": draw(label_maps)}
        spec["template"] = {"metadata": {"labels": draw(label_maps)}}
    if kind == "Pod":
        spec["nodeName"] = draw(st.sampled_from(["n1", "n2"]))
    obj = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": "o", "namespace": "n", "uid": draw(st.sampled_from(["u1", "u2"])),
                     "resourceVersion": draw(st.sampled_from(["1", "2"])), "labels": draw(label_maps),
                     "annotations": draw(st.dictionaries(
                         st.sampled_from(["team", "deployment.kubernetes.io/revision"]), st.just("v"), max_size=2))},
        "spec": spec,
        "status": draw(values),
    }
    return obj


states = st.one_of(st.just({"absent": True}), objects().map(kube.user_state))


@settings(max_examples=200, deadline=None)
@given(states)
def test_property_a_state_has_no_differences_with_itself(state):
    assert kube.differences(state, state) == [] and kube.matches(state, state)
    assert kube.differences(state, copy.deepcopy(state)) == []


@settings(max_examples=300, deadline=None)
@given(states, states, st.integers(1, 5))
def test_property_differences_are_empty_iff_the_states_match_in_either_order(a, b, limit):
    lines = kube.differences(a, b, limit)
    assert (lines == []) == kube.matches(a, b) == kube.matches(b, a) == (kube.differences(b, a) == [])
    assert len(lines) <= limit
    assert all("\n" not in line for line in lines)
    assert kube.differences(a, b, limit) == lines  # deterministic


@settings(max_examples=200, deadline=None)
@given(objects())
def test_property_projection_is_idempotent(obj):
    state = kube.user_state(obj)
    assert kube.user_state(state["object"]) == state
    assert json.loads(json.dumps(state)) == state


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), objects()), st.one_of(st.none(), objects()), st.one_of(st.none(), objects()),
       st.booleans())
def test_property_restore_decision_follows_the_order_of_checks(prior_obj, post_obj, live, forced):
    prior, post = kube.user_state(prior_obj), kube.user_state(post_obj)
    decision = kube.decide_restore(prior, post, live, forced)
    now = kube.user_state(live)
    assert decision.action in kube.ACTIONS
    if kube.matches(prior, now):
        assert decision.action == "none"
    elif not forced and not kube.matches(post, now):
        assert decision.action == "refuse" and list(decision.differences) == kube.differences(post, now)
    elif prior_obj is None:
        assert decision.action == "delete" and decision.uid == live["metadata"]["uid"]
    elif live is None:
        assert decision.action == "create" and kube.user_state(body(decision)) == prior
    else:
        assert decision.action == "replace"
        assert body(decision)["metadata"]["resourceVersion"] == live["metadata"]["resourceVersion"]
        # restoring the body puts the prior state back: the copied server-set values are not part of it
        assert kube.matches(kube.user_state(body(decision)), prior)


# --- recording (what a step of the family holds) --------------------------------------------------------------

SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": "shop", "uid": "s-1",
                                                             "resourceVersion": "7"},
          "data": {"password": "aHVudGVyMg=="}}


def test_a_recorded_write_keeps_the_reference_and_the_prior_state_and_the_post_state_in_its_result():
    before, after = deployment(3), deployment(0)
    tool, args = kube.recorded_args("scale", kube.object_ref(before), before)
    assert tool == "kube.scale" and args == {"ref": kube.object_ref(before), "prior": kube.user_state(before)}
    result = kube.recorded_result(tool, after)
    assert result["post"] == kube.user_state(after) and set(result) == {"uid", "resourceVersion", "post"}
    tool, args = kube.recorded_args("create", kube.object_ref(after), None, after)
    assert (tool, args["prior"]) == ("kube.create", {"absent": True})


def test_a_delete_records_the_absent_post_state_even_when_the_server_answers_with_the_terminating_object():
    terminating = deployment(1)
    terminating["metadata"]["deletionTimestamp"] = "2026-12-07T10:00:00Z"
    assert kube.recorded_result("kube.delete", terminating)["post"] == {"absent": True}
    assert kube.recorded_result("kube.delete", None)["post"] == {"absent": True}


def test_a_secrets_content_never_enters_the_journal():
    for verb in ("patch", "delete", "apply"):
        tool, args = kube.recorded_args(verb, kube.object_ref(SECRET), SECRET, SECRET if verb == "apply" else None)
        result = kube.recorded_result(tool, SECRET)
        assert tool == "kube.secret"
        text = json.dumps([args, result])
        assert "aHVudGVyMg" not in text and "password" not in text


def test_a_state_over_the_limit_is_recorded_unjournaled_with_its_size_named():
    big = deployment(1)
    big["metadata"]["annotations"] = {"blob": "x" * (kube.MAX_STATE_BYTES + 10)}
    tool, args = kube.recorded_args("patch", kube.object_ref(big), big)
    assert tool == "kube.unjournaled" and args["bytes"] > kube.MAX_STATE_BYTES
    assert str(args["bytes"]) in args["reason"] and "blob" not in json.dumps(args)
    # a post state over the limit is left out: its undo's $result.post is missing (the plan says unrecoverable)
    result = kube.recorded_result("kube.patch", big)
    assert "post" not in result and result["postBytes"] > kube.MAX_STATE_BYTES


def test_a_recorded_state_fits_a_steps_64_kib_args_with_its_reference():
    from reversi.models.runstep import MAX_CALL_BYTES

    assert kube.MAX_STATE_BYTES + 4 * 1024 <= MAX_CALL_BYTES


def test_a_reference_is_its_own_reference():
    ref = kube.object_ref(deployment(1))
    assert kube.object_ref(ref) == ref
    with pytest.raises(kube.OutOfScope):
        kube.object_ref({"apiVersion": "v1", "kind": "Namespace", "name": "shop"})


def test_an_object_being_deleted_matches_no_state_and_its_restore_waits():
    going = deployment(2)
    going["metadata"]["deletionTimestamp"] = "2026-12-07T10:00:00Z"
    state = kube.user_state(going)
    assert state["terminating"] is True
    assert not kube.matches(kube.user_state(deployment(2)), state) and not kube.matches(kube.ABSENT, state)
    assert kube.differences(kube.ABSENT, state) == ["the object: recorded absent, live being deleted"]
    # a deleted object's undo waits until it is gone; its read-back never calls it restored meanwhile
    decision = kube.decide_restore(kube.user_state(deployment(2)), kube.ABSENT, going, forced=True)
    assert decision.action == "wait"
    assert kube.read_answer(kube.user_state(deployment(2)), going)["matches"] is False


def test_an_object_deleted_and_created_again_since_is_another_object_and_is_refused_unless_forced():
    created = deployment(3)
    again = deployment(3)
    again["metadata"]["uid"] = "u-2"
    decision = kube.decide_restore(kube.ABSENT, kube.user_state(created), again, forced=False, uid="u-1")
    assert decision.action == "refuse" and "deleted and created again since" in decision.differences[0]
    assert kube.decide_restore(kube.ABSENT, kube.user_state(created), created, forced=False, uid="u-1").action \
        == "delete"
    assert kube.decide_restore(kube.ABSENT, kube.user_state(created), again, forced=True, uid="u-1").action \
        == "delete"


def test_a_daemonsets_template_generation_is_the_servers():
    ds = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {
        "name": "agent", "namespace": "shop", "annotations": {"deprecated.daemonset.template.generation": "3"}},
        "spec": {"selector": {"matchLabels": {"a": "b"}}}}
    later = copy.deepcopy(ds)
    later["metadata"]["annotations"]["deprecated.daemonset.template.generation"] = "5"
    assert kube.matches(kube.user_state(ds), kube.user_state(later))


@pytest.mark.parametrize("name", ["../../other/configmaps/victim", "x?dryRun=All", "a/b", "%2e%2e", "..", "x" * 254])
def test_a_name_that_is_no_object_name_is_refused_before_any_call(name):
    with pytest.raises(kube.OutOfScope, match="not a Kubernetes object name"):
        kube.object_ref({"apiVersion": "v1", "kind": "ConfigMap", "namespace": "shop", "name": name})
    with pytest.raises(kube.OutOfScope, match="not a Kubernetes object name"):
        kube.object_ref({"apiVersion": "v1", "kind": "ConfigMap", "namespace": "Shop/x", "name": "ok"})


def test_a_state_of_another_object_than_the_steps_is_refused():
    ref = kube.object_ref(deployment(1))
    kube.check_states(ref, kube.user_state(deployment(2)), kube.ABSENT)
    other = deployment(2)
    other["metadata"]["name"] = "someone-elses"
    with pytest.raises(ValueError, match="not the step's object"):
        kube.check_states(ref, kube.user_state(other))


def test_an_object_a_rollback_created_again_is_its_own_for_the_steps_before():
    """A change, then the delete of the same object: the delete's undo creates the object again
    (a new uid, annotated with the run); the change's undo then restores it, never refuses it as
    someone else's, and a state never holds the annotation."""
    before, changed = deployment(2), deployment(5)
    created = kube.decide_restore(kube.user_state(changed), kube.ABSENT, None, forced=False, run="shop/r")
    assert created.action == "create"
    assert created.body["metadata"]["annotations"][kube.RESTORED_BY] == "shop/r"
    live = copy.deepcopy(created.body)
    live["metadata"].update(uid="u-new", resourceVersion="77")
    assert kube.user_state(live) == kube.user_state(changed)  # the annotation is in no state
    decision = kube.decide_restore(kube.user_state(before), kube.user_state(changed), live, forced=False,
                                   uid="u-1", run="shop/r")
    assert decision.action == "replace" and kube.RESTORED_BY not in (decision.body["metadata"].get("annotations") or {})
    other_run = kube.decide_restore(kube.user_state(before), kube.user_state(changed), live, forced=False,
                                    uid="u-1", run="shop/other")
    assert other_run.action == "refuse"
