"""Pure builders: Jobs and Secrets (docs/concepts.md#the-job-contract) and bounded request status."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from reversi.adapters import jobs
from reversi.adapters import status as st_mod
from reversi.engine.executor import StepRun
from reversi.models.rollbackrequest import Plan, PlanAction
from reversi.models.toolmanifest import Runner

OWNER = jobs.Owner("shop", "undo-1", "11111111-2222-3333-4444-555555555555")
RUNNER = Runner.model_validate({"name": "cli", "image": "registry.example/tools:1", "command": ["tool"],
                                "envFrom": [{"secretRef": {"name": "payments-api"}}], "deadlineSeconds": 120})
CALL = jobs.compensator_call("shop/order-1", 3, "payments.refund", "payments.create_charge",
                             {"charge_id": "ch_1", "card": "4242 4242 4242 4242"}, "k" * 64)


def build(**kw):
    args = dict(owner=OWNER, run_name="order-1", run_uid="run-uid-1", step=3, attempt=2, runner=RUNNER, call=CALL,
                idempotency_key="k" * 64)
    args.update(kw)
    return jobs.build_job(**args)


def test_the_call_travels_in_a_secret_never_in_the_job_spec():
    secret, job = build()
    assert json.loads(secret["stringData"]["call.json"]) == CALL
    assert secret["stringData"]["idempotency-key"] == "k" * 64
    spec_text = json.dumps(job)
    assert "4242" not in spec_text and "ch_1" not in spec_text and "k" * 64 not in spec_text
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["REVERSI_CALL"]["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "call.json"}
    assert env["REVERSI_IDEMPOTENCY_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "idempotency-key"
    assert env["REVERSI_CALL_FILE"]["value"] == "/var/run/reversi/call.json"


def test_job_contract_fields():
    secret, job = build(deadline_seconds=30)
    spec = job["spec"]
    assert spec["backoffLimit"] == 0
    assert spec["activeDeadlineSeconds"] == 30  # the request's deadline is smaller than the runner's
    assert spec["ttlSecondsAfterFinished"] == 3600
    assert job["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert secret["metadata"]["ownerReferences"] == [OWNER.reference()]
    labels = job["metadata"]["labels"]
    assert labels[jobs.LABEL_STEP] == "3" and labels[jobs.LABEL_ATTEMPT] == "2"
    assert labels[jobs.LABEL_ROLE] == "compensator"
    assert labels[jobs.LABEL_RUN_UID] == "run-uid-1"


def test_pod_meets_the_restricted_pod_security_standard():
    _, job = build()
    pod = job["spec"]["template"]["spec"]
    c = pod["containers"][0]["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["allowPrivilegeEscalation"] is False and c["capabilities"] == {"drop": ["ALL"]}
    assert c["readOnlyRootFilesystem"] is True and c["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    assert pod["restartPolicy"] == "Never"


def test_reader_and_check_jobs_have_their_own_names_and_no_key():
    secret, job = build(role="reader", read=2, call=jobs.reader_call("payments.get_charge", {"charge_id": "ch_1"}),
                        idempotency_key=None)
    assert job["metadata"]["name"].endswith("-c2-r2")
    assert "idempotency-key" not in secret["stringData"]
    _, check = build(role="check", read=0, command=["verify", "--strict"])
    assert check["metadata"]["name"].endswith("-c2-x0")
    assert check["spec"]["template"]["spec"]["containers"][0]["command"] == ["verify", "--strict"]


@given(st.text(min_size=1, max_size=80), st.integers(0, 19999), st.integers(1, 10**6), st.integers(0, 10**6))
def test_property_job_names_are_deterministic_dns_labels(uid, step, attempt, read):
    name = jobs.job_name(uid, step, attempt, "reader", read)
    assert name == jobs.job_name(uid, step, attempt, "reader", read)
    assert len(name) <= 63 and name.replace("-", "").isalnum() and name == name.lower()


def _plan(n):
    actions = [PlanAction(step=i, tool="payments.create_charge", kind="compensate", compensation_tool="payments.refund",
                          idempotency_key="k" * 64, args={"charge_id": f"ch_{i}"}) for i in range(n)]
    return Plan(fully_reversible=True, actions=actions)


def test_status_steps_are_bounded_and_keep_active_steps_first():
    plan = _plan(1000)
    runs = {i: StepRun(i, stage="compensated", attempts=1, verification="verified") for i in range(1000)}
    runs[3] = StepRun(3, stage="compensating", attempts=1)
    runs[500] = StepRun(500, stage="failed", attempts=3, error="x" * 5000)
    entries = st_mod.step_entries(plan, runs, {}, {}, {}, None, 1, {}, {}, limit=50, message_limit=100)
    assert len(entries) == 50
    steps = {e["step"] for e in entries}
    assert {3, 500} <= steps
    failed = next(e for e in entries if e["step"] == 500)
    assert len(failed["lastError"]) == 100


def test_status_steps_say_when_the_effect_of_an_undo_is_unknown_and_only_then():
    """``status.steps[].effectUnknown`` carries the fact across passes (a step waiting to try
    again after a compensator killed mid-call); the journal carries it for a failed step."""
    from reversi.models.rollbackrequest import StepStatus

    runs = {0: StepRun(0, stage="retrying", attempts=1, error="exit code 143", effect_unknown=True),
            1: StepRun(1, stage="failed", attempts=2, error="refund refused")}
    entries = {e["step"]: e for e in st_mod.step_entries(_plan(2), runs, {}, {}, {}, None, 1, {}, {}, limit=50,
                                                         message_limit=100)}
    assert entries[0]["effectUnknown"] is True and "effectUnknown" not in entries[1]
    assert StepStatus.model_validate(entries[0]).effect_unknown is True  # the CRD schema keeps it


def test_status_plan_is_bounded_and_counts_what_it_left_out():
    wire = st_mod.plan_status(_plan(1000), 200)
    assert len(wire["actions"]) == 200 and wire["omitted"] == 800 and wire["fullyReversible"] is True


def test_pod_truth_a_failed_job_whose_container_exited_0_succeeded():
    """An attempt is judged by its pod: a Job marked failed after an outage, whose container
    terminated with 0, did its work (the compensator must not run again)."""
    from reversi.adapters.kube import pod_verdict

    assert pod_verdict("failed", [0]) == "succeeded"
    assert pod_verdict("failed", [0, 0]) == "succeeded"
    assert pod_verdict("failed", [0, 1]) == "failed"
    assert pod_verdict("failed", [None]) == "failed", "a container that never terminated proves nothing"
    assert pod_verdict("failed", []) == "failed", "no pod: the Job's verdict stands"
    assert pod_verdict("succeeded", [1]) == "succeeded"
    assert pod_verdict("running", [0]) == "running"
    assert pod_verdict("failed", [0], disrupted=True) == "failed", \
        "an evicted pod's exit 0 may be its answer to the SIGTERM that stopped it mid-call"
    assert pod_verdict("failed", [0], deadline_killed=True) == "failed", \
        "so may the exit 0 of a program the Job's deadline stopped"


def test_the_deadline_killed_a_program_that_finished_at_or_after_it():
    """Pod truth upgrades a late-marked Job only for a program that finished before the Job's
    deadline; one that finished at or after it was stopped by the deadline's SIGTERM."""
    import datetime as dt

    from reversi.adapters.kube import killed_by_deadline

    deadline = dt.datetime(2026, 12, 1, 10, 0, 0, tzinfo=dt.UTC)
    before, after = deadline - dt.timedelta(seconds=5), deadline + dt.timedelta(seconds=1)
    assert not killed_by_deadline("DeadlineExceeded", deadline, [before]), "it ended by itself; marked late"
    assert killed_by_deadline("DeadlineExceeded", deadline, [after])
    assert killed_by_deadline("DeadlineExceeded", deadline, [None]), "no finish time: the deadline's reason stands"
    assert killed_by_deadline("DeadlineExceeded", None, [before]), "no start time to judge by"
    assert not killed_by_deadline("BackoffLimitExceeded", deadline, [after])


