"""The SDK's boundary pieces that need no API server: results, settlements, refusals (recovery in code)."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.rest import ApiException

from reversi import sdk
from reversi.models.toolmanifest import ToolSpec


def _api_error(message: str, status: int = 403) -> ApiException:
    err = ApiException(status=status, reason="Forbidden")
    err.body = json.dumps({"message": message, "reason": "Forbidden"})
    return err


@pytest.mark.parametrize("message", [
    'admission webhook "x" denied the request: Run shop/r: run is being rolled back by RollbackRequest r-undo-x2; '
    "it takes no new steps",
    'admission webhook "x" denied the request: Run shop/r: run was rolled back by RollbackRequest r-undo-x2; it',
])
def test_a_closed_run_is_refused_as_run_closed_naming_the_request(message):
    refused = sdk._refusal(_api_error(message), "recording t")
    assert isinstance(refused, sdk.RunClosed) and isinstance(refused, sdk.RecordingRefused)
    assert refused.request == "r-undo-x2"


def test_recovery_required_knows_what_cannot_be_undone():
    write = ToolSpec.model_validate({"name": "p.charge", "effect": "write", "compensation": {
        "tool": "p.refund", "kind": "compensation", "args": {}, "runner": "r"}})
    assert sdk._undoable(write)
    assert sdk._undoable(ToolSpec.model_validate({"name": "p.get", "effect": "read"}))
    assert not sdk._undoable(ToolSpec.model_validate({"name": "e.send", "effect": "irreversible"}))
    assert not sdk._undoable(None)  # unmanifested: nothing says how to undo it
    with pytest.raises(ValueError):
        sdk.Recorder(None, "ns", "r", recovery="maybe")  # type: ignore[arg-type]


def test_a_rollback_result_is_complete_only_when_succeeded_and_complete():
    status = {"phase": "Incomplete", "report": {"complete": False, "failed": [{"step": 2, "error": "500"}],
                                                "residue": [{"step": 1, "residue": ["statement line"]}]},
              "conditions": [{"type": "Complete", "message": "1 failed"}]}
    result = sdk.RollbackResult.of("shop", "r", "r-undo-1", status)
    assert not result.complete and result.failed == [{"step": 2, "error": "500"}]
    err = sdk.RollbackIncomplete(result)
    assert err.request == "r-undo-1" and err.residue[0]["step"] == 1
    assert "step 2: 500" in str(err)
    done = sdk.RollbackResult.of("shop", "r", "r-undo-1", {"phase": "Succeeded", "report": {"complete": True}})
    assert done.complete
    late = sdk.RollbackResult.of("shop", "r", "r-undo-1", {"phase": "Running"}, timed_out=True)
    assert not late.complete and "did not finish in time" in late.describe()


def test_a_settlement_is_succeeded_or_failed():
    assert sdk.Settlement("succeeded", {"id": "x"}).result == {"id": "x"}
    with pytest.raises(ValueError):
        sdk.Settlement("maybe")


def test_a_write_no_admission_replica_answered_says_so_not_only_the_servers_words():
    message = ('Internal error occurred: failed calling webhook "runstep.mutate.reversi.dev": failed to call '
               'webhook: Post "https://reversi.reversi-system.svc:443/mutate-runstep": net/http: TLS handshake timeout')
    refused = sdk._refusal(_api_error(message, status=500), "recording t")
    assert type(refused) is sdk.RecordingRefused and refused.reason == "AdmissionUnreachable"
    assert "admission server is unreachable" in refused.message and "TLS handshake timeout" in refused.message
