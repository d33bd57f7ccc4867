"""Nested runs (docs/concepts.md#nested-runs) on the real control plane.

A parent with two children rolls back all three in causal order with one report (the order read
from the downstream server's log of calls), a child rolled back on its own first is
``alreadyRecovered`` with zero extra compensator runs (compensator Jobs and downstream calls
counted), admission refuses what the rules forbid with messages that say what to fix, and a halt on
the parent's scope stops the child's calls.

Every compensator and reader is ``demo/downstream/tool.py`` run as a Job.
"""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from reversi.adapters.journal import step_body
from reversi.models.run import MAX_TREE_RUNS
from reversi.sdk import Halted, Recorder
from tests.helpers import wait_for
from tests.integration.test_plugin import kr

pytestmark = pytest.mark.cluster
G, V = "reversi.dev", "v1alpha1"


def _open(rv, name: str, parent: str | None = None, actor: str = "test-agent", **ref) -> dict:
    spec: dict = {"scope": {"actor": actor}, "manifestRef": {"name": "payments"}}
    if parent is not None:
        spec["parentRef"] = {"name": parent, **ref}
    return rv.create("runs", {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": name}, "spec": spec})


def _reserve_step(rv, run: str, index: int, ids: dict) -> None:
    """Record step ``index`` of ``run``: a real reservation (the call), then its RunStep."""
    order = f"{run}-{index}"
    held = rv.reserve(order)
    ids[held["id"]] = (run, index)
    rv.create("runsteps", step_body(rv.ns, run, rv.step(index, "inventory.reserve",
                                                          {"sku": "sku-mug", "qty": 1, "order_id": order}, held)))


def _tree(rv, ids: dict) -> None:
    """p: step 0, child a (opened at 1), a's steps 0 and 1, p's step 1, child b (opened at 2), b's
    steps 0 and 1, p's step 2."""
    _open(rv, "p")
    _reserve_step(rv, "p", 0, ids)
    _open(rv, "a", parent="p", step=99)  # a client's step is ignored: the server records the parent's count
    _reserve_step(rv, "a", 0, ids)
    _reserve_step(rv, "a", 1, ids)
    _reserve_step(rv, "p", 1, ids)
    _open(rv, "b", parent="p")
    _reserve_step(rv, "b", 0, ids)
    _reserve_step(rv, "b", 1, ids)
    _reserve_step(rv, "p", 2, ids)


def _releases(rv, ids: dict, since: float) -> list[tuple[str, int]]:
    calls = [c for c in rv.downstream.state()["calls"] if c["at"] >= since and not c["replayed"]]
    out = []
    for c in calls:
        parts = c["path"].split("/")
        if c["path"].startswith("/inventory/reservations/") and parts[-1] == "release":
            out.append(ids[parts[-2]])
    return out


def _compensators(rv, run: str) -> int:
    uid = rv.get("runs", run)["metadata"]["uid"]
    jobs = rv.batch.list_namespaced_job(rv.ns, label_selector=f"reversi.dev/role=compensator,reversi.dev/run-uid={uid}")
    return len(jobs.items)


def _child_request(rv, request: str) -> str:
    """The name of the first child request that ``request``'s report names, once it exists."""

    def made():
        runs = ((rv.get("rollbackrequests", request).get("status") or {}).get("report") or {}).get("runs", [])
        name = next((s["request"] for s in runs[1:] if s.get("request")), None)
        try:
            return name and rv.get("rollbackrequests", name) and name
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    return wait_for(made, timeout=60, what=f"the child request of {request}")


def _cond(obj: dict, ctype: str) -> dict:
    return next(x for x in obj["status"]["conditions"] if x["type"] == ctype)


def _refused(rv, fn) -> str:
    with pytest.raises(ApiException) as err:
        fn()
    body = err.value.body
    try:
        return json.loads(body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(body)


def test_parent_with_two_children_rolls_back_all_three_in_causal_order_with_one_report(rv, cluster):
    rv.apply_manifest()
    ids: dict = {}
    _tree(rv, ids)
    assert rv.get("runs", "a")["spec"]["parentRef"] == {"name": "p", "step": 1}
    assert rv.get("runs", "b")["spec"]["parentRef"] == {"name": "p", "step": 2}
    assert rv.get("runs", "b")["metadata"]["labels"]["reversi.dev/parent"] == "p"
    # the plugin's plan shows the order a rollback of p will follow
    plan = kr(cluster, "plan", "p", namespace=rv.ns)
    assert "Child runs: a rollback of this run undoes, in this order:" in plan.stdout, plan.stdout + plan.stderr
    order_text = plan.stdout[plan.stdout.index("Child runs:"):]
    assert [line.strip() for line in order_text.splitlines()[1:8]] == [
        "- step 2 of p", "- child Run b (opened at step 2), as one unit", "- steps 1..0 of b", "- step 1 of p",
        "- child Run a (opened at step 1), as one unit", "- steps 1..0 of a", "- step 0 of p"], plan.stdout
    started = time.time()
    rv.request("undo", "p")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", timeout=240)
    described = kr(cluster, "describe", "undo", namespace=rv.ns).stdout
    assert "Runs (nested, in rollback order):" in described, described
    # downstream truth: each reservation released once, in causal order
    order = _releases(rv, ids, started)
    assert order == [("p", 2), ("b", 1), ("b", 0), ("p", 1), ("a", 1), ("a", 0), ("p", 0)], order
    held = [rv.downstream.get(f"/inventory/reservations/{rid}")["status"] for rid in ids]
    assert held == ["released"] * 7
    # one report: the parent's buckets, and a section per run
    report = req["status"]["phase"] == "Succeeded" and req["status"]["report"]
    assert report and report["complete"] is True and report["compensated"] == [0, 1, 2], req["status"]
    sections = {s["run"]: s for s in report["runs"]}
    assert [s["run"] for s in report["runs"]] == ["p", "b", "a"]
    assert sections["p"]["outcome"] == "rolledBack"
    for child, opened in (("a", 1), ("b", 2)):
        assert sections[child]["outcome"] == "rolledBack" and sections[child]["complete"] is True
        assert sections[child]["opened"] == opened and sections[child]["compensated"] == 2
        sub = rv.get("rollbackrequests", sections[child]["request"])
        assert sub["metadata"]["ownerReferences"][0]["name"] == "undo"
        assert sub["status"]["report"]["compensated"] == [0, 1]
    assert {_compensators(rv, r) for r in ("p", "a", "b")} == {len(rv.steps(r)) for r in ("p", "a", "b")}
    # one lock over the tree, released together; every run closed by the request
    for run in ("p", "a", "b"):
        obj = rv.get("runs", run)
        assert obj["status"].get("activeRequest") is None and obj["status"]["closedBy"] == "undo"
        assert _cond(obj, "RolledBack")["status"] == "True"
    # the parent is closed: no new child, no new step in a child
    msg = _refused(rv, lambda: _open(rv, "late", parent="p"))
    assert "was rolled back by RollbackRequest undo" in msg and "child runs" in msg, msg


def test_a_child_rolled_back_first_is_already_recovered_and_its_compensators_never_run_twice(rv):
    rv.apply_manifest()
    ids: dict = {}
    _tree(rv, ids)
    first = time.time()
    rv.request("undo-a", "a")
    assert rv.wait_phase("undo-a", "Succeeded", "Incomplete", timeout=120)["status"]["phase"] == "Succeeded"
    assert _releases(rv, ids, first) == [("a", 1), ("a", 0)]
    jobs_a = _compensators(rv, "a")
    assert jobs_a == 2
    second = time.time()
    rv.request("undo", "p")
    req = rv.wait_phase("undo", "Succeeded", "Incomplete", timeout=240)
    assert req["status"]["phase"] == "Succeeded", req["status"]
    sections = {s["run"]: s for s in req["status"]["report"]["runs"]}
    assert sections["a"]["outcome"] == "alreadyRecovered" and sections["a"]["complete"] is True
    assert "request" not in sections["a"]  # nothing was started for it
    assert sections["b"]["outcome"] == "rolledBack"
    # zero extra compensator runs for a: no Job, no downstream call
    assert _compensators(rv, "a") == jobs_a
    order = _releases(rv, ids, second)
    assert order == [("p", 2), ("b", 1), ("b", 0), ("p", 1), ("p", 0)], order


def test_admission_refuses_bad_parents_with_clear_messages(rv, admin_api):
    rv.apply_manifest()
    _open(rv, "root")
    # missing parent
    msg = _refused(rv, lambda: _open(rv, "orphan", parent="nope"))
    assert "parent Run nope not found" in msg, msg
    # cross-namespace: a parentRef has no namespace, and a Run of that name elsewhere is not a parent
    other = f"{rv.ns}-other"
    core = client.CoreV1Api(admin_api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other)))
    try:
        rv.custom.create_namespaced_custom_object(G, V, other, "runs", {
            "apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": "elsewhere"},
            "spec": {"manifestRef": {"name": "payments"}}})
        msg = _refused(rv, lambda: _open(rv, "x1", parent="elsewhere"))
        assert "parent Run elsewhere not found" in msg, msg
        msg = _refused(rv, lambda: _open(rv, "x2", parent="elsewhere", namespace=other))
        assert "same namespace" in msg, msg
    finally:
        core.delete_namespace(other)
    # itself
    msg = _refused(rv, lambda: _open(rv, "me", parent="me"))
    assert "its own parent" in msg, msg
    # a cycle: c under root; root deleted and created again under c
    _open(rv, "c", parent="root")
    rv.custom.delete_namespaced_custom_object(G, V, rv.ns, "runs", "root")
    def gone():
        try:
            rv.get("runs", "root")
        except ApiException as err:
            return err.status == 404
        return False

    wait_for(gone, what="Run root deleted")
    msg = _refused(rv, lambda: _open(rv, "root", parent="c"))
    assert "cycle" in msg and "root -> c -> root" in msg, msg
    # depth: d1 (root) .. d8 is admitted, d9 is refused
    _open(rv, "d1")
    for i in range(2, 9):
        _open(rv, f"d{i}", parent=f"d{i - 1}")
    msg = _refused(rv, lambda: _open(rv, "d9", parent="d8"))
    assert "at most 8 deep" in msg, msg
    # parentRef is immutable
    msg = _refused(rv, lambda: rv.patch("runs", "d2", {"spec": {"parentRef": {"name": "d3"}}}))
    assert "spec.parentRef is immutable" in msg, msg
    msg = _refused(rv, lambda: rv.patch("runs", "d1", {"spec": {"parentRef": {"name": "d3"}}}))
    assert "spec.parentRef is immutable" in msg, msg
    # a client cannot move the recorded opening index either
    rv.patch("runs", "d2", {"spec": {"parentRef": {"name": "d1", "step": 7}}})
    assert rv.get("runs", "d2")["spec"]["parentRef"] == {"name": "d1", "step": 0}


