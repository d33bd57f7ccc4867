"""``kubectl reversi check``'s judges (docs/operations.md#checking-an-install): what each reading means, one
line per problem that says what to do."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client.rest import ApiException

from reversi.adapters.policies import recording_policies
from reversi.cli import check

NOW = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.UTC)


def api_error(status: int, message: str) -> ApiException:
    err = ApiException(status=status, reason="x")
    err.body = json.dumps({"kind": "Status", "message": message, "code": status})
    return err


@pytest.mark.parametrize(("version", "status"), [
    ("v1.36.3", "ok"), ("v1.37.0-alpha.1", "ok"), ("v2.0.0", "ok"), ("v1.35.9", "problem"), ("v1.29.0+k3s1", "problem"),
    ("", "problem"), ("banana", "problem")])
def test_the_kubernetes_version_is_136_or_newer(version, status):
    found = check.judge_version(version)
    assert found.status == status
    if status == "problem":
        assert "1.36" in found.line


@given(st.integers(0, 3), st.integers(0, 60))
def test_a_version_is_judged_by_its_minor_as_a_number_not_as_text(major, minor):
    assert (check.judge_version(f"v{major}.{minor}.0").status == "ok") == ((major, minor) >= check.MIN_KUBERNETES)


def test_every_needed_api_is_named_when_it_is_not_served():
    served = {api: set(plurals) for api, plurals in check.NEEDED_APIS.items()}
    assert all(f.status == "ok" for f in check.judge_apis(served))
    served[check.ADMISSION_API] -= {"mutatingadmissionpolicies"}
    del served["coordination.k8s.io/v1"]
    problems = [f.line for f in check.judge_apis(served) if f.status == "problem"]
    assert len(problems) == 2
    assert "mutatingadmissionpolicies" in problems[0] and "leases" in problems[1]


def test_missing_rights_are_one_line_naming_each_and_who_to_ask():
    assert check.judge_rights([], "alice", "reversi-system").status == "ok"
    found = check.judge_rights(["create clusterroles.rbac.authorization.k8s.io", "create secrets"], "bob", "rs")
    assert found.status == "problem" and "\n" not in found.line
    assert "bob may not create clusterroles" in found.line and "create secrets" in found.line
    assert "cluster admin" in found.line


def lease(holder: str | None, renewed_ago: float, duration: int = 15) -> dict:
    renew = (NOW - dt.timedelta(seconds=renewed_ago)).isoformat().replace("+00:00", "Z")
    return {"spec": {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": duration}}


def test_the_operators_lease_is_held_and_renewed_within_its_duration():
    assert check.judge_lease(lease("reversi-abc", 3), "reversi-operator", "rs", NOW).status == "ok"
    stale = check.judge_lease(lease("reversi-abc", 40), "reversi-operator", "rs", NOW)
    assert stale.status == "problem" and "40 s ago" in stale.line and "no rollback advances" in stale.line
    assert check.judge_lease(lease(None, 1), "reversi-operator", "rs", NOW).status == "problem"
    assert "does not exist" in check.judge_lease(None, "reversi-operator", "rs", NOW).line


def test_a_deployment_with_no_ready_replica_is_a_problem_with_its_fix():
    ready = {"spec": {"replicas": 2}, "status": {"readyReplicas": 2}}
    assert check.judge_deployment(ready, "reversi-admission", "rs", "admission", "scale it").status == "ok"
    scaled_to_zero = {"spec": {"replicas": 0}, "status": {}}
    found = check.judge_deployment(scaled_to_zero, "reversi-admission", "rs", "admission", "scale it up")
    assert found.status == "problem" and found.line == "Deployment rs/reversi-admission has 0 of 0 replicas ready: " \
                                                       "scale it up"
    assert check.judge_deployment(None, "x", "rs", "operator", "f").status == "problem"


def test_the_webhooks_answer_unless_the_api_server_could_not_call_them_or_called_none():
    judged = {"spec": {"runRef": {"name": check.PROBE_NAME}}}  # the mutating webhook removed the claim
    assert check.judge_webhook_probe(None, judged, "reversi", "rs").status == "ok"
    assert check.judge_webhook_probe(api_error(400, "admission webhook denied: no such Run"), None, "reversi",
                                     "rs").status == "ok"
    down = check.judge_webhook_probe(api_error(500, 'Internal error occurred: failed calling webhook '
                                                    '"rollbackrequest.validate.reversi.dev": no endpoints available'),
                                     None, "reversi", "rs")
    assert down.status == "problem" and "scale deployment reversi-admission" in down.line and "\n" not in down.line
    assert check.judge_webhook_probe(api_error(403, "forbidden: cannot create"), None, "reversi", "rs").status == "note"
    unjudged = {"spec": {"runRef": {"name": check.PROBE_NAME}, "approvedBy": check.PROBE_NAME}}
    none_called = check.judge_webhook_probe(None, unjudged, "reversi", "rs")
    assert none_called.status == "problem" and "no admission webhook was called" in none_called.line


def test_the_policies_present_bound_and_the_lock_selecting_its_params():
    expected = [p["metadata"]["name"] for p in recording_policies("reversi") if not p["kind"].endswith("Binding")]
    lock = {"metadata": {"name": "reversi-runstep-lock"}, "spec": {"paramRef": {"selector": {}}}}
    found = check.judge_policies(expected, expected, expected, lock, "reversi-runstep-lock")
    assert [f.status for f in found] == ["ok", "ok"]
    found = check.judge_policies(expected[1:], expected[2:], expected, {"spec": {}}, "reversi-runstep-lock")
    assert [f.status for f in found] == ["problem", "problem"]
    assert f"missing {expected[0]}" in found[0].line and f"not bound: {expected[1]}" in found[0].line


def test_the_policy_probe_passes_only_when_the_policy_refused_it():
    assert check.judge_policy_probe(None, "must be named").status == "problem"
    refused = api_error(422, "ValidatingAdmissionPolicy 'reversi-runstep-record' denied request: ... must be named x")
    assert check.judge_policy_probe(refused, "must be named").status == "ok"
    other = check.judge_policy_probe(api_error(422, "spec.index: Invalid value"), "must be named")
    assert other.status == "problem" and "another reason" in other.line


def test_the_metrics_service_needs_a_ready_endpoint_and_a_missing_monitor_is_a_note():
    assert [f.status for f in check.judge_metrics(2, "reversi-operator", "rs", "present")] == ["ok"]
    assert [f.status for f in check.judge_metrics(0, "reversi-operator", "rs", "absent")] == ["problem", "note"]
    assert [f.status for f in check.judge_metrics(None, "reversi-operator", "rs", "no-crd")] == ["problem", "note"]


def test_the_rendering_is_one_line_per_finding_and_a_summary():
    findings = [check.ok("a", "fine"), check.problem("b", "broken: fix it"), check.Finding("c", "note", "fyi")]
    assert check.render(findings).splitlines() == ["✔ fine", "✗ broken: fix it", "• fyi", "1 problem found"]
    assert not check.passed(findings) and check.passed(findings[::2])
    assert not check.passed(findings[2:]), "notes alone prove nothing"
    assert check.render(findings[2:]).splitlines()[-1] == "nothing could be checked (see the notes)"
    assert check.render(findings[:1]).splitlines()[-1] == "all checks passed"
    assert check.as_dicts(findings[:1]) == [{"check": "a", "status": "ok", "message": "fine"}]


def test_the_policies_checked_include_the_outcome_writes_own():
    names = check.policy_names("reversi")
    assert names[0] == "reversi-runstep-outcome" and "reversi-runstep-lock" in names and len(names) == len(set(names))
