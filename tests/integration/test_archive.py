"""The archive before deletion (docs/operations.md#the-archive) against a real PostgreSQL server the
tests start (tests/postgres.py) and the real control plane: an expired Run's record is written,
then the Run deleted; it reads back as ``describe`` showed it; a database that is down, refuses
the password or has a full disk delays the deletion and says so (a Run condition, an Event, a
metric) and loses nothing; a retry after a crash between the commit and the delete writes
nothing twice. A Run deleted by hand (``kubectl delete run``) is archived before it goes, and waits
while the database is down (docs/operations.md#a-run-deleted-by-hand); with the archive turned off,
the finalizer is taken off again.

The integration tests' operator is stopped for this module, and one with the archive on (the
same ports) runs in its place."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import pytest
import yaml
from kubernetes import client

from reversi.adapters.archive import Archive
from reversi.cli import views
from reversi.engine import archive as records
from reversi.engine.archive import FINALIZER
from reversi.engine.retention import NAMESPACE_ANNOTATION
from reversi_devcluster.build import binary
from reversi_devcluster.localop import OperatorProcess, remove_webhook_configurations
from tests.helpers import wait_for
from tests.integration.conftest import RV
from tests.integration.test_metrics import scrape, value
from tests.integration.test_retention import _exists, _gone
from tests.postgres import PASSWORD, Postgres

pytestmark = pytest.mark.cluster
NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
PORT = int(os.environ.get("REVERSI_TEST_METRICS_PORT", "18089"))


@pytest.fixture(scope="module")
def postgres():
    server = Postgres()
    server.init()
    yield server
    server.destroy()


@pytest.fixture(scope="module")
def archiving(cluster, crds, admin_api, operator, postgres):
    """The operator with the archive on, in place of the integration tests' one (stopped, with
    its webhook configurations, and started again afterwards)."""
    operator.stop()
    remove_webhook_configurations(admin_api)
    os.environ["REVERSI_ARCHIVE_DSN"] = postgres.dsn()
    os.environ["REVERSI_ARCHIVE_ENABLED"] = "true"  # the admission server's (it creates Runs with the finalizer)
    try:
        op = OperatorProcess(cluster.paths.admin_kubeconfig, cluster.paths.logs / "operator-archive.log",
                             metrics_port=PORT, webhook_port=operator.webhook_port, admission_metrics_port=PORT + 1)
        op.start()
    finally:
        del os.environ["REVERSI_ARCHIVE_DSN"], os.environ["REVERSI_ARCHIVE_ENABLED"]
    try:
        yield op
    finally:
        op.stop()
        remove_webhook_configurations(admin_api)
        operator.start()


@pytest.fixture
def arv(admin_api, namespace, downstream, archiving):
    """Helpers in the test's namespace, whose Runs expire 2 s after their last activity."""
    client.CoreV1Api(admin_api).patch_namespace(namespace, {"metadata": {"annotations": {NAMESPACE_ANNOTATION: "2"}}})
    rv = RV(admin_api, namespace, downstream)
    rv.apply_manifest()
    return rv


def _quiet(rv: RV, name: str, steps: int = 2) -> dict:
    return rv.run(name, [rv.step(i, "payments.get_customer", {"id": f"c{i}"}, {"id": f"c{i}"}) for i in range(steps)])


def _archived(postgres: Postgres, uid: str) -> dict[str, int]:
    rows = postgres.sql(f"SELECT writes, (SELECT count(*) FROM reversi_runs WHERE uid = '{uid}'), "
                        f"(SELECT count(*) FROM reversi_steps WHERE run_uid = '{uid}') FROM reversi_runs "
                        f"WHERE uid = '{uid}'", database="reversi")
    if not rows:
        return {}
    writes, runs, steps = (int(x) for x in rows.split("|"))
    return {"writes": writes, "runs": runs, "steps": steps}


def _archived_condition(rv: RV, run: str) -> dict | None:
    run_obj = rv.get("runs", run)
    return next((c for c in (run_obj.get("status") or {}).get("conditions") or [] if c["type"] == "Archived"), None)


def _failure_events(rv: RV, run: str) -> list:
    return [e for e in client.CoreV1Api(rv.api).list_namespaced_event(rv.ns).items
            if e.involved_object.name == run and e.reason == "ArchiveFailed"]


