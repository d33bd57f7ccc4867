"""Rules 1–8 (docs/concepts.md#rollback-rules) and the report, on the real control plane with real Jobs.

Every compensator and reader is ``demo/downstream/tool.py`` run by the node agent as a Job pod;
the downstream server keeps real state, so each test also checks what really happened there.
"""

from __future__ import annotations

import sys
import time

import pytest
from kubernetes.client.rest import ApiException

from reversi.engine.keys import snapshot_id
from reversi.models.runstep import LABEL_RUN
from reversi.models.toolmanifest import ToolSpec

from tests.helpers import wait_for
from tests.integration.conftest import TOOL

pytestmark = pytest.mark.cluster


def _charge_step(rv, index, order, **kw):
    charge = rv.charge(order)
    return rv.step(index, "payments.create_charge", {"order_id": order, "amount": 700, "customer": "cus_9"},
                   charge, **kw), charge


def _charge_steps(rv, n: int, prefix: str) -> tuple[list[dict], list[dict]]:
    """``n`` independent charge steps (orders ``<prefix>-0`` ...) and their charges."""
    pairs = [_charge_step(rv, i, f"{prefix}-{i}") for i in range(n)]
    return [step for step, _ in pairs], [charge for _, charge in pairs]


def test_rule2_dry_run_plans_the_design_example_and_changes_nothing(rv):
    rv.apply_manifest()
    s1, charge = _charge_step(rv, 1, "o-dry")
    rv.run("order-4711", [
        rv.step(0, "payments.get_customer", {"id": "cus_9"}, {"id": "cus_9"}),
        s1,
        rv.step(2, "payments.capture", {"charge_id": charge["id"]}, outcome="uncertain"),
        rv.step(3, "email.send", {"to": "customer"}, {"id": "msg_1"}),
    ])
    rv.request("plan-only", "order-4711", dryRun=True)
    req = rv.wait_phase("plan-only", "Planned", timeout=30)
    actions = {a["step"]: a for a in req["status"]["plan"]["actions"]}
    assert actions[3]["kind"] == "unrecoverable" and "the customer has read the email" in actions[3]["reason"]
    assert actions[2]["kind"] == "unresolved"
    assert actions[1]["kind"] == "defer" and actions[1]["blockedBy"] == [2]
    assert 0 not in actions or actions[0]["kind"] == "skip"
    assert req["status"]["plan"]["fullyReversible"] is False
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is False
    assert rv.batch.list_namespaced_job(rv.ns).items == []


def test_rule5_compensated_step_is_verified_by_a_reader_job(rv):
    rv.apply_manifest()
    s0, charge = _charge_step(rv, 0, "o-verify")
    rv.run("r", [s0])
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete")
    assert req["status"]["phase"] == "Succeeded", req["status"]
    report = req["status"]["report"]
    assert report["compensated"] == [0] and report["complete"] is True
    assert report["residue"] == [{"step": 0, "type": "declared",
                                  "text": "the charge stays visible on the customer's statement"}]
    entry = rv.step_status(req, 0)
    assert rv.condition(entry, "Compensated")["status"] == "True"
    assert rv.condition(entry, "Verified")["reason"] == "Verified"
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    [undo] = rv.undo("r")  # the undo state is on the step's RunStep (status.undo)
    assert undo["step"] == 0
    assert undo["state"] == "compensated" and undo["verification"] == "verified" and undo["attempts"] == 1
    assert len(undo["idempotencyKey"]) == 64
    assert "undo" not in (rv.get("runs", "r").get("status") or {}), "the Run keeps no per-step undo state"


def test_rule1_dependents_are_undone_first_newest_first(rv):
    rv.apply_manifest(capture_needs_approval=False)
    s0, charge = _charge_step(rv, 0, "o-order")
    capture = rv.capture(charge["id"])
    reservation = rv.reserve("o-order")
    rv.run("r", [s0,
                 rv.step(1, "payments.capture", {"charge_id": charge["id"]}, capture),
                 rv.step(2, "inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-order"}, reservation,
                         depends_on=[0])])
    started = time.time()
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete")
    assert req["status"]["report"]["compensated"] == [0, 1, 2], req["status"]["report"]
    calls = [c for c in rv.downstream.state()["calls"] if c["at"] > started and not c["replayed"]]

    def undone(path):  # the step each undo call belongs to
        if path.endswith("/release"):
            return 2
        if path.endswith("/void"):
            return 1
        return 0 if path == "/payments/refunds" else None

    order = [undone(c["path"]) for c in calls if undone(c["path"]) is not None]
    # every step named, in order: newest first (2, then 1), and the charge (0) only after both of
    # its dependents (1 requires it, 2 dependsOn it); one real undo call per step
    assert order == [2, 1, 0], calls
    jobs = rv.batch.list_namespaced_job(rv.ns, label_selector="reversi.dev/role=compensator").items
    assert sorted(int(j.metadata.labels["reversi.dev/step"]) for j in jobs) == [0, 1, 2]