def test_a_halt_on_the_parents_scope_stops_the_childs_calls(rv):
    rv.apply_manifest()
    _open(rv, "boss", actor="planner")
    child = Recorder.open(rv.ns, "worker", manifest="payments", parent="boss", scope={"actor": "sub-agent"},
                          api=rv.api)  # the SDK opens a child run
    assert rv.get("runs", "worker")["spec"]["parentRef"] == {"name": "boss", "step": 0}
    _open(rv, "free", actor="sub-agent")
    rv.create("halts", {"apiVersion": f"{G}/{V}", "kind": "Halt", "metadata": {"name": "stop-planner"},
                        "spec": {"reason": "planner misbehaves", "scope": {"actor": "planner"}}})
    body = step_body(rv.ns, "worker", rv.step(0, "inventory.reserve", {"sku": "s", "qty": 1, "order_id": "h"}))
    msg = _refused(rv, lambda: rv.create("runsteps", body))
    assert "kill switch: planner misbehaves" in msg and "ancestor Run boss" in msg, msg
    calls = []
    with pytest.raises(Halted) as err:  # the SDK raises before the call is made
        child.call("inventory.reserve", {"sku": "s", "qty": 1, "order_id": "h"}, calls.append)
    assert "ancestor Run boss" in str(err.value) and calls == []
    # a run outside the tree with the same own scope is not halted
    rv.create("runsteps", step_body(rv.ns, "free", rv.step(0, "inventory.reserve",
                                                             {"sku": "s", "qty": 1, "order_id": "f"})))
    # the child's own scope still matches too
    rv.create("halts", {"apiVersion": f"{G}/{V}", "kind": "Halt", "metadata": {"name": "stop-sub"},
                        "spec": {"reason": "sub-agents paused", "scope": {"actor": "sub-agent"}}})
    msg = _refused(rv, lambda: rv.create("runsteps", step_body(rv.ns, "free", rv.step(
        1, "inventory.reserve", {"sku": "s", "qty": 1, "order_id": "f2"}))))
    assert "kill switch: sub-agents paused" in msg, msg


