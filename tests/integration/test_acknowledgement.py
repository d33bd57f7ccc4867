"""Acknowledging residue (docs/concepts.md#acknowledging-residue) on the real control plane: the
RBAC verb, the server's stamps, the Run and its last RollbackRequest reading as done (kstatus
Current) while their report stays incomplete, the gauges, withdrawal, and a later rollback that
the acknowledgement does not cover."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from reversi.metrics import incomplete_run
from tests.gitops import kstatus
from tests.helpers import users_with_roles, wait_for
from tests.integration.test_metrics import scrape, value
from tests.integration.test_plugin import kr, one_line_error

pytestmark = pytest.mark.cluster
G, V = "reversi.dev", "v1alpha1"
PATCHER = [{"apiGroups": [G], "resources": ["runs", "rollbackrequests"], "verbs": ["get", "list", "patch"]}]
ACKNOWLEDGER = [*PATCHER, {"apiGroups": [G], "resources": ["runs"], "verbs": ["acknowledge"]}]


@pytest.fixture
def users(cluster, admin_api, namespace):
    """``oncall`` may patch Runs but not acknowledge them; ``lead`` holds the verb acknowledge."""
    return users_with_roles(cluster, admin_api, namespace, {"oncall": PATCHER, "lead": ACKNOWLEDGER})


def _ack(api, ns: str, run: str, ack: dict | None) -> dict:
    return client.CustomObjectsApi(api).patch_namespaced_custom_object(
        G, V, ns, "runs", run, {"spec": {"acknowledgement": ack}})


def _message(err: ApiException) -> str:
    import json
    return json.loads(err.body).get("message", "")


def _conditions(obj: dict) -> dict[str, tuple[str, str]]:
    return {x["type"]: (x["status"], x["reason"]) for x in (obj.get("status") or {}).get("conditions") or []}


def _incomplete_email_run(rv, run: str, request: str) -> dict:
    rv.run(run, [rv.step(0, "email.send", {"to": "c@example.com"}, {"id": "m-1"})])
    rv.request(request, run)
    return rv.wait_phase(request, "Incomplete")


def test_acknowledging_needs_the_verb_and_an_incomplete_rollback_and_is_stamped_by_the_server(
        rv, users, cluster, operator):
    rv.apply_manifest()
    ns = rv.ns
    stalled = _conditions(_incomplete_email_run(rv, "r", "undo"))["Stalled"]
    assert stalled[0] == "True"
    # the verb acknowledge, not patch, decides
    with pytest.raises(ApiException) as err:
        _ack(users["oncall"], ns, "r", {"note": "told the customer"})
    assert err.value.status == 403 and "needs the RBAC verb acknowledge on runs" in _message(err.value)
    # a run with nothing to acknowledge says so
    rv.run("clean", [rv.step(0, "payments.get_customer", {"id": "cus_9"}, {"id": "cus_9"})])
    with pytest.raises(ApiException) as err:
        _ack(users["lead"], ns, "clean", {"note": "nothing"})
    assert err.value.status == 409 and "has no incomplete rollback to acknowledge" in _message(err.value)
    # the server stamps who, when and which request, whatever the client says
    run = _ack(users["lead"], ns, "r", {"note": "told the customer", "actor": "mallory", "request": "other"})
    ack = run["spec"]["acknowledgement"]
    assert ack["actor"] == "lead" and ack["request"] == "undo" and ack["acknowledgedAt"]
    # the Run and its last request read as done; their record still says what stands
    wait_for(lambda: _conditions(rv.get("runs", "r")).get("Ready") == ("True", "ResidueAcknowledged"),
             what="the Run Ready with its residue acknowledged")
    req = wait_for(lambda: (r := rv.get("rollbackrequests", "undo")) and
                   _conditions(r).get("Ready") == ("True", "ResidueAcknowledged") and r,
                   what="the request Ready with its residue acknowledged")
    run = rv.get("runs", "r")
    assert _conditions(run)["Stalled"][0] == "False" and _conditions(run)["RolledBack"][0] == "False"
    assert req["status"]["phase"] == "Incomplete" and _conditions(req)["Complete"][0] == "False"
    assert _conditions(req)["Stalled"][0] == "False"
    assert not req["status"]["report"]["complete"] and req["status"]["report"]["unrecoverable"]
    assert [x["status"] for x in kstatus([run, req])] == ["Current", "Current"]
    assert not incomplete_run(run)
    wait_for(lambda: value(scrape(operator.metrics_port), "reversi_incomplete_rollbacks", namespace=ns) == 0,
             what="the acknowledged run no longer counted")
    # kubectl reversi describe says so; kubectl get runs shows who
    shown = kr(cluster, "describe", "run/r", namespace=ns)
    assert shown.returncode == 0 and "Residue:      acknowledged by lead" in shown.stdout, shown.stdout
    # a note is never stamped over by a client that sends the object back unchanged
    again = _ack(users["lead"], ns, "r", {"note": "told the customer", "actor": "mallory"})
    assert again["spec"]["acknowledgement"]["actor"] == "lead"

    # withdrawn: stalled again, both of them
    _ack(users["lead"], ns, "r", None)
    wait_for(lambda: _conditions(rv.get("runs", "r")).get("Stalled", ("", ""))[0] == "True", what="the Run stalled")
    wait_for(lambda: _conditions(rv.get("rollbackrequests", "undo")).get("Stalled") == stalled,
             what="the request stalled again, as it was")


def test_a_later_rollback_is_not_covered_by_an_earlier_acknowledgement(rv, users, cluster, operator):
    rv.apply_manifest()
    ns = rv.ns
    _incomplete_email_run(rv, "r", "undo")
    proc = kr(cluster, "acknowledge", "r", "--note", "apologised by phone", namespace=ns,
              kubeconfig=cluster.kubeconfig_for("lead"))
    assert proc.returncode == 0 and "residue of RollbackRequest undo is acknowledged by lead" in proc.stdout, proc
    wait_for(lambda: _conditions(rv.get("runs", "r")).get("Ready") == ("True", "ResidueAcknowledged"),
             what="the Run Ready")
    # without the verb, the plugin says why in one line
    denied = one_line_error(kr(cluster, "acknowledge", "r", "--note", "x", namespace=ns,
                               kubeconfig=cluster.kubeconfig_for("oncall")))
    assert "acknowledge" in denied
    rv.request("again", "r")
    rv.wait_phase("again", "Incomplete")
    run = wait_for(lambda: (r := rv.get("runs", "r")) and _conditions(r).get("Stalled", ("", ""))[0] == "True" and r,
                   what="the Run stalled by the new rollback")
    assert run["status"]["lastRequest"] == "again" and incomplete_run(run)
    wait_for(lambda: value(scrape(operator.metrics_port), "reversi_incomplete_rollbacks", namespace=ns) == 1,
             what="the run counted again")
