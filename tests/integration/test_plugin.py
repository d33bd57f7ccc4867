"""``kubectl reversi`` on the real control plane: each command run as a subprocess, checked by its
exit code, its output and the API objects it created or changed.

Approvals and resolutions are stamped with the user (``approver``, ``actor``) by an admission
webhook when it is installed; these tests accept an entry with the stamp or without it, but
never one with a different user or with fields the plugin did not send.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from reversi.adapters.journal import step_body
from tests.helpers import wait_for

pytestmark = pytest.mark.cluster
#: steps of the long run (as in test_journal.py): recording is sequential per run
LONG_RUN = int(os.environ.get("REVERSI_LONG_RUN_STEPS", "600"))

ADMIN = "reversi-admin"  # the user of the local control plane's admin kubeconfig
GROUP, VERSION = "reversi.dev", "v1alpha1"


# ------------------------------------------------------------------------------- helpers


def kr(cluster, *args: str, namespace: str | None = None, kubeconfig: Path | None = None,
       timeout: float = 180) -> subprocess.CompletedProcess:
    """Run ``kubectl-reversi`` (as ``python -m reversi.entrypoints.plugin``)."""
    cmd = [sys.executable, "-m", "reversi.entrypoints.plugin",
           "--kubeconfig", str(kubeconfig or cluster.paths.admin_kubeconfig)]
    if namespace:
        cmd += ["-n", namespace]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout)


def complete(cluster, *words: str, namespace: str) -> list[str]:
    """What ``kubectl_complete-reversi`` answers kubectl for ``kubectl reversi WORDS<TAB>``."""
    entry = "from reversi.entrypoints.plugin import complete_main; complete_main()"
    done = subprocess.run([sys.executable, "-c", entry, "--kubeconfig", str(cluster.paths.admin_kubeconfig),
                           "-n", namespace, *words], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout.splitlines()


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The process failed with exit 1 and one ``error: ...`` line on stderr, no traceback."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def charge_step(rv, index: int, order: str, **kw) -> tuple[dict, dict]:
    charge = rv.charge(order)
    return rv.step(index, "payments.create_charge", {"order_id": order, "amount": 700, "customer": "cus_9"},
                   charge, **kw), charge


def example_run(rv, name: str = "order-4711") -> dict:
    """The example run: a read, a charge, an uncertain capture, an email."""
    s1, charge = charge_step(rv, 1, f"o-{uuid.uuid4().hex[:6]}")
    rv.run(name, [
        rv.step(0, "payments.get_customer", {"id": "cus_9"}, {"id": "cus_9"}),
        s1,
        rv.step(2, "payments.capture", {"charge_id": charge["id"]}, outcome="uncertain"),
        rv.step(3, "email.send", {"to": "customer"}, {"id": "msg_1"}),
    ])
    return charge


def stamped_or_absent(entry: dict, field: str) -> None:
    """The webhook stamps ``field`` with the authenticated user; before it lands it is absent."""
    assert entry.get(field) in (None, ADMIN), entry


# ---------------------------------------------------------------------------------- plan


def test_plan_of_the_design_example_matches_the_operators_dry_run_and_exits_2(rv, cluster):
    rv.apply_manifest()
    example_run(rv)
    table = kr(cluster, "plan", "order-4711", namespace=rv.ns)
    assert table.returncode == 2, table.stderr
    rows = {line.split()[0]: line for line in table.stdout.splitlines() if line[:1].isdigit()}
    assert set(rows) == {"0", "1", "2", "3"}
    assert "defer" in rows["1"] and "blocked by 2 (unresolved)" in rows["1"]
    assert "unresolved" in rows["2"] and "unrecoverable" in rows["3"]
    assert "Verdict: NOT fully reversible" in table.stdout

    proc = kr(cluster, "plan", "order-4711", "-o", "json", namespace=rv.ns)
    assert proc.returncode == 2, proc.stderr
    mine = json.loads(proc.stdout)
    assert mine["fullyReversible"] is False
    as_yaml = kr(cluster, "plan", "order-4711", "-o", "yaml", namespace=rv.ns)
    assert as_yaml.returncode == 2 and yaml.safe_load(as_yaml.stdout) == mine  # the same document, as YAML
    named = kr(cluster, "plan", "order-4711", "-o", "name", namespace=rv.ns)
    assert named.stdout == "run.reversi.dev/order-4711\n"
    wide = kr(cluster, "plan", "order-4711", "-o", "wide", namespace=rv.ns)
    assert "UNDO KIND" in wide.stdout and '"amount":700' in wide.stdout
    assert [a["kind"] for a in mine["actions"]] == ["skip", "defer", "unresolved", "unrecoverable"]

    # the same plan as the operator's own dry run (same keys, args, blockers)
    dry = kr(cluster, "rollback", "order-4711", "--dry-run", "--name", "plan-only", "--wait", namespace=rv.ns)
    assert dry.returncode == 2, dry.stdout + dry.stderr  # planned, and not fully reversible
    assert dry.stdout.splitlines()[0] == "plan-only"
    assert "Phase:        Planned" in dry.stdout and "Plan (NOT fully reversible" in dry.stdout
    theirs = {a["step"]: a for a in rv.get("rollbackrequests", "plan-only")["status"]["plan"]["actions"]}
    assert theirs, "the operator planned something"
    for action in mine["actions"]:
        if action["step"] not in theirs:
            assert action["kind"] == "skip"  # the status leaves skips out
            continue
        op = theirs[action["step"]]
        assert action["kind"] == op["kind"]
        assert action["blockedBy"] == op.get("blockedBy", [])
        assert action["idempotencyKey"] == op.get("idempotencyKey")
        assert action["args"] == op.get("args")
        assert action["residue"] == op.get("residue", [])
    assert rv.batch.list_namespaced_job(rv.ns).items == [], "a plan and a dry run undo nothing"


def test_plan_of_a_reversible_run_exits_0_with_resolved_args_and_key(rv, cluster):
    rv.apply_manifest()
    s0, charge = charge_step(rv, 0, "o-plan-ok")
    rv.run("r", [s0])
    proc = kr(cluster, "plan", "r", "-o", "json", namespace=rv.ns)
    assert proc.returncode == 0, proc.stderr
    action = json.loads(proc.stdout)["actions"][0]
    assert action["kind"] == "compensate" and action["compensationTool"] == "payments.refund"
    assert action["args"] == {"charge_id": charge["id"], "amount": 700}
    assert len(action["idempotencyKey"]) == 64 and action["verified"] is True
    assert action["compensationKind"] == "compensation" and action["needsApproval"] is False
    human = kr(cluster, "plan", "r", namespace=rv.ns)
    assert human.returncode == 0 and "Verdict: fully reversible" in human.stdout
    assert complete(cluster, "plan", "", namespace=rv.ns) == ["r", ":4"]  # RUN names from the cluster
    assert complete(cluster, "plan", "x", namespace=rv.ns) == [":4"]


def test_plan_of_a_missing_run_is_one_line_naming_the_fix(rv, cluster):
    line = one_line_error(kr(cluster, "plan", "order-9", namespace=rv.ns))
    assert line == f"error: Run {rv.ns}/order-9 not found; check the name with kubectl get runs -n {rv.ns}"


# ------------------------------------------------------------------------------ rollback


def test_rollback_wait_undoes_the_run_and_exits_0(rv, cluster):
    rv.apply_manifest()
    s0, charge = charge_step(rv, 0, "o-rb-ok")
    rv.run("r", [s0])
    proc = kr(cluster, "rollback", "r", "--wait", "--retries", "2", "--parallelism", "2", "--timeout", "120",
              namespace=rv.ns)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    name = proc.stdout.splitlines()[0]
    assert name.startswith("r-undo-") and len(name) == len("r-undo-") + 5
    req = rv.get("rollbackrequests", name)
    assert req["spec"]["runRef"] == {"name": "r"}
    assert (req["spec"]["retries"], req["spec"]["parallelism"]) == (2, 2)
    assert req["spec"]["dryRun"] is False and req["spec"]["approveCompensations"] is False
    assert req["status"]["phase"] == "Succeeded"
    assert "phase Succeeded" in proc.stdout
    assert "step 0  payments.create_charge -> payments.refund" in proc.stdout  # live progress lines
    assert "Compensated (undone and checked by a reader): 1" in proc.stdout
    assert "the charge stays visible on the customer's statement" in proc.stdout
    assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True

    # the logs of the step's Jobs, read from their pods (the compensator printed the refund, the reader the charge)
    logs = kr(cluster, "logs", name, namespace=rv.ns)
    assert logs.returncode == 0, logs.stderr
    heading, *text = logs.stdout.splitlines()
    assert heading.startswith("==> step 0 (payments.refund): Job rv-") and heading.endswith("-0-c1 <==")
    assert charge["id"] in "\n".join(text)
    read = kr(cluster, "logs", name, "--step", "0", "--reader", "--tail", "1", namespace=rv.ns)
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout)["refunded"] is True  # the read-back's answer, alone
    assert complete(cluster, "logs", "r-", namespace=rv.ns) == [name, ":4"]  # REQUEST names from the cluster
    absent = kr(cluster, "logs", name, "--step", "7", namespace=rv.ns)
    assert "step 7 of RollbackRequest" in one_line_error(absent) and "has no compensator Job" in absent.stderr


def test_rollback_without_wait_prints_the_name_and_creates_the_request(rv, cluster):
    rv.apply_manifest()
    s0, _ = charge_step(rv, 0, "o-rb-nowait")
    rv.run("r", [s0])
    proc = kr(cluster, "rollback", "r", "--name", "mine", namespace=rv.ns)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "mine\n"
    assert "kubectl reversi describe mine" in proc.stderr
    assert rv.get("rollbackrequests", "mine")["spec"]["runRef"]["name"] == "r"
    again = kr(cluster, "rollback", "r", "--name", "mine", namespace=rv.ns)
    assert "RollbackRequest" in one_line_error(again) and "already exists" in again.stderr
    rv.wait_phase("mine", "Succeeded", "Incomplete")


def test_rollback_wait_of_an_incomplete_undo_exits_2_and_says_what_to_do(rv, cluster):
    rv.apply_manifest(capture_needs_approval=False)
    example_run(rv, "r")
    proc = kr(cluster, "rollback", "r", "--wait", "--name", "undo", namespace=rv.ns)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert rv.get("rollbackrequests", "undo")["status"]["phase"] == "Incomplete"
    out = proc.stdout
    assert "Report (NOT complete)" in out
    assert "Unresolved (outcome intended or uncertain: Reversi will not guess): 1\n  step 2  payments.capture" in out
    assert "step 3  email.send: irreversible: the customer has read the email" in out
    assert "step 1  payments.create_charge: blocked by 2" in out
    todo = out.split("What to do next:")[1]
    assert f"kubectl reversi resolve r 2 --status succeeded|failed [--result JSON] --note TEXT -n {rv.ns}" in todo


def test_rollback_wait_of_an_unusable_request_exits_2_with_the_fix(rv, cluster):
    rv.apply_manifest()
    s0, _ = charge_step(rv, 0, "o-nomanifest")
    rv.run("r", [s0])
    rv.custom.delete_namespaced_custom_object(GROUP, VERSION, rv.ns, "toolmanifests", "payments")
    proc = kr(cluster, "rollback", "r", "--wait", "--name", "undo", namespace=rv.ns)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Phase:        Failed" in proc.stdout and "Invalid:      ManifestNotFound:" in proc.stdout
    todo = proc.stdout.split("What to do next:")[1]
    assert f"ToolManifest {rv.ns}/payments" in todo and f"kubectl reversi rollback r -n {rv.ns}" in todo


def test_rollback_of_a_missing_run_creates_nothing(rv, cluster):
    line = one_line_error(kr(cluster, "rollback", "ghost", "--wait", namespace=rv.ns))
    assert f"Run {rv.ns}/ghost not found" in line
    assert rv.custom.list_namespaced_custom_object(GROUP, VERSION, rv.ns, "rollbackrequests")["items"] == []


def test_rollback_wait_stops_at_approval_then_approve_step_finishes_it(rv, cluster):
    rv.apply_manifest(capture_needs_approval=True)
    s0, charge = charge_step(rv, 0, "o-approve")
    capture = rv.capture(charge["id"])
    rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, capture)])
    proc = kr(cluster, "rollback", "r", "--wait", "--name", "undo", "--approval-grace", "2", namespace=rv.ns)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "phase AwaitingApproval" in proc.stdout
    assert "Stopped waiting: steps 1 wait for approval" in proc.stdout
    assert f"kubectl reversi approve undo --step 1 -n {rv.ns}" in proc.stdout
    assert rv.get("rollbackrequests", "undo")["status"]["phase"] == "AwaitingApproval"
    assert rv.downstream.get(f"/payments/captures/{capture['id']}")["status"] == "captured"

    wrong = kr(cluster, "approve", "undo", "--step", "0", namespace=rv.ns)
    assert "needs no approval" in one_line_error(wrong)
    ok = kr(cluster, "approve", "undo", "--step", "1", namespace=rv.ns)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"RollbackRequest {rv.ns}/undo: approved step(s) 1")
    approvals = rv.get("rollbackrequests", "undo")["spec"]["approvals"]
    assert [a["step"] for a in approvals] == [1]
    assert set(approvals[0]) <= {"step", "approver", "approvedAt"}
    stamped_or_absent(approvals[0], "approver")
    again = kr(cluster, "approve", "undo", "--step", "1", namespace=rv.ns)
    if again.returncode:  # the request may already have ended, undone: approving an ended request is refused
        assert "has ended (Succeeded)" in one_line_error(again)
    else:
        assert "already approved" in again.stdout
    assert len(rv.get("rollbackrequests", "undo")["spec"]["approvals"]) == 1

    req = rv.wait_phase("undo", "Succeeded", "Incomplete")
    assert req["status"]["report"]["compensated"] == [0, 1]
    assert rv.downstream.get(f"/payments/captures/{capture['id']}")["status"] == "voided"
    described = kr(cluster, "describe", "undo", namespace=rv.ns)
    assert described.returncode == 0 and "Approved:     steps 1" in described.stdout
    late = kr(cluster, "approve", "undo", "--step", "1", namespace=rv.ns)
    assert "has ended (Succeeded)" in one_line_error(late)


def test_rollback_wait_gives_up_at_its_timeout_and_the_request_goes_on(rv, cluster):
    rv.apply_manifest(capture_needs_approval=True)
    s0, charge = charge_step(rv, 0, "o-timeout")
    rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, rv.capture(charge["id"]))])
    # the request plans only once the lock is in force at the API server (docs/concepts.md#admission): a few s
    proc = kr(cluster, "rollback", "r", "--wait", "--name", "slow", "--timeout", "12", "--approval-grace", "600",
              namespace=rv.ns)
    line = one_line_error(proc)
    assert line.startswith(f"error: timed out after 12s waiting for RollbackRequest {rv.ns}/slow "
                           "(phase AwaitingApproval")
    assert f"kubectl reversi describe slow -n {rv.ns}" in line
    assert proc.stdout.splitlines()[0] == "slow"
    assert rv.get("rollbackrequests", "slow")["status"]["phase"] == "AwaitingApproval"


def test_approve_all_sets_approve_compensations(rv, cluster):
    rv.apply_manifest(capture_needs_approval=True)
    s0, charge = charge_step(rv, 0, "o-approve-all")
    capture = rv.capture(charge["id"])
    rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, capture)])
    rv.request("undo", "r")
    rv.wait_phase("undo", "AwaitingApproval")
    proc = kr(cluster, "approve", "undo", "--all", namespace=rv.ns)
    assert proc.returncode == 0, proc.stderr
    spec = rv.get("rollbackrequests", "undo")["spec"]
    assert spec["approveCompensations"] is True
    stamped_or_absent(spec, "approvedBy")
    assert "approvals" not in spec or spec["approvals"] == []
    assert rv.wait_phase("undo", "Succeeded", "Incomplete")["status"]["phase"] == "Succeeded"
    usage = kr(cluster, "approve", "undo", namespace=rv.ns)
    assert "--step N (repeatable) or --all" in one_line_error(usage)


def _user_with(rv, cluster, verbs: list[str], resources: tuple[str, ...] = ("rollbackrequests", "runs")) -> Path:
    """A kubeconfig for a new user allowed ``verbs`` on ``resources`` (reversi.dev) in the namespace."""
    user = f"user-{uuid.uuid4().hex[:6]}"
    rbac = client.RbacAuthorizationV1Api(rv.api)
    rbac.create_namespaced_role(rv.ns, {"metadata": {"name": user}, "rules": [
        {"apiGroups": [GROUP], "resources": list(resources), "verbs": verbs}]})
    rbac.create_namespaced_role_binding(rv.ns, {"metadata": {"name": user},
                                                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                            "name": user},
                                                "subjects": [{"kind": "User", "name": user}]})
    return cluster.kubeconfig_for(user)


def test_approve_refused_by_the_server_shows_its_message(rv, cluster):
    rv.apply_manifest(capture_needs_approval=True)
    s0, charge = charge_step(rv, 0, "o-approve-rbac")
    rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, rv.capture(charge["id"]))])
    rv.request("undo", "r")
    rv.wait_phase("undo", "AwaitingApproval")

    viewer = _user_with(rv, cluster, ["get", "list", "watch"])
    line = one_line_error(kr(cluster, "approve", "undo", "--step", "1", namespace=rv.ns, kubeconfig=viewer))
    assert f"approving RollbackRequest {rv.ns}/undo refused (Forbidden):" in line
    assert viewer.stem in line and "cannot patch" in line  # the API server's own words, naming the user
    assert "RBAC verbs patch and approve" in line

    # write access is not enough: approving is a permission of its own (the admission webhook)
    editor = _user_with(rv, cluster, ["get", "list", "watch", "create", "patch", "update"])
    line = one_line_error(kr(cluster, "approve", "undo", "--step", "1", namespace=rv.ns, kubeconfig=editor))
    assert f"approving RollbackRequest {rv.ns}/undo refused (Forbidden):" in line
    assert 'verb \\"approve\\"' in line or 'verb "approve"' in line
    line = one_line_error(kr(cluster, "approve", "undo", "--all", namespace=rv.ns, kubeconfig=editor))
    assert "approveCompensations" in line and "Forbidden" in line
    line = one_line_error(kr(cluster, "rollback", "r", "--approve-compensations", namespace=rv.ns, kubeconfig=editor))
    assert "creating RollbackRequest" in line and "forbidden" in line and "approve" in line
    spec = rv.get("rollbackrequests", "undo")["spec"]
    assert not spec.get("approvals") and not spec.get("approveCompensations")
    assert [r["metadata"]["name"] for r in
            rv.custom.list_namespaced_custom_object(GROUP, VERSION, rv.ns, "rollbackrequests")["items"]] == ["undo"]

    # describe needs only the request: the Run (tool names) and the Events are extras
    reader = _user_with(rv, cluster, ["get"], resources=("rollbackrequests",))
    described = kr(cluster, "describe", "undo", namespace=rv.ns, kubeconfig=reader)
    assert described.returncode == 0, described.stderr
    assert "Phase:        AwaitingApproval" in described.stdout and "Awaiting approval: 1" in described.stdout
    assert "warning: reading Run" in described.stderr and "forbidden" in described.stderr
    assert "Run:          r  (not readable)" in described.stdout


# ------------------------------------------------------------------------------ describe


def test_describe_run_shows_the_request_that_last_held_the_run_and_errors_name_the_fix(rv, cluster):
    """describe run/RUN shows the newest request of a run that no rollback has held yet, then the
    one that last took its lock (status.lastRequest, the one its Ready condition and the alerts
    follow), even when a dry run is created after it."""
    rv.apply_manifest()
    s0, _ = charge_step(rv, 0, "o-describe")
    rv.run("r", [s0])
    rv.request("older", "r", dryRun=True)
    rv.wait_phase("older", "Planned", timeout=30)
    first = kr(cluster, "describe", "run/r", namespace=rv.ns)
    assert first.returncode == 0 and first.stdout.startswith("Name:         older\n"), first.stdout[:200]
    rv.request("newer", "r")
    rv.wait_phase("newer", "Succeeded", "Incomplete")
    time.sleep(1.1)  # creationTimestamp has whole seconds: the dry run below is the newest request
    rv.request("later-dry-run", "r", dryRun=True)
    rv.wait_phase("later-dry-run", "Planned", timeout=30)
    proc = kr(cluster, "describe", "run/r", namespace=rv.ns)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Name:         newer\n"), proc.stdout[:200]
    assert "Phase:        Succeeded" in proc.stdout and "Compensated (undone and checked by a reader): 1" in proc.stdout
    assert "RunnersRecorded" in proc.stdout and "RollbackComplete" in proc.stdout  # the request's events
    # the request that held it deleted, and its name used again for another Run: never shown for this one
    rv.run("other", [])
    rv.custom.delete_namespaced_custom_object(GROUP, VERSION, rv.ns, "rollbackrequests", "newer")
    wait_for(lambda: "newer" not in {r["metadata"]["name"] for r in rv.custom.list_namespaced_custom_object(
        GROUP, VERSION, rv.ns, "rollbackrequests")["items"]}, what="the request gone")
    rv.request("newer", "other", dryRun=True)
    reused = kr(cluster, "describe", "run/r", namespace=rv.ns)
    assert reused.returncode == 0 and reused.stdout.startswith("Name:         later-dry-run\n"), reused.stdout[:200]
    by_name = kr(cluster, "describe", "older", namespace=rv.ns)
    assert by_name.returncode == 0 and "Phase:        Planned" in by_name.stdout
    assert f"kubectl reversi rollback r -n {rv.ns}" in by_name.stdout
    missing = one_line_error(kr(cluster, "describe", "nope", namespace=rv.ns))
    assert f"RollbackRequest {rv.ns}/nope not found" in missing
    rv.run("lonely", [])
    none = one_line_error(kr(cluster, "describe", "run/lonely", namespace=rv.ns))
    assert f"no RollbackRequest for Run {rv.ns}/lonely" in none and "kubectl reversi rollback lonely" in none


# ------------------------------------------------------------------------------- resolve


def test_resolve_settles_the_runsteps_and_unblocks_the_plan(rv, cluster):
    rv.apply_manifest(capture_needs_approval=False)
    s0, charge = charge_step(rv, 0, "o-resolve")
    capture = rv.capture(charge["id"])
    reservation = rv.reserve("o-resolve")
    rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, outcome="uncertain"),
                 rv.step(2, "inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-resolve"},
                         outcome="intended")])
    assert kr(cluster, "plan", "r", namespace=rv.ns).returncode == 2

    first = kr(cluster, "resolve", "r", "1", "--status", "succeeded", "--result", json.dumps({"id": capture["id"]}),
               "--note", "seen in the payments dashboard", namespace=rv.ns)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f"Run {rv.ns}/r: step 1 resolved as succeeded")
    second = kr(cluster, "resolve", "r", "2", "--status", "succeeded", "--result",
                json.dumps({"id": reservation["id"]}),
                "--note", "reservation exists", namespace=rv.ns)
    assert second.returncode == 0, second.stderr
    resolutions = {s["spec"]["index"]: s["spec"].get("resolution") for s in rv.steps("r")}
    assert resolutions[0] is None
    assert [(i, r["status"], r.get("result"), r["note"]) for i, r in sorted(resolutions.items()) if r] == [
        (1, "succeeded", {"id": capture["id"]}, "seen in the payments dashboard"),
        (2, "succeeded", {"id": reservation["id"]}, "reservation exists")]
    for r in (resolutions[1], resolutions[2]):
        assert set(r) <= {"status", "result", "note", "actor", "resolvedAt"}
        stamped_or_absent(r, "actor")

    plan = kr(cluster, "plan", "r", "-o", "json", namespace=rv.ns)
    assert plan.returncode == 0, plan.stdout
    assert [a["kind"] for a in json.loads(plan.stdout)["actions"]] == ["compensate"] * 3


def test_resolve_refuses_what_cannot_be_settled(rv, cluster):
    rv.apply_manifest()
    s0, charge = charge_step(rv, 0, "o-resolve-bad")
    rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, outcome="uncertain")])

    def resolve(*args: str) -> str:
        return one_line_error(kr(cluster, "resolve", "r", *args, namespace=rv.ns))

    assert "has outcome succeeded" in resolve("0", "--status", "failed", "--note", "n")
    assert resolve("7", "--status", "failed", "--note", "n") == (
        f"error: Run {rv.ns}/r has no step 7 (no RunStep {rv.ns}/r-00007); "
        f"see its steps with kubectl get runsteps -l reversi.dev/run=r -n {rv.ns}")
    assert "--note is empty" in resolve("1", "--status", "failed", "--note", "  ")
    assert "Missing option '--note'" in resolve("1", "--status", "failed")
    assert "--result must be a JSON object" in resolve("1", "--status", "succeeded", "--result", "[1]", "--note", "n")
    assert "--result is not JSON" in resolve("1", "--status", "succeeded", "--result", "{id", "--note", "n")
    assert all("resolution" not in s["spec"] for s in rv.steps("r"))
    ok = kr(cluster, "resolve", "r", "1", "--status", "failed", "--note", "never happened", namespace=rv.ns)
    assert ok.returncode == 0, ok.stderr
    assert "already resolved as failed" in resolve("1", "--status", "succeeded", "--note", "changed my mind")
    assert [s["spec"].get("resolution", {}).get("note") for s in rv.steps("r")] == [None, "never happened"]
    assert one_line_error(kr(cluster, "resolve", "ghost", "0", "--status", "failed", "--note", "n",
                             namespace=rv.ns)).endswith(f"check the name with kubectl get runs -n {rv.ns}")


def test_a_stale_patch_is_recognised_as_a_lost_race(rv, cluster):
    """resolve guards its merge patch of the RunStep with metadata.resourceVersion, approve its
    JSON patch with a test of it; the server's answer when the object moved on must read as a
    race (retried), not as a refusal."""
    from reversi.cli.api import connect, lost_race

    rv.apply_manifest()
    s0, _ = charge_step(rv, 0, "o-race")
    rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": "x"}, outcome="uncertain")])
    step = rv.get("runsteps", "r-00001")
    rv.patch("runsteps", "r-00001", {"metadata": {"labels": {"touched": "yes"}}})  # the object moves on
    c = connect(str(cluster.paths.admin_kubeconfig), None, rv.ns)
    stale = step["metadata"]["resourceVersion"]
    resolution = {"status": "failed", "note": "n"}
    with pytest.raises(ApiException) as err:
        c.patch("runsteps", "r-00001", {"metadata": {"resourceVersion": stale}, "spec": {"resolution": resolution}})
    assert lost_race(err.value), err.value.body
    with pytest.raises(ApiException) as err:
        c.patch("runsteps", "r-00001", [{"op": "test", "path": "/metadata/resourceVersion", "value": stale},
                                        {"op": "add", "path": "/spec/resolution", "value": resolution}],
                json_patch=True)
    assert lost_race(err.value), err.value.body
    current = rv.get("runsteps", "r-00000")["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as err:  # a settled step: the server refuses, no race
        c.patch("runsteps", "r-00000", {"metadata": {"resourceVersion": current}, "spec": {"resolution": resolution}})
    assert not lost_race(err.value), err.value.body
    assert "resolution" not in rv.get("runsteps", "r-00001")["spec"]


# ---------------------------------------------------------------------------------- halts


def test_halt_add_list_lift(rv, cluster):
    name = f"cluster-{uuid.uuid4().hex[:6]}"
    try:
        proc = kr(cluster, "halt", "add", "dup", "--reason", "duplicate charges", "--tool", "payments.*",
                  "--actor", "checkout-agent", "--tenant", "acme", "--environment", "prod", namespace=rv.ns)
        assert proc.returncode == 0, proc.stderr
        halt = rv.get("halts", "dup")
        assert halt["spec"] == {"reason": "duplicate charges", "by": ADMIN, "scope": {
            "tool": "payments.*", "actor": "checkout-agent", "tenant": "acme", "environment": "prod"}}
        proc = kr(cluster, "halt", "add", name, "--cluster", "--namespace-glob", f"{rv.ns}*", "--reason", "freeze")
        assert proc.returncode == 0, proc.stderr
        custom = client.CustomObjectsApi(rv.api)
        ch = custom.get_cluster_custom_object(GROUP, VERSION, "clusterhalts", name)
        assert ch["spec"] == {"reason": "freeze", "by": ADMIN, "scope": {"namespace": f"{rv.ns}*"}}

        listed = kr(cluster, "halt", "list", namespace=rv.ns)
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert lines[0].split()[:4] == ["KIND", "NAME", "REASON", "SCOPE"]
        dup = next(line for line in lines if line.startswith("Halt "))
        assert "dup" in dup and "duplicate charges" in dup
        assert "tool=payments.* actor=checkout-agent tenant=acme environment=prod" in dup
        assert any(line.startswith("ClusterHalt") and name in line and f"namespace={rv.ns}*" in line for line in lines)
        everywhere = kr(cluster, "halt", "list", "-A")
        assert everywhere.returncode == 0 and rv.ns in everywhere.stdout and "NAMESPACE" in everywhere.stdout
        as_list = json.loads(kr(cluster, "halt", "list", "-o", "json", namespace=rv.ns).stdout)
        assert as_list["kind"] == "List" and {(i["kind"], i["metadata"]["name"]) for i in as_list["items"]} >= {
            ("Halt", "dup"), ("ClusterHalt", name)}
        named = kr(cluster, "halt", "list", "-o", "name", namespace=rv.ns).stdout.splitlines()
        assert "halt.reversi.dev/dup" in named and f"clusterhalt.reversi.dev/{name}" in named
        assert "IN-FORCE" in kr(cluster, "halt", "list", "-o", "wide", namespace=rv.ns).stdout

        dupe = kr(cluster, "halt", "add", "dup", "--reason", "again", namespace=rv.ns)
        assert f"Halt {rv.ns}/dup already exists; lift it first" in one_line_error(dupe)
        bad = kr(cluster, "halt", "add", "x", "--reason", "r", "--namespace-glob", "a*", namespace=rv.ns)
        assert "--namespace-glob needs --cluster" in one_line_error(bad)

        assert kr(cluster, "halt", "lift", "dup", namespace=rv.ns).returncode == 0
        assert kr(cluster, "halt", "lift", name, "--cluster").returncode == 0
        with pytest.raises(ApiException) as err:
            rv.get("halts", "dup")
        assert err.value.status == 404
        with pytest.raises(ApiException) as err:
            custom.get_cluster_custom_object(GROUP, VERSION, "clusterhalts", name)
        assert err.value.status == 404
        gone = kr(cluster, "halt", "lift", "dup", namespace=rv.ns)
        assert f"Halt {rv.ns}/dup not found" in one_line_error(gone)
        empty = kr(cluster, "halt", "list", namespace=rv.ns)
        assert empty.returncode == 0 and name not in empty.stdout and "dup" not in empty.stdout
    finally:
        _delete_cluster_halt(rv.api, name)


def _delete_cluster_halt(api, name: str) -> None:
    try:
        client.CustomObjectsApi(api).delete_cluster_custom_object(GROUP, VERSION, "clusterhalts", name)
    except ApiException as err:
        if err.status != 404:
            raise


def test_kill_switch_on_status_off(rv, cluster):
    custom = client.CustomObjectsApi(rv.api)
    try:
        on = kr(cluster, "kill-switch", "on", "--reason", "incident 42")
        assert on.returncode == 0, on.stderr
        halt = custom.get_cluster_custom_object(GROUP, VERSION, "clusterhalts", "reversi-kill-switch")
        assert halt["spec"] == {"reason": "incident 42", "by": ADMIN}  # no scope: every call everywhere
        status = kr(cluster, "kill-switch", "status")
        assert status.returncode == 0 and status.stdout.startswith(f"kill switch: ON by {ADMIN}")
        assert "incident 42" in status.stdout
        doc = yaml.safe_load(kr(cluster, "kill-switch", "status", "-o", "yaml").stdout)
        assert doc["on"] is True and doc["reason"] == "incident 42" and doc["by"] == ADMIN
        named = kr(cluster, "kill-switch", "status", "-o", "name")
        assert named.stdout == "clusterhalt.reversi.dev/reversi-kill-switch\n"
        again = kr(cluster, "kill-switch", "on", "--reason", "incident 43")
        assert again.returncode == 0 and "reason changed" in again.stdout
        assert custom.get_cluster_custom_object(GROUP, VERSION, "clusterhalts",
                                                "reversi-kill-switch")["spec"]["reason"] == "incident 43"
        off = kr(cluster, "kill-switch", "off")
        assert off.returncode == 0 and off.stdout.startswith("kill switch off")
        with pytest.raises(ApiException):
            custom.get_cluster_custom_object(GROUP, VERSION, "clusterhalts", "reversi-kill-switch")
        assert kr(cluster, "kill-switch", "status").stdout == "kill switch: off\n"
        assert json.loads(kr(cluster, "kill-switch", "status", "-o", "json").stdout) == {"on": False}
        assert "already off" in kr(cluster, "kill-switch", "off").stdout
    finally:
        _delete_cluster_halt(rv.api, "reversi-kill-switch")


# --------------------------------------------------------------------------------- export


def test_export_writes_journal_resolutions_undo_and_transitions_in_time_order(rv, cluster):
    rv.apply_manifest(capture_needs_approval=False)
    s0, charge = charge_step(rv, 0, "o-export")
    capture = rv.capture(charge["id"])
    rv.run("r", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, outcome="uncertain")],
           resolutions=[{"step": 1, "status": "succeeded", "result": {"id": capture["id"]}, "note": "seen"}])
    rv.downstream.fault("/payments/refunds", "error", times=1)
    rv.request("undo", "r", retries=3, backoff={"baseMs": 100, "maxMs": 200})
    rv.wait_phase("undo", "Succeeded", "Incomplete")
    rv.request("other-run", "not-this-one", dryRun=True)  # its events must not appear
    rv.wait_phase("other-run", "Failed", timeout=30)

    proc = kr(cluster, "export", "r", namespace=rv.ns)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    types = [r["type"] for r in records]
    assert types[:4] == ["run", "step", "step", "resolution"]
    assert records[0]["uid"] == rv.get("runs", "r")["metadata"]["uid"]
    steps = [r for r in records if r["type"] == "step"]
    assert [s["index"] for s in steps] == [0, 1] and all("snapshot" not in s for s in steps)
    assert steps[0]["result"] == charge and steps[1]["outcome"] == "uncertain"
    res = next(r for r in records if r["type"] == "resolution")
    assert (res["step"], res["status"], res["result"], res["note"]) == (1, "succeeded", {"id": capture["id"]}, "seen")
    undo = {r["step"]: r for r in records if r["type"] == "undo"}
    assert undo[0]["state"] == undo[1]["state"] == "compensated" and undo[0]["attempts"] == 2
    assert [{k: v for k, v in u.items() if k != "type"}
            for u in undo.values()] == rv.undo("r")  # status.undo of each RunStep
    transitions = [r for r in records if r["type"] == "transition"]
    assert {t["request"] for t in transitions} == {"undo"}
    reasons = [t["reason"] for t in transitions]
    assert reasons.count("CompensationRetrying") == 1 and reasons[-1] == "RollbackComplete"
    assert reasons.index("RunnersRecorded") < reasons.index("CompensationRetrying")
    times = [t["time"] for t in transitions]
    assert times == sorted(times) and all(times)
    assert types == sorted(types, key=["run", "step", "resolution", "undo", "transition"].index)

    full = kr(cluster, "export", "r", "--with-snapshots", namespace=rv.ns)
    snaps = [json.loads(line).get("snapshot") for line in full.stdout.splitlines() if '"type":"step"' in line]
    assert [s["name"] for s in snaps] == ["payments.create_charge", "payments.capture"]


# ------------------------------------------------------------------------ global options


def test_namespace_comes_from_the_context_and_options_work_after_the_command(rv, cluster, tmp_path):
    rv.apply_manifest()
    s0, _ = charge_step(rv, 0, "o-context")
    rv.run("r", [s0])
    config = yaml.safe_load(cluster.paths.admin_kubeconfig.read_text())
    config["contexts"].append({"name": "shop", "context": {**config["contexts"][0]["context"], "namespace": rv.ns}})
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump(config))
    base = [sys.executable, "-m", "reversi.entrypoints.plugin"]
    by_context = subprocess.run(base + ["--kubeconfig", str(path), "--context", "shop", "plan", "r"],
                                capture_output=True, text=True, timeout=60)
    assert by_context.returncode == 0, by_context.stderr
    after = subprocess.run(base + ["plan", "r", "--kubeconfig", str(path), "-n", rv.ns, "-o", "json"],
                           capture_output=True, text=True, timeout=60)
    assert after.returncode == 0 and json.loads(after.stdout)["fullyReversible"] is True
    default_ns = subprocess.run(base + ["--kubeconfig", str(path), "plan", "r"], capture_output=True, text=True,
                                timeout=60)
    assert "error: Run default/r not found" in one_line_error(default_ns)
    unknown = subprocess.run(base + ["--kubeconfig", str(path), "--context", "nope", "plan", "r"],
                             capture_output=True, text=True, timeout=60)
    assert "context nope not found" in one_line_error(unknown)


def test_an_unreachable_api_server_is_one_line(cluster, tmp_path):
    config = yaml.safe_load(cluster.paths.admin_kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "reversi.entrypoints.plugin", "--kubeconfig", str(path),
                           "plan", "r"], capture_output=True, text=True, timeout=120)
    line = one_line_error(proc)
    assert "cannot reach the API server at https://127.0.0.1:1" in line and "--kubeconfig" in line


# ------------------------------------------------------------------------------ large runs


def test_plan_and_export_of_a_long_run(rv, cluster):
    """The plan is computed locally from the run's RunSteps (one paged LIST), so it covers every
    step however long the run (the request's status keeps only a bounded part of it). 600 steps
    here (recording is sequential, through the webhooks), REVERSI_LONG_RUN_STEPS for more;
    benchmarks/plugin_plan_bench.py times 10,000."""
    n = LONG_RUN
    rv.apply_manifest()
    rv.run("big", [])
    for i in range(n):  # admission refuses a gap: one run is recorded in order
        tool = "payments.create_charge" if i % 2 else "payments.get_customer"
        args = {"order_id": f"o-{i}", "amount": i, "customer": "cus_9"} if i % 2 else {"id": "cus_9"}
        rv.create("runsteps", step_body(rv.ns, "big", rv.step(i, tool, args, {"id": f"ch_{i}"})))
    started = time.monotonic()
    proc = kr(cluster, "plan", "big", "-o", "json", namespace=rv.ns)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    actions = json.loads(proc.stdout)["actions"]
    assert len(actions) == n and [a["step"] for a in actions] == list(range(n))
    assert {a["kind"] for a in actions[1::2]} == {"compensate"} and {a["kind"] for a in actions[::2]} == {"skip"}
    assert actions[-1]["args"] == {"charge_id": f"ch_{n - 1}", "amount": n - 1}
    assert elapsed < 30, f"plan took {elapsed:.1f}s"
    table = kr(cluster, "plan", "big", namespace=rv.ns)
    assert table.returncode == 0 and sum(1 for line in table.stdout.splitlines() if line[:1].isdigit()) == n
    export = kr(cluster, "export", "big", namespace=rv.ns)
    assert export.returncode == 0
    records = [json.loads(line) for line in export.stdout.splitlines()]
    assert records[0]["steps"] == n
    assert [r["index"] for r in records if r["type"] == "step"] == list(range(n))


def test_plan_and_resolve_of_a_run_of_0_1_with_an_inline_journal(rv, cluster):
    """A Run recorded by Reversi 0.1 carries its steps inline; the operator copies them into
    RunSteps (status.movedSteps). The plugin plans it before and after the move, and resolves its
    steps once moved."""
    rv.apply_manifest(capture_needs_approval=False)
    s0, charge = charge_step(rv, 0, "o-inline")
    rv.inline_run("old", [s0, rv.step(1, "payments.capture", {"charge_id": charge["id"]}, outcome="uncertain")])
    plan = kr(cluster, "plan", "old", "-o", "json", namespace=rv.ns)
    assert plan.returncode == 2, plan.stderr
    assert [a["kind"] for a in json.loads(plan.stdout)["actions"]] == ["defer", "unresolved"]
    wait_for(lambda: (rv.get("runs", "old").get("status") or {}).get("movedSteps") == 2,
             timeout=60, what="the operator to move Run old into RunSteps")
    assert [s["spec"]["index"] for s in rv.steps("old")] == [0, 1]
    capture = rv.capture(charge["id"])
    ok = kr(cluster, "resolve", "old", "1", "--status", "succeeded", "--result", json.dumps({"id": capture["id"]}),
            "--note", "captured", namespace=rv.ns)
    assert ok.returncode == 0, ok.stderr
    after = kr(cluster, "plan", "old", "-o", "json", namespace=rv.ns)
    assert after.returncode == 0, after.stderr
    assert [a["kind"] for a in json.loads(after.stdout)["actions"]] == ["compensate", "compensate"]


def test_version_shows_the_plugins_and_each_crds_schema_version(cluster, crds):
    from reversi.models.common import SCHEMA_VERSION

    proc = kr(cluster, "version", "--json")  # the deprecated alias of -o json still works, and says so
    assert proc.returncode == 0 and "--json is deprecated; use -o json" in proc.stderr, proc.stderr
    answer = json.loads(proc.stdout)
    assert yaml.safe_load(kr(cluster, "version", "-o", "yaml").stdout) == answer
    assert answer["schemaVersion"] == SCHEMA_VERSION and answer["current"] is True and answer["problems"] == []
    assert set(answer["crds"]) == {f"{p}.reversi.dev" for p in
                                   ("runs", "runsteps", "rollbackrequests", "toolmanifests", "halts", "clusterhalts",
                                    "closedrunslices")}
    assert set(answer["crds"].values()) == {SCHEMA_VERSION}
    text = kr(cluster, "version")
    assert text.returncode == 0 and f"operator schema version {SCHEMA_VERSION}" in text.stdout


def test_check_without_the_chart_says_so_in_one_line_and_a_user_with_few_rights_gets_notes(cluster, namespace):
    """``kubectl reversi check`` where nothing is installed: one problem line that says how to install
    (docs/operations.md#checking-an-install); a user who may read none of it gets a note per check it could not
    make, never a refusal of the whole check."""
    absent = kr(cluster, "check", "--release-namespace", "no-reversi-here")
    assert absent.returncode == 2, (absent.stdout, absent.stderr)
    problems = [line for line in absent.stdout.splitlines() if line.startswith("✗")]
    assert problems == ["✗ namespace no-reversi-here does not exist: Reversi is not installed there; install it "
                        "(helm install reversi charts/reversi -n no-reversi-here --create-namespace), or name where "
                        "it is with --release-namespace"], absent.stdout
    nobody = kr(cluster, "check", "--release-namespace", namespace, "-o", "json",
                kubeconfig=cluster.kubeconfig_for("check-nobody"))
    assert nobody.returncode == 2 and "Traceback" not in nobody.stderr, (nobody.stdout, nobody.stderr)
    notes = [f for f in json.loads(nobody.stdout) if f["status"] == "note"]
    assert {f["check"] for f in notes} >= {"crds", "operator", "policies"}, nobody.stdout
    assert all(f["message"].startswith("not checked: you may not read") for f in notes if f["check"] == "crds")