APPROVED_RESERVE = {"name": "inventory.reserve_approved", "effect": "write",
                    "compensation": {"tool": "inventory.release", "kind": "inverse",
                                     "args": {"reservation_id": "$result.id"}, "requiresApproval": True,
                                     "runner": "tools"}}


def _parent_and_approval_child(rv) -> tuple[dict, dict]:
    """p (one reservation) and its child a, whose one reservation needs approval to be released:
    ``({reservation id: (run, step)} of p, the child's reservation)``."""
    rv.apply_manifest(extra_tools=[APPROVED_RESERVE])
    ids: dict = {}
    _open(rv, "p")
    _reserve_step(rv, "p", 0, ids)
    _open(rv, "a", parent="p")
    held = rv.reserve("a-0")
    rv.create("runsteps", step_body(rv.ns, "a", rv.step(0, APPROVED_RESERVE["name"],
                                                        {"sku": "sku-mug", "qty": 1, "order_id": "a-0"}, held)))
    return ids, held


def test_a_child_held_by_another_request_makes_the_parent_wait_and_a_cancel_reaches_the_child(rv):
    ids, held = _parent_and_approval_child(rv)
    # a request of the child alone holds the child's lock while it waits for an approval
    rv.request("undo-a", "a")
    rv.wait_phase("undo-a", "AwaitingApproval")
    rv.request("undo", "p")
    waiting = rv.wait_phase("undo", "Waiting")
    assert f"RollbackRequest {rv.ns}/undo-a is working on Run {rv.ns}/a" in _cond(waiting, "Running")["message"]
    # all or nothing: the parent's run is not locked while its child is held by another request
    assert rv.get("runs", "p")["status"].get("activeRequest") is None
    assert rv.get("runs", "a")["status"]["activeRequest"] == "undo-a"
    rv.patch("rollbackrequests", "undo-a", {"spec": {"cancel": True}})
    rv.wait_phase("undo-a", "Incomplete")
    # the tree's request takes the whole tree; the child (opened at 1) goes first, by its own request
    sub = _child_request(rv, "undo")
    rv.wait_phase(sub, "AwaitingApproval")
    for run in ("p", "a"):
        assert rv.get("runs", run)["status"]["activeRequest"] == "undo"
    # the parent's step 0 waits for the child (it was recorded before the child was opened)
    p0 = next(iter(ids))
    assert rv.downstream.get(f"/inventory/reservations/{p0}")["status"] == "held"
    rv.patch("rollbackrequests", "undo", {"spec": {"cancel": True}})
    req = rv.wait_phase("undo", "Incomplete", "Succeeded", timeout=120)
    assert req["status"]["phase"] == "Incomplete" and _cond(req, "Complete")["reason"] == "Cancelled"
    assert rv.get("rollbackrequests", sub)["spec"]["cancel"] is True
    sections = {s["run"]: s for s in req["status"]["report"]["runs"]}
    assert sections["a"]["outcome"] == "cancelled" and sections["a"]["complete"] is False
    assert req["status"]["report"]["cancelled"] == [0] and req["status"]["report"]["complete"] is False
    # nothing ran: no compensator Job, no release; every run of the tree released
    assert _compensators(rv, "p") == 0 and _compensators(rv, "a") == 0
    assert rv.downstream.get(f"/inventory/reservations/{held['id']}")["status"] == "held"
    for run in ("p", "a"):
        assert rv.get("runs", run)["status"].get("activeRequest") is None


