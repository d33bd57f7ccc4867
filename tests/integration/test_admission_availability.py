"""Recording while parts are down: the admission server apart from the operator, the SDK across an
admission gap, and the outcome write checked by the API server itself.

docs/operations.md#admission-where-each-rule-is-enforced says which rule is enforced where; these
tests stop the operator or every admission replica and check what an agent, and the journal, see.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from reversi.adapters import apicalls
from reversi.adapters.journal import step_body
from reversi.adapters.webhooks import RESULT_CEILING_BYTES
from reversi.models.runstep import step_name
from reversi.sdk import Halted, OutcomeNotRecorded, Recorder
from tests.integration.test_admission import _call, _halt, _recorder, users  # noqa: F401 - users is a fixture

pytestmark = pytest.mark.cluster
G, V = "reversi.dev", "v1alpha1"


@contextlib.contextmanager
def admission_down(operator):
    """Every admission replica SIGKILLed for the body (no webhook answers); started again after."""
    assert operator.admission is not None, "the test operator runs with its admission server"
    operator.admission.kill()
    try:
        yield
    finally:
        operator.admission.start()


@pytest.fixture
def operator_down(operator):
    """The operator SIGKILLed for the body (its admission server keeps running); started again after."""
    operator.kill()
    try:
        yield
    finally:
        operator.start()


def test_a_halt_refuses_calls_while_the_operator_is_stopped(rv, users, admin_api, namespace, operator_down):  # noqa: F811
    """The kill switch does not depend on the reconciling operator: the admission server refuses a
    matching call, names the halt, and nothing is recorded."""
    rv.apply_manifest()
    rec = _recorder(users["agent-a"], namespace, "r")
    assert _call(rec) is True
    _halt(admin_api, namespace, "stop", "operator down, calls must still stop", {"tool": "payments.*"})
    made = []
    with pytest.raises(Halted) as err:
        rec.call("payments.get_customer", {"id": "cus_9"}, lambda a: made.append(a) or {"id": "cus_9"})
    assert made == [] and "kill switch: operator down, calls must still stop" in str(err.value)
    assert [s["spec"]["index"] for s in rv.steps("r")] == [0]


def test_a_call_recorded_during_an_admission_gap_waits_and_is_recorded(rv, users, namespace, operator):  # noqa: F811
    """Every admission replica is down for about 3 s: a write that crosses the webhook (here a
    step of a Run opened before its ToolManifest existed, so it has no pinned manifest) is refused
    with "failed calling webhook" (never landed), so the SDK tries it again and the agent's call is
    recorded once the webhooks answer; the call is made once. (A recorded call of a Run with a
    pinned manifest crosses no webhook and does not wait: test_recording_policies.py.)"""
    rec = _recorder(users["agent-a"], namespace, "r")
    assert "pinnedManifest" not in rv.get("runs", "r")["spec"]
    rv.apply_manifest()
    operator.admission.kill()
    restarted = threading.Timer(3.0, operator.admission.start)
    restarted.start()
    try:
        # the gap is real: a bare write (no retry) is refused because no webhook answers
        body = step_body(namespace, "r", {"index": 0, "tool": "payments.get_customer", "args": {"id": "x"},
                                          "outcome": "intended"})
        with pytest.raises(ApiException) as err:
            client.CustomObjectsApi(users["agent-a"]).create_namespaced_custom_object(G, V, namespace, "runsteps", body)
        assert apicalls.admission_unreachable(err.value), err.value.body
        started = time.monotonic()
        made = []
        rec.call("payments.get_customer", {"id": "cus_9"}, lambda a: made.append(a) or {"id": "cus_9"})
        waited = time.monotonic() - started
    finally:
        restarted.join()
    assert made == [{"id": "cus_9"}], "the call is made once, after its intended record landed"
    assert waited > 0.5, f"the call did not wait for the admission server ({waited:.2f} s): the gap was not overlapped"
    steps = rv.steps("r")
    assert [(s["spec"]["index"], s["spec"]["outcome"]) for s in steps] == [(0, "succeeded")]
    assert steps[0]["spec"]["principal"] == "agent-a", "stamped by the admission server"


def test_the_outcome_write_is_checked_by_the_api_server_with_no_admission_server(rv, users, namespace,  # noqa: F811
                                                                                 operator):
    """The outcome write crosses no webhook: with every admission replica down, the step's principal
    records its outcome, and another user is refused by the API server's own policy (rule 10)."""
    rv.apply_manifest()
    rec = _recorder(users["agent-a"], namespace, "r")
    step = rec.begin("payments.get_customer", {"id": "cus_9"})
    patch = [{"op": "replace", "path": "/spec/outcome", "value": "failed"}]
    with admission_down(operator):
        with pytest.raises(ApiException) as err:
            client.CustomObjectsApi(users["agent-b"]).patch_namespaced_custom_object(
                G, V, namespace, "runsteps", step_name("r", step.index), patch,
                _content_type="application/json-patch+json")
        message = json.loads(err.value.body)["message"]
        assert err.value.status == 403 and "belongs to another principal (agent-a); agent-b may not" in message, \
            message
        assert "ValidatingAdmissionPolicy" in message, "refused by the API server's policy, not a webhook"
        rec.finish(step, "succeeded", {"id": "cus_9"})  # no webhook answers, and none is needed
    assert rv.steps("r")[0]["spec"]["outcome"] == "succeeded"