def test_an_expired_run_is_archived_then_deleted_and_reads_back_as_describe_showed_it(arv, postgres):
    rv = arv
    charge = rv.charge("o-arch-1")
    rv.run("held", [rv.step(0, "payments.create_charge", {"order_id": "o-arch-1", "amount": 700, "customer": "cus_9"},
                            charge),
                    rv.step(1, "payments.capture", {"charge_id": charge["id"]}, {"id": "cap_1"}, depends_on=[0])])
    rv.request("undo", "held")
    rv.wait_phase("undo", "AwaitingApproval")
    rv.patch("rollbackrequests", "undo", {"spec": {"denials": [{"step": 1, "note": "the customer wants it"}]}})
    rv.wait_phase("undo", "Incomplete")
    assert _exists(rv, "runs", "held")
    rv.patch("runs", "held", {"spec": {"acknowledgement": {"note": "the customer keeps the capture"}}})
    request = wait_for(lambda: (r := rv.get("rollbackrequests", "undo")) and any(
        c["type"] == "Ready" and c["reason"] == "ResidueAcknowledged" for c in r["status"]["conditions"]) and r,
        what="the request Ready with its residue acknowledged")
    run = rv.get("runs", "held")
    shown = views.describe_request(request, run, [], NOW)
    _gone(rv, "held")
    archived = Archive(postgres.dsn()).record(run["metadata"]["uid"])
    assert archived is not None and [s["spec"]["index"] for s in archived.steps] == [0, 1]
    assert len(archived.requests) == 1 and views.describe_request(archived.requests[0], archived.run, [], NOW) == shown
    who = {(a.action, a.step) : a.actor for a in archived.actions}
    assert who[("denied", 1)] == "reversi-admin" and who[("acknowledged", None)] == "reversi-admin"
    assert who[("recorded", 0)] == "reversi-admin"
    assert _archived(postgres, run["metadata"]["uid"]) == {"writes": 1, "runs": 1, "steps": 2}
    # kubectl reversi archive: found by principal and tool, shown with its report
    cli = [sys.executable, "-m", "reversi.entrypoints.plugin", "archive"]
    env = {**os.environ, "REVERSI_ARCHIVE_DSN": postgres.dsn()}
    listed = subprocess.run([*cli, "list", "-n", rv.ns, "--principal", "reversi-admin", "--tool", "payments.capture"],
                            capture_output=True, text=True, env=env, check=True).stdout
    assert "held" in listed and run["metadata"]["uid"] in listed
    none = subprocess.run([*cli, "list", "-n", rv.ns, "--tool", "email.send"], capture_output=True, text=True,
                          env=env, check=True)
    assert "held" not in none.stdout and "no archived Run matches" in none.stderr
    show = subprocess.run([*cli, "show", "held", "-n", rv.ns], capture_output=True, text=True, env=env,
                          check=True).stdout
    assert "--- RollbackRequest undo ---" in show and "denied step 1 (undo): the customer wants it" in show
    assert PASSWORD not in show + listed
    as_json = json.loads(subprocess.run([*cli, "list", "-n", rv.ns, "--run", "held", "-o", "json"], capture_output=True,
                                        text=True, env=env, check=True).stdout)
    assert [(r["name"], r["uid"], r["writes"]) for r in as_json["runs"]] == [("held", run["metadata"]["uid"], 1)]
    as_yaml = yaml.safe_load(subprocess.run([*cli, "show", "held", "-n", rv.ns, "-o", "yaml"], capture_output=True,
                                            text=True, env=env, check=True).stdout)
    assert as_yaml["run"]["metadata"]["uid"] == run["metadata"]["uid"] and len(as_yaml["requests"]) == 1
    assert [(a["step"], a["actor"]) for a in as_yaml["actions"] if a["action"] == "denied"] == [(1, "reversi-admin")]
    named = subprocess.run([*cli, "show", "held", "-n", rv.ns, "-o", "name"], capture_output=True, text=True, env=env,
                           check=True).stdout
    assert named == "run.reversi.dev/held\n"


def test_a_database_that_is_down_delays_the_delete_says_so_and_loses_nothing(arv, postgres):
    rv = arv
    postgres.stop()
    try:
        uid = _quiet(rv, "patient")["metadata"]["uid"]
        found = wait_for(lambda: _archived_condition(rv, "patient"), timeout=30, what="the Archived condition")
        assert found["status"] == "False" and found["reason"] == "ArchiveFailed"
        assert "(unreachable)" in found["message"] and PASSWORD not in found["message"]
        event = wait_for(lambda: _failure_events(rv, "patient"), what="a Warning Event ArchiveFailed")[0]
        assert event.type == "Warning"
        assert value(scrape(PORT), "reversi_archive_failures_total", namespace=rv.ns, reason="unreachable") >= 1
        assert _exists(rv, "runs", "patient") and len(rv.steps("patient")) == 2
    finally:
        postgres.start()
    _gone(rv, "patient", timeout=60)
    assert _archived(postgres, uid) == {"writes": 1, "runs": 1, "steps": 2}


