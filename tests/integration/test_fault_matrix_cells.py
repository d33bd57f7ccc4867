"""Cells of the fault matrix (docs/guarantees.md) that need the API: a request or a Run deleted at
each moment of a step's undo, a ToolManifest edited while its Jobs run, a resolution written while a
request holds the lock, the webhook unreachable during a rollback, and a compensator that fails
after its call took effect.

A step is held at the moment a cell names (docs/guarantees.md#the-five-moments) by a gate, not by
a sleep: every compensator and reader runs ``demo/downstream/tool.py`` behind :data:`GATE`, which
waits while a file ``undo-<id>`` (a compensator whose call names ``<id>``) or ``read-<id>`` (a
reader) exists in the test's gate folder, and the test removes the file to let it go. The moment
between a compensator and its read-back cannot be held from inside a Job (the operator starts the
reader as soon as it sees the compensator done), so there the operator is down. Downstream truth
is the demo server's log of calls, one line per real effect or replay of an idempotency key.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException

from reversi.adapters import apicalls
from reversi.adapters.journal import step_body
from tests.helpers import wait_for
from tests.integration.conftest import TOOL, manifest_body

pytestmark = pytest.mark.cluster
G, V = "reversi.dev", "v1alpha1"

#: a runner's command: wait while the test holds this Job's call, then run the demo tool
GATE = (
    "import json,os,sys,time\n"
    "p=os.environ.get('REVERSI_CALL_FILE','')\n"
    "c=json.load(open(p)) if p and os.path.exists(p) else json.loads(os.environ['REVERSI_CALL'])\n"
    "k,a=('undo',c['args']) if 'args' in c else ('read',c.get('arguments') or {})\n"
    "h=[os.path.join(os.environ['GATES'],k+'-'+v) for v in a.values() if isinstance(v,str)]\n"
    "while any(os.path.exists(x) for x in h): time.sleep(0.05)\n"
    "os.execv(sys.executable,[sys.executable,os.environ['TOOL']])\n"
)
TERMINAL = ("Succeeded", "Incomplete", "Failed")


class Gates:
    """The gate folder of one test: :meth:`hold` a compensator (``undo``) or reader (``read``)
    whose call names ``value`` before it calls; :meth:`release` lets it go."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def hold(self, kind: str, value: str) -> None:
        (self.root / f"{kind}-{value}").touch()

    def release(self, kind: str, value: str) -> None:
        (self.root / f"{kind}-{value}").unlink(missing_ok=True)


@pytest.fixture
def gates(rv, cluster):
    """The test ToolManifest with every Job behind :data:`GATE` (the gate folder is the cluster's,
    not /tmp: a Job's /tmp is a volume of its own)."""
    g = Gates(Path(cluster.paths.root) / "fault-matrix-gates" / rv.ns)
    assert not g.root.resolve().is_relative_to("/tmp"), f"{g.root}: a Job's /tmp hides it; move the cluster folder"
    body = manifest_body(rv.downstream.url)
    runner = body["spec"]["runners"][0]
    runner["command"] = [sys.executable, "-c", GATE]
    runner["env"] = [*runner["env"], {"name": "GATES", "value": str(g.root)}, {"name": "TOOL", "value": str(TOOL)}]
    rv.manifest = rv.create("toolmanifests", body)
    yield g
    for held in g.root.iterdir():
        held.unlink()
    g.root.rmdir()


def _jobs(rv, role: str, step: int | None = None) -> list:
    selector = f"reversi.dev/role={role}" + (f",reversi.dev/step={step}" if step is not None else "")
    return rv.batch.list_namespaced_job(rv.ns, label_selector=selector).items


def _done(jobs: list) -> bool:
    return bool(jobs) and all(j.status.succeeded or j.status.failed for j in jobs)


def _reserve_step(rv, index: int, order: str, **kw) -> tuple[str, dict]:
    """A real reservation (the agent's call) and its step ``index``: the reservation's id and the step."""
    held = rv.reserve(order)
    return held["id"], rv.step(index, "inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": order}, held, **kw)


def _calls(rv, path: str) -> list[bool]:
    """The downstream's log for ``path``: one entry per call with an effect or a replay (True)."""
    return [c["replayed"] for c in rv.downstream.state()["calls"] if c["path"] == path]


def _release_calls(rv, rid: str) -> list[bool]:
    return _calls(rv, f"/inventory/reservations/{rid}/release")