def test_deleting_the_tree_request_mid_way_releases_every_run_of_the_tree(rv):
    _parent_and_approval_child(rv)
    rv.request("undo", "p")
    sub = _child_request(rv, "undo")
    rv.wait_phase(sub, "AwaitingApproval")
    assert {rv.get("runs", r)["status"]["activeRequest"] for r in ("p", "a")} == {"undo"}
    rv.custom.delete_namespaced_custom_object(G, V, rv.ns, "rollbackrequests", "undo",
                                              body=client.V1DeleteOptions(propagation_policy="Foreground"))

    def released():
        return all(not (rv.get("runs", r).get("status") or {}).get("activeRequest") for r in ("p", "a"))

    wait_for(released, timeout=60, what="every run of the tree released")
    for run in ("p", "a"):
        locked = _cond(rv.get("runs", run), "Locked")
        assert locked["status"] == "False", locked

    def sub_gone():
        try:
            rv.get("rollbackrequests", sub)
        except ApiException as err:
            return err.status == 404
        return False

    wait_for(sub_gone, timeout=60, what="the child's request deleted with the tree's request")
    assert _compensators(rv, "a") == 0 and _compensators(rv, "p") == 0


def test_a_tree_holds_at_most_64_runs_below_its_root(rv):
    rv.apply_manifest()
    _open(rv, "big")
    for i in range(MAX_TREE_RUNS - 1):
        _open(rv, f"c{i}", parent="big")
    _open(rv, "deep", parent=f"c{MAX_TREE_RUNS - 2}")  # a grandchild counts too: 64 below the root
    msg = _refused(rv, lambda: _open(rv, "one-more", parent="c0"))
    assert f"the tree of root Run big already has {MAX_TREE_RUNS} runs below its root" in msg, msg
    assert rv.get("runs", "deep")["metadata"]["labels"]["reversi.dev/root"] == "big"


