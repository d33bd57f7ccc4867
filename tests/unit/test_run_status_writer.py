"""The Run status writer (reversi.handlers.runs.RunStatusWriter) on the operator's work queue: a
burst of events on one Run makes one status write, once the Run has been quiet for
run_status_quiet_seconds, from the newest body; nothing is written while the operator may not
reconcile (docs/operations.md#upgrading: older CRDs would prune what it writes). And the Run
handler reaches it the way the operator's handlers reach every part: through kopf's memo."""

from __future__ import annotations

import copy
import threading
import time

import kopf
import pytest

from reversi import schema
from reversi.handlers import runs, runtime
from reversi.handlers.runs import RunStatusWriter
from reversi.settings import OperatorSettings
from tests.helpers import wait_for


class FakeKube:
    """Records the status writes (no API server: the write's rules are in adapters.status)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.writes: list[tuple[str, str, int, str, float]] = []

    def merge_status(self, plural, namespace, name, update, resource_version=None):
        with self.lock:
            self.writes.append((namespace, name, update["observedGeneration"], resource_version, time.monotonic()))

    def get(self, plural, namespace, name):
        return None

    custom = None  # the run informers' client: not used here


def body(generation: int) -> dict:
    return {"metadata": {"generation": generation, "resourceVersion": f"rv{generation}", "annotations": {}},
            "spec": {}, "status": {"observedGeneration": None, "lastRequest": None, "conditions": []}}


def wait_until(predicate, timeout: float = 10.0) -> None:
    wait_for(predicate, timeout=timeout, interval=0.005)


@pytest.fixture
def writers():
    made: list[RunStatusWriter] = []
    yield made
    for writer in made:
        writer.stop()


def test_run_status_writes_wait_for_a_quiet_run_and_take_the_last_body(writers):
    kube = FakeKube()
    writer = RunStatusWriter(kube, 0.2, reconciling=lambda: True)  # type: ignore[arg-type]
    writers.append(writer)
    for generation in range(1, 6):
        writer.changed("shop", "r", body(generation))
    last = time.monotonic()
    writer.changed("shop", "other", body(1))
    wait_until(lambda: len(kube.writes) == 2)
    assert [w[:4] for w in kube.writes] == [("shop", "r", 5, "rv5"), ("shop", "other", 1, "rv1")]
    assert kube.writes[0][4] - last >= 0.19, "written before the Run was quiet"
    assert writer.queue.keys() == set()


def test_nothing_is_written_while_the_operator_may_not_reconcile(writers):
    kube = FakeKube()
    allowed = threading.Event()
    writer = RunStatusWriter(kube, 0.0, reconciling=allowed.is_set)  # type: ignore[arg-type]
    writers.append(writer)
    writer.changed("shop", "r", body(1))
    wait_until(lambda: not writer.queue.keys())  # its pass ran, and wrote nothing
    assert kube.writes == []
    allowed.set()
    writer.changed("shop", "r", body(2))  # the Run's next event (or the resync when the CRDs are current)
    wait_until(lambda: len(kube.writes) == 1)
    assert kube.writes[0][:3] == ("shop", "r", 2)


class FakeMetrics:
    def __init__(self) -> None:
        self.observed: list[tuple[str, str]] = []

    def run_observed(self, namespace, name, body):
        self.observed.append((namespace, name))


def test_the_run_handler_takes_the_writer_from_the_memo_the_start_up_handler_filled(writers):
    """As in reversi-operator: the start-up handler puts the parts on the operator's memo; kopf
    gives each resource a shallow copy of it (kopf docs, memos: "In-memory containers"), so a
    verdict recorded on the parts later (the schema check) is seen through every copy."""
    kube, metrics = FakeKube(), FakeMetrics()
    memo = kopf.Memo({runtime.SETTINGS_KEY: OperatorSettings(run_status_quiet_seconds=0.05)})
    ours = runtime.settings_of(memo)

    def operating(parts: runtime.Parts) -> runtime.Operating:
        writer = RunStatusWriter(parts.kube, ours.run_status_quiet_seconds, parts.reconciling)
        writers.append(writer)
        return runtime.Operating(None, None, writer)  # type: ignore[arg-type]  # no request is reconciled here

    memo[runtime.MEMO_KEY] = runtime.build(ours, kube, metrics, operating=operating)  # type: ignore[arg-type]
    run_memo = copy.copy(memo)  # what kopf hands the handlers of one Run
    runs.run_changed(runtime.parts(run_memo), "ADDED", body(1), "shop", "r")
    assert not runtime.parts(run_memo).operating().run_status.queue.keys()
    runtime.parts(memo).schema = schema.SchemaCheck(installed={}, wanted=0, problems=())  # the CRDs are current
    runs.run_changed(runtime.parts(run_memo), "MODIFIED", body(2), "shop", "r")
    wait_until(lambda: len(kube.writes) == 1)
    assert kube.writes[0][:3] == ("shop", "r", 2)


def test_a_handler_before_the_start_up_handler_is_told_so():
    with pytest.raises(RuntimeError, match="start-up handler"):
        runtime.parts(kopf.Memo())
    assert runtime.settings_of(kopf.Memo()) == OperatorSettings()
