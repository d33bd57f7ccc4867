"""SDK recovery boundaries (README, "Recovery in code") and the run boundary (rules 11, 12), on the local
control plane, with the downstream system's own state as the truth."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes.client.rest import ApiException

from demo.downstream.client import Client, DownstreamError
from reversi.adapters.journal import step_body
from reversi.sdk import Recorder, RecoveryRequired, RollbackIncomplete, RunClosed, Settlement

SCOPE = {"actor": "test-agent"}
FAST = {"retries": 1, "backoff": {"baseMs": 100, "maxMs": 200}}


def shop(rv, timeout: float = 10.0) -> Client:
    return Client(rv.downstream.url, timeout=timeout)


def reservation(rv, rid: str) -> dict:
    return rv.downstream.get(f"/inventory/reservations/{rid}")


def charge(rv, cid: str) -> dict:
    return rv.downstream.get(f"/payments/charges/{cid}")


def test_rule_closed_run_refuses_new_steps_during_and_after_rollback(rv):
    """Rule 11: from the lock on, a new step is refused (naming the request), never reaches the
    downstream system and is never undone by that request; resolutions still work; after the
    rollback the run stays closed."""
    rv.apply_manifest()
    c = rv.charge("o-closed")
    cap = rv.capture(c["id"])
    rv.run("closed", [
        rv.step(0, "payments.create_charge", {"order_id": "o-closed", "amount": 700}, result={"id": c["id"]}),
        rv.step(1, "payments.capture", {"charge_id": c["id"]}, result={"id": cap["id"]}),
        rv.step(2, "inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-x"}, outcome="uncertain"),
    ])
    rv.request("undo-closed", "closed", **FAST)
    held = rv.wait_phase("undo-closed", "AwaitingApproval")  # the capture's undo waits: the lock is held
    assert held["status"]["runSteps"] == 3
    assert rv.get("runs", "closed")["status"]["closedBy"] == "undo-closed"

    rec = Recorder.attach(rv.ns, "closed", api=rv.api)
    reached: list[dict] = []
    with pytest.raises(RunClosed, match="run is being rolled back by RollbackRequest undo-closed") as info:
        rec.call("inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-late"},
                 lambda a: reached.append(a) or rv.reserve("o-late"))
    assert info.value.request == "undo-closed" and reached == []
    with pytest.raises(ApiException) as raw:  # any client, not only the SDK
        rv.create("runsteps", step_body(rv.ns, "closed", rv.step(3, "email.send", {"to": "x"})))
    assert "run is being rolled back by RollbackRequest undo-closed" in raw.value.body

    rv.resolve("closed", 2, status="failed", note="the shop has no such reservation")  # still admitted
    rv.patch("rollbackrequests", "undo-closed", {"spec": {"approveCompensations": True}})  # approvals too
    done = rv.wait_phase("undo-closed", "Succeeded", "Incomplete")
    assert done["status"]["report"]["complete"], done["status"]["report"]
    assert {a["step"] for a in done["status"]["plan"]["actions"]} <= {0, 1, 2}
    assert charge(rv, c["id"])["refunded"] is True
    assert not [x for x in rv.downstream.state()["reservations"].values() if x["order_id"] == "o-late"]

    with pytest.raises(RunClosed, match="run was rolled back by RollbackRequest undo-closed"):
        Recorder.attach(rv.ns, "closed", api=rv.api).call("payments.get_customer", {"id": "cus_9"},
                                                          lambda a: reached.append(a))
    assert reached == [] and len(rv.steps("closed")) == 3
    run = rv.get("runs", "closed")
    assert run["status"]["closedBy"] == "undo-closed" and not run["status"].get("activeRequest")


def test_boundary_rolls_back_three_calls_and_reraises(rv):
    """A block that raises after three calls: all three undone (downstream), the error re-raised."""
    rv.apply_manifest()
    ds = shop(rv)
    with pytest.raises(RuntimeError, match="the review said no") as info:
        with Recorder.boundary(rv.ns, "bnd-raise", manifest="payments", api=rv.api, scope=SCOPE, poll=0.2,
                               timeout=120, rollback_spec=FAST) as b:
            ch = b.call("payments.create_charge", {"order_id": "o-b1", "amount": 700, "customer": "cus_9"},
                        lambda a: ds.create_charge(a["order_id"], a["amount"], a["customer"]))
            r1 = b.call("inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-b1"},
                        lambda a: ds.reserve(a["sku"], a["qty"], a["order_id"]))
            r2 = b.call("inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-b1-2"},
                        lambda a: ds.reserve(a["sku"], a["qty"], a["order_id"]))
            raise RuntimeError("the review said no")
    assert info.type is RuntimeError
    assert b.result is not None and b.result.complete and b.result.phase == "Succeeded"
    assert charge(rv, ch["id"])["refunded"] is True
    assert reservation(rv, r1["id"])["status"] == "released"
    assert reservation(rv, r2["id"])["status"] == "released"


def test_boundary_raises_rollback_incomplete_when_an_undo_fails(rv):
    """One undo fails for good: RollbackIncomplete names the failed step, the original error is
    its cause, and the other call is still undone."""
    rv.apply_manifest()
    ds = shop(rv)
    rv.downstream.fault("/payments/refunds", "error", times=10)
    with pytest.raises(RollbackIncomplete) as info:
        with Recorder.boundary(rv.ns, "bnd-fail", manifest="payments", api=rv.api, scope=SCOPE, poll=0.2,
                               timeout=120, rollback_spec=FAST) as b:
            ch = b.call("payments.create_charge", {"order_id": "o-b2", "amount": 700, "customer": "cus_9"},
                        lambda a: ds.create_charge(a["order_id"], a["amount"], a["customer"]))
            r1 = b.call("inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-b2"},
                        lambda a: ds.reserve(a["sku"], a["qty"], a["order_id"]))
            raise ValueError("out of stock")
    err = info.value
    assert isinstance(err.__cause__, ValueError)
    assert [f["step"] for f in err.failed] == [0], err.report
    assert err.request and err.result.phase == "Incomplete"
    # typed residue: the failed undo leaves its effect, said as such (never as a declared leftover of an undo)
    assert [r["type"] for r in err.residue if r["step"] == 0] == ["failed"], err.residue
    assert charge(rv, ch["id"])["refunded"] is False  # the truth: the refund never happened
    assert reservation(rv, r1["id"])["status"] == "released"


def test_boundary_rollback_from_inside_closes_the_run(rv):
    """b.rollback() mid-block undoes what ran; a later call raises before reaching downstream."""
    rv.apply_manifest()
    ds = shop(rv)
    reached: list[dict] = []
    with Recorder.boundary(rv.ns, "bnd-inside", manifest="payments", api=rv.api, scope=SCOPE, poll=0.2,
                           timeout=120, rollback_spec=FAST) as b:
        ch = b.call("payments.create_charge", {"order_id": "o-b3", "amount": 700, "customer": "cus_9"},
                    lambda a: ds.create_charge(a["order_id"], a["amount"], a["customer"]))
        r1 = b.call("inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-b3"},
                    lambda a: ds.reserve(a["sku"], a["qty"], a["order_id"]))
        result = b.rollback(reason="the review rejected the order")
        assert result.complete, result.report
        assert sorted(result.report["compensated"]) == [0, 1]
        before = len(rv.downstream.state()["calls"])
        with pytest.raises(RunClosed):
            b.call("inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-b3-late"},
                   lambda a: reached.append(a) or ds.reserve(a["sku"], a["qty"], a["order_id"]))
    assert reached == [] and len(rv.downstream.state()["calls"]) == before
    assert charge(rv, ch["id"])["refunded"] is True
    assert reservation(rv, r1["id"])["status"] == "released"
    req = rv.get("rollbackrequests", result.request)
    assert req["metadata"]["annotations"]["reversi.dev/reason"] == "the review rejected the order"
    # the server refuses too, not only this recorder
    with pytest.raises(RunClosed, match="run was rolled back by"):
        Recorder.attach(rv.ns, "bnd-inside", api=rv.api).begin("payments.get_customer", {"id": "cus_9"})
    with pytest.raises(ApiException, match="run was rolled back by"):
        rv.create("runsteps", step_body(rv.ns, "bnd-inside", rv.step(2, "payments.get_customer", {"id": "cus_9"})))


def test_reconcile_settles_what_downstream_confirms_then_rollback_undoes_it(rv):
    """reconcile: an uncertain call the downstream confirms is settled (and then undone by a
    rollback); one it cannot confirm is left unresolved."""
    rv.apply_manifest()
    ds = shop(rv, timeout=0.5)
    rec = Recorder.open(rv.ns, "bnd-probe", manifest="payments", api=rv.api, scope=SCOPE)
    rv.downstream.fault("/inventory/reservations", "timeout", times=1, delay_s=2)  # happens, answer lost
    with pytest.raises(TimeoutError):
        rec.call("inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-p1"},
                 lambda a: ds.reserve(a["sku"], a["qty"], a["order_id"]))
    rv.downstream.fault("/inventory/reservations", "error", times=1)  # refused: nothing happened
    with pytest.raises(DownstreamError):
        rec.call("inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-p2"},
                 lambda a: ds.reserve(a["sku"], a["qty"], a["order_id"]))

    def shop_probe(step):
        found = [r for r in rv.downstream.state()["reservations"].values()
                 if r["order_id"] == step.args["order_id"]]
        if len(found) != 1:
            return None  # no evidence either way: leave it to a person
        return Settlement("succeeded", result=found[0], note=f"the shop holds reservation {found[0]['id']}")

    done = rec.reconcile(shop_probe)
    assert list(done.settled) == [0] and done.left == [1]
    settled = rv.steps("bnd-probe")[0]["spec"]["resolution"]
    assert settled["note"].startswith("settled by probe shop_probe: the shop holds reservation")
    assert settled["actor"]  # stamped by the API server from the authenticated user
    rid = settled["result"]["id"]
    assert reservation(rv, rid)["status"] == "held"

    result = rec.rollback("undo what the probe confirmed", timeout=120, poll=0.2, spec=FAST)
    assert result.report["compensated"] == [0] and result.report["unresolved"] == [1]
    assert not result.complete
    assert reservation(rv, rid)["status"] == "released"


def test_recovery_required_refuses_what_cannot_be_undone_before_the_call(rv):
    """Rule 12: a ``recovery: required`` run refuses an irreversible call at admission (any
    client) and in the SDK, before the call is made; undoable calls go on; the mode is immutable."""
    rv.apply_manifest()
    rec = Recorder.open(rv.ns, "bnd-strict", manifest="payments", api=rv.api, scope=SCOPE, recovery="required")
    assert rv.get("runs", "bnd-strict")["spec"]["recovery"] == "required"
    reached: list[dict] = []
    with pytest.raises(RecoveryRequired, match=r"recovery required: email\.send cannot be undone"):
        rec.call("email.send", {"to": "ada@example.com"}, lambda a: reached.append(a))
    later = Recorder.attach(rv.ns, "bnd-strict", api=rv.api)  # the run's promise, whoever records
    with pytest.raises(RecoveryRequired):
        later.call("email.send", {"to": "ada@example.com"}, lambda a: reached.append(a))
    assert reached == [] and rv.steps("bnd-strict") == []
    with pytest.raises(ApiException) as raw:
        rv.create("runsteps", step_body(rv.ns, "bnd-strict", rv.step(0, "email.send", {"to": "x"})))
    assert "recovery required: email.send cannot be undone" in raw.value.body
    rec.call("payments.get_customer", {"id": "cus_9"}, lambda a: {"id": "cus_9"})  # a read needs no undo
    with pytest.raises(ApiException, match="immutable"):
        rv.patch("runs", "bnd-strict", {"spec": {"recovery": "bestEffort"}})


def test_async_boundary_rolls_back_when_the_block_raises(rv):
    rv.apply_manifest()
    ds = shop(rv)

    async def agent():
        async with Recorder.aboundary(rv.ns, "bnd-async", manifest="payments", api=rv.api, scope=SCOPE,
                                      poll=0.2, timeout=120, rollback_spec=FAST) as b:
            async def reserve(a):
                return ds.reserve(a["sku"], a["qty"], a["order_id"])
            got = await b.call("inventory.reserve", {"sku": "sku-mug", "qty": 1, "order_id": "o-async"}, reserve)
            holder.append(got)
            raise KeyError("no shipping address")

    holder: list[dict] = []
    with pytest.raises(KeyError):
        asyncio.run(agent())
    assert reservation(rv, holder[0]["id"])["status"] == "released"


def test_reader_probe_settles_with_the_declared_reader_then_rollback_undoes_it(rv):
    """The ready-made probe runs the tool's verification reader as a Job (arguments from the
    call's args): it settles the call the shop confirms, leaves the one it cannot find."""
    hold = {"name": "inventory.hold", "effect": "write",
            "compensation": {"tool": "inventory.release", "kind": "inverse", "args": {"reservation_id": "$result.id"},
                             "runner": "tools"},
            "verification": {"tool": "inventory.find_reservation", "args": {"order_id": "$args.order_id"},
                             "expect": {"status": "released"}, "retries": 2, "backoffMs": 200, "runner": "tools"}}
    rv.apply_manifest(extra_tools=[hold])
    ds = shop(rv, timeout=0.5)
    rec = Recorder.open(rv.ns, "bnd-reader", manifest="payments", api=rv.api, scope=SCOPE)
    rv.downstream.fault("/inventory/reservations", "timeout", times=1, delay_s=2)
    with pytest.raises(TimeoutError):
        rec.call("inventory.hold", {"sku": "sku-mug", "qty": 1, "order_id": "o-r1"},
                 lambda a: ds.reserve(a["sku"], a["qty"], a["order_id"]))
    rv.downstream.fault("/inventory/reservations", "error", times=1)
    with pytest.raises(DownstreamError):
        rec.call("inventory.hold", {"sku": "sku-mug", "qty": 1, "order_id": "o-r2"},
                 lambda a: ds.reserve(a["sku"], a["qty"], a["order_id"]))

    done = rec.reconcile(rec.reader_probe(timeout=60, poll=0.2))
    assert list(done.settled) == [0] and done.left == [1], done
    settled = rv.steps("bnd-reader")[0]["spec"]["resolution"]
    assert settled["note"].startswith("settled by probe reader: reader inventory.find_reservation")
    rid = settled["result"]["id"]
    assert reservation(rv, rid)["status"] == "held" and settled["result"]["order_id"] == "o-r1"

    result = rec.rollback("undo the held mug", timeout=120, poll=0.2, spec=FAST)
    assert result.report["compensated"] == [0] and result.report["unresolved"] == [1]
    assert reservation(rv, rid)["status"] == "released"