def _stage(rv, request: str, step: int) -> str | None:
    entries = (rv.get("rollbackrequests", request).get("status") or {}).get("steps") or []
    return next((e["stage"] for e in entries if e["step"] == step), None)


def _undo(rv, run: str) -> dict[int, dict]:
    return {u["step"]: u for u in rv.undo(run)}


class ReportUntrue(AssertionError):
    """A report that says something the downstream contradicts (docs/guarantees.md#the-guarantee)."""


# ------------------------------------------------------------------------------ deleted at each moment


@pytest.mark.parametrize("deleted", ["request", "run"])
def test_a_request_or_run_deleted_with_steps_at_moments_1_3_4_5_leaves_what_the_report_says(rv, gates, operator,
                                                                                              deleted):
    """docs/guarantees.md#delete-request and #delete-run: four steps held at four moments at once,
    then the request or the Run is deleted. Step 0 waits for an approval (moment 1, after the
    lock), step 1's compensator has finished and its read-back has not started (moment 3: the
    operator is down from before it finished until after the deletion), step 2's reader runs
    (moment 4), step 3's verdict is journaled (moment 5).

    The request deleted: the Run is released, steps 1 and 2 are settled from their compensators'
    Jobs (compensated, unverified), step 3 keeps its verdict; the next request reads steps 1 and 2
    back (adopting step 2's running reader: one reader Job), never runs a compensator again,
    and undoes step 0. The Run deleted: the request fails ``RunNotFound``; the undos of steps 1-3
    stand done downstream and step 0's was never made. (Its Jobs go with the Run by garbage
    collection, which takes from seconds to over half a minute here: not waited for.)"""
    charge = rv.charge("o-cap")
    capture = rv.capture(charge["id"])
    held = {i: _reserve_step(rv, i, f"o-held-{i}") for i in (1, 2, 3)}
    rid = {i: held[i][0] for i in held}
    rv.run("r", [rv.step(0, "payments.capture", {"charge_id": charge["id"]}, capture),
                 *[held[i][1] for i in (1, 2, 3)]])
    gates.hold("undo", rid[1])
    gates.hold("read", rid[2])
    rv.request("undo", "r", parallelism=4)

    def at_moments() -> bool:
        return bool((_undo(rv, "r").get(3) or {}).get("state") == "compensated" and _jobs(rv, "reader", 2)
                    and _jobs(rv, "compensator", 1) and _stage(rv, "undo", 0) == "awaitingApproval")

    wait_for(at_moments, timeout=60, what="steps 0-3 at moments 1, 2, 4, 5")
    operator.kill()
    try:
        gates.release("undo", rid[1])
        wait_for(lambda: _done(_jobs(rv, "compensator", 1)), timeout=30, what="step 1's compensator to finish")
        assert not _jobs(rv, "reader", 1), "step 1 is past moment 3: its read-back started"
        assert _jobs(rv, "compensator", 1)[0].status.succeeded and not _done(_jobs(rv, "reader", 2))
        plural = "rollbackrequests" if deleted == "request" else "runs"
        rv.custom.delete_namespaced_custom_object(G, V, rv.ns, plural, "undo" if deleted == "request" else "r")
    finally:
        operator.start()
    if deleted == "request":
        _next_request_settles_without_running_anything_twice(rv, gates, rid, capture["id"])
    else:
        _the_request_fails_and_the_downstream_shows_what_ran(rv, rid, capture["id"])


def _next_request_settles_without_running_anything_twice(rv, gates, rid: dict[int, str], capture: str) -> None:
    wait_for(lambda: not (rv.get("runs", "r").get("status") or {}).get("activeRequest"), timeout=30,
             what="the Run to be released")

    def settled() -> dict[int, dict] | None:
        undo = _undo(rv, "r")
        return undo if all(undo.get(s, {}).get("state") == "compensated" for s in (1, 2)) else None

    undo = wait_for(settled, timeout=30, what="steps 1 and 2 settled from their Jobs")
    assert [(undo[s]["verification"], undo[s]["attempts"]) for s in (1, 2, 3)] == [
        ("unverified", 1), ("unverified", 1), ("verified", 1)], undo
    assert 0 not in undo, "step 0 never started"
    gates.release("read", rid[2])
    rv.request("next", "r", approveCompensations=True, parallelism=4)
    req = rv.wait_phase("next", *TERMINAL, timeout=60)
    assert req["status"]["phase"] == "Succeeded" and req["status"]["report"]["compensated"] == [0, 1, 2, 3], req
    undo = _undo(rv, "r")
    assert [undo[s].get("verifiedBy") for s in (1, 2)] == ["next", "next"] and undo[3]["request"] == "undo"
    assert [len(_jobs(rv, "compensator", s)) for s in range(4)] == [1, 1, 1, 1], "a compensator ran twice"
    assert len(_jobs(rv, "reader", 2)) == 1, "the next request started a reader of its own for step 2"
    # the truth downstream: each undo happened once, no replay
    assert [_release_calls(rv, rid[s]) for s in (1, 2, 3)] == [[False]] * 3
    assert _calls(rv, f"/payments/captures/{capture}/void") == [False]


