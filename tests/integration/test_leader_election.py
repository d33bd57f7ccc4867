"""Leader election (docs/operations.md#leader-election), on the real control plane with two
operator processes: only the holder of the Lease creates Jobs and writes; a SIGKILLed holder is
replaced and every compensation is made once downstream; SIGTERM hands the Lease over at once;
a holder stopped (SIGSTOP) past its lease and resumed makes no write.

Who wrote what is read from the API server's own record: each replica's requests carry a user
agent that names it (``reversi-operator-<identity>``), which the API server records as the field
manager of each write, with its time, in the objects' ``managedFields``. The Lease's timings are
shortened (4 s lease, 3 s renew deadline, 0.5 s retry) to keep the file short; the rules are the
same as with the defaults.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time
import urllib.request

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from reversi_devcluster.localop import OperatorProcess, free_port
from tests.helpers import wait_for
from tests.integration.test_contract import _charge_step

pytestmark = pytest.mark.cluster

LEASE = "reversi-operator"
TIMINGS = {"REVERSI_LEASE_SECONDS": "4", "REVERSI_RENEW_DEADLINE_SECONDS": "3", "REVERSI_RETRY_PERIOD_SECONDS": "0.5"}


@pytest.fixture
def replicas(rv, operator, cluster, monkeypatch):
    """Two operator replicas (a and b) electing through a Lease in the test's namespace; the tests'
    own operator is SIGKILLed meanwhile (its admission servers keep serving) and started again after."""
    for key, value in {**TIMINGS, "REVERSI_LEASE_NAMESPACE": rv.ns}.items():
        monkeypatch.setenv(key, value)
    operator.kill()
    made = [OperatorProcess(cluster.paths.admin_kubeconfig, operator.log.with_name(f"operator-lease-{n}.log"),
                            metrics_port=free_port(), tick_seconds=operator.tick_seconds, identity=f"replica-{n}")
            for n in "ab"]
    try:
        yield made
    finally:
        for replica in made:
            if replica.alive():
                os.killpg(replica.proc.pid, signal.SIGCONT)
                replica.stop()
        for key in TIMINGS:
            monkeypatch.delenv(key)
        monkeypatch.delenv("REVERSI_LEASE_NAMESPACE")
        operator.start()


def _holder(rv) -> str | None:
    try:
        lease = client.CoordinationV1Api(rv.api).read_namespaced_lease(LEASE, rv.ns)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return lease.spec.holder_identity


def _leader_gauge(replica: OperatorProcess) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{replica.metrics_port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(f'reversi_leader{{identity="{replica.identity}"}}'):
                return float(line.split()[-1])
    return None


def _writes(rv, identity: str) -> list[tuple[str, str, dt.datetime]]:
    """(kind, name, time) of every managedFields entry written by replica ``identity`` in the
    test's namespace: its Jobs, Secrets, RollbackRequests, Runs and RunSteps."""
    manager = f"reversi-operator-{identity}"
    objects = [("Job", j) for j in rv.batch.list_namespaced_job(rv.ns).items]
    objects += [("Secret", s) for s in rv.core.list_namespaced_secret(rv.ns).items]
    found = [(kind, o.metadata.name, f.time) for kind, o in objects for f in o.metadata.managed_fields or []
             if f.manager == manager]
    for plural in ("rollbackrequests", "runs", "runsteps"):
        for item in rv.custom.list_namespaced_custom_object("reversi.dev", "v1alpha1", rv.ns, plural)["items"]:
            found += [(plural, item["metadata"]["name"], dt.datetime.fromisoformat(f["time"].replace("Z", "+00:00")))
                      for f in item["metadata"].get("managedFields") or [] if f.get("manager") == manager]
    return found


def _slow_rollback(rv, run: str, steps: int) -> list[dict]:
    """A Run of ``steps`` charges and a request undoing it at parallelism 2, each refund answered
    after 2 s (its effect is made at once): compensations stay in flight."""
    rv.apply_manifest()
    made = [_charge_step(rv, i, f"o-{run}-{i}") for i in range(steps)]
    rv.run(run, [step for step, _ in made])
    rv.downstream.fault("/payments/refunds", "timeout", times=steps, delay_s=2)
    rv.request(f"undo-{run}", run, parallelism=2)
    return [charge for _, charge in made]