def test_rule1_parallelism_bounds_the_compensations_under_way_at_the_downstream(rv):
    """``parallelism: 2`` over six independent charges, counted at the downstream: every refund
    is in flight for 1.5 s (its effect is recorded when it arrives, its answer comes 1.5 s
    later), and at most two are ever in flight at once — and two are, so the bound is met by
    overlapping work, not by running one at a time. Each read-back takes 1.5 s too; that a step
    being read back holds no slot is the schedule's rule, shown in tests/unit/test_engine_schedule.py."""
    rv.apply_manifest()
    steps, charges = _charge_steps(rv, 6, "o-par")
    rv.run("r", steps)
    rv.downstream.fault("/payments/refunds", "timeout", times=6, delay_s=1.5)
    rv.downstream.fault("/payments/charges/", "timeout", times=6, delay_s=1.5)
    started = time.time()
    rv.request("undo", "r", parallelism=2)
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", timeout=180)
    assert req["status"]["report"]["compensated"] == list(range(6)), req["status"]["report"]
    refunds = sorted(c["at"] for c in rv.downstream.calls("/payments/refunds", since=started))
    assert len(refunds) == 6, refunds
    # refunds in flight when each one arrived: those that arrived before it and are not answered yet
    in_flight = [sum(1 for other in refunds[:i + 1] if other + 1.5 > at) for i, at in enumerate(refunds)]
    assert max(in_flight) == 2, (in_flight, [round(at - started, 2) for at in refunds])
    assert all(c["refunded"] for c in (rv.downstream.get(f"/payments/charges/{ch['id']}") for ch in charges))


def test_rule1_step_is_deferred_while_dependent_stands(rv):
    rv.apply_manifest(capture_needs_approval=False)
    s0, charge = _charge_step(rv, 0, "o-defer")
    rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, outcome="uncertain"),
                 rv.step(2, "email.send", {"to": "c"}, {"id": "m"})])
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Incomplete")
    report = req["status"]["report"]
    assert report["deferred"] == [{"step": 0, "blockedBy": [1]}]
    assert report["unresolved"] == [1]
    assert report["unrecoverable"][0]["step"] == 2
    assert report["complete"] is False
    entry = rv.step_status(req, 0)
    assert rv.condition(entry, "Compensated")["reason"] == "Blocked"
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is False


def test_rule4_failing_compensation_is_retried_with_the_same_key(rv):
    rv.apply_manifest()
    s0, _charge = _charge_step(rv, 0, "o-retry")
    rv.run("r", [s0])
    rv.downstream.fault("/payments/refunds", "error", times=2)
    rv.request("undo", "r", retries=4, backoff={"baseMs": 100, "maxMs": 400})
    req = rv.wait_phase("undo", "Succeeded", "Incomplete")
    assert req["status"]["phase"] == "Succeeded", req["status"]
    entry = rv.step_status(req, 0)
    assert entry["attempts"] == 3
    jobs = rv.batch.list_namespaced_job(rv.ns, label_selector="reversi.dev/role=compensator").items
    keys = {rv.secret_env(j, "REVERSI_IDEMPOTENCY_KEY") for j in jobs}
    assert len(keys) == 1, "every attempt carries the same idempotency key"
    assert len(rv.downstream.calls("/payments/refunds", since=rv.started)) == 1
    events = rv.core.list_namespaced_event(rv.ns, field_selector="involvedObject.name=undo").items
    assert sum(1 for e in events if e.reason == "CompensationRetrying") == 2


def test_rule4_compensation_fails_after_retries_with_error_and_attempts(rv):
    rv.apply_manifest()
    s0, charge = _charge_step(rv, 0, "o-fail")
    rv.run("r", [s0])
    rv.downstream.fault("/payments/refunds", "error", times=10)
    rv.request("undo", "r", retries=2, backoff={"baseMs": 100, "maxMs": 200})
    req = rv.wait_phase("undo", "Incomplete")
    report = req["status"]["report"]
    assert report["failed"][0]["step"] == 0
    assert "after 2 attempts" in report["failed"][0]["error"]
    assert "injected fault" in report["failed"][0]["error"]
    [undo] = rv.undo("r")
    assert undo["state"] == "compensationFailed" and undo["attempts"] == 2
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is False


