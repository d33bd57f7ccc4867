"""A recorded call admitted by the API server alone (docs/concepts.md#admission): the SDK's step
carries its copy of the Run (``spec.runAtOpen``), crosses no webhook, is stamped by the
MutatingAdmissionPolicy and checked by the ValidatingAdmissionPolicies (halts as params, the lock
through the namespace's closed runs, forward duplicates by claims); what needs the Run is checked
after the fact by the operator (foreign steps)."""

from __future__ import annotations

import os
import threading
import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from reversi.adapters.journal import step_body
from reversi.models.runstep import step_name
from reversi.sdk import DuplicateCall, Halted, NotYourRun, OutcomeNotRecorded, Recorder, RunClosed
from tests.helpers import wait_for
from tests.integration.test_admission import _call, _halt, _recorder, users  # noqa: F401 - users is a fixture
from tests.integration.test_admission_availability import admission_down
from tests.integration.test_plugin import kr

pytestmark = pytest.mark.cluster
G, V = "reversi.dev", "v1alpha1"
FAST = {"retries": 1, "backoff": {"baseMs": 100, "maxMs": 200}}
#: rollback lock races of a recorded call: 3 here, 25 in make test-long (as for a step written by hand)
LOCK_RACES = int(os.environ.get("REVERSI_BOUNDARY_ATTEMPTS", "3"))


def test_a_recorded_call_is_stamped_by_the_api_server_and_a_halt_holds_with_no_admission_replica(
        rv, users, admin_api, namespace, operator):  # noqa: F811
    """Every admission replica SIGKILLed: calls are recorded (no webhook on the create, none on the
    outcome), stamped by the API server (principal, run label, the Run as owner; no snapshot, the
    time is the creation time), and a Halt applied meanwhile refuses the next call within 1 s."""
    rv.apply_manifest()
    rec = _recorder(users["agent-a"], namespace, "r")
    run_uid = rv.get("runs", "r")["metadata"]["uid"]
    with admission_down(operator):
        assert _call(rec) and _call(rec)
        step = rv.get("runsteps", step_name("r", 1))
        assert step["spec"]["principal"] == "agent-a" and step["spec"]["outcome"] == "succeeded"
        assert step["metadata"]["labels"]["reversi.dev/run"] == "r"
        assert [(o["kind"], o["uid"]) for o in step["metadata"]["ownerReferences"]] == [("Run", run_uid)]
        assert "snapshot" not in step["spec"] and "recordedAt" not in step["spec"]
        _halt(admin_api, namespace, "stop", "no admission replica", {"tool": "payments.*"})
        applied = time.monotonic()
        made = []
        while True:  # calls until the halt refuses one
            try:
                rec.call("payments.get_customer", {"id": "cus_9"}, lambda a: made.append(a) or {"id": "cus_9"})
            except Halted as err:
                assert "kill switch: no admission replica (Halt" in str(err)
                break
            assert time.monotonic() - applied < 1.0, "the halt was not in force within 1 s"
    wait_for(lambda: next((c for c in (rv.get("halts", "stop").get("status") or {}).get("conditions", [])
                           if c["type"] == "InForce" and c["status"] == "True"), None),
             what="the operator's probe reports the halt in force")


def test_halt_add_wait_returns_once_the_api_server_refuses(rv, cluster):
    rv.apply_manifest()
    added = kr(cluster, "halt", "add", "w", "--reason", "freeze", "--tool", "email.*", "--wait", namespace=rv.ns)
    assert added.returncode == 0 and "is in force" in added.stdout, added.stderr
    with pytest.raises(Halted):
        Recorder.open(rv.ns, "r", manifest="payments", api=rv.api).begin("email.send", {"to": "x"})


