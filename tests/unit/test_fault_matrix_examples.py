"""Cells of the fault matrix (docs/guarantees.md) pinned one at a time, where the property
(``test_fault_matrix_property.py``) meets the fault only at random and does not pin the moment or
the outcome a cell names.

Each example drives the engine's passes through one rollback as the property does (its
:class:`World`: journal first, then Jobs, then status; every Job read by the product's
``job_view``; a simulated downstream that counts effects per idempotency key), with the faults
given in order instead of drawn. Rule only: no cluster, no real downstream.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import pytest
from test_fault_matrix_property import (BACKOFF, COMPENSATOR_FAULTS, MAX_PASSES, NOW, READER_FAULTS, Downstream,
                                        Fault, World)

from reversi.engine import decide as dc
from reversi.models.rollbackrequest import Report, RollbackRequestSpec
from reversi_testkit import run_spec, snapshot, step, tool

OK = next(f for f in COMPENSATOR_FAULTS if f.name == "ok")
READ_OK = next(f for f in READER_FAULTS if f.name == "ok")


def fault(name: str, faults: Iterable[Fault] = COMPENSATOR_FAULTS) -> Fault:
    return next(f for f in faults if f.name == name)


def in_order(compensators: list[tuple[Fault, int]], readers: list[Fault] | None = None
             ) -> Callable[[str], tuple[Fault, int]]:
    """The faults of the Jobs as they start, in order: ``(fault, passes it runs)`` for each
    compensator; each reader (and guard read) meets the next of ``readers`` (then ``ok``), one pass."""
    comps, reads = list(compensators), list(readers or [])

    def draw(role: str) -> tuple[Fault, int]:
        if role == "compensator":
            return comps.pop(0)
        return (reads.pop(0) if reads else READ_OK), 1
    return draw


def one_step(entry: dict | None = None, **spec) -> World:
    """A run of one write step (its effect stands downstream) and a request of ``spec``."""
    run = run_spec([step(0, snapshot(entry or tool("w0")), result={"id": "r0"})])
    request = RollbackRequestSpec.model_validate({"runRef": {"name": "order-4711"}, "retries": 1,
                                                  "backoff": {"baseMs": 100, "maxMs": 400}, **spec})
    return World(run=run, spec=request, downstream=Downstream({0: True}), draw_fault=lambda role: (OK, 0))


def roll_back(world: World, draw: Callable[[str], tuple[Fault, int]],
              watch: Callable[[World, dc.Decision], None] | None = None) -> Report:
    """Drive the passes to the request's end; ``watch`` sees each pass."""
    world.draw_fault = draw
    rng, now = random.Random(0), NOW
    for _ in range(MAX_PASSES):
        d = world.one_pass(now, None, rng)
        if watch:
            watch(world, d)
        if d.ending.finished and not d.awaiting:
            return d.ending.report
        world.tick()
        now += 1.0
    raise AssertionError("\n".join(world.log))


def residue(report: Report) -> dict[int, str]:
    return {r.step: r.type for r in report.residue}


def calls(world: World) -> list[bool]:
    """The downstream's compensation calls of step 0, each with the step's key: real (True) or a replay."""
    assert {key for _, key, _ in world.downstream.calls} <= {world.key(0)}
    return [real for _, _, real in world.downstream.calls]


# ------------------------------------------------------------------------------ the compensator


AFTER_ITS_CALL = [
    ("fails", fault("fails, after its call"), "failed"),
    ("crashes", Fault("crashes, after its call", acts=True, exit_code=139, **BACKOFF), "failed"),
    ("OOM-killed", fault("OOM-killed, after its call"), "unknown"),
]


@pytest.mark.parametrize("name, after_call, out_of_attempts", AFTER_ITS_CALL, ids=[a[0] for a in AFTER_ITS_CALL])
def test_a_compensator_that_ends_after_its_call_took_effect_is_replayed_with_the_same_key(name, after_call,
                                                                                          out_of_attempts):
    """docs/guarantees.md#c-fails, #c-crashes, #c-oom: the call took effect, then the program
    failed (answered non-zero), crashed or was OOM-killed. Reversi cannot know that it acted: the
    next attempt sends the same key, the downstream replays it, and the read-back confirms it:
    compensated, one effect. Out of attempts the step is failed, residue ``failed`` ("may remain")
    for a program that answered, ``unknown`` for one the kernel stopped, although the effect is gone."""
    world = one_step(retries=2)
    report = roll_back(world, in_order([(after_call, 0), (OK, 0)]))
    assert report.compensated == [0] and world.mine[0].attempts == 2
    assert calls(world) == [True, False] and world.downstream.standing[0] is False

    world = one_step(retries=1)
    report = roll_back(world, in_order([(after_call, 0)]))
    assert [f.step for f in report.failed] == [0] and residue(report) == {0: out_of_attempts}
    assert calls(world) == [True] and world.downstream.standing[0] is False  # gone, and the report says "may remain"


