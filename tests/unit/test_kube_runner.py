"""reversi-kube-runner's act step (docs/concepts.md#built-in-kubernetes-compensation): what it
writes for each decision of the engine, and its refusals, against an in-memory stand-in for the
API (the decisions themselves are tests/unit/test_kube_family_rules.py; the cluster test is
tests/integration/test_kube_family.py)."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from reversi.adapters import apicalls
from reversi.engine import kube
from reversi.entrypoints import kube_runner

NS = "shop"


def configmap(color: str, rv: str = "5", uid: str = "u-1") -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": NS, "uid": uid, "resourceVersion": rv},
            "data": {"color": color}}


REF = {"apiVersion": "v1", "kind": "ConfigMap", "namespace": NS, "name": "settings"}


class Objects:
    """One object, or none; records every write."""

    def __init__(self, live: dict | None, fail: ApiException | Exception | None = None):
        self.live, self.fail, self.writes = live, fail, []

    def get(self, ref):
        return self.live

    def _write(self, what, *args):
        if self.fail is not None:
            raise self.fail
        self.writes.append((what, *args))

    def delete(self, ref, uid="", resource_version=""):
        self._write("delete", uid, resource_version)

    def create(self, body, repeat="unsent"):
        self._write("create", body)

    def replace(self, body):
        self._write("replace", body)


def args(prior: dict | None, post: dict | None) -> dict:
    return {"ref": REF, "prior": kube.user_state(prior), "post": kube.user_state(post)}


def test_an_update_is_undone_by_a_write_of_the_prior_content_on_the_live_resource_version():
    objects = Objects(configmap("green", rv="9"))
    kube_runner.restore(objects, args(configmap("blue"), configmap("green")), forced=False)
    ((what, body),) = objects.writes
    assert what == "replace" and body["data"] == {"color": "blue"} and body["metadata"]["resourceVersion"] == "9"


def test_a_create_is_undone_by_a_delete_with_the_uid_as_precondition_and_a_delete_by_a_create():
    objects = Objects(configmap("red", uid="u-7"))
    kube_runner.restore(objects, args(None, configmap("red", uid="u-7")), forced=False)
    assert objects.writes == [("delete", "u-7", "5")]
    objects = Objects(None)
    kube_runner.restore(objects, args(configmap("blue"), None), forced=False)
    ((what, body),) = objects.writes
    assert what == "create" and body["data"] == {"color": "blue"} and "resourceVersion" not in body["metadata"]


def test_a_change_since_is_refused_with_its_differences_unless_forced_and_nothing_is_written():
    objects = Objects(configmap("red"))
    with pytest.raises(kube_runner.Refused, match=r'changed since: .*data.color: recorded "green", live "red"'):
        kube_runner.restore(objects, args(configmap("blue"), configmap("green")), forced=False)
    assert objects.writes == []
    kube_runner.restore(objects, args(configmap("blue"), configmap("green")), forced=True)
    assert [w[0] for w in objects.writes] == ["replace"]


def test_an_object_already_at_its_prior_state_is_left_alone():
    objects = Objects(configmap("blue"))
    assert "nothing to do" in kube_runner.restore(objects, args(configmap("blue"), configmap("green")), forced=False)
    assert objects.writes == []


def test_a_missing_right_names_the_verb_and_the_object_and_a_lost_race_says_the_next_attempt_decides():
    objects = Objects(configmap("green"), fail=ApiException(status=403, reason="Forbidden"))
    with pytest.raises(kube_runner.Refused, match="update ConfigMap shop/settings is forbidden to this runner's "
                                                  "service account: grant it update"):
        kube_runner.restore(objects, args(configmap("blue"), configmap("green")), forced=False)
    objects = Objects(configmap("green"), fail=apicalls.Conflict("the object has been modified"))
    with pytest.raises(kube_runner.Refused, match="changed while it was being restored"):
        kube_runner.restore(objects, args(configmap("blue"), configmap("green")), forced=False)


def test_the_reader_answers_with_the_differences_against_the_state_it_is_given():
    answer = kube_runner.read(Objects(configmap("red")), {"ref": REF, "state": kube.user_state(configmap("blue"))})
    assert answer == {"matches": False, "differences": ['data.color: recorded "blue", live "red"']}


@pytest.mark.parametrize("call, message", [
    ({"tool": "payments.refund", "args": {}}, "runs kube.restore"),
    ({"tool": "kube.restore", "args": {"prior": {}}}, 'with a "ref" object'),
    ({"tool": "kube.matches", "arguments": {"ref": {"kind": "ConfigMap"}}}, "ref.apiVersion is missing"),
])
def test_a_malformed_call_exits_2_with_what_is_wrong(tmp_path, call, message):
    log = tmp_path / "termination-log"
    env = {"REVERSI_CALL": json.dumps(call), "REVERSI_TERMINATION_LOG": str(log)}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        assert kube_runner.main([]) == 2
    assert message in log.read_text()


def test_the_principals_groups_are_those_the_api_server_gives_every_such_user():
    assert kube_runner.groups_of("system:serviceaccount:shop:agent") == [
        "system:serviceaccounts", "system:serviceaccounts:shop", "system:authenticated"]
    assert kube_runner.groups_of("alice") == ["system:authenticated"]


def test_a_step_recorded_at_admission_is_known_by_the_mark_only_the_admission_server_may_set():
    """docs/concepts.md#recording-with-no-agent-code: its states are the API server's own."""
    marked = {"spec": {"runAtOpen": {"uid": "r", "recordedAtAdmission": True}}}
    assert kube_runner.recorded_at_admission(Objects(marked), f"{NS}/run", 3) is True
    assert kube_runner.recorded_at_admission(Objects({"spec": {"runAtOpen": {"uid": "r"}}}), f"{NS}/run", 3) is False
    assert kube_runner.recorded_at_admission(Objects(None), f"{NS}/run", 3) is False
    assert kube_runner.recorded_at_admission(Objects(marked), f"{NS}/run", None) is False


def test_a_recording_runs_principal_is_the_service_account_it_records():
    run = {"spec": {"principal": "alice", "record": {"serviceAccount": "agent"}}}
    principal = kube_runner.principal_of(Objects(run), f"{NS}/run")
    assert principal.user == f"system:serviceaccount:{NS}:agent"
    assert kube_runner.principal_of(Objects({"spec": {"principal": "alice"}}), f"{NS}/run").user == "alice"