def test_a_failed_job_with_no_exit_of_its_own_gave_no_answer():
    """A read whose program never exited by itself is lost, not failed (rule 5, JobView.lost):
    no pod or no terminated container, a container the node lost, or one the Job's deadline
    killed. A program that exited non-zero by itself answered."""
    from reversi.adapters.kube import no_answer

    assert no_answer("DeadlineExceeded", []), "the pod never ran its program to an exit"
    assert no_answer("BackoffLimitExceeded", [(137, "ContainerStatusUnknown")]), "lost with the node"
    assert no_answer("DeadlineExceeded", [(137, "Error")]) and no_answer("DeadlineExceeded", [(143, "Error")])
    assert not no_answer("DeadlineExceeded", [(1, "Error")]), "it exited 1 by itself before the deadline"
    assert not no_answer("BackoffLimitExceeded", [(1, "Error")])
    assert not no_answer("BackoffLimitExceeded", [(137, "OOMKilled")]), "an answer of sorts: it ran out of memory"
    assert no_answer("BackoffLimitExceeded", [(143, "Error")], disrupted=True), \
        "an evicted reader's exit answered the SIGTERM, not the question"
    assert no_answer("DeadlineExceeded", [(1, "Error")], deadline_killed=True), \
        "it exited 1 when the deadline stopped it"


