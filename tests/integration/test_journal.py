"""The sliced journal (docs/concepts.md#the-journal): one RunStep per step, at a cost that does not depend on the
run's length, with every rule of the journal still enforced — on the real control plane."""

from __future__ import annotations

import os
import threading

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from reversi.adapters.journal import step_body
from reversi.models.runstep import LABEL_FORWARD_KEY, LABEL_RUN, MAX_CALL_BYTES, MAX_RUN_STEPS, step_name
from reversi.sdk import DuplicateCall, RecordingRefused, Recorder

G, V = "reversi.dev", "v1alpha1"
pytestmark = pytest.mark.cluster
#: steps of the long run: 5,000 in ``make test-long``, fewer in ``make test`` (recording is
#: sequential per run, about 20-40 ms a step here)
LONG_RUN = int(os.environ.get("REVERSI_LONG_RUN_STEPS", "400"))


def _message(err: ApiException) -> str:
    import json

    try:
        return json.loads(err.body).get("message", "")
    except (TypeError, ValueError):
        return str(err.body)


def _record_many(rv, run: str, steps: list[dict]) -> None:
    """Create RunSteps in order of index (admission refuses a gap: one run is recorded in order)."""
    for step in steps:
        rv.create("runsteps", step_body(rv.ns, run, step))


def _open_run(rv, name: str) -> None:
    rv.create("runs", {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": name},
                       "spec": {"scope": {"actor": "test-agent"}, "manifestRef": {"name": "payments"}}})


def test_a_step_is_a_small_object_named_by_run_and_index_owned_by_the_run(rv):
    rv.apply_manifest()
    charge = rv.charge("o-shape")
    rv.run("r", [rv.step(0, "payments.get_customer", {"id": "cus_9"}, {"id": "cus_9"}),
                 rv.step(1, "payments.create_charge", {"order_id": "o-shape", "amount": 700, "customer": "cus_9"},
                         charge)])
    run = rv.get("runs", "r")
    assert "steps" not in run["spec"], "the Run carries no steps"
    step = rv.get("runsteps", "r-00001")
    assert step["metadata"]["labels"] == {LABEL_RUN: "r"}, "the API server labels a recorded call by its run"
    assert LABEL_FORWARD_KEY not in rv.get("runsteps", "r-00000")["metadata"]["labels"]
    owner = step["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Run", "r", run["metadata"]["uid"])
    assert "snapshot" not in step["spec"], "a recorded call is undone by the Run's pinned manifest"
    assert step["spec"]["runAtOpen"]["manifestRevision"] == run["spec"]["pinnedManifest"]["revision"]
    assert "payments.create_charge" in {t["name"] for t in run["spec"]["pinnedManifest"]["tools"]}
    listed = rv.custom.list_namespaced_custom_object(G, V, rv.ns, "runsteps", label_selector=f"{LABEL_RUN}=r")
    assert [s["metadata"]["name"] for s in listed["items"]] == ["r-00000", "r-00001"]


