"""The journal assembled from RunSteps (engine/journal.py) and the journal's admission rules."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reversi.engine import admission as rules
from reversi.engine.journal import Entry, assemble
from reversi.models.run import RunSpec, StepUndo
from reversi.models.runstep import RunStepSpec, StepResolution, forward_key_label, step_name

RUN = RunSpec.model_validate({"manifestRef": {"name": "m"}, "scope": {"actor": "a"}})


def _entry(i: int, outcome: str = "succeeded", resolution: dict | None = None, undo: str | None = None) -> Entry:
    spec = RunStepSpec.model_validate({"runRef": {"name": "r"}, "index": i, "tool": "t.x", "args": {"i": i},
                                       "outcome": outcome, **({"resolution": resolution} if resolution else {})})
    state = StepUndo(step=i, state=undo, idempotency_key="0" * 64) if undo else None
    return Entry(spec, state)


@given(st.permutations(list(range(30))))
def test_steps_come_out_in_index_order_whatever_order_they_were_read_in(order):
    journal = assemble(RUN, [_entry(i) for i in order])
    assert [s.index for s in journal.spec.steps] == list(range(30))
    assert journal.missing == [] and journal.size == 30
    assert journal.spec.manifest_ref.name == "m" and journal.spec.scope.actor == "a"


@given(st.sets(st.integers(0, 40), min_size=1))
def test_a_gap_is_named_never_papered_over(present):
    journal = assemble(RUN, [_entry(i) for i in present])
    top = max(present)
    expected = [i for i in range(top) if i not in present][:5]
    assert journal.missing == expected
    if expected:
        assert f"step(s) {expected[0]}" in journal.gap_message("ns/r")


def test_resolutions_and_undo_state_travel_with_their_step():
    journal = assemble(RUN, [_entry(0), _entry(1, "uncertain", {"status": "succeeded", "result": {"id": 1},
                                                               "note": "seen"}, undo="compensated")])
    assert [(r.step, r.status, r.result) for r in journal.spec.resolutions] == [(1, "succeeded", {"id": 1})]
    assert journal.undo[1].state == "compensated" and 0 not in journal.undo


def test_a_runstep_wins_over_the_inline_step_it_was_moved_from():
    inline = RunSpec.model_validate({"manifestRef": {"name": "m"}, "steps": [
        {"index": 0, "tool": "t.x", "outcome": "intended"}, {"index": 1, "tool": "t.x", "outcome": "succeeded"}]})
    journal = assemble(inline, [_entry(0, "failed")], [StepUndo(step=1, state="compensated", idempotency_key="0" * 64)])
    assert [s.outcome for s in journal.spec.steps] == ["failed", "succeeded"]
    assert journal.undo[1].state == "compensated"


def test_step_names_order_and_bound():
    assert step_name("order-4711", 42) == "order-4711-00042"
    assert sorted(step_name("r", i) for i in (10, 2, 100)) == ["r-00002", "r-00010", "r-00100"]
    for bad in (-1, 100_000, True, "3"):
        try:
            step_name("r", bad)  # type: ignore[arg-type]
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was accepted")


def test_forward_key_labels_are_label_values_and_tell_tools_apart():
    a, b = forward_key_label("pay.charge", "o-1"), forward_key_label("pay.refund", "o-1")
    assert a != b and len(a) == 40 and a.isalnum()


def test_a_call_settled_failed_or_compensated_no_longer_stands():
    step = RunStepSpec.model_validate({"runRef": {"name": "r"}, "index": 9, "tool": "t.x",
                                       "outcome": "intended"}).as_step()
    failed = StepResolution(status="failed", note="no such charge")
    assert rules.check_forward_duplicate(step, "k", [(3, "t.x", "succeeded", None, None)]) is not None
    assert rules.check_forward_duplicate(step, "k", [(3, "t.x", "uncertain", None, None)]) is not None
    assert rules.check_forward_duplicate(step, "k", [(3, "t.x", "uncertain", failed, None)]) is None
    assert rules.check_forward_duplicate(step, "k", [(3, "t.x", "succeeded", None, "compensated")]) is None
    assert rules.check_forward_duplicate(step, "k", [(3, "t.other", "succeeded", None, None)]) is None
    assert rules.check_forward_duplicate(step, "k", [(9, "t.x", "succeeded", None, None)]) is None


def test_call_size_is_refused_by_name():
    step = RunStepSpec.model_validate({"runRef": {"name": "r"}, "index": 0, "tool": "t.x", "outcome": "succeeded",
                                       "result": {"blob": "x" * 100}})
    refusal = rules.check_call_size(step, 64)
    assert refusal is not None and "result is" in refusal.message and "limit of 64 bytes" in refusal.message
    assert rules.check_call_size(step, 10_000) is None


@given(st.integers(1, 40), st.integers(0, 45))
def test_terminal_boundary_a_request_plans_the_run_as_it_stood_at_the_lock(size, count):
    """Rule 11: ``upto(runSteps)`` keeps steps 0..runSteps-1, their resolutions and undo
    state, and never a step that arrived later; a step below the count not yet read is missing."""
    entries = [_entry(i, "uncertain", {"status": "failed", "note": "n"} if i % 3 == 0 else None,
                      "compensated" if i % 2 else None) for i in range(size)]
    journal = assemble(RUN, entries).upto(count)
    assert [s.index for s in journal.spec.steps] == list(range(min(size, count)))
    assert all(r.step < count for r in journal.spec.resolutions)
    assert all(i < count for i in journal.undo)
    assert journal.missing == list(range(size, count))[:5]


def test_terminal_boundary_a_closed_run_refuses_new_steps_naming_the_request():
    active = rules.check_run_open("undo-1", "undo-1", "Run shop/r", "payments.capture")
    assert active is not None and active.reason == rules.RUN_CLOSED
    assert "Run shop/r: run is being rolled back by RollbackRequest undo-1" in active.message
    ended = rules.check_run_open(None, "undo-1", "Run shop/r")
    assert ended is not None and "run was rolled back by RollbackRequest undo-1" in ended.message
    assert rules.check_run_open(None, None, "Run shop/r") is None


def test_recovery_required_refuses_a_step_that_cannot_be_undone():
    from reversi.models.run import Step
    from reversi.models.toolmanifest import ToolManifestSpec

    manifest = ToolManifestSpec.model_validate({"tools": [
        {"name": "e.send", "effect": "irreversible"}, {"name": "p.get", "effect": "read"}]})
    strict = RUN.model_copy(update={"recovery": "required"})
    send = Step(index=0, tool="e.send", outcome="intended")
    refusal = rules.check_recovery(strict, [send], manifest)
    assert refusal is not None and refusal.reason == rules.RECOVERY_REQUIRED
    assert refusal.message.startswith("recovery required: e.send cannot be undone")
    assert rules.check_recovery(strict, [Step(index=0, tool="x.unknown", outcome="intended")], manifest) is not None
    assert rules.check_recovery(strict, [Step(index=0, tool="p.get", outcome="intended")], manifest) is None
    assert rules.check_recovery(RUN, [send], manifest) is None  # bestEffort: the default, as before
