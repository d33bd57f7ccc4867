"""Acknowledging residue (docs/concepts.md#acknowledging-residue): which acknowledgement counts,
when one may be set, and what the Run's and its last request's readiness say."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reversi import conditions as cond
from reversi.adapters import status as status_io
from reversi.engine.acknowledgement import LEGACY_ANNOTATION, Acknowledged, acknowledged, changed, problem, superseded

ACK = {"note": "refunded by hand", "actor": "lead", "acknowledgedAt": "2026-12-01T10:00:00Z", "request": "undo"}


def _run(rolled_back: str | None = "False", locked: str = "False", last: str | None = "undo",
         ack: dict | None = None, legacy: str | None = None) -> dict:
    conds = [{"type": "Locked", "status": locked}]
    if rolled_back is not None:
        conds.append({"type": "RolledBack", "status": rolled_back, "message": "last rollback: undo (incomplete)"})
    meta = {"name": "r", "annotations": {LEGACY_ANNOTATION: legacy} if legacy is not None else {}}
    return {"metadata": meta, "spec": {"acknowledgement": ack} if ack else {},
            "status": {"conditions": conds, "lastRequest": last, "activeRequest": "undo" if locked == "True" else None}}


def test_an_acknowledgement_counts_only_for_the_request_it_names_while_that_left_residue():
    assert acknowledged(_run(ack=ACK)) == Acknowledged("refunded by hand", "lead", "2026-12-01T10:00:00Z", "undo")
    assert acknowledged(_run(ack=ACK, last="again")) is None, "a later rollback is not covered"
    assert acknowledged(_run(ack=ACK, rolled_back="True")) is None, "rolled back in full: nothing to accept"
    assert acknowledged(_run(ack=ACK, rolled_back=None)) is None
    assert acknowledged(_run()) is None


def test_the_annotation_of_earlier_versions_still_counts_and_says_what_it_is():
    found = acknowledged(_run(legacy="oncall: apologised"))
    assert found is not None and found.legacy
    assert found.text() == f"acknowledged (annotation {LEGACY_ANNOTATION}): oncall: apologised"
    assert acknowledged(_run(legacy="x", rolled_back="True")) is None


def test_only_the_note_makes_a_change_the_stamps_are_the_servers():
    assert changed(None, {"note": "a"}) and changed({"note": "a"}, None) and changed({"note": "a"}, {"note": "b"})
    assert not changed({"note": "a", "actor": "lead"}, {"note": "a", "actor": "mallory"})
    assert not changed(None, None)


def test_nothing_to_acknowledge_while_a_rollback_holds_the_run_or_when_none_left_residue():
    assert "is working on Run r" in (problem(_run(locked="True"), "r") or "")
    assert "no incomplete rollback to acknowledge" in (problem(_run(rolled_back="True"), "r") or "")
    assert "no incomplete rollback to acknowledge" in (problem(_run(rolled_back=None), "r") or "")
    assert problem(_run(), "r") is None


def _readiness(tuples) -> dict[str, tuple[str, str]]:
    return {t: (s, r) for t, s, r, _ in tuples}


def test_a_run_whose_residue_is_acknowledged_is_ready_not_stalled():
    conds = _run()["status"]["conditions"]
    assert _readiness(status_io.run_readiness(conds, "r"))[cond.STALLED] == (cond.TRUE, cond.INCOMPLETE)
    ready = _readiness(status_io.run_readiness(conds, "r", acknowledged(_run(ack=ACK))))
    assert ready[cond.READY] == (cond.TRUE, cond.RESIDUE_ACKNOWLEDGED) and ready[cond.STALLED][0] == cond.FALSE
    locked = _readiness(status_io.run_readiness(_run(locked="True")["status"]["conditions"], "r",
                                                acknowledged(_run(ack=ACK))))
    assert locked[cond.RECONCILING][0] == cond.TRUE, "a rollback at work wins"


def _finished(reason: str) -> dict:
    conds = status_io.summary_conditions([], 2, [(cond.COMPLETE, cond.FALSE, reason, "2 of 3 undone"),
                                                 *status_io.request_readiness("Incomplete", reason, "2 of 3 undone")])
    return {"phase": "Incomplete", "observedGeneration": 2, "conditions": conds}


@given(st.lists(st.booleans(), min_size=1, max_size=6),
       st.sampled_from([cond.PARTIAL, cond.NOT_POSSIBLE, cond.CANCELLED]))
def test_a_finished_requests_readiness_follows_acknowledgement_back_and_forth(flips, reason):
    """Acknowledged or withdrawn in any order, the request is Ready exactly while acknowledged,
    Stalled otherwise, never both; an update is made only when something changes."""
    status = _finished(reason)
    for ack in flips:
        update = status_io.request_acknowledged_update(status, acknowledged(_run(ack=ACK)) if ack else None)
        if update is not None:
            status = {**status, **update}
        after = {x["type"]: x for x in status["conditions"]}
        assert (after[cond.READY]["status"] == cond.TRUE) == ack
        assert (after[cond.STALLED]["status"] == cond.TRUE) == (not ack)
        assert after[cond.COMPLETE]["status"] == cond.FALSE, "the verdict never changes"
        assert status_io.request_acknowledged_update(status, acknowledged(_run(ack=ACK)) if ack else None) is None
    if not flips[-1]:
        stalled = {x["type"]: x for x in status["conditions"]}[cond.STALLED]
        assert stalled["reason"] == (cond.CANCELLED if reason == cond.CANCELLED else cond.INCOMPLETE)


def test_only_an_incomplete_request_follows_acknowledgement():
    assert status_io.request_acknowledged_update({"phase": "Succeeded", "conditions": []},
                                                 acknowledged(_run(ack=ACK))) is None


@pytest.mark.parametrize("reason", [cond.PARTIAL, cond.NOT_POSSIBLE, cond.CANCELLED])
def test_an_incomplete_request_whose_residue_no_longer_stands_is_ready_as_superseded(reason):
    """Only the request whose residue stands on the Run follows its acknowledgement; an earlier one is Ready,
    reason Superseded, naming the request that says what stands, and its verdict never changes
    (docs/concepts.md#acknowledging-residue)."""
    status = _finished(reason)
    update = status_io.request_superseded_update(status, "undo-2", "r")
    assert update is not None
    after = {x["type"]: x for x in update["conditions"]}
    assert (after[cond.READY]["status"], after[cond.READY]["reason"]) == (cond.TRUE, cond.SUPERSEDED)
    assert after[cond.STALLED]["status"] == cond.FALSE and after[cond.RECONCILING]["status"] == cond.FALSE
    assert "RollbackRequest undo-2's to say" in after[cond.READY]["message"]
    assert after[cond.COMPLETE] == {x["type"]: x for x in status["conditions"]}[cond.COMPLETE], "the verdict stays"
    assert status_io.request_superseded_update({**status, **update}, "undo-2", "r") is None, "written once"
    assert status_io.request_superseded_update({"phase": "Succeeded", "conditions": []}, "undo-2", "r") is None


@given(st.lists(st.tuples(st.sampled_from(["r1", "r2", "r3", "r4"]),
                          st.sampled_from([None, "Running", "Incomplete", "Succeeded", "Failed"]),
                          st.sampled_from([None, "Incomplete", "ResidueAcknowledged", "Superseded"])),
                unique_by=lambda r: r[0]),
       st.sampled_from([None, "r1", "r2"]), st.sampled_from([None, "r3"]))
def test_superseded_names_every_other_incomplete_request_once_while_no_rollback_holds_the_run(
        requests, holder, locked_by):
    marked = superseded(holder, locked_by, requests)
    if holder is None or locked_by is not None:
        assert marked == []
        return
    assert holder not in marked
    assert marked == sorted(n for n, phase, reason in requests if phase == "Incomplete" and n != holder
                            and reason != "Superseded")