def test_two_writers_racing_on_one_run_never_get_the_same_index(rv, admin_api):
    """Two recorders append to one run at the same time; creating a name that exists fails, so
    the loser takes the next index. Proof the race happened: the recorders retried on taken names."""
    rv.apply_manifest()
    recorders = [Recorder.open(rv.ns, "race", manifest="payments", api=admin_api, scope={"actor": "test-agent"})
                 for _ in range(2)]
    start = threading.Barrier(2)
    indices: dict[tuple[int, int], int] = {}

    def write(w: int) -> None:
        start.wait()
        for i in range(40):
            step = recorders[w].begin("payments.get_customer", {"id": "cus_9", "writer": w, "call": i})
            indices[(w, i)] = step.index
            recorders[w].finish(step, "succeeded", {"id": "cus_9"})

    threads = [threading.Thread(target=write, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(indices.values()) == list(range(80)), "80 calls, 80 distinct indices 0..79"
    recorded = {(s["spec"]["args"]["writer"], s["spec"]["args"]["call"]): s["spec"]["index"] for s in rv.steps("race")}
    assert recorded == indices, "every call is recorded once, at the index its writer was given"
    assert sum(r.index_conflicts for r in recorders) > 0, "the writers did race for the same index"


def test_steps_are_recorded_in_order_with_no_gap(rv):
    rv.apply_manifest()
    _open_run(rv, "gap")
    rv.create("runsteps", step_body(rv.ns, "gap", rv.step(0, "payments.get_customer", {"id": "cus_9"})))
    with pytest.raises(ApiException) as err:
        rv.create("runsteps", step_body(rv.ns, "gap", rv.step(2, "payments.get_customer", {"id": "cus_9"})))
    assert "step 1 of Run" in _message(err.value) and "recorded in order 0, 1, 2" in _message(err.value)
    body = step_body(rv.ns, "gap", rv.step(1, "payments.get_customer", {"id": "cus_9"}))
    body["metadata"]["name"] = "gap-1"
    with pytest.raises(ApiException) as err:
        rv.create("runsteps", body)
    assert "must be named gap-00001" in _message(err.value)


def test_a_step_past_the_documented_limit_is_refused_with_the_message(rv, admin_api):
    rv.apply_manifest()
    _open_run(rv, "full")
    body = step_body(rv.ns, "full", rv.step(0, "payments.get_customer", {"id": "cus_9"}))
    body["spec"]["index"] = MAX_RUN_STEPS
    body["metadata"]["name"] = f"full-{MAX_RUN_STEPS}"
    with pytest.raises(ApiException) as err:
        rv.create("runsteps", body)
    assert err.value.status == 422
    assert f"has reached the limit of {MAX_RUN_STEPS:,} steps" in _message(err.value)
    assert "open a new Run" in _message(err.value)
    rec = Recorder.attach(rv.ns, "full", api=admin_api)
    rec._next = MAX_RUN_STEPS  # as if 100,000 steps were recorded
    called = []
    with pytest.raises(RecordingRefused, match="limit of 100,000 steps"):
        rec.call("payments.get_customer", {"id": "cus_9"}, lambda a: called.append(a))
    assert not called, "the call is never made"


def test_args_or_result_over_the_size_limit_are_refused_by_name(rv, admin_api):
    rv.apply_manifest()
    rec = Recorder.open(rv.ns, "big-args", manifest="payments", api=admin_api)
    called = []
    with pytest.raises(RecordingRefused) as err:
        rec.call("payments.get_customer", {"id": "cus_9", "blob": "x" * (MAX_CALL_BYTES + 1)},
                 lambda a: called.append(a))
    assert f"more than the limit of {MAX_CALL_BYTES} bytes" in err.value.message and "args" in err.value.message
    assert not called and rv.steps("big-args") == []
    step = rec.begin("payments.get_customer", {"id": "cus_9"})
    with pytest.raises(Exception) as err2:
        rec.finish(step, "succeeded", {"blob": "y" * (MAX_CALL_BYTES + 1)})
    assert "result is" in str(err2.value) and "stays intended" in str(err2.value)
    assert rv.get("runsteps", step_name("big-args", step.index))["spec"]["outcome"] == "intended"


def test_a_forward_duplicate_is_found_in_a_long_run(rv, admin_api):
    """The earlier standing call with the same forward key is found by its claim (one create whose
    name is taken), not by reading the run: step 17 of a long run (5,000 steps in make test-long)
    still blocks a repeat at its end; a call settled failed does not."""
    rv.apply_manifest()
    Recorder.open(rv.ns, "long", manifest="payments", api=admin_api)
    late = LONG_RUN - 100
    for i in range(LONG_RUN):
        if i in (17, late):  # the keyed calls, recorded by the SDK: each claims its key
            rec = Recorder.attach(rv.ns, "long", api=admin_api)
            step = rec.begin("payments.create_charge", {"order_id": f"o-dup-{i}", "amount": 1, "customer": "cus_9"})
            assert step.index == i
            rec.finish(step, "succeeded" if i == 17 else "uncertain", {"id": f"ch_{i}"})
        else:
            _record_many(rv, "long", [rv.step(i, "payments.get_customer", {"id": "cus_9", "page": i},
                                              {"id": "cus_9"})])
    rec = Recorder.attach(rv.ns, "long", api=admin_api)
    called = []
    with pytest.raises(DuplicateCall, match="like step 17, which still stands"):
        rec.call("payments.create_charge", {"order_id": "o-dup-17", "amount": 1, "customer": "cus_9"},
                 lambda a: called.append(a))
    assert not called, "the repeat is refused before the call is made"
    with pytest.raises(DuplicateCall, match=f"like step {late}"):  # uncertain: it may stand
        rec.begin("payments.create_charge", {"order_id": f"o-dup-{late}", "amount": 1, "customer": "cus_9"})
    rv.resolve("long", late, status="failed", note="the payments API has no such charge")
    step = rec.begin("payments.create_charge", {"order_id": f"o-dup-{late}", "amount": 1, "customer": "cus_9"})
    assert step.index == LONG_RUN, "a call settled failed no longer stands: its repeat is admitted"


# Append-only, and a RunStep deleted only with its Run: tests/integration/test_admission.py
# (test_a_recorded_runstep_is_append_only, test_a_resolution_cannot_be_swapped_out_and_back_in,
# test_a_runstep_is_deleted_only_with_its_run). Here: the webhook's own check of rule 10, for a
# client that sends no runAtOpen.
def test_another_principal_cannot_record_or_change_steps(rv, cluster):
    rv.apply_manifest()
    rv.run("r", [rv.step(0, "payments.get_customer", {"id": "cus_9"}, outcome="intended")])
    from kubernetes import config

    rbac = client.RbacAuthorizationV1Api(rv.api)
    rbac.create_namespaced_role(rv.ns, {"metadata": {"name": "rec"}, "rules": [
        {"apiGroups": [G], "resources": ["runs", "runsteps"], "verbs": ["get", "list", "create", "patch"]}]})
    rbac.create_namespaced_role_binding(rv.ns, {"metadata": {"name": "rec"},
                                                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                            "name": "rec"},
                                                "subjects": [{"kind": "User", "name": "mallory"}]})
    mallory = client.CustomObjectsApi(config.new_client_from_config(
        config_file=str(cluster.kubeconfig_for("mallory", ("agents",)))))
    with pytest.raises(ApiException) as err:
        mallory.create_namespaced_custom_object(G, V, rv.ns, "runsteps",
                                                step_body(rv.ns, "r", rv.step(1, "payments.get_customer", {"id": "x"})))
    assert err.value.status == 403 and "belongs to another principal" in _message(err.value)
    with pytest.raises(ApiException) as err:
        mallory.patch_namespaced_custom_object(G, V, rv.ns, "runsteps", "r-00000", {"spec": {"outcome": "failed"}})
    assert "belongs to another principal" in _message(err.value)