def test_rule5_verification_mismatch_names_the_field_and_fails_the_step(rv):
    rv.apply_manifest(expect={"status": "canceled"})
    s0, _charge = _charge_step(rv, 0, "o-mismatch")
    rv.run("r", [s0])
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Incomplete")
    failed = req["status"]["report"]["failed"]
    assert failed[0]["step"] == 0
    assert 'status is "refunded", expected "canceled"' in failed[0]["error"]
    entry = rv.step_status(req, 0)
    assert rv.condition(entry, "Verified")["reason"] == "VerificationFailed"
    assert entry["reads"] == 2  # retries: 2 read-backs, then the verdict
    assert rv.undo("r")[0]["state"] == "compensationFailed"


def test_rule5_reader_printing_no_json_is_a_failed_read(rv):
    rv.apply_manifest(reader_command=["sh", "-c", "echo this is not json"])
    s0, _ = _charge_step(rv, 0, "o-nojson")
    rv.run("r", [s0])
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Incomplete")
    error = req["status"]["report"]["failed"][0]["error"]
    assert "read failed" in error and "no JSON" in error
    assert rv.condition(rv.step_status(req, 0), "Verified")["reason"] == "ReadFailed"


def test_rule5_a_read_back_that_ran_out_of_its_deadline_is_read_again_without_counting(rv):
    """The first read-back hangs (the downstream answers its GET after 30 s) until its Job's
    4 s deadline ends it: no answer, a lost read. The step reads again without counting it
    against verification.retries (2) and is verified; the downstream saw one refund."""
    rv.apply_manifest(reader_command=[sys.executable, str(TOOL)], reader_deadline_seconds=4)
    s0, charge = _charge_step(rv, 0, "o-lost-read")
    rv.run("r", [s0])
    rv.downstream.fault(f"/payments/charges/{charge['id']}", "timeout", times=1, delay_s=30)
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", timeout=120)
    assert req["status"]["phase"] == "Succeeded", req["status"]["report"]
    step = rv.step_status(req, 0)
    # a busy machine may lose one more read to the 4 s deadline: each lost read is one more read
    assert step.get("lostReads", 0) >= 1 and step["reads"] == step["lostReads"] + 1, step
    assert rv.condition(step, "Verified")["reason"] == "Verified"
    events = rv.core.list_namespaced_event(rv.ns, field_selector="involvedObject.name=undo").items
    lost = [e.message for e in events if e.reason == "ReadBackLost"]
    assert len(lost) == step["lostReads"] and "DeadlineExceeded" in lost[0], lost
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    assert len(rv.downstream.calls("/payments/refunds", since=rv.started)) == 1


def test_rule5_no_reader_runner_means_unverified_and_incomplete(rv):
    rv.apply_manifest(reader=False)
    s0, charge = _charge_step(rv, 0, "o-noreader")
    rv.run("r", [s0])
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Incomplete")
    report = req["status"]["report"]
    assert report["unverified"] == [0] and report["compensated"] == [] and report["complete"] is False
    assert rv.condition(rv.step_status(req, 0), "Verified")["reason"] == "NoReader"
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True


def test_rule5_unresolvable_verification_arguments_fail_the_step(rv):
    extra = [{"name": "payments.charge_without_id", "effect": "write",
              "compensation": {"tool": "payments.refund", "kind": "compensation",
                               "args": {"charge_id": "$args.charge_id"}, "runner": "tools"},
              "verification": {"tool": "payments.get_charge", "args": {"charge_id": "$result.id"},
                               "expect": {"refunded": True}, "runner": "tools"}}]
    rv.apply_manifest(extra_tools=extra)
    charge = rv.charge("o-noargs")
    rv.run("r", [rv.step(0, "payments.charge_without_id", {"charge_id": charge["id"]}, {"ok": True})])
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Incomplete")
    error = req["status"]["report"]["failed"][0]["error"]
    assert error.startswith("cannot verify: arguments unavailable")
    assert rv.condition(rv.step_status(req, 0), "Verified")["reason"] == "VerificationArgumentsUnavailable"


