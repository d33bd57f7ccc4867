"""Acknowledging residue (docs/concepts.md#acknowledging-residue) on the real control plane: the
RBAC verb, the server's stamps, the Run and its last RollbackRequest reading as done (kstatus
Current) while their report stays incomplete, the gauges, withdrawal, a later rollback that undid
nothing (still covered) and one that left a new failure (not covered: describe and the
ACKNOWLEDGED-BY column say so)."""

from __future__ import annotations

import subprocess

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from reversi.engine.acknowledgement import incomplete as incomplete_run
from reversi_devcluster.build import binary
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


def _acknowledged_by(rv, cluster) -> dict[str, str]:
    """The ACKNOWLEDGED-BY column of ``kubectl get runs``, by Run (the API server's Table of the
    Runs, from the CRD's printer columns)."""
    table = subprocess.run([binary("kubernetes", "kubectl"), "--kubeconfig", str(cluster.paths.admin_kubeconfig),
                            "get", "runs", "-n", rv.ns], capture_output=True, text=True, check=True).stdout.splitlines()
    start = table[0].index("ACKNOWLEDGED-BY")
    end = table[0].index("READY", start)
    return {line.split()[0]: line[start:end].strip() for line in table[1:] if line.strip()}


def test_an_acknowledgement_covers_what_stands_until_a_later_rollback_leaves_something_new(
        rv, users, cluster, operator):
    """Run ``a`` (an email, which nothing can unsend) and run ``b`` (a charge whose refund fails)
    are acknowledged. A later rollback of ``a`` undoes nothing: what stands is unchanged and the
    acknowledgement still covers it (Ready, ACKNOWLEDGED-BY lead). A later rollback of ``b``
    fails again: that failure is new, so ``b`` is Stalled again, its ACKNOWLEDGED-BY is empty, and
    ``describe`` says the acknowledgement accepted the first request's residue, not what stands
    now (docs/concepts.md#acknowledging-residue)."""
    rv.apply_manifest()
    ns = rv.ns
    rv.run("a", [rv.step(0, "email.send", {"to": "c@example.com"}, {"id": "m-1"})])
    charge = rv.charge("o-ack")
    rv.run("b", [rv.step(0, "payments.create_charge", {"order_id": "o-ack", "amount": 700, "customer": "cus_9"},
                         charge)])
    rv.downstream.fault("/payments/refunds", "error", times=1)
    rv.request("undo-a", "a")
    rv.request("undo-b", "b", retries=1)
    rv.wait_phase("undo-a", "Incomplete")
    assert [f["step"] for f in rv.wait_phase("undo-b", "Incomplete")["status"]["report"]["failed"]] == [0]
    for run in ("a", "b"):
        proc = kr(cluster, "acknowledge", run, "--note", "dealt with by hand", namespace=ns,
                  kubeconfig=cluster.kubeconfig_for("lead"))
        assert proc.returncode == 0 and f"residue of RollbackRequest undo-{run} is acknowledged by lead" in \
            proc.stdout, proc
    # without the verb, the plugin says why in one line
    denied = one_line_error(kr(cluster, "acknowledge", "a", "--note", "x", namespace=ns,
                               kubeconfig=cluster.kubeconfig_for("oncall")))
    assert "acknowledge" in denied
    wait_for(lambda: _acknowledged_by(rv, cluster) == {"a": "lead", "b": "lead"}, what="both acknowledged by lead")

    rv.request("again-a", "a")  # takes the lock, undoes nothing: the email stays sent
    rv.wait_phase("again-a", "Incomplete")
    rv.downstream.fault("/payments/refunds", "error", times=1)
    rv.request("again-b", "b", retries=1)  # the refund fails again
    rv.wait_phase("again-b", "Incomplete")
    b = wait_for(lambda: (r := rv.get("runs", "b")) and _conditions(r).get("Stalled", ("", ""))[0] == "True" and r,
                 what="Run b stalled by the new failure")
    assert b["status"]["lastRequest"] == "again-b" and incomplete_run(b)
    assert b["status"]["standing"]["request"] == "again-b" and "acknowledgedBy" not in b["status"]["standing"]
    a = rv.get("runs", "a")
    assert a["status"]["lastRequest"] == "again-a" and a["status"]["standing"]["request"] == "undo-a"
    assert _conditions(a)["Ready"] == ("True", "ResidueAcknowledged") and not incomplete_run(a)
    wait_for(lambda: _acknowledged_by(rv, cluster) == {"a": "lead", "b": ""}, what="ACKNOWLEDGED-BY of a only")
    # only the request whose residue stands follows the acknowledgement; the run's other Incomplete requests
    # are Ready as superseded (a GitOps health check of them is green), their verdicts unchanged
    def ready(name: str) -> tuple[str, str]:
        return _conditions(rv.get("rollbackrequests", name))["Ready"]

    wait_for(lambda: ready("undo-b") == ("True", "Superseded") and ready("again-a") == ("True", "Superseded"),
             what="undo-b and again-a superseded")
    assert ready("undo-a") == ("True", "ResidueAcknowledged")
    assert ready("again-b")[0] == "False" and _conditions(rv.get("rollbackrequests", "again-b"))["Stalled"][0] == "True"
    assert rv.get("rollbackrequests", "undo-b")["status"]["phase"] == "Incomplete"
    shown_b = kr(cluster, "describe", "run/b", namespace=ns).stdout
    assert "Standing:     on Run b now: 1 failed undo(s) stand, left by RollbackRequest again-b" in shown_b, shown_b
    assert "Residue:      not acknowledged now: acknowledged by lead" in shown_b, shown_b
    assert ("accepted RollbackRequest undo-b's residue, not what stands now (RollbackRequest again-b left steps "
            "standing since)") in shown_b, shown_b
    assert "it covers what stands now" not in shown_b
    assert "kubectl reversi acknowledge b" in shown_b  # what to do next: accept it again once dealt with
    shown_a = kr(cluster, "describe", "run/a", namespace=ns).stdout
    assert "it covers what stands now (RollbackRequest undo-a's residue)" in shown_a, shown_a
    samples = scrape(operator.metrics_port)
    wait_for(lambda: value(scrape(operator.metrics_port), "reversi_incomplete_rollbacks", namespace=ns) == 1,
             what="run b counted again, run a not")
    assert value(samples, "reversi_standing_undos", namespace=ns, tool="payments.create_charge",
                 state="failed") in (None, 1)
