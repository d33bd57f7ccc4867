"""What stands (docs/concepts.md#what-stands): engine/standing.py computes a Run's
``status.standing`` from its journal as a rollback ends; adapters/status.run_release_update turns
it into the Run's status (RolledBack, Ready/Stalled, acknowledgedBy); the acknowledgement counts
while it names the request whose residue stands; ``describe`` says the same. Pure, no cluster."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reversi import conditions as cond
from reversi.adapters import status as status_mod
from reversi.cli import views
from reversi.engine import acknowledgement
from reversi.engine import standing as sd
from reversi.models.run import Standing, StepUndo

KEY = "a" * 64
TOOLS = {0: "payments.create_charge", 1: "inventory.reserve", 2: "email.send"}


def undo(step: int, state: str, request: str, verification: str | None = None, **more) -> StepUndo:
    return StepUndo(step=step, state=state, attempts=1, idempotency_key=KEY, request=request,
                    verification=verification, **more)


FAILED_BY_UNDO = {0: undo(0, "compensationFailed", "undo"), 1: undo(1, "compensated", "undo", "verified")}


def ending(request: str, complete: bool = False, stopped: bool = False, undone=()) -> sd.Ending:
    return sd.Ending(request, frozenset({request}), complete, stopped=stopped, undone=frozenset(undone))


def test_what_stands_is_read_from_the_journal():
    steps = sd.standing_undos({0: undo(0, "compensationFailed", "a"),
                               1: undo(1, "compensated", "a", "unverified"),
                               2: undo(2, "compensated", "b", "unverified", verified_by="c"),
                               3: undo(3, "compensated", "a", "none"),
                               4: undo(4, "compensating", "a")}, {0: "t0", 1: "t1", 2: "t2"})
    assert [(s.step, s.tool, s.state, s.request) for s in steps] == [
        (0, "t0", "failed", "a"), (1, "t1", "unverified", "a"), (2, "t2", "unverified", "c")]


def test_a_failed_undo_gives_the_first_verdict_and_names_its_request():
    out = sd.after_rollback(None, None, FAILED_BY_UNDO, TOOLS, ending("undo"))
    assert out.rolled_back == "False" and out.acted and out.new == (0,)
    assert out.standing["request"] == "undo" and out.standing["failed"] == 1 and out.standing["unverified"] == 0
    assert out.standing["tools"] == [{"tool": "payments.create_charge", "state": "failed", "steps": 1}]
    assert out.standing["steps"] == [{"step": 0, "tool": "payments.create_charge", "state": "failed",
                                      "request": "undo"}]


def test_a_request_that_undid_nothing_changes_nothing_that_stands():
    """Cancelled after it took the lock, every step denied, or past its deadline before it acted:
    the journal is as the failed rollback left it, and so is what stands."""
    before = sd.after_rollback(None, None, FAILED_BY_UNDO, TOOLS, ending("undo")).standing
    for stopped in (True, False):
        out = sd.after_rollback("False", before, FAILED_BY_UNDO, TOOLS, ending("cancelled", stopped=stopped))
        assert out.rolled_back is None and not out.acted and out.new == ()
        assert sd.same(out.standing, before) and out.standing["request"] == "undo"


def test_a_run_never_rolled_back_stays_so_when_its_first_request_is_stopped_before_it_acted():
    assert sd.after_rollback(None, None, {}, TOOLS, ending("x", stopped=True)) == sd.Settled(None, None, False, ())
    # one that ran to its end without undoing anything (an irreversible step) gives the first verdict
    first = sd.after_rollback(None, None, {}, TOOLS, ending("x"))
    assert first.rolled_back == "False" and first.standing["request"] == "x" and first.standing["failed"] == 0


def test_a_rollback_that_fixes_it_clears_it_and_one_that_only_undoes_more_keeps_its_request():
    before = sd.after_rollback(None, None, {0: undo(0, "compensationFailed", "undo"),
                                            1: undo(1, "compensated", "undo", "unverified")}, TOOLS,
                               ending("undo")).standing
    # the unverified undo read back by a later request: one failed undo left, still the first request's
    reread = {0: undo(0, "compensationFailed", "undo"),
              1: undo(1, "compensated", "undo", "verified", verified_by="again")}
    out = sd.after_rollback("False", before, reread, TOOLS, ending("again"))
    assert out.rolled_back == "False" and out.acted and out.new == ()
    assert out.standing["request"] == "undo" and (out.standing["failed"], out.standing["unverified"]) == (1, 0)
    fixed = {0: undo(0, "compensated", "fix", "verified"), 1: reread[1]}
    done = sd.after_rollback("False", out.standing, fixed, TOOLS, ending("fix", complete=True))
    assert done.rolled_back == "True" and done.standing["failed"] == 0 and done.standing["request"] == "fix"


def test_a_rollback_that_leaves_a_new_step_standing_names_itself():
    before = sd.after_rollback(None, None, FAILED_BY_UNDO, TOOLS, ending("undo")).standing
    again = {0: undo(0, "compensationFailed", "again"), 1: FAILED_BY_UNDO[1]}  # retried, failed again
    out = sd.after_rollback("False", before, again, TOOLS, ending("again"))
    assert out.standing["request"] == "again" and out.new == (0,)


def test_a_step_the_request_found_already_undone_stands_no_more():
    before = sd.after_rollback(None, None, FAILED_BY_UNDO, TOOLS, ending("undo")).standing
    out = sd.after_rollback("False", before, FAILED_BY_UNDO, TOOLS, ending("look", complete=True, undone={0}))
    assert out.rolled_back == "True" and out.standing["failed"] == 0 and out.acted


def test_a_child_runs_undo_is_its_parents_rollback():
    out = sd.after_rollback(None, None, {0: undo(0, "compensationFailed", "undo-child")}, TOOLS,
                            sd.Ending("undo", frozenset({"undo", "undo-child"}), False))
    assert out.acted and out.new == (0,) and out.standing["request"] == "undo"


@given(st.dictionaries(st.integers(0, 5), st.tuples(
    st.sampled_from(["compensated", "compensationFailed", "compensating"]),
    st.sampled_from([None, "verified", "none", "unverified", "verificationFailed"]),
    st.sampled_from(["r1", "r2"])), max_size=6),
    st.sampled_from([None, "True", "False"]), st.booleans(), st.booleans())
def test_a_request_that_wrote_nothing_never_changes_what_stands_or_clears_it(journal, rolled, stopped, first):
    """Property: with a journal none of whose entries is the ending request's, and an incomplete
    report, what stands keeps its counts and request, and RolledBack never turns True; the counts
    are always the journal's."""
    undo_ = {s: undo(s, state, req, verification) for s, (state, verification, req) in journal.items()}
    tools = {s: f"t{s}" for s in undo_}
    before = sd.summary(sd.standing_undos(undo_, tools), "r1") if rolled is not None else None
    out = sd.after_rollback(rolled, before, undo_, tools, ending("r3", stopped=stopped))
    assert out.rolled_back != "True" and not out.acted and out.new == ()
    if out.standing is not None:
        assert out.standing["failed"] == sum(1 for u in undo_.values() if sd.state_of(u) == "failed")
        assert out.standing["unverified"] == sum(1 for u in undo_.values() if sd.state_of(u) == "unverified")
    if rolled == "False":
        assert out.rolled_back is None and sd.same(out.standing, before)
    Standing.model_validate(out.standing or {})  # what the CRD takes