def test_rule6_rerun_skips_compensated_and_retries_failed_with_the_same_key(rv):
    rv.apply_manifest()
    s0, _charge0 = _charge_step(rv, 0, "o-rerun-a")
    s1, _charge1 = _charge_step(rv, 1, "o-rerun-b")
    rv.run("r", [s0, s1])
    # the newest step (1) is undone first: make its refund fail for the whole first request
    rv.downstream.fault("/payments/refunds", "error", times=2)
    rv.request("first", "r", retries=2, backoff={"baseMs": 50, "maxMs": 100})
    first = rv.wait_phase("first", "Incomplete")
    assert [f["step"] for f in first["status"]["report"]["failed"]] == [1]
    assert first["status"]["report"]["compensated"] == [0]
    key1 = {u["step"]: u["idempotencyKey"] for u in rv.undo("r")}
    rv.request("second", "r")
    second = rv.wait_phase("second", "Succeeded", "Incomplete")
    assert second["status"]["phase"] == "Succeeded", second["status"]
    assert second["status"]["report"]["compensated"] == [0, 1]
    undo = {u["step"]: u for u in rv.undo("r")}
    assert undo[1]["attempts"] == 3 and undo[1]["idempotencyKey"] == key1[1]
    assert undo[0]["request"] == "first", "a compensated step is never redone"
    assert len(rv.downstream.calls("/payments/refunds", since=rv.started)) == 2  # one real refund per charge


def test_rule6_two_requests_never_run_one_compensation_twice(rv):
    rv.apply_manifest()
    steps, _ = _charge_steps(rv, 3, "o-two")
    rv.run("r", steps)
    rv.request("a", "r")
    rv.request("b", "r")

    def one_works_the_other_waits():
        phases = {n: (rv.get("rollbackrequests", n).get("status") or {}).get("phase") for n in ("a", "b")}
        waiting = [n for n, p in phases.items() if p == "Waiting"]
        working = [n for n, p in phases.items() if p in ("Running", "AwaitingApproval")]
        return (working[0], waiting[0]) if waiting and working else None

    first, second = wait_for(one_works_the_other_waits, timeout=60, interval=0.05,
                             what="one request Running while the other is Waiting")
    waiting = rv.get("rollbackrequests", second)
    assert rv.condition(waiting["status"], "Running")["reason"] == "WaitingForRun"
    assert first in rv.condition(waiting["status"], "Running")["message"]
    a = rv.wait_phase("a", "Succeeded", "Incomplete")
    b = rv.wait_phase("b", "Succeeded", "Incomplete")
    assert a["status"]["phase"] == b["status"]["phase"] == "Succeeded"
    assert sorted(a["status"]["report"]["compensated"]) == sorted(b["status"]["report"]["compensated"]) == [0, 1, 2]
    assert len(rv.downstream.calls("/payments/refunds", since=rv.started)) == 3
    jobs = rv.batch.list_namespaced_job(rv.ns, label_selector="reversi.dev/role=compensator").items
    assert len(jobs) == 3
    assert {j.metadata.annotations["reversi.dev/request"]
            for j in jobs} == {first}, "only the request that worked ran compensators"
    assert {u["request"] for u in rv.undo("r")} == {first}


def test_rule7_resolved_uncertain_step_is_compensated_with_the_given_result(rv):
    rv.apply_manifest(capture_needs_approval=False)
    s0, charge = _charge_step(rv, 0, "o-resolve")
    capture = rv.capture(charge["id"])  # the call did happen, but the agent saw a timeout
    rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, outcome="uncertain")],
           resolutions=[{"step": 1, "status": "succeeded", "result": {"id": capture["id"]},
                         "note": "seen in the payments dashboard", "actor": "oncall"}])
    resolution = rv.steps("r")[1]["spec"]["resolution"]
    assert resolution["actor"] == "reversi-admin", "the actor is stamped from the authenticated user"
    assert resolution["resolvedAt"] and resolution["result"] == {"id": capture["id"]}
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete")
    assert req["status"]["report"]["compensated"] == [0, 1], req["status"]["report"]
    assert rv.downstream.get(f"/payments/captures/{capture['id']}")["status"] == "voided"


def test_rule7_resolution_without_result_leaves_the_step_unrecoverable(rv):
    rv.apply_manifest(capture_needs_approval=False)
    s0, charge = _charge_step(rv, 0, "o-resolve-nores")
    rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, outcome="uncertain")],
           resolutions=[{"step": 1, "status": "succeeded", "note": "it went through", "actor": "oncall"}])
    rv.request("undo", "r", dryRun=True)
    req = rv.wait_phase("undo", "Planned", timeout=30)
    action = next(a for a in req["status"]["plan"]["actions"] if a["step"] == 1)
    assert action["kind"] == "unrecoverable" and "$result.id" in action["reason"]


