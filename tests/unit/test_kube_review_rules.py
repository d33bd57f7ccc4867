"""Recording an agent's own writes at admission (docs/concepts.md#recording-with-no-agent-code): the pure rules
that turn an admission review into a kube-family step, and settle its outcome from what was stored."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reversi.adapters import webhooks
from reversi.engine import kube, kube_review

AGENT = "system:serviceaccount:team:agent"


def _cm(data: dict, rv: str = "10", uid: str = "u-1", **meta: object) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": "team", "uid": uid, "resourceVersion": rv, **meta},
            "data": data}


def _review(operation: str, obj: dict | None, old: dict | None, **extra: object) -> dict:
    resource = extra.pop("resource", {"group": "", "version": "v1", "resource": "configmaps"})
    return {"uid": "r-1", "operation": operation, "namespace": "team", "name": "settings", "resource": resource,
            "userInfo": {"username": AGENT}, "object": obj, "oldObject": old, **extra}


def _deployment(replicas: int, rv: str = "7") -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "team", "uid": "d-1", "resourceVersion": rv},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}}}}


# --- what a review records ------------------------------------------------------------------------------


def test_a_create_is_kube_create_with_an_absent_prior_and_the_object_as_its_expected_post():
    write = kube_review.written(_review("CREATE", _cm({"a": "1"}), None))
    assert write is not None
    assert (write.tool, write.verb, write.uid, write.prior_version) == (kube.CREATE, "create", "u-1", "")
    assert write.args == {"ref": {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "team", "name": "settings"},
                          "prior": {"absent": True}}
    assert write.expected == kube.user_state(_cm({"a": "1"}))
    assert write.user == AGENT


def test_an_update_is_kube_patch_with_old_object_as_its_prior_state():
    write = kube_review.written(_review("UPDATE", _cm({"a": "2"}, rv="10"), _cm({"a": "1"}, rv="10")))
    assert write is not None and write.tool == kube.PATCH and write.prior_version == "10"
    assert write.args["prior"] == kube.user_state(_cm({"a": "1"}))
    assert write.expected["object"]["data"] == {"a": "2"}
    assert not write.changes_nothing


def test_a_scale_is_recorded_on_the_object_it_scales_read_as_parent():
    # a Scale leaves replicas: 0 out (omitempty): the API server sends an empty spec for a scale to zero
    scale = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "web", "namespace": "team"},
             "spec": {}}
    review = _review("UPDATE", scale, dict(scale, spec={"replicas": 3}), subResource="scale",
                     resource={"group": "apps", "version": "v1", "resource": "deployments"})
    write = kube_review.written(review, _deployment(3))
    assert write is not None and write.tool == kube.SCALE and write.prior_version == "7"
    assert write.args["prior"]["object"]["spec"]["replicas"] == 3
    assert write.expected["object"]["spec"]["replicas"] == 0
    with pytest.raises(ValueError, match="parent"):
        kube_review.written(review)


def test_a_delete_is_kube_delete_and_its_expected_post_is_absent():
    write = kube_review.written(_review("DELETE", None, _cm({"a": "1"})))
    assert write is not None and write.tool == kube.DELETE and write.expected == {"absent": True}
    assert write.args["prior"] == kube.user_state(_cm({"a": "1"}))


def test_the_family_classification_holds_a_secret_s_content_never_in_the_step():
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": "team", "uid": "s"},
              "data": {"password": "c2VjcmV0"}}
    write = kube_review.written(_review("UPDATE", secret, secret, resource={"group": "", "version": "v1",
                                                                           "resource": "secrets"}))
    assert write is not None and write.tool == kube.SECRET
    assert "c2VjcmV0" not in repr(write.args) and "c2VjcmV0" not in repr(write.expected)
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "d", "namespace": "team"}}
    deleted = kube_review.written(_review("DELETE", None, claim))
    assert deleted is not None and deleted.tool == kube.DELETE_VOLUME_CLAIM


@pytest.mark.parametrize("extra", [
    {"dryRun": True},
    {"subResource": "status"},
    {"resource": {"group": "reversi.dev", "version": "v1alpha1", "resource": "runs"}},
    {"resource": {"group": "", "version": "v1", "resource": "events"}},
    {"resource": {"group": "coordination.k8s.io", "version": "v1", "resource": "leases"}},
])
def test_dry_runs_other_subresources_and_reversi_s_own_kinds_are_not_recorded(extra):
    assert kube_review.written(_review("UPDATE", _cm({"a": "2"}), _cm({"a": "1"}), **extra)) is None


def test_the_delete_of_a_recorded_namespace_is_refused_its_objects_would_go_unrecorded():
    review = _review("DELETE", None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}},
                     resource={"group": "", "version": "v1", "resource": "namespaces"}, name="team")
    with pytest.raises(kube.OutOfScope, match="deleting namespace team"):
        kube_review.written(review)
    assert "request.name" in webhooks.recorded_users({AGENT: ("team",)})


def test_a_cluster_scoped_object_is_out_of_scope():
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}}
    with pytest.raises(kube.OutOfScope):
        kube_review.written(_review("CREATE", namespace, None))


# --- settling the outcome -------------------------------------------------------------------------------


def test_the_first_version_stored_after_the_prior_one_equal_to_the_expected_post_is_succeeded():
    write = kube_review.written(_review("UPDATE", _cm({"a": "2"}), _cm({"a": "1"})))
    assert write is not None
    settled = kube_review.settle_change(write, _cm({"a": "2"}, rv="11"))
    assert settled.outcome == "succeeded" and settled.result is not None
    assert settled.result["post"] == kube.user_state(_cm({"a": "2"})) and settled.result["resourceVersion"] == "11"


def test_a_write_refused_after_admission_is_failed_another_write_first_or_none_at_all():
    write = kube_review.written(_review("UPDATE", _cm({"a": "2"}), _cm({"a": "1"})))
    assert write is not None
    other = kube_review.settle_change(write, _cm({"a": "3"}, rv="11"))
    none = kube_review.settle_change(write, None)
    assert other.outcome == none.outcome == "failed"
    assert "another write's" in (other.error or "") and "no new version" in (none.error or "")


def test_an_update_that_changes_nothing_is_succeeded_though_nothing_was_stored():
    write = kube_review.written(_review("UPDATE", _cm({"a": "1"}), _cm({"a": "1"})))
    assert write is not None and write.changes_nothing
    settled = kube_review.settle_change(write, None)
    assert settled.outcome == "succeeded" and settled.result is not None and settled.result["resourceVersion"] == "10"


def test_a_custom_resources_scale_is_uncertain_its_replicas_path_is_its_crds():
    widget = {"apiVersion": "breaker.dev/v1", "kind": "Widget",
              "metadata": {"name": "w1", "namespace": "team", "uid": "w", "resourceVersion": "3"}, "spec": {"size": 1}}
    scale = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "w1", "namespace": "team"},
             "spec": {"replicas": 7}}
    review = _review("UPDATE", scale, scale, subResource="scale",
                     resource={"group": "breaker.dev", "version": "v1", "resource": "widgets"})
    write = kube_review.written(review, widget)
    assert write is not None and write.tool == kube.SCALE
    stored = {**widget, "metadata": {**widget["metadata"], "resourceVersion": "4"}, "spec": {"size": 7}}
    settled = kube_review.settle_change(write, stored)
    assert settled.outcome == "uncertain" and "specReplicasPath" in (settled.error or "")


def test_a_delete_is_succeeded_by_the_deletion_or_a_deletion_timestamp_and_failed_otherwise():
    write = kube_review.written(_review("DELETE", None, _cm({"a": "1"})))
    assert write is not None
    assert kube_review.settle_change(write, _cm({"a": "1"}, rv="11"), deleted=True).outcome == "succeeded"
    held = _cm({"a": "1"}, rv="11", deletionTimestamp="2026-12-07T00:00:00Z", finalizers=["x"])
    assert kube_review.settle_change(write, held).outcome == "succeeded"
    assert kube_review.settle_change(write, _cm({"a": "9"}, rv="11")).outcome == "failed"
    assert kube_review.settle_change(write, None).outcome == "failed"


def test_a_create_is_settled_by_the_object_with_the_review_s_uid():
    write = kube_review.written(_review("CREATE", _cm({"a": "1"}, uid="u-1"), None))
    assert write is not None
    found = kube_review.settle_create(write, _cm({"a": "1"}, uid="u-1", rv="12"))
    assert found is not None and found.outcome == "succeeded" and found.result is not None
    assert found.result["uid"] == "u-1"
    assert kube_review.settle_create(write, _cm({"a": "1"}, uid="someone-else")) is None
    assert kube_review.settle_create(write, None) is None
    assert kube_review.not_created(write).outcome == "failed"


@given(st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=4),
       st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=4),
       st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=4))
def test_an_update_is_succeeded_exactly_when_the_first_stored_version_holds_its_expected_state(prior, post, first):
    write = kube_review.written(_review("UPDATE", _cm(post), _cm(prior)))
    assert write is not None
    settled = kube_review.settle_change(write, _cm(first, rv="11"))
    assert (settled.outcome == "succeeded") == (first == post)
    if settled.outcome == "succeeded":
        assert settled.result is not None and settled.result["post"] == kube.user_state(_cm(post))


# --- who is recorded --------------------------------------------------------------------------------------


def _run(record: dict | None, **status: object) -> dict:
    return {"metadata": {"name": "r", "namespace": "team", "uid": "1"},
            "spec": {"manifestRef": {"name": "m"}, **({"record": record} if record else {})}, "status": status}


def test_a_run_holds_its_service_accounts_writes_in_its_namespaces_closed_or_not_until_it_is_deleted():
    assert kube_review.recorded_by(_run({"serviceAccount": "agent"})) == (AGENT, ("team",))
    assert kube_review.recorded_by(_run({"serviceAccount": "agent", "namespaces": ["b", "a"]})) == (AGENT, ("a", "b"))
    # closed: its user's writes are still sent, to be refused (the run boundary)
    assert kube_review.recorded_by(_run({"serviceAccount": "agent"}, closedBy="undo-1")) == (AGENT, ("team",))
    assert kube_review.recorded_by(_run(None)) is None
    going = copy.deepcopy(_run({"serviceAccount": "agent"}))
    going["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    assert kube_review.recorded_by(going) is None


def test_recorders_join_the_namespaces_of_every_open_run_of_a_user():
    joined = kube_review.recorders([(AGENT, ("a",)), None, (AGENT, ("b", "a")), ("u2", ("c",))])
    assert joined == {AGENT: ("a", "b"), "u2": ("c",)}


def test_the_match_condition_names_only_recorded_users_and_is_false_for_none():
    assert webhooks.recorded_users({}) == "false"
    condition = webhooks.recorded_users({AGENT: ("a", "b"), "it's": ("c",)})
    assert f"'{AGENT}': ['a', 'b']" in condition and "'it\\'s': ['c']" in condition
    assert "request.namespace) in" in condition and "'reversi.dev'" in condition
    with pytest.raises(ValueError, match="limit"):
        webhooks.recorded_users({f"u{i}": ("a",) for i in range(webhooks.MAX_RECORDED_USERS + 1)})


def test_the_recording_configuration_refuses_while_no_replica_answers_and_sees_every_namespaced_kind():
    body = webhooks.record_configuration(lambda hook: {"url": f"https://x{hook.path}"}, {AGENT: ("team",)})
    hook = body["webhooks"][0]
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "NoneOnDryRun"
    assert hook["clientConfig"] == {"url": "https://x/validate-record"}
    assert hook["rules"][0]["resources"] == ["*", "*/scale"] and hook["rules"][0]["scope"] == "Namespaced"
    assert hook["matchConditions"][0]["expression"] == webhooks.recorded_users({AGENT: ("team",)})


def test_an_attempt_whose_stored_version_is_another_steps_is_failed_with_nothing_to_undo():
    write = kube_review.Written(ref={"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "ns", "name": "web"},
                                verb="scale", tool="kube.scale", args={}, expected={}, uid="u", prior_version="7",
                                user="agent")
    settled = kube_review.claimed_by_another(write, 2)
    assert settled.outcome == "failed" and "another write's, step 2's" in settled.error