def _run(rolled_back: str | None = None, standing: dict | None = None, ack: dict | None = None,
         last: str | None = None) -> dict:
    conds = [] if rolled_back is None else [{"type": "RolledBack", "status": rolled_back, "reason": "Incomplete",
                                             "message": "m"}]
    status = {"conditions": conds, "activeRequest": "again", "lastRequest": last or "again"}
    if standing is not None:
        status["standing"] = standing
    return {"metadata": {"name": "r", "namespace": "shop", "generation": 1, "resourceVersion": "9"},
            "spec": {"acknowledgement": ack} if ack else {}, "status": status}


ACK = {"note": "refunded by hand", "actor": "lead", "acknowledgedAt": "2026-12-01T10:00:00Z", "request": "undo"}


def test_an_acknowledgement_counts_while_it_names_the_request_whose_residue_stands():
    standing = sd.after_rollback(None, None, FAILED_BY_UNDO, TOOLS, ending("undo")).standing
    run = _run("False", standing, ACK)
    assert acknowledgement.residue_request(run) == "undo"
    assert acknowledgement.acknowledged(run).actor == "lead" and acknowledgement.stale(run) is None
    # a run written before status.standing: its lastRequest
    assert acknowledgement.residue_request(_run("False", None, ACK, last="undo")) == "undo"
    moved = {**standing, "request": "again"}
    assert acknowledgement.acknowledged(_run("False", moved, ACK)) is None
    assert acknowledgement.stale(_run("False", moved, ACK)).request == "undo"


def _conds(update: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in update["conditions"]}