def test_rule8_compensation_needing_approval_waits_until_approved(rv):
    rv.apply_manifest(capture_needs_approval=True)
    s0, charge = _charge_step(rv, 0, "o-approve")
    capture = rv.capture(charge["id"])
    rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, capture)])
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "AwaitingApproval")
    assert req["status"]["report"]["awaitingApproval"] == [1]
    assert rv.condition(rv.step_status(req, 1), "Approved")["reason"] == "AwaitingApproval"
    assert rv.downstream.get(f"/payments/captures/{capture['id']}")["status"] == "captured"
    # the request's conditions agree: nothing runs because step 1 waits for a person, and a
    # request waiting for an approval is not stalled (kstatus: Reconciling says what it waits for)
    assert rv.condition(req["status"], "Running")["reason"] == "AwaitingApproval"
    assert rv.condition(req["status"], "Reconciling")["reason"] == "AwaitingApproval"
    assert "Reconciling says" in rv.condition(req["status"], "Stalled")["message"]
    # the client claims to be alice; the admission webhook records who really approved
    rv.patch("rollbackrequests", "undo", {"spec": {"approvals": [{"step": 1, "approver": "alice"}]}})
    req = rv.wait_phase("undo", "Succeeded", "Incomplete")
    assert req["status"]["report"]["compensated"] == [0, 1]
    assert rv.condition(req["status"], "AwaitingApproval")["reason"] == "NoneAwaiting", "approved one by one"
    assert rv.condition(rv.step_status(req, 1), "Approved")["message"] == "approved by reversi-admin"
    assert rv.get("rollbackrequests", "undo")["spec"]["approvals"][0]["approver"] == "reversi-admin"


def test_request_for_a_missing_run_fails_with_a_clear_condition_after_the_wait(rv):
    rv.request("undo", "no-such-run")  # waits REVERSI_RUN_WAIT_SECONDS (8 s in the tests) for the Run
    # kstatus InProgress while it waits (a GitOps tool must not call it healthy)
    waiting = wait_for(lambda: (lambda st: st if any(c["type"] == "Planned" for c in st.get("conditions") or [])
                                else None)(rv.get("rollbackrequests", "undo").get("status") or {}),
                       timeout=30, what="the operator to say it waits for the Run")
    assert waiting["phase"] == "Pending" and rv.condition(waiting, "Planned")["reason"] == "RunNotFound"
    assert rv.condition(waiting, "Reconciling")["status"] == "True"
    assert rv.condition(waiting, "Reconciling")["reason"] == "RunNotFound"
    assert rv.condition(waiting, "Ready")["status"] == "False"
    req = rv.wait_phase("undo", "Failed", timeout=60)
    invalid = next(c for c in req["status"]["conditions"] if c["type"] == "Invalid")
    assert invalid["status"] == "True" and invalid["reason"] == "RunNotFound"
    assert "not found (waited 8s for it to be created)" in invalid["message"]
    assert "fix spec.runRef.name" in invalid["message"]


def test_request_for_a_run_without_its_manifest_fails_with_a_clear_condition(rv):
    rv.apply_manifest()
    s0, _ = _charge_step(rv, 0, "o-nomanifest")
    rv.run("r", [s0])
    rv.custom.delete_namespaced_custom_object("reversi.dev", "v1alpha1", rv.ns, "toolmanifests", "payments")
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Failed", timeout=30)
    invalid = next(c for c in req["status"]["conditions"] if c["type"] == "Invalid")
    assert invalid["reason"] == "ManifestNotFound" and "payments" in invalid["message"]


def test_a_dangling_depends_on_is_refused_at_admission(rv):
    rv.apply_manifest()
    s0, _ = _charge_step(rv, 0, "o-dangling", depends_on=[5])
    with pytest.raises(ApiException) as err:
        rv.run("r", [s0])
    assert err.value.status == 422
    assert "dependsOn may only name earlier steps" in err.value.body
    assert rv.steps("r") == [], "nothing is recorded for the refused step"


def test_a_template_that_points_nowhere_makes_the_step_unrecoverable(rv):
    rv.apply_manifest()
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o", "amount": 1, "customer": "c"}, {"no_id": 1})])
    rv.request("undo", "r")
    req = rv.wait_phase("undo", "Incomplete")
    unrecoverable = req["status"]["report"]["unrecoverable"]
    assert unrecoverable[0]["step"] == 0 and "$result.id" in unrecoverable[0]["reason"]