def _the_request_fails_and_the_downstream_shows_what_ran(rv, rid: dict[int, str], capture: str) -> None:
    req = rv.wait_phase("undo", *TERMINAL, timeout=60)
    invalid = next(c for c in req["status"]["conditions"] if c["type"] == "Invalid")
    assert req["status"]["phase"] == "Failed" and invalid["reason"] == "RunNotFound", req["status"]
    assert "was deleted" in invalid["message"], invalid
    # the undos of steps 1-3 were made (moments 3, 4, 5), step 0's never was (moment 1)
    assert [_release_calls(rv, rid[s]) for s in (1, 2, 3)] == [[False]] * 3
    assert _calls(rv, f"/payments/captures/{capture}/void") == []
    report = req["status"]["report"]
    assert report["compensated"] == [3] and not report["complete"], report
    residue = {r["step"]: r["type"] for r in report["residue"]}
    assert residue[0] == "notAttempted", residue  # true: it waited for an approval
    if {residue.get(1), residue.get(2)} & {"notAttempted"}:
        raise ReportUntrue(f"steps 1 and 2 were undone downstream, the report says not attempted: {residue}")
    assert (residue[1], residue[2]) == ("unknown", "unknown"), residue  # their journal went with the Run


# ------------------------------------------------------------------------------ the ToolManifest edited


def test_a_toolmanifest_edited_while_a_compensator_and_a_reader_run_changes_nothing(rv, gates):
    """docs/guarantees.md#manifest-edit: the runner is edited to a dead command and address while
    step 0's compensator runs (moment 2) and step 1's reader runs (moment 4). Both finish as they
    started, every Job of the request (step 0's reader starts after the edit) runs the runner it
    recorded at the lock, and both undos are compensated and checked: one release each."""
    held = {i: _reserve_step(rv, i, f"o-edit-{i}") for i in (0, 1)}
    rv.run("r", [held[0][1], held[1][1]])
    gates.hold("undo", held[0][0])
    gates.hold("read", held[1][0])
    rv.request("undo", "r", parallelism=2)
    wait_for(lambda: _jobs(rv, "compensator", 0) and _jobs(rv, "reader", 1), timeout=60,
             what="step 0's compensator and step 1's reader running")
    manifest = rv.get("toolmanifests", "payments")
    manifest["spec"]["runners"][0].update(command=["false"], env=[{"name": "DOWNSTREAM_URL", "value": "http://127.0.0.1:9"}])
    rv.custom.replace_namespaced_custom_object(G, V, rv.ns, "toolmanifests", "payments", manifest)
    gates.release("undo", held[0][0])
    gates.release("read", held[1][0])
    req = rv.wait_phase("undo", *TERMINAL, timeout=60)
    assert req["status"]["phase"] == "Succeeded" and req["status"]["report"]["compensated"] == [0, 1], req["status"]
    assert {u["verification"] for u in _undo(rv, "r").values()} == {"verified"}
    jobs = rv.batch.list_namespaced_job(rv.ns).items
    assert len(jobs) == 4 and {j.spec.template.spec.containers[0].command[-1] for j in jobs} == {GATE}
    assert [_release_calls(rv, held[i][0]) for i in (0, 1)] == [[False], [False]]


# ------------------------------------------------------------------------------ the call was uncertain


