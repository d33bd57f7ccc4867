"""The rollback lock's probe (docs/concepts.md#admission): a dry run of the run's next step is
proof that the lock is in force only when the lock refuses it, while the rollback holds the run
and after it released it."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.rest import ApiException

from reversi.adapters import closed_runs


class Answers:
    """A stand-in for ``CustomObjectsApi.create_namespaced_custom_object`` that answers the
    probe's dry run with one refusal (or admits it), recording what it was sent."""

    def __init__(self, status: int | None, message: str = ""):
        self.status, self.message, self.sent = status, message, []

    def create_namespaced_custom_object(self, group, version, namespace, plural, body, **kwargs):
        self.sent.append((plural, body, kwargs))
        if self.status is None:
            return body
        err = ApiException(status=self.status, reason="Forbidden")
        err.body = json.dumps({"kind": "Status", "message": self.message})
        raise err


@pytest.mark.parametrize("message", [
    "admission webhook denied: Run shop/r: run is being rolled back by RollbackRequest undo-1; it takes no new steps",
    "Run shop/r: run was rolled back by RollbackRequest undo-1; it takes no new steps: record further calls "
    "in a new Run",
])
def test_the_lock_in_force_is_proven_while_the_rollback_holds_the_run_and_after(message):
    api = Answers(403, message)
    assert closed_runs.probe(api, "shop", "r", "uid-1") is True
    ((plural, body, kwargs),) = api.sent
    assert plural == "runsteps" and kwargs.get("dry_run") == "All"
    assert body["spec"]["runAtOpen"]["uid"] == "uid-1" and body["spec"]["tool"] == closed_runs.PROBE_TOOL


@pytest.mark.parametrize("status, message", [
    (None, ""),                                                                    # admitted: not in force yet
    (403, "kill switch: maintenance (Halt shop/stop refuses step 99999, reversi.dev/lock-probe)"),  # a halt
    (422, "RunStep shop/r-99999: step 99999 of Run shop/r must be named ..."),
    # a halt whose reason quotes the lock's words is not the lock, nor is another run's lock
    (403, "kill switch: until run was rolled back by RollbackRequest x (Halt shop/stop refuses step 99999)"),
    (403, "Run shop/other: run was rolled back by RollbackRequest x; it takes no new steps"),
])
def test_any_other_answer_is_no_proof(status, message):
    assert closed_runs.probe(Answers(status, message), "shop", "r", "uid-1") is False


def test_a_runs_slice_is_a_stable_hash_of_its_name_among_sixteen():
    """A run's ClosedRunSlice is found from its name alone, the same in every process and version
    (docs/operations.md#the-locks-param-closedrunslices), and names spread over every slice."""
    import zlib

    from reversi.models.closedrunslice import SLICES

    assert closed_runs.slice_name("order-4711") == f"reversi-closed-runs-{zlib.crc32(b'order-4711') % 16:02d}"
    names = {closed_runs.slice_name(f"run-{i}") for i in range(2000)}
    assert names == {f"reversi-closed-runs-{n:02d}" for n in range(SLICES)}
    assert closed_runs.entry("u-1", "undo") == "u-1 undo" and closed_runs.entry("u-1", "undo", ended=True) == \
        "u-1 undo ended"