def test_plan_of_a_parent_is_not_fully_reversible_when_a_child_run_is_not(rv, cluster):
    """The plan's verdict and exit code cover the whole tree: a parent whose own steps can all be
    undone, with a child that sent an email (irreversible), is not fully reversible."""
    rv.apply_manifest()
    ids: dict = {}
    _open(rv, "shop")
    _reserve_step(rv, "shop", 0, ids)
    _open(rv, "mail", parent="shop")
    rv.create("runsteps", step_body(rv.ns, "mail", rv.step(0, "email.send", {"to": "c@example.com"}, {"id": "m1"})))
    alone = kr(cluster, "plan", "mail", namespace=rv.ns)
    assert alone.returncode == 2, alone.stdout + alone.stderr
    text = kr(cluster, "plan", "shop", namespace=rv.ns)
    assert text.returncode == 2, text.stdout + text.stderr
    assert "Not fully reversible below this run: mail" in text.stdout, text.stdout
    as_json = kr(cluster, "plan", "shop", "-o", "json", namespace=rv.ns)
    doc = json.loads(as_json.stdout)
    assert as_json.returncode == 2 and doc["fullyReversible"] is False
    assert {r["run"]: r["fullyReversible"] for r in doc["runs"]} == {"shop": True, "mail": False}
    named = kr(cluster, "plan", "shop", "-o", "name", namespace=rv.ns)
    assert named.stdout.splitlines() == ["run.reversi.dev/shop", "run.reversi.dev/mail"]