def test_a_resolution_written_while_a_request_holds_the_lock_is_undone_by_that_request(rv, gates):
    """docs/guarantees.md#uncertain: step 0's call was uncertain (unresolved) when the request took
    the lock; it is resolved (it happened, with its result) while step 1's compensator runs. The
    request holding the lock plans it again and undoes it itself: compensated and checked, the
    request Succeeded, one release of each reservation."""
    r0, step0 = _reserve_step(rv, 0, "o-unsure-0", outcome="uncertain")
    del step0["result"]  # an uncertain call has no result yet
    r1, step1 = _reserve_step(rv, 1, "o-unsure-1")
    rv.run("r", [step0, step1])
    gates.hold("undo", r1)
    rv.request("undo", "r")
    wait_for(lambda: _jobs(rv, "compensator", 1), timeout=60, what="step 1's compensator running")
    # the request's status with its report may be written a moment after the Job it started
    residue = wait_for(lambda: (rv.get("rollbackrequests", "undo")["status"].get("report") or {}).get("residue"),
                       timeout=30, what="the request's report")
    assert residue[0]["type"] == "unknown"
    rv.resolve("r", 0, status="succeeded", result={"id": r0}, note="the reservation is there downstream")

    def planned() -> bool:
        actions = rv.get("rollbackrequests", "undo")["status"]["plan"]["actions"]
        return any(a["step"] == 0 and a["kind"] == "compensate" for a in actions)

    wait_for(planned, timeout=30, what="the request holding the lock to plan step 0 again")
    gates.release("undo", r1)
    req = rv.wait_phase("undo", *TERMINAL, timeout=60)
    report = req["status"]["report"]
    assert req["status"]["phase"] == "Succeeded" and report["compensated"] == [0, 1], report
    assert report["unresolved"] == [] and report["residue"] == []
    assert _undo(rv, "r")[0]["request"] == "undo" and _undo(rv, "r")[0]["verification"] == "verified"
    assert [_release_calls(rv, r) for r in (r0, r1)] == [[False], [False]]


# ------------------------------------------------------------------------------ the webhook unreachable


def _refused(call) -> bool:
    try:
        call()
    except ApiException as err:
        return apicalls.admission_unreachable(err)
    return False


def test_a_rollback_runs_to_its_end_while_no_admission_replica_answers(rv, gates, operator):
    """docs/guarantees.md#webhook-all, a run without children: every admission replica is killed
    while step 1's compensator is held, so step 1's moments 2-5 and step 0's moments 1-5
    (``parallelism: 1``: it starts once step 1's undo is done) pass while no webhook answers.
    The operator writes only status, Jobs, Secrets and Events: the request Succeeded, both undos
    checked, one release each. A person's spec write (a cancel) is refused meanwhile."""
    held = {i: _reserve_step(rv, i, f"o-hook-{i}") for i in (0, 1)}
    rv.run("r", [held[0][1], held[1][1]])
    gates.hold("undo", held[1][0])
    rv.request("undo", "r")
    wait_for(lambda: _jobs(rv, "compensator", 1), timeout=60, what="step 1's compensator running")
    assert not _jobs(rv, "compensator", 0)
    operator.admission.kill()
    try:
        assert _refused(lambda: rv.patch("rollbackrequests", "undo", {"spec": {"cancel": True}}))
        gates.release("undo", held[1][0])
        req = rv.wait_phase("undo", *TERMINAL, timeout=60)
        assert not operator.admission.alive()
    finally:
        operator.admission.start()
    assert req["status"]["phase"] == "Succeeded" and req["status"]["report"]["compensated"] == [0, 1], req["status"]
    assert {u["verification"] for u in _undo(rv, "r").values()} == {"verified"}
    assert [_release_calls(rv, held[i][0]) for i in (0, 1)] == [[False], [False]]


def _webhook_refusals(rv) -> float:
    """How many RollbackRequest creates kube-apiserver refused because it could not call a webhook."""
    resp = rv.api.call_api("GET", rv.api.configuration.host + "/metrics")
    resp.read()
    text = resp.data.decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("apiserver_admission_webhook_rejection_count{") and "rollbackrequest" in line
               and 'operation="CREATE"' in line and "calling_webhook_error" in line)


