"""The pure pieces of handlers/reconciler.py: the plan cache key, the readers a manifest gives,
the timing of attempts, and who waits for a Run's lock (no API: these touch none)."""

from __future__ import annotations

from reversi.engine import executor as ex
from reversi.handlers.reconciler import PassMemory, Reconciler, _plan_key, current_readers, run_gone
from reversi.models.run import StepUndo
from reversi.models.toolmanifest import ToolManifestSpec
from reversi.settings import OperatorSettings

RUN = {"metadata": {"resourceVersion": "41"}}
REQ = {"status": {"runSteps": 3}}


def key(memory: PassMemory, run=RUN, req=REQ, started=100.0, runners=frozenset({"cli"}), readers=None, known=True):
    return _plan_key(run, req, memory, started, set(runners), readers or {}, known)


def test_the_plan_is_never_cached_without_an_informer():
    assert key(PassMemory()) is None  # journal read by a LIST: no version to compare


def test_the_plan_key_changes_with_everything_the_plan_is_built_from():
    memory = PassMemory(journal_version=7)
    base = key(memory)
    assert base is not None and key(PassMemory(journal_version=7)) == base
    assert key(PassMemory(journal_version=8)) != base
    assert key(memory, run={"metadata": {"resourceVersion": "42"}}) != base
    assert key(memory, req={"status": {"runSteps": 4}}) != base
    assert key(memory, started=101.0) != base
    assert key(memory, runners={"cli", "other"}) != base
    assert key(memory, readers={"get": "cli"}) != base
    assert key(memory, known=False) != base
    written = PassMemory(journal_version=7, written={1: StepUndo(step=1, state="compensating", attempts=1,
                                                             idempotency_key="a" * 64)})
    assert key(written) != base  # undo this process wrote that the watch has not brought back yet


def test_current_readers_are_the_read_back_tools_with_a_reader_runner():
    manifest = ToolManifestSpec.model_validate({
        "runners": [{"name": "cli", "image": "x:1", "command": ["x"]}],
        "tools": [
            {"name": "a", "effect": "write", "compensation": {"tool": "undo-a", "kind": "inverse", "runner": "cli"},
             "verification": {"tool": "get-a", "expect": {}, "runner": "cli"}},
            {"name": "b", "effect": "write", "compensation": {"tool": "undo-b", "kind": "inverse", "runner": "cli"},
             "verification": {"tool": "get-b", "expect": {}}},  # no reader runner,
            {"name": "c", "effect": "read"}]})
    assert current_readers(manifest) == {"get-a": "cli"}
    assert current_readers(None) == {}


def test_a_run_not_locked_yet_is_never_gone():
    assert run_gone({}, None) is None
    assert run_gone({"runSteps": 2}, {"status": {"closedBy": "undo"}}) is None


class Metrics:
    def __init__(self):
        self.seen: list[tuple[str, str, float]] = []

    def observe_compensation(self, ns, tool, seconds):
        self.seen.append(("compensation", tool, seconds))

    def observe_verification(self, ns, tool, seconds):
        self.seen.append(("verification", tool, seconds))


def test_attempts_and_read_backs_are_timed_from_the_moves_of_a_pass():
    metrics = Metrics()
    rec = Reconciler(None, OperatorSettings(), metrics)  # type: ignore[arg-type]  # no API used
    memory = PassMemory()
    pending, compensating = ex.StepRun(2), ex.StepRun(2, stage="compensating", attempts=1)
    verifying = ex.StepRun(2, stage="verifying", attempts=1, reads=1)
    done = ex.StepRun(2, stage="compensated", attempts=1, verification="verified")
    rec._durations("ns", "w", pending, compensating, memory, now=10.0)
    rec._durations("ns", "w", compensating, compensating, memory, now=12.0)  # still running: nothing
    rec._durations("ns", "w", compensating, verifying, memory, now=13.5, first_read=True)
    rec._durations("ns", "w", verifying, done, memory, now=14.0)
    assert metrics.seen == [("compensation", "w", 3.5), ("verification", "w", 0.5)]
    assert memory.since == {}


def test_every_read_back_is_timed_when_the_hand_over_to_it_was_not_written():
    """The request's status is not written when a compensator hands over to its first read-back,
    so the pass that sees the verdict rebuilds the step from ``compensating``: each of 7 undos
    read back is still one observation (the histogram counted 3 of 7 when only a pass that
    started from ``verifying`` was timed)."""
    from prometheus_client import CollectorRegistry

    from reversi.metrics import Metrics as Real

    metrics = Real(CollectorRegistry())
    rec = Reconciler(None, OperatorSettings(), metrics)  # type: ignore[arg-type]  # no API used
    memory = PassMemory()
    for s in range(7):
        pending, compensating = ex.StepRun(s), ex.StepRun(s, stage="compensating", attempts=1)
        verifying = ex.StepRun(s, stage="verifying", attempts=1, reads=1)
        done = ex.StepRun(s, stage="compensated", attempts=1, verification="verified")
        rec._durations("ns", "w", pending, compensating, memory, now=10.0 * s)
        rec._durations("ns", "w", compensating, verifying, memory, now=10.0 * s + 1, first_read=True)
        if s % 2:  # a pass rebuilt from the older status still shows it handed over, its reader running
            rec._durations("ns", "w", compensating, verifying, memory, now=10.0 * s + 2)
        rec._durations("ns", "w", compensating, done, memory, now=10.0 * s + 3)  # rebuilt: from compensating
    count = metrics.registry.get_sample_value("reversi_verification_duration_seconds_count",
                                              {"namespace": "ns", "tool": "w"})
    total = metrics.registry.get_sample_value("reversi_verification_duration_seconds_sum",
                                              {"namespace": "ns", "tool": "w"})
    assert (count, total) == (7, 14.0)
    assert memory.since == {}


def test_a_read_back_of_an_earlier_undo_is_timed_and_a_failed_compensation_is_not_a_verification():
    metrics = Metrics()
    rec = Reconciler(None, OperatorSettings(), metrics)  # type: ignore[arg-type]  # no API used
    memory = PassMemory()
    before = ex.StepRun(4, stage="verifying", attempts=1, reads=1)  # rule 5: an earlier request's undo
    rec._durations("ns", "w", before, before, memory, now=1.0, first_read=True)
    rec._durations("ns", "w", before, ex.StepRun(4, stage="rereading", attempts=1, reads=1), memory, now=2.0)
    rec._durations("ns", "w", ex.StepRun(4, stage="verifying", attempts=1, reads=2),
                   ex.StepRun(4, stage="failed", attempts=1, verification="verificationFailed"), memory, now=5.0)
    compensating = ex.StepRun(5, stage="compensating", attempts=1)
    rec._durations("ns", "w", ex.StepRun(5), compensating, memory, now=1.0)
    rec._durations("ns", "w", compensating, ex.StepRun(5, stage="failed", attempts=1), memory, now=3.0)
    assert metrics.seen == [("verification", "w", 4.0), ("compensation", "w", 2.0)]
    assert memory.since == {}


def test_requests_waiting_for_a_runs_lock_are_woken_once():
    rec = Reconciler(None, OperatorSettings())  # type: ignore[arg-type]
    rec._wait_for_lock("ns", "r", "b")
    rec._wait_for_lock("ns", "r", "a")
    assert rec.lock_released("ns", "r") == ["a", "b"]
    assert rec.lock_released("ns", "r") == []
    rec._wait_for_run("ns", "r", "x", True)
    assert rec.waiting_for("ns", "r") == ["x"]
    rec._wait_for_run("ns", "r", "x", False)
    assert rec.waiting_for("ns", "r") == []
