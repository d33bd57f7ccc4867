"""The demo downstream systems: server (payments, inventory, email), tool command, client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from demo.downstream.client import Client, DownstreamError  # noqa: E402

SERVER = ROOT / "demo" / "downstream" / "server.py"
TOOL = ROOT / "demo" / "downstream" / "tool.py"


class Server:
    """The server as a subprocess on a free port, with a state file."""

    def __init__(self, state: Path, log: Path) -> None:
        self.state, self.log = state, log
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> Server:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(SERVER), "--port", "0", "--state", str(self.state)],
                stdout=subprocess.PIPE, stderr=log, text=True)
        line = self.proc.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:"), line
        self.url = line.removeprefix("listening on ")
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()


@pytest.fixture
def server(tmp_path):
    srv = Server(tmp_path / "state.json", tmp_path / "server.log").start()
    yield srv
    srv.stop()


@pytest.fixture
def ds(server) -> Client:
    return Client(server.url, timeout=5)


def run_tool(tmp_path: Path, url: str, call: dict, *, via_file: bool = True, **env: str):
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("REVERSI_", "DOWNSTREAM_"))}
    environ.update(DOWNSTREAM_URL=url, REVERSI_TERMINATION_LOG=str(tmp_path / "termination-log"))
    if via_file:
        call_file = tmp_path / "call.json"
        call_file.write_text(json.dumps(call))
        environ["REVERSI_CALL_FILE"] = str(call_file)
    else:
        environ["REVERSI_CALL"] = json.dumps(call)
    environ.update(env)
    return subprocess.run([sys.executable, str(TOOL)], env=environ, capture_output=True,
                          text=True, timeout=30)


def compensation(tool: str, args: dict, key: str = "run-1/1/comp") -> dict:
    return {"run_id": "run-1", "step": 1, "tool": tool, "original_tool": "x",
            "args": args, "idempotency_key": key}


# -- payments --------------------------------------------------------------------------------


def test_charge_and_idempotency_key_returns_first_answer(ds):
    first = ds.create_charge("o-1", 700, "cus_9", idempotency_key="o-1")
    assert first["id"].startswith("ch_")
    assert (first["status"], first["amount"], first["refunded"]) == ("succeeded", 700, False)
    again = ds.create_charge("o-1", 700, "cus_9", idempotency_key="o-1")
    assert again == first
    assert len(ds.state()["charges"]) == 1
    assert ds.get_customer("cus_9")["charges"] == [first["id"]]
    # keys are scoped per path: the same key on another endpoint is a different call
    res = ds.reserve("sku-mug", 1, "o-1", idempotency_key="o-1")
    assert res["id"].startswith("res_")


def test_refund_marks_charge_refunded_and_second_refund_is_refused(ds):
    charge = ds.create_charge("o-2", 500, "cus_1")
    refund = ds.refund(charge["id"], 500, idempotency_key="k1")
    assert refund["id"].startswith("re_") and refund["status"] == "succeeded"
    got = ds.get_charge(charge["id"])
    assert (got["refunded"], got["status"]) == (True, "refunded")
    assert ds.refund(charge["id"], 500, idempotency_key="k1") == refund  # same key: replay
    with pytest.raises(DownstreamError) as err:
        ds.refund(charge["id"], 500, idempotency_key="k2")
    assert err.value.status == 409
    assert len(ds.state()["refunds"]) == 1


def test_capture_void(ds):
    charge = ds.create_charge("o-3", 300, "cus_9")
    cap = ds.capture(charge["id"])
    assert cap["id"].startswith("cap_") and cap["status"] == "captured"
    assert ds.void_capture(cap["id"])["status"] == "voided"
    assert ds.get_capture(cap["id"])["status"] == "voided"
    with pytest.raises(DownstreamError) as err:
        ds.void_capture(cap["id"])
    assert err.value.status == 409


def test_unknown_charge_is_404(ds):
    with pytest.raises(DownstreamError) as err:
        ds.get_charge("ch_nope")
    assert err.value.status == 404


# -- inventory and email -----------------------------------------------------------------------


def test_reserve_and_release_restores_stock(ds):
    before = ds.get_stock("sku-shirt")["available"]
    res = ds.reserve("sku-shirt", 2, "o-4")
    assert res["status"] == "held"
    assert ds.get_stock("sku-shirt") == {"sku": "sku-shirt", "available": before - 2, "held": 2}
    assert ds.release(res["id"])["status"] == "released"
    assert ds.get_stock("sku-shirt") == {"sku": "sku-shirt", "available": before, "held": 0}
    with pytest.raises(DownstreamError) as err:
        ds.reserve("sku-shirt", before + 1, "o-5")
    assert err.value.status == 409


def test_email_goes_to_outbox_once_per_key(ds):
    msg = ds.send_email("ada@example.com", "Your order", idempotency_key="mail-1")
    assert msg["id"].startswith("msg_")
    assert ds.send_email("ada@example.com", "Your order", idempotency_key="mail-1") == msg
    assert [m["id"] for m in ds.outbox()] == [msg["id"]]


# -- fault injection ---------------------------------------------------------------------------


def test_timeout_fault_effect_happens_answer_late(ds):
    charge = ds.create_charge("o-6", 900, "cus_9")
    ds.inject_fault("/payments/captures", "timeout", times=1, delay_s=2)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        ds.capture(charge["id"], idempotency_key="cap-o-6", timeout=0.5)
    assert time.monotonic() - started < 1.5
    captures = list(ds.state()["captures"].values())
    assert [c["status"] for c in captures] == ["captured"]  # the effect happened
    # the retry with the same key gets the first answer, no second capture
    assert ds.capture(charge["id"], idempotency_key="cap-o-6")["id"] == captures[0]["id"]
    assert len(ds.state()["captures"]) == 1


def test_timeout_fault_answers_after_delay(ds):
    ds.inject_fault("/payments/customers", "timeout", delay_s=0.5)
    started = time.monotonic()
    assert ds.get_customer("cus_9")["id"] == "cus_9"
    assert time.monotonic() - started >= 0.5


def test_error_fault_fails_without_effect(ds):
    ds.inject_fault("/inventory/reservations", "error", times=1)
    with pytest.raises(DownstreamError) as err:
        ds.reserve("sku-mug", 1, "o-7", idempotency_key="r-7")
    assert err.value.status == 500
    assert ds.state()["reservations"] == {}
    assert ds.reserve("sku-mug", 1, "o-7", idempotency_key="r-7")["status"] == "held"
    assert ds.state()["faults"] == []


# -- the tool command ------------------------------------------------------------------------


def test_tool_compensation_refund_with_idempotency_key(ds, server, tmp_path):
    charge = ds.create_charge("o-8", 700, "cus_9")
    call = compensation("payments.refund", {"charge_id": charge["id"], "amount": 700})
    done = run_tool(tmp_path, server.url, call)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["charge_id"] == charge["id"]
    assert ds.get_charge(charge["id"])["refunded"] is True
    # a retry with the same key succeeds again and refunds nothing more
    again = run_tool(tmp_path, server.url, call)
    assert again.returncode == 0, again.stderr
    assert len(ds.state()["refunds"]) == 1
    # a different key is refused: non-zero, one line on stderr and in the termination log
    other = run_tool(tmp_path, server.url, compensation("payments.refund",
                                                        {"charge_id": charge["id"]}, key="other"))
    assert other.returncode == 1
    assert "409" in other.stderr and len(other.stderr.strip().splitlines()) == 1
    assert (tmp_path / "termination-log").read_text().strip() == other.stderr.strip()


def test_tool_compensation_via_env_and_key_from_env(ds, server, tmp_path):
    res = ds.reserve("sku-mug", 3, "o-9")
    call = compensation("inventory.release", {"reservation_id": res["id"]})
    del call["idempotency_key"]
    done = run_tool(tmp_path, server.url, call, via_file=False, REVERSI_IDEMPOTENCY_KEY="k-env")
    assert done.returncode == 0, done.stderr
    assert ds.get_reservation(res["id"])["status"] == "released"
    assert any(k.endswith(" k-env") for k in ds.state()["idempotency"])


def test_tool_void_capture(ds, server, tmp_path):
    cap = ds.capture(ds.create_charge("o-10", 100, "cus_1")["id"])
    done = run_tool(tmp_path, server.url, compensation("payments.void_capture",
                                                       {"capture_id": cap["id"]}))
    assert done.returncode == 0, done.stderr
    assert ds.get_capture(cap["id"])["status"] == "voided"


def test_tool_read_prints_json(ds, server, tmp_path):
    charge = ds.create_charge("o-11", 250, "cus_9")
    done = run_tool(tmp_path, server.url,
                    {"tool": "payments.get_charge", "arguments": {"charge_id": charge["id"]}})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ds.get_charge(charge["id"])


def test_tool_finds_a_reservation_by_its_order(ds, server, tmp_path):
    held = ds.reserve("sku-mug", 1, "o-find")
    done = run_tool(tmp_path, server.url, {"tool": "inventory.find_reservation", "arguments": {"order_id": "o-find"}})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["id"] == held["id"]
    missing = run_tool(tmp_path, server.url, {"tool": "inventory.find_reservation", "arguments": {"order_id": "o-no"}})
    assert missing.returncode == 1 and "404" in missing.stderr


def test_tool_read_of_missing_object_fails(server, tmp_path):
    done = run_tool(tmp_path, server.url,
                    {"tool": "inventory.get_reservation", "arguments": {"reservation_id": "res_x"}})
    assert done.returncode == 1 and "404" in done.stderr and done.stdout == ""


def test_tool_unknown_tool_exits_2(server, tmp_path):
    done = run_tool(tmp_path, server.url, compensation("payments.teleport", {}))
    assert done.returncode == 2
    assert "unknown tool 'payments.teleport'" in done.stderr


def test_tool_missing_argument_and_wrong_kind_exit_2(server, tmp_path):
    missing = run_tool(tmp_path, server.url, compensation("payments.refund", {"amount": 1}))
    assert missing.returncode == 2 and "charge_id" in missing.stderr
    wrong = run_tool(tmp_path, server.url, compensation("payments.get_charge", {"charge_id": "c"}))
    assert wrong.returncode == 2


def test_tool_unreachable_downstream_fails(tmp_path):
    done = run_tool(tmp_path, "http://127.0.0.1:9", {"tool": "payments.get_charge",
                                                     "arguments": {"charge_id": "c"}})
    assert done.returncode == 1 and "cannot reach" in done.stderr


# -- persistence ---------------------------------------------------------------------------


def test_state_survives_restart(server, tmp_path):
    ds = Client(server.url, timeout=5)
    charge = ds.create_charge("o-12", 400, "cus_9", idempotency_key="o-12")
    res = ds.reserve("sku-poster", 1, "o-12")
    server.stop()
    assert json.loads(server.state.read_text())["charges"][charge["id"]]["amount"] == 400
    server.start()
    ds = Client(server.url, timeout=5)
    assert ds.get_charge(charge["id"]) == charge
    assert ds.get_reservation(res["id"])["status"] == "held"
    assert ds.get_stock("sku-poster")["available"] == 0
    assert ds.create_charge("o-12", 400, "cus_9", idempotency_key="o-12") == charge
    assert len(ds.state()["charges"]) == 1


def test_reset_restores_seed(ds):
    ds.create_charge("o-13", 1, "cus_9")
    ds.reset(stock={"sku-x": 2})
    state = ds.state()
    assert state["charges"] == {} and state["stock"] == {"sku-x": {"sku": "sku-x", "available": 2,
                                                                   "held": 0}}