def test_a_wrong_password_delays_the_delete_and_says_so_without_the_password(arv, postgres):
    rv = arv
    postgres.sql("ALTER ROLE reversi PASSWORD 'rotated-elsewhere'")
    postgres.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'reversi'")
    try:
        uid = _quiet(rv, "locked-out")["metadata"]["uid"]
        found = wait_for(lambda: (c := _archived_condition(rv, "locked-out")) and "(auth)" in c["message"] and c,
                         timeout=30, what="the Archived condition saying the password was refused")
        assert "password authentication failed" in found["message"]
        assert PASSWORD not in found["message"]
        assert _exists(rv, "runs", "locked-out")
    finally:
        postgres.sql(f"ALTER ROLE reversi PASSWORD '{PASSWORD}'")
    _gone(rv, "locked-out", timeout=60)
    assert _archived(postgres, uid)["runs"] == 1


def test_a_full_disk_delays_the_delete_and_says_so(arv, postgres):
    rv = arv
    postgres.sql("CREATE TABLE filler (b bytea)", database="reversi")
    try:
        with pytest.raises(subprocess.CalledProcessError):  # fill the tablespace's tmpfs for real
            for _ in range(64):
                postgres.sql("INSERT INTO filler SELECT decode(string_agg(md5(random()::text), ''), 'hex') "
                             "FROM generate_series(1, 32768)", database="reversi")
        uid = _quiet(rv, "no-room", steps=20)["metadata"]["uid"]
        found = wait_for(lambda: _archived_condition(rv, "no-room"), timeout=30, what="the Archived condition")
        assert "(disk_full)" in found["message"], found["message"]
        assert _exists(rv, "runs", "no-room")
    finally:
        postgres.sql("DROP TABLE filler", database="reversi")
    _gone(rv, "no-room", timeout=60)
    assert _archived(postgres, uid) == {"writes": 1, "runs": 1, "steps": 20}


def test_a_retry_after_a_crash_between_commit_and_delete_writes_nothing_twice(arv, postgres):
    rv = arv
    body = {"apiVersion": "reversi.dev/v1alpha1", "kind": "Run", "metadata": {"name": "twice"},
            "spec": {"scope": {"actor": "test-agent"}, "manifestRef": {"name": "payments"},
                     "retention": {"keep": "Forever"}}}
    rv.create("runs", body)
    for i in range(3):
        rv.create("runsteps", {"apiVersion": "reversi.dev/v1alpha1", "kind": "RunStep",
                               "metadata": {"name": f"twice-{i:05d}", "labels": {"reversi.dev/run": "twice"}},
                               "spec": {"runRef": {"name": "twice"},
                                        **rv.step(i, "payments.get_customer", {"id": "c"}, {"id": "c"})}})
    run = rv.get("runs", "twice")
    # what an operator committed before it was killed, the Run not deleted yet
    Archive(postgres.dsn()).write(records.record(run, rv.steps("twice"), [], "expired", None))
    rv.patch("runs", "twice", {"spec": {"retention": {"keep": None, "ttlSeconds": 1}}})
    _gone(rv, "twice")
    assert _archived(postgres, run["metadata"]["uid"]) == {"writes": 2, "runs": 1, "steps": 3}
    assert postgres.sql(f"SELECT count(*) FROM reversi_actions WHERE run_uid = '{run['metadata']['uid']}'",
                        database="reversi") == "3", "who did what: once per step, not twice"


# ------------------------------------------------------------------------ a Run deleted by hand

def _keep_forever(rv: RV) -> None:
    """Retention keeps the namespace's Runs: only a person deletes them here."""
    client.CoreV1Api(rv.api).patch_namespace(rv.ns, {"metadata": {"annotations": {NAMESPACE_ANNOTATION: "Forever"}}})


def _finalizers(rv: RV, run: str) -> list[str]:
    return list(rv.get("runs", run)["metadata"].get("finalizers") or [])


def _kubectl_delete(cluster, rv: RV, run: str, *wait: str) -> subprocess.CompletedProcess:
    """``kubectl delete run`` as a person types it (a background delete, kubectl's default)."""
    return subprocess.run([binary("kubernetes", "kubectl"), "--kubeconfig", str(cluster.paths.admin_kubeconfig),
                           "delete", "run", run, "-n", rv.ns, *wait], capture_output=True, text=True, check=True,
                          timeout=120)


def _deleted_reason(postgres: Postgres, uid: str) -> str:
    return postgres.sql(f"SELECT deleted_reason FROM reversi_runs WHERE uid = '{uid}'", database="reversi")