def test_a_forward_duplicate_race_admits_exactly_one_call_per_key(rv, users, namespace):  # noqa: F811
    """Two recorders of one run (two processes) race on 25 idempotency keys: each key's claim is
    one create, so exactly one call per key is recorded and the other is refused before it is made."""
    rv.apply_manifest()
    Recorder.open(namespace, "race", manifest="payments", api=users["agent-a"])
    admitted: dict[str, int] = {}
    refused: dict[str, int] = {}
    lock = threading.Lock()
    start = threading.Barrier(2)

    def agent() -> None:
        rec = Recorder.attach(namespace, "race", api=users["agent-a"])
        start.wait()
        for k in range(25):
            key = f"o-race-{k}"
            try:
                rec.begin("payments.create_charge", {"order_id": key, "amount": 1, "customer": "c"})
                with lock:
                    admitted[key] = admitted.get(key, 0) + 1
            except DuplicateCall:
                with lock:
                    refused[key] = refused.get(key, 0) + 1

    threads = [threading.Thread(target=agent) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert admitted == {f"o-race-{k}": 1 for k in range(25)}, admitted
    assert refused == {f"o-race-{k}": 1 for k in range(25)}, refused
    steps = rv.steps("race")
    assert len(steps) == 25 and sorted(s["spec"]["index"] for s in steps) == list(range(25))


def test_a_failed_call_releases_its_key(rv, admin_api):
    rv.apply_manifest()
    rec = Recorder.open(rv.ns, "rel", manifest="payments", api=admin_api)
    args = {"order_id": "o-rel", "amount": 1, "customer": "c"}
    step = rec.begin("payments.create_charge", args)
    with pytest.raises(DuplicateCall, match="like step 0, which still stands"):
        rec.begin("payments.create_charge", args)
    rec.finish(step, "failed", error="declined")
    assert rec.begin("payments.create_charge", args).index == 1


@pytest.mark.parametrize("race", range(LOCK_RACES))
def test_a_call_racing_the_lock_is_refused_or_rolled_back_never_silent(rv, admin_api, race):
    """An agent records as fast as it can while a rollback takes the run's lock: every recorded
    step is in the rollback's plan (pinned at the lock, or found by the count before it ends), and
    every later call is refused with RunClosed before it is made."""
    rv.apply_manifest()
    run = f"lock-{race}"
    rec = Recorder.open(rv.ns, run, manifest="payments", api=admin_api)
    made: list[int] = []
    closed = threading.Event()
    errors: list[BaseException] = []

    def agent() -> None:
        try:
            while True:
                step = rec.begin("payments.get_customer", {"id": "cus_9"})
                made.append(step.index)
                rec.finish(step, "succeeded", {"id": "cus_9"})
        except RunClosed:
            closed.set()
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    thread = threading.Thread(target=agent)
    thread.start()
    wait_for(lambda: len(made) >= 3 or None, what="the agent recording")
    rv.request(f"undo-{race}", run, **FAST)
    thread.join(60)
    assert not errors and closed.is_set(), errors
    done = rv.wait_phase(f"undo-{race}", "Succeeded", "Incomplete")
    planned = {a["step"] for a in done["status"]["plan"]["actions"]}
    recorded = {s["spec"]["index"] for s in rv.steps(run)}
    assert recorded == set(made) and recorded <= planned, (sorted(recorded - planned), done["status"].get("runSteps"))


def test_another_principal_is_refused_and_a_forged_step_is_never_undone(rv, users, namespace, admin_api):  # noqa: F811
    """agent-b records into agent-a's run: the SDK's copy of the Run names agent-a, so the API
    server refuses it. A step whose copy leaves the principal out is admitted, stamped with
    agent-b as its principal, and found by the operator: never undone, named in the report with
    the rule, an Event."""
    rv.apply_manifest()
    rec = _recorder(users["agent-a"], namespace, "owned")
    assert _call(rec)
    with pytest.raises(NotYourRun, match="belongs to another principal"):
        Recorder.attach(namespace, "owned", api=users["agent-b"]).begin("email.send", {"to": "x"})
    run_uid = rv.get("runs", "owned")["metadata"]["uid"]
    forged = step_body(namespace, "owned", {"index": 1, "tool": "email.send", "args": {"to": "x"},
                                            "outcome": "succeeded", "runAtOpen": {"uid": run_uid}})
    client.CustomObjectsApi(users["agent-b"]).create_namespaced_custom_object(G, V, namespace, "runsteps", forged)
    assert rv.get("runsteps", step_name("owned", 1))["spec"]["principal"] == "agent-b"
    rv.request("undo-owned", "owned", **FAST)
    done = rv.wait_phase("undo-owned", "Succeeded", "Incomplete")
    report = done["status"]["report"]
    assert [f["step"] for f in report["foreign"]] == [1] and "rule 10" in report["foreign"][0]["reason"]
    assert {a["step"] for a in done["status"]["plan"]["actions"]} == {0}, "the foreign step is not planned"
    events = client.CoreV1Api(admin_api).list_namespaced_event(namespace).items
    assert any(e.reason == "ForeignSteps" and "owned-00001" in e.message for e in events)


def test_a_step_of_a_deleted_run_is_reported_to_its_recorder(rv, admin_api):
    """The Run is deleted (and created again) between a call's intended record and its outcome:
    the step went with the Run, and the outcome write says so instead of vanishing."""
    rv.apply_manifest()
    rec = Recorder.open(rv.ns, "gone", manifest="payments", api=admin_api)
    step = rec.begin("payments.get_customer", {"id": "cus_9"})
    rv.custom.delete_namespaced_custom_object(G, V, rv.ns, "runs", "gone", propagation_policy="Foreground")

    def step_gone():
        try:
            rv.custom.get_namespaced_custom_object(G, V, rv.ns, "runsteps", step_name("gone", step.index))
        except ApiException as err:
            return err.status == 404 or None
        return None

    wait_for(step_gone, timeout=60, what="the step deleted with its Run")
    with pytest.raises(OutcomeNotRecorded, match="its Run was deleted"):
        rec.finish(step, "succeeded", {"id": "cus_9"})