def _each_refunded_once(rv, run: str, charges: list[dict]) -> None:
    req = rv.wait_phase(f"undo-{run}", "Succeeded", "Incomplete", timeout=120)
    assert req["status"]["phase"] == "Succeeded", json.dumps(req["status"].get("report"))
    for charge in charges:
        assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    refunds = rv.downstream.calls("/payments/refunds", since=rv.started)
    assert len(refunds) == len(charges), refunds
    jobs = rv.batch.list_namespaced_job(rv.ns, label_selector="reversi.dev/role=compensator").items
    assert len(jobs) == len(charges) and all(j.metadata.labels["reversi.dev/attempt"] == "1" for j in jobs)


def test_only_the_holder_acts_and_a_killed_holder_is_replaced_with_each_compensation_made_once(rv, replicas):
    a, b = replicas
    a.start()
    wait_for(lambda: _holder(rv) == a.identity, timeout=30, what="replica a to take the Lease")
    b.start()
    assert _holder(rv) == a.identity
    wait_for(lambda: (_leader_gauge(a), _leader_gauge(b)) == (1.0, 0.0), timeout=10,
             what="reversi_leader 1 on a, 0 on b")
    charges = _slow_rollback(rv, "kill", 6)
    wait_for(lambda: any(u["state"] == "compensating" for u in rv.undo("kill")), timeout=60, interval=0.1,
             what="a compensation in flight")
    assert not _writes(rv, b.identity), "the standby wrote while a held the Lease"
    a.kill()
    killed = time.monotonic()
    wait_for(lambda: _holder(rv) == b.identity, timeout=15, interval=0.1, what="replica b to take the Lease")
    assert time.monotonic() - killed < 4 + 0.5 + 2, "the standby took longer than the lease and a retry"
    _each_refunded_once(rv, "kill", charges)
    assert any(kind == "Job" for kind, _, _ in _writes(rv, b.identity)), "the new holder created no Job"
    assert _leader_gauge(b) == 1.0


def test_sigterm_hands_the_lease_over_at_once_and_a_holder_stopped_past_its_lease_makes_no_write(rv, replicas):
    a, b = replicas
    a.start()
    wait_for(lambda: _holder(rv) == a.identity, timeout=30, what="replica a to take the Lease")
    b.start()
    charges = _slow_rollback(rv, "stop", 6)
    wait_for(lambda: any(u["state"] == "compensating" for u in rv.undo("stop")), timeout=60, interval=0.1,
             what="a compensation in flight")
    # SIGSTOP a past its lease: b takes over; a, resumed, finds its renew deadline passed and writes nothing
    os.killpg(a.proc.pid, signal.SIGSTOP)
    stopped = dt.datetime.now(dt.UTC)
    wait_for(lambda: _holder(rv) == b.identity, timeout=15, interval=0.1, what="replica b to take the Lease")
    time.sleep(1)
    os.killpg(a.proc.pid, signal.SIGCONT)
    _each_refunded_once(rv, "stop", charges)
    late = [w for w in _writes(rv, a.identity) if w[2] > stopped.replace(microsecond=0) + dt.timedelta(seconds=1)]
    assert not late, f"replica a wrote after it was stopped past its lease: {late}"
    wait_for(lambda: _leader_gauge(a) == 0.0, timeout=10, what="reversi_leader 0 on the resumed replica")
    # a graceful stop of the holder: it waits up to 2 s for its writes in flight, then releases the
    # Lease, and the standby (watching it) takes it at once: seconds in all, where a Lease that was
    # not released would make it wait for the 15 s lease to expire (4.1 s measured once on a loaded
    # machine, against 3 s before; docs/operations.md#leader-election)
    termed = time.monotonic()
    os.killpg(b.proc.pid, signal.SIGTERM)
    wait_for(lambda: _holder(rv) == a.identity, timeout=10, interval=0.05, what="replica a to take the released Lease")
    took = time.monotonic() - termed
    assert took < 7, f"the standby took the released Lease after {took:.1f}s"
    b.proc.wait(timeout=15)