def test_a_child_runs_rollback_waits_for_the_webhook_instead_of_ending_incomplete(rv, gates, operator):
    """docs/guarantees.md#webhook, a run with child runs: the parent p (steps 0 and 1, its child c
    opened between them) is rolled back; every admission replica is killed while p's step 1 is
    undone, so the operator's create of c's RollbackRequest is refused. Once the webhooks answer
    again, the rollback must go on: c undone, the request Succeeded, and no section blaming a
    deletion that never happened."""
    run = {"mode": "enforce", "scope": {"actor": "test-agent"}, "manifestRef": {"name": "payments"}}
    rv.create("runs", {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": "p"}, "spec": run})
    steps = {}
    for run_name, index, parent in (("p", 0, None), ("c", 0, "p"), ("p", 1, None)):
        if parent:
            rv.create("runs", {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": run_name},
                               "spec": {**run, "parentRef": {"name": parent}}})
        rid, step = _reserve_step(rv, index, f"o-{run_name}-{index}")
        rv.create("runsteps", step_body(rv.ns, run_name, step))
        steps[run_name, index] = rid
    gates.hold("undo", steps["p", 1])
    rv.request("undo", "p")
    wait_for(lambda: _jobs(rv, "compensator", 1), timeout=60, what="p's step 1 compensator running")
    refused = _webhook_refusals(rv)
    operator.admission.kill()
    try:
        gates.release("undo", steps["p", 1])
        # the operator's create of c's request was refused (three tries of one pass)
        wait_for(lambda: _webhook_refusals(rv) >= refused + 3, timeout=60, what="c's request refused")
    finally:
        operator.admission.start()
    req = rv.wait_phase("undo", *TERMINAL, timeout=60)
    sections = req["status"]["report"]["runs"]
    blamed = [s["message"] for s in sections if "deleted" in (s.get("message") or "")]
    if blamed or req["status"]["phase"] != "Succeeded":
        raise ReportUntrue(f"{req['status']['phase']}, though nothing was deleted: {blamed}; c's reservation "
                           f"released {len(_release_calls(rv, steps['c', 0]))} times")
    assert [_release_calls(rv, steps[k]) for k in (("p", 1), ("c", 0), ("p", 0))] == [[False]] * 3


# ------------------------------------------------------------------------------ Jobs that break the contract


def _charge_tool(name: str, runner: str, reader: str | None) -> dict:
    """A charge tool whose refund runs on ``runner`` and whose read-back (none without ``reader``)
    runs on ``reader``."""
    entry = {"name": name, "effect": "write",
             "compensation": {"tool": "payments.refund", "kind": "compensation",
                              "args": {"charge_id": "$result.id", "amount": "$args.amount"}, "runner": runner}}
    if reader:
        entry["verification"] = {"tool": "payments.get_charge", "args": {"charge_id": "$result.id"},
                                 "expect": {"refunded": True}, "retries": 2, "backoffMs": 200, "runner": reader}
    return entry


def test_lying_jobs_leave_the_report_as_the_matrix_says_against_the_downstream(rv):
    """docs/guarantees.md#c-lies and #r-lies: three charges whose refunds exit 0 and call nothing.
    Step 0 has an honest read-back: it finds the charge standing, reads again, and the step is
    failed (``verification failed``), residue ``failed``. Step 1 declares no read-back, step 2 a
    reader that says "refunded": both are reported compensated (WRONG, and Reversi cannot know),
    while the downstream shows every charge standing and no refund at all."""
    body = manifest_body(rv.downstream.url)
    tools = body["spec"]["runners"][0]
    body["spec"]["runners"] += [
        {**tools, "name": "liar", "command": ["sh", "-c", "echo '{\"id\": \"re_0\"}'"]},
        {**tools, "name": "liar-reader", "command": ["sh", "-c", "echo '{\"refunded\": true}'"]}]
    body["spec"]["tools"] += [_charge_tool("lies.honest_read", "liar", "tools"),
                              _charge_tool("lies.no_read", "liar", None),
                              _charge_tool("lies.lying_read", "liar", "liar-reader")]
    rv.manifest = rv.create("toolmanifests", body)
    charges = [rv.charge(f"o-lie-{i}") for i in range(3)]
    names = ["lies.honest_read", "lies.no_read", "lies.lying_read"]
    rv.run("r", [rv.step(i, names[i], {"order_id": f"o-lie-{i}", "amount": 700, "customer": "cus_9"}, charges[i])
                 for i in range(3)])
    rv.request("undo", "r", retries=1, parallelism=3)
    req = rv.wait_phase("undo", *TERMINAL, timeout=60)
    report = req["status"]["report"]
    assert req["status"]["phase"] == "Incomplete" and report["compensated"] == [1, 2], report
    assert [f["step"] for f in report["failed"]] == [0] and "verification failed" in report["failed"][0]["error"]
    assert [(r["step"], r["type"]) for r in report["residue"]] == [(0, "failed")], report["residue"]
    assert report["noReadBack"] == [1] and _undo(rv, "r")[2]["verification"] == "verified"
    # the truth downstream: nothing was refunded, whatever the report says of steps 1 and 2
    assert not [c for c in rv.downstream.state()["calls"] if c["path"] == "/payments/refunds"]
    assert not any(rv.downstream.get(f"/payments/charges/{c['id']}")["refunded"] for c in charges)


READERS = {
    "errors": "{tool} >/dev/null; echo 'HTTP 503 from the downstream' >&2; exit 1",
    "logs after its answer": "{tool}; echo 'closing the connection' >&2",
}


@pytest.mark.parametrize("reader", list(READERS))
def test_a_reader_that_errors_or_logs_after_its_answer_fails_its_reads_of_an_undo_that_took(rv, reader):
    """docs/guarantees.md#r-errors and #r-noise: the reader reads the refunded charge, then exits
    1 by itself, or prints a line on stderr after its answer (the pod's log holds both streams). Both
    reads fail (``read failed``), the step is failed with residue ``unknown``: the undo ran and
    nobody knows whether it took. Downstream it did: one refund."""
    tool = " ".join(map(shlex.quote, [sys.executable, str(TOOL)]))
    rv.apply_manifest(reader_command=["sh", "-c", READERS[reader].format(tool=tool)])
    charge = rv.charge("o-read")
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-read", "amount": 700, "customer": "cus_9"},
                         charge)])
    rv.request("undo", "r")
    req = rv.wait_phase("undo", *TERMINAL, timeout=60)
    report = req["status"]["report"]
    assert req["status"]["phase"] == "Incomplete" and [f["step"] for f in report["failed"]] == [0], report
    error = report["failed"][0]["error"]
    assert error.startswith("verification failed: read failed: "), error
    if reader == "logs after its answer":
        assert "the reader printed no JSON" in error and "closing" not in error, error
    assert [(r["step"], r["type"]) for r in report["residue"]] == [(0, "unknown")], report["residue"]
    assert len(_jobs(rv, "reader", 0)) == 2  # verification.retries: 2 reads, each answered
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    assert _calls(rv, "/payments/refunds") == [False]