def test_a_run_deleted_by_hand_is_archived_before_it_goes(arv, postgres, cluster):
    rv = arv
    _keep_forever(rv)
    created = _quiet(rv, "by-hand", steps=3)
    assert FINALIZER in created["metadata"]["finalizers"], "the admission webhook puts it on at creation"
    uid = created["metadata"]["uid"]
    _kubectl_delete(cluster, rv, "by-hand", "--timeout=90s")  # kubectl waits until the Run is gone
    assert not _exists(rv, "runs", "by-hand")
    # downstream truth: the row and its steps in PostgreSQL, written once, as deleted by hand
    assert _archived(postgres, uid) == {"writes": 1, "runs": 1, "steps": 3}
    assert _deleted_reason(postgres, uid) == "deleted"
    shown = subprocess.run([sys.executable, "-m", "reversi.entrypoints.plugin", "archive", "show", "by-hand", "-n",
                            rv.ns], capture_output=True, text=True, check=True,
                           env={**os.environ, "REVERSI_ARCHIVE_DSN": postgres.dsn()}).stdout
    assert "payments.get_customer" in shown and PASSWORD not in shown
    wait_for(lambda: [e for e in client.CoreV1Api(rv.api).list_namespaced_event(rv.ns).items
                      if e.involved_object.name == "by-hand" and e.reason == "RunArchived"],
             what="the Event RunArchived")


def test_a_run_deleted_by_hand_while_the_database_is_down_is_not_gone_until_it_is_back(arv, postgres, cluster):
    rv = arv
    _keep_forever(rv)
    uid = _quiet(rv, "waits")["metadata"]["uid"]
    wait_for(lambda: FINALIZER in _finalizers(rv, "waits"), what=f"the finalizer {FINALIZER} on the Run")
    postgres.stop()
    try:
        _kubectl_delete(cluster, rv, "waits", "--wait=false")
        found = wait_for(lambda: (c := _archived_condition(rv, "waits")) and c["reason"] == "ArchiveFailed" and c,
                         timeout=30, what="the Archived condition of the Run deleted by hand")
        assert found["status"] == "False" and "not deleted yet" in found["message"] and "(unreachable)" in found[
            "message"] and PASSWORD not in found["message"]
        assert wait_for(lambda: _failure_events(rv, "waits"), what="a Warning Event ArchiveFailed")[0].type == "Warning"
        assert value(scrape(PORT), "reversi_archive_failures_total", namespace=rv.ns, reason="unreachable") >= 1
        run = rv.get("runs", "waits")  # kept: marked deleted, its steps still there to be archived
        assert run["metadata"].get("deletionTimestamp") and FINALIZER in run["metadata"]["finalizers"]
        assert len(rv.steps("waits")) == 2
    finally:
        postgres.start()
    _gone(rv, "waits", timeout=90)
    assert _archived(postgres, uid) == {"writes": 1, "runs": 1, "steps": 2}
    assert _deleted_reason(postgres, uid) == "deleted"


def test_turning_the_archive_off_takes_the_finalizer_off_again(arv, archiving, admin_api, postgres, cluster):
    rv = arv
    _keep_forever(rv)
    uid = _quiet(rv, "unheld")["metadata"]["uid"]
    wait_for(lambda: FINALIZER in _finalizers(rv, "unheld"), what=f"the finalizer {FINALIZER} on the Run")
    archiving.stop()
    remove_webhook_configurations(admin_api)
    try:
        archiving.start()  # without REVERSI_ARCHIVE_DSN nor REVERSI_ARCHIVE_ENABLED: the archive is off
        wait_for(lambda: FINALIZER not in _finalizers(rv, "unheld"), timeout=60,
                 what=f"the finalizer {FINALIZER} taken off with the archive off")
        _kubectl_delete(cluster, rv, "unheld", "--timeout=60s")
        assert not _exists(rv, "runs", "unheld") and _archived(postgres, uid) == {}
        # and a Run made now has none: the archive turned on again gives it one (the operator's pass)
        assert not _quiet(rv, "later", steps=1)["metadata"].get("finalizers")
    finally:
        archiving.stop()
        remove_webhook_configurations(admin_api)
        os.environ["REVERSI_ARCHIVE_DSN"] = postgres.dsn()
        os.environ["REVERSI_ARCHIVE_ENABLED"] = "true"
        try:
            archiving.start()
        finally:
            del os.environ["REVERSI_ARCHIVE_DSN"], os.environ["REVERSI_ARCHIVE_ENABLED"]
    wait_for(lambda: FINALIZER in _finalizers(rv, "later"), timeout=60,
             what=f"the finalizer {FINALIZER} put on a Run made while the archive was off")