def test_releasing_after_a_request_that_undid_nothing_keeps_the_verdict_and_the_acknowledgement():
    standing = {**sd.after_rollback(None, None, FAILED_BY_UNDO, TOOLS, ending("undo")).standing,
                "updatedAt": "2026-12-01T09:00:00Z", "acknowledgedBy": "lead"}
    run = _run("False", standing, ACK)
    settled = sd.after_rollback("False", standing, FAILED_BY_UNDO, TOOLS, ending("again", stopped=True))
    update = status_mod.run_release_update(run, "again", settled, complete=False, deleted=False,
                                           now="2026-12-01T11:00:00Z")
    conds = _conds(update)
    messages = {c["type"]: c["message"] for c in update["conditions"]}
    assert conds["RolledBack"] == ("False", "Incomplete") and messages["RolledBack"] == "m"  # as it was
    assert conds["Locked"] == ("False", cond.RELEASED)
    assert messages["Locked"] == "RollbackRequest again finished; it undid nothing, so what stands is unchanged"
    assert conds["Ready"] == ("True", cond.RESIDUE_ACKNOWLEDGED)
    assert update["standing"]["acknowledgedBy"] == "lead" and update["standing"]["updatedAt"] == "2026-12-01T09:00:00Z"


def test_releasing_after_a_rollback_that_left_a_new_failure_stalls_the_run_and_drops_the_old_acknowledgement():
    standing = {**sd.after_rollback(None, None, FAILED_BY_UNDO, TOOLS, ending("undo")).standing,
                "acknowledgedBy": "lead"}
    again = {0: undo(0, "compensationFailed", "again"), 1: FAILED_BY_UNDO[1]}
    settled = sd.after_rollback("False", standing, again, TOOLS, ending("again"))
    update = status_mod.run_release_update(_run("False", standing, ACK), "again", settled, complete=False,
                                           deleted=False, now="2026-12-01T11:00:00Z")
    conds = _conds(update)
    assert conds["RolledBack"] == ("False", cond.INCOMPLETE) and conds["Stalled"] == ("True", cond.INCOMPLETE)
    assert update["standing"]["request"] == "again" and update["standing"]["acknowledgedBy"] is None
    rolled = next(c for c in update["conditions"] if c["type"] == "RolledBack")
    assert rolled["message"] == "last rollback: RollbackRequest again (incomplete); 1 failed undo(s) stand"


def test_describe_says_what_stands_and_never_shows_an_old_acknowledgement_as_covering_it():
    standing = sd.after_rollback(None, None, FAILED_BY_UNDO, TOOLS, ending("undo")).standing
    covered = "\n".join(views.standing_lines(_run("False", standing, ACK)))
    assert "Standing:     on Run r now: 1 failed undo(s) stand, left by RollbackRequest undo" in covered
    assert "  step 0  payments.create_charge: failed (RollbackRequest undo)" in covered
    assert "Residue:      acknowledged by lead at 2026-12-01T10:00:00Z: refunded by hand; it covers what stands " \
           "now (RollbackRequest undo's residue)" in covered
    later = "\n".join(views.standing_lines(_run("False", {**standing, "request": "again"}, ACK)))
    assert "acknowledged by lead" in later and "it covers" not in later
    assert ("Residue:      not acknowledged now: acknowledged by lead at 2026-12-01T10:00:00Z: refunded by hand "
            "accepted RollbackRequest undo's residue, not what stands now (RollbackRequest again left steps "
            "standing since)") in later
    assert views.standing_lines(_run(None)) == []


class _Recording:
    """Records the status writes and the reads of the Run status writer (no API server)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str, dict]] = []
        self.reads: list[tuple[str, str]] = []

    def merge_status(self, plural, namespace, name, update, resource_version=None):
        self.writes.append((plural, name, update))

    def get(self, plural, namespace, name):
        self.reads.append((plural, name))
        if plural == "rollbackrequests":
            return {"metadata": {"name": name, "resourceVersion": "3"}, "spec": {"runRef": {"name": "r"}},
                    "status": {"phase": "Incomplete", "observedGeneration": 1, "conditions": [
                        {"type": "Complete", "status": "False", "reason": "Partial", "message": "incomplete"}]}}
        return None


def test_the_run_status_writer_names_who_accepted_what_stands_and_syncs_that_request():
    """An acknowledgement of ``undo`` on a run whose last lock-taker ``again`` undid nothing:
    the writer sets ``standing.acknowledgedBy`` and makes ``undo`` (whose residue stands), not
    ``again``, read as acknowledged."""
    from reversi.handlers import runs

    standing = sd.after_rollback(None, None, FAILED_BY_UNDO, TOOLS, ending("undo")).standing
    body = _run("False", {"request": standing["request"], "acknowledgedBy": None}, ACK, last="again")
    body["status"]["activeRequest"] = None
    body["status"]["conditions"] += [{"type": "Locked", "status": "False", "reason": "Released", "message": "m"}]
    kube = _Recording()
    runs._write(kube, lambda: True, ("shop", "r"), body)  # type: ignore[arg-type]
    (plural, name, update), *rest = kube.writes
    assert (plural, name) == ("runs", "r") and update["standing"] == {"acknowledgedBy": "lead"}
    assert ("rollbackrequests", "undo") in kube.reads and ("rollbackrequests", "again") not in kube.reads
    assert [(p, n) for p, n, _ in rest] == [("rollbackrequests", "undo")]