# ------------------------------------------------------------------------------ the compensator fails after its call


def test_a_compensator_that_fails_after_its_call_took_effect_is_replayed_by_the_next_request(rv):
    """docs/guarantees.md#c-fails: the refund takes effect, but its answer comes after the
    compensator's own 1 s timeout, so the program exits 1 by itself ("timed out"). With one attempt
    the step is failed, residue ``failed`` ("may remain") although the refund happened: Reversi
    cannot know. The next request sends the same key: the downstream replays it, the read-back
    confirms it, compensated; one refund in all."""
    body = manifest_body(rv.downstream.url)
    body["spec"]["runners"][0]["env"].append({"name": "DOWNSTREAM_TIMEOUT", "value": "1"})
    rv.manifest = rv.create("toolmanifests", body)
    charge = rv.charge("o-late")
    rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-late", "amount": 700, "customer": "cus_9"},
                         charge)])
    rv.downstream.fault("/payments/refunds", "timeout", times=1, delay_s=4)
    rv.request("first", "r", retries=1)
    first = rv.wait_phase("first", *TERMINAL, timeout=60)["status"]
    assert first["phase"] == "Incomplete" and "timed out" in first["report"]["failed"][0]["error"], first["report"]
    assert [(r["step"], r["type"]) for r in first["report"]["residue"]] == [(0, "failed")]
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True  # it did take effect
    rv.request("second", "r")
    second = rv.wait_phase("second", *TERMINAL, timeout=60)["status"]
    assert second["phase"] == "Succeeded" and second["report"]["compensated"] == [0], second["report"]
    [undo] = rv.undo("r")
    assert (undo["attempts"], undo["verification"]) == (2, "verified")
    refunds = [c for c in rv.downstream.state()["calls"] if c["path"] == "/payments/refunds"]
    assert [(c["key"], c["replayed"]) for c in refunds] == [(undo["idempotencyKey"], False),
                                                            (undo["idempotencyKey"], True)]