def test_a_result_past_the_ceiling_is_refused_by_name(rv, users, namespace):  # noqa: F811
    """A result over the limit is refused before the write by the SDK (64 KiB of JSON), and by the
    API server for any client past its ceiling: never an etcd error."""
    rv.apply_manifest()
    rec = _recorder(users["agent-a"], namespace, "r")
    step = rec.begin("payments.get_customer", {"id": "cus_9"})
    with pytest.raises(OutcomeNotRecorded) as refused:
        rec.finish(step, "succeeded", {"blob": "x" * (70 * 1024)})
    assert "more than the limit of 65536 bytes per step" in refused.value.message
    patch = [{"op": "replace", "path": "/spec/outcome", "value": "succeeded"},
             {"op": "add", "path": "/spec/result", "value": {"blob": "x" * (RESULT_CEILING_BYTES + 10)}}]
    with pytest.raises(ApiException) as err:
        client.CustomObjectsApi(users["agent-a"]).patch_namespaced_custom_object(
            G, V, namespace, "runsteps", step_name("r", step.index), patch,
            _content_type="application/json-patch+json")
    message = json.loads(err.value.body)["message"]
    assert err.value.status == 422 and "past the limit of 65536 bytes of JSON per step" in message, message
    assert rv.steps("r")[0]["spec"]["outcome"] == "intended"


def test_a_step_carries_its_principal_and_it_never_changes(rv, users, namespace):  # noqa: F811
    """``spec.principal`` is stamped from the authenticated user whatever the client sent, and
    the CRD refuses to change or drop it."""
    rv.apply_manifest()
    Recorder.open(namespace, "r", manifest="payments", api=users["agent-a"], scope={"actor": "a"})
    body = step_body(namespace, "r", {"index": 0, "tool": "payments.get_customer", "args": {"id": "x"},
                                      "outcome": "intended", "principal": "someone-else"})
    custom = client.CustomObjectsApi(users["agent-a"])
    created = custom.create_namespaced_custom_object(G, V, namespace, "runsteps", body)
    assert created["spec"]["principal"] == "agent-a"
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object(G, V, namespace, "runsteps", step_name("r", 0),
                                              [{"op": "replace", "path": "/spec/principal", "value": "agent-b"}],
                                              _content_type="application/json-patch+json")
    assert err.value.status == 422 and "spec.principal is stamped when the step is recorded" in err.value.body


def test_a_steps_owner_is_put_back_when_another_user_changes_it(rv, users, namespace):  # noqa: F811
    """The Run as owner is the server's stamp: a patch that points it at another uid (so the step
    would no longer follow its Run, or would be collected as an orphan) is admitted with the
    owner put back, like the run label."""
    rv.apply_manifest()
    rec = _recorder(users["agent-a"], namespace, "r")
    step = rec.begin("payments.get_customer", {"id": "cus_9"})
    before = rv.steps("r")[0]["metadata"]["ownerReferences"]
    patch = [{"op": "replace", "path": "/metadata/ownerReferences/0/uid",
              "value": "00000000-0000-0000-0000-000000000001"}]
    client.CustomObjectsApi(users["agent-b"]).patch_namespaced_custom_object(
        G, V, namespace, "runsteps", step_name("r", step.index), patch, _content_type="application/json-patch+json")
    after = rv.steps("r")[0]["metadata"]["ownerReferences"]
    assert after == before and after[0]["uid"] == rv.get("runs", "r")["metadata"]["uid"]


def test_a_run_and_a_namespace_are_deleted_with_their_steps_while_no_admission_replica_answers(
        rv, users, admin_api, namespace, operator):  # noqa: F811
    """A RunStep is deleted only with its Run: the garbage collector (the Run is gone) and the
    namespace controller (the namespace goes) delete steps without a review
    (``webhooks.CLEANUP_MATCH``), so deleting a Run or a namespace does not wait for an admission
    replica. Anyone else's delete of a step still needs one: with none answering it is refused."""
    from tests.helpers import wait_for
    from tests.integration.conftest import manifest_body

    rv.apply_manifest()
    rec = _recorder(users["agent-a"], namespace, "gone")
    assert _call(rec) and _call(rec)
    core, custom = client.CoreV1Api(admin_api), client.CustomObjectsApi(admin_api)
    other = f"{namespace}-doomed"
    core.create_namespace({"metadata": {"name": other}})
    custom.create_namespaced_custom_object(G, V, other, "toolmanifests", manifest_body(rv.downstream.url))
    assert _call(Recorder.open(other, "doomed", manifest="payments", api=admin_api, scope={"actor": "a"}))
    assert custom.list_namespaced_custom_object(G, V, other, "runsteps")["items"]
    with admission_down(operator):
        with pytest.raises(ApiException) as err:  # a user's delete of a step is still reviewed
            custom.delete_namespaced_custom_object(G, V, namespace, "runsteps", step_name("gone", 0))
        assert apicalls.admission_unreachable(err.value), err.value.body
        custom.delete_namespaced_custom_object(G, V, namespace, "runs", "gone")
        core.delete_namespace(other)
        wait_for(lambda: not rv.steps("gone"), timeout=60,
                 what="the deleted Run's steps deleted by the garbage collector")

        def namespace_gone() -> bool:
            try:
                core.read_namespace(other)
            except ApiException as gone:
                return gone.status == 404
            return False

        wait_for(namespace_gone, timeout=90, what=f"namespace {other} deleted with its Run and steps")