def test_pod_truth_a_complete_compensator_stopped_mid_call_did_not_answer():
    """A compensator's exit 0 is its answer only when nothing stopped it: the Job controller
    sometimes marks Complete a Job whose evicted pod exited 0 on SIGTERM (docs/guarantees.md#c-evicted),
    so a Complete compensator whose pod was disrupted, or killed by its deadline, failed
    (docs/guarantees.md#c-evicted). A reader's answer is its output: its Job's verdict stands."""
    from reversi.adapters.kube import pod_verdict

    assert pod_verdict("succeeded", [0], disrupted=True, compensator=True) == "failed"
    assert pod_verdict("succeeded", [0], deadline_killed=True, compensator=True) == "failed"
    assert pod_verdict("succeeded", [0], compensator=True) == "succeeded", "nothing stopped it: its exit 0 answers"
    assert pod_verdict("succeeded", [0], disrupted=True) == "succeeded", "a reader is judged by what it printed"
    assert pod_verdict("failed", [0], disrupted=True, compensator=True) == "failed"
    assert pod_verdict("failed", [0], compensator=True) == "succeeded", "pod truth still upgrades a late-marked Job"


def test_a_complete_job_was_killed_by_its_deadline_only_when_a_container_ended_at_or_after_it():
    import datetime as dt

    from reversi.adapters.kube import killed_by_deadline

    deadline = dt.datetime(2026, 12, 1, 10, 0, 0, tzinfo=dt.UTC)
    before, after = deadline - dt.timedelta(seconds=5), deadline + dt.timedelta(seconds=1)
    assert killed_by_deadline("", deadline, [after], complete=True)
    assert killed_by_deadline("", deadline, [deadline], complete=True)
    assert not killed_by_deadline("", deadline, [before], complete=True)
    assert not killed_by_deadline("", deadline, [None], complete=True), "no finish time: nothing says it was"
    assert not killed_by_deadline("", None, [after], complete=True), "no deadline to judge by"


def test_a_pods_disruption_is_its_true_disruption_target_condition():
    from reversi.adapters.kube import disruption_of

    assert disruption_of([("Ready", "False", "PodFailed", None),
                          ("DisruptionTarget", "True", "EvictionByEvictionAPI", "Eviction API: evicting")]) == \
        "EvictionByEvictionAPI: Eviction API: evicting"
    assert disruption_of([("DisruptionTarget", "True", "TerminationByKubelet", None)]) == "TerminationByKubelet"
    assert disruption_of([("DisruptionTarget", "False", "EvictionByEvictionAPI", "cleared")]) is None
    assert disruption_of([]) is None


