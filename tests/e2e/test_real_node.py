"""Reversi on a real node: the operator from its image, compensators and readers in containers,
and the faults only a real kubelet and container runtime produce. Each case is checked against
the downstream system's own record of what happened (tests/e2e/conftest.py)."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import describe

pytestmark = pytest.mark.cluster


def test_the_chart_installed_operator_undoes_a_charge_with_a_compensator_in_a_container(shop):
    """The verified rollback, end to end on the real node: the refund happens once downstream,
    the reader confirms it, and the compensator's pod ran as the restricted standard demands
    (a non-root user id, a read-only root) in the demo image."""
    shop.manifest([shop.runner()])
    charge = shop.charge_in_a_run("order-1", "o-1")
    name = shop.roll_back("order-1")
    done = shop.wait_final(name)
    assert done["status"]["phase"] == "Succeeded", describe(shop, name)
    assert done["status"]["report"]["compensated"] == [0]
    refunds = shop.refunds(charge["id"])
    assert len(refunds) == 1 and refunds[0]["amount"] == 700, refunds
    assert shop.downstream.get_charge(charge["id"])["refunded"] is True
    pods = shop.pods(**{"reversi.dev/step": "0"})
    assert {p.spec.containers[0].name for p in pods} >= {"compensator", "reader"}
    for pod in pods:
        assert pod.status.phase == "Succeeded", pod.status
        assert pod.spec.containers[0].image == "localhost/reversi-demo:dev"
        assert pod.spec.security_context.run_as_user == 65532
        assert pod.spec.containers[0].security_context.read_only_root_filesystem is True
        ended = pod.status.container_statuses[0].state.terminated
        assert ended.exit_code == 0 and ended.container_id.startswith("containerd://"), ended
