"""The report (docs/concepts.md#the-report): its buckets, residue and ``complete``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from reversi.engine import (
    AWAITING_APPROVAL,
    COMPENSATED,
    DEFERRED,
    FAILED,
    PENDING,
    RUNNING,
    StepOutcome,
    build_plan,
    build_report,
    outcomes_from_undo,
    report_message,
)
from reversi.engine.report import INCOMPLETE_BUCKETS, residue_type
from reversi.models import Plan, PlanAction, RunStatus, StepUndo
from reversi_testkit import RUN_ID, example_run_spec, run_spec, step, tool

W = tool("w", residue=["a log line stays"])
MAIL = tool("mail", "irreversible", residue=["the mail was read"])
READ = tool("r", "read")


def test_design_example_report_is_incomplete_and_lists_every_step():
    report = build_report(build_plan(example_run_spec(), run_id=RUN_ID))
    assert report.skipped == [0]
    assert [(d.step, d.blocked_by) for d in report.deferred] == [(1, [2])]
    assert report.unresolved == [2]
    assert [u.step for u in report.unrecoverable] == [3]
    assert "the customer has read the email" in report.unrecoverable[0].reason
    assert report.complete is False


def test_report_complete_when_every_standing_step_is_compensated_and_verified():
    plan = build_plan(run_spec([step(0, READ), step(1, W), step(2, W, "failed")]), run_id=RUN_ID)
    report = build_report(plan, {1: StepOutcome(COMPENSATED, "verified")})
    assert report.compensated == [1]
    assert report.skipped == [0, 2]
    assert [(r.step, r.type, r.text) for r in report.residue] == [(1, "declared", "a log line stays")]
    assert report.complete is True
    assert report_message(report).startswith("complete: 1 compensated (1)")


def test_rule5_unverified_undo_is_only_in_unverified_and_the_report_is_incomplete():
    plan = build_plan(run_spec([step(0, W)]), run_id=RUN_ID)
    for verification in ("unverified", None):
        report = build_report(plan, {0: StepOutcome(COMPENSATED, verification)})
        assert report.unverified == [0]
        assert report.compensated == []
        # undone but not checked: whether the effect is gone is unknown (the manifest's lines are not claimed)
        assert [(r.step, r.type) for r in report.residue] == [(0, "unknown")]
        assert report.complete is False


def test_rule5_verification_failure_is_a_failed_step():
    plan = build_plan(run_spec([step(0, W)]), run_id=RUN_ID)
    report = build_report(plan,
                          {0: StepOutcome(COMPENSATED, "verificationFailed", error='status is "x", expected "y"')})
    assert [(f.step, f.error) for f in report.failed] == [(0, 'status is "x", expected "y"')]
    assert [(r.step, r.type) for r in report.residue] == [(0, "failed")]  # the effect may remain
    read = build_report(plan, {0: StepOutcome(COMPENSATED, "verificationFailed", effect_unknown=True,
                                              error="verification failed: read failed: exit code 1")})
    assert [(r.step, r.type) for r in read.residue] == [(0, "unknown")]  # nobody knows whether it is gone


def test_a_failed_undo_is_residue_unknown_by_the_structured_fact_never_by_its_text():
    """Typed residue (docs/concepts.md#the-report): a failed step is ``unknown`` exactly when its
    outcome says nobody knows its effect (``effect_unknown``: its last compensator that ran was
    killed mid-call, or its read-back failed); the error's words decide nothing."""
    plan = build_plan(run_spec([step(0, W), step(1, W), step(2, W)]), run_id=RUN_ID)
    report = build_report(plan, {
        0: StepOutcome(FAILED, error="compensation failed after 3 attempts: DeadlineExceeded: ...; exit code 143",
                       effect_unknown=True),
        1: StepOutcome(FAILED, error="compensation failed after 3 attempts: refund refused: 409"),
        2: StepOutcome(FAILED, error="compensation failed after 1 attempt: read failed (its own words)"),
    })
    assert [(r.step, r.type) for r in report.residue] == [(0, "unknown"), (1, "failed"), (2, "failed")]
    assert "whether its effect is gone is unknown" in report.residue[0].text
    assert "its effect may remain" in report.residue[1].text
    assert report.complete is False and [f.step for f in report.failed] == [0, 1, 2]


def test_a_failed_undo_journaled_with_an_unknown_effect_is_reported_unknown():
    """A failed undo read back from the journal (``status.undo``) keeps its ``effectUnknown``."""
    undo = [StepUndo(step=0, state="compensationFailed", idempotency_key="a" * 64, attempts=2,
                     last_error="compensation failed after 2 attempts: OOMKilled: exit code 137", effect_unknown=True),
            StepUndo(step=1, state="compensationFailed", idempotency_key="b" * 64, attempts=2,
                     last_error="compensation failed after 2 attempts: refund refused")]
    out = outcomes_from_undo(undo)
    assert out[0].effect_unknown is True and out[1].effect_unknown is False
    plan = build_plan(run_spec([step(0, W), step(1, W)]), run_id=RUN_ID)
    report = build_report(plan, out)
    assert [(r.step, r.type) for r in report.residue] == [(0, "unknown"), (1, "failed")]


def test_effect_unknown_types_only_a_failed_step():
    assert residue_type("failed", True) == "unknown" and residue_type("failed") == "failed"
    assert residue_type("cancelled", True) == "notAttempted"
    assert residue_type("compensated", True) == "declared"


def test_report_failed_awaiting_deferred_and_pending_buckets():
    plan = build_plan(run_spec([step(i, W) for i in range(5)]), run_id=RUN_ID)
    report = build_report(
        plan,
        {
            0: StepOutcome(FAILED, error="HTTP 500"),
            1: StepOutcome(AWAITING_APPROVAL),
            2: StepOutcome(DEFERRED, blocked_by=(0,)),
            3: RUNNING,
        },
    )
    assert [(f.step, f.error) for f in report.failed] == [(0, "HTTP 500")]
    assert report.awaiting_approval == [1]
    assert [(d.step, d.blocked_by) for d in report.deferred] == [(2, [0])]
    assert report.pending == [3, 4]
    assert report.complete is False
    assert "1 failed (0)" in report_message(report)


def test_rule6_rerun_reports_settled_steps_without_upgrading_an_unchecked_undo():
    spec = run_spec([step(0, W), step(1, W)])
    undo = RunStatus(
        undo=[
            StepUndo(step=0, state="compensated", idempotency_key="a" * 64, verification="verified"),
            StepUndo(step=1, state="compensated", idempotency_key="b" * 64, verification="unverified"),
        ]
    )
    plan = build_plan(spec, undo, run_id=RUN_ID)
    assert [a.kind for a in plan.actions] == ["skip", "skip"]
    report = build_report(plan, outcomes_from_undo(undo))
    assert report.compensated == [0]
    assert report.unverified == [1]
    assert report.complete is False
    # without the earlier outcomes the steps are merely skipped
    assert build_report(plan).skipped == [0, 1]


def test_outcomes_from_undo_maps_states():
    undo = [
        StepUndo(step=0, state="compensated", idempotency_key="a" * 64, verification="verified"),
        StepUndo(step=1, state="compensationFailed", idempotency_key="b" * 64, last_error="boom"),
        StepUndo(step=2, state="compensating", idempotency_key="c" * 64),
    ]
    out = outcomes_from_undo(undo)
    assert out[0] == StepOutcome(COMPENSATED, "verified")
    assert out[1].state == FAILED and out[1].error == "boom"
    assert out[2].state == RUNNING


# ----------------------------------------------------------------------------- properties

KINDS = ["compensate", "skip", "unrecoverable", "unresolved", "unmanifested", "defer"]
STATES = [None, PENDING, RUNNING, COMPENSATED, FAILED, AWAITING_APPROVAL, DEFERRED, "cancelled"]
CHECKS = [None, "verified", "none", "unverified", "verificationFailed"]


@st.composite
def plans_and_outcomes(draw):
    n = draw(st.integers(min_value=0, max_value=30))
    actions, outcomes = [], {}
    for i in range(n):
        kind = draw(st.sampled_from(KINDS))
        actions.append(
            PlanAction(step=i, tool="t", kind=kind, reason="r", residue=draw(st.lists(st.just("x"), max_size=2)))
        )
        state = draw(st.sampled_from(STATES))
        if state is not None and kind in ("compensate", "skip", "defer"):
            if kind == "skip" and state != COMPENSATED:
                continue
            outcomes[i] = StepOutcome(state, draw(st.sampled_from(CHECKS)),
                                     error=draw(st.sampled_from([None, "e", "verification failed: read failed: x"])),
                                     effect_unknown=draw(st.booleans()))
    return Plan(fully_reversible=False, actions=actions), outcomes


def buckets(report):
    out = {
        "compensated": report.compensated,
        "skipped": report.skipped,
        "failed": [f.step for f in report.failed],
        "unrecoverable": [u.step for u in report.unrecoverable],
        "unresolved": report.unresolved,
        "unmanifested": report.unmanifested,
        "deferred": [d.step for d in report.deferred],
        "awaiting_approval": report.awaiting_approval,
        "unverified": report.unverified,
        "pending": report.pending,
        "cancelled": report.cancelled,
    }
    return out


@settings(max_examples=300, deadline=None)
@given(plans_and_outcomes())
def test_property_every_step_lands_in_exactly_one_bucket(case):
    plan, outcomes = case
    report = build_report(plan, outcomes)
    seen = [s for steps in buckets(report).values() for s in steps]
    assert sorted(seen) == [a.step for a in plan.actions]


@settings(max_examples=300, deadline=None)
@given(plans_and_outcomes())
def test_property_complete_exactly_when_the_non_success_buckets_are_empty(case):
    plan, outcomes = case
    report = build_report(plan, outcomes)
    all_empty = all(not getattr(report, name) for name in INCOMPLETE_BUCKETS)
    assert report.complete is all_empty
    # complete: every step is compensated (and verified) or skipped, nothing else
    assert report.complete is (len(report.compensated) + len(report.skipped) == len(plan.actions))


@settings(max_examples=200, deadline=None)
@given(plans_and_outcomes())
def test_property_report_never_claims_a_check_that_did_not_happen(case):
    plan, outcomes = case
    report = build_report(plan, outcomes)
    for s in report.compensated:
        # checked by a reader, or openly listed as having no read-back declared
        assert outcomes[s].state == COMPENSATED and outcomes[s].verification in ("verified", "none")
        assert (outcomes[s].verification == "none") is (s in report.no_read_back)
    assert set(report.no_read_back) <= set(report.compensated)
    required = build_report(plan, outcomes, require_verification=True)
    for s in required.compensated:
        assert outcomes[s].verification == "verified", "requireVerification: only a read-back counts"
    declared_steps = {r.step for r in report.residue if r.type == "declared"}
    assert declared_steps <= set(report.compensated), "declared residue only for undone (and checked) steps"


@settings(max_examples=300, deadline=None)
@given(plans_and_outcomes())
def test_property_complete_exactly_when_only_declared_residue(case):
    """Typed residue: complete <=> every residue entry is declared; every step of a bucket other
    than compensated and skipped has exactly one residue entry, of the type its status maps to."""
    plan, outcomes = case
    report = build_report(plan, outcomes)
    assert report.complete is all(r.type == "declared" for r in report.residue)
    not_declared = [r.step for r in report.residue if r.type != "declared"]
    assert len(not_declared) == len(set(not_declared)), "one non-declared entry per step"
    for name, steps in buckets(report).items():
        for s in steps:
            types = [r.type for r in report.residue if r.step == s and r.type != "declared"]
            if name in ("compensated", "skipped"):
                assert types == []
            else:
                # the structured fact alone types a failed step: its error's words decide nothing
                assert types == [residue_type(name, outcomes[s].effect_unknown if s in outcomes else False)], (name, s)
    for r in report.residue:
        assert r.type in ("declared", "failed", "notAttempted", "unknown") and r.text


def test_rule5_no_read_back_declared_is_compensated_and_complete_unless_required():
    plan = Plan(fully_reversible=True, actions=[PlanAction(step=0, tool="t", kind="compensate", reason="r")])
    outcome = {0: StepOutcome(COMPENSATED, "none")}
    report = build_report(plan, outcome)
    assert report.compensated == [0] and report.no_read_back == [0] and report.unverified == []
    assert report.complete is True
    required = build_report(plan, outcome, require_verification=True)
    assert required.compensated == [] and required.unverified == [0] and required.complete is False


def test_rule8_a_denied_step_stays_in_awaiting_approval_and_says_why():
    plan = Plan(fully_reversible=True, actions=[PlanAction(step=0, tool="t", kind="compensate", reason="r")])
    report = build_report(plan, {0: StepOutcome(AWAITING_APPROVAL, error="denied by ana: keep it")})
    assert report.awaiting_approval == [0] and report.complete is False
    assert [(d.step, d.reason) for d in report.denied] == [(0, "denied by ana: keep it")]


def test_the_summary_names_a_denied_step_denied_not_awaiting():
    """A denied compensation stays in the awaitingApproval bucket (the contract), but the one-line
    summary says what happened to it: a person said no, nothing waits any more."""
    from reversi.models.rollbackrequest import Report, StepReason

    report = Report.model_construct(
        compensated=[0], skipped=[], failed=[], unrecoverable=[], unresolved=[], unmanifested=[], deferred=[],
        awaiting_approval=[3, 4], unverified=[], pending=[], no_read_back=[],
        denied=[StepReason.model_construct(step=3, reason="denied by oncall: keep it")], residue=[], complete=False)
    text = report_message(report)
    assert "1 awaiting approval (4)" in text and "1 denied (3)" in text


def test_a_run_deleted_mid_way_leaves_the_steps_under_way_unknown_and_the_rest_as_reported():
    """docs/guarantees.md#delete-run: a pending step whose compensator had started may have taken
    effect and its journal is gone: residue unknown; a step never started stays notAttempted, an
    undone one stays compensated."""
    from reversi.engine.report import when_run_gone
    from reversi.models.rollbackrequest import Report, StepResidue

    report = Report(compensated=[3], pending=[0, 1, 2], residue=[
        StepResidue(step=0, type="notAttempted", text="its undo had not started"),
        StepResidue(step=1, type="notAttempted", text="its undo had not started or settled"),
        StepResidue(step=2, type="notAttempted", text="its undo had not started or settled")])
    gone = when_run_gone(report, started={1, 2, 3})
    assert {r.step: r.type for r in gone.residue} == {0: "notAttempted", 1: "unknown", 2: "unknown"}
    assert gone.compensated == [3] and gone.pending == [0, 1, 2] and not gone.complete
    assert "Run was deleted" in gone.residue[1].text