def test_a_compensator_that_hangs_keeps_its_step_compensating_until_the_jobs_deadline_ends_it():
    """docs/guarantees.md#c-hangs: while the compensator hangs, every pass leaves the step
    ``compensating`` and the request running, and starts nothing else for it; the Job's deadline
    ends it (as killed by its deadline): the next attempt sends the same key; out of attempts, the
    step is failed with residue ``unknown``."""
    hangs = fault("hangs until its deadline, exits 143 on SIGTERM, before its call")
    seen: list[tuple[str, bool]] = []

    def watch(world: World, d: dc.Decision) -> None:
        if ("compensator", 0, 1, 0) in world.jobs and not world.jobs["compensator", 0, 1, 0].finished:
            seen.append((world.entries[0]["stage"], d.ending.finished))

    world = one_step(retries=2)
    report = roll_back(world, in_order([(hangs, 5), (OK, 0)]), watch)
    assert seen == [("compensating", False)] * 6
    assert report.compensated == [0] and calls(world) == [True]
    assert world.jobs["compensator", 0, 1, 0].seen.message.startswith("DeadlineExceeded")

    world = one_step(retries=1)
    report = roll_back(world, in_order([(hangs, 5)]))
    assert residue(report) == {0: "unknown"} and "DeadlineExceeded" in report.failed[0].error
    assert calls(world) == [] and world.downstream.standing[0] is True


def test_a_compensator_evicted_before_its_container_ran_is_retried_and_never_acted():
    """docs/guarantees.md#c-evicted-1: its pod was evicted while its container was being created.
    The attempt fails with the Job's own reason (the pod says nothing more), is retried with the
    same key, and the next attempt's call is the one real effect (no replay). Out of attempts:
    failed, residue ``failed``: its program never ran, the effect remains."""
    evicted = fault("evicted before its container ran")
    world = one_step(retries=2)
    report = roll_back(world, in_order([(evicted, 0), (OK, 0)]))
    first = world.jobs["compensator", 0, 1, 0].seen
    assert first is not None and (first.state, first.lost, first.effect_unknown) == ("failed", True, False)
    assert first.message.startswith("BackoffLimitExceeded")
    assert report.compensated == [0] and calls(world) == [True] and world.mine[0].attempts == 2

    world = one_step(retries=1)
    report = roll_back(world, in_order([(evicted, 0)]))
    assert residue(report) == {0: "failed"} and calls(world) == [] and world.downstream.standing[0] is True


def test_a_lying_compensator_is_caught_by_an_honest_read_back_and_not_without_one():
    """docs/guarantees.md#c-lies: it exits 0 and does nothing. With a read-back: the reader finds
    the effect standing, reads again, then the step is failed (``verification failed``), residue
    ``failed``. Without one: the report says compensated (``noReadBack``), complete, while the
    effect stands (WRONG, as the matrix says); with ``requireVerification``: unverified, residue ``unknown``."""
    lies = fault("lies: exits 0, did nothing")
    world = one_step()
    report = roll_back(world, in_order([(lies, 0)]))
    assert residue(report) == {0: "failed"} and report.failed[0].error.startswith("verification failed")
    assert world.mine[0].state == "compensationFailed" and world.downstream.standing[0] is True

    world = one_step(tool("w0", verify=False))
    report = roll_back(world, in_order([(lies, 0)]))
    assert report.compensated == [0] and report.no_read_back == [0] and report.complete
    assert world.downstream.standing[0] is True  # the report is wrong, and Reversi cannot know

    world = one_step(tool("w0", verify=False), requireVerification=True)
    report = roll_back(world, in_order([(lies, 0)]))
    assert report.unverified == [0] and residue(report) == {0: "unknown"} and not report.complete


# ------------------------------------------------------------------------------ the reader


def test_a_reader_that_says_undone_when_the_effect_stands_makes_the_report_wrong():
    """docs/guarantees.md#r-lies-4: the compensator did nothing and the reader says "undone": the
    step is compensated and verified while the effect stands. Reversi cannot see it."""
    world = one_step()
    report = roll_back(world, in_order([(fault("lies: exits 0, did nothing"), 0)],
                                       [fault("lies: says undone", READER_FAULTS)]))
    assert report.compensated == [0] and world.mine[0].verification == "verified" and report.complete
    assert world.downstream.standing[0] is True


def test_a_reader_log_line_after_its_answer_is_a_failed_read():
    """docs/guarantees.md#r-noise: the answer must be the whole output or its last non-empty line;
    a line after it makes every read fail: failed, ``read failed: the reader printed no JSON``,
    residue ``unknown`` (the undo ran, nobody knows whether it took: here it did)."""
    noisy = fault("noise: a log line after the answer", READER_FAULTS)
    entry = tool("w0")
    entry["verification"].update(retries=2, backoffMs=100)
    world = one_step(entry)
    report = roll_back(world, in_order([(OK, 0)], [noisy, noisy]))
    assert residue(report) == {0: "unknown"}
    assert report.failed[0].error.startswith("verification failed: read failed: the reader printed no JSON")
    assert len([j for j in world.jobs.values() if j.role == "reader"]) == 2 and world.downstream.standing[0] is False


# ------------------------------------------------------------------------------ the input


def test_a_precondition_whose_argument_is_missing_is_a_conflict_unless_forced():
    """docs/guarantees.md#result-missing: the precondition names ``$result.missing``, which the
    call's result does not have. It cannot be shown to hold, so no read and no compensator runs:
    ``conflict``, residue ``notAttempted``. Forced, the step is undone anyway."""
    entry = tool("w0")
    entry["compensation"]["precondition"] = {"tool": "get-w0", "args": {"id": "$result.missing"},
                                             "expect": {"state": "held"}}
    world = one_step(entry)
    report = roll_back(world, in_order([]))
    assert [c.step for c in report.conflict] == [0], report
    assert "precondition arguments unavailable" in report.conflict[0].reason
    assert residue(report) == {0: "notAttempted"} and world.jobs == {} and world.downstream.standing[0] is True

    world = one_step(entry, force=[{"step": 0, "actor": "alice"}])
    report = roll_back(world, in_order([(OK, 0)]))
    assert report.compensated == [0] and [f.step for f in report.forced] == [0] and calls(world) == [True]