def test_a_compensator_that_started_and_gave_no_answer_leaves_its_effect_unknown():
    """Residue unknown, not failed (docs/concepts.md#the-report): the program started and was
    stopped mid-call (its deadline, an eviction, an OOM kill, a signal, its node lost, or its pod
    went with no exit seen). One that exited non-zero by itself answered; one that never ran did
    nothing."""
    from reversi.adapters.kube import call_unanswered

    assert call_unanswered([(143, "Error")], ran=True, deadline_killed=True), "killed by its deadline"
    assert call_unanswered([(0, "Completed")], ran=True, disrupted=True), "evicted: its exit 0 answered SIGTERM"
    assert call_unanswered([(137, "OOMKilled")], ran=True), "OOM-killed mid-call"
    assert call_unanswered([(137, "ContainerStatusUnknown")], ran=True), "lost with its node"
    assert call_unanswered([(143, "Error")], ran=True), "ended by a signal, not by itself"
    assert call_unanswered([], ran=True), "it ran (or its pod is gone, nothing says it never ran); no exit seen"
    assert not call_unanswered([(1, "Error")], ran=True), "it answered: it exited 1 by itself"
    assert not call_unanswered([(128, "StartError")], ran=True), "its program could not start: nothing ran"
    assert not call_unanswered([], ran=False), "it never ran (its image could not be pulled)"
    assert not call_unanswered([], ran=False, deadline_killed=True), "the deadline struck a container never run"


def test_a_complete_compensator_stopped_mid_call_says_why_and_that_the_call_may_have_happened():
    from reversi.adapters.kube import unanswered_success

    evicted = unanswered_success("EvictionByEvictionAPI: Eviction API: evicting")
    assert "disrupted (EvictionByEvictionAPI: Eviction API: evicting)" in evicted
    assert "may or may not have taken effect" in evicted and evicted.startswith("its Job is Complete")
    assert "deadline" in unanswered_success(deadline_killed=True)
    assert "Stopping container compensator" in unanswered_success(killing="pod p: Stopping container compensator")


def test_a_reader_log_that_cannot_be_read_on_the_way_is_read_again_for_a_while():
    """A reader's log that the API server cannot fetch (the kubelet restarting: 5xx, or 429) is
    read again on a later pass for READER_LOG_GRACE_SECONDS after the Job finished; any other
    error, or a later one, is a failed read (a new reader runs)."""
    import datetime as dt

    from reversi.adapters.kube import READER_LOG_GRACE_SECONDS, reader_log_pending

    done = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    soon = done + dt.timedelta(seconds=5)
    late = done + dt.timedelta(seconds=READER_LOG_GRACE_SECONDS + 1)
    assert reader_log_pending(500, done, soon) and reader_log_pending(503, done, soon)
    assert reader_log_pending(429, done, soon)
    assert reader_log_pending(502, None, late), "no finish time: keep looking"
    assert not reader_log_pending(500, done, late), "the kubelet stays away: the read failed"
    assert not reader_log_pending(404, done, soon), "the log is gone: the read failed"
    assert not reader_log_pending(403, done, soon)
    assert not reader_log_pending(None, done, soon)


def _slice_entries(steps, size=10):
    return {s: jobs.step_calls(s, {"compensator": {"args": "x" * size, "step": s},
                                   "reader": {"tool": "r", "arguments": s}, "precheck": None}, f"key-{s}")
            for s in steps}


