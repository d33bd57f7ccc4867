"""Retention's rules (docs/concepts.md#retention): one test per rule of what may be deleted, and
hypothesis properties over every combination of the Run's facts."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reversi.engine import retention as rules
from reversi.engine.acknowledgement import LEGACY_ANNOTATION
from reversi.handlers.retention import Pacer, RequestsByRun, namespace_setting, request_facts

T0 = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
DAY = 86_400
TTL = rules.Setting(DAY, "default")


def _ts(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _run(*, created: dt.datetime = T0, rolled_back: str | None = None, lock_changed: dt.datetime | None = None,
         active: str | None = None, ack: dict | None = None, legacy: str | None = None, parent: str | None = None,
         retention: dict | None = None, deleting: bool = False, last: str | None = "undo") -> dict:
    conds = []
    if lock_changed is not None:
        conds.append({"type": "Locked", "status": "True" if active else "False",
                      "lastTransitionTime": _ts(lock_changed)})
    if rolled_back is not None:
        conds.append({"type": "RolledBack", "status": rolled_back, "lastTransitionTime": _ts(lock_changed or created)})
    meta = {"name": "order-1", "namespace": "shop", "uid": "u-1", "resourceVersion": "7",
            "creationTimestamp": _ts(created), "annotations": {LEGACY_ANNOTATION: legacy} if legacy else {}}
    if deleting:
        meta["deletionTimestamp"] = _ts(created)
    spec: dict = {"manifestRef": {"name": "m"}}
    if ack:
        spec["acknowledgement"] = ack
    if parent:
        spec["parentRef"] = {"name": parent}
    if retention:
        spec["retention"] = retention
    return {"metadata": meta, "spec": spec, "status": {"conditions": conds, "activeRequest": active,
                                                       "lastRequest": last}}


def _steps(count: int = 3, at: dt.datetime = T0, outcome: str | None = "succeeded") -> rules.StepActivity:
    return rules.StepActivity(count, at, outcome)


def _decide(run: dict, now: dt.datetime, **kw) -> rules.Verdict:
    kw.setdefault("steps", _steps())
    return rules.decide(rules.facts_of(run), kw.pop("applies", TTL), now, **kw)


LATER = T0 + dt.timedelta(days=2)


# ------------------------------------------------------------------ one test per rule


def test_a_quiet_run_with_nothing_unfinished_expires_a_ttl_after_its_last_activity():
    verdict = _decide(_run(), LATER)
    assert verdict.expire and verdict.reason == rules.EXPIRED
    assert "no activity since 2026-03-01T12:00:00Z" in verdict.message


def test_rule1_a_run_being_deleted_is_left_to_the_api_server():
    assert _decide(_run(deleting=True), LATER).reason == rules.BEING_DELETED


def test_rule2_a_namespace_annotation_that_cannot_be_read_keeps_its_runs():
    applies = rules.setting(None, "30d", DAY)
    verdict = _decide(_run(), LATER, applies=applies)
    assert not verdict.expire and verdict.reason == rules.INVALID_RETENTION
    assert "'30d' is neither a whole number of seconds" in verdict.message


def test_rule3_a_run_kept_forever_on_purpose_is_never_deleted():
    applies = rules.setting({"keep": "Forever"}, "60", 60)
    verdict = _decide(_run(retention={"keep": "Forever"}), T0 + dt.timedelta(days=3650), applies=applies)
    assert not verdict.expire and verdict.reason == rules.KEPT_FOREVER and verdict.until is None
    assert "spec.retention" in verdict.message


def test_rule3_no_setting_anywhere_keeps_every_run():
    verdict = _decide(_run(), LATER, applies=rules.setting(None, None, None))
    assert verdict.reason == rules.KEPT_FOREVER and "the operator's default" in verdict.message


def test_rule4_a_child_run_is_kept_while_its_parent_exists():
    child = _run(parent="order-0")
    assert _decide(child, LATER, parent_exists=True).reason == rules.PARENT_RUN_EXISTS
    assert _decide(child, LATER, parent_exists=False).expire, "the parent is gone: the child goes by its own rules"


def test_rule5_a_run_with_a_request_waiting_for_approval_is_kept():
    requests = [rules.RequestFacts("undo", "AwaitingApproval")]
    verdict = _decide(_run(active="undo", lock_changed=T0), LATER, requests=requests)
    assert not verdict.expire and verdict.reason == rules.AWAITING_APPROVAL
    assert "kubectl reversi approve undo" in verdict.message


def test_rule5_a_run_whose_lock_a_request_holds_is_kept():
    verdict = _decide(_run(active="undo", lock_changed=T0), LATER, requests=[rules.RequestFacts("undo", "Running")])
    assert verdict.reason == rules.ROLLBACK_IN_PROGRESS
    # also when the request is not known (deleted while the operator was down): the lock says so
    assert _decide(_run(active="gone", lock_changed=T0), LATER).reason == rules.ROLLBACK_IN_PROGRESS


@pytest.mark.parametrize("phase", ["Pending", "Waiting", None])
def test_rule5_a_run_with_a_request_waiting_for_it_or_its_lock_is_kept(phase):
    verdict = _decide(_run(), LATER, requests=[rules.RequestFacts("undo-2", phase)])
    assert not verdict.expire and verdict.reason == rules.ROLLBACK_PENDING


@pytest.mark.parametrize("phase", ["Planned", "Succeeded", "Incomplete", "Failed"])
def test_rule5_finished_requests_do_not_keep_a_run(phase):
    assert _decide(_run(rolled_back="True"), LATER, requests=[rules.RequestFacts("undo", phase)]).expire


def test_rule6_a_run_with_a_failed_undo_not_acknowledged_is_kept():
    verdict = _decide(_run(rolled_back="False"), LATER, requests=[rules.RequestFacts("undo", "Incomplete")])
    assert not verdict.expire and verdict.reason == rules.RESIDUE_STANDING
    assert "kubectl reversi acknowledge" in verdict.message


def test_rule6_once_a_person_acknowledged_the_residue_the_run_may_go():
    ack = {"note": "refunded by hand", "actor": "lead", "acknowledgedAt": _ts(T0), "request": "undo"}
    assert _decide(_run(rolled_back="False", ack=ack), LATER).expire
    assert _decide(_run(rolled_back="False", legacy="told the customer"), LATER).expire
    # an acknowledgement of an earlier rollback does not cover the last one
    assert _decide(_run(rolled_back="False", ack=ack, last="undo-2"), LATER).reason == rules.RESIDUE_STANDING


def test_the_acknowledgement_is_activity_the_ttl_starts_again():
    acknowledged_at = T0 + dt.timedelta(hours=36)
    ack = {"note": "refunded by hand", "actor": "lead", "acknowledgedAt": _ts(acknowledged_at), "request": "undo"}
    verdict = _decide(_run(rolled_back="False", ack=ack), LATER)
    assert verdict.reason == rules.NOT_EXPIRED and verdict.until == acknowledged_at + dt.timedelta(days=1)


def test_rule7_a_run_with_a_run_below_it_kept_is_kept():
    kept = rules.Verdict(False, rules.RECORDING, "step 9 was last written ...", T0 + dt.timedelta(days=3))
    verdict = _decide(_run(), LATER, below=[("order-1-shipping", kept)])
    assert not verdict.expire and verdict.reason == rules.RUN_BELOW_KEPT
    assert "order-1-shipping" in verdict.message and verdict.until == kept.until
    gone = rules.Verdict(True, rules.EXPIRED, "no activity")
    assert _decide(_run(), LATER, below=[("order-1-shipping", gone)]).expire


def test_rule8_a_run_whose_own_activity_is_recent_is_kept_until_a_ttl_after_it():
    rolled = T0 + dt.timedelta(hours=30)
    verdict = _decide(_run(rolled_back="True", lock_changed=rolled), LATER)
    assert not verdict.expire and verdict.reason == rules.NOT_EXPIRED
    assert verdict.until == rolled + dt.timedelta(seconds=DAY)
    assert verdict.seconds_left(LATER) == pytest.approx(6 * 3600)


def test_rule9_a_run_whose_agent_is_still_recording_is_kept():
    recent = LATER - dt.timedelta(minutes=5)
    verdict = _decide(_run(), LATER, steps=_steps(42, recent, "intended"))
    assert not verdict.expire and verdict.reason == rules.RECORDING
    assert verdict.until == recent + dt.timedelta(seconds=DAY)
    assert "step 41 was last written" in verdict.message


def test_rule9_the_newest_step_is_read_only_when_everything_else_lets_the_run_go():
    verdict = _decide(_run(), LATER, steps=None)
    assert verdict.read_steps and not verdict.expire and verdict.reason == rules.STEPS_UNREAD
    assert not _decide(_run(), T0 + dt.timedelta(hours=1), steps=None).read_steps
    assert not _decide(_run(rolled_back="False"), LATER, steps=None).read_steps


def test_a_run_with_no_step_expires_on_its_own_activity():
    assert _decide(_run(), LATER, steps=rules.StepActivity(0)).expire


# ------------------------------------------------------------------ settings


def test_the_run_wins_over_the_namespace_which_wins_over_the_default():
    assert rules.setting({"ttlSeconds": 60}, "3600", 86400) == rules.Setting(60, "spec.retention")
    assert rules.setting(None, "3600", 86400) == rules.Setting(3600, "namespace")
    assert rules.setting(None, "Forever", 86400) == rules.Setting(None, "namespace")
    assert rules.setting(None, None, 86400) == rules.Setting(86400, "default")
    assert rules.setting({}, None, 5) == rules.Setting(5, "default"), "an empty spec.retention sets nothing"


@pytest.mark.parametrize("value", ["", "0", "-5", "1.5", "30d", "forever", str(rules.MAX_TTL_SECONDS + 1)])
def test_an_annotation_that_is_not_seconds_or_forever_is_an_error_that_says_what_to_write(value):
    ttl, error = rules.parse_annotation(value)
    assert ttl is None and error is not None and "whole number of seconds" in error


def test_an_invalid_spec_retention_that_slipped_past_the_schema_keeps_the_run():
    applies = rules.setting({"ttlSeconds": 0}, None, 60)
    assert applies.error and _decide(_run(), LATER, applies=applies).reason == rules.INVALID_RETENTION


# ------------------------------------------------------------------ facts


def test_the_runs_activity_is_its_creation_its_locks_transitions_and_its_acknowledgement():
    run = _run(rolled_back="True", lock_changed=T0 + dt.timedelta(hours=2))
    run["status"]["conditions"].append({"type": "Archived", "status": "False",
                                        "lastTransitionTime": _ts(T0 + dt.timedelta(hours=9))})
    assert rules.run_activity(run) == T0 + dt.timedelta(hours=2), "retention's own condition is not activity"
    assert rules.run_activity({"metadata": {}}) is None


def test_the_newest_steps_last_write_is_the_latest_of_its_creation_recording_and_managed_fields():
    meta = {"metadata": {"creationTimestamp": _ts(T0), "managedFields": [
        {"manager": "sdk", "operation": "Update", "time": _ts(T0 + dt.timedelta(seconds=3))},
        {"manager": "kubectl", "operation": "Update", "time": _ts(T0 + dt.timedelta(hours=5))},
        {"manager": "reversi", "operation": "Update", "subresource": "status"}]}}
    found = rules.step_activity(12, meta)
    assert found == rules.StepActivity(12, T0 + dt.timedelta(hours=5), None)
    assert rules.step_activity(0, None) == rules.StepActivity(0)


def test_what_the_informers_keep_of_requests_and_namespaces():
    req = {"metadata": {"name": "undo", "namespace": "shop"}, "spec": {"runRef": {"name": "order-1"}},
           "status": {"phase": "Waiting"}}
    assert request_facts(req) == ("order-1", rules.RequestFacts("undo", "Waiting"))
    done = {**req, "status": {"phase": "Incomplete", "completionTime": "2026-01-01T00:00:00Z"}}
    assert request_facts(done) == ("order-1", rules.RequestFacts("undo", "Incomplete"))
    assert request_facts({"metadata": {"name": "x"}, "spec": {}}) is None
    ns = {"metadata": {"name": "shop", "annotations": {rules.NAMESPACE_ANNOTATION: "60"}}}
    assert namespace_setting(ns) == "60" and namespace_setting({"metadata": {"name": "x"}}) is None


def test_requests_are_indexed_by_their_run_and_leave_it_when_deleted():
    index = RequestsByRun()
    assert index.changed(("shop", "undo"), None, ("order-1", rules.RequestFacts("undo", None))) == [("shop", "order-1")]
    assert index.of("shop", "order-1") == [rules.RequestFacts("undo", None)]
    index.changed(("shop", "undo"), ("order-1", rules.RequestFacts("undo", None)), None)
    assert index.of("shop", "order-1") == []


def test_the_pacer_lets_a_burst_through_then_one_per_interval():
    now = [0.0]
    pacer = Pacer(2.0, clock=lambda: now[0])
    assert pacer.take() == 0.0 and pacer.take() == 0.0
    assert pacer.take() == pytest.approx(0.5)
    now[0] = 0.5
    assert pacer.take() == 0.0 and pacer.take() > 0


# ------------------------------------------------------------------ properties

times = st.integers(min_value=0, max_value=10 * DAY).map(lambda s: T0 + dt.timedelta(seconds=s))
phases = st.sampled_from([None, "Pending", "Waiting", "Planned", "Running", "AwaitingApproval", "Succeeded",
                          "Incomplete", "Failed"])


@st.composite
def situations(draw):
    run = _run(created=T0, rolled_back=draw(st.sampled_from([None, "True", "False"])),
               lock_changed=draw(st.none() | times), active=draw(st.none() | st.just("undo")),
               legacy=draw(st.none() | st.just("done by hand")), parent=draw(st.none() | st.just("p")),
               deleting=draw(st.booleans()))
    requests = [rules.RequestFacts(f"r{i}", p) for i, p in enumerate(draw(st.lists(phases, max_size=3)))]
    steps = rules.StepActivity(draw(st.integers(0, 5)), draw(st.none() | times))
    applies = draw(st.sampled_from([TTL, rules.Setting(None, "default"), rules.Setting(60, "namespace"),
                                    rules.Setting(None, "namespace", "bad")]))
    return run, requests, steps, applies, draw(st.booleans())


@given(situations(), times)
def test_a_run_expires_only_when_nothing_about_it_is_unfinished_and_a_ttl_passed_since_all_activity(sit, now):
    run, requests, steps, applies, parent_exists = sit
    facts = rules.facts_of(run)
    verdict = rules.decide(facts, applies, now, requests=requests, steps=steps, parent_exists=parent_exists)
    if verdict.expire:
        assert applies.ttl_seconds is not None and applies.error is None and not facts.deleting
        assert not facts.active_request and not facts.residue
        assert all(r.phase in ("Planned", "Succeeded", "Incomplete", "Failed") for r in requests)
        assert not (parent_exists and facts.parent)
        ttl = dt.timedelta(seconds=applies.ttl_seconds)
        assert facts.activity is not None and facts.activity + ttl <= now
        assert steps.newest_at is None or steps.newest_at + ttl <= now
    assert verdict.reason in rules.REASONS
    if verdict.until is not None:
        assert verdict.until > now, "a keeping that ends by itself ends later than now"


@given(situations(), times, st.integers(min_value=0, max_value=10 * DAY))
def test_once_a_run_may_go_it_may_go_later_too(sit, now, later):
    run, requests, steps, applies, parent_exists = sit
    facts = rules.facts_of(run)
    first = rules.decide(facts, applies, now, requests=requests, steps=steps, parent_exists=parent_exists)
    again = rules.decide(facts, applies, now + dt.timedelta(seconds=later), requests=requests, steps=steps,
                         parent_exists=parent_exists)
    assert not first.expire or again.expire


@given(situations(), times)
def test_a_kept_run_whose_keeping_ends_by_itself_may_go_at_that_moment(sit, now):
    run, requests, steps, applies, parent_exists = sit
    facts = rules.facts_of(run)
    verdict = rules.decide(facts, applies, now, requests=requests, steps=steps, parent_exists=parent_exists)
    if verdict.reason in (rules.NOT_EXPIRED, rules.RECORDING):
        at = rules.decide(facts, applies, verdict.until, requests=requests, steps=steps, parent_exists=parent_exists)
        assert at.expire or at.reason == rules.RECORDING, "at the moment named, the next rule decides"


def test_the_journal_ceiling_is_the_lowest_runstep_count_of_a_namespaces_quotas():
    from reversi.metrics import journal_ceilings

    quota = lambda ns, hard: {"metadata": {"namespace": ns}, "spec": {"hard": hard}}  # noqa: E731
    found = journal_ceilings([quota("shop", {"count/runsteps.reversi.dev": "200k"}),
                              quota("shop", {"count/runsteps.reversi.dev": "5000", "pods": "10"}),
                              quota("lab", {"pods": "10"}), quota("ops", {"count/runsteps.reversi.dev": "1e3"})])
    assert found == {"shop": 5000, "ops": 1000}