# ----------------------------------------------------------- the inline journal of Reversi 0.1

def test_an_inline_run_of_reversi_0_1_is_moved_into_runsteps_and_rolls_back(rv):
    """A Run recorded by Reversi 0.1 keeps its steps in spec.steps (one of them naming a shared
    snapshot) and its resolutions in spec.resolutions: the operator moves each step into a RunStep
    with the same record, counts them in status.movedSteps (the inline lists stay as recorded),
    and a rollback then undoes it all, from the RunSteps."""
    rv.apply_manifest(capture_needs_approval=False)
    s1, charge = _charge_step(rv, 1, "o-inline")
    capture = rv.capture(charge["id"])  # the call happened, but the agent saw a timeout
    reservation = rv.reserve("o-inline")
    entry = ToolSpec.model_validate(rv.snapshot("inventory.reserve"))
    sid = snapshot_id(entry)
    reserve = rv.step(3, "inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-inline"}, reservation,
                      depends_on=[1])
    del reserve["snapshot"]
    reserve["snapshotId"] = sid  # 0.1 shared one copy of a manifest entry between steps
    steps = [rv.step(0, "payments.get_customer", {"id": "cus_9"}, {"id": "cus_9"}), s1,
             rv.step(2, "payments.capture", {"charge_id": charge["id"]}, outcome="uncertain"), reserve]
    resolutions = [{"step": 2, "status": "succeeded", "result": {"id": capture["id"]},
                    "note": "seen in the payments dashboard"}]
    body = {"apiVersion": "reversi.dev/v1alpha1", "kind": "Run", "metadata": {"name": "legacy"},
            "spec": {"mode": "enforce", "scope": {"actor": "test-agent"}, "manifestRef": {"name": "payments"},
                     "snapshots": [{"id": sid, **entry.to_wire()}], "steps": steps, "resolutions": resolutions}}
    created = rv.create("runs", body)  # what rv.inline_run makes, with a shared snapshot
    created_spec = created["spec"]
    inline = created["spec"]["steps"]
    assert inline[3].get("snapshotId") == sid and "snapshot" not in inline[3]
    assert len(inline) == 4 and created["spec"]["resolutions"][0]["actor"] == "reversi-admin"

    def moved():
        run = rv.get("runs", "legacy")
        steps = rv.steps("legacy")
        counted = (run.get("status") or {}).get("movedSteps") == 4
        return steps if counted and len(steps) == 4 else None

    steps = wait_for(moved, timeout=30, what="the inline journal moved into RunSteps")
    for old, obj in zip(inline, steps, strict=True):
        spec = obj["spec"]
        assert obj["metadata"]["name"] == f"legacy-{old['index']:05d}"
        assert obj["metadata"]["labels"][LABEL_RUN] == "legacy"
        assert obj["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
        assert spec["runRef"] == {"name": "legacy"}
        for field in ("index", "tool", "args", "outcome", "recordedAt"):
            assert spec[field] == old[field], (old["index"], field)
        assert spec.get("result") == old.get("result") and spec.get("dependsOn", []) == old.get("dependsOn", [])
        # the snapshot taken when the step was recorded, inline or shared, moves with it
        expected = old.get("snapshot") or next({k: v for k, v in s.items() if k != "id"}
                                               for s in created_spec["snapshots"] if s["id"] == old["snapshotId"])
        assert spec["snapshot"] == expected, old["index"]
        assert "snapshotId" not in spec
    old_res = created["spec"]["resolutions"][0]
    assert steps[2]["spec"]["resolution"] == {k: v for k, v in old_res.items() if k != "step"}
    assert "resolution" not in steps[1]["spec"]

    rv.request("undo", "legacy")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete")
    report = req["status"]["report"]
    assert req["status"]["phase"] == "Succeeded", report
    assert report["compensated"] == [1, 2, 3] and report["skipped"] == [0], report
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    assert rv.downstream.get(f"/payments/captures/{capture['id']}")["status"] == "voided"
    assert rv.downstream.get(f"/inventory/reservations/{reservation['id']}")["status"] == "released"
    undo = {u["step"]: u for u in rv.undo("legacy")}
    assert sorted(undo) == [1, 2, 3] and all(u["state"] == "compensated" for u in undo.values())
    run = rv.get("runs", "legacy")
    assert run["spec"]["steps"] == inline, "the inline journal stays as it was recorded"
    assert not (run.get("status") or {}).get("undo"), "undo state is written on the RunSteps"
