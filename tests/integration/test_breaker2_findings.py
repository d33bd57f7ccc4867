"""Adversarial findings on the calls Secrets, the hand-over and the API call layer (breaker 2).

Each test reproduces one problem found against the real control plane; downstream truth is the
demo server's log of calls.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.cluster

#: non-ASCII text: 2 bytes of UTF-8 per character, 6 as a JSON \\u escape
TEXT = "é" * 15_800


def test_a_step_whose_calls_carry_non_ascii_text_near_the_limits_is_undone_and_verified(rv):
    """args and result near their 64 KiB (of UTF-8 JSON, as admission measures them), in non-ASCII
    text; the compensation, its precheck, its precondition and its read-back each carry half of
    each. Written with \\u escapes each call was ~190 KB: more than Linux takes in one environment
    string (128 KiB, ``REVERSI_CALL``), so no Job of the step could start its program (exit code
    127: the precheck failed, the step ended ``conflict``, nothing undone)."""
    read_args = {"charge_id": "$result.id", "memo": "$args.memo", "note": "$result.note"}
    tool = {"name": "payments.annotated_charge", "effect": "write",
            "compensation": {"tool": "payments.refund", "kind": "compensation", "runner": "tools", "precheck": True,
                             "args": {"charge_id": "$result.id", "amount": "$args.amount", "memo": "$args.memo",
                                      "note": "$result.note"},
                             "precondition": {"tool": "payments.get_charge", "args": read_args,
                                              "expect": {"refunded": False}}},
            "verification": {"tool": "payments.get_charge", "args": read_args, "expect": {"refunded": True},
                             "runner": "tools", "retries": 2, "backoffMs": 200}}
    rv.apply_manifest(extra_tools=[tool])
    charge = rv.charge("o-utf8")
    rv.run("r", [rv.step(0, tool["name"], {"order_id": "o-utf8", "amount": 700, "memo": TEXT},
                         {**charge, "note": TEXT})])
    rv.request("u", "r")
    done = rv.wait_phase("u", "Succeeded", "Incomplete", "Failed", timeout=90)
    entry = rv.step_status(done, 0)
    assert done["status"]["phase"] == "Succeeded", (entry.get("stage"), entry.get("lastError"))
    assert done["status"]["report"]["compensated"] and done["status"]["report"].get("unverified") in (None, [])
    refunds = rv.downstream.calls("/payments/refunds", since=rv.started)
    assert len(refunds) == 1, refunds