def test_a_slice_of_steps_shares_one_calls_secret_and_each_job_mounts_only_its_own_call():
    entries = _slice_entries(range(32, 64))
    [(name, data)] = jobs.pack_calls("run-uid-1", entries)
    assert name.startswith(f"rv-{jobs.run_hash('run-uid-1')}-k1-") and len(name) <= 63
    assert set(data) == {f"{s}.{k}" for s in range(32, 64) for k in ("compensator.json", "reader.json",
                                                                      "idempotency-key")}
    ref = jobs.CallRef(name, jobs.call_key(40, "check"), jobs.idempotency_key_key(40))
    assert ref.call_key == "40.compensator.json"  # verifyCommand's check gets the compensator's call
    job = jobs.job_for(owner=OWNER, run_name="order-1", run_uid="run-uid-1", step=40, attempt=2, runner=RUNNER,
                       role="check", call_ref=ref)
    pod = job["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["REVERSI_CALL"]["valueFrom"]["secretKeyRef"] == {"name": name, "key": "40.compensator.json"}
    assert env["REVERSI_IDEMPOTENCY_KEY"]["valueFrom"]["secretKeyRef"] == {"name": name, "key": "40.idempotency-key"}
    [vol] = [v for v in pod["volumes"] if v["name"] == "call"]
    assert vol["secret"]["items"] == [{"key": "40.compensator.json", "path": "call.json"}]
    whole = jobs.calls_secret(name, OWNER, "run-uid-1", data)
    assert whole["immutable"] and whole["stringData"] == data and whole["metadata"]["ownerReferences"]


def test_calls_secret_names_say_their_content():
    entries = _slice_entries(range(0, 5))
    assert jobs.pack_calls("u", entries) == jobs.pack_calls("u", dict(reversed(list(entries.items()))))
    changed = dict(entries)
    changed[3] = jobs.step_calls(3, {"compensator": {"args": "settled since"}}, "key-3")
    assert jobs.pack_calls("u", changed)[0][0] != jobs.pack_calls("u", entries)[0][0]
    try:
        jobs.pack_calls("u", _slice_entries([31, 32]))
    except ValueError as err:
        assert "slices [0, 1]" in str(err)
    else:
        raise AssertionError("steps of two slices packed together")


@given(st.lists(st.integers(0, 200_000), min_size=1, max_size=32), st.integers(1, 400_000))
def test_a_large_slice_is_split_in_step_order_and_no_step_is_lost_or_split(sizes, limit):
    entries = _slice_entries([], 0)
    for i, n in enumerate(sizes):
        entries.update(_slice_entries([i], n))
    packs = jobs.pack_calls("u", entries, max_bytes=limit)
    steps = [sorted({int(k.split(".")[0]) for k in data}) for _, data in packs]
    assert [s for group in steps for s in group] == sorted(entries)  # each step once, in order
    assert len({name for name, _ in packs}) == len(packs)
    for (_, data), group in zip(packs, steps, strict=True):
        size = sum(len(k) + len(v.encode()) for k, v in data.items())
        assert size <= limit or len(group) == 1  # over the limit only a step alone (it must go somewhere)


#: the API server's limit on a Secret's data, and Linux's on one environment string (``NAME=value``)
SECRET_LIMIT, ENV_STRING_LIMIT = 1024 * 1024, 128 * 1024


def test_a_step_whose_calls_carry_non_ascii_text_fits_one_secret_and_each_call_an_environment_variable():
    # args and result at their limit (64 KiB of UTF-8 JSON each, the size admission measures) in
    # non-ASCII text; every call of the step carries half of each: 4 calls of ~62 KiB of UTF-8.
    # Written with \u escapes each is ~3 times larger: past what one environment variable can
    # hold (exec fails with E2BIG, no Job of the step runs its program), and a step's calls
    # three times nearer the API server's 1 MiB per Secret.
    text = "é" * 15_800  # 31,600 bytes of UTF-8
    call = jobs.compensator_call("shop/order-1", 3, "payments.refund", "payments.create_charge",
                                 {"charge_id": "ch_1", "memo": text, "note": text}, "k" * 64)
    read = jobs.reader_call("payments.get_charge", {"charge_id": "ch_1", "memo": text, "note": text})
    entries = {3: jobs.step_calls(3, {"compensator": call, "reader": read, "precheck": read, "precondition": read},
                                  "k" * 64)}
    [(_, data)] = jobs.pack_calls("run-uid-1", entries)
    assert sum(len(k) + len(v.encode()) for k, v in data.items()) < SECRET_LIMIT
    for key in ("3.compensator.json", "3.reader.json"):
        assert len(f"REVERSI_CALL={data[key]}".encode()) < ENV_STRING_LIMIT
        assert json.loads(data[key])["args" if "compensator" in key else "arguments"]["memo"] == text
    secret, _ = build(call=call)  # a Job's own Secret too
    assert len(secret["stringData"][jobs.CALL_KEY].encode()) < ENV_STRING_LIMIT


def test_a_call_longer_than_one_environment_string_is_refused_by_name():
    jobs.check_job_call_size("x" * jobs.MAX_JOB_CALL_BYTES, "the compensator call of step 3")
    try:
        jobs.check_job_call_size("é" * (jobs.MAX_JOB_CALL_BYTES // 2 + 1), "the compensator call of step 3")
    except jobs.CallTooLarge as err:
        assert str(err).startswith(f"the compensator call of step 3 is {2 * (jobs.MAX_JOB_CALL_BYTES // 2 + 1)} bytes")
        assert "REVERSI_CALL" in str(err)
    else:
        raise AssertionError("a call too long for REVERSI_CALL was let through")
