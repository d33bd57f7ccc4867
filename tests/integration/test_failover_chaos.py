"""Failovers at random moments during rollbacks (docs/operations.md#leader-election): the holder
of the Lease is SIGKILLed, SIGTERMed, or SIGSTOPped past its lease and resumed, while two
operator replicas undo runs whose refunds each take 1 s to answer. Judged against the downstream
system: every charge refunded, no refund made twice, every request Succeeded, and no write by a
replica while it was stopped or after it resumed until the next failover (the objects'
``managedFields`` name each replica: tests/integration/test_leader_election.py).

``make e2e`` makes 2 failovers; ``make chaos-failover`` makes 20 (REVERSI_FAILOVER_CHAOS=20).
Replay a sequence with REVERSI_CHAOS_SEED=<the seed it printed>.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import time

import pytest

from tests.helpers import wait_for
from tests.integration.test_contract import _charge_step
from tests.integration.test_leader_election import _holder, _writes, replicas  # noqa: F401 - the fixture

pytestmark = pytest.mark.cluster

FAILOVERS = int(os.environ.get("REVERSI_FAILOVER_CHAOS", "2"))
STEPS_PER_RUN = 6


def _failover(rv, procs: dict, how: str, quiet: list[tuple[str, dt.datetime]]) -> None:
    """Fail the holder over by ``how``; a stopped replica's quiet window opens (closed by the caller)."""
    holder = procs[_holder(rv)]
    other = next(p for p in procs.values() if p is not holder)
    if how == "kill":
        holder.kill()
    elif how == "term":
        holder.stop()
    else:
        os.killpg(holder.proc.pid, signal.SIGSTOP)
        quiet.append((holder.identity, dt.datetime.now(dt.UTC)))
    wait_for(lambda: _holder(rv) == other.identity, timeout=20, interval=0.1, what=f"the standby to take over ({how})")
    if how == "stop":
        os.killpg(holder.proc.pid, signal.SIGCONT)
    else:
        holder.start()


def test_failovers_at_random_moments_make_no_compensation_twice(rv, replicas):  # noqa: F811 - the fixture
    seed = int(os.environ.get("REVERSI_CHAOS_SEED", str(random.randrange(1 << 30))))
    print(f"REVERSI_CHAOS_SEED={seed}")
    rnd = random.Random(seed)
    a, b = replicas
    a.start()
    wait_for(lambda: _holder(rv) == a.identity, timeout=30, what="replica a to take the Lease")
    b.start()
    procs = {p.identity: p for p in replicas}
    rv.apply_manifest()
    quiet: list[tuple[str, dt.datetime]] = []  # (replica, stopped at): no write by it from then on
    windows: list[tuple[str, dt.datetime, dt.datetime]] = []
    charges, requests, done = [], [], 0
    while done < FAILOVERS:
        run = f"c{len(requests)}"
        made = [_charge_step(rv, i, f"o-{run}-{i}") for i in range(STEPS_PER_RUN)]
        charges += [charge for _, charge in made]
        rv.run(run, [step for step, _ in made])
        rv.downstream.fault("/payments/refunds", "timeout", times=STEPS_PER_RUN, delay_s=1)
        rv.request(f"undo-{run}", run, parallelism=2)
        requests.append(f"undo-{run}")
        for _ in range(min(2, FAILOVERS - done)):
            time.sleep(rnd.uniform(0.5, 3.0))
            for identity, since in quiet:  # the next failover may make a stopped-and-resumed replica the holder
                windows.append((identity, since, dt.datetime.now(dt.UTC)))
            quiet.clear()
            how = rnd.choice(["kill", "term", "stop"])
            began = time.monotonic()
            _failover(rv, procs, how, quiet)
            done += 1
            print(f"failover {done}/{FAILOVERS}: {how}, the standby held the Lease after "
                  f"{time.monotonic() - began:.1f}s")
        for name in requests[-1:]:
            req = rv.wait_phase(name, "Succeeded", "Incomplete", "Failed", timeout=180)
            assert req["status"]["phase"] == "Succeeded", json.dumps(req["status"].get("report"))
    windows += [(identity, since, dt.datetime.now(dt.UTC)) for identity, since in quiet]
    for charge in charges:
        assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
    refunds = rv.downstream.calls("/payments/refunds", since=rv.started)
    assert len(refunds) == len(charges) and len({c["key"] for c in refunds}) == len(charges), refunds
    for identity, since, until in windows:
        start = since.replace(microsecond=0) + dt.timedelta(seconds=1)
        late = [w for w in _writes(rv, identity) if start < w[2] < until.replace(microsecond=0)]
        assert not late, f"{identity} wrote after it was stopped past its lease: {late}"
