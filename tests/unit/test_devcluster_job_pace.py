"""The local control plane's Job controller pace (docs/development.md#components): upstream's
controller manager with one setting, the period it gathers pod events for before a Job sync."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from reversi_devcluster import build
from reversi_devcluster.cluster import ClusterSettings


def test_the_controller_manager_is_built_from_upstreams_app_with_only_the_batch_period_set():
    main = build.CONTROLLER_MANAGER_MAIN
    assert "app.NewControllerManagerCommand()" in main and "cli.Run(" in main
    assert "job.SyncJobBatchPeriod = d" in main and 'os.Getenv("REVERSI_JOB_SYNC_BATCH_PERIOD")' in main
    assert "controller-manager" in build.CONTROL_PLANE_COMPONENTS
    assert build.components()["controller-manager"].binaries == ("kube-controller-manager",)


@pytest.mark.parametrize("period", ["100", "fast", "-1s", "1m", "0s", "0ms", "0.0s", "00ms"])
def test_a_period_that_is_not_a_go_duration_of_seconds_or_less_is_refused_by_name(period):
    with pytest.raises(ValidationError) as err:
        ClusterSettings(job_sync_batch_period=period)
    assert "job_sync_batch_period" in str(err.value)



@pytest.mark.parametrize("period", ["100ms", "1s", "0.5s", "250ms", "10ms"])
def test_a_positive_go_duration_is_taken(period):
    assert ClusterSettings(job_sync_batch_period=period).job_sync_batch_period == period
