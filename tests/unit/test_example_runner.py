"""The example runner (docs/examples/runner/payments_tool.py) follows the Job contract
(docs/concepts.md#the-job-contract), run as a Job runs it (a process, the call in a file) against the demo's
downstream server over real HTTP: a refund happens once per idempotency key, a read prints what the server
holds, and each failure is its exit code and one line in the termination log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from demo.downstream.client import Client

RUNNER = Path(__file__).resolve().parents[2] / "docs" / "examples" / "runner" / "payments_tool.py"


def job(tmp_path: Path, call: dict, url: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "call.json").write_text(json.dumps(call))
    env = {"REVERSI_CALL_FILE": str(tmp_path / "call.json"), "REVERSI_TERMINATION_LOG": str(tmp_path / "term.log"),
           "PATH": "/usr/bin:/bin", **({"PAYMENTS_URL": url} if url else {})}
    return subprocess.run([sys.executable, str(RUNNER)], env=env, capture_output=True, text=True, timeout=60)


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def shop(tmp_path):
    """The demo's downstream server (payments with idempotency keys), started for the test."""
    proc = subprocess.Popen([sys.executable, str(REPO / "demo" / "downstream" / "server.py"), "--port", "0",
                             "--state", str(tmp_path / "state.json"), "--quiet"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip() if proc.stdout else ""
        assert line.startswith("listening on "), line
        url = line.split()[-1]
        yield url, Client(url)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_refund_is_made_once_per_key_and_the_read_back_sees_it(tmp_path, shop):
    url, downstream = shop
    charge = downstream.create_charge("o-1", 700, "cus_9", idempotency_key="o-1")
    compensate = {"run_id": "r", "step": 0, "tool": "payments.refund", "original_tool": "payments.create_charge",
                  "args": {"charge_id": charge["id"], "amount": 700}, "idempotency_key": "undo-r-0"}
    first, again = job(tmp_path, compensate, url), job(tmp_path, compensate, url)  # a retried Job: the same key
    assert first.returncode == again.returncode == 0, (first.stderr, again.stderr)
    assert json.loads(first.stdout) == json.loads(again.stdout)
    refunds = [c for c in downstream.state()["calls"] if c["path"] == "/payments/refunds" and not c["replayed"]]
    assert len(refunds) == 1 and refunds[0]["key"] == "undo-r-0"
    read = job(tmp_path, {"tool": "payments.get_charge", "arguments": {"charge_id": charge["id"]}}, url)
    assert read.returncode == 0 and json.loads(read.stdout)["refunded"] is True


@pytest.mark.parametrize(("call", "url", "code", "line"), [
    ({"tool": "payments.refund", "args": {}}, "URL", 2, "missing argument 'charge_id'"),
    ({"tool": "payments.wire", "args": {"charge_id": "x"}}, "URL", 2, "is not a compensate tool"),
    ({"tool": "payments.refund", "arguments": {"charge_id": "x"}}, "URL", 2, "is not a read tool"),
    ({"tool": "payments.get_charge", "arguments": {"charge_id": "ch_none"}}, "URL", 1, "HTTP 404"),
    ({"tool": "payments.get_charge", "arguments": {"charge_id": "x"}}, None, 2, "PAYMENTS_URL is not set"),
])
def test_each_failure_is_its_exit_code_and_one_line_in_the_termination_log(tmp_path, shop, call, url, code, line):
    done = job(tmp_path, call, shop[0] if url else None)
    assert done.returncode == code, done.stderr
    assert line in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert (tmp_path / "term.log").read_text().strip() == done.stderr.strip()
